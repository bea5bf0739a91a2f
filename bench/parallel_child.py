"""bench_parallel's children: one case on every rank of a fresh process group (rank 0 returns the JSON).

Run as `python -m lingbot_world.bench.bench_parallel --child SPEC` (alone, or under torch.distributed.run for two
GPUs): bench_parallel's main hands the spec to CHILDREN. `child_base` times the real sampler of one base expert
(sequential CFG, CFG-parallel or Ulysses), `child_fast` the Fast model's chunks (Ulysses: tokens and K/V cache heads
split; issue 26's conditions with rank 0 decoding); both time the parallel exchanges alone at the case's shapes.
"""
from __future__ import annotations

import time
from pathlib import Path
from typing import Optional

import torch

from ..wan.dit.model import DiTConfig
from .pipeline_setup import make_inputs, schedule, sync
from .common import peak_rss_bytes

ISSUE_CAP_GIB, ISSUE_WARM_CHUNKS = 24, 2


# ---- children (every rank runs one; rank 0 prints the JSON) -----------------------------------------------------
def _session(spec: dict):
    from ..parallel.group import Session

    device = torch.device(spec["device"])
    if spec["gpus"] == 1:
        if device.type == "cuda":
            torch.cuda.set_device(0)
            device = torch.device("cuda", 0)
        return Session.single(device)
    return Session.start(device.type, timeout_s=spec["timeout_s"])


def _speed(device: torch.device, compile: str = "off"):
    from ..speed.options import SpeedOptions, apply_speed, resolve_speed

    plan = resolve_speed(SpeedOptions(compile=compile, compute="bf16", attention="auto"), device)
    return lambda model: apply_speed(model, plan)


def _attach(session, model):
    from ..parallel.ulysses import SequenceParallel

    if session.sp_degree > 1:
        model.set_seq_parallel(SequenceParallel(session.sp_degree, session.layout.sp_rank(session.rank),
                                                session.sp_group, model.cfg.num_heads))
    return model


def _peaks(device: torch.device) -> dict:
    if device.type != "cuda":
        return {"peak_rss": peak_rss_bytes()}
    return {"peak_allocated": torch.cuda.max_memory_allocated(device),
            "peak_reserved": torch.cuda.max_memory_reserved(device), "peak_rss": peak_rss_bytes()}


def _save_output(spec: dict, session, tensor: torch.Tensor) -> None:
    """Rank 0 keeps the case's output so the parent can measure how far 2 GPUs are from 1 (bf16 rounding)."""
    if session.is_main and spec.get("workdir"):
        from safetensors.torch import save_file

        save_file({"out": tensor.detach().float().cpu().contiguous()}, str(Path(spec["workdir"]) /
                                                                          f"out_{spec['case']}.safetensors"))


def _comm_block(session, tokens: int, cfg: DiTConfig, batch: int, iters: int, dtype) -> Optional[float]:
    """Seconds of one block's Ulysses exchanges (q, k, v to heads, the output back) at this shape, timed alone."""
    sp = None
    from ..parallel.ulysses import SequenceParallel

    if session.sp_degree < 2:
        return None
    sp = SequenceParallel(session.sp_degree, session.layout.sp_rank(session.rank), session.sp_group, cfg.num_heads)
    per = sp.shard(tokens)[1]
    device = session.device
    x = torch.randn(batch, per, cfg.num_heads, cfg.head_dim, device=device, dtype=dtype)

    def block():
        heads = [sp.to_heads(x) for _ in range(3)]
        sp.to_tokens(heads[0])

    block()
    sync(device)
    t0 = time.perf_counter()
    for _ in range(iters):
        block()
    sync(device)
    return (time.perf_counter() - t0) / iters


def _gather_timing(session, shape, iters: int) -> Optional[float]:
    """Seconds of the CFG exchange (all-gather of one float32 velocity) alone."""
    import torch.distributed as dist

    if session.layout.cfg < 2:
        return None
    v = torch.randn(*shape, device=session.device)
    parts = [torch.empty_like(v) for _ in range(2)]
    dist.all_gather(parts, v, group=session.cfg_group)
    sync(session.device)
    t0 = time.perf_counter()
    for _ in range(iters):
        dist.all_gather(parts, v, group=session.cfg_group)
    sync(session.device)
    return (time.perf_counter() - t0) / iters


def child_base(spec: dict) -> dict:
    from ..memory.placement import make_provider
    from ..parallel.cfg import CFGParallel
    from ..parallel.layout import plan_layout
    from ..wan.sampling.sampler import make_noise, sample

    session = _session(spec)
    device = session.device
    try:
        cfg = DiTConfig.from_json(spec["config"])
        session.set_layout(plan_layout(spec["mode"] if session.parallel else "off", session.world, cfg.num_heads))
        video = tuple(spec["video"])
        inputs = make_inputs(video, cfg, device)
        speed = _speed(device)
        prov = make_provider("resident", spec["base"], spec["base"], device, video=video, cfg_mode="sequential",
                             seq_parallel=session.sp_degree, log=lambda s: None,
                             prepare=lambda m: (speed(m), _attach(session, m)))
        settings = schedule(1 + spec["timed"], 0)
        settings.cfg_mode = "sequential"
        velocity = CFGParallel(session.layout.cfg_rank(session.rank), session.cfg_group) if session.layout.cfg == 2 \
            else None
        ends: list[float] = []

        def on_step(info) -> None:
            sync(device)
            ends.append(time.perf_counter())

        noise = make_noise(inputs["shape"], 42, "cuda" if device.type == "cuda" else "cpu", device=device)
        t_load = time.perf_counter()
        prov.acquire("high")
        sync(device)
        load_s = time.perf_counter() - t_load
        weights = torch.cuda.memory_allocated(device) if device.type == "cuda" else None
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)
        t0 = time.perf_counter()
        try:
            with torch.inference_mode():
                latent = sample(prov, noise, inputs["ctx"], inputs["neg"], inputs["y"], inputs["camera"], settings,
                                device=device, callback=on_step, velocity=velocity)
            finite = bool(torch.isfinite(latent).all())
            _save_output(spec, session, latent)
        finally:
            prov.close()
        steps = [b - a for a, b in zip([t0] + ends[:-1], ends)]
        mine = {"rank": session.rank, "device": str(device), "load_s": round(load_s, 2), "weights_allocated": weights,
                "plan": prov.plan.reason, **_peaks(device), "finite": finite,
                "step_s": [round(s, 3) for s in steps]}
        if device.type == "cuda":
            torch.cuda.empty_cache()
        tokens = (video[0] - 1) // 4 + 1
        lat_h, lat_w = video[1] // 8, video[2] // 8
        tokens *= (lat_h // 2) * (lat_w // 2)
        dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
        block = _comm_block(session, tokens, cfg, 1, spec["comm_iters"], dtype)
        if block is not None:
            mine["comm_step_s"] = round(block * cfg.num_layers * 2, 4)  # 40 blocks x 2 passes (sequential CFG)
        gather = _gather_timing(session, inputs["shape"], spec["comm_iters"])
        if gather is not None:
            mine["comm_step_s"] = round(gather, 5)
        every = session.gather_json(mine, "collecting results")
        out = {"layout": session.layout.describe(), "ranks": every,
               "s_per_step": round(max(sum(r["step_s"][1:]) / max(1, len(r["step_s"]) - 1) for r in every), 3),
               "warmup_step_s": max(r["step_s"][0] for r in every)}
        if any("comm_step_s" in r for r in every):
            out["comm_step_s"] = max(r.get("comm_step_s", 0) for r in every)
        return out if session.is_main else {}
    finally:
        session.close()


def child_fast(spec: dict) -> dict:
    from ..memory.fast_planner import plan_fast_memory
    from ..memory.kv_placement import FastPlacement
    from ..memory.estimates import available_ram_bytes, free_vram_bytes
    from ..parallel.layout import plan_layout
    from ..wan.dit.kv_cache import cache_layout
    from ..wan.sampling.fast_sampler import FastRun, draw, fast_frames, make_generator
    from ..speed.vae_norm import decoder_norm_silu
    from ..wan.vae.streaming import StreamingDecoder, streaming_decode_bytes
    from .fast_child import fast_inputs
    from .bench_models import spec_recipe

    session = _session(spec)
    device = session.device
    cuda = device.type == "cuda"
    issue = bool(spec.get("issue"))
    try:
        if issue and cuda:
            from .pipeline_setup import apply_cap

            apply_cap(device, ISSUE_CAP_GIB, spec.get("context_gib", 0.5))
        cfg = DiTConfig.from_json(spec["fast_config"])
        session.set_layout(plan_layout("ulysses" if session.parallel else "off", session.world, cfg.num_heads,
                                       model="fast"))
        frames, h, w = spec["video"]
        recipe = spec_recipe(spec)  # v1 Fast's: the parallel cases run issue 26's video
        fr = fast_frames(frames, chunk=recipe.chunk_frames)
        inputs = fast_inputs(spec["video"], cfg, device, fr.latent_frames)
        fsl = (h // 16) * (w // 16)
        layout = cache_layout(fr.latent_frames, fsl, window_frames=spec.get("window"), sink_frames=spec.get("sink", 0))
        vram = free_vram_bytes(device) if cuda else 1 << 60
        vae = _issue_vae(spec, session, device) if issue else None
        extra = streaming_decode_bytes(vae.cfg, h, w) if vae is not None and cuda else 0
        plan = plan_fast_memory(h, w, cfg, layout, vram, available_ram_bytes(), seq_parallel=session.sp_degree,
                                extra_vram=extra)
        placement = FastPlacement(plan, device, lambda s: None)
        film = plan.make_film(device)  # the camera FiLM kept per chunk, as the session does
        ends: list[float] = []
        try:
            t0 = time.perf_counter()
            speed = _speed(device, "blocks" if issue and cuda else "off")
            model = _attach(session, speed(placement.load_model(spec["fast"], "nf4")))
            cache = placement.make_cache()
            sync(device)
            load_s = time.perf_counter() - t0
            weights = torch.cuda.memory_allocated(device) if cuda else None

            def new_run(seed: int):
                gen = make_generator(seed, "cuda" if cuda else "cpu")
                noise = draw(gen, (1, 16, fr.latent_frames, h // 8, w // 8), device)
                return FastRun(model, noise, inputs["ctx"], inputs["y"], inputs["camera"], cache, gen, device=device,
                               film=film, schedule=recipe.schedule(), chunk_frames=recipe.chunk_frames)

            norm_silu = decoder_norm_silu(device)  # the decoder's kernels as every door builds them
            decoder = None
            if issue:  # compile, attention plans and the decoder's first frames, on slots the timed run rewrites
                warm, decoder = new_run(7), StreamingDecoder(vae, norm_silu=norm_silu) if vae is not None else None
                with torch.inference_mode():
                    for _ in range(min(ISSUE_WARM_CHUNKS, warm.chunks)):
                        x0 = warm.next_chunk()
                        if decoder:
                            decoder.decode(x0)
                sync(device)
                cache.global_end = cache.local_end = 0
                if decoder:  # the video starts again: a new decoder (its causal caches) on the same VAE
                    decoder.close()
                    decoder = StreamingDecoder(vae, norm_silu=norm_silu)
            if cuda:
                torch.cuda.reset_peak_memory_stats(device)
            run = new_run(42)
            limit = min(run.chunks, spec["chunks"]) if spec.get("window") and not issue else run.chunks
            t_start = time.perf_counter()
            with torch.inference_mode():
                for _ in range(limit):
                    x0 = run.next_chunk()
                    if decoder:
                        decoder.decode(x0)
                    sync(device)
                    ends.append(time.perf_counter())
            finite = bool(torch.isfinite(x0).all())
            _save_output(spec, session, x0)
            peaks = _peaks(device)
        finally:
            if film is not None:
                film.close()  # frees its pinned FiLM store (the FiLM of blocks without GPU room)
            placement.close()
        chunk_s = [b - a for a, b in zip([t_start] + ends[:-1], ends)]
        mine = {"rank": session.rank, "device": str(device), "load_s": round(load_s, 2), "weights_allocated": weights,
                "plan": plan.reason, "cache_heads": plan.cache_heads or cfg.num_heads, **peaks, "finite": finite,
                "chunk_s": [round(s, 3) for s in chunk_s]}
        if cuda:
            torch.cuda.empty_cache()
        dtype = torch.bfloat16 if cuda else torch.float32
        block = _comm_block(session, 3 * fsl, cfg, 1, spec["comm_iters"], dtype)
        if block is not None:
            mine["comm_chunk_s"] = round(block * cfg.num_layers * 5, 4)  # 40 blocks x (4 steps + context pass)
        every = session.gather_json(mine, "collecting results")
        if not session.is_main:
            return {}
        slowest = [max(r["chunk_s"][i] for r in every) for i in range(len(chunk_s))]
        out = {"layout": session.layout.describe(), "ranks": every, "frames": fr.frames, "chunks": fr.chunks,
               "chunks_run": len(slowest), "chunk_s": slowest}
        if spec.get("window") and len(slowest) < fr.chunks:
            window_chunks = -(-spec["window"] // 3)
            steady = slowest[window_chunks:] or slowest[-1:]
            mean = sum(steady) / len(steady)
            out.update(s_per_chunk=round(mean, 3), extrapolated=True,
                       sampling_s=round(sum(slowest) + mean * (fr.chunks - len(slowest)), 1),
                       note=f"{len(slowest)} of {fr.chunks} chunks run; the rest at the mean of chunks "
                            f"{window_chunks + 1}..{len(slowest)} (the window is full from chunk {window_chunks + 1})")
        elif issue:  # warmed up: the mean over the whole video, as issue 26's one-GPU table
            out.update(s_per_chunk=round(sum(slowest) / len(slowest), 3), extrapolated=False,
                       sampling_s=round(sum(slowest), 2), first_chunk_s=slowest[0], decode_on_rank0=True,
                       compile="blocks" if cuda else "off", cap_gib=ISSUE_CAP_GIB if cuda else None)
        else:
            out.update(s_per_chunk=round(sum(slowest[1:]) / max(1, len(slowest) - 1), 3), extrapolated=False,
                       sampling_s=round(sum(slowest), 2), first_chunk_s=slowest[0])
        if any("comm_chunk_s" in r for r in every):
            out["comm_chunk_s"] = max(r.get("comm_chunk_s", 0) for r in every)
        return out
    finally:
        session.close()


def _issue_vae(spec: dict, session, device: torch.device):
    """The VAE rank 0 decodes every chunk with (full-size fp32, random weights); None on the other ranks."""
    from ..wan.vae.model import VAEConfig, WanVAE

    if not session.is_main:
        return None
    torch.manual_seed(0)
    with torch.device(device):
        return WanVAE(VAEConfig.tiny() if spec["tiny"] else VAEConfig()).eval().requires_grad_(False)


CHILDREN = {"base": child_base, "fast": child_fast}
