"""How far back in time the causal VAE looks: what makes a continued video's encode and decode exact.

Every temporal operator of the Wan VAE is a causal convolution over a sliding cache of the frames before the chunk,
so a latent frame depends on a bounded past. Measured here, not derived by hand: a NaN put into the first input
spreads through every operation that reads it (0 * NaN is NaN too, so even a zero weight keeps the dependency),
and the last output frame it reaches is the reach. The temporal structure alone decides it (not the weights nor
the widths), so it is traced on a one-channel twin of the VAE at the smallest spatial size, in about a second
(Wan2.1: the encoder's first frame reaches latent frame 28, a decoded latent frame reaches 38 frames later).

What the pack builds on it (tests/test_fast_continue.py checks both against whole-video runs, bit for bit):
- the I2V conditioning of a video that keeps growing: frames 1.. are zeros, so from latent frame `reach + 1` on
  every latent frame of `y` is the same computation on the same inputs, i.e. the same values (`wan/i2v.py`);
- decoding the new part of a continued video on its own: starting `reach + 1` latent frames earlier gives exactly
  the frames of one whole decode (the earlier frames' influence, and that of the decoder starting mid-video, has
  died out by then).
"""
from __future__ import annotations

import functools
from dataclasses import replace

import torch

from .model import VAEConfig, WanVAE

TRACE_LATENT_FRAMES = 64  # longer than any reach found; a reach this long is reported as an error


@functools.lru_cache(maxsize=8)
def encoder_reach(cfg: VAEConfig) -> int:
    """The last latent frame that the first input frame influences (28 for the Wan2.1 VAE)."""
    vae, side = _twin(cfg)
    cache: dict = {}
    last = 0
    with torch.inference_mode():
        for i in range(TRACE_LATENT_FRAMES):
            chunk = torch.full((1, 3, 1, side, side), float("nan")) if i == 0 else torch.zeros(1, 3, vae.cfg.temporal_factor, side, side)
            if vae.conv1(vae.encoder(chunk, cache)).isnan().any():
                last = i
    return _checked(last, "encoder")


@functools.lru_cache(maxsize=8)
def decoder_reach(cfg: VAEConfig) -> int:
    """How many latent frames after a latent frame its influence on the decoded frames lasts (38 for Wan2.1)."""
    vae, side = _twin(cfg)
    s = vae.cfg.spatial_factor
    cache: dict = {}
    last = 0
    with torch.inference_mode():
        for i in range(TRACE_LATENT_FRAMES):
            z = torch.full((1, vae.cfg.z_dim, 1, side // s, side // s), float("nan") if i == 0 else 0.0)
            if vae.decoder(vae.conv2(z), cache).isnan().any():
                last = i
    return _checked(last, "decoder")


def _twin(cfg: VAEConfig) -> tuple[WanVAE, int]:
    """A one-channel copy of the architecture (same temporal structure) and the smallest frame side it takes."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        vae = WanVAE(replace(cfg, dim=1)).eval()
    return vae, vae.cfg.spatial_factor


def _checked(last: int, what: str) -> int:
    if last >= TRACE_LATENT_FRAMES - 1:
        raise RuntimeError(f"the VAE {what}'s temporal reach is at least {TRACE_LATENT_FRAMES} latent frames; "
                           "this architecture is not causal with a bounded past")
    return last
