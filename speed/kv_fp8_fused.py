"""The FP8 K/V cache's rounding, encoding and decoding in one Triton kernel each (CUDA, Triton imported lazily).

As torch ops (wan/dit/kv_fp8.py) each is about a dozen passes over float32 temporaries: measured on an H100 they
made a rolled `draft` chunk 0.19 s slower (24 GB cap; bench/results/fast_rolling_kvfp8_h100.json), more than the
link time the FP8 cache saves there. A kernel reads each value once and writes it once. The arithmetic is the
same and exact but for the one rounding to e4m3 (to nearest, ties to even, in both), so the bits equal the torch
ops' (tests/test_kv_fp8.py, on the GPU). Like vae_norm.py, a property of the device: every FP8 cache on a CUDA
GPU with Triton uses it. Ada / Hopper convert to e4m3 in hardware; an Ampere card (RTX 30xx) has no FP8 conversion,
so there the kernels build the same code bits from integer ops (FUSED_BITS).

    ops = kv_fp8_ops(device)   # Fp8Ops: round(x), encode(x, codes, exps), decode(codes, exps, out)
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from typing import Callable, Optional

import torch

from ..quant.lazy_triton import TritonKernel
from ..wan.dit import kv_fp8

MAX_ROW = 256  # one program holds BLOCK_R rows of up to this many values in registers
_BLOCK_VALUES = 4096


def _load():
    from . import kv_fp8_kernel

    return kv_fp8_kernel


KERNELS = TritonKernel(_load, "FP8 K/V cache kernels")


@dataclass(frozen=True)
class Fp8Ops:
    """The FP8 cache's three operations on one device (the eager ones of wan/dit/kv_fp8.py by default)."""

    round: Callable[[torch.Tensor], torch.Tensor] = kv_fp8.round_fp8
    encode: Callable = kv_fp8.encode
    decode: Callable = kv_fp8.decode
    name: str = "torch ops"


EAGER = Fp8Ops()


def _rows(x: torch.Tensor, *others: torch.Tensor) -> Optional[tuple[int, int]]:
    """(rows, row length) when every tensor is a contiguous CUDA tensor the kernels take, else None."""
    d = x.shape[-1] if x.dim() else 0
    if KERNELS.failed is not None or not x.is_cuda or not 0 < d <= MAX_ROW or not x.is_contiguous():
        return None
    if any(not t.is_cuda or not t.is_contiguous() for t in others):
        return None
    return x.numel() // d, d


def _launch(shape: Optional[tuple[int, int]], kernel: str, args: tuple, eager: Callable, **constants):
    """Run `kernel` over `shape`'s rows, or `eager()` where the kernels cannot serve (then for good if they fail)."""
    found = None if shape is None else KERNELS.get()
    if found is None:
        return eager()
    triton, kernels = found
    block_d = triton.next_power_of_2(shape[1])
    block_r = max(1, _BLOCK_VALUES // block_d)
    try:
        getattr(kernels, kernel)[(triton.cdiv(shape[0], block_r),)](
            *args, shape[0], shape[1], BLOCK_R=block_r, BLOCK_D=block_d, num_warps=4, **constants)
    except Exception as e:  # noqa: BLE001 - a Triton that cannot build the kernel: the torch ops, for good
        KERNELS.give_up(e)
        return eager()
    return None


def _round(x: torch.Tensor, hw: bool) -> torch.Tensor:
    out = torch.empty_like(x)
    done = _launch(_rows(x), "encode_kernel", (x, out, out, out), lambda: kv_fp8.round_fp8(x),
                   WRITE_OUT=True, WRITE_CODES=False, HW_FP8=hw)
    return out if done is None else done


def _encode(x: torch.Tensor, codes: Optional[torch.Tensor] = None, exps: Optional[torch.Tensor] = None, *,
            hw: bool) -> tuple[torch.Tensor, torch.Tensor]:
    if codes is None:
        codes = torch.empty(x.shape, dtype=kv_fp8.CODE, device=x.device)
    if exps is None:
        exps = torch.empty((*x.shape[:-1], 1), dtype=torch.int8, device=x.device)
    target = codes if hw else codes.view(torch.uint8)
    done = _launch(_rows(x, codes, exps), "encode_kernel", (x, x, target, exps),
                   lambda: kv_fp8.encode(x, codes, exps), WRITE_OUT=False, WRITE_CODES=True, HW_FP8=hw)
    return (codes, exps) if done is None else done


def _decode(codes: torch.Tensor, exps: torch.Tensor, out: Optional[torch.Tensor] = None,
            dtype: torch.dtype = torch.bfloat16, *, hw: bool) -> torch.Tensor:
    if out is None:
        out = torch.empty(codes.shape, dtype=dtype, device=codes.device)
    source = codes if hw else codes.view(torch.uint8)
    done = _launch(_rows(codes, exps, out), "decode_kernel", (source, exps, out),
                   lambda: kv_fp8.decode(codes, exps, out), HW_FP8=hw)
    return out if done is None else done


def _ops(hw: bool) -> Fp8Ops:
    return Fp8Ops(partial(_round, hw=hw), partial(_encode, hw=hw), partial(_decode, hw=hw),
                  "Triton, hardware e4m3" if hw else "Triton, integer e4m3")


FUSED = _ops(hw=True)  # e4m3 conversions in hardware: Ada / Hopper and newer
FUSED_BITS = _ops(hw=False)  # the same bits from integer ops: any GPU Triton runs on (an RTX 30xx)

HW_FP8_CAPABILITY = (8, 9)  # Triton converts to e4m3 in hardware from Ada / Hopper on
MIN_CAPABILITY = (8, 0)  # the integer kernels: Ampere and newer


def kv_fp8_ops(device) -> Fp8Ops:
    """The FP8 cache's operations on `device`: one kernel each on an Ampere or newer GPU where Triton imports
    (converting in hardware from Ada / Hopper on, in integer ops before), the torch ops elsewhere: the same bits."""
    device = torch.device(device)
    if device.type != "cuda" or KERNELS.get() is None:
        return EAGER
    capability = torch.cuda.get_device_capability(device)
    if capability >= HW_FP8_CAPABILITY:
        return FUSED
    return FUSED_BITS if capability >= MIN_CAPABILITY else EAGER
