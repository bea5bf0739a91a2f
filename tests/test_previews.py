"""Whole-clip latent previews (nodes/previews.py): every latent frame, in order, decoded by the previewer, within
ComfyUI's preview size."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image

from lingbot_world.nodes.previews import GAP, ClipPreview, grid_layout


def latent_to_rgb(weights: torch.Tensor):
    """A latent-to-RGB decoder like ComfyUI's Latent2RGBPreviewer: per-pixel linear map, one image per call."""
    def decode(x0: torch.Tensor) -> Image.Image:
        assert x0.dim() == 4 and x0.shape[0] == 1
        rgb = torch.einsum("chw,cr->hwr", x0[0].float(), weights)
        return Image.fromarray(((rgb.clamp(-1, 1) + 1) * 127.5).round().to(torch.uint8).numpy())

    return decode


def upscaling(decode, factor: int):
    """A TAESD-like decoder: `factor` output pixels per latent pixel."""
    def dec(x0: torch.Tensor) -> Image.Image:
        im = decode(x0)
        return im.resize((im.width * factor, im.height * factor), Image.NEAREST)

    return dec


@pytest.mark.parametrize("frames, w, h, want", [(21, 104, 60, (4, 6)), (5, 14, 8, (2, 3)), (1, 104, 60, (1, 1)),
                                                (21, 60, 104, (7, 3))])
def test_grid_layout_is_close_to_the_preview_aspect(frames, w, h, want):
    cols, rows = grid_layout(frames, w, h)
    assert (cols, rows) == want and cols * rows >= frames and (cols - 1) * rows < frames


def test_every_latent_frame_is_in_the_grid_in_reading_order():
    torch.manual_seed(0)
    weights = torch.randn(16, 3) * 0.2
    frames, h, w = 21, 60, 104
    x0 = torch.zeros(1, 16, frames, h, w)
    for t in range(frames):  # each frame a distinct flat colour
        x0[0, :, t] = torch.randn(16, 1, 1)
    preview = ClipPreview(latent_to_rgb(weights), max_side=512)
    grid = np.asarray(preview(x0))
    cols, rows = grid_layout(frames, w, h)
    assert grid.shape == (rows * h + (rows - 1) * GAP, cols * w + (cols - 1) * GAP, 3)  # no shrink needed at 512
    decode = latent_to_rgb(weights)
    for t in range(frames):
        y, x = (t // cols) * (h + GAP), (t % cols) * (w + GAP)
        want = np.asarray(decode(x0[:, :, t]))
        assert np.array_equal(grid[y:y + h, x:x + w], want), f"frame {t}"
    empty = grid[(rows - 1) * (h + GAP):, (frames % cols) * (w + GAP):]  # cells after the last frame
    assert (empty == 24).all()


def test_big_clips_and_upscaling_previewers_stay_within_the_preview_size():
    x0 = torch.randn(1, 16, 21, 90, 160)  # 720p, 81 frames
    decode = latent_to_rgb(torch.randn(16, 3) * 0.2)
    for factor, max_side in ((1, 512), (8, 512), (8, 256)):
        preview = ClipPreview(upscaling(decode, factor), max_side=max_side)
        im = preview(x0)
        assert max(im.size) <= max_side and preview.scale == factor
        assert min(im.size) > max_side // 3  # the space is used, not wasted
    flat = torch.zeros(1, 16, 3, 8, 8)
    flat[0, :, 1] = 1.0  # area shrink keeps a flat frame flat
    im = np.asarray(ClipPreview(upscaling(decode, 8), max_side=64)(flat))
    assert im.shape[0] <= 64 and im.shape[1] <= 64


def test_a_single_image_latent_is_refused():
    with pytest.raises(ValueError, match=r"\[B, C, T, h, w\]"):
        ClipPreview(latent_to_rgb(torch.randn(16, 3)))(torch.zeros(1, 16, 8, 8))
