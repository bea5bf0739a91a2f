"""Whole-clip latent previews (nodes/adapters/previews.py): every latent frame, in order, decoded by the previewer, within
ComfyUI's preview size."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image

from lingbot_world.nodes.adapters.previews import GAP, ClipPreview, grid_layout


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


# ---- which decoder LingBot samplers preview with (issue 27: on by default, video TAE previewers) ----------------
class _Format:
    latent_rgb_factors = [[0.1, 0.2, 0.3]] * 16
    latent_rgb_factors_bias = [0.0, 0.0, 0.0]
    taesd_decoder_name = "lighttaew2_1"


def _fake_latent_preview(method: str):
    """ComfyUI's latent_preview as far as the pack uses it: get_previewer answers per --preview-method."""
    import types

    class Latent2RGBPreviewer:
        def __init__(self, factors, bias=None):
            self.factors = torch.tensor(factors)

        def decode_latent_to_preview(self, x0):
            assert x0.dim() == 4
            rgb = torch.einsum("bchw,cr->bhwr", x0, self.factors)[0]
            return Image.fromarray(((rgb.clamp(-1, 1) + 1) * 127.5).byte().numpy())

    class VideoTAE:  # like core's TAEHV previewer: video latents only, first frame
        calls = []

        def decode_latent_to_preview(self, x0):
            if x0.dim() != 5:
                raise ValueError(f"video previewer got {x0.dim()}-D")
            VideoTAE.calls.append(tuple(x0.shape))
            h, w = x0.shape[-2:]
            return Image.new("RGB", (w * 8, h * 8), (200, 10, 10))

    m = types.SimpleNamespace(Latent2RGBPreviewer=Latent2RGBPreviewer, VIDEO_TAES=["taehv", "lighttaew2_1"],
                              VideoTAE=VideoTAE)
    m.get_previewer = lambda device, fmt: {"none": None, "latent2rgb": Latent2RGBPreviewer(fmt.latent_rgb_factors),
                                           "taesd": VideoTAE()}[method]
    return m


def test_previews_are_on_when_comfyui_has_them_off_and_the_switch_turns_them_off():
    from lingbot_world.nodes.adapters.previews import preview_decoder

    lp = _fake_latent_preview("none")  # ComfyUI's default: --preview-method none
    decode = preview_decoder(lp, "cpu", _Format())
    assert decode is not None
    grid = ClipPreview(decode, max_side=256)(torch.randn(1, 16, 5, 6, 10))
    assert grid.mode == "RGB" and max(grid.size) <= 256
    assert preview_decoder(lp, "cpu", _Format(), enabled=False) is None


def test_a_video_tae_previewer_gets_five_d_latents():
    from lingbot_world.nodes.adapters.previews import preview_decoder

    lp = _fake_latent_preview("taesd")
    decode = preview_decoder(lp, "cpu", _Format())
    grid = ClipPreview(decode, max_side=512)(torch.randn(1, 16, 5, 6, 10))
    assert grid.getpixel((1, 1)) == (200, 10, 10)
    assert all(len(s) == 5 and s[2] == 1 for s in lp.VideoTAE.calls)  # [1, C, 1, h, w]: one latent frame
    lp2 = _fake_latent_preview("latent2rgb")  # Latent2RGB keeps its 4-D input even for a video format
    ClipPreview(preview_decoder(lp2, "cpu", _Format()), max_side=128)(torch.randn(1, 16, 3, 4, 4))
