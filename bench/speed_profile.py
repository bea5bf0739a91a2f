"""bench_speed's profiler helpers (bench_fast's too): one call's device time by kernel category under
torch.profiler, its top operators, and the compute stream's idle gaps by size."""
from __future__ import annotations

import bisect
import json
import time
from pathlib import Path

import torch

from .pipeline_setup import sync
from .trace_gaps import compute_stream, host_gap_sources, idle_gaps


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
