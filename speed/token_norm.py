"""A block's LayerNorms in one kernel each (CUDA, Triton imported lazily), for the compiled per-token phases.

The modulate phase (norm(x) * (1 + scale) + shift, stored in the GEMM dtype) and the cross-attention's affine
norm3 read a float32 row of the residual stream and write one row in the GEMM dtype. Inductor compiles a norm
over a row wider than 1024 (the 1.3B's 1536, the 14B's 5120) as a looped reduction: one kernel for the
statistics and one that reads the row again to apply them (0.015-0.031 s of a rolled v2 1.3B `auto` chunk in
H200 profiles). Here one program holds a row in registers, so the row is read once and written once. The sums run
in float32 in another order than eager's, as the compiled phases' already do: only `with_fused_norms` (the
compiled phases) uses it, never the eager ones that keep the reference's bits. It needs row-major rows (the
residual stream is, since WanDiT copies the patch conv's output to rows); elsewhere the phases it wraps serve.
Off by default (LINGBOT_TOKEN_NORM=1 turns it on, speed/options.compiled_token_ops): checked against LayerNorm on
the GPU and in Triton's interpreter, not yet timed inside the model.

    ops = with_fused_norms(compiled_ops)   # ops.modulate / ops.norm_to: the kernel where it runs, else theirs
"""
from __future__ import annotations

from typing import Optional

import torch
import torch.nn as nn

from ..quant.lazy_triton import TritonKernel

MAX_WIDTH = 8192  # one program holds a row in registers
_HALF = (torch.float16, torch.bfloat16)


def _load():
    from .token_norm_kernel import layer_norm_rows_kernel

    return layer_norm_rows_kernel


KERNEL = TritonKernel(_load, "fused LayerNorm kernel")


def _plain_layer_norm(norm: nn.Module, width: int) -> bool:
    """A LayerNorm over the last dim only, with both affine tensors or neither (WanLayerNorm's forms)."""
    return (isinstance(norm, nn.LayerNorm) and tuple(norm.normalized_shape) == (width,)
            and (norm.weight is None) == (norm.bias is None))


def _row_vector(v: torch.Tensor, batch: int, width: int) -> Optional[int]:
    """The batch stride of a [B or 1, 1, width] vector with unit last stride, or None if it is not one."""
    if v.dim() != 3 or v.shape[1] != 1 or v.shape[2] != width or v.shape[0] not in (1, batch) or v.stride(2) != 1:
        return None
    return 0 if v.shape[0] == 1 else v.stride(0)


def usable(norm: nn.Module, x: torch.Tensor) -> bool:
    return (KERNEL.failed is None and x.is_cuda and x.dim() == 3 and x.stride(2) == 1
            and 0 < x.shape[2] <= MAX_WIDTH and x.dtype in (torch.float32, *_HALF)
            and _plain_layer_norm(norm, x.shape[2]) and not torch.compiler.is_compiling()
            and not (torch.is_grad_enabled() and x.requires_grad)  # no backward for the kernel
            and KERNEL.get() is not None)


def layer_norm_rows(norm: nn.Module, x: torch.Tensor, dtype: torch.dtype, shift: Optional[torch.Tensor] = None,
                    scale1: Optional[torch.Tensor] = None) -> Optional[torch.Tensor]:
    """norm(x) [then shift + that * scale1], [B, n, width] in `dtype`; None where the kernel cannot serve."""
    if not usable(norm, x):
        return None
    b, n, width = x.shape
    if shift is not None and (_row_vector(shift, b, width) is None or _row_vector(scale1, b, width) is None
                              or shift.dtype != torch.float32 or scale1.dtype != torch.float32):
        return None
    out = torch.empty(b, n, width, dtype=dtype, device=x.device)
    try:
        launch(norm, x, out, shift, scale1)
    except Exception as e:  # noqa: BLE001 - a Triton that cannot build the kernel: the compiled phases, for good
        KERNEL.give_up(e)
        return None
    return out


def launch(norm: nn.Module, x: torch.Tensor, out: torch.Tensor, shift: Optional[torch.Tensor] = None,
           scale1: Optional[torch.Tensor] = None) -> None:
    """The kernel over x's rows into out (checked by the caller; the CPU tests run it in Triton's interpreter)."""
    b, n, width = x.shape
    if out.numel() == 0:
        return
    triton, kernel = KERNEL.get()
    block = triton.next_power_of_2(width)
    affine = norm.weight is not None
    modulate = shift is not None
    kernel[(b * n,)](x, out, norm.weight if affine else x, norm.bias if affine else x,
                     shift if modulate else x, scale1 if modulate else x, n, width,
                     x.stride(0), x.stride(1), _row_vector(shift, b, width) if modulate else 0,
                     _row_vector(scale1, b, width) if modulate else 0, float(norm.eps),
                     AFFINE=affine, ROUND_NORM=x.dtype in _HALF, MODULATE=modulate, BLOCK=block,
                     num_warps=4 if block <= 2048 else 8)


def with_fused_norms(ops):
    """`ops` (compiled TokenOps) with modulate and norm_to running the kernel where it serves, theirs elsewhere."""
    modulate, norm_to = ops.modulate, ops.norm_to

    def fused_modulate(norm: nn.Module, x: torch.Tensor, shift: torch.Tensor, scale1: torch.Tensor,
                       dtype: torch.dtype) -> torch.Tensor:
        y = layer_norm_rows(norm, x, dtype, shift, scale1)
        return y if y is not None else modulate(norm, x, shift, scale1, dtype)

    def fused_norm_to(norm: nn.Module, x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        y = layer_norm_rows(norm, x, dtype)
        return y if y is not None else norm_to(norm, x, dtype)

    ops.modulate, ops.norm_to = fused_modulate, fused_norm_to
    return ops
