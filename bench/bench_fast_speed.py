"""Benchmark: the Fast model's speed presets and levers, per 12-frame chunk (issue 26).

    # one H100 session, four calls (bench/results/fast_chunk_*_h100.json; each call on a fresh machine writes the
    # Fast expert again, ~20 s, and every case takes 40-65 s)
    python -m lingbot_world.bench.bench_fast_speed --cases exact,auto,fast,draft,auto_profile --workdir /tmp/lwfs \
        --keep --fresh --budget-s 430 --min-case-s 45 --out bench/results/fast_chunk_h100.json
    python -m lingbot_world.bench.bench_fast_speed --cases exact,decode,auto_overlap,draft_overlap,fast_overlap,\
fold,steps3,window15,fp8_gemm,fp8_attn --workdir /tmp/lwfs --fresh --budget-s 470 --min-case-s 42 \
        --out bench/results/fast_chunk_levers_h100.json
    python -m lingbot_world.bench.bench_fast_speed --cases exact,fast,draft --workdir /tmp/lwfs --fresh \
        --budget-s 175 --out bench/results/fast_chunk_presets_h100.json      # draft ran in a 4th call, same machine
    python -m lingbot_world.bench.bench_fast_speed --tiny --out /tmp/fast_speed_tiny.json     # CPU smoke run
    # stored FP8 / INT8 weights (--weights fp8|int8; each copy is converted once from the random NF4 expert)
    python -m lingbot_world.bench.bench_fast_speed --cases exact,auto,fp8_weights,int8_weights,fast_fp8_weights,\
draft_fp8_weights --workdir /tmp/lwf --keep --budget-s 560 --min-case-s 45 \
        --out bench/results/fast_chunk_lowp_weights_h100.json
    # today's 24 GB table and where a chunk's time goes (profiles split by the compute stream's idle gaps)
    python -m lingbot_world.bench.bench_fast_speed --cases exact,auto,fp8_weights,draft_fp8_weights,draft,draft_profile,\
fast_fp8_weights_profile --workdir /tmp/lwf --keep --budget-s 900 --min-case-s 40 \
        --out bench/results/fast_chunk_spare3_h100.json
    # (its whole-card profiles; its capped rows ran with a 2.5 GiB spare, before today's 3 GiB)
    python -m lingbot_world.bench.bench_fast_speed --cases exact,auto,fp8_weights,fast_fp8_weights,draft_fp8_weights,\
draft_whole_card_profile,fast_fp8_weights_whole_card_profile --workdir /tmp/lwf --keep --budget-s 900 \
        --min-case-s 40 --out bench/results/fast_chunk_fp8_plan_h100.json
    # with the VAE decoder's FrameRings: the 24 GB table, its FP8-weight rows, and the host's share of the idle time
    python -m lingbot_world.bench.bench_fast_speed --cases draft,auto,fast,exact --workdir /tmp/lwf --keep --fresh \
        --budget-s 420 --min-case-s 40 --out bench/results/fast_chunk_ring_h100.json
    python -m lingbot_world.bench.bench_fast_speed --cases fp8_weights,draft_fp8_weights --workdir /tmp/lwf --keep \
        --fresh --budget-s 330 --min-case-s 40 --out bench/results/fast_chunk_ring_fp8w_h100.json
    python -m lingbot_world.bench.bench_fast_speed --cases draft_host_gaps,auto_host_gaps,fast --workdir /tmp/lwf \
        --keep --fresh --budget-s 400 --min-case-s 40 --out bench/results/fast_chunk_host_gaps_h100.json
    python -m lingbot_world.bench.bench_fast_speed --cases decode --workdir /tmp/lwo --budget-s 100 \
        --out bench/results/decode_ring_h100.json        # the chunk decode alone (decode_old_h100.json: before)
    python -m lingbot_world.bench.fast_projection --out bench/results/fast_chunk_projection.json  # RTX projections
    # CUDA graphs once the window rolls (16-chunk videos; *_graphs set LINGBOT_CUDA_GRAPHS=1 in their child)
    python -m lingbot_world.bench.bench_fast_speed --cases draft_rolling,draft_rolling_graphs --workdir /tmp/lwf --keep \
        --fresh --budget-s 260 --min-case-s 40 --out bench/results/fast_rolling_draft_h100.json
    # draft in 2 steps, fast with the FP8 cache, the FP8 cache's integer kernels (BENCHMARKS "draft in 2 steps")
    python -m lingbot_world.bench.bench_fast_speed --cases draft,draft_again,draft_kv_bits,draft_profile,\
draft_steps2_profile --workdir /tmp/lwf --keep --fresh --budget-s 520 --min-case-s 40 \
        --out bench/results/fast_chunk_kv_bits_h100.json
    python -m lingbot_world.bench.bench_fast_speed --cases draft_steps2,draft_rolling,draft_rolling_steps2 \
        --workdir /tmp/lwf --keep --budget-s 400 --min-case-s 40 --out bench/results/fast_chunk_steps2_h100.json
    python -m lingbot_world.bench.bench_fast_speed --cases fast_kv_bf16,fast_kv_fp8 --workdir /tmp/lwf --keep \
        --budget-s 200 --min-case-s 40 --out bench/results/fast_chunk_fast_kv_ab1_h100.json

Conditions of issue 26's table: 480x832, 81 frames (7 chunks of 3 latent frames), a 24 GB card (the process capped
with set_per_process_memory_fraction, memory planned by `plan_fast_memory` as the CLI does, the VAE's streaming
decode counted in), window 21 + sink 3, camera on. Every case runs in its own child process: the model loads, the
speed plan of its preset is applied (`speed.presets.resolve_preset`, explicit flags over it where the case says),
two warm-up chunks run (compile, cuDNN plans, the decoder's first frames) and are forgotten (the cache's counters
go back to 0: every slot a chunk attends to is written again by the timed run before it is read), then the whole
video runs timed, each chunk's DiT work followed by its streaming VAE decode on the same stream (the frames are
ready when the chunk's time ends). Every chunk runs its context pass (the player's case: the video continues).

Per case: seconds per chunk (DiT + decode, and each part), their mean over the video, peak VRAM and RSS, and the
outputs (the first model call's velocity and every chunk's x0) saved in --workdir; the parent compares them with
the `exact` case's (relative L2): `error_forward` (the very first call: same inputs in every case), `error_chunks`
(each chunk's x0, errors carried through the cache included), `error_video` (the whole latent).

`fp8_weights*` / `int8_weights` cases load the FP8 / INT8 copy of the same expert (`lingbot-world convert-fp8` /
`convert-int8` of the NF4 folder, made once in --workdir by a child process): e4m3 / int8 weights read as stored by
the GEMMs, no NF4 dequantization; their errors are against `exact`, the NF4 model, so they measure what the stored
weights and low-precision activations change.

`*_profile` cases: the 4th chunk under torch.profiler instead (device seconds by kernel category, top kernels and
operators, the device's busy share of the chunk's unprofiled wall time, and the compute stream's idle gaps by size,
those ending with a host->device copy counted as waits on it: what CUDA graphs could give back at most).
`*_host_gaps` cases: the same with Python stacks, each host-bound gap charged to the code the host was in
(trace_gaps.host_gap_sources).
`*_whole_card*` cases run without the 24 GB cap (the cache on the GPU, nothing streamed).
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import torch

from ..quant.lowp_kinds import LOWP_WEIGHTS
from ..wan.dit.model import DiTConfig
from .bench_fast import TINY_VIDEO, V480, child_start, fast_inputs
from .bench_pipeline import PACKAGE, bench_config, random_experts, sync
from .common import (
    CaseLoop,
    add_case_arguments,
    case_ok,
    child_main,
    in_gb,
    mib_in_gb,
    parse_cases,
    peak_rss_bytes,
    run_case_child,
    tiny_children,
)

MODULE = __spec__.name if __spec__ is not None else __name__
WINDOW, SINK = 21, 3
WARM_CHUNKS = 2
REFERENCE = "exact"
FRAMES_REFERENCE = "auto"  # the decode levers change frames, not latents: compared with auto's frames


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
    "auto_decode_bf16": dict(preset="auto", compile="blocks", levers=dict(decode_bf16=True), save_frames=True),
    "fast_overlap": dict(preset="fast", compile="blocks", levers=dict(decode_overlap=True, decode_bf16=True)),
    "draft_overlap": dict(preset="draft", compile="blocks", levers=dict(decode_overlap=True, decode_bf16=True)),
    "decode": dict(kind="decode"),  # the VAE's chunk decode alone, four ways
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
TARGETS_S = {"exact": None, "auto": 1.6, "fast": 1.0, "draft": 0.75}  # issue 26: per 12-frame chunk, one H100


# ---- the child ---------------------------------------------------------------------------------------------------
def child_case(spec: dict) -> dict:
    from safetensors.torch import save_file

    from ..memory.kv_placement import FastPlacement, plan_fast_memory
    from ..memory.placement import available_ram_bytes, free_vram_bytes
    from ..speed.decode import ChunkDecoder
    from ..speed.levers import ChunkLevers
    from ..speed.options import GRAPHS_ENV, apply_speed, graphs_enabled, resolve_speed
    from ..speed.presets import PRESETS, attach_preset, preset_options
    from ..wan.dit.kv_cache import cache_layout
    from ..wan.sampling.fast_sampler import FastRun, draw, make_generator
    from ..wan.vae.model import VAEConfig, WanVAE
    from ..speed.vae_norm import decoder_norm_silu
    from ..wan.vae.streaming import StreamingDecoder, streaming_decode_bytes
    from ..wan.vae.tiny import TinyStreamingDecoder

    if spec.get("graphs"):
        os.environ[GRAPHS_ENV] = "1"
    os.environ.update(spec.get("env", {}))  # a switch read where the kernels are picked (LINGBOT_NF4_ROWS=0)
    if spec.get("fp8_min_query_share"):
        from ..wan.dit import attention as attention_mod

        attention_mod.FP8_MIN_QUERY_SHARE = spec["fp8_min_query_share"]
    if spec.get("fp8_kernel") == "bits":  # as on an RTX 30xx: no hardware e4m3 conversion
        from ..speed import kv_fp8_fused

        kv_fp8_fused.HW_FP8_CAPABILITY = (99, 0)
    device, cuda, cfg, fr, h, w, out = child_start(spec)
    preset = PRESETS[spec["preset"]]
    levers = ChunkLevers(**{**preset.levers.__dict__, **spec.get("levers", {})})
    explicit = {k: spec[k] for k in ("compile", "compute", "attention") if spec.get(k)}
    weights = spec.get("weights", "nf4")
    plan_speed = attach_preset(resolve_speed(preset_options(preset.name, explicit), device, weights=weights),
                               preset.name)
    plan_speed.levers = levers
    out["speed"] = plan_speed.to_json()
    vae_cfg = VAEConfig.tiny() if spec["tiny"] else VAEConfig()
    torch.manual_seed(0)  # the same random VAE in every case: the same conditioning y
    with torch.device(device):
        vae = WanVAE(vae_cfg).eval().requires_grad_(False)
    inputs = fast_inputs(spec["video"], cfg, device, fr.latent_frames, vae)
    out["vae_encode_s"] = inputs["vae_encode_s"]
    if cuda:
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)
    window = levers.window(spec["window"], fr.latent_frames)
    layout = cache_layout(fr.latent_frames, (h // 16) * (w // 16), window_frames=window,
                          sink_frames=spec["sink"] if window is not None and window < fr.latent_frames else 0)
    out["layout"] = {"capacity": layout.capacity, "sink_tokens": layout.sink_tokens, "evict": layout.evict,
                     "window_frames": window}
    # the first chunk that ends past the window: from it on every chunk writes and reads the same slots
    out["rolled_from_chunk"] = next((c for c in range(fr.chunks) if window is not None and layout.evict
                                     and 3 * (c + 1) > window), None)
    vram = free_vram_bytes(device) if cuda else 1 << 60
    bf16_decode_planned = levers.decode_bf16 and not spec.get("vae_plan_f32")
    extra = streaming_decode_bytes(vae_cfg, h, w, bf16=bf16_decode_planned) if cuda else 0
    tiny = None
    if spec.get("tiny_vae"):  # the file in taew2_1's format, loaded as the doors load it
        from ..loaders.demo_checkpoint import DEMO_TINY_WIDTHS, write_random_tiny_vae
        from ..world.assembly import load_tiny, tiny_bytes

        path = write_random_tiny_vae(Path(spec["workdir"]) / f"taew2_1_{spec['case']}.safetensors",
                                     widths=DEMO_TINY_WIDTHS if spec["tiny"] else (256, 128, 64, 64))
        tiny = load_tiny(path, device)
        if not spec.get("tiny_plan_as_vae"):  # else the cache plan of the VAE's case: the decoder alone changes
            extra = tiny_bytes(tiny, h, w) if cuda else 0
    out["decode_bytes_planned"] = extra
    plan = plan_fast_memory(h, w, cfg, layout, vram, available_ram_bytes(), extra_vram=extra, weights=weights,
                            graphs=graphs_enabled(device), camera_film=spec.get("film", True),
                            film_host=spec.get("film_host", True), kv_fp8=levers.kv_fp8,
                            kv_codes_on_gpu=spec.get("kv_codes_on_gpu"))
    out["plan"] = plan.to_json()
    out["weights"] = weights
    if levers.kv_fp8:
        from ..speed.kv_fp8_fused import kv_fp8_ops

        out["kv_fp8_ops"] = kv_fp8_ops(device).name
    placement = FastPlacement(plan, device, lambda s: None)
    film = plan.make_film(device)  # every run of the case shares it (each chunk's camera slice starts it over)
    try:
        t0 = time.perf_counter()
        model = apply_speed(placement.load_model(spec["fast_lowp"].get(weights, spec["fast"]), weights), plan_speed)
        sync(device)
        out["load_s"] = round(time.perf_counter() - t0, 3)
        cache = placement.make_cache()
        options = dict(levers.fast_run_options(), device=device)

        def new_run(on_chunk=None, seed=42):
            gen = make_generator(seed, "cuda" if cuda else "cpu")
            noise = draw(gen, (1, 16, fr.latent_frames, h // 8, w // 8), device)
            return FastRun(model, noise, inputs["ctx"], inputs["y"], inputs["camera"], cache, gen,
                           on_chunk=on_chunk, film=film, **options)

        # warm-up: compile, attention plans and the decoder, on chunks the timed run writes again
        t0 = time.perf_counter()
        norm_silu = decoder_norm_silu(device)  # the decoder's kernels as every door builds them
        def new_decoder():
            return TinyStreamingDecoder(tiny) if tiny is not None else StreamingDecoder(vae, norm_silu=norm_silu)

        warm, warm_decoder = new_run(seed=7), new_decoder()
        # in the timed run's precision: a bf16 decode builds its own Triton kernels (0.76 s on an H100 when the
        # warm-up decoded in float32 only; fast_chunk_fused_h100.json)
        warm_decode = ChunkDecoder(warm_decoder.decode, device, bf16=levers.decode_bf16)
        warm_chunks, warm_s = warm.chunks if spec.get("warm_video") else min(WARM_CHUNKS, warm.chunks), []
        with torch.inference_mode():
            for _ in range(warm_chunks):
                t_chunk = time.perf_counter()
                warm_decode.submit(warm.next_chunk()).result()
                sync(device)
                warm_s.append(round(time.perf_counter() - t_chunk, 4))
        out["warm_up_s"] = round(time.perf_counter() - t0, 3)
        out["warm_chunk_s"] = warm_s
        warm_decoder.close()
        del warm
        cache.global_end = cache.local_end = 0
        if spec.get("profile"):
            from .bench_fast import profile_chunk

            out["profile"] = profile_chunk(new_run(), device, host_gaps=spec.get("host_gaps", False))
            return out

        first_call: list = []
        hook = model.register_forward_hook(
            lambda mod, args, result: first_call.append(result.float().cpu()) if not first_call else None)
        decoder = ChunkDecoder(new_decoder().decode, device,
                               overlap=levers.decode_overlap, bf16=levers.decode_bf16)
        marks: list[tuple] = []
        latents: list[torch.Tensor] = []
        pending: list = []

        def on_chunk(index: int, x0: torch.Tensor) -> None:
            latents.append(x0.cpu())  # waits for the chunk's DiT (a copy to the host)
            t_dit = time.perf_counter()
            pending.append(decoder.submit(x0))
            if not decoder.overlapped:
                sync(device)
            else:  # the frames of the chunk before are due now (the player shows them)
                if len(pending) > 1:
                    pending[-2].result()
            marks.append((t_dit, time.perf_counter()))

        run = new_run(on_chunk)
        uploaded_before = (placement.placement.stats() or {}).get("uploaded_bytes", 0)
        if cuda:
            torch.cuda.reset_peak_memory_stats(device)
        sync(device)
        t_start = time.perf_counter()
        with torch.inference_mode():
            run.run()
            frames = [p.result() for p in pending]
        sync(device)
        out["video_s"] = round(time.perf_counter() - t_start, 3)
        out["frames_out"] = sum(f.shape[2] for f in frames)
        if spec.get("save_frames"):
            save_file({"frames": torch.cat([f.float().cpu() for f in frames], dim=2)[:, :, ::4].contiguous()},
                      str(Path(spec["workdir"]) / f"frames_{spec['case']}.safetensors"))
        del frames
        hook.remove()
        starts = [t_start] + [m[1] for m in marks[:-1]]
        out["chunk_s"] = [round(e - s, 4) for s, (_, e) in zip(starts, marks)]
        out["dit_s"] = [round(d - s, 4) for s, (d, _) in zip(starts, marks)]
        out["decode_s"] = [round(e - d, 4) for d, e in marks]
        out["calls_per_chunk"] = run.model_calls / run.chunks
        latent = torch.cat(latents, dim=2)
        out["finite"] = bool(torch.isfinite(latent).all())
        save_file({"latent": latent.contiguous(), "first_call": first_call[0].contiguous()},
                  str(Path(spec["workdir"]) / f"outputs_{spec['case']}.safetensors"))
        if cuda:
            out["peak_allocated"] = torch.cuda.max_memory_allocated(device)
            out["peak_reserved"] = torch.cuda.max_memory_reserved(device)
            out["alloc_retries"] = torch.cuda.memory_stats(device).get("num_alloc_retries", 0)
        out["stream"] = placement.placement.stats() if placement.placement else None
        runner = getattr(model, "block_runner", None)
        out["graphs"] = runner.stats() if runner is not None else None
        out["film"] = film.to_json() if film is not None else None
        if film is not None and "host" in film.stores:
            out["film"]["host_store"] = film.stores["host"].stats()
        out["uploaded_bytes_timed"] = (out["stream"] or {}).get("uploaded_bytes", 0) - uploaded_before
        out["peak_rss_sampling"] = peak_rss_bytes()
    finally:
        if film is not None:
            film.close()
        placement.close()
    return out


def child_decode(spec: dict) -> dict:
    """The streaming decode of a 21-latent-frame video chunk by chunk, alone: float32 and bf16 under autocast, each
    with the eager norm + SiLU and with the fused kernel every door uses on a CUDA GPU (speed/vae_norm.py), and
    bf16 also with cuDNN's autotuner (torch.backends.cudnn.benchmark); seconds per chunk after one warm-up video,
    and each variant's frames against eager float32's (relative L2)."""
    from ..speed.decode import ChunkDecoder
    from ..speed.vae_norm import decoder_norm_silu
    from ..wan.vae.model import VAEConfig, WanVAE
    from ..wan.vae.streaming import StreamingDecoder

    device = torch.device(spec["device"])
    frames, h, w = spec["video"]
    lat = (frames - 1) // 4 + 1
    lat -= lat % 3
    torch.manual_seed(0)
    with torch.device(device):
        vae = WanVAE(VAEConfig.tiny() if spec["tiny"] else VAEConfig()).eval().requires_grad_(False)
    z = torch.randn(1, 16, lat, h // 8, w // 8, generator=torch.Generator().manual_seed(1)).to(device)
    out: dict = {"latent_frames": lat}
    ref = None
    fused = decoder_norm_silu(device)
    for name, bf16, bench, norm_silu in (("fp32", False, False, None), ("bf16", True, False, None),
                                         ("fp32_fused", False, False, fused), ("bf16_fused", True, False, fused),
                                         ("bf16_fused_cudnn_benchmark", True, True, fused)):
        torch.backends.cudnn.benchmark = bench
        times = []
        for rep in range(2):  # the first video warms up (and lets the autotuner choose)
            dec = ChunkDecoder(StreamingDecoder(vae, norm_silu=norm_silu).decode, device, bf16=bf16)
            got = []
            for c in range(0, lat, 3):
                sync(device)
                t0 = time.perf_counter()
                got.append(dec.submit(z[:, :, c:c + 3]).result())
                sync(device)
                times.append(time.perf_counter() - t0)
            if rep == 0:
                times = []
        video = torch.cat([g[:, :, ::4].float().cpu() for g in got], dim=2)
        ref = video if ref is None else ref
        out[name] = {"s_per_chunk": round(sum(times) / len(times), 4), "first_chunk_s": round(times[0], 4),
                     "error_vs_fp32": round(rel_l2(video, ref), 6)}
    torch.backends.cudnn.benchmark = False
    return out


def child_link(spec: dict) -> dict:
    """The host link alone: GB/s of copies between pinned RAM and the device, one way, the other, and both at once
    (two streams): how much room the K/V stream leaves for the camera FiLM streamed from RAM."""
    device = torch.device(spec["device"])
    cuda = device.type == "cuda"
    nbytes = (64 if spec["tiny"] else 1024) * 1024**2
    host_a = torch.empty(nbytes, dtype=torch.uint8, pin_memory=cuda)
    host_b = torch.empty_like(host_a, pin_memory=cuda)
    dev_a = torch.ones(nbytes, dtype=torch.uint8, device=device)
    dev_b = torch.empty(nbytes, dtype=torch.uint8, device=device)
    streams = [torch.cuda.Stream(device), torch.cuda.Stream(device)] if cuda else [None, None]

    def timed(copies) -> float:
        best = float("inf")
        for _ in range(5):
            sync(device)
            t0 = time.perf_counter()
            for stream, dst, src in copies:
                if cuda:
                    with torch.cuda.stream(stream):
                        dst.copy_(src, non_blocking=True)
                else:
                    dst.copy_(src)
            sync(device)
            best = min(best, time.perf_counter() - t0)
        return best

    out = {"bytes": nbytes}
    for name, copies in (("h2d", [(streams[0], dev_b, host_a)]), ("d2h", [(streams[1], host_b, dev_a)]),
                         ("both", [(streams[0], dev_b, host_a), (streams[1], host_b, dev_a)])):
        t = timed(copies)
        out[name] = {"seconds": round(t, 5), "gb_per_s_each_way": round(nbytes / t / 1e9, 2)}
    return out


CHILDREN = {"fast_speed": child_case, "decode": child_decode, "link": child_link}


# ---- the parent --------------------------------------------------------------------------------------------------
def rel_l2(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.double() - b.double()).norm() / b.double().norm())


def errors_against_reference(workdir: Path, name: str) -> dict:
    """Relative L2 of the case's saved outputs against its reference case's (`exact` unless the case names
    another): first call, each chunk, the video."""
    from safetensors.torch import load_file

    reference = CASES.get(name, {}).get("reference", REFERENCE)
    mine, ref = workdir / f"outputs_{name}.safetensors", workdir / f"outputs_{reference}.safetensors"
    if name == reference or not mine.is_file() or not ref.is_file():
        return {}
    a, b = load_file(str(mine)), load_file(str(ref))
    la, lb = a["latent"], b["latent"]
    if la.shape != lb.shape:  # another video length: nothing to compare
        return {}
    out = {"error_reference": reference, "error_forward": round(rel_l2(a["first_call"], b["first_call"]), 6),
           "error_chunks": [round(rel_l2(la[:, :, i:i + 3], lb[:, :, i:i + 3]), 6) for i in range(0, lb.shape[2], 3)],
           "error_video": round(rel_l2(la, lb), 6)}
    mine, ref = workdir / f"frames_{name}.safetensors", workdir / f"frames_{FRAMES_REFERENCE}.safetensors"
    if name != FRAMES_REFERENCE and mine.is_file() and ref.is_file():  # every 4th frame
        out["error_frames_vs_auto"] = round(rel_l2(load_file(str(mine))["frames"], load_file(str(ref))["frames"]), 6)
    return out


def summarize(res: dict, workdir: Path) -> dict:
    s: dict = {}
    for name, r in res["cases"].items():
        if not case_ok(r):
            continue
        if CASES.get(name, {}).get("kind") == "decode":
            s[name] = {k: v for k, v in r.items() if isinstance(v, dict) and "s_per_chunk" in v}
            continue
        if CASES.get(name, {}).get("kind") == "link":
            s[name] = {k: v["gb_per_s_each_way"] for k, v in r.items() if isinstance(v, dict)}
            continue
        if r.get("profile"):
            pr = r["profile"]
            split = dict(pr["split"]["seconds"])
            # host<->device copies run on the copy engines beside the kernels; profile_split counts them as
            # "elementwise": take them out so the split and the busy share are the compute engines' alone
            copies = sum(v for k, v in pr["split"]["top_kernels"] if k.startswith("Memcpy"))
            split["elementwise"] = round(split["elementwise"] - copies, 4)
            kernels = round(pr["split"]["kernel_seconds"] - copies, 4)
            wall = pr["wall_s_around"]
            s[name] = {"device_s": kernels, "copies_s": round(copies, 4), "wall_s_around": wall,
                       "device_busy_share": round(kernels / wall, 3) if wall else None, "device_split_s": split,
                       "compute_stream": pr["split"].get("compute_stream"), "host_gaps": pr["split"].get("host_gaps")}
            continue
        chunks = r["chunk_s"]
        mean = lambda xs: round(sum(xs) / len(xs), 4)  # noqa: E731
        # the whole video (every frame decoded) over its chunks: with an overlapped decode a chunk's own time
        # holds the decode of the chunk before, so only the video's time compares across cases
        row = {"preset": r["speed"]["preset"], "weights": r.get("weights", "nf4"),
               "speed": {k: r["speed"][k] for k in ("compile", "compute", "attention")},
               "levers": r["speed"]["levers"], "mean_chunk_s": round(r["video_s"] / len(chunks), 4),
               "mean_dit_s": mean(r["dit_s"]), "mean_decode_s": mean(r["decode_s"]), "first_chunk_s": chunks[0],
               "calls_per_chunk": r["calls_per_chunk"],
               "s_per_call": round(mean(r["dit_s"]) / r["calls_per_chunk"], 4),
               "fps": round(12 / mean(chunks), 2), "peak_reserved_gb": in_gb(r.get("peak_reserved")),
               "smi_peak_gb": mib_in_gb(r.get("smi_peak_used_mib")), "peak_rss_gb": in_gb(r.get("peak_rss")),
               "cache_layers_on_gpu": r["plan"].get("cache_layers_on_gpu"), "warm_up_s": r.get("warm_up_s"),
               "warm_chunk_s": r.get("warm_chunk_s"),
               "full_window_chunk_s": chunks[-1],
               "uploaded_gb_per_chunk": round(r.get("uploaded_bytes_timed", 0) / 1e9 / len(chunks), 2),
               "film_blocks": [r["plan"].get("film_blocks", 0), r["plan"].get("film_host_blocks", 0)]}
        rolled = r.get("rolled_from_chunk")
        if rolled is not None and rolled + 1 < len(chunks):  # the rolled chunks after the one that captures
            row.update(rolling_chunk_s=mean(chunks[rolled + 1:]), rolling_dit_s=mean(r["dit_s"][rolled + 1:]),
                       rolling_decode_s=mean(r["decode_s"][rolled + 1:]), capture_chunk_s=chunks[rolled],
                       rolling_chunks=len(chunks) - rolled - 1, graphs=r.get("graphs"))
        row.update(errors_against_reference(workdir, name))
        target = TARGETS_S.get(name)
        if target is not None:
            row["target_s"] = target
            row["met"] = row["mean_chunk_s"] <= target
        s[name] = row
    return s


def print_report(res: dict) -> None:
    print("\n| case | preset / options / levers | s per chunk (DiT + decode) | DiT | decode | fps | error per forward "
          "| error per chunk (first / last) | peak reserved | nvidia-smi | RSS |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for name, r in res["cases"].items():
        if "error" in r:
            print(f"| {name} | ERROR: {r['error'][:160]} | | | | | | | | | |")
            continue
        row = res.get("summary", {}).get(name, {})
        if CASES.get(name, {}).get("kind") in ("decode", "link"):
            print(f"| {name} | {CASES[name]['kind']} alone: {json.dumps(row)} | | | | | | | | | |")
            continue
        if r.get("profile"):
            print(f"| {name} | profiled chunk: kernels {row.get('device_s')} s of ~{row.get('wall_s_around')} s "
                  f"(busy {row.get('device_busy_share')}), copies {row.get('copies_s')} s beside them, "
                  f"{json.dumps(row.get('device_split_s'))} | | | | | | | | | |")
            continue
        errs = row.get("error_chunks") or []
        print(f"| {name} | {row['preset']} {row.get('weights', 'nf4')} weights {json.dumps(row['speed'])} "
              f"{json.dumps(row['levers'])} | "
              f"{row['mean_chunk_s']} | {row['mean_dit_s']} | {row['mean_decode_s']} | {row['fps']} | "
              f"{row.get('error_forward', '-')} | {errs[0] if errs else '-'} / {errs[-1] if errs else '-'} | "
              f"{row['peak_reserved_gb']} GB | {row['smi_peak_gb']} GB | {row['peak_rss_gb']} GB |")


def run(args) -> dict:
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    cfg = DiTConfig(**{**bench_config(args.tiny).__dict__, "causal": True})
    workdir = Path(args.workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    loop = CaseLoop(args, "fast_speed", device, lambda res: res.update(summary=summarize(res, workdir)),
                    config=cfg.to_json(),
                    notes=["per chunk: the chunk's DiT calls (steps + its context pass) and its streaming VAE decode, "
                           "timed after two warm-up chunks; mean over the video",
                           f"errors: relative L2 against the '{REFERENCE}' case's outputs (same seed and inputs)"])
    paths = {"fast": workdir / "lingbot_world_fast_bnb_nf4"}
    experts = random_experts(loop, paths, {"fast": cfg}, device)
    lowp_paths = {kind: workdir / f"lingbot_world_fast_{kind}" for kind in LOWP_WEIGHTS}
    for kind in sorted({CASES[c].get("weights") for c in args.cases} & set(LOWP_WEIGHTS)):
        loop.res[f"{kind}_copy"] = lowp_copy(paths["fast"], lowp_paths[kind], kind, device,
                                             timeout=max(60.0, loop.remaining()))
        loop.save()

    def run_case(name: str, timeout: float) -> dict:
        c = CASES[name]
        video = TINY_VIDEO["fast"] if args.tiny else V480
        if c.get("chunks"):  # a longer video of the same size: 3 latent frames per chunk, 4 frames per latent
            video = (4 * (3 * c["chunks"] - 1) + 1, *video[1:])
        spec = {"case": name, "kind": c.get("kind", "fast_speed"), "device": device, "tiny": args.tiny,
                "video": list(video), "config": cfg.to_json(), "fast": experts["paths"]["fast"], "workdir": str(workdir),
                "fast_lowp": {kind: str(p) for kind, p in lowp_paths.items()},
                "cap_gib": c.get("cap_gib", 24) if device == "cuda" else None, "context_gib": args.context_gib,
                "window": 6 if args.tiny else WINDOW, "sink": 1 if args.tiny else SINK, "expandable_segments": True,
                **{k: v for k, v in c.items() if k in ("preset", "compile", "compute", "attention", "levers",
                                                       "profile", "save_frames", "weights", "host_gaps",
                                                       "graphs", "film", "film_host", "vae_plan_f32", "fp8_kernel",
                                                       "tiny_vae", "tiny_plan_as_vae", "env", "warm_video",
                                                       "kv_codes_on_gpu")}}
        if args.tiny:
            spec.pop("compile", None)
            if spec.get("levers", {}).get("decode_bf16") and device == "cpu":
                spec["levers"] = {**spec["levers"], "decode_bf16": False}  # CPU autocast: minutes on 2 cores
        return run_case_child(spec, workdir, timeout, MODULE)

    return loop.run(run_case, workdir, written=[*paths.values(), *lowp_paths.values()])


def lowp_copy(nf4: Path, out: Path, kind: str, device: str, timeout: float) -> dict:
    """The FP8 / INT8 copy of the random NF4 expert (`lingbot-world convert-<kind>`, in a child process so this
    one never touches the GPU), reused while it is newer than the NF4 file."""
    weights = out / "model.safetensors"
    if weights.is_file() and weights.stat().st_mtime >= (nf4 / "model.safetensors").stat().st_mtime:
        return {"path": str(out), "reused": True}
    if out.exists():
        shutil.rmtree(out)  # a copy of an older NF4 expert (the converter never replaces a folder)
    print(f"[{kind}] converting {nf4.name} to {kind.upper()} in {out} ...", flush=True)
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", PACKAGE, f"convert-{kind}", str(nf4), str(out), "--device", device],
                          capture_output=True, text=True, timeout=timeout)
    if proc.returncode != 0:
        raise RuntimeError(f"convert-{kind} failed (exit {proc.returncode}):\n{proc.stdout[-2000:]}{proc.stderr[-2000:]}")
    stats = json.loads(proc.stdout[proc.stdout.index("{"):])
    return {"path": str(out), "made_s": round(time.perf_counter() - t0, 1), "stats": stats}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_case_arguments(p, CASES, DEFAULT_CASES, budget_s=540.0, min_case_s=40.0,
                       tiny_help="tiny config and video on the CPU (smoke run)",
                       workdir="/tmp/lingbot_fast_speed", workdir_help="where the Fast expert and the outputs go",
                       keep_help="keep the expert for the next call")
    p.add_argument("--context-gib", type=float, default=0.5, help="GiB a real card loses to the CUDA context")
    args = p.parse_args(argv)
    if args.child:
        return child_main(args.child, CHILDREN)
    args.cases = parse_cases(p, args.cases, CASES)
    with tiny_children(args.tiny):  # one thread per child process, the caller's environment kept
        res = run(args)
    print_report(res)
    if args.out:
        print(f"results: {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
