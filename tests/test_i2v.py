"""The I2V conditioning tensor y: mask pattern, channel order, VAE input (resized frame 0, then zeros)."""
import numpy as np
import pytest
import torch
import torch.nn.functional as F

from lingbot_world.wan.i2v import build_i2v_condition, first_frame_mask, image_to_model_range, resize_first_frame
from lingbot_world.wan.vae.model import VAEConfig, WanVAE


class SpyVAE:
    """Forwards to a real VAE and records what it was asked to encode."""

    def __init__(self, vae: WanVAE):
        self.vae = vae
        self.calls = []

    def encode(self, video, **kw):
        self.calls.append((video.clone(), kw))
        return self.vae.encode(video, **kw)


@pytest.fixture(scope="module")
def vae():
    torch.manual_seed(0)
    return WanVAE(VAEConfig.tiny()).eval()


def test_mask_pattern():
    m = first_frame_mask(5, 3, 4)
    assert m.shape == (4, 5, 3, 4)
    assert (m[:, 0] == 1).all() and (m[:, 1:] == 0).all()


def test_condition_layout_and_vae_input(vae):
    torch.manual_seed(1)
    image = torch.rand(3, 40, 70) * 2 - 1  # odd size: it is resized, not cropped
    spy = SpyVAE(vae)
    y = build_i2v_condition(spy, image, height=32, width=48, frames=9)
    assert y.shape == (1, 20, 3, 4, 6) and y.dtype == torch.float32
    # mask first: all four channels 1 at latent frame 0, 0 elsewhere
    assert (y[0, :4, 0] == 1).all() and (y[0, :4, 1:] == 0).all()
    # the VAE saw [1,3,9,32,48]: the bicubic-resized image, then zero frames
    (video, kw), = spy.calls
    assert video.shape == (1, 3, 9, 32, 48) and kw["tiled"] is False
    expected_first = F.interpolate(image[None], size=(32, 48), mode="bicubic", align_corners=False)[0]
    torch.testing.assert_close(video[0, :, 0], expected_first, rtol=0, atol=0)
    assert (video[:, :, 1:] == 0).all()
    # then the latent of exactly that video
    torch.testing.assert_close(y[:, 4:], vae.encode(video), rtol=0, atol=0)


def test_resize_is_bicubic_without_antialias_or_clamp():
    # a hard edge makes bicubic overshoot: the reference keeps the overshoot
    img = -torch.ones(3, 64, 64)
    img[:, :, 32:] = 1
    up = resize_first_frame(img, 96, 96)
    assert up.max() > 1 and up.min() < -1
    x = torch.rand(3, 64, 64)
    down = resize_first_frame(x, 32, 32)
    no_aa = F.interpolate(x[None], size=(32, 32), mode="bicubic", align_corners=False, antialias=False)[0]
    aa = F.interpolate(x[None], size=(32, 32), mode="bicubic", align_corners=False, antialias=True)[0]
    torch.testing.assert_close(down, no_aa, rtol=0, atol=0)
    assert not torch.allclose(down, aa)
    # runs on CPU in fp32 whatever comes in
    assert resize_first_frame(x.double(), 32, 32).dtype == torch.float32


def test_tiling_options_reach_the_vae(vae):
    spy = SpyVAE(vae)
    build_i2v_condition(spy, torch.zeros(3, 32, 32), 32, 32, 5, tiled=True, tile=2, overlap=1)
    assert spy.calls[0][1] == {"tiled": True, "tile": 2, "overlap": 1}


def test_bad_inputs(vae):
    with pytest.raises(ValueError, match=r"frames=80 is not 4n\+1 \(nearest valid: 77 or 81\)"):
        build_i2v_condition(vae, torch.zeros(3, 8, 8), 32, 32, 80)
    with pytest.raises(ValueError, match=r"height=40 is not a multiple of 16 \(nearest valid: 32 or 48\)"):
        build_i2v_condition(vae, torch.zeros(3, 8, 8), 40, 32, 5)
    with pytest.raises(ValueError, match=r"\[3,H,W\]"):
        build_i2v_condition(vae, torch.zeros(8, 8, 3), 32, 32, 5)


def test_example_image_end_to_end(vae, examples_dir):
    from PIL import Image

    pil = Image.open(examples_dir / "00" / "image.jpg").convert("RGB")
    hwc = torch.from_numpy(np.asarray(pil, dtype=np.float32) / 255.0)
    image = image_to_model_range(hwc)
    assert image.shape == (3, pil.height, pil.width)
    assert image.min() >= -1 and image.max() <= 1
    y = build_i2v_condition(vae, image, height=48, width=80, frames=5)
    assert y.shape == (1, 20, 2, 6, 10)
    assert torch.isfinite(y).all()
