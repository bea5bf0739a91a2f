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
import sys
from pathlib import Path

import torch

from ..wan.dit.blocks import DEFAULT_TOKEN_CHUNK
from ..wan.dit.model import DiTConfig
from .common import CaseLoop, add_case_arguments, child_main, parse_cases, run_case_child, tiny_children
from .expert_files import expert_paths, random_experts
from .pipeline_cases import V480
from .pipeline_setup import bench_config
from .speed_cases import CASES, DEFAULT_CASES, FORWARD, REFERENCE, SMALL_VIDEO, TINY_SMALL_VIDEO, TINY_VIDEO
from .speed_child import CHILDREN
from .speed_report import check_targets, errors_vs_reference, print_report, summarize

MODULE = __spec__.name if __spec__ is not None else __name__  # the name this file runs under (`-m`)


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
