"""cudnn-frontend attention on the shapes the models run: FP8 (`--attention fp8`) and bf16 with cuDNN's fastest
plan (`--attention cudnn`) against torch SDPA's cuDNN kernel, for the base model's self-attention (31,668 tokens at
464x832x81) and the Fast model's chunk (4,524 queries) over a short and a full cache. Per shape: ms of the whole
FP8 call (quantizing q/k/v, the kernel, the bf16 output) and of its kernel alone, ms of both bf16 kernels, TFLOP/s,
the plans cuDNN offered with the tuning's ms of each, and the relative error of each against float32 attention on
the first 1,024 queries of 4 heads, for random inputs and for peaked ones (q, k x 2.5, as after RMSNorm gains > 1).
GPU only (Hopper+, cudnn-frontend).

    python -m lingbot_world.bench.bench_attention_fp8 --out bench/results/attention_fp8_h100.json   # ~20 s
"""
from __future__ import annotations

import argparse
import sys
import time

import torch
import torch.nn.functional as F

from .common import cuda_ms

SHAPES = [  # (queries, keys, spread of q/k)
    (31668, 31668, 1.0), (31668, 31668, 2.5), (4524, 31668, 2.5), (4524, 9048, 2.5),
    # a rolled 480x832 chunk: draft's 15-frame window, fast's 21 (issue 26's conditions)
    (4680, 23400, 2.5), (4680, 32760, 2.5)]
HEADS, HEAD_DIM = 40, 128


def fp8_kernel_only(kernel, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor):
    """A call of cuDNN's FP8 attention kernel alone on these inputs, quantized once here (outside any timing)."""
    from ..wan.dit import attention_fp8

    graph, handle = kernel.graph_for(q, k)
    (q8, dq), (k8, dk), (v8, dv) = (attention_fp8.quantize(t) for t in (q, k, v))
    o8 = torch.empty(q.shape, device=q.device, dtype=torch.float8_e4m3fn)
    pack = kernel.pack(q8, k8, v8, o8, dq, dk, dv, attention_fp8.OUTPUT_SCALE / (dv * attention_fp8.E4M3_MAX))
    return lambda: graph.execute(pack, handle)


def measure(lq: int, lk: int, spread: float) -> dict:
    from ..wan.dit import attention as attn
    from ..wan.dit import attention_fp8
    from ..wan.dit.attention_cudnn import CudnnAttention

    g = torch.Generator(device="cuda").manual_seed(0)
    q = torch.randn(1, lq, HEADS, HEAD_DIM, device="cuda", generator=g, dtype=torch.bfloat16) * spread
    k = torch.randn(1, lk, HEADS, HEAD_DIM, device="cuda", generator=g, dtype=torch.bfloat16) * spread
    v = torch.randn(1, lk, HEADS, HEAD_DIM, device="cuda", generator=g, dtype=torch.bfloat16)
    kernel = attention_fp8.FP8Attention()
    t0 = time.perf_counter()
    kernel(q, k, v)
    first_call_s = time.perf_counter() - t0
    ref = F.scaled_dot_product_attention(*(t[:, :, :4].transpose(1, 2).float() for t in (q[:, :1024], k, v)))
    ref = ref.transpose(1, 2)
    cudnn_order = ("cudnn",)
    out = {"queries": lq, "keys": lk, "spread": spread, "first_call_s": round(first_call_s, 3)}
    exact = CudnnAttention()
    flops = 4 * HEADS * lq * lk * HEAD_DIM
    fused = attention_fp8.FP8Attention(torch.compile(attention_fp8.cast), torch.compile(attention_fp8.dequantize))
    runs = {"fp8": lambda: kernel(q, k, v),
            # as the `compile` option runs it (speed/options.apply_speed): the cast and the output's dequantize
            # compiled, the same arithmetic
            "fp8_compiled_cast": lambda: fused(q, k, v),
            "fp8_kernel_only": fp8_kernel_only(kernel, q, k, v),
            "bf16_sdpa_cudnn": lambda: attn.sdpa(q, k, v, cudnn_order),
            "bf16_cudnn_frontend_tuned": lambda: exact(q, k, v)}
    for name, fn in runs.items():
        ms = cuda_ms(fn)
        out[name] = {"ms": round(ms, 3), "tflops": round(flops / ms / 1e9, 1)}
    out["fp8"]["rel_error_vs_fp32"] = attn.relative_error(kernel(q, k, v)[:, :1024, :4], ref)
    out["bf16_sdpa_cudnn"]["rel_error_vs_fp32"] = attn.relative_error(
        attn.sdpa(q, k, v, cudnn_order)[:, :1024, :4], ref)
    out["bf16_cudnn_frontend_tuned"]["rel_error_vs_fp32"] = attn.relative_error(exact(q, k, v)[:, :1024, :4], ref)
    out["plans"] = {"fp8": kernel.graphs.plan_report(), "bf16": exact.graphs.plan_report()}
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default=None, help="results JSON")
    args = p.parse_args(argv)
    from ..wan.dit import attention_fp8

    reason = attention_fp8.unavailable_reason(torch.device("cuda"))
    if reason:
        print(f"bench_attention_fp8: {reason}", file=sys.stderr)
        return 2
    import cudnn

    results = {"bench": "attention_fp8", "device": torch.cuda.get_device_name(), "torch": torch.__version__,
               "cudnn_backend": cudnn.backend_version(), "cudnn_frontend": getattr(cudnn, "__version__", "?"),
               "shapes": [measure(*shape) for shape in SHAPES]}
    for r in results["shapes"]:
        print(f"{r['queries']:>6} x {r['keys']:>6} (spread {r['spread']}): fp8 {r['fp8']['ms']} ms "
              f"(compiled cast {r['fp8_compiled_cast']['ms']} ms, kernel {r['fp8_kernel_only']['ms']} ms, "
              f"{r['fp8_kernel_only']['tflops']} TFLOP/s), bf16 cuDNN "
              f"{r['bf16_sdpa_cudnn']['ms']} ms, bf16 frontend tuned {r['bf16_cudnn_frontend_tuned']['ms']} ms; "
              f"error {r['fp8']['rel_error_vs_fp32']:.3g} "
              f"(bf16 {r['bf16_sdpa_cudnn']['rel_error_vs_fp32']:.2g})")
    if args.out:
        from .common import write_json

        write_json(args.out, results)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
