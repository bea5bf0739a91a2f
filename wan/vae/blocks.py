"""Building blocks of the Wan2.1 causal video VAE (spec §8.1).

Attribute names and `nn.Sequential` indices reproduce the release's state-dict keys
(`residual.0.gamma`, `residual.2.weight`, `resample.1.weight`, `time_conv.weight`, ...).

Temporal causality: every block takes a `cache` dict that lives for one encode or decode call. Each
layer with a temporal kernel keeps what it needs from the previous chunk under its own module as key,
so chunked processing reproduces the reference's feature cache (spec §8.2) without index bookkeeping.
"""
from __future__ import annotations

from typing import Callable, Optional

import torch
import torch.nn as nn
import torch.nn.functional as F
from einops import rearrange

CACHE_FRAMES = 2  # a 3-tap causal kernel needs the two frames before the chunk
FeatureCache = dict  # module -> cached frames, a FrameRing (one-frame steps) or FIRST_CHUNK (temporal upsamplers)


class _FirstChunk:
    """Marker: the temporal upsampler has seen the first chunk only (it was passed through)."""

    def __repr__(self) -> str:
        return "FIRST_CHUNK"


FIRST_CHUNK = _FirstChunk()
NormSilu = Callable[["RMSNorm", torch.Tensor, torch.Tensor], None]  # (norm, x, out slot): out = SiLU(norm(x))


class CausalConv3d(nn.Conv3d):
    """Conv3d padded causally in time: 2p zero frames in front, none behind; p on each side in H and W.

    The spatial padding is left to the convolution itself (no padded copy of the activation); only the
    front of the time axis is materialised, from cached frames where available, zeros otherwise.
    """

    def __init__(self, in_ch: int, out_ch: int, kernel_size, stride=1, padding=0):
        k = _triple(kernel_size)
        p = _triple(padding)
        super().__init__(in_ch, out_ch, k, stride=stride, padding=(0, p[1], p[2]))
        self.time_pad = 2 * p[0]
        self._ring_weights = None  # (the weight's stamp, {(taps, dtype): the ring's 2D weight})

    def conv_after(self, x: torch.Tensor, history: Optional[torch.Tensor] = None) -> torch.Tensor:
        """Convolve `x` preceded by `history` frames; zero frames fill what history does not cover."""
        front = self.time_pad
        if history is not None and front > 0:
            x = torch.cat([history.to(x.dtype), x], dim=2)
            front -= history.shape[2]
        if front > 0:
            x = F.pad(x, (0, 0, 0, 0, front, 0))
        kt = self.kernel_size[0]
        if kt > 1 and x.shape[2] == kt and x.is_contiguous():
            # exactly one output frame (the frame-by-frame path): a 2D conv over (channel, time) stacked as
            # channels computes the same sums, with cuDNN's faster, smaller-workspace 2D kernels
            y = F.conv2d(x.flatten(1, 2), self.weight.flatten(1, 2), self.bias, self.stride[1:],
                         self.padding[1:], self.dilation[1:])
            return y.unsqueeze(2)
        return self._conv_forward(x, self.weight, self.bias)

    def ring(self, cache: FeatureCache, like: torch.Tensor) -> FrameRing:
        """This conv's ring in `cache` (made on the first step, zeros for the causal padding)."""
        ring = cache.get(self)
        if ring is None:
            ring = cache[self] = FrameRing(like, ring_dtype(like))
        elif not isinstance(ring, FrameRing):
            raise RuntimeError("a causal conv stepped one frame at a time was given multi-frame history")
        return ring

    def conv_ring(self, ring: FrameRing) -> torch.Tensor:
        """The conv of the ring's three frames (the newest just written) -> [N, out, 1, H, W] (channels last)."""
        ring.advance()
        dtype = ring.buf.dtype
        bias = self.bias if self.bias is None or _autocast_on(ring.buf) else self.bias.to(dtype)
        y = F.conv2d(ring.stacked(), self._ring_weight(ring.taps(), dtype), bias, self.stride[1:],
                     self.padding[1:], self.dilation[1:])
        return y.unsqueeze(2)

    def step(self, norm: "RMSNorm", x: torch.Tensor, cache: FeatureCache,
             norm_silu: Optional[NormSilu] = None) -> torch.Tensor:
        """This conv of SiLU(norm(x)) for one frame [N, C, 1, H, W], through its ring: the norm and SiLU are written
        into the ring's next slot (by `norm_silu`, default norm_silu_into; speed/vae_norm.py fuses them)."""
        ring = self.ring(cache, x)
        (norm_silu or norm_silu_into)(norm, x, ring.next_slot())
        return self.conv_ring(ring)

    def _ring_weight(self, taps: tuple, dtype: torch.dtype) -> torch.Tensor:
        """The weight [out, 3*in, kh, kw] for slots holding time taps `taps`, channels last: three per dtype, kept
        on the module (about 0.1 GB in float32 for the Wan decoder's tail), made again if the weight tensor is
        replaced, moved or changed in place."""
        w = self.weight
        # an inference tensor (weights loaded under inference_mode, as ComfyUI does) has no version counter
        stamp = (w.data_ptr(), None if w.is_inference() else w._version, w.device)
        cached = self._ring_weights
        if cached is None or cached[0] != stamp:
            cached = self._ring_weights = (stamp, {})
        key = (taps, dtype)
        got = cached[1].get(key)
        if got is None:
            got = torch.stack([w[:, :, t] for t in taps], dim=1).flatten(1, 2).to(dtype)
            got = cached[1][key] = got.contiguous(memory_format=torch.channels_last)
        return got

    def forward(self, x: torch.Tensor, cache: Optional[FeatureCache] = None) -> torch.Tensor:
        if cache is None or self.time_pad == 0:
            return self.conv_after(x)
        prev = cache.get(self)
        keep = x[:, :, -CACHE_FRAMES:]
        if keep.shape[2] < CACHE_FRAMES and prev is not None:
            # a 1-frame chunk: keep the last frame of the previous chunk too
            keep = torch.cat([prev[:, :, -1:], keep], dim=2)
        else:
            keep = keep.clone()  # a view would keep the whole chunk alive
        out = self.conv_after(x, prev)
        cache[self] = keep
        return out


class FrameRing:
    """The inputs of a causal 3-tap conv stepped one frame at a time: the new frame and the two before it, in a
    ring of three slots stored [N, H, W, 3, C] (channels last, the slots side by side per pixel).

    Why: the step's input is written straight into its slot (by the norm and SiLU before the conv), and the conv
    reads all three slots as one [N, 3C, H, W] channels-last image (a 2D conv with the time taps stacked as
    channels, the weight's taps put in slot order). No frames are concatenated or copied between steps, and
    cuDNN gets the NHWC layout its tensor-core kernels use without converting. Starts as zeros: the causal
    padding of a video's first frame."""

    __slots__ = ("buf", "newest")

    def __init__(self, like: torch.Tensor, dtype: torch.dtype):
        n, c, _, h, w = like.shape
        self.buf = torch.zeros(n, h, w, 3, c, dtype=dtype, device=like.device)
        self.newest = 2  # the first frame goes into slot 0

    def next_slot(self) -> torch.Tensor:
        """The slot the next frame goes into (the oldest), as a [N, C, 1, H, W] view."""
        return self.buf[:, :, :, (self.newest + 1) % 3].permute(0, 3, 1, 2).unsqueeze(2)

    def advance(self) -> None:
        self.newest = (self.newest + 1) % 3

    def stacked(self) -> torch.Tensor:
        """The three slots as one [N, 3C, H, W] channels-last image (slot-major channels)."""
        n, h, w, t, c = self.buf.shape
        return self.buf.view(n, h, w, t * c).permute(0, 3, 1, 2)

    def taps(self) -> tuple:
        """The time tap (0 = the oldest input, 2 = the newest) each slot holds."""
        return tuple(2 - (self.newest - s) % 3 for s in range(3))

    @property
    def nbytes(self) -> int:
        return self.buf.numel() * self.buf.element_size()


def _autocast_on(x: torch.Tensor) -> bool:
    kind = x.device.type
    return kind in ("cuda", "cpu") and torch.is_autocast_enabled(kind)


def ring_dtype(x: torch.Tensor) -> torch.dtype:
    """The dtype a ring stores: what the conv computes in (autocast's dtype where autocast is on)."""
    return torch.get_autocast_dtype(x.device.type) if _autocast_on(x) else x.dtype


def norm_silu_into(norm: "RMSNorm", x: torch.Tensor, out: torch.Tensor) -> None:
    """out = SiLU(norm(x)), written into `out` (a ring slot): the ops of F.normalize(x) * scale * gamma."""
    denom = x.norm(2, dim=1, keepdim=True).clamp_min_(1e-12)
    torch.div(x, denom, out=out)
    out.mul_(norm.scale).mul_(norm.gamma)
    F.silu(out, inplace=True)


def _triple(v) -> tuple:
    return tuple(v) if isinstance(v, (tuple, list)) else (v, v, v)


class RMSNorm(nn.Module):
    """L2-normalise over channels, times sqrt(C) and a per-channel gamma (no bias).

    `images=True` gives gamma the `[C,1,1]` shape of the 2D attention norm, otherwise `[C,1,1,1]`.
    """

    def __init__(self, dim: int, images: bool = False):
        super().__init__()
        self.scale = dim**0.5
        self.gamma = nn.Parameter(torch.ones(dim, *((1, 1) if images else (1, 1, 1))))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # in place on the fresh normalised tensor: same rounding as `normalize(x) * scale * gamma`
        return F.normalize(x, dim=1).mul_(self.scale).mul_(self.gamma)


class ResidualBlock(nn.Module):
    """RMS -> SiLU -> causal 3x3x3 -> RMS -> SiLU -> Dropout -> causal 3x3x3, plus a 1x1x1 shortcut."""

    def __init__(self, in_dim: int, out_dim: int, dropout: float = 0.0):
        super().__init__()
        self.residual = nn.Sequential(
            RMSNorm(in_dim),
            nn.SiLU(),
            CausalConv3d(in_dim, out_dim, 3, padding=1),
            RMSNorm(out_dim),
            nn.SiLU(),
            nn.Dropout(dropout),
            CausalConv3d(out_dim, out_dim, 3, padding=1),
        )
        self.shortcut = CausalConv3d(in_dim, out_dim, 1) if in_dim != out_dim else nn.Identity()

    def forward(self, x: torch.Tensor, cache: FeatureCache) -> torch.Tensor:
        norm1, _, conv1, norm2, _, dropout, conv2 = self.residual
        h = F.silu(norm1(x), inplace=True)
        h = conv1(h, cache)
        h = F.silu(norm2(h), inplace=True)
        h = conv2(dropout(h), cache)
        return h.add_(self.shortcut(x))

    def step(self, x: torch.Tensor, cache: FeatureCache, norm_silu: Optional[NormSilu] = None) -> torch.Tensor:
        """forward() for one frame [N, C, 1, H, W] at a time, through FrameRings (the same sums; a block must be
        stepped this way for the whole video, its cache holds rings). Dropout is off (eval: p = 0 in the release).
        norm_silu: what writes SiLU(norm(x)) into a slot (CausalConv3d.step)."""
        norm1, _, conv1, norm2, _, _, conv2 = self.residual
        h = conv1.step(norm1, x, cache, norm_silu)
        return conv2.step(norm2, h, cache, norm_silu).add_(self.shortcut(x))


class AttentionBlock(nn.Module):
    """Single-head self-attention over the H*W positions of each frame on its own, residual."""

    def __init__(self, dim: int):
        super().__init__()
        self.norm = RMSNorm(dim, images=True)
        self.to_qkv = nn.Conv2d(dim, dim * 3, 1)
        self.proj = nn.Conv2d(dim, dim, 1)

    def forward(self, x: torch.Tensor, cache: Optional[FeatureCache] = None) -> torch.Tensor:
        b, c, t, h, w = x.shape
        frames = rearrange(x, "b c t h w -> (b t) c h w")
        qkv = self.to_qkv(self.norm(frames))
        q, k, v = rearrange(qkv, "n (three c) h w -> three n 1 (h w) c", three=3).unbind(0)
        out = F.scaled_dot_product_attention(q, k, v)
        out = self.proj(rearrange(out, "n 1 (h w) c -> n c h w", h=h, w=w))
        return x + rearrange(out, "(b t) c h w -> b c t h w", b=b)


class Resample(nn.Module):
    """Spatial x2 up/down sampling, with a causal temporal x2 step in the "3d" modes (spec §8.1-8.2)."""

    MODES = ("upsample2d", "upsample3d", "downsample2d", "downsample3d")

    def __init__(self, dim: int, mode: str):
        super().__init__()
        if mode not in self.MODES:
            raise ValueError(f"unknown resample mode {mode!r}; expected one of {self.MODES}")
        self.mode = mode
        if mode.startswith("upsample"):
            self.resample = nn.Sequential(
                nn.Upsample(scale_factor=(2.0, 2.0), mode="nearest-exact"),
                nn.Conv2d(dim, dim // 2, 3, padding=1),
            )
            if mode == "upsample3d":
                self.time_conv = CausalConv3d(dim, dim * 2, (3, 1, 1), padding=(1, 0, 0))
        else:
            self.resample = nn.Sequential(nn.ZeroPad2d((0, 1, 0, 1)), nn.Conv2d(dim, dim, 3, stride=2))
            if mode == "downsample3d":
                self.time_conv = CausalConv3d(dim, dim, (3, 1, 1), stride=(2, 1, 1))

    def forward(self, x: torch.Tensor, cache: FeatureCache) -> torch.Tensor:
        if self.mode == "upsample3d":
            x = self._time_upsample(x, cache)
        x = self._spatial(x)
        if self.mode == "downsample3d":
            x = self._time_downsample(x, cache)
        return x

    def _spatial(self, x: torch.Tensor) -> torch.Tensor:
        # frame by frame into one output: the x2-upsampled input never exists for all frames at once
        b, _, t, h, w = x.shape
        if t == 1:  # one frame: its result as it comes (no copy; channels last stays channels last)
            return self.resample(x[:, :, 0]).unsqueeze(2)
        out = None
        for i in range(t):
            y = self.resample(x[:, :, i])
            if out is None:
                out = y.new_empty(b, y.shape[1], t, y.shape[2], y.shape[3])
            out[:, :, i] = y
            del y
        return out

    def _time_upsample(self, x: torch.Tensor, cache: FeatureCache) -> torch.Tensor:
        state = cache.get(self)
        if state is None:  # first chunk: passes through, one frame stays one frame
            cache[self] = FIRST_CHUNK
            return x
        first = state is FIRST_CHUNK
        keep = x[:, :, -CACHE_FRAMES:]
        if keep.shape[2] < CACHE_FRAMES:
            pad = torch.zeros_like(keep) if first else state[:, :, -1:]
            keep = torch.cat([pad, keep], dim=2)
        else:
            keep = keep.clone()
        # after the first chunk the history is zeros (the conv's own causal padding), then the cache
        y = self.time_conv.conv_after(x, None if first else state)
        cache[self] = keep
        # the 2C output channels are two frames each (first C = the earlier one), interleaved in time
        return rearrange(y, "b (two c) t h w -> b c (t two) h w", two=2)

    def _time_downsample(self, x: torch.Tensor, cache: FeatureCache) -> torch.Tensor:
        state = cache.get(self)
        cache[self] = x[:, :, -1:].clone()
        if state is None:  # first chunk: no time conv
            return x
        return self.time_conv(torch.cat([state, x], dim=2))
