"""bench_fast_speed's cases: each a speed preset, options and levers over it, and what the child does with them
(a longer video, a profile, another decoder, another plan); the defaults and issue 26's targets."""
from __future__ import annotations


def _draft2_tiny(**kw) -> dict:
    """A case of `draft --chunk-steps 2 --tiny-vae` (the issue's fastest preset), compiled, with `kw` on top."""
    return dict(preset="draft", compile="blocks", levers=dict(steps=2), tiny_vae=True, **kw)


CASES: dict[str, dict] = {
    "exact": dict(preset="exact"),  # eager bf16: the reference of every error
    # the fastest exact path (compiled even for a 7-chunk video); its frames are the reference of the decode levers
    "auto": dict(preset="auto", compile="blocks", save_frames=True),
    "fast": dict(preset="fast", compile="blocks"),
    "draft": dict(preset="draft", compile="blocks"),
    # each lever alone, on top of the auto preset
    "fp8_gemm": dict(preset="auto", compile="blocks", compute="fp8", attention="sdpa"),
    "fp8_attn": dict(preset="auto", compile="blocks", attention="fp8"),
    "draft_fp8_attn": dict(preset="draft", compile="blocks", attention="fp8"),  # draft + cuDNN's FP8 attention
    # a rolled 2-step draft chunk with cuDNN's FP8 attention for its 4,680 queries over the 23,400-key window too
    # (the product runs it only where queries >= keys / FP8_MIN_QUERY_SHARE): fixed shapes once the window rolls,
    # so no graph is built inside the timed chunks
    "draft_rolling_steps2_tiny_vae_fp8_attn": _draft2_tiny(chunks=16, attention="fp8", fp8_min_query_share=8,
                                                           reference="draft_rolling_steps2_tiny_vae"),
    # the FP8 K/V cache (draft's kv_fp8 lever): alone on auto (its error), and draft without it; *_before: draft as
    # planned before the bf16 decode was counted (the decoder's share planned in float32) and without the FP8 cache
    "kv_fp8": dict(preset="auto", compile="blocks", levers=dict(kv_fp8=True)),
    "draft_kv_bf16": dict(preset="draft", compile="blocks", levers=dict(kv_fp8=False)),
    "draft_before": dict(preset="draft", compile="blocks", levers=dict(kv_fp8=False), vae_plan_f32=True),
    "draft_rolling_kv_bf16": dict(preset="draft", compile="blocks", chunks=16, levers=dict(kv_fp8=False),
                                  reference="draft_rolling"),
    "draft_rolling_before": dict(preset="draft", compile="blocks", chunks=16, levers=dict(kv_fp8=False),
                                 vae_plan_f32=True, reference="draft_rolling"),
    # the FP8 cache under `fast` (link-bound on a 24 GB card: it halves the K/V bytes streamed per chunk), and
    # `draft` with the integer-op kernels an RTX 30xx runs (no hardware e4m3 there; the same bits: error 0)
    "fast_kv_fp8": dict(preset="fast", compile="blocks", levers=dict(kv_fp8=True)),
    "fast_kv_bf16": dict(preset="fast", compile="blocks", levers=dict(kv_fp8=False)),
    "draft_kv_bits": dict(preset="draft", compile="blocks", fp8_kernel="bits", reference="draft"),
    "draft_again": dict(preset="draft", compile="blocks", reference="draft"),  # the same case twice: error 0
    # 2 steps per chunk ([999, 825]) instead of draft's 3: a third fewer model calls
    "draft_steps2": dict(preset="draft", compile="blocks", levers=dict(steps=2)),
    "draft_rolling_steps2": dict(preset="draft", compile="blocks", chunks=16, levers=dict(steps=2),
                                 reference="draft_rolling"),
    "fp8_weights": dict(preset="auto", compile="blocks", weights="fp8"),  # stored e4m3 weights, FP8 GEMMs
    "int8_weights": dict(preset="auto", compile="blocks", weights="int8"),  # stored int8 weights, INT8 GEMMs (sm80+)
    "fast_fp8_weights": dict(preset="fast", compile="blocks", weights="fp8"),  # + FP8 attention
    "draft_fp8_weights": dict(preset="draft", compile="blocks", weights="fp8"),  # + the draft chunk levers
    "steps3": dict(preset="auto", compile="blocks", levers=dict(steps=3)),
    "fold": dict(preset="auto", compile="blocks", levers=dict(fold_context=True)),
    "window15": dict(preset="auto", compile="blocks", levers=dict(window_frames=15)),
    "auto_overlap": dict(preset="auto", compile="blocks", levers=dict(decode_overlap=True), save_frames=True),
    "auto_decode_bf16": dict(preset="auto", compile="blocks", levers=dict(decode_dtype="bf16"), save_frames=True),
    "fast_overlap": dict(preset="fast", compile="blocks", levers=dict(decode_overlap=True, decode_dtype="bf16")),
    "draft_overlap": dict(preset="draft", compile="blocks", levers=dict(decode_overlap=True, decode_dtype="bf16")),
    "decode": dict(kind="decode"),  # the VAE's chunk decode alone, six ways
    # the tiny decoder (--tiny-vae; a random taew2_1-format file in --workdir) instead of the VAE: decode and plan
    "draft_tiny_vae": dict(preset="draft", compile="blocks", tiny_vae=True),
    "draft_steps2_tiny_vae": _draft2_tiny(),
    "draft_rolling_steps2_tiny_vae": _draft2_tiny(chunks=16),
    "draft_steps2_tiny_vae_vae_plan": _draft2_tiny(tiny_plan_as_vae=True),
    "fast_tiny_vae": dict(preset="fast", compile="blocks", tiny_vae=True),
    "draft_rolling_steps2_tiny_vae_graphs": _draft2_tiny(chunks=16, graphs=True,
                                                         reference="draft_rolling_steps2_tiny_vae"),
    "draft_steps2_fp8_weights_tiny_vae": _draft2_tiny(weights="fp8"),
    "auto_tiny_vae": dict(preset="auto", compile="blocks", tiny_vae=True, save_frames=True),
    # NF4 weights prepared in two passes (bnb's dequantize, then the row quantizer) instead of quant/nf4_rows.py's
    # one kernel: the same latents (error 0), the time the kernel saves
    "draft_steps2_tiny_vae_two_pass": _draft2_tiny(env={"LINGBOT_NF4_ROWS": "0"}, reference="draft_steps2_tiny_vae"),
    "draft_rolling_steps2_tiny_vae_two_pass": _draft2_tiny(chunks=16, env={"LINGBOT_NF4_ROWS": "0"},
                                                           reference="draft_rolling_steps2_tiny_vae"),
    "draft_two_pass": dict(preset="draft", compile="blocks", env={"LINGBOT_NF4_ROWS": "0"}, reference="draft"),
    "fast_two_pass": dict(preset="fast", compile="blocks", env={"LINGBOT_NF4_ROWS": "0"}, reference="fast"),
    # the warm-up a whole video long (every cache length seen once) instead of two chunks: first-use costs
    "draft_steps2_tiny_vae_warm_video": _draft2_tiny(warm_video=True, reference="draft_steps2_tiny_vae"),
    # an FP8 cache's layers kept on the card as codes (the plan does so when RAM is short; *_codes always): about
    # twice as many layers, the host layers spread among them, their uploads ahead on a stream of their own;
    # against the same room in bf16 layers (*_bf16_layers: never codes, the host layers after them). The same bits.
    "draft_steps2_tiny_vae_codes": _draft2_tiny(kv_codes_on_gpu=True, reference="draft_steps2_tiny_vae_bf16_layers"),
    "draft_steps2_tiny_vae_bf16_layers": _draft2_tiny(kv_codes_on_gpu=False),
    "draft_rolling_steps2_tiny_vae_codes": _draft2_tiny(chunks=16, kv_codes_on_gpu=True,
                                                        reference="draft_rolling_steps2_tiny_vae_bf16_layers"),
    "draft_rolling_steps2_tiny_vae_bf16_layers": _draft2_tiny(chunks=16, kv_codes_on_gpu=False),
    "draft_rolling_steps2_tiny_vae_codes_one_ahead": _draft2_tiny(
        chunks=16, kv_codes_on_gpu=True, env={"LINGBOT_KV_UPLOAD_AHEAD": "0"},
        reference="draft_rolling_steps2_tiny_vae_bf16_layers"),
    "draft_steps2_tiny_vae_codes_profile": _draft2_tiny(kv_codes_on_gpu=True, profile=True),
    "draft_steps2_tiny_vae_bf16_layers_profile": _draft2_tiny(kv_codes_on_gpu=False, profile=True),
    "draft_codes": dict(preset="draft", compile="blocks", kv_codes_on_gpu=True, reference="draft_bf16_layers"),
    "draft_bf16_layers": dict(preset="draft", compile="blocks", kv_codes_on_gpu=False),
    "draft_steps2_tiny_vae_whole_card": _draft2_tiny(cap_gib=None, reference="draft_steps2_tiny_vae"),
    # the camera FiLM computed at every call: with 2 calls a chunk, keeping it saves one computation per block
    "draft_steps2_tiny_vae_no_film": _draft2_tiny(film=False, reference="draft_steps2_tiny_vae"),
    "draft_steps2_tiny_vae_profile": _draft2_tiny(profile=True),
    "draft_steps2_tiny_vae_host_gaps": _draft2_tiny(profile=True, host_gaps=True),
    # the same case again, for a pair run on one machine (e.g. before and after a change): its latents against
    # the first's
    "draft_steps2_tiny_vae_again": _draft2_tiny(reference="draft_steps2_tiny_vae"),
    "link": dict(kind="link"),  # pinned RAM <-> device copies alone: GB/s one way, the other, both at once
    "auto_profile": dict(preset="auto", compile="blocks", profile=True),
    "exact_profile": dict(preset="exact", profile=True),
    "fast_profile": dict(preset="fast", compile="blocks", profile=True),
    "fp8_weights_profile": dict(preset="auto", compile="blocks", weights="fp8", profile=True),
    "fast_fp8_weights_profile": dict(preset="fast", compile="blocks", weights="fp8", profile=True),
    "draft_profile": dict(preset="draft", compile="blocks", profile=True),
    "draft_steps2_profile": dict(preset="draft", compile="blocks", profile=True, levers=dict(steps=2)),
    "draft_kv_bf16_profile": dict(preset="draft", compile="blocks", profile=True, levers=dict(kv_fp8=False)),
    "draft_fp8_weights_profile": dict(preset="draft", compile="blocks", weights="fp8", profile=True),
    # the same chunk with Python stacks: each host-bound idle gap charged to the code the host was in
    "draft_host_gaps": dict(preset="draft", compile="blocks", profile=True, host_gaps=True),
    "auto_host_gaps": dict(preset="auto", compile="blocks", profile=True, host_gaps=True),
    # the whole card (the cache on the GPU, nothing streamed): are a capped chunk's idle gaps K/V waits or the host?
    "draft_whole_card_profile": dict(preset="draft", compile="blocks", profile=True, cap_gib=None),
    "fast_fp8_weights_whole_card_profile": dict(preset="fast", compile="blocks", weights="fp8", profile=True,
                                                cap_gib=None),
    # a 16-chunk video: the window rolls from chunk 7 (auto, 21 frames) / chunk 5 (draft, 15); *_graphs replay the
    # blocks from CUDA graphs from then on (speed/block_graphs.py, LINGBOT_CUDA_GRAPHS=1), the others launch every
    # kernel (errors against the same preset without graphs: 0 is a replay that gives the eager run's bits)
    # eager (no compile) with the window rolled, with and without CUDA graphs: for the v2 1.3B, whose small kernels
    # leave the GPU waiting on the host more than a 14B's do
    "exact_rolling": dict(preset="exact", chunks=16),
    # the same case run again (e.g. by today's code after the one before a change, in one workdir): the bits
    # against the first's, and the time on one machine
    "exact_rolling_again": dict(preset="exact", chunks=16, reference="exact_rolling"),
    "exact_rolling_graphs": dict(preset="exact", chunks=16, graphs=True, reference="exact_rolling"),
    "draft_rolling_steps2_tiny_vae_eager": dict(preset="draft", compile="off", levers=dict(steps=2), tiny_vae=True,
                                                chunks=16, reference="draft_rolling_steps2_tiny_vae"),
    "draft_rolling_steps2_tiny_vae_eager_graphs": dict(preset="draft", compile="off", levers=dict(steps=2),
                                                       tiny_vae=True, chunks=16, graphs=True,
                                                       reference="draft_rolling_steps2_tiny_vae_eager"),
    # the presets as the doors resolve them for the model (no compile forced: --compile auto per model)
    "auto_rolling_as_played": dict(preset="auto", chunks=16, reference="exact_rolling"),
    "auto_rolling_as_played_overlap": dict(preset="auto", chunks=16, levers=dict(decode_overlap=True),
                                           reference="exact_rolling"),
    "draft_rolling_steps2_tiny_vae_as_played": dict(preset="draft", levers=dict(steps=2), tiny_vae=True, chunks=16),
    # the camera FiLM kept per chunk under the CUDA graphs (a graph that keeps it, one that reads it) against
    # computed at every call: the same latents (error 0), the time it saves; and the profile against the floor
    "exact_rolling_no_film": dict(preset="exact", chunks=16, film=False, reference="exact_rolling"),
    "auto_rolling_as_played_no_film": dict(preset="auto", chunks=16, film=False, reference="auto_rolling_as_played"),
    "auto_rolling_as_played_profile": dict(preset="auto", chunks=16, profile=True),
    # the blocks' prepared GEMM weights kept on the card (the plan's resident_weights) against prepared from the NF4
    # codes at every call: the same latents (error 0), the dequantization it saves
    "exact_rolling_not_resident": dict(preset="exact", chunks=16, resident=False, reference="exact_rolling"),
    "auto_rolling_as_played_not_resident": dict(preset="auto", chunks=16, resident=False,
                                                reference="auto_rolling_as_played"),
    "auto_rolling_as_played_not_resident_profile": dict(preset="auto", chunks=16, resident=False, profile=True),
    "draft_rolling_steps2_tiny_vae_as_played_no_film": dict(preset="draft", levers=dict(steps=2), tiny_vae=True,
                                                            chunks=16, film=False,
                                                            reference="draft_rolling_steps2_tiny_vae_as_played"),
    # the v2 1.3B's exact and auto levers (issue 48): the decode on a side stream beside the next chunk's DiT (the
    # same frames, later), and auto's compiled per-token work replayed from CUDA graphs, with and without it
    "exact_rolling_overlap": dict(preset="exact", chunks=16, levers=dict(decode_overlap=True),
                                  reference="exact_rolling"),
    "auto_rolling_compiled_graphs": dict(preset="auto", compile="blocks", chunks=16, graphs=True,
                                         reference="exact_rolling"),
    "auto_rolling_compiled_graphs_overlap": dict(preset="auto", compile="blocks", chunks=16, graphs=True,
                                                 levers=dict(decode_overlap=True), reference="exact_rolling"),
    # 8-bit attention that runs on Ada and Ampere (SageAttention's Triton kernel: INT8 q.k, fp16 p.v): its error
    # against the same preset with exact attention, its time, and a profile for the consumer-card projection; and
    # the 2-step chunk with bf16 GEMMs (its error per forward against exact: no FP8 GEMM rounding in it)
    "draft_steps2_tiny_vae_sage": _draft2_tiny(attention="sage", reference="draft_steps2_tiny_vae"),
    "draft_steps2_tiny_vae_sage_profile": _draft2_tiny(attention="sage", profile=True),
    "draft_rolling_steps2_tiny_vae_sage_as_played": dict(preset="draft", levers=dict(steps=2), tiny_vae=True,
                                                         chunks=16, attention="sage",
                                                         reference="draft_rolling_steps2_tiny_vae_as_played"),
    "draft_steps2_bf16_tiny_vae": _draft2_tiny(compute="bf16"),
    "draft_steps2_bf16_sage_tiny_vae": _draft2_tiny(compute="bf16", attention="sage"),
    "draft_steps2_bf16_sage_tiny_vae_profile": _draft2_tiny(compute="bf16", attention="sage", profile=True),
    # profiles of a chunk once the window is full (the middle of 16): where a rolled chunk's time goes, and the
    # source of fast_projection's consumer-card rows (a chunk before the window fills has less attention)
    "exact_rolling_profile": dict(preset="exact", chunks=16, profile=True),
    "auto_rolling_compiled_graphs_profile": dict(preset="auto", compile="blocks", chunks=16, graphs=True,
                                                 profile=True),
    "draft_rolling_steps2_tiny_vae_as_played_profile": dict(preset="draft", levers=dict(steps=2), tiny_vae=True,
                                                            chunks=16, profile=True),
    "draft_rolling_steps2_bf16_sage_tiny_vae_profile": dict(preset="draft", levers=dict(steps=2), tiny_vae=True,
                                                            chunks=16, compute="bf16", attention="sage",
                                                            profile=True),
    # issue 48: the rolled 2-step chunk compiled into CUDA graphs with FP8 / bf16 GEMMs and cuDNN / SageAttention,
    # each with its profile (the rows fast_projection pairs them with)
    "draft_rolling_steps2_tiny_vae_graphs_profile": _draft2_tiny(chunks=16, graphs=True, profile=True),
    "draft_rolling_steps2_bf16_tiny_vae_graphs": _draft2_tiny(chunks=16, graphs=True, compute="bf16",
                                                              reference="draft_rolling_steps2_tiny_vae_graphs"),
    "draft_rolling_steps2_bf16_tiny_vae_graphs_profile": _draft2_tiny(chunks=16, graphs=True, compute="bf16",
                                                                      profile=True),
    "draft_rolling_steps2_bf16_sage_tiny_vae_graphs": _draft2_tiny(chunks=16, graphs=True, compute="bf16",
                                                                   attention="sage",
                                                                   reference="draft_rolling_steps2_bf16_tiny_vae_graphs"),
    "draft_rolling_steps2_bf16_sage_tiny_vae_graphs_profile": _draft2_tiny(chunks=16, graphs=True, compute="bf16",
                                                                           attention="sage", profile=True),
    # fp16 GEMMs with fp16 accumulation (twice the bf16 rate on GeForce cards; the H200 runs them at bf16's): their
    # error against bf16 GEMMs, alone and with SageAttention, and a profile for the consumer-card projection
    "draft_rolling_steps2_fp16acc_tiny_vae_graphs": _draft2_tiny(chunks=16, graphs=True, compute="fp16acc",
                                                                 reference="draft_rolling_steps2_bf16_tiny_vae_graphs"),
    "draft_rolling_steps2_fp16acc_sage_tiny_vae_graphs": _draft2_tiny(
        chunks=16, graphs=True, compute="fp16acc", attention="sage",
        reference="draft_rolling_steps2_bf16_tiny_vae_graphs"),
    "draft_rolling_steps2_fp16acc_sage_tiny_vae_graphs_profile": _draft2_tiny(chunks=16, graphs=True,
                                                                              compute="fp16acc", attention="sage",
                                                                              profile=True),
    "draft_rolling_steps2_sage_tiny_vae_graphs": _draft2_tiny(chunks=16, graphs=True, attention="sage",
                                                              reference="draft_rolling_steps2_tiny_vae_graphs"),
    "draft_rolling_steps2_sage_tiny_vae_graphs_profile": _draft2_tiny(chunks=16, graphs=True, attention="sage",
                                                                      profile=True),
    # the FFN's GELU in its GEMM's epilogue, which the compiled phases now ask for, against a phase of its own (as
    # before): the error it adds to auto's per forward, the time it saves, and the profile against the floor
    "auto_rolling_as_played_no_gelu_epilogue": dict(preset="auto", chunks=16, env={"LINGBOT_GELU_EPILOGUE": "0"},
                                                    reference="auto_rolling_as_played"),
    "auto_rolling_as_played_no_gelu_epilogue_profile": dict(preset="auto", chunks=16, profile=True,
                                                            env={"LINGBOT_GELU_EPILOGUE": "0"}),
    # the VAE decode in fp16 (10 bits of mantissa, TF32's) instead of float32: the same latents (error 0), the
    # time it saves alone and on the side stream; its frames against float32's are the `decode` case's
    "exact_rolling_decode_fp16": dict(preset="exact", chunks=16, levers=dict(decode_dtype="fp16"),
                                      reference="exact_rolling"),
    "auto_rolling_as_played_decode_fp16": dict(preset="auto", chunks=16, levers=dict(decode_dtype="fp16"),
                                               reference="exact_rolling"),
    "auto_rolling_as_played_decode_fp16_overlap": dict(preset="auto", chunks=16, reference="exact_rolling",
                                                       levers=dict(decode_dtype="fp16", decode_overlap=True)),
    # INT8 GEMMs (per-token activations, per-row weights; the RTX 30xx's fastest, twice fp16acc's rate there):
    # their error against bf16 GEMMs, alone and with SageAttention, and a profile for the consumer-card projection
    "draft_rolling_steps2_int8_tiny_vae_graphs": _draft2_tiny(chunks=16, graphs=True, compute="int8",
                                                              reference="draft_rolling_steps2_bf16_tiny_vae_graphs"),
    "draft_rolling_steps2_int8_sage_tiny_vae_graphs": _draft2_tiny(
        chunks=16, graphs=True, compute="int8", attention="sage",
        reference="draft_rolling_steps2_bf16_tiny_vae_graphs"),
    "draft_rolling_steps2_int8_sage_tiny_vae_graphs_profile": _draft2_tiny(chunks=16, graphs=True, compute="int8",
                                                                           attention="sage", profile=True),
    "auto_rolling": dict(preset="auto", compile="blocks", chunks=16),
    "auto_rolling_graphs": dict(preset="auto", compile="blocks", chunks=16, graphs=True, reference="auto_rolling"),
    "draft_rolling": dict(preset="draft", compile="blocks", chunks=16),
    "draft_rolling_graphs": dict(preset="draft", compile="blocks", chunks=16, graphs=True,
                                 reference="draft_rolling"),
    # the camera FiLM kept per chunk (the plan's film_blocks: the room the model and the cache layers leave)
    # against computed at every call: the same latents (error 0 against the case with it), the time it saves; on
    # the 24 GB cap (little room there) and the whole card (every block's)
    "exact_no_film": dict(preset="exact", film=False, reference="exact"),
    "auto_no_film": dict(preset="auto", compile="blocks", film=False, reference="auto"),
    "draft_no_film": dict(preset="draft", compile="blocks", film=False, reference="draft"),
    "auto_whole_card": dict(preset="auto", compile="blocks", cap_gib=None),
    "auto_whole_card_no_film": dict(preset="auto", compile="blocks", cap_gib=None, film=False,
                                    reference="auto_whole_card"),
    "draft_whole_card": dict(preset="draft", compile="blocks", cap_gib=None),
    "auto_rolling_no_film": dict(preset="auto", compile="blocks", chunks=16, film=False, reference="auto_rolling"),
    "draft_rolling_no_film": dict(preset="draft", compile="blocks", chunks=16, film=False,
                                  reference="draft_rolling"),
    # the same videos on the whole card (the cache on the GPU, nothing streamed): do the 24 GB rows wait on the
    # K/V streamed from RAM once the window is full? (measured on an H100: no, 2.949 against 2.936 s)
    "auto_rolling_whole_card": dict(preset="auto", compile="blocks", chunks=16, cap_gib=None),
    "auto_rolling_whole_card_no_film": dict(preset="auto", compile="blocks", chunks=16, cap_gib=None, film=False,
                                            reference="auto_rolling_whole_card"),
    "draft_rolling_whole_card": dict(preset="draft", compile="blocks", chunks=16, cap_gib=None),
    "draft_whole_card_no_film": dict(preset="draft", compile="blocks", cap_gib=None, film=False,
                                     reference="draft_whole_card"),
    # the FiLM of the blocks the 24 GB card has no room for kept in pinned RAM and streamed back (the plan's
    # film_host_blocks, the default) against the device's few blocks alone: the same latents, the time it saves
    "auto_film_device": dict(preset="auto", compile="blocks", film_host=False, reference="auto"),
    "draft_film_device": dict(preset="draft", compile="blocks", film_host=False, reference="draft"),
    "auto_rolling_film_device": dict(preset="auto", compile="blocks", chunks=16, film_host=False,
                                     reference="auto_rolling"),
    "draft_rolling_film_device": dict(preset="draft", compile="blocks", chunks=16, film_host=False,
                                      reference="draft_rolling"),
}
DEFAULT_CASES = ["exact", "auto", "fast", "draft"]
# seconds per chunk (DiT + decode) on one H100 / H200 with the 24 GB cap, per model: issue 26's for v1 Fast (a
# 12-frame chunk), issue 48's for v2 (a 16-frame chunk)
TARGETS = {"v1-fast": {"exact": None, "auto": 1.6, "fast": 1.0, "draft": 0.75},
           "v2-14b": {"auto": 2.9},
           "v2-1.3b": {"exact": 0.80, "auto": 0.60, "draft_steps2_tiny_vae": 0.30}}
TARGETS_S = TARGETS["v1-fast"]
