"""Streaming decode: a latent video decoded chunk by chunk as it is generated (the Fast model's chunks).

The Wan VAE decoder is causal in time: each latent frame needs only the feature cache left by the frames before
it. `StreamingDecoder` keeps that cache (one per spatial tile when tiled) between calls, so decoding the chunks
one after another runs exactly the operations of one whole-video decode: the frames are bit-identical
(tests/test_fast_decode.py). The first chunk of n latent frames gives 1 + 4(n-1) frames, every later one 4n.
"""
from __future__ import annotations

import functools
from typing import Optional

import torch

from .blocks import FeatureCache, FrameRing, NormSilu
from .model import DEFAULT_OVERLAP, DEFAULT_TILE, TileArg, VAEConfig, WanVAE, _pair, tile_spans


class StreamingDecoder:
    """`decode(z_chunk)` / `decode_raw(mu_chunk)` -> this chunk's frames [B, 3, T, 8h, 8w] in [-1, 1] (float32)."""

    def __init__(self, vae: WanVAE, *, tiled: bool = False, tile: TileArg = DEFAULT_TILE,
                 overlap: int = DEFAULT_OVERLAP, norm_silu: Optional[NormSilu] = None):
        self.vae = vae
        self.norm_silu = norm_silu  # the tail's norm + SiLU (None: the eager ops; speed/vae_norm.py fuses them)
        self.tiled = tiled
        self.tile = _pair(tile)
        self.overlap = overlap
        self.caches: dict = {}  # (rows, cols) of a tile -> its causal feature cache; (None, None) untiled
        self.latent_frames = 0  # decoded so far
        self.shape: Optional[tuple] = None  # (B, h, w) of the latent, fixed by the first chunk

    @property
    def frames(self) -> int:
        """Video frames produced so far."""
        t = self.vae.cfg.temporal_factor
        return 0 if self.latent_frames == 0 else 1 + t * (self.latent_frames - 1)

    def decode(self, z: torch.Tensor) -> torch.Tensor:
        """Normalised latent chunk (what the DiT samples) -> its frames."""
        return self.decode_raw(self.vae.denormalize(z))

    def decode_raw(self, mu: torch.Tensor) -> torch.Tensor:
        """Raw latent chunk -> its frames."""
        vae = self.vae
        vae._check_latent(mu)
        b, _, n, h, w = mu.shape
        if self.shape is None:
            self.shape = (b, h, w)
        elif self.shape != (b, h, w):
            raise ValueError(f"latent chunk {tuple(mu.shape)} does not continue the video of batch/size {self.shape}")
        s, t = vae.cfg.spatial_factor, vae.cfg.temporal_factor
        first = self.latent_frames == 0
        count = t * n - (t - 1 if first else 0)
        out = torch.empty(b, 3, count, h * s, w * s, device=vae.device)
        with torch.inference_mode():
            if not self.tiled:
                vae._decode_into(out, mu, self.caches.setdefault((None, None), {}), self.norm_silu)
            else:
                vae._blend_tiles(out, lambda ys, xs: self._tile(mu, ys, xs, first),
                                 tile_spans(h, self.tile[0], self.overlap), tile_spans(w, self.tile[1], self.overlap), s)
        self.latent_frames += n
        return out.clamp_(-1.0, 1.0)

    def _tile(self, mu: torch.Tensor, ys: tuple, xs: tuple, first: bool) -> torch.Tensor:
        vae = self.vae
        part = mu[:, :, :, ys[0]:ys[1], xs[0]:xs[1]]
        s, t = vae.cfg.spatial_factor, vae.cfg.temporal_factor
        count = t * part.shape[2] - (t - 1 if first else 0)
        out = torch.empty(part.shape[0], 3, count, part.shape[3] * s, part.shape[4] * s, device=vae.device)
        cache: FeatureCache = self.caches.setdefault((ys, xs), {})
        vae._decode_into(out, part, cache, self.norm_silu)
        return out

    def close(self) -> None:
        """Drop the feature caches (two frames per causal conv, three per full-resolution ring)."""
        self.caches.clear()


@functools.lru_cache(maxsize=8)
def _decoder_footprint(cfg: VAEConfig) -> tuple[int, float, float]:
    """(parameter count, ring bytes per latent cell, other feature-cache bytes per latent cell) of a float32
    streaming decode, from a dry run on `meta`."""
    with torch.device("meta"):
        vae = WanVAE(cfg)
    cache: FeatureCache = {}
    side = 2
    mu = torch.empty(1, cfg.z_dim, 2, side, side, device="meta")
    out = torch.empty(1, 3, 1 + cfg.temporal_factor, side * cfg.spatial_factor, side * cfg.spatial_factor,
                      device="meta")
    with torch.inference_mode():
        vae._decode_into(out, mu, cache)
    rings = sum(v.nbytes for v in cache.values() if isinstance(v, FrameRing))
    kept = sum(v.numel() * v.element_size() for v in cache.values() if isinstance(v, torch.Tensor))
    return sum(p.numel() for p in vae.parameters()), rings / (side * side), kept / (side * side)


def streaming_decode_bytes(cfg: VAEConfig, height: int, width: int, tiled: bool = False, half: bool = False) -> int:
    """Device bytes a StreamingDecoder needs while it lives: weights, the causal feature caches (kept between
    chunks: about 5.3 GB at 480x832 in float32, most of it the full-resolution rings holding three frames each)
    and one frame's full-resolution activations. Tiling does not shrink the caches here (every tile keeps its own
    until the video ends).

    half: the decode runs under fp16 or bf16 autocast (the presets' decode levers). Its rings are stored in that
    dtype (blocks.ring_dtype), half the bytes; the other caches and the activations are still counted in float32 (on
    CUDA autocast keeps the norms' outputs in float32)."""
    s = cfg.spatial_factor
    cells = (height // s) * (width // s)
    params, ring_per_cell, kept_per_cell = _decoder_footprint(cfg)
    if half:
        ring_per_cell /= 2
    activations = 8 * cfg.dim * height * width * 4  # a few full-resolution tensors of the last stage
    return int(4 * params + (ring_per_cell + kept_per_cell) * cells + activations)


def context_latents(cfg: VAEConfig, before: int) -> int:
    """Latent frames before a part that a decode of the part alone starts from to give exactly the frames of one
    whole-video decode: the decoder's temporal reach plus one (`reach.py`), at most the `before` there are, and
    up to two more so that the decode starts at a latent frame that is a multiple of 3. (The decoder's
    full-resolution convs keep their last three inputs in a ring, blocks.FrameRing; a decode that starts there
    turns its rings in step with the whole video's, so every conv sums its taps in the same order.)"""
    from .reach import decoder_reach

    before = int(before)
    start = max(0, before - (decoder_reach(cfg) + 1))
    return before - (start - start % 3)


def warm_up(decoder: StreamingDecoder, z_before: torch.Tensor) -> None:
    """Decode (and discard) the last `context_latents` latent frames before a part, so that `decoder.decode` of the
    part gives exactly its frames of one whole-video decode. z_before: the video's latent so far (normalised)."""
    n = context_latents(decoder.vae.cfg, z_before.shape[2])
    if n:
        decoder.decode(z_before[:, :, -n:])


def decode_part(vae: WanVAE, z_before: Optional[torch.Tensor], z_part: torch.Tensor, *, tiled: bool = False,
                norm_silu: Optional[NormSilu] = None, **tile_kw) -> torch.Tensor:
    """The frames of a continued video's new part `z_part` (normalised latent), as one whole decode gives them."""
    decoder = StreamingDecoder(vae, tiled=tiled, norm_silu=norm_silu, **tile_kw)
    try:
        if z_before is not None and z_before.shape[2]:
            warm_up(decoder, z_before)
        return decoder.decode(z_part)
    finally:
        decoder.close()
