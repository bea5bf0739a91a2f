"""Wan2.1 causal video VAE (spec §8): chunked encode/decode with a causal feature cache, optional tiling.

`WanVAE(cfg).state_dict()` has exactly the keys and shapes of the release's `Wan2.1_VAE.pth` and ComfyUI's
`wan_2.1_vae.safetensors` (194 tensors, 126,892,531 parameters at full size). The model can be built on the
`meta` device and filled by a loader (`loaders/vae_files.py`).

Latent spaces: `encode`/`decode` work in the *normalised* space the DiT sees, z = (mu - mean) / std;
`encode_raw`/`decode_raw` work with the raw encoder mean mu (what ComfyUI's LATENT holds for Wan).
Everything runs in float32. Spatial tiling (`tiled=True`) bounds memory at 720p; the untiled path is the
reference computation.

Memory: the full-resolution layers (before the first temporal downsample, after the last temporal upsample)
run one frame at a time through the same causal cache, which gives the same sums as the reference's 4-frame
chunks; what remains is mostly the cache itself (two frames per causal conv, three in the decoder's
full-resolution rings, blocks.FrameRing). Measured on an H100 at 464x832x81 before the rings: decode 2.8 s / 6.7 GB
peak untiled, 3.1 s / 4.3 GB tiled (64-cell tiles; bench/bench_vae.py); the rings took a 12-frame chunk's decode
from 0.42 to 0.31 s and its peak from 6.9 to 7.4 GB (BENCHMARKS).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional, Sequence, Tuple, Union

import torch
import torch.nn as nn
import torch.nn.functional as F

from .blocks import AttentionBlock, CausalConv3d, FeatureCache, NormSilu, Resample, ResidualBlock, RMSNorm

LATENT_MEAN = (-0.7571, -0.7089, -0.9113, 0.1075, -0.1745, 0.9653, -0.1517, 1.5508,
               0.4134, -0.0715, 0.5517, -0.3632, -0.1922, -0.9497, 0.2503, -0.2921)
LATENT_STD = (2.8184, 1.4541, 2.3275, 2.6558, 1.2196, 1.7708, 2.6052, 2.0743,
              3.2687, 2.1526, 2.8652, 1.5579, 1.6382, 1.1253, 2.8251, 1.9160)

DEFAULT_TILE = 64  # latent cells (512 px): largest tile edge for tiled encode/decode
DEFAULT_OVERLAP = 8  # latent cells (64 px) shared by neighbouring tiles, blended with linear ramps
SIZE_MULTIPLE = 16  # pixel sizes: 8 for the VAE times the DiT's 2x2 patch

TileArg = Union[int, Tuple[int, int]]


@dataclass(frozen=True)
class VAEConfig:
    dim: int = 96
    z_dim: int = 16
    dim_mult: Tuple[int, ...] = (1, 2, 4, 4)
    num_res_blocks: int = 2
    temporal_downsample: Tuple[bool, ...] = (False, True, True)
    dropout: float = 0.0
    latent_mean: Tuple[float, ...] = LATENT_MEAN
    latent_std: Tuple[float, ...] = LATENT_STD

    def __post_init__(self):
        if len(self.temporal_downsample) != len(self.dim_mult) - 1:
            raise ValueError(
                f"temporal_downsample needs {len(self.dim_mult) - 1} entries (one per downsampling level), "
                f"got {len(self.temporal_downsample)}"
            )
        if len(self.latent_mean) != self.z_dim or len(self.latent_std) != self.z_dim:
            raise ValueError(f"latent_mean/latent_std need z_dim={self.z_dim} entries each")

    @property
    def spatial_factor(self) -> int:
        return 2 ** (len(self.dim_mult) - 1)

    @property
    def temporal_factor(self) -> int:
        return 2 ** sum(bool(t) for t in self.temporal_downsample)

    @classmethod
    def tiny(cls, **over) -> "VAEConfig":
        """Same structure and strides (4 in time, 8 in space, 16 latent channels), few channels."""
        base = dict(dim=8, dim_mult=(1, 2, 2, 2), num_res_blocks=1)
        base.update(over)
        return cls(**base)


class Encoder(nn.Module):
    def __init__(self, cfg: VAEConfig):
        super().__init__()
        dims = [cfg.dim * m for m in (1, *cfg.dim_mult)]
        self.conv1 = CausalConv3d(3, dims[0], 3, padding=1)
        layers = []
        for i, (cin, cout) in enumerate(zip(dims[:-1], dims[1:])):
            for _ in range(cfg.num_res_blocks):
                layers.append(ResidualBlock(cin, cout, cfg.dropout))
                cin = cout
            if i < len(cfg.dim_mult) - 1:
                layers.append(Resample(cout, "downsample3d" if cfg.temporal_downsample[i] else "downsample2d"))
        self.downsamples = nn.Sequential(*layers)
        top = dims[-1]
        self.middle = nn.Sequential(ResidualBlock(top, top, cfg.dropout), AttentionBlock(top),
                                    ResidualBlock(top, top, cfg.dropout))
        self.head = nn.Sequential(RMSNorm(top), nn.SiLU(), CausalConv3d(top, cfg.z_dim * 2, 3, padding=1))
        # the full-resolution layers before the first temporal downsample run one frame at a time
        self._stem_len = next((i for i, m in enumerate(self.downsamples) if _is_temporal(m)), len(self.downsamples))

    def _stem(self, x: torch.Tensor, cache: FeatureCache) -> torch.Tensor:
        x = self.conv1(x, cache)
        for layer in self.downsamples[:self._stem_len]:
            x = layer(x, cache)
        return x

    def forward(self, x: torch.Tensor, cache: FeatureCache) -> torch.Tensor:
        x = framewise(lambda f: self._stem(f, cache), x)
        for layer in (*self.downsamples[self._stem_len:], *self.middle):
            x = layer(x, cache)
        return self.head[2](F.silu(self.head[0](x), inplace=True), cache)


class Decoder(nn.Module):
    def __init__(self, cfg: VAEConfig):
        super().__init__()
        dims = [cfg.dim * m for m in (cfg.dim_mult[-1], *reversed(cfg.dim_mult))]
        temporal_upsample = tuple(reversed(cfg.temporal_downsample))
        top = dims[0]
        self.conv1 = CausalConv3d(cfg.z_dim, top, 3, padding=1)
        self.middle = nn.Sequential(ResidualBlock(top, top, cfg.dropout), AttentionBlock(top),
                                    ResidualBlock(top, top, cfg.dropout))
        layers = []
        for i, (cin, cout) in enumerate(zip(dims[:-1], dims[1:])):
            if i > 0:
                cin //= 2  # the previous level's upsampler halved the channels
            for _ in range(cfg.num_res_blocks + 1):
                layers.append(ResidualBlock(cin, cout, cfg.dropout))
                cin = cout
            if i < len(cfg.dim_mult) - 1:
                layers.append(Resample(cout, "upsample3d" if temporal_upsample[i] else "upsample2d"))
        self.upsamples = nn.Sequential(*layers)
        self.head = nn.Sequential(RMSNorm(dims[-1]), nn.SiLU(), CausalConv3d(dims[-1], 3, 3, padding=1))
        # the full-resolution layers after the last temporal upsample run one frame at a time
        temporal = [i for i, m in enumerate(self.upsamples) if _is_temporal(m)]
        self._tail_start = temporal[-1] + 1 if temporal else 0

    def _tail(self, x: torch.Tensor, cache: FeatureCache, norm_silu: Optional[NormSilu]) -> torch.Tensor:
        # one frame at a time: the residual blocks and the head step through FrameRings (blocks.py)
        for layer in self.upsamples[self._tail_start:]:
            x = layer.step(x, cache, norm_silu) if isinstance(layer, ResidualBlock) else layer(x, cache)
        return self.head[2].step(self.head[0], x, cache, norm_silu)

    def forward(self, x: torch.Tensor, cache: FeatureCache, norm_silu: Optional[NormSilu] = None) -> torch.Tensor:
        """norm_silu: the tail's norm + SiLU into a ring slot (None: blocks.norm_silu_into)."""
        x = self.conv1(x, cache)
        for layer in (*self.middle, *self.upsamples[:self._tail_start]):
            x = layer(x, cache)
        return framewise(lambda f: self._tail(f, cache, norm_silu), x)


def _is_temporal(m: nn.Module) -> bool:
    return isinstance(m, Resample) and m.mode.endswith("3d")


def framewise(fn, x: torch.Tensor) -> torch.Tensor:
    """`fn` over the frames of `x` one at a time, results concatenated in time.

    For layers whose only temporal operators are causal 3-tap convs, a chunk of T frames gives the same result
    as T one-frame chunks through the same cache (the cache is a sliding window of the last two inputs),
    while only one frame's full-resolution activations exist at a time.
    """
    if x.shape[2] == 1:
        return fn(x)
    return torch.cat([fn(x[:, :, i:i + 1]) for i in range(x.shape[2])], dim=2)


def nearest_valid(value: int, step: int, offset: int = 0) -> Tuple[int, int]:
    """The closest valid values of the form offset + k*step (positive) below and above `value`."""
    k = max(0 if offset > 0 else 1, (value - offset) // step)
    low = offset + k * step
    return (low, low + step) if low < value else (low, low)


def check_video_size(frames: int, height: int, width: int, multiple: int = SIZE_MULTIPLE,
                     temporal: int = 4) -> None:
    """Refuse frame counts that are not 4n+1 and sizes that are not multiples of 16, naming valid ones."""
    problems = []
    if frames < 1 or (frames - 1) % temporal:
        lo, hi = nearest_valid(frames, temporal, 1)
        problems.append(f"frames={frames} is not {temporal}n+1 (nearest valid: {lo} or {hi})"
                        if lo != hi else f"frames={frames} is not {temporal}n+1 (use {lo})")
    for name, v in (("height", height), ("width", width)):
        if v < multiple or v % multiple:
            lo, hi = nearest_valid(v, multiple)
            problems.append(f"{name}={v} is not a multiple of {multiple} (nearest valid: {lo} or {hi})"
                            if lo != hi else f"{name}={v} is not a multiple of {multiple} (use {lo})")
    if problems:
        raise ValueError("invalid video size: " + "; ".join(problems))


def tile_spans(length: int, tile: int, overlap: int) -> list:
    """Start/end pairs of equal tiles of at most `tile` cells covering `length`, neighbours sharing >= `overlap`.

    Uses the fewest tiles that fit, each only as large as needed (so no work is wasted on excess overlap),
    with starts spread evenly: the last tile ends exactly at `length`.
    """
    if length <= tile:
        return [(0, length)]
    if not 0 <= overlap < tile:
        raise ValueError(f"tile overlap {overlap} must be >= 0 and smaller than the tile size {tile}")
    n = math.ceil((length - overlap) / (tile - overlap))
    size = math.ceil((length + (n - 1) * overlap) / n)
    starts = [round(i * (length - size) / (n - 1)) for i in range(n)]
    return [(s, s + size) for s in starts]


def ramp_weights(spans: Sequence[Tuple[int, int]], scale: int) -> list:
    """Per-tile 1D blend weights (output units = cells * scale): linear ramps across each shared border."""
    out = []
    for k, (s, e) in enumerate(spans):
        w = torch.ones((e - s) * scale)
        if k > 0:
            n = (spans[k - 1][1] - s) * scale
            w[:n] = torch.minimum(w[:n], torch.arange(1, n + 1) / (n + 1))
        if k < len(spans) - 1:
            n = (e - spans[k + 1][0]) * scale
            w[-n:] = torch.minimum(w[-n:], torch.arange(n, 0, -1) / (n + 1))
        out.append(w)
    return out


def _pair(v: TileArg) -> Tuple[int, int]:
    return (v, v) if isinstance(v, int) else (int(v[0]), int(v[1]))


class WanVAE(nn.Module):
    """The Wan2.1 VAE: `encoder`, `conv1` (to mu/logvar), `conv2` (latent in), `decoder`."""

    def __init__(self, cfg: Optional[VAEConfig] = None):
        super().__init__()
        self.cfg = cfg = cfg or VAEConfig()
        self.encoder = Encoder(cfg)
        self.conv1 = CausalConv3d(cfg.z_dim * 2, cfg.z_dim * 2, 1)
        self.conv2 = CausalConv3d(cfg.z_dim, cfg.z_dim, 1)
        self.decoder = Decoder(cfg)

    @property
    def device(self) -> torch.device:
        return self.conv1.weight.device

    # ---- latent normalisation (the reference multiplies by 1/std and divides by it on the way back)

    def _stats(self, like: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        shape = (1, self.cfg.z_dim, 1, 1, 1)
        mean = torch.tensor(self.cfg.latent_mean, dtype=torch.float32, device=like.device).view(shape)
        inv_std = 1.0 / torch.tensor(self.cfg.latent_std, dtype=torch.float32, device=like.device).view(shape)
        return mean, inv_std

    def normalize(self, mu: torch.Tensor) -> torch.Tensor:
        """Raw encoder mean -> the DiT's latent space: (mu - mean) * (1/std)."""
        self._check_latent(mu)
        mean, inv_std = self._stats(mu)
        return (mu.float() - mean) * inv_std

    def denormalize(self, z: torch.Tensor) -> torch.Tensor:
        """The DiT's latent space -> raw mu: z / (1/std) + mean."""
        self._check_latent(z)
        mean, inv_std = self._stats(z)
        return z.float() / inv_std + mean

    # ---- encode

    def encode(self, video: torch.Tensor, *, tiled: bool = False, tile: TileArg = DEFAULT_TILE,
               overlap: int = DEFAULT_OVERLAP) -> torch.Tensor:
        """`[B,3,F,H,W]` in [-1,1] (F = 4n+1, H and W multiples of 16) -> normalised z `[B,16,F_lat,H/8,W/8]`."""
        return self.normalize(self.encode_raw(video, tiled=tiled, tile=tile, overlap=overlap))

    def encode_raw(self, video: torch.Tensor, *, tiled: bool = False, tile: TileArg = DEFAULT_TILE,
                   overlap: int = DEFAULT_OVERLAP) -> torch.Tensor:
        """Like `encode` but returns the raw encoder mean mu (ComfyUI's LATENT for Wan)."""
        if video.dim() != 5 or video.shape[1] != 3:
            raise ValueError(f"expected a video tensor [B,3,F,H,W], got shape {tuple(video.shape)}")
        b, _, f, h, w = video.shape
        check_video_size(f, h, w, temporal=self.cfg.temporal_factor)
        s = self.cfg.spatial_factor
        lat = (b, self.cfg.z_dim, 1 + (f - 1) // self.cfg.temporal_factor, h // s, w // s)
        mu = torch.empty(lat, dtype=torch.float32, device=self.device)  # a normal tensor, filled below
        with torch.inference_mode():
            if not tiled:
                self._encode_into(mu, video)
            else:
                th, tw = _pair(tile)
                self._blend_tiles(mu, lambda ys, xs: self._encode_tile(video, ys, xs, s),
                                  tile_spans(lat[3], th, overlap), tile_spans(lat[4], tw, overlap), 1)
        return mu

    def _encode_tile(self, video: torch.Tensor, ys: Tuple[int, int], xs: Tuple[int, int], s: int) -> torch.Tensor:
        part = video[:, :, :, ys[0] * s:ys[1] * s, xs[0] * s:xs[1] * s]
        out = torch.empty(part.shape[0], self.cfg.z_dim, 1 + (part.shape[2] - 1) // self.cfg.temporal_factor,
                          ys[1] - ys[0], xs[1] - xs[0], device=self.device)
        self._encode_into(out, part)
        return out

    def _encode_into(self, mu: torch.Tensor, video: torch.Tensor) -> None:
        """Frame 0 alone, then chunks of 4 frames, one latent frame each, sharing one causal cache."""
        cache: FeatureCache = {}
        step = self.cfg.temporal_factor
        for i in range(mu.shape[2]):
            chunk = video[:, :, :1] if i == 0 else video[:, :, 1 + step * (i - 1):1 + step * i]
            h = self.encoder(chunk.to(self.device, torch.float32), cache)
            mu[:, :, i:i + 1] = self.conv1(h)[:, :self.cfg.z_dim]  # logvar is never used
            del h

    # ---- decode

    def decode(self, z: torch.Tensor, *, tiled: bool = False, tile: TileArg = DEFAULT_TILE,
               overlap: int = DEFAULT_OVERLAP, norm_silu: Optional[NormSilu] = None) -> torch.Tensor:
        """Normalised z `[B,16,F_lat,h,w]` -> video `[B,3,1+4(F_lat-1),8h,8w]` float32 clamped to [-1,1].
        norm_silu: the decoder tail's norm + SiLU (None: the eager ops; speed/vae_norm.py fuses them)."""
        return self.decode_raw(self.denormalize(z), tiled=tiled, tile=tile, overlap=overlap, norm_silu=norm_silu)

    def decode_raw(self, mu: torch.Tensor, *, tiled: bool = False, tile: TileArg = DEFAULT_TILE,
                   overlap: int = DEFAULT_OVERLAP, norm_silu: Optional[NormSilu] = None) -> torch.Tensor:
        """Like `decode` but from raw latents mu."""
        self._check_latent(mu)
        b, _, t, h, w = mu.shape
        s = self.cfg.spatial_factor
        out = torch.empty(b, 3, 1 + self.cfg.temporal_factor * (t - 1), h * s, w * s, device=self.device)
        with torch.inference_mode():
            if not tiled:
                self._decode_into(out, mu, None, norm_silu)
            else:
                th, tw = _pair(tile)
                self._blend_tiles(out, lambda ys, xs: self._decode_tile(mu, ys, xs, norm_silu),
                                  tile_spans(h, th, overlap), tile_spans(w, tw, overlap), s)
        return out.clamp_(-1.0, 1.0)

    def _decode_tile(self, mu: torch.Tensor, ys: Tuple[int, int], xs: Tuple[int, int],
                     norm_silu: Optional[NormSilu] = None) -> torch.Tensor:
        part = mu[:, :, :, ys[0]:ys[1], xs[0]:xs[1]]
        s = self.cfg.spatial_factor
        out = torch.empty(part.shape[0], 3, 1 + self.cfg.temporal_factor * (part.shape[2] - 1),
                          part.shape[3] * s, part.shape[4] * s, device=self.device)
        self._decode_into(out, part, None, norm_silu)
        return out

    def _decode_into(self, out: torch.Tensor, mu: torch.Tensor, cache: Optional[FeatureCache] = None,
                     norm_silu: Optional[NormSilu] = None) -> None:
        """One latent frame at a time through the decoder, sharing one causal cache (unclamped).

        cache: continue a decode whose earlier latent frames went through it (streaming decode); `out` then
        receives only this part's frames (4 per latent frame, plus 1 for the video's first)."""
        cache = {} if cache is None else cache
        t0 = 0
        for i in range(mu.shape[2]):
            # conv2 (1x1x1) per latent frame, so a streaming decode computes exactly the same sums
            frames = self.decoder(self.conv2(mu[:, :, i:i + 1].to(self.device, torch.float32)), cache, norm_silu)
            out[:, :, t0:t0 + frames.shape[2]] = frames
            t0 += frames.shape[2]
            del frames

    # ---- tiling

    @staticmethod
    def _blend_tiles(out: torch.Tensor, run_tile, ys_spans, xs_spans, scale: int) -> None:
        """Fill `out` with tiles from `run_tile(ys, xs)` (in latent cells), blended by linear ramps.

        Every tile goes through the whole temporal pipeline on its own; only one tile's result is alive at
        a time besides `out` and an H x W weight sum.
        """
        wy = ramp_weights(ys_spans, scale)
        wx = ramp_weights(xs_spans, scale)
        wsum = torch.zeros(out.shape[-2:], device=out.device)
        out.zero_()
        for ys, wyk in zip(ys_spans, wy):
            for xs, wxk in zip(xs_spans, wx):
                w2 = (wyk[:, None] * wxk[None, :]).to(out.device)
                region = (..., slice(ys[0] * scale, ys[1] * scale), slice(xs[0] * scale, xs[1] * scale))
                tile = run_tile(ys, xs)
                out[region] += tile * w2
                wsum[region[1:]] += w2
                del tile
        out /= wsum

    def _check_latent(self, z: torch.Tensor) -> None:
        if z.dim() != 5 or z.shape[1] != self.cfg.z_dim:
            raise ValueError(f"expected latents [B,{self.cfg.z_dim},F_lat,h,w], got shape {tuple(z.shape)}")
