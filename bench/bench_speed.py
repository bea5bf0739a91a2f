"""Benchmark: the speed options of issue 15 on one full-size NF4 expert, 464x832x81, swap layout on a 24 GB cap.

    # H100: two calls of <= 9 minutes; the second reuses the expert and the inductor cache of the first
    python -m lingbot_world.bench.bench_speed --cases baseline,eager,compile,attention,fp8 \\
        --keep --workdir /tmp/lws --fresh --budget-s 530 --out /tmp/lws/speed_h100.json
    python -m lingbot_world.bench.bench_speed --cases fp8_compile,int8,int8_compile,compile_warm,fp16acc,sage,tiny \\
        --workdir /tmp/lws --budget-s 530 --out /tmp/lws/speed_h100.json
    python -m lingbot_world.bench.bench_speed --tiny --out /tmp/speed_tiny.json        # CPU smoke run
    # layered CFG (a step = one layered call) against its sequential twin in the same run, two calls
    python -m lingbot_world.bench.bench_speed --cases eager,eager_layered,compile,compile_layered --timed-steps 2 \
        --keep --workdir /tmp/lws --fresh --budget-s 540 --out /tmp/lws/speed_layered_h100.json
    python -m lingbot_world.bench.bench_speed --cases fp8_compile_fp8attn,fp8_compile_fp8attn_layered \
        --timed-steps 2 --workdir /tmp/lws --budget-s 540 --out /tmp/lws/speed_layered_h100.json
    # the issue-15 targets alone in one call (~6 min on a fresh H100): s/step, warm-up, error, kernel split
    python -m lingbot_world.bench.bench_speed --cases eager,compile,fp8_compile --timed-steps 2 \
        --workdir /tmp/lws --fresh --budget-s 530 --out /tmp/lws/speed_h100.json

A random full-size NF4 expert (bench_pipeline.random_experts, 9.6 GB, reused from --workdir) runs the DiT forward
the way the sampler calls it (sequential CFG: a step is a cond and an uncond forward; camera on; 8192-token
chunks) in one fresh process per case, capped like a 24 GB card (the swap layout holds one expert):

- baseline: the block and NF4 forward as they were before issue 15 (bench/legacy_block.py), same session;
- eager / compile / fp8 / fp8_compile / int8 / int8_compile / fp16acc / sage: the library's paths (speed/options.py);
- compile_warm: compile again in a new process, so its warm-up is the cached one a second run pays;
- *_layered: the same paths with layered CFG: a step is ONE model call (`layered=True`), reported against its
  sequential twin (the case without `_layered`): s/step ratio, extra peak VRAM, bit-identical outputs.

Per case: the first forward (compile warm-up included), s/forward and s/step over --timed-steps steps, peak VRAM
(allocated / reserved, and over the resident weights), the compile statistics, optionally a torch.profiler
kernel split of one forward (attention / GEMM / dequant / elementwise+copies), the cond output of the first
forward and the final latent of a 4-step sampling run at 240x416x17 (saved under --workdir). The parent then
reports each path's relative error against `eager` (bf16, exact) per forward at full size and over the whole
4-step run, and projects s/step on an RTX 3090 and 4090 from the kernel split (see PROJECTION_CARDS).
`attention` times SDPA's cuDNN / flash / efficient kernels (and SageAttention / flash-attn when installed) on
the full-size self-attention; `tiny` reports the error of every path on the tiny config, with NF4's own
quantization error next to it. Each case is time-boxed and isolated; the JSON is rewritten after every case.
"""
from __future__ import annotations

import argparse
import bisect
import json
import os
import sys
import time
from pathlib import Path
from typing import Optional

import torch

from ..wan.dit.blocks import DEFAULT_TOKEN_CHUNK
from ..wan.dit.model import DiTConfig
from .bench_pipeline import (
    V480,
    apply_cap,
    bench_config,
    expert_paths,
    make_inputs,
    random_experts,
    schedule,
    sync,
)
from .common import CaseLoop, add_case_arguments, child_main, parse_cases, run_case_child, tiny_children
from .trace_gaps import compute_stream, host_gap_sources, idle_gaps

MODULE = __spec__.name if __spec__ is not None else __name__  # the name this file runs under (`-m`)
SMALL_VIDEO = (17, 240, 416)  # the 4-step error run
TINY_VIDEO = (9, 32, 48)
TINY_SMALL_VIDEO = (9, 48, 64)  # 36 tokens: the low-precision paths need more than 16 rows
REFERENCE = "eager"

FORWARD = "forward"
CASES: dict[str, dict] = {
    "baseline": dict(kind=FORWARD, legacy=True),
    "eager": dict(kind=FORWARD, profile=True),
    "compile": dict(kind=FORWARD, compile="blocks", profile=True),
    "compile_warm": dict(kind=FORWARD, compile="blocks"),
    # compile as before eager's bf16 casts were emulated (inductor keeps fused bf16 intermediates in float32): the
    # error that emulation removes, measured in the same session (not in the default cases)
    "compile_noemulate": dict(kind=FORWARD, compile="blocks", inductor_options={}, profile=True),
    "fp8_compile_noemulate": dict(kind=FORWARD, compute="fp8", compile="blocks", inductor_options={}, profile=True),
    "fp8": dict(kind=FORWARD, compute="fp8"),
    "fp8_compile": dict(kind=FORWARD, compute="fp8", compile="blocks", profile=True),
    "int8": dict(kind=FORWARD, compute="int8"),
    "int8_compile": dict(kind=FORWARD, compute="int8", compile="blocks", profile=True),
    "fp16acc": dict(kind=FORWARD, compute="fp16acc"),  # its error; an H100 gains no speed from it
    "sage": dict(kind=FORWARD, attention="sage"),
    # cuDNN FP8 attention for the video self-attention (Hopper+, nvidia-cudnn-frontend): with exact GEMMs, and the
    # whole FP8 path (FP8 GEMMs + FP8 attention, what `--compute fp8` picks with `--attention auto` on Hopper)
    "compile_fp8attn": dict(kind=FORWARD, compile="blocks", attention="fp8", profile=True),
    "fp8_compile_fp8attn": dict(kind=FORWARD, compute="fp8", compile="blocks", attention="fp8", profile=True),
    # the exact path with the FFN's GELU in the first GEMM's cuBLASLt epilogue (blocks.FFN_GELU_EPILOGUE)
    "compile_epilogue": dict(kind=FORWARD, compile="blocks", gelu_epilogue=True, profile=True),
    # the exact path with bf16 attention through cudnn-frontend on cuDNN's fastest plan (issue 15's 6.3 s/step)
    "compile_cudnn": dict(kind=FORWARD, compile="blocks", attention="cudnn", profile=True),
    # layered CFG (issue 15): a step is ONE model call whose cond and uncond samples run one after the other inside
    # each block (camera FiLM, weight preparation and block 0's self-attention shared); bit-identical to its twin
    "eager_layered": dict(kind=FORWARD, cfg="layered", profile=True),
    "compile_layered": dict(kind=FORWARD, compile="blocks", cfg="layered", profile=True),
    "fp8_compile_fp8attn_layered": dict(kind=FORWARD, compute="fp8", compile="blocks", attention="fp8", cfg="layered",
                                        profile=True),
    # the camera FiLM cache in pinned host memory (wan/dit/film_cache.py, memory/film_stream.py): the camera layers
    # run in the first forward only; later forwards read their values, one block ahead; bit-identical to the twin
    "eager_filmcache": dict(kind=FORWARD, film="host", profile=True),
    "compile_filmcache": dict(kind=FORWARD, compile="blocks", film="host", profile=True),
    "fp8_compile_fp8attn_filmcache": dict(kind=FORWARD, compute="fp8", compile="blocks", attention="fp8", film="host",
                                          profile=True),
    "compile_layered_filmcache": dict(kind=FORWARD, compile="blocks", cfg="layered", film="host", profile=True),
    "fp8_compile_fp8attn_layered_filmcache": dict(kind=FORWARD, compute="fp8", compile="blocks", attention="fp8",
                                                  cfg="layered", film="host", profile=True),
    "attention": dict(kind="attention"),
    "tiny": dict(kind="tiny"),
}
LAYERED_SUFFIX = "_layered"  # a layered case's twin (same options, sequential CFG) is its name without it
FILM_SUFFIX = "_filmcache"  # a camera-cache case's twin (same options, no cache) is its name without it
DEFAULT_CASES = ["baseline", "eager", "compile", "attention", "fp8", "fp8_compile", "int8", "int8_compile",
                 "compile_warm", "fp16acc", "sage", "tiny"]

TARGETS = {  # issue 15, H100, s/step at 464x832x81, sequential CFG, swap on a 24 GB cap
    "eager": ("s_per_step", 7.8),
    "compile": ("s_per_step", 6.3),
    "fp8_compile": ("s_per_step", 4.6),
    "fp8_compile_fp8attn": ("s_per_step", 4.6),
    "eager_filmcache": ("s_per_step", 7.8),
    "compile_filmcache": ("s_per_step", 6.3),
    "fp8_compile_fp8attn_filmcache": ("s_per_step", 4.6),
    "compile_layered_filmcache": ("s_per_step", 6.3),
    "fp8_compile_fp8attn_layered_filmcache": ("s_per_step", 4.6),
    "compile_cudnn": ("s_per_step", 6.3),
    "eager_layered": ("s_per_step", 7.8),
    "compile_layered": ("s_per_step", 6.3),
    "fp8_compile_fp8attn_layered": ("s_per_step", 4.6),
}
# layered vs its sequential twin in the same run: the FiLM GEMMs (~5 % of a step on an H100) and half the weight
# preparation saved; and the same output bit for bit
LAYERED_RATIO_TARGET = 0.97
# the camera cache vs its twin: the camera layers' four GEMMs per block are ~a quarter of a forward's GEMM time
FILM_RATIO_TARGET = 0.95
RATIO_TARGETS = {LAYERED_SUFFIX: LAYERED_RATIO_TARGET, FILM_SUFFIX: FILM_RATIO_TARGET}


def twin_of(name: str) -> Optional[str]:
    """The case a layered or camera-cache case is compared with: the same options without its last suffix."""
    for suffix in (FILM_SUFFIX, LAYERED_SUFFIX):
        if name.endswith(suffix):
            return name[:-len(suffix)]
    return None
SWAP_VRAM_TARGET = 13e9

# ---- consumer-card projection -------------------------------------------------------------------------------
# Published dense peaks (no sparsity). H100 SXM5: NVIDIA H100 Tensor Core GPU datasheet. RTX 4090: NVIDIA Ada
# Lovelace architecture whitepaper v1.1, Appendix A (GeForce cards run bf16/fp16 and fp8 GEMMs with float32
# accumulation at half the fp16-accumulate rate). RTX 3090: NVIDIA Ampere GA102 GPU architecture whitepaper,
# Table 9 (same float32-accumulate halving).
PROJECTION_CARDS = {  # dense TFLOP/s (TOPS for int8); fp16acc = fp16 with fp16 accumulation
    "H100 SXM5": {"bf16": 989.4, "fp8": 1978.9, "int8": 1978.9, "fp16acc": 989.4, "bw_gbs": 3350},
    "RTX 4090": {"bf16": 165.2, "fp8": 330.3, "int8": 660.6, "fp16acc": 330.3, "bw_gbs": 1008},
    "RTX 3090": {"bf16": 71.0, "fp8": None, "int8": 284.0, "fp16acc": 142.0, "bw_gbs": 936},
}
MEASURED_ON = "H100 SXM5"


# ---- kernel split ---------------------------------------------------------------------------------------------
def kernel_category(name: str) -> str:
    """attention / gemm / dequant / elementwise (everything else: elementwise, reductions, norms, copies)."""
    n = name.lower()
    if any(k in n for k in ("fmha", "flash", "sdpa", "attention", "attn_fwd", "_attn")):
        return "attention"
    if "dequantize" in n or n.startswith("kdequant") or "bitsandbytes" in n:
        return "dequant"
    if any(k in n for k in ("gemm", "cutlass", "xmma", "nvjet", "cublas", "_mm", "matmul", "aten::mm",
                            "aten::addmm", "aten::bmm", "aten::linear", "scaled_mm", "int_mm", "rowwise")):
        return "gemm"
    return "elementwise"


def profile_split(run, device: torch.device, top_ops: int = 0, host_gaps: bool = False) -> dict:
    """Seconds per kernel category for one call of `run` (device kernels on CUDA, self CPU time on a CPU).
    top_ops > 0 adds the top operators (torch ops, as called from Python) by device time and by CPU time:
    name, calls, self CPU s, CPU s (with children), device s (their kernels). host_gaps (CUDA): the run also
    records Python stacks, and the compute stream's idle gaps are charged to the code the host was in
    (trace_gaps.host_gap_sources; the stacks slow the host, so its wall time is not the unprofiled one)."""
    from torch.profiler import ProfilerActivity, profile

    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    host_gaps = host_gaps and device.type == "cuda"
    sync(device)
    t0 = time.perf_counter()
    with profile(activities=acts, with_stack=host_gaps) as prof:
        run()
        sync(device)
    wall = time.perf_counter() - t0
    events = list(prof.key_averages())

    def tally(select, time_of):
        split = {"attention": 0.0, "gemm": 0.0, "dequant": 0.0, "elementwise": 0.0}
        top: dict[str, float] = {}
        for ev in events:
            us = time_of(ev) if select(ev) else 0.0
            if us:
                split[kernel_category(ev.key)] += us / 1e6
                top[ev.key[:120]] = top.get(ev.key[:120], 0.0) + us / 1e6
        return split, top

    def device_us(ev):
        us = getattr(ev, "self_device_time_total", None)
        return getattr(ev, "self_cuda_time_total", 0.0) if us is None else us

    if device.type == "cuda":
        # Kernels are the events on the device; older profilers only attribute them to the launching op.
        split, top = tally(lambda ev: str(getattr(ev, "device_type", "")).endswith("CUDA"), device_us)
        if not sum(split.values()):
            split, top = tally(lambda ev: True, device_us)
    else:
        split, top = tally(lambda ev: True, lambda ev: ev.self_cpu_time_total)
    total = sum(split.values())
    out = {
        "seconds": {k: round(v, 4) for k, v in split.items()},
        "share": {k: round(v / total, 4) for k, v in split.items()} if total else {},
        "kernel_seconds": round(total, 4),
        "profiled_wall_seconds": round(wall, 3),
        "top_kernels": [[k, round(v, 4)] for k, v in sorted(top.items(), key=lambda kv: -kv[1])[:25]],
    }
    if top_ops:
        ops = [ev for ev in events if not str(getattr(ev, "device_type", "CPU")).endswith("CUDA")]

        def device_total(ev):
            us = getattr(ev, "device_time_total", None)
            return getattr(ev, "cuda_time_total", 0.0) if us is None else us

        def row(ev):
            return [ev.key[:120], ev.count, round(ev.self_cpu_time_total / 1e6, 4),
                    round(ev.cpu_time_total / 1e6, 4), round(device_total(ev) / 1e6, 4)]

        out["top_ops_columns"] = ["op", "calls", "self_cpu_s", "cpu_s", "device_s"]
        out["top_ops_by_device"] = [row(ev) for ev in sorted(ops, key=lambda e: -device_total(e))[:top_ops]]
        out["top_ops_by_cpu"] = [row(ev) for ev in sorted(ops, key=lambda e: -e.self_cpu_time_total)[:top_ops]]
    if device.type == "cuda":
        out["compute_stream"] = compute_stream_gaps(prof.events())
    if host_gaps:
        out["host_gaps"] = _host_gaps(prof)
    return out


def _host_gaps(prof) -> dict:
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "trace.json"
        prof.export_chrome_trace(str(path))
        return host_gap_sources(json.loads(path.read_text()))


GAP_BINS_US = (10.0, 50.0, 500.0)  # idle gaps on the compute stream: launch-sized, short waits, long waits
COPY_WAIT_SLACK_US = 30.0  # a kernel starting this soon after a copy ended is taken as having waited for it


def compute_stream_gaps(events) -> dict:
    """Idle time of the busiest kernel stream (the compute stream) between its first and last kernel, by gap size.

    What CUDA graphs can give back is bounded by the short gaps (the GPU waiting for the next launch); long gaps
    are waits on another stream (K/V uploads) or on the host, which graphs do not remove. A gap that ends within
    COPY_WAIT_SLACK_US of a copy's end is counted as a wait on that copy."""
    by_stream: dict = {}
    copy_ends: list = []
    for ev in events:
        if not str(getattr(ev, "device_type", "")).endswith("CUDA"):
            continue
        if ev.key.startswith("Memcpy"):
            copy_ends.append(ev.time_range.end)
            continue
        if ev.key.startswith("Memset"):
            continue
        by_stream.setdefault(ev.device_resource_id, []).append((ev.time_range.start, ev.time_range.end))
    if not by_stream:
        return {}
    stream, spans = compute_stream(by_stream)
    copy_ends.sort()
    busy, end, idle = idle_gaps(spans)
    gaps, on_copy = [gap for _, gap, _ in idle], 0.0
    for idle_from, gap, _ in idle:
        # the next kernel started right after a copy ended: the stream was waiting for that copy (an event)
        s = idle_from + gap
        i = bisect.bisect_right(copy_ends, s)
        if i and s - COPY_WAIT_SLACK_US <= copy_ends[i - 1] and copy_ends[i - 1] >= idle_from:
            on_copy += gap
    edges = (0.0, *GAP_BINS_US, float("inf"))
    bins = {f"{lo:g}-{hi:g}us": round(sum(g for g in gaps if lo <= g < hi) / 1e6, 6)
            for lo, hi in zip(edges, edges[1:])}
    return {"stream": int(stream), "kernels": len(spans), "span_s": round((end - spans[0][0]) / 1e6, 6),
            "busy_s": round(busy / 1e6, 6), "idle_s": round(sum(gaps) / 1e6, 6), "idle_by_gap": bins,
            "idle_ending_with_a_copy_s": round(on_copy / 1e6, 6),
            "gaps": len(gaps)}


def project(split_seconds: dict, compute: str, card: dict, measured: dict) -> Optional[float]:
    """Seconds on `card` for a forward whose H100 kernel split is `split_seconds`: attention and GEMMs scale with
    the tensor-core peak of their precision, dequant and elementwise work with memory bandwidth."""
    gemm_kind = compute if compute in ("fp8", "int8", "fp16acc") else "bf16"
    if card.get(gemm_kind) is None:
        return None
    t = split_seconds["attention"] * measured["bf16"] / card["bf16"]
    t += split_seconds["gemm"] * measured[gemm_kind] / card[gemm_kind]
    t += (split_seconds["dequant"] + split_seconds["elementwise"]) * measured["bw_gbs"] / card["bw_gbs"]
    return t


# ---- children -------------------------------------------------------------------------------------------------
def _plan_for(spec: dict, device: torch.device):
    from ..speed.options import SpeedOptions, SpeedOptionError, SpeedPlan, resolve_speed

    opts = SpeedOptions(compile=spec.get("compile", "off"), compute=spec.get("compute", "bf16"),
                        attention=spec.get("attention", "sdpa"))
    try:
        return resolve_speed(opts, device)
    except SpeedOptionError:
        if not spec["tiny"]:
            raise
        # CPU smoke run: exercise the low-precision paths through their CPU emulation anyway.
        return SpeedPlan(compile=opts.compile, compute=opts.compute, attention="sdpa", device=str(device),
                         strict_compile=True)


def _forward_setup(spec: dict):
    """Model (speed plan applied), inputs and the forward closure for a forward case."""
    from ..loaders.expert_loader import load_expert
    from ..speed import compile as compile_mod
    from ..speed.options import apply_speed
    from ..wan.dit import attention as attn
    from ..wan.sampling.sampler import make_noise

    device = torch.device(spec["device"])
    cfg = DiTConfig.from_json(spec["config"])
    info: dict = {}
    from ..wan.dit import blocks

    if spec.get("gelu_epilogue") is not None:  # the FFN's GELU in the GEMM epilogue or a separate phase (default)
        blocks.FFN_GELU_EPILOGUE = bool(spec["gelu_epilogue"])
    info["ffn_gelu_epilogue"] = blocks.FFN_GELU_EPILOGUE
    if spec.get("compile") == "blocks":
        info["inductor_cache"] = str(compile_mod.configure_cache(Path(spec["workdir"]) / "inductor"))
        if spec.get("inductor_options") is not None:
            compile_mod.INDUCTOR_OPTIONS = spec["inductor_options"]
        if device.type == "cpu":
            compile_mod.BACKEND = "aot_eager"  # the smoke run checks the plumbing, not the C++ build
        info["inductor_options"] = compile_mod.inductor_options(compile_mod.BACKEND)
    dtype = torch.bfloat16 if spec["tiny"] else None  # the CPU smoke run computes in bf16 like a GPU
    model = load_expert(spec["expert"], device=device, compute_dtype=dtype)
    model.set_token_chunk(spec["chunk"])
    if spec.get("legacy"):
        attn.set_backend("sdpa", device, sdpa_order=())  # torch's own kernel order, as before issue 15
        info["plan"] = "legacy block, bitsandbytes forward, torch's default SDPA"
    else:
        plan = _plan_for(spec, device)
        plan.strict_compile = False  # a phase that fails to compile runs eagerly and is listed in compile_stats
        apply_speed(model, plan)
        info["plan"] = plan.to_json()
        if spec["tiny"]:
            for m in model.modules():
                if hasattr(m, "lowp_min_rows"):
                    m.lowp_min_rows = 1
    inputs = make_inputs(tuple(spec["video"]), cfg, device)
    noise = make_noise(inputs["shape"], 1, source="cuda" if device.type == "cuda" else "cpu").to(device)
    t = torch.tensor([900], device=device)
    film = {"film": make_film_cache(spec, cfg, device)} if spec.get("film") else {}

    def forward(ctx):
        with torch.inference_mode():
            return model(noise, t, ctx, inputs["y"], camera=inputs["camera"], **film)

    def layered_step():
        """A whole CFG step as the sampler's layered mode calls it: [cond, uncond] from one model call."""
        with torch.inference_mode():
            both = torch.cat([inputs["ctx"], inputs["neg"]])
            return model(noise.expand(2, *noise.shape[1:]), t.expand(2), both, inputs["y"], camera=inputs["camera"],
                         layered=True, shared_input=True, **film)

    info["cfg_mode"] = spec.get("cfg", "sequential")
    if film:
        info["film_cache"] = film["film"]
    return model, inputs, (layered_step if spec.get("cfg") == "layered" else forward), info


def make_film_cache(spec: dict, cfg: DiTConfig, device: torch.device):
    """Every block's camera FiLM in pinned host memory ("host") or on the device ("device")."""
    from ..memory.film_stream import HostFilmStore
    from ..wan.dit.film_cache import FilmCache

    if spec["film"] == "device":
        return FilmCache.on_device(cfg.num_layers)
    return FilmCache(host_blocks=range(cfg.num_layers), host_store=HostFilmStore(device))


def _small_run(model, spec: dict, device: torch.device) -> tuple[torch.Tensor, float]:
    """4 sampling steps (2 + 2, the same expert for both phases) at a small size: the whole-run error check."""
    from ..wan.sampling.sampler import ResidentExperts, make_noise, sample

    cfg = DiTConfig.from_json(spec["config"])
    inputs = make_inputs(tuple(spec["small_video"]), cfg, device, seed=3)
    settings = schedule(2, 2)
    settings.cfg_mode = spec.get("cfg", "sequential")
    noise = make_noise(inputs["shape"], 7, source="cuda" if device.type == "cuda" else "cpu")
    cache = make_film_cache(spec, cfg, device) if spec.get("film") else None
    sync(device)
    t0 = time.perf_counter()
    try:
        with torch.inference_mode():
            latent = sample(ResidentExperts(model, model), noise, inputs["ctx"], inputs["neg"], inputs["y"],
                            inputs["camera"], settings, device=device, camera_cache=cache)
        sync(device)
    finally:
        if cache is not None:
            cache.close()
    return latent, time.perf_counter() - t0


def _save(path: Path, tensor: torch.Tensor) -> None:
    from safetensors.torch import save_file

    tmp = path.with_suffix(".tmp")
    save_file({"t": tensor.detach().float().cpu().contiguous()}, str(tmp))
    os.replace(tmp, path)


def child_forward(spec: dict) -> dict:
    from contextlib import nullcontext

    from ..speed import compile as compile_mod
    from .legacy_block import legacy_forward

    device = torch.device(spec["device"])
    out: dict = {"cap_bytes": apply_cap(device, spec.get("cap_gib"), spec["context_gib"])}
    if device.type == "cuda":
        torch.empty(1, device=device)
    workdir = Path(spec["workdir"])
    with legacy_forward() if spec.get("legacy") else nullcontext():
        t_load = time.perf_counter()
        model, inputs, forward, info = _forward_setup(spec)
        film = info.pop("film_cache", None)
        sync(device)
        out.update(info, load_seconds=round(time.perf_counter() - t_load, 2))
        if device.type == "cuda":
            out["weights_allocated"] = torch.cuda.memory_allocated(device)
            torch.cuda.reset_peak_memory_stats(device)
        # Layered: one call is a whole step (cond and uncond); sequential: a step is two forwards.
        layered = spec.get("cfg") == "layered"
        step = (lambda: forward()) if layered else (lambda: (forward(inputs["ctx"]), forward(inputs["neg"])))
        # First forward: includes compiling (compile cases) and one-time kernel selection.
        t0 = time.perf_counter()
        first = forward() if layered else forward(inputs["ctx"])
        sync(device)
        out["first_forward_seconds"] = round(time.perf_counter() - t0, 3)
        out["finite"] = bool(torch.isfinite(first).all())
        _save(workdir / f"out_{spec['case']}.safetensors", first[0])  # the cond output (a layered call's first half)
        del first
        t0 = time.perf_counter()
        if layered:
            forward()
        else:
            forward(inputs["neg"])
        sync(device)
        out["second_forward_seconds"] = round(time.perf_counter() - t0, 3)
        steps = []
        for _ in range(spec["timed"]):
            t0 = time.perf_counter()
            step()
            sync(device)
            steps.append(time.perf_counter() - t0)
        if film is not None:
            # a forward that reads every block's values: the output compared bit for bit with the twin's first one
            last = forward() if layered else forward(inputs["ctx"])
            _save(workdir / f"out_{spec['case']}.safetensors", last[0])
            del last
            out["film_cache"] = {**film.to_json(), **film.stores["host"].stats()} if "host" in film.stores \
                else film.to_json()
        out["step_seconds"] = [round(s, 3) for s in steps]
        out["s_per_step"] = round(sum(steps) / len(steps), 3)
        out["s_per_forward"] = round(out["s_per_step"] / 2, 3)  # layered: half a step, per pass
        if device.type == "cuda":
            out["peak_allocated"] = torch.cuda.max_memory_allocated(device)
            out["peak_reserved"] = torch.cuda.max_memory_reserved(device)
            out["activation_peak"] = out["peak_allocated"] - out["weights_allocated"]
        out["compile_stats"] = compile_mod.STATS.to_json()
        from ..wan.dit import attention as attn

        out["attention"] = {"backend_in_use": attn.get_backend(), "sdpa_order": attn.get_sdpa_order(),
                            "first_call_checks": dict(attn.CHECKS)}
        if spec.get("profile") and layered:  # one layered call is both passes: the split per pass, like the others
            prof = profile_split(forward, device)
            prof["seconds"] = {k: round(v / 2, 4) for k, v in prof["seconds"].items()}
            prof["kernel_seconds"] = round(prof["kernel_seconds"] / 2, 4)
            prof["per"] = "pass (half of one layered call)"
            out["profile"] = prof
        elif spec.get("profile"):
            out["profile"] = profile_split(lambda: forward(inputs["ctx"]), device)
        if spec.get("small_run"):
            latent, seconds = _small_run(model, spec, device)
            out["small_run_seconds"] = round(seconds, 2)
            out["small_run_finite"] = bool(torch.isfinite(latent).all())
            _save(workdir / f"small_{spec['case']}.safetensors", latent)
    return out


def child_attention(spec: dict) -> dict:
    """SDPA kernels (and installed packages) on the full-size self-attention: ms, TFLOP/s, error vs float32."""
    from ..wan.dit import attention as attn

    device = torch.device(spec["device"])
    b, seq, heads, hd = spec["attn_shape"]
    g = torch.Generator(device=device).manual_seed(0)
    dtype = torch.bfloat16
    q, k, v = (torch.randn(b, seq, heads, hd, device=device, generator=g, dtype=dtype) for _ in range(3))
    flops = 4 * b * heads * seq * seq * hd
    nq = min(seq, 1024)
    ref = attn.sdpa(q[:, :nq].float(), k.float(), v.float())  # float32 reference for the first queries
    out: dict = {"shape": [b, seq, heads, hd], "flops": flops, "order_auto": attn.sdpa_kernel_order(device)}
    runs = {f"sdpa_{kname}": (lambda kname=kname: attn.sdpa(q, k, v, (kname,))) for kname in
            (("cudnn", "flash", "efficient") if device.type == "cuda" else ("math",))}
    runs["sdpa_auto"] = lambda: attn.sdpa(q, k, v, attn.sdpa_kernel_order(device))
    for name in ("sage", "flash", "fp8", "cudnn"):
        if name in attn.available_backends() and device.type == "cuda":
            runs[name] = lambda name=name: attn._kernel(name, q, k, v)
    for name, fn in runs.items():
        try:
            fn()
            sync(device)
            n = spec["attn_iters"]
            t0 = time.perf_counter()
            for _ in range(n):
                o = fn()
            sync(device)
            sec = (time.perf_counter() - t0) / n
            out[name] = {"ms": round(sec * 1e3, 2), "tflops": round(flops / sec / 1e12, 1),
                         "rel_error_vs_fp32": attn.relative_error(o[:, :nq], ref)}
        except Exception as e:  # noqa: BLE001 - a kernel this GPU or build lacks
            out[name] = {"error": type(e).__name__ + ": " + str(e).partition("\n")[0][:200]}
    if "sage" in attn.available_backends() and device.type == "cuda":
        out["sage_probe"] = attn.probe_sage(device) or "ok"
    return out


def child_tiny(spec: dict) -> dict:
    """Every compute/compile path on the tiny config, against the bf16 NF4 path (and NF4 against its float
    weights, for scale): per forward and over a 4-step run."""
    import tempfile

    from ..loaders.expert_loader import load_expert
    from ..loaders.nf4_writer import random_expert_state, write_official_expert
    from ..speed import compile as compile_mod
    from ..speed.options import apply_speed
    from ..wan.sampling.sampler import make_noise

    device = torch.device(spec["device"])
    cfg = DiTConfig.tiny()
    if device.type == "cpu":
        compile_mod.BACKEND = "aot_eager"
    compile_mod.configure_cache(Path(spec["workdir"]) / "inductor")
    spec = {**spec, "config": cfg.to_json(), "tiny": True}
    out: dict = {"config": cfg.to_json()}
    with tempfile.TemporaryDirectory(dir=spec["workdir"]) as tmp:
        write_official_expert(random_expert_state(cfg, "cpu", seed=5, dtype=torch.bfloat16), cfg, tmp,
                              dtype=torch.bfloat16)
        nf4 = load_expert(tmp, device=device, mode="nf4", compute_dtype=torch.bfloat16)
        plain = load_expert(tmp, device=device, mode="bf16")
    inputs = make_inputs(TINY_VIDEO, cfg, device)
    noise = make_noise(inputs["shape"], 1, source="cpu").to(device)
    t = torch.tensor([900], device=device)

    def forward(model):
        with torch.inference_mode():
            return model(noise, t, inputs["ctx"], inputs["y"], camera=inputs["camera"]).float()

    small = {"config": cfg.to_json(), "small_video": list(TINY_SMALL_VIDEO)}

    def run4(model):
        return _small_run(model, small, device)[0].float()

    def rel(a, b):
        return ((a - b).norm() / b.norm()).item()

    ref_f, ref_r = forward(nf4), run4(nf4)
    out["nf4_vs_float_weights"] = {"forward": rel(ref_f, forward(plain)), "run4": rel(ref_r, run4(plain))}
    del plain
    for name in ("compile", "fp8", "fp8_compile", "int8", "int8_compile", "fp16acc"):
        case = CASES[name]
        try:
            plan = _plan_for({**spec, **case}, device)
            apply_speed(nf4, plan)
            for m in nf4.modules():
                if hasattr(m, "lowp_min_rows"):
                    m.lowp_min_rows = 1
            out[name] = {"forward": rel(forward(nf4), ref_f), "run4": rel(run4(nf4), ref_r)}
        except Exception as e:  # noqa: BLE001
            out[name] = {"error": type(e).__name__ + ": " + str(e).partition("\n")[0][:300]}
    return out


CHILDREN = {FORWARD: child_forward, "attention": child_attention, "tiny": child_tiny}


# ---- parent ---------------------------------------------------------------------------------------------------
def case_spec(name: str, args, cfg: DiTConfig, expert: str, device: str, workdir: Path) -> dict:
    base = dict(CASES[name])
    full = (1, 31668, 40, 128)
    spec = {
        **base, "case": name, "device": device, "config": cfg.to_json(), "tiny": args.tiny, "expert": expert,
        "workdir": str(workdir), "video": list(TINY_VIDEO if args.tiny else V480),
        "small_video": list(TINY_SMALL_VIDEO if args.tiny else SMALL_VIDEO), "small_run": not args.no_small_run,
        "cap_gib": None if (args.tiny or device != "cuda") else args.cap_gib, "context_gib": args.context_gib,
        "timed": args.timed_steps, "chunk": args.token_chunk, "expandable_segments": True,
        "attn_shape": [1, 96, 2, 64] if args.tiny else list(full), "attn_iters": 2 if args.tiny else 10,
    }
    if args.no_profile:
        spec["profile"] = False
    return spec


def _load_saved(path: Path) -> Optional[torch.Tensor]:
    if not path.is_file():
        return None
    from safetensors.torch import load_file

    return load_file(str(path))["t"]


def errors_vs_reference(res: dict, workdir: Path) -> None:
    """Relative error of every forward case against `eager` (files saved by the children, possibly by an earlier
    call with the same --workdir)."""
    for kind, prefix in (("forward", "out"), ("run4", "small")):
        ref = _load_saved(workdir / f"{prefix}_{REFERENCE}.safetensors")
        if ref is None:
            continue
        for name, r in res["cases"].items():
            if name == REFERENCE or "error" in r or CASES.get(name, {}).get("kind") != FORWARD:
                continue
            out = _load_saved(workdir / f"{prefix}_{name}.safetensors")
            if out is not None and out.shape == ref.shape:
                r.setdefault("rel_error_vs_eager", {})[kind] = ((out - ref).norm() / ref.norm()).item()
            twin = twin_of(name)
            twin_out = _load_saved(workdir / f"{prefix}_{twin}.safetensors") if twin else None
            if out is not None and twin_out is not None and out.shape == twin_out.shape:
                # layered / the camera cache must reproduce their twin bit for bit (same GEMM shapes, same kernels)
                r["twin"] = twin
                r.setdefault("bit_identical_to_twin", {})[kind] = bool(torch.equal(out, twin_out))
                r.setdefault("rel_error_vs_twin", {})[kind] = (
                    (out - twin_out).norm() / twin_out.norm().clamp_min(1e-30)).item()


def summarize(res: dict) -> dict:
    c = res["cases"]
    ok = lambda r: r is not None and "error" not in r  # noqa: E731
    s: dict = {"rows": {}, "projection": {}}
    base = c.get("baseline", {}).get("s_per_step") if ok(c.get("baseline")) else None
    eager = c.get("eager", {}).get("s_per_step") if ok(c.get("eager")) else None
    for name, r in c.items():
        if CASES.get(name, {}).get("kind") != FORWARD or not ok(r):
            continue
        row = {k: r.get(k) for k in ("s_per_step", "s_per_forward", "first_forward_seconds",
                                     "second_forward_seconds")}
        row["warmup_seconds"] = (round(r["first_forward_seconds"] - r["s_per_forward"], 2)
                                 if r.get("s_per_forward") else None)
        row["peak_allocated_gb"] = round(r["peak_allocated"] / 1e9, 2) if r.get("peak_allocated") else None
        row["peak_reserved_gb"] = round(r["peak_reserved"] / 1e9, 2) if r.get("peak_reserved") else None
        row["activation_peak_gb"] = round(r["activation_peak"] / 1e9, 2) if r.get("activation_peak") else None
        if base and r.get("s_per_step"):
            row["over_baseline"] = round(r["s_per_step"] / base, 3)
        if eager and r.get("s_per_step"):
            row["over_eager"] = round(r["s_per_step"] / eager, 3)
        row["rel_error_vs_eager"] = r.get("rel_error_vs_eager")
        twin = c.get(twin_of(name)) if twin_of(name) else None
        if ok(twin) and twin.get("s_per_step") and r.get("s_per_step"):
            row["twin"] = twin_of(name)
            row["over_twin"] = round(r["s_per_step"] / twin["s_per_step"], 3)
            if r.get("peak_allocated") and twin.get("peak_allocated"):
                row["extra_peak_gb"] = round((r["peak_allocated"] - twin["peak_allocated"]) / 1e9, 2)
        if r.get("bit_identical_to_twin") is not None:
            row["bit_identical_to_twin"] = r["bit_identical_to_twin"]
        if r.get("film_cache"):
            row["film_cache_host_gb"] = round(r["film_cache"].get("host_bytes", 0) / 1e9, 2)
            row["peak_rss_gb"] = round(r.get("peak_rss", 0) / 1e9, 2)
        s["rows"][name] = row
        prof = r.get("profile")
        if prof:
            compute = CASES[name].get("compute", "bf16")
            s["projection"][name] = projection_row(prof, compute, r)
            if compute == "bf16":  # the same kernels with fp16-accumulate GEMMs (the H100 runs those at bf16 speed)
                s["projection"][f"{name}+fp16acc (derived)"] = projection_row(prof, "fp16acc", r)
    return s


def projection_row(prof: dict, compute: str, r: dict) -> dict:
    measured = PROJECTION_CARDS[MEASURED_ON]
    proj = {"h100_kernel_split_s": prof["seconds"], "compute": compute}
    overhead = r["s_per_forward"] - prof["kernel_seconds"] if r.get("s_per_forward") else 0.0
    proj["h100_non_kernel_s"] = round(overhead, 3)
    for card, spec in PROJECTION_CARDS.items():
        if card == MEASURED_ON:
            continue
        fwd = project(prof["seconds"], compute, spec, measured)
        proj[card] = None if fwd is None else {
            "s_per_forward": round(fwd, 2), "s_per_step": round(2 * fwd, 2),
            "sampling_70_steps_min": round(70 * 2 * fwd / 60, 1)}
    return proj


def check_targets(res: dict) -> dict:
    c, t = res["cases"], {}
    for name, (key, limit) in TARGETS.items():
        r = c.get(name)
        if r is not None and "error" not in r and r.get(key) is not None:
            t[f"{name}_{key}<={limit}"] = r[key] <= limit
    for name, r in c.items():
        if CASES.get(name, {}).get("kind") == FORWARD and r and "error" not in r and r.get("peak_reserved"):
            t[f"{name}_swap_vram<=13GB"] = r["peak_reserved"] <= SWAP_VRAM_TARGET
    for name, r in c.items():
        twin = c.get(twin_of(name)) if twin_of(name) else None
        if not (r and "error" not in r and twin and "error" not in twin):
            continue
        limit = RATIO_TARGETS[FILM_SUFFIX if name.endswith(FILM_SUFFIX) else LAYERED_SUFFIX]
        if r.get("s_per_step") and twin.get("s_per_step"):
            t[f"{name}_over_{twin_of(name)}<={limit}"] = r["s_per_step"] / twin["s_per_step"] <= limit
        for kind, same in (r.get("bit_identical_to_twin") or {}).items():
            t[f"{name}_bit_identical_{kind}"] = same
    comp = c.get("compile", {}).get("rel_error_vs_eager", {}) if "error" not in c.get("compile", {"error": 1}) else {}
    if comp.get("forward") is not None:
        t["compile_error<=5e-3"] = comp["forward"] <= 5e-3
    return t


def print_report(res: dict) -> None:
    s = res.get("summary", {})
    print("\n| case | s/step | s/forward | warm-up s | peak VRAM alloc / reserved | vs baseline | err/forward | err/4 steps |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for name, r in res["cases"].items():
        if "error" in r:
            print(f"| {name} | ERROR: {r['error'][:90]} | | | | | | |")
            continue
        row = s.get("rows", {}).get(name)
        if row is None:
            continue
        e = row.get("rel_error_vs_eager") or {}
        fmt = lambda v: "-" if v is None else f"{v:.2e}"  # noqa: E731
        print(f"| {name} | {row['s_per_step']} | {row['s_per_forward']} | {row['warmup_seconds']} | "
              f"{row['peak_allocated_gb']} / {row['peak_reserved_gb']} GB | {row.get('over_baseline', '-')} | "
              f"{fmt(e.get('forward'))} | {fmt(e.get('run4'))} |")
    for name, row in s.get("rows", {}).items():
        if "over_twin" in row or "bit_identical_to_twin" in row:
            print(f"{name}: {row.get('over_twin')} x {row.get('twin')}'s s/step, peak {row.get('extra_peak_gb')} GB "
                  f"more, bit-identical {row.get('bit_identical_to_twin')}"
                  + (f", host cache {row['film_cache_host_gb']} GB, peak RSS {row['peak_rss_gb']} GB"
                     if "film_cache_host_gb" in row else ""))
    for name in ("attention", "tiny"):
        if name in res["cases"]:
            print(f"\n{name}: {json.dumps(res['cases'][name], default=str)[:1500]}")
    if s.get("projection"):
        cards = [c for c in PROJECTION_CARDS if c != MEASURED_ON]
        print("\n| path | H100 kernel split (s/forward): attention / GEMM / dequant / elementwise | "
              + " | ".join(f"{c} s/step (70 steps)" for c in cards) + " |")
        print("| --- | --- | " + " | ".join("---" for _ in cards) + " |")
        for name, proj in s["projection"].items():
            sp = proj["h100_kernel_split_s"]
            cells = []
            for c in cards:
                v = proj.get(c)
                cells.append("-" if v is None else f"{v['s_per_step']} ({v['sampling_70_steps_min']} min)")
            print(f"| {name} | {sp['attention']} / {sp['gemm']} / {sp['dequant']} / {sp['elementwise']} | "
                  + " | ".join(cells) + " |")
    print("\ntargets:", json.dumps(res.get("targets", {})))


def run(args) -> dict:
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    cfg = bench_config(args.tiny, args.layers)
    workdir = Path(args.workdir)
    workdir.mkdir(parents=True, exist_ok=True)

    def finish(res: dict) -> None:
        errors_vs_reference(res, workdir)
        res.update(summary=summarize(res), targets=check_targets(res))

    loop = CaseLoop(args, "speed", device, finish, config=cfg.to_json(),
                    notes=["s/step = a cond + an uncond forward (sequential CFG), mean of the timed steps after two "
                           "warm-up forwards; the first forward includes compiling. *_layered cases: s/step = ONE "
                           "layered call (both passes), s/forward = half of it. *_filmcache cases: the camera FiLM cache in pinned "
                           "host memory (filled by the first forward). over_twin and bit_identical_to_twin compare "
                           "with the case of the same name without its last suffix (_layered or _filmcache).",
                           "errors are relative (L2) against the eager bf16 path: the cond output of the first "
                           f"forward at {V480}, and the final latent of a 4-step run (2+2, one expert) at "
                           f"{SMALL_VIDEO}.",
                           "projection: H100 kernel split scaled by published peaks (attention/GEMM: tensor-core "
                           "FLOP/s of their precision; dequant/elementwise: memory bandwidth); not a measurement."])
    forward_cases = [n for n in args.cases if CASES[n]["kind"] == FORWARD]
    if forward_cases and REFERENCE not in args.cases and not (workdir / f"out_{REFERENCE}.safetensors").is_file():
        # errors are taken against eager: a fresh machine (or workdir) runs it first
        print(f"[{REFERENCE}] its outputs are not in {workdir}: running it first as the error reference", flush=True)
        args.cases = [REFERENCE] + list(args.cases)
    expert = None
    if forward_cases:
        paths = expert_paths(workdir, ("high",))
        expert = random_experts(loop, paths, {"high": cfg}, device, label="expert")["paths"]["high"]
    else:
        loop.save()

    def run_case(name: str, timeout: float) -> dict:
        if name == "sage" and not args.tiny:
            from ..wan.dit.attention import available_backends

            if "sage" not in available_backends():
                return {"error": "skipped: sageattention is not installed"}
        return run_case_child(case_spec(name, args, cfg, expert, device, workdir), workdir, timeout, MODULE)

    return loop.run(run_case, workdir, written=[] if expert is None else [Path(expert)],
                    time_box=args.case_timeout_s)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_case_arguments(p, CASES, DEFAULT_CASES, budget_s=530.0, min_case_s=40.0,
                       tiny_help="tiny config and video on the CPU (smoke run)",
                       time_box=("--case-timeout-s", 300.0, "time box of one case"),
                       workdir="/tmp/lingbot_speed_bench", workdir_help="expert (9.6 GB), outputs, inductor cache",
                       keep_help="keep the expert for the next call")
    p.add_argument("--layers", type=int, default=None, help="blocks of the expert (default 40)")
    p.add_argument("--timed-steps", type=int, default=2, help="timed steps (2 forwards each) after the warm-up")
    p.add_argument("--token-chunk", type=int, default=DEFAULT_TOKEN_CHUNK, help="tokens per chunk (default 8192)")
    p.add_argument("--cap-gib", type=float, default=24.0, help="simulated card size (swap layout)")
    p.add_argument("--context-gib", type=float, default=0.5, help="GiB a real card loses to the CUDA context")
    p.add_argument("--no-profile", action="store_true", help="skip the profiler kernel split")
    p.add_argument("--no-small-run", action="store_true", help="skip the 4-step error run")
    args = p.parse_args(argv)
    if args.child:
        torch.manual_seed(0)  # the children's random draws are the same from call to call
        return child_main(args.child, CHILDREN)
    args.cases = parse_cases(p, args.cases, CASES)
    if args.tiny:
        args.timed_steps = min(args.timed_steps, 1)
    with tiny_children(args.tiny):  # one thread per child process, the caller's environment kept
        res = run(args)
    print_report(res)
    if args.out:
        print(f"results: {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
