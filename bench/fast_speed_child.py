"""bench_fast_speed's children: one case in a process of its own (the model loaded, the preset's plan applied, warm-up
chunks, then the timed video and its streaming decode), the VAE's chunk decode alone, and the host link alone."""
from __future__ import annotations

import os
import time
from pathlib import Path

import torch

from .fast_child import child_start, fast_inputs
from .bench_models import spec_recipe
from .pipeline_setup import sync
from .common import peak_rss_bytes

WARM_CHUNKS = 2


def rel_l2(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.double() - b.double()).norm() / b.double().norm())


def output_path(workdir, what: str, case: str, model: str = "v1-fast") -> Path:
    """Where a case's saved outputs ("outputs": latents and first call; "frames") go: v1 Fast's under the names
    they always had, another model's with its name in them (the errors compare cases of one model only)."""
    tag = "" if model == "v1-fast" else f"{model}_"
    return Path(workdir) / f"{what}_{tag}{case}.safetensors"


def child_case(spec: dict) -> dict:
    from safetensors.torch import save_file

    from ..memory.fast_planner import plan_fast_memory
    from ..memory.kv_placement import FastPlacement
    from ..memory.resident_weights import apply_resident_weights
    from ..memory.estimates import available_ram_bytes, free_vram_bytes
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
    recipe = spec_recipe(spec)  # the model's chunk size, schedule (and its fewer-step variants), camera form
    preset = PRESETS[spec["preset"]]
    levers = ChunkLevers(**{**preset.levers.__dict__, **spec.get("levers", {})})
    explicit = {k: spec[k] for k in ("compile", "compute", "attention") if spec.get(k)}
    weights = spec.get("weights", "nf4")
    plan_speed = attach_preset(resolve_speed(preset_options(preset.name, explicit), device, weights=weights),
                               preset.name)
    plan_speed.levers = levers
    from ..speed.options import fit_to_model

    plan_speed = fit_to_model(plan_speed, cfg)  # as the doors do: a narrow model runs --compile auto eagerly
    out["speed"] = plan_speed.to_json()
    vae_cfg = VAEConfig.tiny() if spec["tiny"] else VAEConfig()
    torch.manual_seed(0)  # the same random VAE in every case: the same conditioning y
    with torch.device(device):
        vae = WanVAE(vae_cfg).eval().requires_grad_(False)
    inputs = fast_inputs(spec["video"], cfg, device, fr.latent_frames, vae, camera_form=recipe.camera_form)
    out["vae_encode_s"] = inputs["vae_encode_s"]
    if cuda:
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)
    window = levers.window(spec["window"], fr.latent_frames)
    layout = cache_layout(fr.latent_frames, (h // 16) * (w // 16), recipe.chunk_frames, window_frames=window,
                          sink_frames=spec["sink"] if window is not None and window < fr.latent_frames else 0,
                          release=(recipe.window, recipe.sink))
    out["layout"] = {"capacity": layout.capacity, "sink_tokens": layout.sink_tokens, "evict": layout.evict,
                     "window_frames": window}
    # the first chunk that ends past the window: from it on every chunk writes and reads the same slots
    out["rolled_from_chunk"] = next((c for c in range(fr.chunks) if window is not None and layout.evict
                                     and recipe.chunk_frames * (c + 1) > window), None)
    vram = free_vram_bytes(device) if cuda else 1 << 60
    half_decode_planned = levers.decode_dtype != "float32" and not spec.get("vae_plan_f32")
    extra = streaming_decode_bytes(vae_cfg, h, w, half=half_decode_planned) if cuda else 0
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
                            graphs=graphs_enabled(device, cfg), camera_film=spec.get("film", True),
                            film_host=spec.get("film_host", True), kv_fp8=levers.kv_fp8,
                            kv_codes_on_gpu=spec.get("kv_codes_on_gpu"), compute=plan_speed.compute,
                            resident_weights=spec.get("resident", True))
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
        out["resident_weight_bytes"] = apply_resident_weights(model, plan)  # as the World session does
        sync(device)
        out["load_s"] = round(time.perf_counter() - t0, 3)
        cache = placement.make_cache()
        options = {"schedule": recipe.schedule(), **levers.fast_run_options(recipe), "device": device,
                   "chunk_frames": recipe.chunk_frames}

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
        # in the timed run's precision: a half-precision decode builds its own Triton kernels (0.76 s on an H100
        # when the warm-up decoded in float32 only; fast_chunk_fused_h100.json)
        warm_decode = ChunkDecoder(warm_decoder.decode, device, dtype=levers.decode_dtype)
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
            from .fast_child import profile_chunk

            out["profile"] = profile_chunk(new_run(), device, host_gaps=spec.get("host_gaps", False))
            return out

        first_call: list = []
        hook = model.register_forward_hook(
            lambda mod, args, result: first_call.append(result.float().cpu()) if not first_call else None)
        decoder = ChunkDecoder(new_decoder().decode, device,
                               overlap=levers.decode_overlap, dtype=levers.decode_dtype)
        marks: list[tuple] = []
        latents: list[torch.Tensor] = []
        pending: list = []
        captures: list[int] = []  # the CUDA graphs captured by the end of each chunk (the rolled mean skips those)

        def on_chunk(index: int, x0: torch.Tensor) -> None:
            latents.append(x0.cpu())  # waits for the chunk's DiT (a copy to the host)
            captures.append(getattr(model.block_runner, "captures", 0))  # 0: no graphs
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
                      str(output_path(spec["workdir"], "frames", spec["case"], spec.get("model", "v1-fast"))))
        del frames
        hook.remove()
        starts = [t_start] + [m[1] for m in marks[:-1]]
        out["chunk_s"] = [round(e - s, 4) for s, (_, e) in zip(starts, marks)]
        out["dit_s"] = [round(d - s, 4) for s, (d, _) in zip(starts, marks)]
        out["decode_s"] = [round(e - d, 4) for d, e in marks]
        out["calls_per_chunk"] = run.model_calls / run.chunks
        out["captures_by_chunk"] = captures
        latent = torch.cat(latents, dim=2)
        out["finite"] = bool(torch.isfinite(latent).all())
        save_file({"latent": latent.contiguous(), "first_call": first_call[0].contiguous()},
                  str(output_path(spec["workdir"], "outputs", spec["case"], spec.get("model", "v1-fast"))))
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
    """The streaming decode of the video (v1 Fast: 21 latent frames) chunk by chunk (the model's chunks), alone:
    float32 and bf16 under autocast, each with the eager norm + SiLU and with the fused kernel every door uses on a
    CUDA GPU (speed/vae_norm.py), fp16 under autocast with the fused kernel, and bf16 also with cuDNN's autotuner (torch.backends.cudnn.benchmark); seconds per
    chunk after one warm-up video, and each variant's frames against eager float32's (relative L2)."""
    from ..speed.decode import ChunkDecoder
    from ..speed.vae_norm import decoder_norm_silu
    from ..wan.vae.model import VAEConfig, WanVAE
    from ..wan.vae.streaming import StreamingDecoder

    device = torch.device(spec["device"])
    frames, h, w = spec["video"]
    chunk = spec_recipe(spec).chunk_frames
    lat = (frames - 1) // 4 + 1
    lat -= lat % chunk
    torch.manual_seed(0)
    with torch.device(device):
        vae = WanVAE(VAEConfig.tiny() if spec["tiny"] else VAEConfig()).eval().requires_grad_(False)
    z = torch.randn(1, 16, lat, h // 8, w // 8, generator=torch.Generator().manual_seed(1)).to(device)
    out: dict = {"latent_frames": lat}
    ref = None
    fused = decoder_norm_silu(device)
    for name, dtype, bench, norm_silu in (("fp32", "float32", False, None), ("bf16", "bf16", False, None),
                                          ("fp32_fused", "float32", False, fused), ("bf16_fused", "bf16", False, fused),
                                          ("fp16_fused", "fp16", False, fused),
                                          ("bf16_fused_cudnn_benchmark", "bf16", True, fused)):
        torch.backends.cudnn.benchmark = bench
        times = []
        for rep in range(2):  # the first video warms up (and lets the autotuner choose)
            dec = ChunkDecoder(StreamingDecoder(vae, norm_silu=norm_silu).decode, device, dtype=dtype)
            got = []
            for c in range(0, lat, chunk):
                sync(device)
                t0 = time.perf_counter()
                got.append(dec.submit(z[:, :, c:c + chunk]).result())
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
