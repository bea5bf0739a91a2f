"""How far one video is from another: PSNR and SSIM of decoded frames, and the drift of a K/V cache.

- PSNR: on uint8 frames, peak 255, from the mean squared error over every pixel and channel of the frames given
  (a chunk's frames give one number). Identical frames give `math.inf` (no cap: the caller says how it shows it).
- SSIM: the Gaussian-window SSIM of Wang, Bovik, Sheikh and Simoncelli (2004): an 11x11 window of sigma 1.5,
  K1 = 0.01, K2 = 0.03, L = 255, the statistics over the window's valid positions only (no padding), on the luma
  (BT.601: Y = 0.299 R + 0.587 G + 0.114 B) of each frame; a frame's SSIM is the mean of its map, a chunk's the
  mean of its frames'. Frames smaller than 11 pixels use the largest odd window that fits (the same
  sigma, the Gaussian cut there and normalised again).
- K/V drift: per tensor, the cosine similarity <a, b> / (|a| |b|) and the relative L2 |a - b| / |b| of the values
  as float32 (bf16, fp16 and float32 caches all are exactly), b the reference; products and sums in float64, over
  blocks of tokens, so a layer needs no full-size copy of itself. Identical tensors give exactly cosine 1 and
  relative L2 0.

Everything here is plain torch maths on host tensors: no model, no file.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence, Union

import numpy as np
import torch

PEAK = 255.0
SSIM_WINDOW = 11
SSIM_SIGMA = 1.5
SSIM_K1, SSIM_K2 = 0.01, 0.03
LUMA = (0.299, 0.587, 0.114)  # BT.601
DRIFT_BLOCK_TOKENS = 1024  # tokens per block of the drift sums (bounds the float64 temporaries)

Frames = Union[np.ndarray, torch.Tensor]


def _frames(x: Frames, name: str) -> torch.Tensor:
    t = torch.as_tensor(np.asarray(x)) if not isinstance(x, torch.Tensor) else x
    if t.dtype != torch.uint8 or t.dim() != 4 or t.shape[-1] != 3:
        raise ValueError(f"{name}: frames must be uint8 [n, H, W, 3], got {t.dtype} {tuple(t.shape)}")
    return t.detach().to("cpu")


def _pair(a: Frames, b: Frames) -> tuple[torch.Tensor, torch.Tensor]:
    a, b = _frames(a, "a"), _frames(b, "b")
    if a.shape != b.shape:
        raise ValueError(f"frames of different shapes: {tuple(a.shape)} and {tuple(b.shape)}")
    return a, b


def psnr(a: Frames, b: Frames) -> float:
    """PSNR in dB of uint8 frames `a` against `b` (peak 255) over all their pixels; inf when identical."""
    a, b = _pair(a, b)
    mse = _mse(a, b)
    return math.inf if mse == 0 else 10.0 * math.log10(PEAK * PEAK / mse)


def psnr_per_frame(a: Frames, b: Frames) -> list[float]:
    a, b = _pair(a, b)
    return [psnr(a[i:i + 1], b[i:i + 1]) for i in range(a.shape[0])]


def _mse(a: torch.Tensor, b: torch.Tensor) -> float:
    d = a.to(torch.float64) - b.to(torch.float64)
    return float((d * d).mean())


def luma(frames: torch.Tensor) -> torch.Tensor:
    """[n, H, W, 3] uint8 -> [n, 1, H, W] float64 luma on 0..255."""
    w = torch.tensor(LUMA, dtype=torch.float64)
    return (frames.to(torch.float64) * w).sum(-1).unsqueeze(1)


def gaussian_window(size: int = SSIM_WINDOW, sigma: float = SSIM_SIGMA) -> torch.Tensor:
    """The normalised 1-D Gaussian [size] (float64) the SSIM window is the outer product of."""
    x = torch.arange(size, dtype=torch.float64) - (size - 1) / 2
    g = torch.exp(-(x * x) / (2 * sigma * sigma))
    return g / g.sum()


def _window_size(h: int, w: int) -> int:
    size = min(SSIM_WINDOW, h, w)
    return size if size % 2 else size - 1


def _filter(x: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
    """Separable 'valid' filtering of [n, 1, H, W] with the window g (x then y)."""
    k = g.numel()
    x = torch.nn.functional.conv2d(x, g.view(1, 1, 1, k))
    return torch.nn.functional.conv2d(x, g.view(1, 1, k, 1))


def ssim_per_frame(a: Frames, b: Frames) -> list[float]:
    """The mean SSIM of each frame's luma (see the module docstring)."""
    a, b = _pair(a, b)
    if a.shape[1] < 1 or a.shape[2] < 1:
        raise ValueError("frames without pixels")
    x, y = luma(a), luma(b)
    g = gaussian_window(_window_size(a.shape[1], a.shape[2]))
    c1, c2 = (SSIM_K1 * PEAK) ** 2, (SSIM_K2 * PEAK) ** 2
    mx, my = _filter(x, g), _filter(y, g)
    sxx = _filter(x * x, g) - mx * mx
    syy = _filter(y * y, g) - my * my
    sxy = _filter(x * y, g) - mx * my
    smap = ((2 * mx * my + c1) * (2 * sxy + c2)) / ((mx * mx + my * my + c1) * (sxx + syy + c2))
    out = smap.mean(dim=(1, 2, 3))
    same = (a == b).flatten(1).all(1)  # identical frames: exactly 1 (the map's rounding can miss it by 1e-16)
    return [1.0 if s else float(v) for v, s in zip(out, same)]


def ssim(a: Frames, b: Frames) -> float:
    """The mean of the frames' SSIM."""
    per = ssim_per_frame(a, b)
    return float(sum(per) / len(per))


@dataclass(frozen=True)
class FrameQuality:
    """Frames against the reference's: PSNR over them all (inf: identical), mean SSIM, and both per frame."""

    psnr: float
    ssim: float
    psnr_per_frame: tuple[float, ...]
    ssim_per_frame: tuple[float, ...]

    @property
    def identical(self) -> bool:
        return math.isinf(self.psnr)


def frame_quality(a: Frames, b: Frames) -> FrameQuality:
    """`a` (the frames compared) against `b` (the reference's)."""
    ssims = ssim_per_frame(a, b)
    return FrameQuality(psnr(a, b), float(sum(ssims) / len(ssims)), tuple(psnr_per_frame(a, b)), tuple(ssims))


# ---- K/V drift ------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Drift:
    """One tensor against the reference's: cosine similarity and relative L2 (|a - b| / |b|)."""

    cosine: float
    rel_l2: float


def drift(a: torch.Tensor, b: torch.Tensor, block: int = DRIFT_BLOCK_TOKENS) -> Drift:
    """`a` against the reference `b` (same shape, any float dtype, [B, tokens, ...]): their float32 values, float64
    products and sums over blocks of `block` tokens. Identical tensors: exactly (1, 0). A zero reference: rel L2 inf unless a is zero
    too; a zero tensor's cosine is 0 (1 when both are zero)."""
    if a.shape != b.shape:
        raise ValueError(f"K/V of different shapes: {tuple(a.shape)} and {tuple(b.shape)}")
    if torch.equal(a, b):
        return Drift(1.0, 0.0)
    dot = aa = bb = dd = 0.0
    tokens = a.shape[1] if a.dim() > 1 else a.shape[0]
    for s in range(0, max(tokens, 1), block):
        x = (a[:, s:s + block] if a.dim() > 1 else a[s:s + block]).to(torch.float32).to(torch.float64)
        y = (b[:, s:s + block] if b.dim() > 1 else b[s:s + block]).to(torch.float32).to(torch.float64)
        dot += float(torch.sum(x * y))
        aa += float(torch.sum(x * x))
        bb += float(torch.sum(y * y))
        diff = x - y
        dd += float(torch.sum(diff * diff))
    if aa == 0 or bb == 0:
        cosine = 1.0 if aa == bb else 0.0
    else:
        cosine = max(-1.0, min(1.0, dot / math.sqrt(aa * bb)))
    rel = math.sqrt(dd / bb) if bb > 0 else (0.0 if dd == 0 else math.inf)
    return Drift(cosine, rel)


@dataclass(frozen=True)
class LayerDrift:
    """One layer's K and V against the reference's, and their mean."""

    k: Drift
    v: Drift

    @property
    def cosine(self) -> float:
        return (self.k.cosine + self.v.cosine) / 2

    @property
    def rel_l2(self) -> float:
        return (self.k.rel_l2 + self.v.rel_l2) / 2


@dataclass(frozen=True)
class CacheDrift:
    """A whole cache against the reference's at one chunk boundary: per layer, and averaged over the layers (each
    layer's value being the mean of its K's and its V's). tokens: the tokens both caches hold, compared."""

    layers: tuple[LayerDrift, ...]
    tokens: int

    @property
    def cosine(self) -> float:
        return _mean([layer.cosine for layer in self.layers])

    @property
    def rel_l2(self) -> float:
        return _mean([layer.rel_l2 for layer in self.layers])


def _mean(values: Sequence[float]) -> float:
    return float(sum(values) / len(values)) if values else math.nan


# ---- two caches at one chunk boundary -------------------------------------------------------------------------
@dataclass(frozen=True)
class CacheSpan:
    """Which video tokens a cache holds, from its counters: the first `sink_tokens` (never evicted) and the latest
    ones, in slot order (what memory/kv_park.placement_layers yields): global_end tokens seen, local_end held."""

    global_end: int
    local_end: int
    sink_tokens: int

    def held(self) -> np.ndarray:
        """The video token of each slot [local_end]."""
        sink = min(self.sink_tokens, self.local_end)
        tail = self.local_end - sink
        return np.concatenate([np.arange(sink), np.arange(self.global_end - tail, self.global_end)]).astype(np.int64)


def common_slots(a: CacheSpan, b: CacheSpan) -> tuple[torch.Tensor, torch.Tensor]:
    """(slots of a, slots of b) holding the same video tokens, in token order: two caches with different windows
    (a preset's cap) hold different tokens once one has evicted; only the tokens both hold are compared."""
    if a.global_end != b.global_end:
        raise ValueError(f"caches at different chunk boundaries: video token {a.global_end} and {b.global_end}")
    _, ia, ib = np.intersect1d(a.held(), b.held(), assume_unique=True, return_indices=True)
    return torch.from_numpy(ia), torch.from_numpy(ib)


def _select(t: torch.Tensor, slots: torch.Tensor) -> torch.Tensor:
    n = slots.numel()
    if n == t.shape[1] and (n == 0 or (int(slots[0]) == 0 and bool((slots[1:] - slots[:-1] == 1).all()))):
        return t  # every slot, in order: no copy
    return t.index_select(1, slots.to(t.device))


def cache_drift(layers, span: CacheSpan, ref_layers, ref_span: CacheSpan) -> CacheDrift:
    """A cache (`layers`: each layer's (K, V) [B, local_end, heads, head_dim] on the host, one at a time, as
    memory/kv_park.placement_layers yields them) against the reference's, on the tokens both hold, layer by layer:
    one layer of each is in memory at a time."""
    ia, ib = common_slots(span, ref_span)
    out = []
    for i, pair in enumerate(_zip_layers(layers, ref_layers)):
        (k, v), (rk, rv) = pair
        if k.shape[1] != span.local_end or rk.shape[1] != ref_span.local_end:
            raise ValueError(f"layer {i}: {k.shape[1]} and {rk.shape[1]} slots for caches holding {span.local_end} "
                             f"and {ref_span.local_end} tokens")
        out.append(LayerDrift(drift(_select(k, ia), _select(rk, ib)), drift(_select(v, ia), _select(rv, ib))))
    return CacheDrift(tuple(out), int(ia.numel()))


def _zip_layers(a, b):
    a, b = iter(a), iter(b)
    n = 0
    while True:
        x, y = next(a, None), next(b, None)
        if x is None and y is None:
            return
        if x is None or y is None:
            raise ValueError(f"caches with different numbers of layers (one ends after {n})")
        n += 1
        yield x, y
