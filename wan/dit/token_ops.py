"""The per-token elementwise phases of a DiT block, each written so that its result is stored once.

The reference's block (spec §2.4 step 6, precision map §2.6) spends about a third of a forward in elementwise
kernels: float32 modulation, casts, norms, RoPE and gated residuals, each materialising a full-width float32
temporary. Here every phase is one function over one chunk of tokens that keeps the reference's roundings
(float32 maths; bf16 only where the reference rounds to bf16) but writes each intermediate once:

- modulate: norm(x) * (1 + scale) + shift in float32, stored straight in the GEMM dtype (`addcmul` with a
  narrowing `out=`), instead of mul, add and cast temporaries;
- gated_residual / film: the float32 residual stream updated in place (`x.addcmul_(y, gate)`);
- qk_norm_rope: one-pass RMSNorm (float32 reduction over bf16 input) and a complex-multiply RoPE written
  straight into the q/k buffer;

The same functions are what `compile="blocks"` hands to torch.compile (`TokenOps(compile_fn)`), so the eager
and compiled paths share one implementation; linears (NF4 dequantize + GEMM) and attention stay outside,
eager, so quantized weights, block-swap hooks and attention backends are untouched by compilation.
"""
from __future__ import annotations

from typing import Callable, Optional

import torch
import torch.nn as nn
import torch.nn.functional as F

from .rope import apply_rope


def _no_grad_needed(*tensors: torch.Tensor) -> bool:
    # `out=` and in-place updates are refused by autograd; inference never needs it.
    return not (torch.is_grad_enabled() and any(t.requires_grad for t in tensors))


def mul_to(a: torch.Tensor, b: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """a * b computed in float32 (type promotion), stored once in `dtype`."""
    if not _no_grad_needed(a, b):
        return (a * b).to(dtype)
    return torch.mul(a, b, out=torch.empty(torch.broadcast_shapes(a.shape, b.shape), dtype=dtype, device=a.device))


def addcmul_to(base: torch.Tensor, a: torch.Tensor, b: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """base + a * b computed in float32 (type promotion), stored once in `dtype`."""
    shape = torch.broadcast_shapes(base.shape, a.shape, b.shape)
    if not _no_grad_needed(base, a, b):
        return torch.addcmul(base, a, b).to(dtype)
    return torch.addcmul(base, a, b, out=torch.empty(shape, dtype=dtype, device=a.device))


def modulate(norm: nn.Module, x: torch.Tensor, shift: torch.Tensor, scale1: torch.Tensor,
             dtype: torch.dtype) -> torch.Tensor:
    """norm(x) * (1 + scale) + shift in float32 (scale1 = 1 + scale), stored in `dtype` (spec §2.4)."""
    return addcmul_to(shift, norm(x), scale1, dtype)


def qk_norm_rope(t: torch.Tensor, norm: nn.Module, cos: torch.Tensor, sin: torch.Tensor,
                 out: torch.Tensor) -> torch.Tensor:
    """Self-attention q or k: full-width RMSNorm of the projection t [B, n, dim], RoPE, into out [B, n, H, hd]."""
    return apply_rope(norm(t).view(out.shape), cos, sin, out=out)


def norm_to(norm: nn.Module, x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """A norm whose output feeds a GEMM in `dtype` (cross-attention's norm3, its q RMSNorm)."""
    y = norm(x)
    return y if y.dtype == dtype else y.to(dtype)


def gated_residual(x: torch.Tensor, y: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
    """x += y * gate with x float32 (in place), y in the compute dtype, gate float32 [B, 1, dim]."""
    if not _no_grad_needed(x, y, gate):
        return x.copy_(x + y.float() * gate)
    return x.addcmul_(y, gate)


def film(x: torch.Tensor, scale1: torch.Tensor, shift: torch.Tensor) -> torch.Tensor:
    """Camera FiLM x = (1 + scale) * x + shift in place (spec §3), given scale1 = 1 + scale (rounded to scale's
    dtype like the reference's bf16 `1 + scale`: WanBlock.camera_film)."""
    if torch.compiler.is_compiling() or not _no_grad_needed(x, scale1, shift):
        return x.copy_(torch.addcmul(shift, x, scale1))  # compiled: one kernel writing x in place
    return torch.addcmul(shift, x, scale1, out=x)


def residual(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """x += y with x float32 (in place) and y in the compute dtype (the cross-attention's residual); compiled it
    is one vectorised kernel instead of eager's mixed-dtype add."""
    if not _no_grad_needed(x, y):
        return x.copy_(x + y.float())
    return x.add_(y)


def gelu_tanh(h: torch.Tensor) -> torch.Tensor:
    """The FFN's tanh GELU, in place on the first GEMM's output."""
    if not _no_grad_needed(h):
        return F.gelu(h, approximate="tanh")
    return torch.ops.aten.gelu_(h, approximate="tanh")


PHASES = ("modulate", "qk_norm_rope", "norm_to", "gated_residual", "residual", "film", "gelu_tanh")


class TokenOps:
    """The phase functions a block calls: the eager ones, or each passed through `wrap` (torch.compile).

    gelu_in_gemm: the FFN's tanh GELU goes into its first GEMM's epilogue where the linear offers one
    (NF4Linear.forward_gelu: cuBLASLt, bf16 GEMMs): one rounding of the GELU's output instead of two, so not the
    eager bits; the compiled phases, which give up those bits already, use it."""

    def __init__(self, wrap: Optional[Callable[[Callable], Callable]] = None, name: str = "eager",
                 gelu_in_gemm: bool = False):
        self.name = name
        self.gelu_in_gemm = gelu_in_gemm
        for phase in PHASES:
            fn = globals()[phase]
            setattr(self, phase, wrap(fn) if wrap is not None else fn)

    def __repr__(self) -> str:
        return f"TokenOps({self.name})"


EAGER = TokenOps()
