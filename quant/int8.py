"""INT8 (W8A8) GEMMs for the NF4 linears, for cards without FP8 (Ampere: int8 tensor cores run 4x bf16 on a
GeForce card): `torch._int_mm` with symmetric per-row scales on both sides.

Like fp8.py: the dequantized weight [N, K] is re-quantized to int8 with one scale per output channel each time a
phase needs it (transient), activations [M, K] get one dynamic scale per token, the int32 product is rescaled
by scale_x [M, 1] * scale_w [1, N] and the bias added in float32, stored once in the output dtype.
"""
from __future__ import annotations

from typing import Optional

import torch

from .shared_inputs import quantized

INT8_MAX = 127.0
_TINY = 1e-12


def quantize_rows(t: torch.Tensor, exact: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """t [R, K] -> (q [R, K] int8, scale [R, 1] float32), q = round(t / scale) in [-127, 127].

    exact: t / scale divided and rounded once (ties to even), for weights quantized once and stored
    (quant/lowp_linear.py); the per-token path multiplies by the reciprocal, which can land an ulp past a tie."""
    amax = torch.linalg.vector_norm(t, ord=float("inf"), dim=-1, keepdim=True, dtype=torch.float32)
    scale = amax.clamp_min(_TINY) / INT8_MAX
    if exact:
        return (t.float() / scale).round_().to(torch.int8), scale
    # |t / scale| <= 127 up to one rounding, and round() of 127.00001 is 127: no clamp needed.
    q = torch.mul(t, scale.reciprocal()).round_().to(torch.int8)
    return q, scale


def quantize_weight(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Dequantized weight [N, K] -> (q [N, K] int8, scale [1, N] float32)."""
    q, scale = quantize_rows(w)
    return q, scale.view(1, -1)


def rescale(acc: torch.Tensor, x_scale: torch.Tensor, w_scale: torch.Tensor, bias: Optional[torch.Tensor],
            out_dtype: torch.dtype) -> torch.Tensor:
    """int32 [M, N] accumulator -> acc * x_scale * w_scale + bias in float32, stored in out_dtype."""
    y = acc * x_scale  # int32 * float32 -> float32, one pass
    if torch.compiler.is_compiling():
        return (y * w_scale if bias is None else torch.addcmul(bias.float(), y, w_scale)).to(out_dtype)
    out = torch.empty(y.shape, dtype=out_dtype, device=y.device)
    if bias is None:
        return torch.mul(y, w_scale, out=out)
    return torch.addcmul(bias, y, w_scale, out=out)


def int_mm(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """a [M, K] int8 @ b [K, N] int8 -> int32 (cuBLASLt on CUDA: M > 16, K and N multiples of 8)."""
    return torch._int_mm(a, b)


def linear(x: torch.Tensor, w8: torch.Tensor, w_scale: torch.Tensor, bias: Optional[torch.Tensor],
           out_dtype: torch.dtype, quantize=quantize_rows, rescale_fn=rescale) -> torch.Tensor:
    """y = x @ w.T + bias with int8 operands; x [..., K], w8 [N, K] int8, w_scale [1, N]."""
    k = x.shape[-1]
    x8, x_scale = quantized(quantize, x.reshape(-1, k))  # shared by the linears reading x (shared_inputs.py)
    y = rescale_fn(int_mm(x8, w8.t()), x_scale, w_scale, bias, out_dtype)
    return y.view(*x.shape[:-1], w8.shape[0])
