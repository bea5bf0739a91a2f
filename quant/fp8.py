"""FP8 (e4m3) GEMMs for the NF4 linears: `torch._scaled_mm` with per-row scales on both sides.

Per forward (and once for all token chunks of a block phase, see `NF4Linear.hold_weight`) the dequantized
weight [N, K] is re-quantized to e4m3 with one scale per output channel; the FP8 copy is transient, so no VRAM
is added between phases. Activations [M, K] get one dynamic scale per token. `_scaled_mm` multiplies the two
FP8 operands on the tensor cores (sm89+), applies scale_a [M, 1] x scale_b [1, N] and the bias, and writes
bf16. On a CPU (tests) or where `_scaled_mm` is missing, `emulated_scaled_mm` computes the same product from
the FP8 values in float32.
"""
from __future__ import annotations

from typing import Optional

import torch

from .shared_inputs import quantized

E4M3 = torch.float8_e4m3fn
E4M3_MAX = float(torch.finfo(E4M3).max)  # 448
_TINY = 1e-12  # an all-zero row keeps a finite scale


def quantize_rows(t: torch.Tensor, exact: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """t [R, K] -> (t8 [R, K] e4m3, scale [R, 1] float32) with t ~= t8 * scale (one amax per row).

    exact: t8 = t / scale rounded once (ties to even), for weights quantized once and stored (quant/lowp_linear.py).
    The per-forward path multiplies by the reciprocal (one fused pass), which can land a float32 ulp past an e4m3
    tie: bf16 weights hit those ties exactly (~0.04 % of them), and a stored weight should not depend on that."""
    amax = torch.linalg.vector_norm(t, ord=float("inf"), dim=-1, keepdim=True, dtype=torch.float32)
    scale = amax.clamp_min(_TINY) / E4M3_MAX
    if exact:
        return (t.float() / scale).to(E4M3), scale
    # |t / scale| <= 448 up to one rounding, which e4m3's round-to-nearest keeps at 448 (NaN starts at 464).
    return mul_to(t, scale.reciprocal(), E4M3), scale


_narrowing_out_ok = True


def mul_to(a: torch.Tensor, b: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """a * b in float32, stored once in a low-precision `dtype` (eager: a narrowing `out=`; compiled: fused)."""
    global _narrowing_out_ok
    if torch.compiler.is_compiling():
        return (a.float() * b).to(dtype)
    if _narrowing_out_ok:
        try:
            return torch.mul(a, b, out=torch.empty(a.shape, dtype=dtype, device=a.device))
        except (RuntimeError, TypeError):  # a build whose kernels cannot store this dtype: keep going, slower
            _narrowing_out_ok = False
    return (a.float() * b).to(dtype)


def quantize_weight(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Dequantized weight [N, K] -> (w8 [N, K] e4m3, scale [1, N] float32), the layout `_scaled_mm` takes."""
    w8, scale = quantize_rows(w)
    return w8, scale.view(1, -1)


def emulated_scaled_mm(a8: torch.Tensor, b8: torch.Tensor, scale_a: torch.Tensor, scale_b: torch.Tensor,
                       bias: Optional[torch.Tensor], out_dtype: torch.dtype) -> torch.Tensor:
    """What `_scaled_mm` computes, in float32 from the FP8 values: (a8 @ b8) * scale_a * scale_b + bias."""
    out = (a8.float() @ b8.float()) * scale_a * scale_b
    if bias is not None:
        out = out + bias.float()
    return out.to(out_dtype)


def scaled_mm(a8: torch.Tensor, b8: torch.Tensor, scale_a: torch.Tensor, scale_b: torch.Tensor,
              bias: Optional[torch.Tensor], out_dtype: torch.dtype, fast_accum: bool = True) -> torch.Tensor:
    """a8 [M, K] row-major, b8 [K, N] column-major (a transposed [N, K] weight), rowwise scales -> out_dtype."""
    if a8.is_cuda:
        return torch._scaled_mm(a8, b8, scale_a=scale_a, scale_b=scale_b, bias=bias, out_dtype=out_dtype,
                                use_fast_accum=fast_accum)
    return emulated_scaled_mm(a8, b8, scale_a, scale_b, bias, out_dtype)


def linear(x: torch.Tensor, w8: torch.Tensor, w_scale: torch.Tensor, bias: Optional[torch.Tensor],
           out_dtype: torch.dtype, quantize=quantize_rows, fast_accum: bool = True) -> torch.Tensor:
    """y = x @ w.T + bias with FP8 operands; x [..., K] in bf16/fp16, w8 [N, K], w_scale [1, N].

    `quantize` is `quantize_rows` or its compiled twin (compile option)."""
    k = x.shape[-1]
    x8, x_scale = quantized(quantize, x.reshape(-1, k))  # shared by the linears reading x (shared_inputs.py)
    if bias is not None and bias.dtype != out_dtype:
        bias = bias.to(out_dtype)  # _scaled_mm takes a bias of the output dtype only
    y = scaled_mm(x8, w8.t(), x_scale, w_scale, bias, out_dtype, fast_accum)
    return y.view(*x.shape[:-1], w8.shape[0])
