"""Benchmark: one GPU against two (CFG-parallel, Ulysses) for the base and the Fast model, full-size random experts.

    # 2 x H200 (nvidia-h200-x2), two calls of < 5 minutes; the second reuses the experts written by the first
    python -m lingbot_world.bench.bench_parallel --cases base1,base2_cfg,base2_ulysses \
        --workdir /tmp/lwp --keep --fresh --budget-s 420 --out /tmp/lwp/parallel_h200x2.json
    python -m lingbot_world.bench.bench_parallel --cases fast1_81,fast2_81,fast1_961,fast2_961 \
        --workdir /tmp/lwp --budget-s 420 --out /tmp/lwp/parallel_h200x2.json
    # 2 x H100 (nvidia-h100-x2): issue 26's conditions (24 GB per GPU, window 21 + sink 3, compiled, rank 0 decoding)
    python -m lingbot_world.bench.bench_parallel --cases fast1_issue,fast2_issue --workdir /tmp/lwp --keep \
        --budget-s 560 --out bench/results/parallel_fast_issue_h100x2_today.json
    python -m lingbot_world.bench.bench_parallel --tiny --out /tmp/parallel_tiny.json     # CPU smoke run (gloo)

Two random full-size NF4 experts are written once in the community layout (made and quantized on the GPU, 9.6 GB
each, reused from --workdir when their config matches; bench_pipeline's writer): a base expert and the Fast model.
Each case runs in fresh processes: one-GPU cases as `python -m ... --child`, two-GPU cases under
`python -m torch.distributed.run --standalone --nproc_per_node=2` (NCCL; the NVLink-multicast switches
NCCL_NVLS_ENABLE=0, TORCH_SYMM_MEM_DISABLE_MULTICAST=1, NVSHMEM_DISABLE_NVLS=1 are kept as given or set), in a
process group of their own that the parent kills when the case overruns its time box. The children use the library
as the CLI does: the memory planner with the sequence split, `parallel.group.Session`, the layouts of
`parallel.layout`, `CFGParallel` as the sampler's velocity, `SequenceParallel` attached to the model,
`FastPlacement` whose K/V cache holds the rank's heads. Compile is off (eager, bf16 compute, SDPA's fastest exact
kernel): the comparison is between GPU counts, not against the compiled path.

- base (480x832x81, 32,760 tokens, camera on, one expert resident on each GPU): the real sampler over one warm-up
  step and --timed-steps timed steps; a step is the conditional and the unconditional pass. s/step on 1 GPU
  (sequential CFG), 2 GPUs CFG-parallel, 2 GPUs Ulysses (each rank both passes over half the tokens).
- fast (480x832; 81 frames, every chunk; 957 frames with window 21 + sink 3: --fast-chunks chunks, the rest
  extrapolated from the mean of the chunks after the window filled, and reported as extrapolated): s/chunk and
  sampling seconds on 1 GPU and 2 GPUs (Ulysses: tokens and K/V cache heads split).
- per rank: peak VRAM (torch allocated / reserved; nvidia-smi per GPU from the parent), weights on the device.
- output: rank 0 saves the final latent (base) / the last chunk's x0 (fast); `rel_l2_vs_one_gpu` is its relative L2
  distance from the one-GPU case's (same seed and inputs): the bf16 rounding the split adds.
- communication: in the Ulysses children, the four all-to-alls of one block at the case's shapes are timed alone
  (CUDA-synchronised, --comm-iters) and scaled to a step/chunk; in the CFG child, the all-gather of the two
  velocities. The summary projects 4 and 8 GPUs from these (a projection, labelled so): per pass
  P_N = P_1 / N + D + C_2 * 4 (N - 1) / N^2, with P_1 the one-GPU pass, D the per-rank work Ulysses does not split
  (measured at N = 2: NF4 dequantization of every weight per forward, text and camera embeddings, padding) and C_2
  the measured all-to-all time of a pass at N = 2 (per-rank bytes scale with (N - 1) / N^2 at a fixed per-GPU link
  bandwidth, as on NVSwitch); 4 GPUs = CFG x Ulysses 2, 8 GPUs = CFG x Ulysses 4, plus Ulysses alone.
Every case is time-boxed (--case-s, and the remaining --budget-s); the JSON is rewritten after every case, a case
that fails is recorded with its error and the next one runs.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Optional

import torch

from ..wan.dit.model import DiTConfig
from .pipeline_setup import bench_config
from .expert_files import random_experts
from .common import CaseLoop, add_case_arguments, case_ok, child_main, parse_cases, run_case_child
from .parallel_child import CHILDREN

MODULE = __spec__.name if __spec__ is not None else __name__
GiB = 1024**3
V480 = (81, 480, 832)  # the issue's 480x832x81: 30 x 52 tokens per latent frame, 32,760 tokens
V961 = (961, 480, 832)
NVLS_OFF = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}

CASES: dict[str, dict] = {
    "base1": dict(kind="base", gpus=1, mode="off", video=V480),
    "base2_cfg": dict(kind="base", gpus=2, mode="cfg", video=V480),
    "base2_ulysses": dict(kind="base", gpus=2, mode="ulysses", video=V480),
    "fast1_81": dict(kind="fast", gpus=1, mode="off", video=V480),
    "fast2_81": dict(kind="fast", gpus=2, mode="ulysses", video=V480),
    "fast1_961": dict(kind="fast", gpus=1, mode="off", video=V961, window=21, sink=3),
    "fast2_961": dict(kind="fast", gpus=2, mode="ulysses", video=V961, window=21, sink=3),
    # issue 26's conditions: 24 GB per GPU, window 21 + sink 3, compiled (the fastest exact path), two warm-up
    # chunks, then the whole 81-frame video timed with rank 0's streaming VAE decode of every chunk included
    "fast1_issue": dict(kind="fast", gpus=1, mode="off", video=V480, window=21, sink=3, issue=True),
    "fast2_issue": dict(kind="fast", gpus=2, mode="ulysses", video=V480, window=21, sink=3, issue=True),
}
PAIRS = {"base2_cfg": "base1", "base2_ulysses": "base1", "fast2_81": "fast1_81", "fast2_961": "fast1_961",
         "fast2_issue": "fast1_issue"}
TARGETS = {"base2_cfg": 1.8, "base2_ulysses": 1.7}  # speed-up per step over one GPU at 480x832x81
TINY = {"base": (9, 32, 48), "fast": (33, 64, 112), "long": (57, 64, 112)}


# ---- parent -----------------------------------------------------------------------------------------------------
def output_difference(workdir: Path, case: str, reference: str) -> Optional[float]:
    """Relative L2 distance of a case's output from its one-GPU reference (None when either is missing)."""
    from safetensors.torch import load_file

    a, b = workdir / f"out_{case}.safetensors", workdir / f"out_{reference}.safetensors"
    if not (a.is_file() and b.is_file()):
        return None
    x, y = load_file(str(a))["out"].double(), load_file(str(b))["out"].double()
    if x.shape != y.shape:
        return None
    return float((x - y).norm() / y.norm().clamp_min(1e-30))


def run_case(spec: dict, workdir: Path, timeout: float) -> dict:
    """One case in fresh processes (torchrun for 2 GPUs) in their own process group, killed as a whole on timeout;
    nvidia-smi's peak of every GPU."""
    env = dict(NVLS_OFF)
    if spec["device"] != "cuda":
        env["OMP_NUM_THREADS"] = "1"
    launcher = [] if spec["gpus"] == 1 else [
        "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={spec['gpus']}"]
    return run_case_child(spec, workdir, timeout, MODULE, launcher=launcher, env=env, smi_per_gpu=True)


def case_spec(name: str, args, cfgs: dict, experts: dict, device: str) -> dict:
    c = dict(CASES[name])
    video = c["video"]
    if args.tiny:
        video = TINY["base"] if c["kind"] == "base" else TINY["long" if c.get("window") else "fast"]
    spec = {"case": name, "kind": c["kind"], "gpus": c["gpus"], "mode": c["mode"], "device": device,
            "tiny": args.tiny, "video": list(video), "config": cfgs["base"].to_json(),
            "fast_config": cfgs["fast"].to_json(), "base": experts["paths"]["base"], "fast": experts["paths"]["fast"],
            "timed": args.timed_steps, "chunks": args.fast_chunks, "comm_iters": args.comm_iters,
            "timeout_s": args.collective_timeout, "workdir": str(Path(args.workdir))}
    if c.get("issue"):
        spec["issue"] = True
    if c.get("window"):
        spec.update(window=6 if args.tiny else c["window"], sink=1 if args.tiny else c["sink"])
        if args.tiny:  # 5 chunks of which 4 run: the window is full from chunk 3
            spec["chunks"] = min(spec["chunks"], 4)
    return spec


def project(one: float, two: float, comm_two: float, n: int) -> float:
    """Per-pass time on n GPUs from the pass on one (one), the pass under Ulysses 2 (two) and its all-to-all time
    (comm_two): P_n = one / n + D + comm_two * 4 (n - 1) / n^2, D = (two - comm_two) - one / 2."""
    dup = max(0.0, (two - comm_two) - one / 2)
    return one / n + dup + comm_two * 4 * (n - 1) / n**2


def summarize(res: dict) -> dict:
    c = res["cases"]
    s: dict = {"speedup": {}, "peak_vram_gb": {}}
    for two, one in PAIRS.items():
        a, b = c.get(one), c.get(two)
        if not (case_ok(a) and case_ok(b)):
            continue
        key = "s_per_step" if CASES[two]["kind"] == "base" else "s_per_chunk"
        if a.get(key) and b.get(key):
            s["speedup"][two] = round(a[key] / b[key], 3)
        if CASES[two]["kind"] == "fast" and a.get("sampling_s") and b.get("sampling_s"):
            s["speedup"][two + "_sampling"] = round(a["sampling_s"] / b["sampling_s"], 3)
    for name, r in c.items():
        if case_ok(r) and r.get("ranks"):
            s["peak_vram_gb"][name] = [round((x.get("peak_reserved") or 0) / 1e9, 2) for x in r["ranks"]]
    base1, cfg2, uly2 = c.get("base1"), c.get("base2_cfg"), c.get("base2_ulysses")
    if case_ok(base1) and case_ok(uly2) and uly2.get("comm_step_s") is not None:
        one, two, comm = base1["s_per_step"] / 2, uly2["s_per_step"] / 2, uly2["comm_step_s"] / 2
        gather = max(0.0, cfg2["s_per_step"] - one) if case_ok(cfg2) else 0.0
        proj = {"comm_share_ulysses2": round(uly2["comm_step_s"] / uly2["s_per_step"], 4),
                "unsplit_work_per_pass_s": round(max(0.0, (two - comm) - one / 2), 3)}
        for n in (4, 8):
            p_sp = project(one, two, comm, n)
            p_cfg = project(one, two, comm, n // 2) if n // 2 > 1 else one
            proj[f"{n}gpu_cfg_x_ulysses{n // 2}_s_per_step"] = round(p_cfg + gather, 3)
            proj[f"{n}gpu_cfg_x_ulysses{n // 2}_speedup"] = round(base1["s_per_step"] / (p_cfg + gather), 2)
            proj[f"{n}gpu_ulysses{n}_s_per_step"] = round(2 * p_sp, 3)
            proj[f"{n}gpu_ulysses{n}_speedup"] = round(base1["s_per_step"] / (2 * p_sp), 2)
        s["projection_base_480x832x81"] = proj
    f1, f2 = c.get("fast1_81"), c.get("fast2_81")
    if case_ok(f1) and case_ok(f2) and f2.get("comm_chunk_s") is not None:
        one, two, comm = f1["s_per_chunk"], f2["s_per_chunk"], f2["comm_chunk_s"]
        proj = {"comm_share_ulysses2": round(comm / two, 4), "unsplit_work_per_chunk_s": round(max(0.0, two - comm -
                                                                                                   one / 2), 3)}
        for n in (4, 8):
            p = project(one, two, comm, n)
            proj[f"{n}gpu_ulysses{n}_s_per_chunk"] = round(p, 3)
            proj[f"{n}gpu_ulysses{n}_speedup"] = round(one / p, 2)
        s["projection_fast_480x832x81"] = proj
    return s


def check_targets(res: dict) -> dict:
    out = {}
    for name, target in TARGETS.items():
        got = res.get("summary", {}).get("speedup", {}).get(name)
        out[name] = {"target": f">= {target}x per step", "measured": got,
                     "met": None if got is None else bool(got >= target)}
    return out


def print_report(res: dict) -> None:
    print("\ncase             layout                                                       result")
    for name, r in res["cases"].items():
        if not case_ok(r):
            print(f"{name:16s} {(r or {}).get('error', 'not run')[:150]}")
            continue
        what = (f"{r['s_per_step']} s/step" if "s_per_step" in r and CASES[name]["kind"] == "base" else
                f"{r.get('s_per_chunk')} s/chunk, sampling {r.get('sampling_s')} s"
                + (" (extrapolated)" if r.get("extrapolated") else ""))
        peaks = ", ".join(f"{(x.get('peak_reserved') or 0) / 1e9:.1f}" for x in r.get("ranks", []))
        print(f"{name:16s} {r.get('layout', '')[:60]:60s} {what}; peak reserved GB per rank: {peaks}")
    print("summary:", json.dumps(res.get("summary", {}), indent=1))
    print("targets:", json.dumps(res.get("targets", {})))


def run(args) -> dict:
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    base_cfg = bench_config(args.tiny)
    cfgs = {"base": base_cfg, "fast": DiTConfig(**{**base_cfg.__dict__, "causal": True})}
    workdir = Path(args.workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    loop = CaseLoop(args, "parallel", device, lambda res: res.update(summary=summarize(res),
                                                                      targets=check_targets(res)),
                    gpus=torch.cuda.device_count(),
                    notes=["compile off (eager), bf16 compute, SDPA's fastest exact kernel; full-size random NF4 "
                           "experts.",
                           "base: s/step = mean of the timed steps after one warm-up step (slowest rank); a step is "
                           "the conditional + the unconditional pass.",
                           "fast 957 frames: the first --fast-chunks chunks run, the rest extrapolated (see the case).",
                           "projection_*: 4/8 GPUs on paper from the measured communication share (see the "
                           "docstring)."])
    if device == "cuda" and torch.cuda.device_count() < max(CASES[c]["gpus"] for c in args.cases):
        print(f"[warning] {torch.cuda.device_count()} GPU(s) visible; the 2-GPU cases will fail", flush=True)
    paths = {"base": workdir / "high_noise_model_bnb_nf4", "fast": workdir / "lingbot_world_fast_bnb_nf4"}
    wanted = {n: paths[n] for n in paths if any(CASES[c]["kind"] == n for c in args.cases)}
    experts = random_experts(loop, paths, cfgs, device, wanted=wanted)

    def one_case(name: str, timeout: float) -> dict:
        r = run_case(case_spec(name, args, cfgs, experts, device), workdir, timeout)
        if name in PAIRS and "error" not in r:
            diff = output_difference(workdir, name, PAIRS[name])
            if diff is not None:
                r["rel_l2_vs_one_gpu"] = diff  # same seed and inputs: the bf16 rounding of the split
        return r

    try:
        return loop.run(one_case, workdir, written=paths.values(), time_box=args.case_s)
    finally:
        if not args.keep:  # the outputs the 2-GPU cases are compared with
            for f in workdir.glob("out_*.safetensors"):
                f.unlink(missing_ok=True)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_case_arguments(p, CASES, CASES, budget_s=540.0, min_case_s=30.0,
                       tiny_help="tiny config and videos on the CPU with gloo (smoke run)",
                       time_box=("--case-s", 150.0, "time box of one case (its processes are killed)"),
                       workdir="/tmp/lingbot_parallel_bench", workdir_help="where the experts are written (≈19 GB)",
                       keep_help="keep the experts for the next call")
    p.add_argument("--timed-steps", type=int, default=2, help="base: timed steps after one warm-up step")
    p.add_argument("--fast-chunks", type=int, default=10, help="957-frame cases: chunks run before extrapolating")
    p.add_argument("--comm-iters", type=int, default=5, help="repetitions of the timed exchanges")
    p.add_argument("--collective-timeout", type=float, default=300.0, help="--parallel-timeout of the children")
    args = p.parse_args(argv)
    if args.child:
        return child_main(args.child, CHILDREN, rank=int(os.environ.get("RANK", "0")))
    args.cases = parse_cases(p, args.cases, CASES)
    if args.tiny:
        args.timed_steps = 1
        args.comm_iters = 2
    res = run(args)
    print_report(res)
    if args.out:
        print(f"results: {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
