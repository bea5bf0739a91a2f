"""Rough VRAM of the VAE: its weights and one encode/decode's working memory (for placement decisions)."""
from __future__ import annotations

import functools

import torch

from .model import VAEConfig, WanVAE

CHUNK_FRAMES = 4  # the causal VAE works on 4 frames at a time
# Live float32 activations per pixel of a 4-frame chunk, in units of the VAE's base width: the widest
# full-resolution stage (2 x dim channels) times ~8 tensors alive at once (inputs, norms, cache, outputs).
ACTIVATION_FACTOR = 2 * 8


def vae_work_bytes(cfg: VAEConfig, height: int, width: int, frames: int, tiled: bool, tile_px: int) -> int:
    """Rough peak VRAM of one VAE encode/decode beyond the weights (an over-estimate: 10.7 GB at 480x832x81
    where the H100 measured 6.2 GB reserved)."""
    h, w = (min(height, tile_px), min(width, tile_px)) if tiled else (height, width)
    chunk = CHUNK_FRAMES * h * w * cfg.dim * ACTIVATION_FACTOR * 4
    video = 3 * frames * height * width * 4  # the full output (decode) / input (encode) video
    return int(chunk + video)


@functools.lru_cache(maxsize=8)
def vae_weight_bytes(cfg: VAEConfig) -> int:
    """float32 weights, counted on `meta`."""
    with torch.device("meta"):
        vae = WanVAE(cfg)
    return 4 * sum(p.numel() for p in vae.parameters())
