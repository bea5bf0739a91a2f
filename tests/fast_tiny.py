"""The tiny causal DiT, the fixed inputs and the streamed caches the Fast cache tests run (test_fast_placement.py,
test_kv_fp8.py load it with importlib): 3 layers, 4 x 6 latent tokens per frame."""
from __future__ import annotations

import torch

from lingbot_world.memory.kv_stream import KVStreamer
from lingbot_world.wan.dit.model import DiTConfig, WanDiT
from lingbot_world.wan.sampling.fast_sampler import FastRun, draw, make_generator
from lingbot_world.world.models import V1_FAST

TINY = DiTConfig.tiny(num_layers=3, text_dim=16, text_len=8, causal=True)
LH, LW, FSL = 4, 6, 6


def make_model() -> WanDiT:
    """Random weights: ~1/sqrt(fan_in) for matrices, 0.3 * N(0, 1) for the rest."""
    m = WanDiT(TINY).eval()
    g = torch.Generator().manual_seed(4)
    with torch.no_grad():
        for p in m.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * (0.3 if p.dim() < 2 else 1 / p[0].numel() ** 0.5))
    return m


def fast_run(model, cache, frames=9, seed=3, device="cpu", **kw) -> FastRun:
    """A run over a video of `frames` latent frames with fixed inputs, through `cache` (step it chunk by chunk)."""
    g = torch.Generator().manual_seed(50)
    y = torch.randn(1, 20, frames, LH, LW, generator=g).to(device)
    cam = torch.randn(1, 384, frames, LH, LW, generator=g).to(device)
    ctx = torch.randn(1, TINY.text_len, TINY.text_dim, generator=g).to(device)
    gen = make_generator(seed, "cuda" if torch.device(device).type == "cuda" else "cpu")
    noise = draw(gen, (1, 16, frames, LH, LW), device)
    kw.setdefault("schedule", V1_FAST.recipe.schedule())
    return FastRun(model, noise, ctx, y, cam, cache, gen, device=device, chunk_frames=V1_FAST.recipe.chunk_frames, **kw)


def fast_latents(model, cache, frames=9, seed=3, device="cpu", **kw):
    """The latents of that video, whole."""
    return fast_run(model, cache, frames, seed, device, **kw).run()


def streamed(model, layout, layers_on_device, device="cpu", dtype=torch.float32, fp8=False,
             code_layers=0) -> KVStreamer:
    """A cache of `layout` with its first `layers_on_device` layers on `device`, `code_layers` of the others as FP8
    codes there too, the rest streamed from (unpinned) host RAM, installed on `model`; close it after."""
    s = KVStreamer.build(layout, TINY.num_layers, TINY.num_heads, TINY.head_dim, device=device,
                         layers_on_device=layers_on_device, code_layers=code_layers, dtype=dtype, pin=False,
                         fp8=fp8)
    return s.install(model)


def streamed_latents(model, layout, frames, layers_on_device, **kw) -> tuple[torch.Tensor, dict]:
    """(the video's latents through such a streamed cache, the streamer's stats); the streamer is closed."""
    s = streamed(model, layout, layers_on_device, **kw)
    try:
        return fast_latents(model, s.cache, frames), s.stats()
    finally:
        s.close()
