"""The memory plan of a World session: where the Fast model, its K/V cache and the streaming VAE go.

One place for every door: the CLI plans with the free VRAM it reads here, ComfyUI with what its model management
can free (it passes `vram`), the player like the CLI.
"""
from __future__ import annotations

import logging
import math
from typing import Optional

import torch

from ..memory.fast_plan import FastMemoryPlan
from ..memory.fast_planner import plan_fast_memory
from ..memory.estimates import available_ram_bytes, free_vram_bytes
from ..quant.nf4_format import default_compute_dtype
from ..speed.options import activation_dtype, graphs_enabled
from ..wan.sizes import VAE_TEMPORAL_STRIDE
from ..wan.vae.model import VAEConfig
from ..wan.vae.streaming import streaming_decode_bytes

log = logging.getLogger(__name__)

STREAM_DECODE = ("auto", "on", "off")


def compute_dtype(weights: str, device: torch.device) -> torch.dtype:
    """The Fast model's compute dtype as it loads (its unquantized weights and LoRAs are kept in it)."""
    return torch.bfloat16 if weights == "bf16" else default_compute_dtype(device)


def cache_dtype(weights: str, device: torch.device, speed=None) -> torch.dtype:
    """The dtype the model computes in once the speed plan (a SpeedPlan or None) is applied, which its K/V cache has
    too: fp16 under `--compute fp16acc` (speed.options.activation_dtype), else the load's."""
    return (activation_dtype(speed.compute) if speed is not None else None) or compute_dtype(weights, device)


def plan_world_memory(cfg, layout, device: torch.device, height: int, width: int, *, weights: str = "nf4",
                      kv_cache: str = "auto", kv_layers_on_gpu: Optional[int] = None, with_camera: bool = True,
                      stream_decode: str = "auto", vae_cfg: Optional[VAEConfig] = None, seq_parallel: int = 1,
                      vram: Optional[int] = -1, ram: Optional[int] = None,
                      camera_film: bool = True, film_host: bool = True,
                      decode_dtype: str = "float32", kv_fp8: bool = False,
                      decode_bytes: Optional[int] = None, compute: str = "bf16",
                      resident_weights: bool = True) -> tuple[FastMemoryPlan, bool]:
    """(the memory plan, whether the VAE decodes each chunk beside the model). vram=-1: read the device's free
    memory (None on the CPU). camera_film=False: no camera FiLM kept per chunk, film_host=False: only on the device
    (benchmarks' A/B). decode_dtype / kv_fp8: the speed levers the plan counts
    (speed.levers.plan_levers): a half-precision decode leaves the K/V cache about 2.3 GB more at 480x832, and an FP8 cache
    takes half the RAM and half the link. decode_bytes: what the streaming decoder needs when it is not the VAE (a
    tiny decoder: wan.vae.tiny.tiny_decode_bytes; about 1 GB instead of 6-7 GB at 480x832). compute: the NF4 GEMMs'
    mode (the speed plan's), which the blocks' kept GEMM weights are prepared for where the card has room
    (resident_weights=False: never; benchmarks' A/B).
    Raises memory.fast_plan.FastMemoryError when nothing fits (the
    message has the numbers).
    """
    if stream_decode not in STREAM_DECODE:
        raise ValueError(f"stream decode {stream_decode!r}: choose one of {', '.join(STREAM_DECODE)}")
    cuda = device.type == "cuda"
    if vram == -1:
        vram = free_vram_bytes(device) if cuda else None  # None: the CPU computes, no device budget
    ram = available_ram_bytes() if ram is None else ram
    kw = dict(weights=weights, cache=kv_cache, cache_layers_on_gpu=kv_layers_on_gpu, camera=with_camera,
              compute_bytes=torch.empty(0, dtype=compute_dtype(weights, device)).element_size(),
              seq_parallel=seq_parallel, graphs=graphs_enabled(device, cfg), camera_film=camera_film,
              film_host=film_host, kv_fp8=kv_fp8, compute=compute, resident_weights=resident_weights)
    plan = plan_fast_memory(height, width, cfg, layout, vram, ram, **kw)
    stream = stream_decode == "on" or not cuda and stream_decode == "auto"
    if cuda and stream_decode != "off":
        extra = decode_bytes if decode_bytes is not None else streaming_decode_bytes(
            vae_cfg or VAEConfig(), height, width, half=decode_dtype != "float32")
        with_vae = plan_fast_memory(height, width, cfg, layout, vram, ram, extra_vram=extra, **kw)
        if stream_decode == "on" or (with_vae.fits and with_vae.blocks_on_gpu is None):
            plan, stream = with_vae, True
        else:
            log.info("streaming decode off: the decoder (%.1f GB while streaming) does not fit beside the model; the "
                     "video is decoded after sampling", extra / 1e9)
    return plan, stream


GROW_VIDEO_FRAMES = 81  # a played cache without a window grows by about 81 video frames at a time


def grow_latent_frames(settings) -> int:
    """Latent frames a played cache without a window grows by: whole chunks covering the 21 latent frames of 81
    video frames (v1 Fast: 21, v2: 24)."""
    chunk = settings.chunk_frames
    return chunk * math.ceil(((GROW_VIDEO_FRAMES - 1) // VAE_TEMPORAL_STRIDE + 1) / chunk)


def session_layout(settings, latent_frames: int):
    """The cache layout for a video of `latent_frames` so far (settings: a FastSettings). With a window (or max
    attention) the cache has its bounded size from the start, so a played video evicts exactly when a batch run of
    the same keys does."""
    chunk = settings.chunk_frames
    lat = max(latent_frames, chunk)
    if settings.window is not None:
        lat = max(lat, chunk * math.ceil((settings.window + 1) / chunk))
    elif settings.max_attention is not None:
        lat = max(lat, chunk * math.ceil((settings.max_attention / settings.frame_tokens + 1) / chunk))
    return settings.layout(lat)


def play_layout(settings, latent_frames: int = 0):
    """The layout a played video starts with (room for about 81 frames at once without a window)."""
    grow = grow_latent_frames(settings)
    return session_layout(settings, grow * max(1, math.ceil(latent_frames / grow)))
