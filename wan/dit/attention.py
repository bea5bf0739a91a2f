"""Attention backend: torch SDPA by default; SageAttention / FlashAttention only when installed and chosen.

The reference never masks on a single GPU (full-length q/k, unmasked text), so plain unmasked attention
computes the same maths (spec §9).
"""
from __future__ import annotations

import importlib.util
import logging

import torch
import torch.nn.functional as F

log = logging.getLogger(__name__)

BACKENDS = ("sdpa", "sage", "flash")
_backend = "sdpa"


def available_backends() -> list[str]:
    out = ["sdpa"]
    if importlib.util.find_spec("sageattention") is not None:
        out.append("sage")
    if importlib.util.find_spec("flash_attn") is not None:
        out.append("flash")
    return out


def set_backend(name: str) -> None:
    """Select the attention kernel for every DiT call ("sdpa", "sage", "flash")."""
    global _backend
    if name not in BACKENDS:
        raise ValueError(f"unknown attention backend {name!r}; choose one of {BACKENDS}")
    if name not in available_backends():
        raise ValueError(f"attention backend {name!r} is not installed; available: {available_backends()}")
    _backend = name


def get_backend() -> str:
    return _backend


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Unmasked multi-head attention. q [B, Lq, H, D], k/v [B, Lk, H, D] -> [B, Lq, H, D]."""
    if _backend in ("sage", "flash") and q.is_cuda:
        # Both kernels take only fp16/bf16; like the reference, run other dtypes in bf16 and cast back (spec §9).
        kernel_dtype = q.dtype if q.dtype in (torch.float16, torch.bfloat16) else torch.bfloat16
        qh, kh, vh = (a.to(kernel_dtype) for a in (q, k, v))
        if _backend == "sage":
            from sageattention import sageattn

            out = sageattn(qh, kh, vh, tensor_layout="NHD", is_causal=False)
        else:
            from flash_attn import flash_attn_func

            out = flash_attn_func(qh, kh, vh)
        return out.to(q.dtype)
    out = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2))
    return out.transpose(1, 2)
