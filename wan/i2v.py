"""The I2V conditioning latent `y` (spec §5.3), shared by the sampler, the CLI and the nodes.

y = [mask (4 channels) ; VAE latent of (first frame, then zero frames) (16 channels)], `[1, 20, F_lat, h/8, w/8]`.
"""
from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F

from .vae.model import DEFAULT_OVERLAP, DEFAULT_TILE, TileArg, WanVAE, check_video_size

MASK_CHANNELS = 4


def image_to_model_range(image_hwc: torch.Tensor) -> torch.Tensor:
    """A `[H,W,3]` image in [0,1] (ComfyUI IMAGE frame, or PIL/255) -> `[3,H,W]` float32 in [-1,1]."""
    if image_hwc.dim() != 3 or image_hwc.shape[-1] != 3:
        raise ValueError(f"expected an RGB image [H,W,3] in [0,1], got shape {tuple(image_hwc.shape)}")
    return image_hwc.permute(2, 0, 1).float() * 2 - 1


def resize_first_frame(image: torch.Tensor, height: int, width: int) -> torch.Tensor:
    """Bicubic resize as the reference does it: CPU, fp32, align_corners=False, no antialias, no clamp."""
    x = image.detach().to("cpu", torch.float32)[None]
    return F.interpolate(x, size=(height, width), mode="bicubic", align_corners=False, antialias=False)[0]


def first_frame_mask(latent_frames: int, lat_h: int, lat_w: int, channels: int = MASK_CHANNELS) -> torch.Tensor:
    """`[4, F_lat, lat_h, lat_w]`: all four channels 1 at latent frame 0, 0 elsewhere.

    The reference builds a per-pixel-frame mask (1 at frame 0), repeats frame 0 four times and folds groups of
    four frames into channels; this is its result written directly.
    """
    mask = torch.zeros(channels, latent_frames, lat_h, lat_w)
    mask[:, 0] = 1
    return mask


def build_i2v_condition(vae: WanVAE, image: torch.Tensor, height: int, width: int, frames: int, *,
                        tiled: bool = False, tile: TileArg = DEFAULT_TILE,
                        overlap: int = DEFAULT_OVERLAP) -> torch.Tensor:
    """The 20-channel conditioning `y [1, 20, F_lat, height/8, width/8]` (float32, on the VAE's device).

    image: `[3, h_img, w_img]` float in [-1, 1] (use `image_to_model_range` for `[H,W,3]` 0..1 images). It is
    resized to (height, width); frames 1..F-1 are zeros (mid-grey). `frames` must be 4n+1 and height/width
    multiples of 16.
    """
    if image.dim() != 3 or image.shape[0] != 3:
        raise ValueError(f"expected the image as [3,H,W] in [-1,1], got shape {tuple(image.shape)}; "
                         f"convert [H,W,3] 0..1 images with image_to_model_range()")
    check_video_size(frames, height, width)
    first = resize_first_frame(image, height, width)
    video = torch.zeros(1, 3, frames, height, width)
    video[0, :, 0] = first
    latent = vae.encode(video, tiled=tiled, tile=tile, overlap=overlap)
    del video
    mask = first_frame_mask(latent.shape[2], latent.shape[3], latent.shape[4]).to(latent)
    return torch.cat([mask[None], latent], dim=1)



class ConditionTrack:
    """The conditioning `y` of a video that keeps growing (Fast continuation): any latent frame on demand.

    Frames 1.. of the conditioning video are zeros, so beyond the VAE encoder's reach of the first frame
    (`wan/vae/reach.py`: latent frame 28 for Wan2.1) every latent frame is the same computation on the same inputs:
    the same values. `y` holds the frames up to one past the reach and every later frame equals the last one, so
    `frames(start, count)` is exactly the slice of one whole-video `build_i2v_condition`, for any length.
    """

    def __init__(self, y: torch.Tensor, stationary_from: int):
        if y.dim() != 5 or y.shape[2] <= stationary_from:
            raise ValueError(f"conditioning {tuple(y.shape)} must hold latent frames 0..{stationary_from}")
        self.y = y[:, :, :stationary_from + 1].detach().to("cpu", torch.float32).contiguous()
        self.stationary_from = int(stationary_from)

    @classmethod
    def build(cls, vae: WanVAE, image: torch.Tensor, height: int, width: int, *, tiled: bool = False,
              have: Optional[torch.Tensor] = None, **tile_kw) -> "ConditionTrack":
        """From the first frame ([3,H,W] in [-1,1], as `build_i2v_condition` takes it). `have`: a conditioning
        already built with the same arguments; reused when it is long enough."""
        from .vae.reach import encoder_reach

        last = encoder_reach(vae.cfg) + 1
        if have is None or have.shape[2] <= last:
            frames = vae.cfg.temporal_factor * last + 1
            with torch.inference_mode():
                have = build_i2v_condition(vae, image, height, width, frames, tiled=tiled, **tile_kw)
        return cls(have, last)

    def frames(self, start: int, count: int) -> torch.Tensor:
        """Latent frames [start, start + count) of the conditioning, `[1, 20, count, h, w]` float32 (CPU)."""
        if start < 0 or count < 1:
            raise ValueError(f"need start >= 0 and count >= 1, got {start}, {count}")
        end = start + count
        known = self.y[:, :, min(start, self.stationary_from):min(end, self.stationary_from + 1)]
        if end <= self.stationary_from + 1:
            return known.clone()
        tail = self.y[:, :, -1:].expand(-1, -1, end - max(start, self.stationary_from + 1), -1, -1)
        parts = [known] if start <= self.stationary_from else []
        return torch.cat(parts + [tail], dim=2).contiguous()

    @property
    def shape(self) -> tuple:
        return tuple(self.y.shape)
