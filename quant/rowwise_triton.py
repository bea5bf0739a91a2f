"""Per-row FP8 / INT8 quantization of activations and weights in one Triton kernel (CUDA; Triton imported lazily).

`fp8.quantize_rows` / `int8.quantize_rows` read each row twice and the scale once more as torch ops (eager: five
kernels; compiled: one looped reduction kernel that measured 0.21 s of a 2.4 s FP8 forward on an H100, about a
third of the memory bandwidth). Here one program holds a whole row in registers (K <= 16,384: every linear input
of the DiT), so each element is read once and written once. Same maths as the torch versions:
scale = max(amax, 1e-12) / QMAX in float32, q = x * (1 / scale) rounded to the target type (FP8: round to nearest
even, |q| <= 448 by construction; INT8: round half to even, as torch.round), bit for bit on the GPU
(tests/test_speed_cuda.py). Where Triton, a CUDA tensor or a fitting layout is missing the callers keep the torch
versions. (Triton's CPU interpreter cannot check it: it lacks libdevice and mis-converts to FP8.)
"""
from __future__ import annotations

import os
from typing import Callable, Optional

import torch

from .lazy_triton import TritonKernel

MAX_COLUMNS = 16384  # one row per program, held in registers
_DTYPES = (torch.bfloat16, torch.float16, torch.float32)
_TINY = 1e-12
_QMAX = {"fp8": 448.0, "int8": 127.0}
_OUT = {"fp8": torch.float8_e4m3fn, "int8": torch.int8}


def _load():
    from .rowwise_kernel import quantize_rows_kernel

    return quantize_rows_kernel


KERNEL = TritonKernel(_load, "Triton row quantizer")
_kernel = KERNEL.get


def enabled() -> bool:
    """LINGBOT_TRITON_QUANT=0 turns the kernel off (the torch quantizers run)."""
    return os.environ.get("LINGBOT_TRITON_QUANT", "1") != "0" and KERNEL.failed is None


def usable(t: torch.Tensor) -> bool:
    """Can the kernel quantize t as it is (a CUDA matrix with contiguous rows of a float dtype)?"""
    return (enabled() and t.is_cuda and t.dim() == 2 and t.dtype in _DTYPES and t.shape[0] > 0
            and 0 < t.shape[1] <= MAX_COLUMNS and t.stride(1) == 1 and _kernel() is not None)


def quantize_rows(t: torch.Tensor, kind: str) -> tuple[torch.Tensor, torch.Tensor]:
    """t [R, K] (see usable) -> (q [R, K] e4m3 or int8, scale [R, 1] float32), t ~= q * scale."""
    found = _kernel()
    if found is None:
        raise RuntimeError("Triton is not installed")
    triton, kernel = found
    rows, cols = t.shape
    q = torch.empty((rows, cols), dtype=_OUT[kind], device=t.device)
    scale = torch.empty((rows, 1), dtype=torch.float32, device=t.device)
    block = triton.next_power_of_2(cols)
    warps = max(1, min(16, block // 512))  # 16 elements per thread for wide rows, fewer warps for narrow ones
    kernel[(rows,)](t, q, scale, cols, t.stride(0), q.stride(0), 1.0 / _QMAX[kind], _TINY,
                    BLOCK=block, ROUND_INT=kind == "int8", num_warps=warps)
    return q, scale


def _kernel_or_none(t: torch.Tensor, kind: str) -> Optional[tuple[torch.Tensor, torch.Tensor]]:
    """quantize_rows(t, kind) where the kernel can run; None where it cannot (or fails to build: then never again)."""
    if not usable(t):
        return None
    try:
        return quantize_rows(t, kind)
    except Exception as e:  # noqa: BLE001 - a Triton that cannot build the kernel: the torch path serves
        KERNEL.give_up(e)
        return None


def preferring_kernel(kind: str, fallback: Callable) -> Callable:
    """A quantizer that runs the Triton kernel where it can and `fallback` (torch, eager or compiled) elsewhere."""

    def quantize(t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        got = _kernel_or_none(t, kind)
        return got if got is not None else fallback(t)

    quantize.__name__ = quantize.__qualname__ = f"quantize_rows_{kind}"
    return quantize


def preferring_kernel_weight(kind: str, fallback: Callable) -> Callable:
    """The weight form: (q [N, K], scale [1, N]), the layout `_scaled_mm` / `_int_mm` take."""

    def quantize(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        got = _kernel_or_none(w, kind)
        return (got[0], got[1].view(1, -1)) if got is not None else fallback(w)

    quantize.__name__ = quantize.__qualname__ = f"quantize_weight_{kind}"
    return quantize



def unavailable_reason(device: Optional[torch.device] = None) -> Optional[str]:
    """Why the kernel will not run (for the speed plan's notes), or None."""
    if KERNEL.failed is not None:
        return f"the kernel failed here ({KERNEL.failed})"
    if not enabled():
        return "LINGBOT_TRITON_QUANT=0"
    if device is not None and torch.device(device).type != "cuda":
        return "not a CUDA device"
    if _kernel() is None:
        return "Triton is not installed"
    return None
