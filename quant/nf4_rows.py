"""NF4 weight -> FP8 / INT8 rows in one Triton kernel (CUDA; Triton imported lazily).

The FP8 and INT8 compute modes prepare each NF4 weight per forward in two passes: bitsandbytes dequantizes it
to bf16 (reading the 4-bit codes, writing 2 bytes per weight), then the row quantizer reads those bf16 values
and writes the 1-byte codes and a scale per output channel. Here one program per output channel does both:
4-bit codes in, 1-byte codes out, about a third of the memory traffic and one launch instead of three (bnb's
nested-scale and 4-bit kernels, the quantizer). The maths is the two passes' to the bit:

    absmax = nested_code[absmax8] * nested_absmax + offset   (float32, each op rounded once, as bnb)
    w      = dtype(code[nibble] * absmax)                     (bnb's dequantized weight in bf16 / fp16)
    scale  = max(amax(w), 1e-12) / QMAX, q = w * (1 / scale)  (rowwise_triton.quantize_rows)

The tests write the recipe again in torch ops (tests/nf4_recipe.py): the CPU tests check it against bitsandbytes,
the GPU tests check the kernel against it and against `two_passes`. Where Triton, a CUDA weight or bnb's standard
NF4 layout is missing, the callers keep the two passes.
"""
from __future__ import annotations

import os
from typing import Callable, Optional

import torch

from . import fp8, int8, rowwise_triton
from .lazy_triton import TritonKernel

_QMAX = {"fp8": 448.0, "int8": 127.0}
_OUT = {"fp8": torch.float8_e4m3fn, "int8": torch.int8}
_TINY = 1e-12
MAX_COLUMNS = rowwise_triton.MAX_COLUMNS


def _load():
    from .nf4_rows_kernel import nf4_rows_kernel

    return nf4_rows_kernel


KERNEL = TritonKernel(_load, "Triton NF4 row quantizer")


def enabled() -> bool:
    """LINGBOT_NF4_ROWS=0 (or LINGBOT_TRITON_QUANT=0) turns the kernel off: bnb's dequantize + the row quantizer."""
    return (os.environ.get("LINGBOT_NF4_ROWS", "1") != "0" and rowwise_triton.enabled()
            and KERNEL.failed is None)


def unavailable_reason(device: Optional[torch.device] = None) -> Optional[str]:
    """Why the kernel will not run (for the speed plan's notes), or None."""
    if os.environ.get("LINGBOT_NF4_ROWS", "1") == "0":
        return "LINGBOT_NF4_ROWS=0"
    if KERNEL.failed is not None:
        return f"the kernel failed here ({KERNEL.failed})"
    return rowwise_triton.unavailable_reason(device)


def _offset(state) -> float:
    """The nested scales' offset as a Python float, read once per weight (it may be a 0-d CUDA tensor)."""
    cached = getattr(state, "_lingbot_offset", None)
    if cached is None:
        cached = float(state.offset)
        state._lingbot_offset = cached
    return cached


def usable(packed: torch.Tensor, state, dtype: torch.dtype) -> bool:
    """Can the kernel prepare this weight: bnb NF4 on a CUDA device, rows that fit one program, whole blocks?"""
    if not (enabled() and packed.is_cuda and packed.dtype == torch.uint8 and dtype in (torch.bfloat16, torch.float16)
            and getattr(state, "quant_type", None) == "nf4" and len(getattr(state, "shape", ())) == 2):
        return False
    rows, cols = state.shape
    if not (rows > 0 and cols > 0 and cols % state.blocksize == 0 and packed.is_contiguous()
            and (1 << (cols // state.blocksize - 1).bit_length()) * state.blocksize <= MAX_COLUMNS  # in registers
            and packed.numel() * 2 == rows * cols and state.code.numel() == 16):
        return False
    tables = [state.absmax, state.code]  # every piece on the weight's device: nothing copied per call
    if state.nested:
        inner = state.state2
        if state.absmax.dtype != torch.uint8 or inner.code.numel() != 256 or inner.absmax.dtype != torch.float32:
            return False
        tables += [inner.absmax, inner.code]
    elif state.absmax.dtype != torch.float32:
        return False
    return all(t.device == packed.device for t in tables) and KERNEL.get() is not None


def prepare(packed: torch.Tensor, state, dtype: torch.dtype, kind: str) -> tuple[torch.Tensor, torch.Tensor]:
    """The NF4 weight (bnb's packed codes and QuantState) -> (q [N, K] e4m3 / int8, scale [1, N] float32), what
    dequantize_4bit(..., dtype) followed by rowwise quantize_weight gives (see usable)."""
    found = KERNEL.get()
    if found is None:
        raise RuntimeError("Triton is not installed")
    triton, kernel = found
    rows, cols = state.shape
    q = torch.empty((rows, cols), dtype=_OUT[kind], device=packed.device)
    scale = torch.empty((1, rows), dtype=torch.float32, device=packed.device)
    blocks = cols // int(state.blocksize)
    padded = triton.next_power_of_2(blocks)
    warps = max(1, min(16, padded * int(state.blocksize) // 512))
    code = state.code.float()
    if state.nested:
        inner = state.state2
        absmax, nested_absmax, nested_code = state.absmax, inner.absmax, inner.code.float()
        offset, nested_block = _offset(state), int(inner.blocksize)
    else:
        absmax, nested_absmax, nested_code, offset, nested_block = state.absmax, state.absmax, code, 0.0, 1
    kernel[(rows,)](packed, absmax, code, nested_absmax, nested_code, q, scale, blocks, offset,
                    1.0 / _QMAX[kind], _TINY, BLOCKS=padded, BLOCKSIZE=int(state.blocksize),
                    NESTED_BLOCKSIZE=nested_block, NESTED=bool(state.nested), FP16=dtype == torch.float16,
                    ROUND_INT=kind == "int8", num_warps=warps)
    return q, scale


class NF4RowsMismatch(RuntimeError):
    """The kernel's codes differ from the two passes' on this GPU (then the two passes serve)."""


_checked: set = set()  # (kind, dtype) pairs whose first result was compared with the two passes on this GPU


def two_passes(packed: torch.Tensor, state, dtype: torch.dtype, kind: str) -> tuple[torch.Tensor, torch.Tensor]:
    """What the kernel replaces: bnb's dequantize into `dtype`, then the row quantizer (Triton where it runs)."""
    from .nf4 import dequantize_nf4  # bitsandbytes: imported when the kernel first runs, not with the speed plan

    fallback = fp8.quantize_weight if kind == "fp8" else int8.quantize_weight
    return rowwise_triton.preferring_kernel_weight(kind, fallback)(dequantize_nf4(packed, state, dtype))


def preferring_kernel(kind: str) -> Callable:
    """prepare(packed, state, dtype) for `kind` where the kernel runs, None where it cannot (the caller then
    dequantizes and quantizes in two passes). Its first result per dtype in the process is compared with the two
    passes' (one weight, once: the kernel was checked on Hopper only, and a GPU or Triton build that rounds
    otherwise must not change the video); a kernel that fails to build or to match is not tried again."""

    def nf4_rows(packed: torch.Tensor, state, dtype: torch.dtype) -> Optional[tuple[torch.Tensor, torch.Tensor]]:
        if not usable(packed, state, dtype):
            return None
        try:
            got = prepare(packed, state, dtype, kind)
            if (kind, dtype) not in _checked:
                want = two_passes(packed, state, dtype, kind)
                if not (torch.equal(got[1], want[1]) and torch.equal(got[0].view(torch.uint8), want[0].view(torch.uint8))):
                    raise NF4RowsMismatch(f"its {kind} codes differ from bitsandbytes' dequantize + the row quantizer "
                                          f"on this GPU ({tuple(state.shape)} weight)")
                _checked.add((kind, dtype))
            return got
        except Exception as e:  # noqa: BLE001 - a Triton that cannot build the kernel: the two passes serve
            KERNEL.give_up(e)
            return None

    nf4_rows.__name__ = nf4_rows.__qualname__ = f"nf4_rows_{kind}"
    return nf4_rows
