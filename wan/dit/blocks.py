"""Building blocks of the LingBot-World DiT (spec §2.3-2.4, §3).

Module and parameter names match the released checkpoints exactly, so `state_dict()` keys are the file's
keys. Precision follows the reference (spec §2.6): bulk linears run in the model's compute dtype (bf16 on
GPU), the residual stream and the modulation maths in float32.
"""
from __future__ import annotations

from contextlib import contextmanager
from typing import TYPE_CHECKING, Callable, Optional

import torch
import torch.nn as nn
import torch.nn.functional as F

from . import token_ops
from .attention import attention, self_attention
from ...quant.shared_inputs import quantize_once

if TYPE_CHECKING:
    from .film_cache import FilmLayer
    from .kv_cache import LayerKV


def as_compute(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    return x if x.dtype == dtype else x.to(dtype)


def linear_fp32(mod: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """A linear layer evaluated in float32 (the reference's fp32 autocast regions).

    Quantized layers expose `dequantized_weight(dtype)`; plain ones are upcast. A LoRA hung on the layer
    (`quant.lora`) is evaluated in float32 too.
    """
    if hasattr(mod, "dequantized_weight"):
        w = mod.dequantized_weight(torch.float32)
    else:
        w = mod.weight.float()
    b = None if mod.bias is None else mod.bias.float()
    lora = getattr(mod, "lora", None)
    if lora is not None:
        return lora.linear_fp32(x, w, b)
    return F.linear(x.float(), w, b)


class WanLayerNorm(nn.LayerNorm):
    """LayerNorm computed in float32, result cast back to the input dtype."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        w = None if self.weight is None else self.weight.float()
        b = None if self.bias is None else self.bias.float()
        return F.layer_norm(x.float(), self.normalized_shape, w, b, self.eps).to(x.dtype)


_HALF = (torch.float16, torch.bfloat16)


class WanRMSNorm(nn.Module):
    """q/k RMSNorm over the full width (before the head split): fp32 maths, cast back, times weight."""

    def __init__(self, dim: int, eps: float = 1e-6, device=None, dtype=None):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim, device=device, dtype=dtype))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # mean(x^2) from one float32 reduction over x as it is (no float32 copy of x); the scaling runs in
        # float32 and is stored once in x's dtype, which is the reference's `.to(x.dtype)` rounding.
        ss = torch.linalg.vector_norm(x, dim=-1, keepdim=True, dtype=torch.float32)
        inv = torch.rsqrt(ss.square() / x.shape[-1] + self.eps)
        normed = token_ops.mul_to(x, inv, x.dtype)
        w = self.weight
        if w.dtype in _HALF and normed.dtype in _HALF and w.dtype != normed.dtype:
            w = w.to(normed.dtype)  # bf16 gains in an fp16 model (set_compute_dtype): not a float32 product
        if w.dtype == normed.dtype:
            return normed.mul_(w)
        return normed * w


# Per-token phases (norms, modulation, projections, RoPE, cross-attention, camera FiLM, FFN, gated residuals)
# run over chunks of this many tokens, so no full-length float32 temporary is ever made: the block's peak is the
# fp32 residual stream plus q, k, v and the attention output (spec §10.2 lists the temporaries this avoids).
DEFAULT_TOKEN_CHUNK = 8192


def token_slices(seq: int, chunk: Optional[int]):
    if not chunk or seq <= chunk:
        return [slice(None)]
    return [slice(s, min(s + chunk, seq)) for s in range(0, seq, chunk)]


# ids of the linears whose weight a `weights_held` is holding now: an inner hold of the same layer (a layered
# phase holds q/k/v for every sample, SelfAttention.qkv holds them again) must neither reset nor release it.
_HOLDING: set[int] = set()


@contextmanager
def weights_held(*layers: nn.Module):
    """Quantized linears prepare their compute weight (dequantized NF4, or FP8/INT8) once for all token chunks
    of a phase (and all samples of a layered forward) instead of once per chunk; plain linears are untouched.
    Nested holds of the same layer are no-ops: the outermost one releases."""
    held = [m for m in layers if hasattr(m, "hold_weight") and id(m) not in _HOLDING]
    for m in held:
        _HOLDING.add(id(m))
        m.hold_weight()
    try:
        yield
    finally:
        for m in held:
            m.release_weight()
            _HOLDING.discard(id(m))


def linear_gelu(linear: nn.Module, x: torch.Tensor, ops: token_ops.TokenOps) -> torch.Tensor:
    """tanh-GELU(linear(x)): in the GEMM's epilogue where the ops ask for it and the linear offers it
    (TokenOps.gelu_in_gemm), else the GEMM then the GELU phase."""
    fused = getattr(linear, "forward_gelu", None) if ops.gelu_in_gemm else None
    y = fused(x) if fused is not None else None
    return y if y is not None else ops.gelu_tanh(linear(x))


class _AttentionLayers(nn.Module):
    """q/k/v/o projections and the full-width q/k RMSNorms shared by self- and cross-attention (spec §2.2 keys)."""

    def __init__(self, dim: int, num_heads: int, eps: float, **factory):
        super().__init__()
        self.num_heads = num_heads
        self.q = nn.Linear(dim, dim, **factory)
        self.k = nn.Linear(dim, dim, **factory)
        self.v = nn.Linear(dim, dim, **factory)
        self.o = nn.Linear(dim, dim, **factory)
        self.norm_q = WanRMSNorm(dim, eps, **factory)
        self.norm_k = WanRMSNorm(dim, eps, **factory)


class SelfAttention(_AttentionLayers):
    def qkv(self, make_input: Callable[[slice], torch.Tensor], shape: tuple, rope, dtype: torch.dtype,
            chunk: Optional[int], ops: Optional[token_ops.TokenOps] = None
            ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """q, k (normed, rotated) and v in the compute dtype, [B, L, heads, head_dim], built chunk by chunk.

        make_input(slice) gives the attention input of those tokens in the compute dtype.
        """
        b, seq, dim = shape
        heads, hd = self.num_heads, dim // self.num_heads
        q, k, v = (torch.empty(b, seq, heads, hd, dtype=dtype, device=self.q.weight.device) for _ in range(3))
        cos, sin = rope
        ops = ops or token_ops.EAGER
        with weights_held(self.q, self.k, self.v):
            for sl in token_slices(seq, chunk):
                h = make_input(sl)
                n = h.shape[1]
                with quantize_once():  # FP8/INT8: h is quantized once for the three projections
                    ops.qk_norm_rope(self.q(h), self.norm_q, cos[sl], sin[sl], q[:, sl])
                    ops.qk_norm_rope(self.k(h), self.norm_k, cos[sl], sin[sl], k[:, sl])
                    v[:, sl] = self.v(h).view(b, n, heads, hd)
        return q, k, v

    def forward(self, x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor], dtype: torch.dtype,
                chunk: Optional[int] = None) -> torch.Tensor:
        """Self-attention of an already modulated input x [B, L, dim] (o projection included)."""
        q, k, v = self.qkv(lambda sl: as_compute(x[:, sl], dtype), x.shape, rope, dtype, chunk)
        out = self_attention(q, k, v).flatten(2)
        return self.o(as_compute(out, dtype))


class CrossAttention(_AttentionLayers):
    """Video tokens attend to all 512 text rows (zero-padded rows included, no mask, no RoPE).

    Each video token attends independently, so the tokens can be processed in chunks.
    """

    def kv(self, context: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        ctx = as_compute(context, dtype)
        hd = ctx.shape[-1] // self.num_heads
        # q/k are cast back to the compute dtype: norm gains kept in fp32 by a loader would otherwise make them
        # fp32 next to a bf16 v, which SDPA rejects (the reference casts q/k/v to bf16 for attention too).
        k = as_compute(self.norm_k(self.k(ctx)), dtype).view(ctx.shape[0], -1, self.num_heads, hd)
        v = self.v(ctx).view(ctx.shape[0], -1, self.num_heads, hd)
        return k, v

    def attend(self, x: torch.Tensor, k: torch.Tensor, v: torch.Tensor, dtype: torch.dtype,
               ops: Optional[token_ops.TokenOps] = None) -> torch.Tensor:
        """x: the normed video tokens of one chunk (any float dtype; the GEMMs take them in `dtype`)."""
        b, seq, dim = x.shape
        ops = ops or token_ops.EAGER
        q = ops.norm_to(self.norm_q, self.q(as_compute(x, dtype)), dtype).view(b, seq, self.num_heads, -1)
        return self.o(as_compute(attention(q, k, v).reshape(b, seq, dim), dtype))

    def forward(self, x: torch.Tensor, context: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        return self.attend(x, *self.kv(context, dtype), dtype)


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
        self.token_chunk: Optional[int] = DEFAULT_TOKEN_CHUNK
        self.ops: token_ops.TokenOps = token_ops.EAGER  # eager or compiled per-token phases (compile option)
        # Sequence parallelism (parallel/ulysses.py): wraps the self-attention call; None = this process alone.
        self.seq_parallel = None

    def camera_film(self, cam: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """(1 + scale, shift) of the camera FiLM, independent of x and t; 1 + scale is rounded to scale's dtype like
        the reference's bf16 `1 + scale`."""
        cam = as_compute(cam, dtype)
        inference = not torch.is_grad_enabled()
        g = self.cam_injector_layer2(F.silu(self.cam_injector_layer1(cam), inplace=inference))
        g = g.add_(cam) if inference else g + cam
        with quantize_once():  # FP8/INT8: g is quantized once for scale and shift
            scale, shift = self.cam_scale_layer(g), self.cam_shift_layer(g)
        return (scale.add_(1) if inference else 1 + scale), shift

    def forward(
        self,
        x: torch.Tensor,
        e0: torch.Tensor,
        context: torch.Tensor,
        cam: Optional[torch.Tensor],
        rope: tuple[torch.Tensor, torch.Tensor],
        dtype: torch.dtype,
        inplace: bool = False,
        kv: Optional["LayerKV"] = None,
        film: Optional["FilmLayer"] = None,
    ) -> torch.Tensor:
        """x [B, L, dim] -> x after the block (float32). inplace=True lets a float32 x be updated in place.

        kv: this block's layer of a K/V cache (the causal Fast model): the chunk's keys and values are stored
        there and its queries attend to the cached past as well; the text K/V are computed once. None = the
        base model's full attention over x.
        film: this block's layer of a camera FiLM cache (wan/dit/film_cache.py): its (1 + scale, shift) are read
        from there when stored, else computed from `cam` and stored. None = computed from `cam`.
        """
        return self.forward_layered([x], [e0], [context], cam, rope, dtype, inplace, kv, film)[0]

    def forward_layered(
        self,
        xs: list[torch.Tensor],
        e0s: list[torch.Tensor],
        contexts: list[torch.Tensor],
        cam: Optional[torch.Tensor],
        rope: tuple[torch.Tensor, torch.Tensor],
        dtype: torch.dtype,
        inplace: bool = False,
        kv: Optional["LayerKV"] = None,
        film: Optional["FilmLayer"] = None,
    ) -> list[torch.Tensor]:
        """The block over several samples ("layered" CFG): one residual stream per sample, run one after the other
        through every phase, while the layer's weights are prepared once per phase for all of them and the camera
        FiLM's (scale, shift) once per token chunk (the camera tokens are shared). Each GEMM sees the rows of one
        sample's chunk, as in a forward per sample, so the results are bit-identical to those forwards.

        contexts: one text context per sample (n samples). e0s: one time modulation per sample.
        xs: one input per sample, or ONE input the caller knows all samples share (same latent, t, y, camera):
        then everything before the cross-attention (self-attention, FiLM) runs once and its result is copied.
        `forward` is this with a single sample (of any batch).
        """
        n = len(contexts)
        if len(e0s) != n or len(xs) not in (1, n) or (kv is not None and n != 1):
            raise ValueError(f"layered block: {len(xs)} inputs, {len(e0s)} time modulations and {n} text contexts "
                             "(give one of each per sample, or one shared input; a K/V cache takes one sample)")
        ops = self.ops
        # e0 [B, 6, dim] fp32 is one row per sample, broadcast over tokens (spec §2.7).
        mods = [self._modulation(e0) for e0 in e0s]
        slices = token_slices(xs[0].shape[1], self.token_chunk)

        # Several samples: q/k/v/o prepared once for all. One: held phase by phase only, so the attention's peak
        # does not carry four prepared weights (0.2 GB in bf16 at full size).
        shared = (self.self_attn.q, self.self_attn.k, self.self_attn.v, self.self_attn.o) if len(xs) > 1 else ()
        with weights_held(*shared):
            xs = [self._self_attention_part(x, m, rope, dtype, inplace, kv, slices) for x, m in zip(xs, mods)]
        if film is not None and film.ready:  # stored by an earlier forward over the same camera
            scale1, shift = film.read()
            for sl in slices:
                for x in xs:
                    ops.film(x[:, sl], scale1[:, sl], shift[:, sl])
            del scale1, shift
            film.done()
        elif cam is not None:
            film_layers = (self.cam_injector_layer1, self.cam_injector_layer2, self.cam_scale_layer,
                           self.cam_shift_layer)
            with weights_held(*film_layers):
                for sl in slices:
                    scale1, shift = self.camera_film(cam[:, sl], dtype)
                    if film is not None:
                        film.write(sl, scale1, shift)
                    for x in xs:
                        ops.film(x[:, sl], scale1, shift)
            if film is not None:
                film.written()
        elif film is not None:
            raise ValueError("a camera FiLM cache without its values needs the camera tokens")
        if len(xs) < n:  # a shared input: the samples part ways at the cross-attention (their texts differ)
            xs = xs + [xs[0].clone() for _ in range(n - len(xs))]

        if kv is None:
            with weights_held(self.cross_attn.k, self.cross_attn.v):
                texts = [self.cross_attn.kv(c, dtype) for c in contexts]
        else:
            texts = [kv.text(lambda: self.cross_attn.kv(contexts[0], dtype))]
        with weights_held(self.cross_attn.q, self.cross_attn.o):
            for sl in slices:
                for x, (k_txt, v_txt) in zip(xs, texts):
                    xn = ops.norm_to(self.norm3, x[:, sl], dtype)
                    ops.residual(x[:, sl], self.cross_attn.attend(xn, k_txt, v_txt, dtype, ops))
        del texts
        with weights_held(self.ffn[0], self.ffn[2]):
            for sl in slices:
                for x, (*_, shift_f, scale1_f, gate_f) in zip(xs, mods):
                    h = linear_gelu(self.ffn[0], ops.modulate(self.norm2, x[:, sl], shift_f, scale1_f, dtype), ops)
                    ops.gated_residual(x[:, sl], self.ffn[2](h), gate_f)
        return xs

    def _modulation(self, e0: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """(shift_a, 1 + scale_a, gate_a, shift_f, 1 + scale_f, gate_f), each [B, 1, dim] float32."""
        shift_a, scale_a, gate_a, shift_f, scale_f, gate_f = (self.modulation.float() + e0).unsqueeze(2).unbind(1)
        return shift_a, 1 + scale_a, gate_a, shift_f, 1 + scale_f, gate_f

    def _self_attention_part(self, x: torch.Tensor, m: tuple, rope: tuple[torch.Tensor, torch.Tensor],
                             dtype: torch.dtype, inplace: bool, kv: Optional["LayerKV"], slices: list) -> torch.Tensor:
        """x + gate * o(self_attention(modulated norm1(x))) as a float32 residual stream (spec §2.4 step 6)."""
        ops = self.ops
        shift_a, scale1_a, gate_a = m[:3]

        def attn_input(sl: slice) -> torch.Tensor:
            return ops.modulate(self.norm1, x[:, sl], shift_a, scale1_a, dtype)

        q, k, v = self.self_attn.qkv(attn_input, x.shape, rope, dtype, self.token_chunk, ops)
        sp = self.seq_parallel
        if kv is not None:
            attn = kv.attend(q, k, v) if sp is None else sp.attend(kv.attend, q, k, v)
        else:  # q is dropped after this: a kernel may write its output there (FP8 attention does)
            attn = self_attention(q, k, v, reuse_q=True) if sp is None else sp.attend(self_attention, q, k, v)
        attn = attn.flatten(2)
        del q, k, v
        # The residual stream is float32 from the first gated add on (block 0 receives bf16; spec §2.6).
        if x.dtype != torch.float32:
            x = x.float()
        elif not inplace:
            x = x.clone()
        with weights_held(self.self_attn.o):
            for sl in slices:
                ops.gated_residual(x[:, sl], self.self_attn.o(as_compute(attn[:, sl], dtype)), gate_a)
        return x


class Head(nn.Module):
    def __init__(self, dim: int, out_features: int, eps: float, **factory):
        super().__init__()
        self.norm = WanLayerNorm(dim, eps, elementwise_affine=False, **factory)
        self.head = nn.Linear(dim, out_features, **factory)
        self.modulation = nn.Parameter(torch.randn(1, 2, dim, **factory) / dim**0.5)

    def forward(self, x: torch.Tensor, e: torch.Tensor, chunk: Optional[int] = DEFAULT_TOKEN_CHUNK,
                ops: Optional[token_ops.TokenOps] = None) -> torch.Tensor:
        # Uses e (time_embedding output), not e0; all fp32 (spec §2.4 step 7).
        ops = ops or token_ops.EAGER
        shift, scale = (self.modulation.float() + e.float().unsqueeze(1)).unsqueeze(2).unbind(1)
        scale1 = 1 + scale
        out = torch.empty(*x.shape[:2], self.head.out_features, dtype=torch.float32, device=x.device)
        for sl in token_slices(x.shape[1], chunk):
            out[:, sl] = linear_fp32(self.head, ops.modulate(self.norm, x[:, sl], shift, scale1, torch.float32))
        return out
