"""loaders/image_files.py: every image kind users hand in decodes right, or fails with one clear line."""
import io
import struct
import zlib

import numpy as np
import pytest
import torch
from PIL import Image

from lingbot_world.loaders.image_files import ImageFileError, load_image


def _png(path, arr: np.ndarray, bit_depth: int = 16, width=None, height=None):
    """A PNG written by hand (Pillow cannot write 16-bit RGB): grey, grey+alpha, RGB or RGBA."""
    h, w = arr.shape[:2]
    channels = 1 if arr.ndim == 2 else arr.shape[2]
    colour = {1: 0, 2: 4, 3: 2, 4: 6}[channels]
    dtype = ">u2" if bit_depth == 16 else "u1"
    rows = arr.reshape(h, -1).astype(dtype)
    raw = b"".join(b"\x00" + rows[y].tobytes() for y in range(h))

    def chunk(kind, data):
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)

    ihdr = struct.pack(">IIBBBBB", width or w, height or h, bit_depth, colour, 0, 0, 0)
    path.write_bytes(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(raw)) + chunk(b"IEND", b""))
    return path


def _ramp(h=24, w=40, top=65535):
    return np.linspace(0, top, h * w).reshape(h, w)


def _unit(decoded):
    return ((decoded.pixels + 1) / 2).permute(1, 2, 0).numpy()  # back to [H, W, 3] in [0, 1]


def test_8bit_rgb_matches_the_reference_decode(tmp_path):
    rgb = np.random.default_rng(0).integers(0, 256, (24, 40, 3), dtype=np.uint8)
    Image.fromarray(rgb).save(tmp_path / "a.png")
    d = load_image(tmp_path / "a.png")
    ref = torch.from_numpy(rgb.astype(np.float32) / 255.0).permute(2, 0, 1) * 2 - 1  # to_tensor * 2 - 1
    assert d.pixels.dtype == torch.float32 and torch.equal(d.pixels, ref) and d.notes == []


def test_16bit_grey_png_keeps_its_tones(tmp_path):
    """Issue case: a 16-bit PNG became a near-white first frame (Pillow's convert('RGB') clips I;16 at 255)."""
    ramp = _ramp().astype(np.uint16)
    _png(tmp_path / "g16.png", ramp)
    assert Image.open(tmp_path / "g16.png").mode.startswith("I")
    got = _unit(load_image(tmp_path / "g16.png"))
    assert np.allclose(got, (ramp / 65535.0)[..., None], atol=1e-6)
    assert 0.45 < got.mean() < 0.55  # a full ramp, not near-white


def test_16bit_rgb_and_rgba_png(tmp_path):
    ramp = _ramp().astype(np.uint16)
    rgb = np.stack([ramp, ramp // 2, ramp // 3], -1)
    _png(tmp_path / "rgb16.png", rgb)
    got = _unit(load_image(tmp_path / "rgb16.png"))
    assert np.allclose(got, rgb / 65535.0, atol=1 / 255)  # 8-bit precision, right tones
    rgba = np.concatenate([rgb, np.full_like(rgb[..., :1], 65535)], -1)
    _png(tmp_path / "rgba16.png", rgba)
    d = load_image(tmp_path / "rgba16.png")
    assert np.allclose(_unit(d), rgb / 65535.0, atol=1 / 255) and any("alpha" in n for n in d.notes)


def test_alpha_is_dropped_like_comfyui_and_said_so(tmp_path):
    rgba = np.zeros((8, 8, 4), np.uint8)
    rgba[..., 0] = 200  # red under fully transparent pixels
    Image.fromarray(rgba, "RGBA").save(tmp_path / "t.png")
    d = load_image(tmp_path / "t.png")
    assert np.allclose(_unit(d)[..., 0], 200 / 255) and np.allclose(_unit(d)[..., 1:], 0)
    assert len(d.notes) == 1 and "alpha channel is ignored" in d.notes[0]


def test_palette_and_cmyk(tmp_path):
    rgb = np.zeros((16, 16, 3), np.uint8)
    rgb[:8] = (255, 0, 0)
    rgb[8:] = (0, 0, 255)
    Image.fromarray(rgb).convert("P", palette=Image.Palette.ADAPTIVE, colors=4).save(tmp_path / "p.png")
    assert np.allclose(_unit(load_image(tmp_path / "p.png")), rgb / 255.0, atol=1e-6)
    Image.fromarray(rgb).convert("CMYK").save(tmp_path / "c.jpg", quality=100)
    assert Image.open(tmp_path / "c.jpg").mode == "CMYK"
    assert np.abs(_unit(load_image(tmp_path / "c.jpg")) - rgb / 255.0).mean() < 0.05


def test_exif_orientation_is_applied(tmp_path):
    rgb = np.zeros((10, 30, 3), np.uint8)
    rgb[:, :5] = 255  # a white bar on the left
    im = Image.fromarray(rgb)
    exif = im.getexif()
    exif[0x0112] = 6  # "rotate 90 CW to display"
    im.save(tmp_path / "phone.jpg", exif=exif.tobytes(), quality=100)
    d = load_image(tmp_path / "phone.jpg")
    assert d.size == (30, 10) and any("EXIF" in n for n in d.notes)
    assert _unit(d)[:5].mean() > 0.9 and _unit(d)[-5:].mean() < 0.1  # the bar is now on top


def test_not_an_image(tmp_path):
    (tmp_path / "notes.png").write_text("this is text, not a PNG")
    with pytest.raises(ImageFileError, match=r"notes\.png is not an image Pillow can read"):
        load_image(tmp_path / "notes.png")
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_image(tmp_path / "missing.png")
    with pytest.raises(ImageFileError, match="is not a file"):
        load_image(tmp_path)


def test_truncated_image(tmp_path):
    buf = io.BytesIO()
    Image.fromarray(np.random.default_rng(1).integers(0, 256, (64, 64, 3), dtype=np.uint8)).save(buf, "PNG")
    (tmp_path / "cut.png").write_bytes(buf.getvalue()[: len(buf.getvalue()) // 2])
    with pytest.raises(ImageFileError, match="damaged or truncated"):
        load_image(tmp_path / "cut.png")


def test_decompression_bomb_is_a_message(tmp_path):
    """A PNG whose header claims 30000 x 30000 pixels (900 MP): refused from the header, nothing decoded."""
    bomb = _png(tmp_path / "bomb.png", np.zeros((1, 1), np.uint8), bit_depth=8, width=30000, height=30000)
    with pytest.raises(ImageFileError, match="decompression-bomb limit") as e:
        load_image(bomb)
    assert "bomb.png" in str(e.value) and "1280x720" in str(e.value)
