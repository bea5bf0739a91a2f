"""The DiT block as it was before issue 15 (commit 557c491), kept only as bench_speed's same-session baseline.

`legacy_forward()` swaps these functions into WanBlock / SelfAttention / CrossAttention / Head / WanRMSNorm and
NF4Linear (bitsandbytes' own `Linear4bit.forward`, one dequantization per token chunk) for the duration of a
`with` block, in a benchmark child process. Nothing in the library uses this file.
"""
from __future__ import annotations

from contextlib import contextmanager

import torch

from ..quant.nf4 import NF4Linear
from ..wan.dit import blocks
from ..wan.dit.attention import attention


def _rms_forward(self, x):
    xf = x.float()
    normed = xf * torch.rsqrt(xf.pow(2).mean(dim=-1, keepdim=True) + self.eps)
    return normed.to(x.dtype) * self.weight


def _apply_rope(x, cos, sin):
    b, seq, heads, d = x.shape
    re, im = x.float().reshape(b, seq, heads, d // 2, 2).unbind(-1)
    c, s = cos[None, :, None, :], sin[None, :, None, :]
    return torch.stack((re * c - im * s, re * s + im * c), dim=-1).reshape(b, seq, heads, d)


def _qkv(self, make_input, shape, rope, dtype, chunk, ops=None):
    b, seq, dim = shape
    heads, hd = self.num_heads, dim // self.num_heads
    q, k, v = (torch.empty(b, seq, heads, hd, dtype=dtype, device=self.q.weight.device) for _ in range(3))
    cos, sin = rope
    for sl in blocks.token_slices(seq, chunk):
        h = make_input(sl)
        n = h.shape[1]
        q[:, sl] = _apply_rope(self.norm_q(self.q(h)).view(b, n, heads, hd), cos[sl], sin[sl])
        k[:, sl] = _apply_rope(self.norm_k(self.k(h)).view(b, n, heads, hd), cos[sl], sin[sl])
        v[:, sl] = self.v(h).view(b, n, heads, hd)
    return q, k, v


def _attend(self, x, k, v, dtype, ops=None):
    b, seq, dim = x.shape
    as_compute = blocks.as_compute
    q = as_compute(self.norm_q(self.q(as_compute(x, dtype))), dtype).view(b, seq, self.num_heads, -1)
    return self.o(as_compute(attention(q, k, v).reshape(b, seq, dim), dtype))


def _camera_film(self, cam, dtype):
    cam = blocks.as_compute(cam, dtype)
    g = self.cam_injector_layer2(torch.nn.functional.silu(self.cam_injector_layer1(cam))) + cam
    return self.cam_scale_layer(g), self.cam_shift_layer(g)


def _block_forward(self, x, e0, context, cam, rope, dtype, inplace=False, kv=None):
    if kv is not None:
        raise NotImplementedError("the pre-issue-15 block has no K/V cache (the base model's baseline only)")
    as_compute = blocks.as_compute
    m = (self.modulation.float() + e0).unsqueeze(2)
    shift_a, scale_a, gate_a, shift_f, scale_f, gate_f = m.unbind(1)
    slices = blocks.token_slices(x.shape[1], self.token_chunk)

    def attn_input(sl):
        return (self.norm1(x[:, sl]).float() * (1 + scale_a) + shift_a).to(dtype)

    q, k, v = self.self_attn.qkv(attn_input, x.shape, rope, dtype, self.token_chunk)
    attn = attention(q, k, v).flatten(2)
    del q, k, v
    if x.dtype != torch.float32:
        x = x.float()
    elif not inplace:
        x = x.clone()
    for sl in slices:
        x[:, sl] += self.self_attn.o(as_compute(attn[:, sl], dtype)).float() * gate_a
    del attn
    if cam is not None:
        for sl in slices:
            s, b = self.camera_film(cam[:, sl], dtype)
            x[:, sl] = (1 + s) * x[:, sl] + b
    k_txt, v_txt = self.cross_attn.kv(context, dtype)
    for sl in slices:
        x[:, sl] += self.cross_attn.attend(self.norm3(x[:, sl]), k_txt, v_txt, dtype)
    for sl in slices:
        h = (self.norm2(x[:, sl]).float() * (1 + scale_f) + shift_f).to(dtype)
        x[:, sl] += self.ffn(h).float() * gate_f
    return x


def _block_forward_layered(self, xs, e0s, contexts, cam, rope, dtype, inplace=False, kv=None, film=None):
    # WanDiT.forward calls every block through forward_layered; the old block ran one sample with no caches
    if len(xs) != 1 or len(contexts) != 1 or film is not None:
        raise NotImplementedError("the pre-issue-15 block runs one sample without a FiLM cache")
    return [_block_forward(self, xs[0], e0s[0], contexts[0], cam, rope, dtype, inplace, kv)]


def _head_forward(self, x, e, chunk=blocks.DEFAULT_TOKEN_CHUNK, ops=None):
    shift, scale = (self.modulation.float() + e.float().unsqueeze(1)).unsqueeze(2).unbind(1)
    out = torch.empty(*x.shape[:2], self.head.out_features, dtype=torch.float32, device=x.device)
    for sl in blocks.token_slices(x.shape[1], chunk):
        out[:, sl] = blocks.linear_fp32(self.head, self.norm(x[:, sl]).float() * (1 + scale) + shift)
    return out


_PATCHES = [
    (blocks.WanRMSNorm, "forward", _rms_forward),
    (blocks.SelfAttention, "qkv", _qkv),
    (blocks.CrossAttention, "attend", _attend),
    (blocks.WanBlock, "camera_film", _camera_film),
    (blocks.WanBlock, "forward", _block_forward),
    (blocks.WanBlock, "forward_layered", _block_forward_layered),
    (blocks.Head, "forward", _head_forward),
]


@contextmanager
def legacy_forward():
    """Run the DiT with the pre-issue-15 block and bitsandbytes' own NF4 forward inside the `with` block."""
    from bitsandbytes.nn import Linear4bit

    saved = [(cls, name, cls.__dict__[name]) for cls, name, _ in _PATCHES]
    saved.append((NF4Linear, "forward", NF4Linear.__dict__["forward"]))
    try:
        for cls, name, fn in _PATCHES:
            setattr(cls, name, fn)
        NF4Linear.forward = Linear4bit.forward
        yield
    finally:
        for cls, name, fn in saved:
            setattr(cls, name, fn)
