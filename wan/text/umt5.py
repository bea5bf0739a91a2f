"""umT5-XXL text encoder (encoder only), weight-compatible with Wan's `models_t5_umt5-xxl-enc-bf16.pth` (spec §7).

`UMT5Encoder(cfg).state_dict()` has exactly the release's 242 keys (`token_embedding.weight`,
`blocks.i.{norm1,attn.{q,k,v,o},norm2,ffn.{gate.0,fc1,fc2},pos_embedding.embedding}.weight`, `norm.weight`).
The model can be built on the `meta` device and filled tensor by tensor by a loader.

Maths (pre-norm T5 with umT5's per-layer relative bias): T5 RMSNorm in fp32 cast back, attention logits
q·kᵀ + bias with NO 1/√d scaling, padded keys masked with the dtype minimum, gated-GELU(tanh) FFN, final
RMSNorm. The token embedding may live on another device/dtype than the blocks (a loader keeps the 2 GB
table on the CPU and looks rows up there); rows are moved to the blocks' device and dtype.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

import torch
import torch.nn as nn
import torch.nn.functional as F
from einops import rearrange


@dataclass(frozen=True)
class UMT5Config:
    vocab_size: int = 256384
    dim: int = 4096
    num_heads: int = 64
    head_dim: int = 64
    ffn_dim: int = 10240
    num_layers: int = 24
    num_buckets: int = 32
    max_distance: int = 128
    eps: float = 1e-6

    @property
    def attn_dim(self) -> int:
        return self.num_heads * self.head_dim

    @classmethod
    def xxl(cls) -> "UMT5Config":
        """umT5-XXL as used by Wan2.x / LingBot-World (5,680,910,336 parameters)."""
        return cls()

    @classmethod
    def tiny(cls, **over) -> "UMT5Config":
        """Same structure, tiny sizes (tests, demos). The vocabulary covers small trained tokenizers;
        max_distance stays 128 because a file's shapes cannot tell it."""
        base = dict(vocab_size=512, dim=32, num_heads=4, head_dim=8, ffn_dim=48, num_layers=2, num_buckets=8)
        base.update(over)
        return cls(**base)

    def num_params(self) -> int:
        per_block = 2 * self.dim + 4 * self.dim * self.attn_dim + 3 * self.dim * self.ffn_dim
        per_block += self.num_buckets * self.num_heads
        return self.vocab_size * self.dim + self.num_layers * per_block + self.dim


def relative_position_bucket(rel: torch.Tensor, num_buckets: int, max_distance: int) -> torch.Tensor:
    """Bidirectional T5 bucket of `rel = key_pos - query_pos` (spec §7).

    Half the buckets for keys after the query; within a half, exact buckets for small distances and
    log-spaced ones up to `max_distance`.
    """
    half = num_buckets // 2
    exact = half // 2
    bucket = (rel > 0).long() * half
    dist = rel.abs()
    # clamp keeps log() finite for the small distances that the `where` discards anyway
    far = exact + (
        torch.log(dist.clamp(min=exact).float() / exact) / math.log(max_distance / exact) * (half - exact)
    ).long()
    far = far.clamp(max=half - 1)
    return bucket + torch.where(dist < exact, dist, far)


class T5RMSNorm(nn.Module):
    """T5 LayerNorm: scale-only RMS norm computed in fp32, cast to the weight dtype, times the weight."""

    def __init__(self, dim: int, eps: float = 1e-6):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.rms_norm(x.float(), (x.shape[-1],), eps=self.eps)
        return y.to(self.weight.dtype) * self.weight


def _embedding(num: int, dim: int) -> nn.Embedding:
    """nn.Embedding; built under torch.device("meta") it skips the random init, whose meta kernel costs the text
    encoder's child ~2 s of one-off imports before it reads a byte."""
    if torch.empty(0).is_meta:
        return nn.Embedding(num, dim, _weight=torch.empty(num, dim))
    return nn.Embedding(num, dim)


class RelativePositionBias(nn.Module):
    def __init__(self, num_buckets: int, num_heads: int, max_distance: int):
        super().__init__()
        self.num_buckets = num_buckets
        self.max_distance = max_distance
        self.embedding = _embedding(num_buckets, num_heads)

    def forward(self, lq: int, lk: int) -> torch.Tensor:
        """Bias [1, heads, lq, lk]."""
        dev = self.embedding.weight.device
        rel = torch.arange(lk, device=dev)[None, :] - torch.arange(lq, device=dev)[:, None]
        buckets = relative_position_bucket(rel, self.num_buckets, self.max_distance)
        return rearrange(self.embedding(buckets), "q k h -> 1 h q k")


class T5SelfAttention(nn.Module):
    def __init__(self, dim: int, num_heads: int, head_dim: int):
        super().__init__()
        self.num_heads = num_heads
        inner = num_heads * head_dim
        self.q = nn.Linear(dim, inner, bias=False)
        self.k = nn.Linear(dim, inner, bias=False)
        self.v = nn.Linear(dim, inner, bias=False)
        self.o = nn.Linear(inner, dim, bias=False)

    def forward(self, x: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
        """x [B, L, dim]; bias [B or 1, heads, L, L] (position bias with masked keys at the dtype minimum)."""
        q, k, v = (rearrange(p(x), "b l (h d) -> b h l d", h=self.num_heads) for p in (self.q, self.k, self.v))
        # T5 folds the scale into its weights: logits are the plain dot product plus bias.
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=bias.to(q.dtype), scale=1.0)
        return self.o(rearrange(out, "b h l d -> b l (h d)"))


class GatedGeluFFN(nn.Module):
    """fc2(fc1(x) * gelu_tanh(gate(x))); `gate` is a Sequential so its weight is `gate.0.weight`."""

    def __init__(self, dim: int, ffn_dim: int):
        super().__init__()
        self.gate = nn.Sequential(nn.Linear(dim, ffn_dim, bias=False), nn.GELU(approximate="tanh"))
        self.fc1 = nn.Linear(dim, ffn_dim, bias=False)
        self.fc2 = nn.Linear(ffn_dim, dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.fc1(x) * self.gate(x))


class UMT5Block(nn.Module):
    def __init__(self, cfg: UMT5Config):
        super().__init__()
        self.norm1 = T5RMSNorm(cfg.dim, cfg.eps)
        self.attn = T5SelfAttention(cfg.dim, cfg.num_heads, cfg.head_dim)
        self.norm2 = T5RMSNorm(cfg.dim, cfg.eps)
        self.ffn = GatedGeluFFN(cfg.dim, cfg.ffn_dim)
        self.pos_embedding = RelativePositionBias(cfg.num_buckets, cfg.num_heads, cfg.max_distance)

    def forward(self, x: torch.Tensor, key_mask: Optional[torch.Tensor]) -> torch.Tensor:
        """x [B, L, dim]; key_mask bool [B, L] (True = real token) or None."""
        length = x.shape[1]
        bias = self.pos_embedding(length, length).to(x.device)
        if key_mask is not None:
            bias = bias.masked_fill(~key_mask[:, None, None, :], torch.finfo(bias.dtype).min)
        x = x + self.attn(self.norm1(x), bias)
        return x + self.ffn(self.norm2(x))


class UMT5Encoder(nn.Module):
    def __init__(self, cfg: UMT5Config):
        super().__init__()
        self.cfg = cfg
        self.token_embedding = _embedding(cfg.vocab_size, cfg.dim)
        self.blocks = nn.ModuleList([UMT5Block(cfg) for _ in range(cfg.num_layers)])
        self.norm = T5RMSNorm(cfg.dim, cfg.eps)

    @classmethod
    def on_meta(cls, cfg: UMT5Config) -> "UMT5Encoder":
        """Structure only, no storage: a loader assigns every tensor."""
        with torch.device("meta"):
            return cls(cfg)

    @property
    def compute_device(self) -> torch.device:
        return self.norm.weight.device

    @property
    def compute_dtype(self) -> torch.dtype:
        return self.norm.weight.dtype

    def forward(self, ids: torch.Tensor, mask: Optional[torch.Tensor] = None) -> torch.Tensor:
        """ids [B, L] int; mask [B, L] (1 = token, 0 = padding) or None. Returns [B, L, dim]."""
        emb = self.token_embedding.weight
        x = F.embedding(ids.to(emb.device), emb).to(self.compute_device, self.compute_dtype)
        key_mask = None if mask is None else mask.to(self.compute_device).bool()
        for block in self.blocks:
            x = block(x, key_mask)
        return self.norm(x)

    @torch.no_grad()
    def encode(self, ids: torch.Tensor, mask: torch.Tensor) -> list[torch.Tensor]:
        """Per-sequence hidden states cut to their true length (mask sum, EOS included): [L_i, dim] each.

        Only the columns up to the longest true length are computed: padded keys are masked, so the valid
        rows do not depend on how much padding follows them.
        """
        lengths = mask.sum(dim=1).tolist()
        width = max(int(n) for n in lengths)
        hidden = self(ids[:, :width], mask[:, :width])
        return [h[: int(n)] for h, n in zip(hidden, lengths)]
