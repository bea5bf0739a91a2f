"""Latent previews of the whole clip: every latent frame of the x0 estimate, laid out as one grid (reading order) and
decoded by ComfyUI's previewer, which the frontend shows on the node like any latent preview.

ComfyUI's own previewers decode only the first frame of a video latent, and its preview channel carries one still
image (JPEG/PNG) per step, so the clip is shown as a grid rather than an animation. No ComfyUI import here: the
decoder is passed in (`previewer.decode_latent_to_preview`), so this is testable and reusable by any sampler loop.
"""
from __future__ import annotations

import math
from typing import Callable, Optional

import torch
import torch.nn.functional as F
from PIL import Image

Decode = Callable[[torch.Tensor], Image.Image]  # [1, C, h, w] latent -> RGB image
GRID_ASPECT = 1.25  # width / height the grid aims for: fits a node's preview area without wasting it
GAP = 2  # pixels between frames
GAP_COLOUR = (24, 24, 24)


def grid_layout(frames: int, cell_w: int, cell_h: int, aspect: float = GRID_ASPECT) -> tuple[int, int]:
    """(columns, rows) for `frames` cells of cell_w x cell_h whose grid is closest to `aspect` (w/h)."""
    def miss(cols: int) -> float:
        rows = math.ceil(frames / cols)
        return abs(math.log(cols * cell_w / (rows * cell_h) / aspect))

    cols = min(range(1, frames + 1), key=miss)
    return cols, math.ceil(frames / cols)


class ClipPreview:
    """Callable x0 [B, C, T, h, w] -> grid image of the first sample's T frames, at most `max_side` pixels.

    The frames are decoded in ONE previewer call, stacked on top of each other (a free view of the latent, so one
    pass over the data and one device sync per step whatever the clip length), then cut apart and laid out as a
    grid. ComfyUI's latent-to-RGB previewer works per pixel, so each cell is exactly that frame's preview. A decoder
    that upscales (TAESD: 8 pixels per latent pixel, measured once) gets a latent shrunk by area averaging first so
    its output stays near max_side; otherwise the grid is resized when it exceeds max_side.
    """

    def __init__(self, decode: Decode, max_side: int = 512, gap: int = GAP):
        self.decode = decode
        self.max_side = max(16, int(max_side))
        self.gap = gap
        self.scale: Optional[float] = None  # output pixels per latent pixel

    def __call__(self, x0: torch.Tensor) -> Image.Image:
        if x0.dim() != 5:
            raise ValueError(f"expected a video latent [B, C, T, h, w], got {tuple(x0.shape)}")
        video = x0[0]  # [C, T, h, w]
        channels, count, h, w = video.shape
        cols, rows = grid_layout(count, w, h)
        if self.scale is None:
            self.scale = self.decode(video[None, :, 0]).width / w
        if self.scale > 1:  # shrink before an upscaling decoder, not after
            fit = self.max_side / (self.scale * max(cols * w, rows * h))
            if fit < 1.0:
                h, w = max(1, int(h * fit)), max(1, int(w * fit))
                video = F.interpolate(video.transpose(0, 1).float(), size=(h, w), mode="area").transpose(0, 1)
        strip = self.decode(video.reshape(1, channels, count * h, w)).convert("RGB")  # frames top to bottom
        cw, ch = strip.width, strip.height // count
        gap = self.gap
        grid = Image.new("RGB", (cols * cw + (cols - 1) * gap, rows * ch + (rows - 1) * gap), GAP_COLOUR)
        for t in range(count):
            grid.paste(strip.crop((0, t * ch, cw, (t + 1) * ch)), ((t % cols) * (cw + gap), (t // cols) * (ch + gap)))
        shrink = self.max_side / max(grid.size)
        if shrink < 1.0:
            grid = grid.resize((max(1, round(grid.width * shrink)), max(1, round(grid.height * shrink))), Image.BILINEAR)
        return grid


def frames_as_video(decode5: Callable[[torch.Tensor], Image.Image]) -> Decode:
    """A [1, C, h, w] decoder made from one that wants video latents [1, C, T, h, w] (ComfyUI's video TAE
    previewers, e.g. Wan's lighttaew2_1): the picture is passed as a video of one latent frame."""
    return lambda latent: decode5(latent.unsqueeze(2))


def preview_decoder(latent_preview, device, latent_format, enabled: bool = True) -> Optional[Decode]:
    """The decoder LingBot samplers preview with, whatever ComfyUI's global preview setting (None when `enabled` is
    off): ComfyUI's own previewer for the latent format (TAESD / video TAE when installed and chosen), else
    Latent2RGB with the format's factors, which needs no file. `latent_preview` is ComfyUI's module (passed in, so
    this needs no ComfyUI to test)."""
    if not enabled:
        return None
    previewer = latent_preview.get_previewer(device, latent_format)
    if previewer is None:  # previews off globally (ComfyUI's default --preview-method none)
        factors = getattr(latent_format, "latent_rgb_factors", None)
        if factors is None:
            return None
        extra = {}
        reshape = getattr(latent_format, "latent_rgb_factors_reshape", None)
        if reshape is not None:  # newer ComfyUI only
            extra["latent_rgb_factors_reshape"] = reshape
        previewer = latent_preview.Latent2RGBPreviewer(factors, getattr(latent_format, "latent_rgb_factors_bias", None),
                                                       **extra)
    video_taes = getattr(latent_preview, "VIDEO_TAES", ())
    if (getattr(latent_format, "taesd_decoder_name", None) in video_taes
            and not isinstance(previewer, latent_preview.Latent2RGBPreviewer)):
        return frames_as_video(previewer.decode_latent_to_preview)
    return previewer.decode_latent_to_preview
