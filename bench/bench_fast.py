"""Benchmark: LingBot-World-Fast at full size on simulated consumer cards, and the base model in the same session.

    # one H100, two commands of < 9 minutes; the second reuses the experts written by the first (--workdir, --keep)
    python -m lingbot_world.bench.bench_fast --cases fast480_gpu,fast480_24,fast480_16,base480 \\
        --workdir /tmp/lwf --keep --fresh --budget-s 500 --t5-seconds 12.9 --out bench/results/fast_h100.json
    python -m lingbot_world.bench.bench_fast --cases fast961_window_24,fast720_24,fast480_12 \\
        --workdir /tmp/lwf --budget-s 500 --t5-seconds 12.9 --out bench/results/fast_h100.json
    python -m lingbot_world.bench.bench_fast --tiny --out /tmp/fast_tiny.json          # CPU smoke run
    # one mid-video chunk of the 24 GB case under torch.profiler (< 2 minutes; reuses --workdir's experts)
    python -m lingbot_world.bench.bench_fast --cases fast480_profile --workdir /tmp/lwf --keep \
        --out bench/results/fast_profile_h100.json

Two random full-size NF4 experts in the real community layout are written once (made and quantized on the GPU,
≈9.6 GB each, reused from --workdir when their config matches): the Fast model (config class WanModelFast) and
one base expert. Each case runs in its own child process (common.run_case_child; memory cap via
`set_per_process_memory_fraction` for a 24 / 16 / 12 GB card minus --context-gib, nvidia-smi polled by the parent,
the child's VmHWM), through the library exactly as the CLI runs it: `plan_fast_memory` (auto placement),
`FastPlacement` (model + K/V cache), `FastRun` over every chunk with real conditioning shapes (y from a random
latent, a preset camera resampled at the chunk-rounded latent frames, random bf16 text context).

Reported per Fast case: the plan, sampling seconds (every chunk, 4 steps + the context pass), seconds per chunk,
model load and cache allocation seconds, VAE encode / decode (full-size random VAE; decode after the model and cache
are freed), end to end (with --t5-seconds from bench_t5), peak VRAM (torch allocated / reserved, nvidia-smi), peak
RSS, bytes streamed from host RAM, and per-chunk peaks for the long video (memory flat). The base case: one expert
resident, seconds per 70-step-schedule step (CFG cond + uncond) from a warm-up and --timed-steps steps, end to end
extrapolated to 70 steps (+ one expert switch from the pipeline benchmark, --switch-seconds).

fast480_profile (not in the default list): fast480_24 up to its middle chunk, that chunk (4 steps + the context
pass) under torch.profiler: device time by kernel category (speed_profile.profile_split), the top 15 operators by
device time and by CPU time, and the unprofiled wall time of the chunks on either side, to tell whether the Fast
forward (4,680 query tokens per call at 480x832) keeps the GPU busy or waits for the CPU.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

from ..wan.dit.model import DiTConfig
from .pipeline_setup import bench_config
from .expert_files import random_experts
from .common import (
    CaseLoop,
    add_case_arguments,
    case_ok,
    child_main,
    in_gb,
    mib_in_gb,
    parse_cases,
    run_case_child,
    tiny_children,
)
from .fast_child import CHILDREN

MODULE = __spec__.name if __spec__ is not None else __name__
GiB = 1024**3
STEPS = 70

V480 = (81, 480, 832)  # 30 x 52 tokens per latent frame: the spec's 32,760-token / 26.8 GB cache
V720 = (81, 720, 1280)
V961 = (961, 480, 832)
CASES: dict[str, dict] = {
    "fast480_gpu": dict(kind="fast", video=V480, cap_gib=None),  # uncapped H100: the whole cache on the GPU
    "fast480_24": dict(kind="fast", video=V480, cap_gib=24),
    "fast480_16": dict(kind="fast", video=V480, cap_gib=16),
    "fast480_12": dict(kind="fast", video=V480, cap_gib=12),  # beyond the issue: model block swap too
    "fast480_24_compile": dict(kind="fast", video=V480, cap_gib=24, speed=dict(compile="blocks")),
    "fast480_24_fp8": dict(kind="fast", video=V480, cap_gib=24, speed=dict(compile="blocks", compute="fp8")),
    "fast480_24_fp8attn": dict(kind="fast", video=V480, cap_gib=24,
                               speed=dict(compile="off", compute="fp8", attention="fp8")),
    "fast480_24_eager_fp8attn": dict(kind="fast", video=V480, cap_gib=24, speed=dict(compile="off", attention="fp8")),
    "fast720_24": dict(kind="fast", video=V720, cap_gib=24),
    "fast961_window_24": dict(kind="fast", video=V961, cap_gib=24, window=21, sink=3, vae=False),
    "base480": dict(kind="base", video=V480, cap_gib=None),
    # torch.profiler over one mid-video chunk (4 steps + the context pass) of fast480_24: not in the default list
    "fast480_profile": dict(kind="fast", video=V480, cap_gib=24, profile=True),
}
DEFAULT_CASES = [name for name, c in CASES.items() if not c.get("profile")]
TARGETS = {
    "fast480_24": "runs; sampling <= 30 s; peak VRAM <= 22.5 GB; peak RSS <= 40 GB",
    "fast480_16": "runs",
    "fast720_24": "runs",
    "fast961_window_24": "runs; per-chunk time within 1.2x of the first chunks'; memory flat",
    "base480": ">= 20x slower end to end than fast480_24",
}
TINY_VIDEO = {"fast": (33, 64, 112), "long": (57, 64, 112)}


# ---- parent ----------------------------------------------------------------------------------------------------
def case_spec(name: str, args, cfgs: dict, experts: dict, device: str) -> dict:
    c = dict(CASES[name])
    video = c["video"]
    if args.tiny:
        video = TINY_VIDEO["long" if video[0] > 81 else "fast"]
    spec = {"case": name, "kind": c["kind"], "device": device, "tiny": args.tiny, "video": list(video),
            "config": cfgs["fast"].to_json(), "base_config": cfgs["base"].to_json(),
            "fast": experts["paths"]["fast"], "base": experts["paths"]["base"],
            "cap_gib": c.get("cap_gib") if device == "cuda" else None, "context_gib": args.context_gib,
            "timed": args.timed_steps, "vae": c.get("vae", True), "expandable_segments": True}
    if c.get("speed") and not args.tiny:  # the tiny CPU smoke run stays eager
        spec["speed"] = c["speed"]
    if c.get("profile"):
        spec.update(profile=True, vae=False)
    if c.get("window"):
        spec.update(window=3 if args.tiny else c["window"], sink=1 if args.tiny else c["sink"])
        if args.tiny:
            spec["window"] = 9
    if args.tiny and c.get("cap_gib") and c["cap_gib"] <= 16:
        spec.update(cache="host", cache_layers_on_gpu=1)  # no card to plan from: exercise the streamed path
    return spec


def summarize(res: dict, args) -> dict:
    c = res["cases"]
    s: dict = {}
    for name, r in c.items():
        if not case_ok(r) or CASES.get(name, {}).get("kind") != "fast":
            continue
        if r.get("profile"):
            pr = r["profile"]
            s[name] = {"plan": r["plan"]["reason"], "chunk": f"{pr['chunk'] + 1} of {pr['chunks']}",
                       "wall_s_around": pr["wall_s_around"], "device_s": pr["split"]["kernel_seconds"],
                       "device_busy_share": pr["device_busy_share"], "device_split_s": pr["split"]["seconds"],
                       "profiled_wall_s": pr["split"]["profiled_wall_seconds"]}
            continue
        row = {"plan": r["plan"]["reason"], "sampling_s": r.get("sampling_s"), "frames": r.get("frames"),
               "load_s": r.get("load_s"), "cache_alloc_s": r.get("cache_alloc_s"),
               "peak_allocated_gb": in_gb(r.get("peak_allocated")), "peak_reserved_gb": in_gb(r.get("peak_reserved")),
               "smi_peak_gb": mib_in_gb(r.get("smi_peak_used_mib")), "peak_rss_gb": in_gb(r.get("peak_rss"))}
        chunks = r.get("chunk_s") or []
        if chunks:
            row["first_chunk_s"], row["mean_chunk_s"] = chunks[0], round(sum(chunks) / len(chunks), 3)
            head = chunks[1:4] or chunks[:1]
            tail = chunks[-3:]
            row["late_over_early_chunks"] = round((sum(tail) / len(tail)) / (sum(head) / len(head)), 3)
            window = CASES.get(name, {}).get("window")
            if window:  # until the window is full each chunk attends to more frames: compare from there on
                fill = -(-window // 3)
                full = chunks[fill:fill + 3] or head
                row["late_over_full_window_chunks"] = round((sum(tail) / len(tail)) / (sum(full) / len(full)), 3)
        peaks = [p.get("peak_reserved") for p in r.get("chunk_peaks", []) if p.get("peak_reserved")]
        if len(peaks) > 3:
            row["late_over_early_peak_reserved"] = round(max(peaks[-3:]) / max(peaks[1:4]), 3)
        rss = [p["rss"] for p in r.get("chunk_peaks", []) if p.get("rss")]
        if len(rss) > 3:
            row["late_over_early_rss"] = round(max(rss[-3:]) / max(rss[1:4]), 3)
        if r.get("compile_s") is not None:  # a later run loads the kernels from the inductor cache
            row.update(speed=r.get("speed"), compile_s=r["compile_s"],
                       sampling_warm_s=round(r["sampling_s"] - r["compile_s"], 3))
        parts = [args.t5_seconds, r.get("vae_encode_s"), r.get("load_s"), r.get("cache_alloc_s"),
                 row.get("sampling_warm_s", r.get("sampling_s")), r.get("vae_decode_s")]
        if all(p is not None for p in parts):
            row["end_to_end_s"] = round(sum(parts), 2)
        s[name] = row
    base = c.get("base480")
    if case_ok(base):
        fast_ref = c.get("fast480_24") if case_ok(c.get("fast480_24")) else c.get("fast480_gpu")
        row = {"s_per_step": base["s_per_step"], "sampling_70_steps_s": round(base["s_per_step"] * STEPS, 1),
               "load_s": base["load_s"]}
        enc = (fast_ref or {}).get("vae_encode_s")
        dec = (fast_ref or {}).get("vae_decode_s")
        parts = [args.t5_seconds, enc, base["load_s"], row["sampling_70_steps_s"], args.switch_seconds, dec]
        if all(p is not None for p in parts):
            row["end_to_end_s"] = round(sum(parts), 1)
        s["base480"] = row
        for name in ("fast480_24", "fast480_gpu", "fast480_16", "fast480_24_compile", "fast480_24_fp8",
                     "fast480_24_fp8attn", "fast480_24_eager_fp8attn"):
            f = s.get(name)
            if f and f.get("sampling_s"):
                sampling = f.get("sampling_warm_s", f["sampling_s"])
                s.setdefault("speedup", {})[f"{name}_sampling"] = round(row["sampling_70_steps_s"] / sampling, 1)
                if f.get("end_to_end_s") and row.get("end_to_end_s"):
                    s["speedup"][f"{name}_end_to_end"] = round(row["end_to_end_s"] / f["end_to_end_s"], 1)
    return s


def check_targets(res: dict) -> dict:
    s = res.get("summary", {})
    c = res["cases"]
    t: dict = {}
    for name in ("fast480_24", "fast480_16", "fast720_24", "fast961_window_24"):
        if name in c:
            t[f"{name}_runs"] = case_ok(c[name])
    r = s.get("fast480_24")
    if r and r.get("peak_reserved_gb") is not None:
        t["fast480_24_sampling<=30s"] = r["sampling_s"] <= 30
        t["fast480_24_peak_vram<=22.5GB"] = r["peak_reserved_gb"] <= 22.5
        t["fast480_24_peak_rss<=40GB"] = (r.get("peak_rss_gb") or 0) <= 40
    r = s.get("fast961_window_24")
    if r and r.get("late_over_early_chunks") is not None:
        t["fast961_chunks_flat<=1.2x"] = r.get("late_over_full_window_chunks", r["late_over_early_chunks"]) <= 1.2
        if r.get("late_over_early_peak_reserved") is not None:
            t["fast961_vram_flat"] = r["late_over_early_peak_reserved"] <= 1.02
    sp = s.get("speedup", {})
    if "fast480_24_end_to_end" in sp:
        t["fast480_24_>=20x_base_end_to_end"] = sp["fast480_24_end_to_end"] >= 20
    return t


def print_report(res: dict) -> None:
    print("\n| case | plan | frames | sampling s | s/chunk (first / mean) | load + cache s | end to end s | "
          "peak VRAM alloc / reserved | nvidia-smi | peak RSS |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for name, r in res["cases"].items():
        if "error" in r:
            print(f"| {name} | ERROR: {r['error'][:120]} | | | | | | | | |")
            continue
        row = res.get("summary", {}).get(name, {})
        if CASES[name]["kind"] == "base":
            print(f"| {name} | one base expert, sequential CFG | 81 | {row.get('sampling_70_steps_s')} (70 x "
                  f"{r['s_per_step']} s/step) | | {r['load_s']} | {row.get('end_to_end_s')} | | | |")
            continue
        if r.get("profile"):
            pr = r["profile"]
            print(f"| {name} | chunk {pr['chunk'] + 1}/{pr['chunks']} profiled: device {pr['split']['kernel_seconds']} s "
                  f"of ~{pr['wall_s_around']} s wall (busy {pr['device_busy_share']}), split "
                  f"{json.dumps(pr['split']['seconds'])} | | | | | | | | |")
            continue
        plan = r["plan"]
        where = ("cache on GPU" if plan["cache"] == "gpu" else
                 f"cache host, {plan['cache_layers_on_gpu']}/{plan['estimates']['num_layers']} on GPU") + (
            f", blocks {plan['blocks_on_gpu']}" if plan.get("blocks_on_gpu") is not None else "")
        print(f"| {name} | {where} | {r['frames']} | {r.get('sampling_s')} | {row.get('first_chunk_s')} / "
              f"{row.get('mean_chunk_s')} | {r.get('load_s')} + {r.get('cache_alloc_s')} | {row.get('end_to_end_s')} | "
              f"{row.get('peak_allocated_gb')} / {row.get('peak_reserved_gb')} GB | {row.get('smi_peak_gb')} GB | "
              f"{row.get('peak_rss_gb')} GB |")
    print("\nspeed-up:", json.dumps(res.get("summary", {}).get("speedup", {})))
    print("targets:", json.dumps(res.get("targets", {})))


def run(args) -> dict:
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    base_cfg = bench_config(args.tiny)
    cfgs = {"fast": DiTConfig(**{**base_cfg.__dict__, "causal": True}), "base": base_cfg}
    workdir = Path(args.workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    loop = CaseLoop(args, "fast", device, lambda res: res.update(summary=summarize(res, args),
                                                                  targets=check_targets(res)),
                    config=cfgs["fast"].to_json(),
                    notes=["Fast sampling: every chunk (4 steps + the context pass), timed from the first call to "
                           "the last.",
                           "base480: s/step of one resident expert (CFG cond + uncond) times 70; end to end adds T5, "
                           "VAE encode/decode (from the Fast 480p case), one load and --switch-seconds.",
                           "caps: set_per_process_memory_fraction of (card GiB - context_gib); nvidia-smi adds the "
                           "context."])
    paths = {"fast": workdir / "lingbot_world_fast_bnb_nf4", "base": workdir / "high_noise_model_bnb_nf4"}
    wanted = {n: paths[n] for n in ("fast", "base")
              if n == "fast" or any(CASES[c]["kind"] == "base" for c in args.cases)}
    experts = random_experts(loop, paths, cfgs, device, wanted=wanted)

    def run_case(name: str, timeout: float) -> dict:
        return run_case_child(case_spec(name, args, cfgs, experts, device), workdir, timeout, MODULE)

    return loop.run(run_case, workdir, written=paths.values())


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_case_arguments(p, CASES, DEFAULT_CASES, budget_s=500.0, min_case_s=30.0,
                       tiny_help="tiny config and videos on the CPU (smoke run)",
                       cases_note=" (default: all but fast480_profile)",
                       workdir="/tmp/lingbot_fast_bench", workdir_help="where the experts are written (≈19 GB)",
                       keep_help="keep the experts for the next call")
    p.add_argument("--timed-steps", type=int, default=2, help="base case: timed steps after one warm-up step")
    p.add_argument("--context-gib", type=float, default=0.5, help="GiB a real card loses to the CUDA context")
    p.add_argument("--t5-seconds", type=float, default=None, help="T5 encode seconds (bench_t5), for end to end")
    p.add_argument("--switch-seconds", type=float, default=3.29,
                   help="base end to end: one expert switch (BENCHMARKS.md, swap from disk)")
    args = p.parse_args(argv)
    if args.child:
        return child_main(args.child, CHILDREN)
    args.cases = parse_cases(p, args.cases, CASES)
    if args.tiny:
        args.timed_steps = 1
    with tiny_children(args.tiny):  # one thread per child process, the caller's environment kept
        res = run(args)
    print_report(res)
    if args.out:
        print(f"results: {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
