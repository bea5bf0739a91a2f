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
import sys
from pathlib import Path

import torch

from ..wan.dit.model import DiTConfig
from ..wan.dit.blocks import DEFAULT_TOKEN_CHUNK
from .common import CaseLoop, add_case_arguments, child_main, parse_cases, run_case_child, tiny_children
from .expert_files import expert_paths, random_experts
from .pipeline_cases import CASES, DEFAULT_CASES, TINY_VIDEO, V480
from .pipeline_child import CHILDREN
from .pipeline_report import check_targets, print_report, summarize
from .pipeline_setup import bench_config

MODULE = __spec__.name if __spec__ is not None else __name__  # the name this file runs under (`-m`)


# ---- parent ---------------------------------------------------------------------------------------------
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
