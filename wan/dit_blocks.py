"""Building blocks of the LingBot-World DiT (spec §2.3-2.4, §3).

Module and parameter names match the released checkpoints exactly, so `state_dict()` keys are the file's
keys. Precision follows the reference (spec §2.6): bulk linears run in the model's compute dtype (bf16 on
GPU), the residual stream and the modulation maths in float32.
"""
from __future__ import annotations

from typing import Optional

import torch
import torch.nn as nn
import torch.nn.functional as F

from .attention import attention
from .rope import apply_rope


def as_compute(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    return x if x.dtype == dtype else x.to(dtype)


def linear_fp32(mod: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """A linear layer evaluated in float32 (the reference's fp32 autocast regions).

    Quantized layers expose `dequantized_weight(dtype)`; plain ones are upcast.
    """
    if hasattr(mod, "dequantized_weight"):
        w = mod.dequantized_weight(torch.float32)
    else:
        w = mod.weight.float()
    b = None if mod.bias is None else mod.bias.float()
    return F.linear(x.float(), w, b)


class WanLayerNorm(nn.LayerNorm):
    """LayerNorm computed in float32, result cast back to the input dtype."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        w = None if self.weight is None else self.weight.float()
        b = None if self.bias is None else self.bias.float()
        return F.layer_norm(x.float(), self.normalized_shape, w, b, self.eps).to(x.dtype)


class WanRMSNorm(nn.Module):
    """q/k RMSNorm over the full width (before the head split): fp32 maths, cast back, times weight."""

    def __init__(self, dim: int, eps: float = 1e-6, device=None, dtype=None):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim, device=device, dtype=dtype))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xf = x.float()
        normed = xf * torch.rsqrt(xf.pow(2).mean(dim=-1, keepdim=True) + self.eps)
        return normed.to(x.dtype) * self.weight


class SelfAttention(nn.Module):
    def __init__(self, dim: int, num_heads: int, eps: float, **factory):
        super().__init__()
        self.num_heads = num_heads
        self.q = nn.Linear(dim, dim, **factory)
        self.k = nn.Linear(dim, dim, **factory)
        self.v = nn.Linear(dim, dim, **factory)
        self.o = nn.Linear(dim, dim, **factory)
        self.norm_q = WanRMSNorm(dim, eps, **factory)
        self.norm_k = WanRMSNorm(dim, eps, **factory)

    def forward(self, x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor], dtype: torch.dtype):
        b, seq, dim = x.shape
        h = as_compute(x, dtype)
        shape = (b, seq, self.num_heads, dim // self.num_heads)
        q = apply_rope(self.norm_q(self.q(h)).view(shape), *rope).to(dtype)
        k = apply_rope(self.norm_k(self.k(h)).view(shape), *rope).to(dtype)
        del h
        v = self.v(as_compute(x, dtype)).view(shape)
        out = attention(q, k, v).reshape(b, seq, dim)
        return self.o(as_compute(out, dtype))


class CrossAttention(nn.Module):
    """Video tokens attend to all 512 text rows (zero-padded rows included, no mask, no RoPE)."""

    def __init__(self, dim: int, num_heads: int, eps: float, **factory):
        super().__init__()
        self.num_heads = num_heads
        self.q = nn.Linear(dim, dim, **factory)
        self.k = nn.Linear(dim, dim, **factory)
        self.v = nn.Linear(dim, dim, **factory)
        self.o = nn.Linear(dim, dim, **factory)
        self.norm_q = WanRMSNorm(dim, eps, **factory)
        self.norm_k = WanRMSNorm(dim, eps, **factory)

    def forward(self, x: torch.Tensor, context: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        b, seq, dim = x.shape
        hd = dim // self.num_heads
        # q/k are cast back to the compute dtype: norm gains kept in fp32 by a loader would otherwise make them
        # fp32 next to a bf16 v, which SDPA rejects (the reference casts q/k/v to bf16 for attention too).
        q = as_compute(self.norm_q(self.q(as_compute(x, dtype))), dtype).view(b, seq, self.num_heads, hd)
        ctx = as_compute(context, dtype)
        k = as_compute(self.norm_k(self.k(ctx)), dtype).view(ctx.shape[0], -1, self.num_heads, hd)
        v = self.v(ctx).view(ctx.shape[0], -1, self.num_heads, hd)
        out = attention(q, k, v).reshape(b, seq, dim)
        return self.o(as_compute(out, dtype))


class WanBlock(nn.Module):
    """One transformer block with LingBot's per-block camera FiLM after self-attention (spec §2.4 step 6)."""

    def __init__(self, dim: int, ffn_dim: int, num_heads: int, eps: float, **factory):
        super().__init__()
        self.norm1 = WanLayerNorm(dim, eps, elementwise_affine=False, **factory)
        self.self_attn = SelfAttention(dim, num_heads, eps, **factory)
        self.norm3 = WanLayerNorm(dim, eps, elementwise_affine=True, **factory)
        self.cross_attn = CrossAttention(dim, num_heads, eps, **factory)
        self.norm2 = WanLayerNorm(dim, eps, elementwise_affine=False, **factory)
        self.ffn = nn.Sequential(
            nn.Linear(dim, ffn_dim, **factory), nn.GELU(approximate="tanh"), nn.Linear(ffn_dim, dim, **factory)
        )
        self.modulation = nn.Parameter(torch.randn(1, 6, dim, **factory) / dim**0.5)
        self.cam_injector_layer1 = nn.Linear(dim, dim, **factory)
        self.cam_injector_layer2 = nn.Linear(dim, dim, **factory)
        self.cam_scale_layer = nn.Linear(dim, dim, **factory)
        self.cam_shift_layer = nn.Linear(dim, dim, **factory)
        # Split the FFN over token chunks to bound its [L, ffn_dim] activation (None = whole sequence).
        self.ffn_chunk_tokens: Optional[int] = None

    def camera_film(self, cam: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """(scale, shift) of the camera FiLM; independent of x and t."""
        cam = as_compute(cam, dtype)
        g = self.cam_injector_layer2(F.silu(self.cam_injector_layer1(cam))) + cam
        return self.cam_scale_layer(g), self.cam_shift_layer(g)

    def _ffn(self, h: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        h = as_compute(h, dtype)
        n = self.ffn_chunk_tokens
        if not n or h.shape[1] <= n:
            return self.ffn(h)
        return torch.cat([self.ffn(part) for part in h.split(n, dim=1)], dim=1)

    def forward(
        self,
        x: torch.Tensor,
        e0: torch.Tensor,
        context: torch.Tensor,
        cam: Optional[torch.Tensor],
        rope: tuple[torch.Tensor, torch.Tensor],
        dtype: torch.dtype,
    ) -> torch.Tensor:
        # e0 [B, 6, dim] fp32 is one row per sample, broadcast over tokens (spec §2.7).
        m = (self.modulation.float() + e0).unsqueeze(2)  # [B, 6, 1, dim]
        shift_a, scale_a, gate_a, shift_f, scale_f, gate_f = m.unbind(1)

        h = self.norm1(x).float() * (1 + scale_a) + shift_a
        x = x + self.self_attn(h, rope, dtype).float() * gate_a
        del h
        if cam is not None:
            s, b = self.camera_film(cam, dtype)
            x = (1 + s) * x + b
            del s, b
        x = x + self.cross_attn(self.norm3(x), context, dtype)
        h = self.norm2(x).float() * (1 + scale_f) + shift_f
        x = x + self._ffn(h, dtype).float() * gate_f
        return x


class Head(nn.Module):
    def __init__(self, dim: int, out_features: int, eps: float, **factory):
        super().__init__()
        self.norm = WanLayerNorm(dim, eps, elementwise_affine=False, **factory)
        self.head = nn.Linear(dim, out_features, **factory)
        self.modulation = nn.Parameter(torch.randn(1, 2, dim, **factory) / dim**0.5)

    def forward(self, x: torch.Tensor, e: torch.Tensor) -> torch.Tensor:
        # Uses e (time_embedding output), not e0; all fp32 (spec §2.4 step 7).
        shift, scale = (self.modulation.float() + e.float().unsqueeze(1)).unsqueeze(2).unbind(1)
        return linear_fp32(self.head, self.norm(x).float() * (1 + scale) + shift)
