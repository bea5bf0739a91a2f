"""Benchmark: the full-size sampling pipeline under each memory mode on simulated consumer cards (issues 9 and 7).

    python -m lingbot_world.bench.bench_pipeline --out bench/results/pipeline.json                  # one H100
    python -m lingbot_world.bench.bench_pipeline --cases swap24,resident24,switch --budget-s 520 --out a.json
    python -m lingbot_world.bench.bench_pipeline --tiny --out /tmp/pipeline_tiny.json                # CPU smoke run

Two random full-size NF4 experts (18.5 B params each, made and quantized on the GPU, written once in the community
layout, ≈19 GB on disk; reused from --workdir when their config matches) are run through the real sampler
(`wan.sampler.sample`) with real conditioning shapes: y from random latents, the camera tensor of a preset at the
video size (camera ON), random bf16 text context [1, 512, 4096]. A step is CFG cond + uncond.

Each case runs in a fresh child process, so the memory cap (`torch.cuda.set_per_process_memory_fraction`, simulating
a 24 / 16 / 12 GB card minus --context-gib for the CUDA context a real card loses) and the peaks do not leak between
cases. Reported per case: seconds per step (the first step is a warm-up; the rest are timed and extrapolated to the
70-step schedule, 26 high + 44 low), switch and load times, peak VRAM from torch (allocated / reserved) and from
`nvidia-smi --query-gpu=memory.used` polled by this process, peak host RSS (VmHWM) of the child and of this
process, and measured activation peaks next to `estimate_activation_bytes`. Every case is wrapped: an error (OOM,
timeout) is recorded and the next case runs; --budget-s skips what would start too late; the JSON is rewritten
after every case (and previous results in --out are kept unless --fresh, so two calls can fill one file).
"""
from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Optional

import torch

from ..wan.dit.model import DiTConfig
from ..wan.dit.blocks import DEFAULT_TOKEN_CHUNK
from .bench_nf4_load import bench_config as load_bench_config
from .common import (
    CaseLoop,
    add_case_arguments,
    case_ok,
    child_main,
    gb,
    in_gb,
    mib_in_gb,
    parse_cases,
    run_case_child,
    tiny_children,
)

MODULE = __spec__.name if __spec__ is not None else __name__  # the name this file runs under (`-m`)
PACKAGE = MODULE.rsplit(".bench.", 1)[0]
GiB = 1024**3
STEPS_HIGH, STEPS_LOW = 26, 44  # the default 70-step schedule (spec §5.5)

V480 = (81, 464, 832)
V720 = (81, 720, 1280)
TINY_VIDEO = (9, 32, 48)

# name -> what the case does. kind "sample": the real sampler over a short schedule; others are special.
CASES: dict[str, dict] = {
    "swap24": dict(kind="sample", video=V480, mode="swap", cap_gib=24, high=3, low=1),
    "resident24": dict(kind="sample", video=V480, mode="resident", cap_gib=24, high=3, low=1),
    "blockswap16": dict(kind="sample", video=V480, mode="block_swap", cap_gib=16, high=3, low=1),
    "blockswap12": dict(kind="sample", video=V480, mode="block_swap", cap_gib=12, high=3, low=1),
    "blockswap8": dict(kind="sample", video=V480, mode="block_swap", cap_gib=8, high=3, low=1),
    "swap720": dict(kind="sample", video=V720, mode="swap", cap_gib=24, high=2, low=1),
    "blockswap16_720": dict(kind="sample", video=V720, mode="block_swap", cap_gib=16, high=2, low=1, ref="swap720"),
    "switch": dict(kind="switch", cap_gib=24),
    "nf4_vs_bf16": dict(kind="bf16", video=V480),
    "cfg": dict(kind="cfg", video=V480),
    "vae": dict(kind="vae", video=V480),
}
DEFAULT_CASES = list(CASES)
SAMPLE_CASES = [n for n, c in CASES.items() if c["kind"] == "sample"]
BLOCK_SWAP_CASES = [n for n in SAMPLE_CASES if CASES[n]["mode"] == "block_swap"]
# the whole-expert case a block-swap case is compared with (same video size)
REFERENCE = {n: CASES[n].get("ref", "resident24") for n in BLOCK_SWAP_CASES}

TARGETS = {
    "swap24": "runs; peak VRAM <= 13 GB; peak RSS <= 4 GB",
    "resident24": "runs; peak VRAM <= 22.5 GB",
    "blockswap16": "runs; s/step <= 1.3x resident",
    "blockswap12": "runs; s/step <= 1.3x resident",
    "blockswap8": "runs (beyond the issue: an 8 GB card)",
    "swap720": "runs",
    "blockswap16_720": "runs (beyond the issue: 720p on a 16 GB card)",
    "switch": "switch from disk <= 5 s, from pinned RAM <= 1.5 s",
    "nf4_vs_bf16": "NF4 s/step <= 1.05x bf16",
    "cfg": "reported (issue 7)",
    "vae": "reported",
}


# ---- shared helpers ------------------------------------------------------------------------------------
def bench_config(tiny: bool, layers: Optional[int] = None) -> DiTConfig:
    """Full size (the released shapes), or the smallest DiT of the same structure for the CPU smoke run."""
    if tiny:
        return DiTConfig.tiny(num_layers=layers or 4)
    return load_bench_config(False, layers)


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def apply_cap(device: torch.device, cap_gib: Optional[float], context_gib: float) -> Optional[int]:
    """Limit this process's caching allocator like a card of `cap_gib` GiB whose context takes `context_gib`."""
    if device.type != "cuda" or not cap_gib:
        return None
    if device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    total = torch.cuda.get_device_properties(device).total_memory
    cap = int((cap_gib - context_gib) * GiB)
    torch.cuda.set_per_process_memory_fraction(min(1.0, cap / total), device)
    return cap


def make_inputs(video: tuple, cfg: DiTConfig, device: torch.device, seed: int = 0) -> dict:
    """Real conditioning shapes: y (mask + random latent), a preset camera at the size, random bf16 text."""
    from ..wan.control.camera import camera_condition
    from ..wan.control.camera_presets import preset_camera
    from ..wan.i2v import first_frame_mask
    from ..wan.sizes import latent_frames, latent_size

    frames, h, w = video
    f_lat = latent_frames(frames)
    lat_h, lat_w = latent_size(h, w)
    g = torch.Generator().manual_seed(seed)
    latent = torch.randn(1, 16, f_lat, lat_h, lat_w, generator=g)
    y = torch.cat([first_frame_mask(f_lat, lat_h, lat_w)[None], latent], dim=1)
    path = preset_camera("dolly_in+pan_right", frames=frames)
    cam = camera_condition(path.poses, path.intrinsics, h, w, frames).plucker
    text_dtype = torch.bfloat16
    ctx = (0.2 * torch.randn(1, cfg.text_len, cfg.text_dim, generator=g)).to(text_dtype)
    neg = (0.2 * torch.randn(1, cfg.text_len, cfg.text_dim, generator=g)).to(text_dtype)
    return {
        "y": y.to(device), "camera": cam.to(device), "ctx": ctx.to(device), "neg": neg.to(device),
        "shape": (1, 16, f_lat, lat_h, lat_w),
    }


def schedule(high: int, low: int, shift: float = 10.0):
    """SamplingSettings whose first `high` steps use the high-noise expert and the next `low` the low one."""
    from ..wan.sampling.sampler import SamplingSettings
    from ..wan.sampling.schedulers import make_scheduler

    steps = high + low
    ts = [int(t) for t in make_scheduler("unipc", steps, shift).timesteps]
    if low == 0:
        boundary = ts[-1] / 1000
    else:
        boundary = (ts[high - 1] + ts[high]) / 2000
    return SamplingSettings(steps=steps, shift=shift, boundary=boundary)


class Recorder:
    """Wraps a provider: times acquire/release, and measures each expert phase's peak over its resident weights."""

    def __init__(self, inner, device: torch.device):
        self.inner, self.device = inner, device
        self.events: list[dict] = []
        self.phases: list[dict] = []
        self.peak_allocated = 0
        self.peak_reserved = 0
        self._phase: Optional[dict] = None

    def _roll(self) -> None:
        if self.device.type == "cuda":
            sync(self.device)
            self.peak_allocated = max(self.peak_allocated, torch.cuda.max_memory_allocated(self.device))
            self.peak_reserved = max(self.peak_reserved, torch.cuda.max_memory_reserved(self.device))
            torch.cuda.reset_peak_memory_stats(self.device)

    def _close_phase(self) -> None:
        if self._phase is not None and self.device.type == "cuda":
            sync(self.device)
            peak = torch.cuda.max_memory_allocated(self.device)
            self._phase["peak_allocated"] = peak
            self._phase["peak_reserved"] = torch.cuda.max_memory_reserved(self.device)
            self._phase["activation_peak"] = peak - self._phase["weights_allocated"]
        if self._phase is not None:
            self.phases.append(self._phase)
        self._phase = None

    def acquire(self, name: str):
        self._close_phase()
        t0 = time.perf_counter()
        model = self.inner.acquire(name)
        sync(self.device)
        t1 = time.perf_counter()
        alloc = torch.cuda.memory_allocated(self.device) if self.device.type == "cuda" else None
        self._roll()
        self._phase = {"expert": name, "weights_allocated": alloc}
        src = self.inner.events[-1]["source"] if getattr(self.inner, "events", None) else None
        self.events.append({"op": "acquire", "name": name, "source": src, "seconds": t1 - t0, "t_end": t1,
                            "allocated_after": alloc})
        return model

    def release(self, name: str) -> None:
        self._close_phase()
        self._roll()
        t0 = time.perf_counter()
        self.inner.release(name)
        sync(self.device)
        t1 = time.perf_counter()
        alloc = torch.cuda.memory_allocated(self.device) if self.device.type == "cuda" else None
        src = self.inner.events[-1]["source"] if getattr(self.inner, "events", None) else None
        self.events.append({"op": "release", "name": name, "source": src, "seconds": t1 - t0, "t_end": t1,
                            "allocated_after": alloc})


def step_times(step_ends: list[tuple[int, str, float]], events: list[dict]) -> list[dict]:
    """Seconds of model compute per step: the time between step ends minus the acquire/release inside it."""
    out = []
    prev = next(e["t_end"] for e in events if e["op"] == "acquire")
    for index, expert, t in step_ends:
        switch = sum(e["seconds"] for e in events if prev < e["t_end"] <= t)
        out.append({"step": index, "expert": expert, "seconds": round(t - prev - switch, 4)})
        prev = t
    return out


# ---- children --------------------------------------------------------------------------------------------
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


# ---- parent ---------------------------------------------------------------------------------------------
def expert_paths(workdir: Path, names: tuple = ("high", "low")) -> dict:
    """Where the random base experts go in --workdir (the community layout's folder names)."""
    return {n: workdir / f"{n}_noise_model_bnb_nf4" for n in names}


def random_experts(loop: CaseLoop, paths: dict, configs: dict, device: str, wanted: Optional[dict] = None,
                   label: str = "experts") -> dict:
    """A case-based driver's random experts: write_random_experts on `wanted` (default: all of `paths`) within the
    budget left, announced on stdout, recorded in the results under `label` and saved; their "paths" name every
    folder of `paths` (the cases' specs refer to them)."""
    workdir = next(iter(paths.values())).parent
    print(f"[{label}] {'tiny' if loop.args.tiny else 'full-size'} random NF4 {label} in {workdir} ...", flush=True)
    experts = write_random_experts(paths if wanted is None else wanted, configs, device,
                                   timeout=max(60.0, loop.remaining()))
    experts["paths"] = {n: str(p) for n, p in paths.items()}
    loop.res[label] = experts
    print(f"[{label}] {'reused' if experts.get('reused') else 'made in %s s' % experts.get('seconds')}", flush=True)
    loop.save()
    return experts


def write_random_experts(paths: dict, configs: dict, device: str, timeout: float) -> dict:
    """Random NF4 experts (community layout, made on `device` in a child process) at `paths`, one per name with
    `configs[name]`; folders whose config.json already matches are reused. Returns {"paths", "reused"|"made"}."""
    paths = {n: Path(p) for n, p in paths.items()}
    info: dict = {"paths": {k: str(v) for k, v in paths.items()}}
    todo = {n: p for n, p in paths.items()
            if not ((p / "model.safetensors").is_file() and (p / "config.json").is_file()
                    and json.loads((p / "config.json").read_text()) == configs[n].to_json())}
    if not todo:
        info["reused"] = True
        return info
    from ..loaders.nf4_writer import nf4_expert_bytes

    workdir = next(iter(todo.values())).parent
    workdir.mkdir(parents=True, exist_ok=True)
    need = sum(nf4_expert_bytes(configs[n]) for n in todo) + 2 * GiB
    free = shutil.disk_usage(workdir).free
    if free < need:
        raise RuntimeError(f"{workdir} has {free / 1e9:.1f} GB free; the experts need {need / 1e9:.1f} GB. "
                           "Pass --workdir on a bigger disk.")
    code = (
        f"import json,sys,time;from pathlib import Path;from {PACKAGE}.wan.dit.model import DiTConfig;"
        f"from {PACKAGE}.bench.bench_nf4_load import make_full_size_expert as mk;"
        "jobs=json.loads(sys.argv[1]);out={}\n"
        "for i,(n,(p,c)) in enumerate(jobs.items()):\n"
        "    out[n]=mk(Path(p),sys.argv[2],seed=i,cfg=DiTConfig.from_json(c))\n"
        "print(json.dumps(out))"
    )
    jobs = {n: (str(p), configs[n].to_json()) for n, p in todo.items()}
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-c", code, json.dumps(jobs), device],
                          capture_output=True, text=True, timeout=timeout)
    if proc.returncode != 0:
        raise RuntimeError(f"making the random experts failed:\n{proc.stderr[-3000:]}")
    info["made"] = json.loads(proc.stdout.strip().splitlines()[-1])
    info["seconds"] = round(time.perf_counter() - t0, 1)
    return info


def case_spec(name: str, args, cfg: DiTConfig, experts: dict, device: str) -> dict:
    base = dict(CASES[name])
    video = TINY_VIDEO if args.tiny else tuple(base.get("video", V480))
    spec = {
        "case": name, "kind": base["kind"], "device": device, "config": cfg.to_json(), "tiny": args.tiny,
        "high": experts["paths"]["high"], "low": experts["paths"]["low"], "video": list(video),
        "cap_gib": base.get("cap_gib") if device == "cuda" else None, "context_gib": args.context_gib,
        "cfg_mode": args.cfg_mode, "timed": args.timed_steps, "chunk": args.token_chunk,
        "expandable_segments": not args.no_expandable_segments, "vae_tiled": args.vae_tiled,
    }
    if base["kind"] == "sample":
        spec.update(mode=base["mode"], high_steps=1 + args.timed_steps if base["high"] > 2 else base["high"],
                    low_steps=base["low"], token_chunk=args.token_chunk)
        if base["mode"] == "block_swap" and (args.blocks_on_gpu is not None or args.tiny):
            # no card to size it from on a CPU: exercise the streaming
            spec["blocks_on_gpu"] = args.blocks_on_gpu if args.blocks_on_gpu is not None else 1
    return spec


def summarize(res: dict, args) -> dict:
    c = res["cases"]
    s: dict = {}
    resident = c.get("resident24")
    ref_step = {"resident24": resident.get("s_per_step") if case_ok(resident) else None}
    if ref_step["resident24"] is None and case_ok(c.get("cfg")):
        ref_step["resident24"] = c["cfg"]["sequential"].get("s_per_step")
    ref_step["swap720"] = c["swap720"].get("s_per_step") if case_ok(c.get("swap720")) else None
    for name in SAMPLE_CASES:
        r = c.get(name)
        if not case_ok(r):
            continue
        row = {"s_per_step": r.get("s_per_step"), "peak_reserved_gb": in_gb(r.get("peak_reserved")),
               "peak_allocated_gb": in_gb(r.get("peak_allocated")), "smi_peak_gb": mib_in_gb(r.get("smi_peak_used_mib")),
               "peak_rss_gb": in_gb(r.get("peak_rss")), "plan": r.get("plan", {}).get("reason")}
        ref = ref_step.get(REFERENCE.get(name))
        if ref and r.get("s_per_step"):
            row["over_resident"] = round(r["s_per_step"] / ref, 3)
        s[name] = row
    sw = c.get("switch")
    if case_ok(sw):
        s["switch"] = {"from_disk_s": sw["disk"]["switch_seconds"], "from_pinned_s": sw["pinned"]["switch_seconds"],
                       "released_all": sw["disk"].get("released_all") and sw["pinned"].get("released_all")}
    # end to end, 464x832x81, 70 steps, from the swap case (the consumer default) and the resident one
    vae = c.get("vae") if case_ok(c.get("vae")) else None
    vae_enc = args.vae_encode_s if args.vae_encode_s is not None else (vae or {}).get("encode_seconds")
    vae_dec = args.vae_decode_s if args.vae_decode_s is not None else (vae or {}).get("decode_seconds")
    for name in ("swap24", "resident24"):
        r = c.get(name)
        if not case_ok(r) or not r.get("s_per_step"):
            continue
        parts = {
            "t5_s": args.t5_seconds,
            "vae_encode_s": vae_enc,
            "load_first_expert_s": r.get("first_load_seconds"),
            "sampling_70_steps_s": round(r["s_per_step"] * (STEPS_HIGH + STEPS_LOW), 1),
            "switch_s": r.get("switch_seconds"),
            "vae_decode_s": vae_dec,
        }
        parts["total_s"] = round(sum(v for v in parts.values() if v), 1)
        parts["missing"] = [k for k, v in parts.items() if v is None]
        s[f"end_to_end_{name}"] = parts
    return s


def check_targets(res: dict) -> dict:
    c, s = res["cases"], res.get("summary", {})
    t: dict = {}
    if "swap24" in c:
        r = c["swap24"]
        t["swap24_runs"] = case_ok(r)
        if case_ok(r) and r.get("peak_reserved") is not None:
            t["swap24_peak_vram<=13GB"] = r["peak_reserved"] <= 13e9
            t["swap24_rss<=4GB"] = (r.get("peak_rss") or 0) <= 4e9
    if "resident24" in c:
        r = c["resident24"]
        t["resident24_runs"] = case_ok(r)
        if case_ok(r) and r.get("peak_reserved") is not None:
            t["resident24_peak_vram<=22.5GB"] = r["peak_reserved"] <= 22.5e9
    for name in BLOCK_SWAP_CASES:
        if name in c:
            t[f"{name}_runs"] = case_ok(c[name])
            if s.get(name, {}).get("over_resident") is not None:
                ref = REFERENCE[name].removesuffix("24")
                t[f"{name}_<=1.3x_{ref}"] = s[name]["over_resident"] <= 1.3
    if "swap720" in c:
        t["swap720_runs"] = case_ok(c["swap720"])
    if "switch" in s:
        t["switch_disk<=5s"] = s["switch"]["from_disk_s"] <= 5
        t["switch_pinned<=1.5s"] = s["switch"]["from_pinned_s"] <= 1.5
        t["release_frees_all"] = bool(s["switch"]["released_all"]) if s["switch"]["released_all"] is not None else None
    if case_ok(c.get("nf4_vs_bf16")):
        t["nf4<=1.05x_bf16"] = c["nf4_vs_bf16"]["nf4_over_bf16"] <= 1.05
    return t


def print_report(res: dict) -> None:
    rows = []
    for name, r in res["cases"].items():
        if "error" in r:
            rows.append([name, "ERROR: " + r["error"][:70], "-", "-", "-", "-", TARGETS.get(name, "")])
            continue
        if name == "switch":
            val = f"disk {r['disk']['switch_seconds']} s, pinned {r['pinned']['switch_seconds']} s"
            rows.append([name, val, "-", "-", "-", gb(r.get("peak_rss")), TARGETS[name]])
        elif name == "nf4_vs_bf16":
            val = f"nf4 {r['nf4']['s_per_step']} s, bf16 {r['bf16']['s_per_step']} s, x{r['nf4_over_bf16']}"
            rows.append([name, val, r["nf4"]["s_per_step"], "-", "-", gb(r.get("peak_rss")), TARGETS[name]])
        elif name == "cfg":
            val = (f"seq {r['sequential'].get('s_per_step')} s, batch {r['batched'].get('s_per_step')} s, "
                   f"unchunked {r['sequential_unchunked'].get('s_per_step')} s, "
                   f"layered {r.get('layered', {}).get('s_per_step')} s")
            rows.append([name, val, r["sequential"].get("s_per_step"), gb(r["sequential"].get("activation_peak")),
                         "-", gb(r.get("peak_rss")), TARGETS[name]])
        elif name == "vae":
            rows.append([name, f"encode {r['encode_seconds']} s, decode {r['decode_seconds']} s", "-",
                         gb(r.get("decode_peak_allocated")), "-", gb(r.get("peak_rss")), TARGETS[name]])
        else:
            plan = r.get("plan", {})
            mode = plan.get("mode", "?") + (f" {plan.get('blocks_on_gpu')}" if plan.get("mode") == "block_swap" else "")
            smi = mib_in_gb(r.get("smi_peak_used_mib"))
            rows.append([name, f"{mode}, {plan.get('cfg_mode')} CFG", r.get("s_per_step"),
                         f"{gb(r.get('peak_allocated'))} / {gb(r.get('peak_reserved'))}",
                         "-" if smi is None else f"{smi:.2f} GB", gb(r.get("peak_rss")), TARGETS.get(name, "")])
    print()
    print("| case | result | s/step | peak VRAM alloc / reserved | nvidia-smi peak | peak RSS | target |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for r in rows:
        print("| " + " | ".join(str(x) for x in r) + " |")
    for k in ("end_to_end_swap24", "end_to_end_resident24"):
        if k in res.get("summary", {}):
            e = res["summary"][k]
            print(f"\n{k} (70 steps extrapolated): " + ", ".join(f"{a}={b}" for a, b in e.items()))
    print("\ntargets:", json.dumps(res.get("targets", {})))


def run(args) -> dict:
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    cfg = bench_config(args.tiny, args.layers)
    workdir = Path(args.workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    loop = CaseLoop(args, "pipeline", device, lambda res: res.update(summary=summarize(res, args),
                                                                      targets=check_targets(res)),
                    config=cfg.to_json(),
                    notes=[
                        "s/step: mean of the timed steps after one warm-up step; a step is CFG cond + uncond; "
                        "70-step figures are extrapolated (26 high + 44 low steps).",
                        "caps: torch.cuda.set_per_process_memory_fraction of (card GiB - context_gib); "
                        "peak VRAM 'reserved' is what the cap limits; nvidia-smi adds the CUDA context.",
                        "expert loads read a warm page cache (the experts were just written).",
                    ])
    paths = expert_paths(workdir)
    experts = random_experts(loop, paths, {n: cfg for n in paths}, device)

    def run_case(name: str, timeout: float) -> dict:
        return run_case_child(case_spec(name, args, cfg, experts, device), workdir, timeout, MODULE)

    return loop.run(run_case, workdir, written=paths.values())


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_case_arguments(p, CASES, DEFAULT_CASES, budget_s=540.0, min_case_s=25.0,
                       tiny_help="tiny config and video, batched CFG, one thread per child (CPU smoke run)",
                       workdir="/tmp/lingbot_pipeline_bench", workdir_help="where the experts are written (≈19 GB)",
                       keep_help="keep the experts for the next call (reused when the config matches)")
    p.add_argument("--layers", type=int, default=None, help="blocks per expert (default 40; fewer for a quick check)")
    p.add_argument("--blocks-on-gpu", type=int, default=None, help="force N in the block-swap cases (default: planned)")
    p.add_argument("--timed-steps", type=int, default=2, help="timed steps after the warm-up step")
    p.add_argument("--cfg-mode", default="sequential", choices=("sequential", "batch", "layered", "auto"),
                   help="CFG mode of the memory-mode cases (default sequential, like the reference)")
    p.add_argument("--token-chunk", type=int, default=DEFAULT_TOKEN_CHUNK,
                   help="tokens per chunk in the DiT's per-token phases (cfg case and memory-mode cases)")
    p.add_argument("--context-gib", type=float, default=0.5, help="GiB a real card loses to the CUDA context")
    p.add_argument("--no-expandable-segments", action="store_true", help="do not set expandable_segments:True")
    p.add_argument("--vae-tiled", action="store_true", help="tiled VAE in the vae case")
    p.add_argument("--t5-seconds", type=float, default=None, help="T5 encode time from bench_t5, for the end-to-end sum")
    p.add_argument("--vae-encode-s", type=float, default=None, help="VAE encode seconds from bench_vae (else measured)")
    p.add_argument("--vae-decode-s", type=float, default=None, help="VAE decode seconds from bench_vae (else measured)")
    args = p.parse_args(argv)
    if args.child:
        return child_main(args.child, CHILDREN)
    args.cases = parse_cases(p, args.cases, CASES)
    if args.tiny:  # the smoke run: fewest forwards, one thread per child (CPU-bound and tiny)
        args.timed_steps = min(args.timed_steps, 1)
        if args.cfg_mode == "sequential":
            args.cfg_mode = "batch"
    with tiny_children(args.tiny):  # one thread per child process, the caller's environment kept
        res = run(args)
    print_report(res)
    if args.out:
        print(f"results: {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
