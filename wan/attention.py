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
    if _backend == "sage" and q.is_cuda:
        from sageattention import sageattn

        return sageattn(q, k, v, tensor_layout="NHD", is_causal=False)
    if _backend == "flash" and q.is_cuda:
        from flash_attn import flash_attn_func

        return flash_attn_func(q, k, v)
    out = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2))
    return out.transpose(1, 2)
