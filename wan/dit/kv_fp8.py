"""The Fast model's K/V cache in FP8 (the `kv_fp8` lever of the `fast` and `draft` presets): e4m3 codes with one
power-of-two scale per token and head.

A streamed cache layer moves from pinned RAM to the GPU at every model call; in FP8 it moves half the bytes (128
one-byte codes and one exponent byte per token and head instead of 256 bytes). Why power-of-two scales: a code
times 2^e is exactly a bf16 value, so `round_fp8(x) = decode(encode(x))` is what every layer holds, on the GPU in
bf16 or in RAM as codes, and encoding a rounded value again gives it back bit for bit. The video therefore does not
depend on which layers the memory plan keeps on the GPU (a played video equals the batch run of the same keys).

The scale of a row (the head_dim values of one token and head) is the smallest 2^e with max|x| <= 448 * 2^e, found
with frexp (exact, no logarithm), within 2^(+-120) (a zero row takes 2^-120). Relative error of a value: at most
2^-4 of its row's largest (e4m3 keeps 3 mantissa bits; subnormal codes below 2^-6 * 2^e). These torch ops are the
definition; speed/kv_fp8_fused.py runs the same arithmetic in one Triton kernel per call on a GPU.
"""
from __future__ import annotations

from typing import Optional

import torch

CODE = torch.float8_e4m3fn
E4M3_MAX = 448.0  # = 0.875 * 2^9
EXP_LIMIT = 120  # exponents are kept in int8 and 2^(+-120) is a normal float32


def exponents(x: torch.Tensor) -> torch.Tensor:
    """int8 [..., 1]: per row of the last dim, the smallest e with max|x| <= 448 * 2^e (clamped to +-120)."""
    amax = x.abs().amax(dim=-1, keepdim=True).float()
    mant, p = torch.frexp(amax)  # amax = mant * 2^p, mant in [0.5, 1) (0 for a zero row)
    e = torch.where(mant <= 0.875, p - 9, p - 8)
    e = torch.where(amax > 0, e, -EXP_LIMIT)  # a zero row: the lowest exponent (any would decode to zeros)
    return e.clamp_(-EXP_LIMIT, EXP_LIMIT).to(torch.int8)


def _pow2(e: torch.Tensor) -> torch.Tensor:
    return torch.ldexp(torch.ones_like(e, dtype=torch.float32), e.to(torch.int32))


def encode(x: torch.Tensor, codes: Optional[torch.Tensor] = None,
           exps: Optional[torch.Tensor] = None) -> tuple[torch.Tensor, torch.Tensor]:
    """x [..., D] -> (e4m3 codes [..., D], int8 exponents [..., 1]), into `codes` / `exps` when given."""
    e = exponents(x)
    scaled = x.float() * _pow2(-e.to(torch.int32))  # exact: a power of two, within float32's normal range
    if codes is None:
        codes = scaled.to(CODE)
    else:
        codes.copy_(scaled)
    if exps is None:
        return codes, e
    exps.copy_(e)
    return codes, exps


def decode(codes: torch.Tensor, exps: torch.Tensor, out: Optional[torch.Tensor] = None,
           dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
    """codes * 2^exps as `dtype` (exact in bf16 and float32), into `out` when given."""
    x = codes.float() * _pow2(exps)
    if out is None:
        return x.to(dtype)
    return out.copy_(x)


def pair_bytes(batch: int, tokens: int, heads: int, head_dim: int) -> int:
    """Bytes of one layer's K and V in FP8: a code per value and an exponent per token and head, each."""
    return 2 * batch * tokens * heads * (head_dim + 1)


def round_fp8(x: torch.Tensor) -> torch.Tensor:
    """x rounded to what the FP8 cache holds (decode(encode(x)), in x's dtype)."""
    codes, e = encode(x)
    return decode(codes, e, dtype=x.dtype)
