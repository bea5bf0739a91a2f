"""bench_pipeline's children: one case in a process of its own: the real sampler under a memory mode, the expert
switch, batched / sequential / layered CFG and token chunking, NF4 against bf16, and the VAE; `timed_forwards` times
CFG steps straight on a model (bench_fast's too)."""
from __future__ import annotations

import time

import torch

from ..wan.dit.model import DiTConfig
from .pipeline_setup import Recorder, apply_cap, make_inputs, schedule, step_times, sync


def child_sample(spec: dict) -> dict:
    from ..memory.estimates import available_ram_bytes, estimate_activation_bytes, free_vram_bytes
    from ..memory.expert_plan import plan_memory
    from ..memory.placement import make_provider
    from ..wan.sampling.sampler import make_noise, sample

    device = torch.device(spec["device"])
    cfg = DiTConfig.from_json(spec["config"])
    out: dict = {"cap_bytes": apply_cap(device, spec.get("cap_gib"), spec["context_gib"])}
    if device.type == "cuda":
        torch.empty(1, device=device)
    video = tuple(spec["video"])
    inputs = make_inputs(video, cfg, device)
    lines: list[str] = []
    kw = {}
    if spec.get("blocks_on_gpu") is not None:
        kw["blocks_on_gpu"] = spec["blocks_on_gpu"]
    if device.type == "cuda":
        out["vram_free_at_start"] = free_vram_bytes(device)
        out["auto_would_pick"] = plan_memory(video, cfg, free_vram_bytes(device), available_ram_bytes(),
                                             cfg_mode=spec["cfg_mode"]).reason
    prov = make_provider(spec["mode"], spec["high"], spec["low"], device=device, video=video, cfg_mode=spec["cfg_mode"],
                         keep_in_ram=False, token_chunk=spec.get("token_chunk"), log=lines.append, **kw)
    out["plan"] = prov.plan.to_json()
    settings = schedule(spec["high_steps"], spec["low_steps"])
    settings.cfg_mode = prov.plan.cfg_mode
    rec = Recorder(prov, device)
    ends: list[tuple[int, str, float]] = []

    def on_step(info) -> None:
        sync(device)
        ends.append((info.index, info.expert, time.perf_counter()))

    noise = make_noise(inputs["shape"], 42, source="cuda" if device.type == "cuda" else "cpu")
    t0 = time.perf_counter()
    try:
        latent = sample(rec, noise, inputs["ctx"], inputs["neg"], inputs["y"], inputs["camera"], settings,
                        device=device, callback=on_step)
        out["finite"] = bool(torch.isfinite(latent).all())
    finally:
        out["wall_seconds"] = round(time.perf_counter() - t0, 2)
        out["log"] = lines
        out["events"] = rec.events
        out["block_swap"] = getattr(prov, "last_stats", None)
        prov.close()
    rec._roll()
    steps = step_times(ends, rec.events)
    out["steps"] = steps
    timed = [s["seconds"] for s in steps[1:]]  # step 0 is the warm-up
    out["s_per_step"] = round(sum(timed) / len(timed), 3) if timed else None
    out["warmup_step_seconds"] = steps[0]["seconds"] if steps else None
    batch = prov.plan.cfg_batch
    est = estimate_activation_bytes(*video, cfg, batch, token_chunk=spec.get("token_chunk"))
    for ph in rec.phases:
        ph["activation_estimate"] = est
        if ph.get("activation_peak"):
            ph["estimate_over_measured"] = round(est / ph["activation_peak"], 3)
    out["phases"] = rec.phases
    loads = [e for e in rec.events if e["op"] == "acquire"]
    out["first_load_seconds"] = round(loads[0]["seconds"], 3) if loads else None
    rel = [e for e in rec.events if e["op"] == "release"]
    if len(loads) > 1 and rel:
        out["switch_seconds"] = round(rel[0]["seconds"] + loads[1]["seconds"], 3)
    if device.type == "cuda":
        out["peak_allocated"] = rec.peak_allocated
        out["peak_reserved"] = rec.peak_reserved
    return out


def child_switch(spec: dict) -> dict:
    """Expert switch times: swap dropping to disk, and swap keeping the released expert in pinned RAM."""
    from ..memory.placement import make_provider

    device = torch.device(spec["device"])
    out: dict = {"cap_bytes": apply_cap(device, spec.get("cap_gib"), spec["context_gib"])}
    if device.type == "cuda":
        torch.empty(1, device=device)
        torch.cuda.empty_cache()
    base = torch.cuda.memory_allocated(device) if device.type == "cuda" else None
    for keep in (False, True):
        prov = make_provider("swap", spec["high"], spec["low"], device=device, keep_in_ram=keep, log=lambda s: None)
        rec = Recorder(prov, device)
        order = ["high", "low"] + (["high", "low"] if keep else [])
        for name in order:
            rec.acquire(name)
            rec.release(name)
        prov.close()
        ev = rec.events
        key = "pinned" if keep else "disk"
        r = {"events": [{k: (round(v, 4) if isinstance(v, float) else v) for k, v in e.items() if k != "t_end"} for e in ev]}
        r["load_from_disk_seconds"] = round(ev[0]["seconds"], 3)
        if keep:
            r["first_release_to_ram_seconds"] = round(ev[1]["seconds"], 3)  # one-time D2H + page locking
            r["switch_seconds"] = round(ev[5]["seconds"] + ev[6]["seconds"], 3)  # release high (kept) + low from RAM
            r["acquire_from_ram_seconds"] = round(ev[6]["seconds"], 3)
        else:
            r["switch_seconds"] = round(ev[1]["seconds"] + ev[2]["seconds"], 3)  # drop high + low from disk
        if device.type == "cuda":
            r["allocated_base"] = base
            r["expert_bytes_on_device"] = ev[0]["allocated_after"] - base
            r["stray_after_release"] = [e["allocated_after"] - base for e in ev if e["op"] == "release"]
            r["released_all"] = all(x == 0 for x in r["stray_after_release"])
        out[key] = r
    return out


def timed_forwards(model, inputs: dict, device: torch.device, batch: bool, steps: int, warm: int = 1,
                   layered: bool = False) -> dict:
    """CFG steps straight on a model (cond + uncond: batched, layered or one after the other): seconds per step
    and the activation peak."""
    from ..wan.sampling.sampler import make_noise

    x = make_noise(inputs["shape"], 1, source="cuda" if device.type == "cuda" else "cpu").to(device)
    t = torch.tensor([900], device=device)

    def step():
        with torch.no_grad():
            if batch or layered:
                extra = dict(layered=True, shared_input=True) if layered else {}
                model(x.expand(2, *x.shape[1:]), t.expand(2), torch.cat([inputs["ctx"], inputs["neg"]]), inputs["y"],
                      camera=inputs["camera"], **extra)
            else:
                model(x, t, inputs["ctx"], inputs["y"], camera=inputs["camera"])
                model(x, t, inputs["neg"], inputs["y"], camera=inputs["camera"])

    for _ in range(warm):
        step()
    sync(device)
    base = torch.cuda.memory_allocated(device) if device.type == "cuda" else None
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        step()
        sync(device)
        times.append(time.perf_counter() - t0)
    r = {"step_seconds": [round(s, 3) for s in times], "s_per_step": round(sum(times) / len(times), 3)}
    if device.type == "cuda":
        r["weights_allocated"] = base
        r["activation_peak"] = torch.cuda.max_memory_allocated(device) - base
        r["peak_reserved"] = torch.cuda.max_memory_reserved(device)
    return r


def child_cfg(spec: dict) -> dict:
    """Batched vs sequential CFG and FFN chunking on one NF4 expert, uncapped (issue 7)."""
    from ..loaders.expert_loader import load_expert
    from ..memory.estimates import estimate_activation_bytes

    device = torch.device(spec["device"])
    cfg = DiTConfig.from_json(spec["config"])
    video = tuple(spec["video"])
    inputs = make_inputs(video, cfg, device)
    model = load_expert(spec["high"], device=device)
    out: dict = {}
    # Default token chunking (what users run) vs the whole sequence at once (the unchunked block's memory).
    runs = [("sequential", False, spec["chunk"], 1), ("batched", True, spec["chunk"], 0),
            ("sequential_unchunked", False, None, 0), ("layered", False, spec["chunk"], 0)]
    for name, batch, chunk, warm in runs:
        model.set_token_chunk(chunk)
        layered = name == "layered"
        try:
            r = timed_forwards(model, inputs, device, batch, spec["timed"], warm=warm, layered=layered)
            r["activation_estimate"] = estimate_activation_bytes(*video, cfg, batch, token_chunk=chunk, layered=layered)
            if r.get("activation_peak"):
                r["estimate_over_measured"] = round(r["activation_estimate"] / r["activation_peak"], 3)
        except torch.OutOfMemoryError as e:
            r = {"error": f"OOM: {str(e).splitlines()[0][:200]}"}
        r["token_chunk"] = chunk
        out[name] = r
        if device.type == "cuda":
            torch.cuda.empty_cache()
    s, b = out["sequential"].get("s_per_step"), out["batched"].get("s_per_step")
    if s and b:
        out["batched_over_sequential"] = round(b / s, 3)
    c = out["sequential_unchunked"].get("s_per_step")
    if s and c:
        out["chunked_over_unchunked"] = round(s / c, 3)
    la = out["layered"].get("s_per_step")
    if s and la:
        out["layered_over_sequential"] = round(la / s, 3)
    return out


def child_bf16(spec: dict) -> dict:
    """NF4 vs a bf16 model of the same architecture (random bf16 weights made on the device), same inputs."""
    from ..loaders.expert_loader import load_expert
    from ..wan.dit.model import WanDiT

    device = torch.device(spec["device"])
    cfg = DiTConfig.from_json(spec["config"])
    inputs = make_inputs(tuple(spec["video"]), cfg, device)
    out: dict = {}
    model = load_expert(spec["high"], device=device)
    out["nf4"] = timed_forwards(model, inputs, device, False, spec["timed"])
    del model
    if device.type == "cuda":
        torch.cuda.empty_cache()
    dtype = torch.bfloat16
    with torch.no_grad():
        model = WanDiT(cfg, device=device, dtype=dtype).requires_grad_(False).eval()
    model.compute_dtype = dtype
    out["bf16"] = timed_forwards(model, inputs, device, False, spec["timed"])
    n, b = out["nf4"]["s_per_step"], out["bf16"]["s_per_step"]
    out["nf4_over_bf16"] = round(n / b, 3)
    return out


def child_vae(spec: dict) -> dict:
    """VAE encode of the conditioning video and decode of the latent at the size (the library's VAE, random
    weights; untiled unless --vae-tiled)."""
    from ..wan.vae.model import VAEConfig, WanVAE

    device = torch.device(spec["device"])
    frames, h, w = spec["video"]
    vcfg = VAEConfig.tiny() if spec["tiny"] else VAEConfig()
    with torch.device(device):
        vae = WanVAE(vcfg).eval().requires_grad_(False)
    tiled = spec.get("vae_tiled", False)
    out: dict = {"tiled": tiled}
    video = torch.zeros(1, 3, frames, h, w, device=device)
    video[:, :, 0] = torch.rand(1, 3, h, w, device=device) * 2 - 1
    for op in ("encode", "decode"):
        if device.type == "cuda":
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats(device)
        sync(device)
        t0 = time.perf_counter()
        with torch.no_grad():
            if op == "encode":
                z = vae.encode(video, tiled=tiled)
            else:
                vae.decode(z, tiled=tiled)
        sync(device)
        out[f"{op}_seconds"] = round(time.perf_counter() - t0, 3)
        if device.type == "cuda":
            out[f"{op}_peak_allocated"] = torch.cuda.max_memory_allocated(device)
    return out


CHILDREN = {"sample": child_sample, "switch": child_switch, "cfg": child_cfg, "bf16": child_bf16, "vae": child_vae}
