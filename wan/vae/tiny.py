"""A tiny decoder for Wan2.1 latents (TAEHV's `taew2_1` / lightx2v's `lighttaew2_1`): a preview-quality decode at
a fraction of the Wan VAE's time and memory, for playing a world and for drafts.

The two files share one layout (`decoder.<index>.…` keys of one sequence, pixels in [0, 1] out) but not their input:
`taew2_1` decodes the normalised latents the DiT samples, `lighttaew2_1` the Wan VAE's raw latents, z·std + mean
(`TinyConfig.raw_latents`; lightx2v's and ComfyUI's own decoders scale the same way). The layout:

    0 clamp (3·tanh(x/3))   1 conv3x3 16→n0   2 relu
    3-5   memory blocks at n0, the latent's frame rate   6 upsample x2   7 1x1 "grow" (x1 in time)   8 conv n0→n1
    9-11  memory blocks at n1                            12 upsample x2  13 grow x2 in time          14 conv n1→n2
    15-17 memory blocks at n2, twice the frame rate      18 upsample x2  19 grow x2 in time          20 conv n2→n3
    21 relu   22 conv3x3 n3→3

A memory block is causal in time: out_t = relu(conv(conv(conv([x_t, x_{t-1}]))) + x_t), with x_{-1} = 0. A grow
layer maps one frame's channels to `s` frames (a 1x1 conv to s·C channels, split in order). One latent frame thus
gives four video frames; the first three of a video are dropped, so n latent frames give 1 + 4(n-1) frames, as the
Wan VAE's do.

`TinyStreamingDecoder` runs one latent frame at a time with each block's previous input kept between calls, so a
video decoded whole, chunk by chunk or frame by frame runs the same kernels on the same shapes: the same bits
(tests/test_tiny_vae.py). `tiny_decoder_reach` says how many latent frames back a frame depends on, which is what a
decoder started mid-video (after a rewind) must decode first to continue exactly.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Optional

import torch
import torch.nn as nn
import torch.nn.functional as F

from .model import LATENT_MEAN, LATENT_STD

LATENT_CHANNELS = 16  # Wan2.1's latent
TIME_GROWTH = (1, 2, 2)  # per stage: 1 latent frame -> 4 video frames (Wan2.1's temporal factor)
FRAMES_TO_TRIM = 3  # the first latent frame gives 4 frames, of which the video keeps the last
MEMORY_BLOCKS = ((3, 4, 5), (9, 10, 11), (15, 16, 17))
UPSAMPLE, GROW, PROJECT = (6, 12, 18), (7, 13, 19), (8, 14, 20)
IN_CONV, OUT_CONV, LAYERS = 1, 22, 23


@dataclass(frozen=True)
class TinyConfig:
    """Channel widths of the four stages (taew2_1: 256, 128, 64, 64), the output's pixel shuffle, and whether the
    decoder takes the VAE's raw latents (lighttaew2_1) instead of the DiT's normalised ones (taew2_1)."""

    widths: tuple = (256, 128, 64, 64)
    patch: int = 1
    raw_latents: bool = False

    @property
    def spatial_factor(self) -> int:
        return 8 * self.patch


class MemoryBlock(nn.Module):
    def __init__(self, channels: int):
        super().__init__()
        c = channels
        self.conv = nn.Sequential(nn.Conv2d(2 * c, c, 3, padding=1), nn.ReLU(), nn.Conv2d(c, c, 3, padding=1),
                                  nn.ReLU(), nn.Conv2d(c, c, 3, padding=1))

    def forward(self, x: torch.Tensor, past: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.conv(torch.cat([x, past], 1)) + x)


class TinyDecoder(nn.Module):
    """The decoder's weights under the file's key names (`decoder.<index>.…`); `TinyStreamingDecoder` runs it."""

    def __init__(self, cfg: TinyConfig = TinyConfig()):
        super().__init__()
        self.cfg = cfg
        n = cfg.widths
        layers: list[nn.Module] = [nn.Identity() for _ in range(LAYERS)]
        layers[IN_CONV] = nn.Conv2d(LATENT_CHANNELS, n[0], 3, padding=1)
        for stage, blocks in enumerate(MEMORY_BLOCKS):
            for i in blocks:
                layers[i] = MemoryBlock(n[stage])
            grow = nn.Module()
            grow.conv = nn.Conv2d(n[stage], n[stage] * TIME_GROWTH[stage], 1, bias=False)
            layers[GROW[stage]] = grow
            layers[PROJECT[stage]] = nn.Conv2d(n[stage], n[stage + 1], 3, padding=1, bias=False)
        layers[OUT_CONV] = nn.Conv2d(n[3], 3 * cfg.patch ** 2, 3, padding=1)
        self.decoder = nn.Sequential(*layers)

    @property
    def device(self) -> torch.device:
        return self.decoder[IN_CONV].weight.device

    @property
    def dtype(self) -> torch.dtype:
        return self.decoder[IN_CONV].weight.dtype

    def decoder_input(self, z: torch.Tensor) -> torch.Tensor:
        """The DiT's normalised latent [B, 16, ...] as this decoder takes it, on its device in its dtype: as is, or
        the VAE's raw latent z·std + mean (scaled in float32, then rounded once)."""
        if not self.cfg.raw_latents:
            return z.to(self.device, self.dtype)
        shape = (1, LATENT_CHANNELS) + (1,) * (z.dim() - 2)
        z = z.to(self.device, torch.float32)
        std = torch.tensor(LATENT_STD, dtype=torch.float32).view(shape).to(z.device, non_blocking=True)
        mean = torch.tensor(LATENT_MEAN, dtype=torch.float32).view(shape).to(z.device, non_blocking=True)
        return torch.addcmul(mean, z, std).to(self.dtype)

    def frame(self, z: torch.Tensor, memory: dict) -> torch.Tensor:
        """One latent frame [B, 16, h, w] as the decoder takes it (`decoder_input`) -> its four frames
        [B, 4, 3, 8h, 8w] in [0, 1]; `memory` (block index -> that block's last input [B, 1, C, H, W]) is read and
        updated."""
        d = self.decoder
        b = z.shape[0]
        x = torch.relu(d[IN_CONV](torch.tanh(z / 3) * 3)).unsqueeze(1)  # [B, T=1, C, h, w]
        for stage, blocks in enumerate(MEMORY_BLOCKS):
            for i in blocks:
                before = memory.get(i)
                if before is None:
                    before = torch.zeros_like(x[:, :1])
                past = torch.cat([before, x[:, :-1]], 1)  # each frame's previous input
                memory[i] = x[:, -1:]
                t = x.shape[1]
                x = d[i](x.flatten(0, 1), past.flatten(0, 1)).unflatten(0, (b, t))
            t = x.shape[1]
            y = F.interpolate(x.flatten(0, 1), scale_factor=2, mode="nearest")
            y = d[GROW[stage]].conv(y)  # [B*T, s*C, H, W]: frame t*s + j is channel group j
            s = TIME_GROWTH[stage]
            y = y.unflatten(1, (s, -1)).flatten(0, 1)
            x = d[PROJECT[stage]](y).unflatten(0, (b, t * s))
        y = d[OUT_CONV](torch.relu(x.flatten(0, 1)))
        if self.cfg.patch > 1:
            y = F.pixel_shuffle(y, self.cfg.patch)
        return y.unflatten(0, (b, x.shape[1])).clamp(0, 1)


class TinyStreamingDecoder:
    """`decode(z_chunk)` -> this chunk's frames [B, 3, T, H, W] in [-1, 1] (float32), like the Wan VAE's
    StreamingDecoder: the first chunk of n latent frames gives 1 + 4(n-1) frames, every later one 4n."""

    def __init__(self, model: TinyDecoder):
        self.model = model
        self.memory: dict = {}
        self.latent_frames = 0
        self.shape: Optional[tuple] = None

    @property
    def frames(self) -> int:
        return 0 if self.latent_frames == 0 else 1 + 4 * (self.latent_frames - 1)

    def decode(self, z: torch.Tensor) -> torch.Tensor:
        """Normalised latent chunk [B, 16, n, h, w] (what the DiT samples) -> its frames."""
        if z.dim() != 5 or z.shape[1] != LATENT_CHANNELS:
            raise ValueError(f"the tiny decoder takes a latent [B, {LATENT_CHANNELS}, T, h, w], got {tuple(z.shape)}")
        b, _, n, h, w = z.shape
        if self.shape is None:
            self.shape = (b, h, w)
        elif self.shape != (b, h, w):
            raise ValueError(f"latent chunk {tuple(z.shape)} does not continue the video of batch/size {self.shape}")
        model = self.model
        z = model.decoder_input(z)
        out = []
        with torch.inference_mode():
            for i in range(n):
                frames = model.frame(z[:, :, i], self.memory)
                if self.latent_frames == 0:
                    frames = frames[:, FRAMES_TO_TRIM:]
                self.latent_frames += 1
                out.append(frames.float().mul_(2).sub_(1))
        return torch.cat(out, 1).transpose(1, 2)

    def fork(self) -> "TinyStreamingDecoder":
        """A decoder that goes on from where this one is, leaving this one as it is (a preview of frames that may be
        replaced). The memory dict is copied shallowly: `TinyDecoder.frame` only ever assigns its entries anew, never
        writes into the tensors, so the two decoders share what they had and part ways from there."""
        twin = TinyStreamingDecoder(self.model)
        twin.memory = dict(self.memory)
        twin.latent_frames, twin.shape = self.latent_frames, self.shape
        return twin

    def close(self) -> None:
        self.memory.clear()


@functools.lru_cache(maxsize=8)
def tiny_decoder_reach(cfg: TinyConfig = TinyConfig()) -> int:
    """How many latent frames after a latent frame its influence on the decoded frames lasts (8 for taew2_1's
    layout: each memory block looks one frame back, six at the latent's frame rate and three at twice it, 3 + 3 + 1.5
    latent frames, which reach into the eighth): traced by putting NaN into the first frame (0·NaN is NaN, so the dependency survives any weight) on a
    one-channel twin at the smallest size. A decoder started `reach` latent frames early gives exact frames (the
    frames before those reach no further than the last of them)."""
    twin = TinyDecoder(TinyConfig(widths=(1, 1, 1, 1), patch=cfg.patch))
    decoder = TinyStreamingDecoder(twin)
    last = 0
    for i in range(32):
        z = torch.full((1, LATENT_CHANNELS, 1, 1, 1), float("nan") if i == 0 else 0.0)
        if decoder.decode(z).isnan().any():
            last = i
    if last >= 31:
        raise RuntimeError("the tiny decoder's reach is longer than traced")
    return last


def tiny_context_latents(cfg: TinyConfig, before: int) -> int:
    """Latent frames before a part that a fresh decoder decodes first to continue a video exactly."""
    return min(before, tiny_decoder_reach(cfg))


def tiny_decode_bytes(cfg: TinyConfig, height: int, width: int, element_size: int = 2) -> int:
    """Device bytes a TinyStreamingDecoder needs while it lives: its weights, each memory block's last input, and
    one latent frame's largest activations (four full-resolution frames of the last stage, a few times over)."""
    n = cfg.widths
    cells = (height // cfg.spatial_factor) * (width // cfg.spatial_factor)
    with torch.device("meta"):
        params = sum(p.numel() for p in TinyDecoder(cfg).parameters())
    memory = 3 * cells * (n[0] + 4 * n[1] + 32 * n[2])  # a stage-2 block keeps a view of its two-frame input
    last_stage = 4 * n[3] * height * width
    return int(element_size * (params + memory + 4 * last_stage) + 4 * 3 * 4 * height * width)
