"""The tiny decoders against their upstream code: frames TAEHV's `taehv.py` and lightx2v's `WanVAE_tiny` made from the
same seeded weights and latent (tests/fixtures/tiny_vae/make_fixtures.py wrote them; no upstream code is in the
repository). The file's contents, not its name, decide which latents it takes."""
from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from lingbot_world.loaders.tiny_vae_files import check_tiny_decoder_file, load_tiny_decoder
from lingbot_world.wan.vae.tiny import TinyConfig, TinyDecoder, TinyStreamingDecoder

from tests.conftest import load_sibling

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "tiny_vae"


make = load_sibling("fixtures/tiny_vae/make_fixtures")


@pytest.fixture(scope="module")
def weights() -> dict:
    return make.seeded_decoder_weights()


def _write(path: Path, weights: dict, dtype: torch.dtype) -> Path:
    save_file({k: v.to(dtype).contiguous() for k, v in weights.items()}, str(path))
    return path


def _decode(path: Path, chunks=(5,)) -> torch.Tensor:
    """The project's frames [1, 3, T, H, W] in [-1, 1], decoded chunk by chunk in float32."""
    decoder = TinyStreamingDecoder(load_tiny_decoder(path))
    z, at, out = make.seeded_latent(), 0, []
    for n in chunks:
        out.append(decoder.decode(z[:, :, at:at + n]))
        at += n
    return torch.cat(out, 2)


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a - b).norm() / b.norm()).item()


def test_the_fixtures_are_small_and_say_what_made_them():
    files = sorted(FIXTURES.glob("*.safetensors"))
    assert [f.name for f in files] == ["lightx2v_lighttaew2_1.safetensors", "taehv_taew2_1.safetensors"]
    assert sum(f.stat().st_size for f in files) < 300_000
    from safetensors import safe_open

    for f in files:
        with safe_open(str(f), "pt") as s:
            assert s.metadata()["seed"] == str(make.SEED)
            assert ".py " in s.metadata()["upstream"]  # each upstream file's name and sha256


def test_a_float16_file_is_taehv_and_matches_taehv_py(tmp_path, weights):
    """taew2_1 as released (float16) decodes the normalised latent: TAEHV's own decode_video, NTCHW in [0, 1]."""
    path = _write(tmp_path / "lighttaew2_1.safetensors", weights, torch.float16)  # the name says otherwise
    assert check_tiny_decoder_file(path).raw_latents is False
    ref = load_file(str(FIXTURES / "taehv_taew2_1.safetensors"))["frames"]  # [1, T, 3, H, W] in [0, 1]
    ref = (ref * 2 - 1).transpose(1, 2)
    ours = _decode(path, chunks=(2, 1, 2))
    assert ours.shape == ref.shape == (1, 3, 17, 16, 24)
    torch.testing.assert_close(ours, ref, rtol=0, atol=1e-5)
    assert _rel(ours, ref) < 1e-6
    assert ref.std() > 0.05 and (ref.abs() < 0.999).float().mean() > 0.5  # a picture, not a clamped constant


def test_a_float32_file_is_lighttae_and_matches_lightx2v(tmp_path, weights):
    """lighttaew2_1 as released (float32) decodes the VAE's raw latent z·std + mean: lightx2v's WanVAE_tiny with
    need_scaled=True, fed the same normalised latent, [1, 3, T, H, W] in [-1, 1]."""
    path = _write(tmp_path / "taew2_1.safetensors", weights, torch.float32)  # the name says otherwise
    assert check_tiny_decoder_file(path).raw_latents is True
    ref = load_file(str(FIXTURES / "lightx2v_lighttaew2_1.safetensors"))["frames"]
    ours = _decode(path, chunks=(1, 4))
    assert ours.shape == ref.shape == (1, 3, 17, 16, 24)
    torch.testing.assert_close(ours, ref, rtol=0, atol=1e-5)
    assert _rel(ours, ref) < 1e-6
    assert ref.std() > 0.05
    bf16 = _write(tmp_path / "bf16.safetensors", weights, torch.bfloat16)
    assert check_tiny_decoder_file(bf16).raw_latents is True  # a bfloat16 copy of LightTAE stays LightTAE


def test_the_scaling_is_what_tells_the_two_apart(tmp_path, weights):
    """Read the wrong way, the same weights give other frames: the fixtures would catch a lost scaling."""
    path = _write(tmp_path / "f32.safetensors", weights, torch.float32)
    light = TinyStreamingDecoder(load_tiny_decoder(path)).decode(make.seeded_latent())
    model = load_tiny_decoder(path)
    model.cfg = dataclasses.replace(model.cfg, raw_latents=False)
    plain = TinyStreamingDecoder(model).decode(make.seeded_latent())
    assert _rel(plain, light) > 0.1
    ref = load_file(str(FIXTURES / "lightx2v_lighttaew2_1.safetensors"))["frames"]
    assert _rel(plain, ref) > 0.1 and _rel(light, ref) < 1e-5


def test_raw_latents_are_scaled_in_float32_then_rounded_once():
    with torch.device("meta"):
        model = TinyDecoder(TinyConfig(widths=(4, 4, 4, 4), raw_latents=True)).to(torch.bfloat16)
    model = model.to_empty(device="cpu")
    z = torch.randn(1, 16, 2, 3, 3)
    got = model.decoder_input(z)
    from lingbot_world.wan.vae.model import LATENT_MEAN, LATENT_STD

    want = (z * torch.tensor(LATENT_STD).view(1, 16, 1, 1, 1) + torch.tensor(LATENT_MEAN).view(1, 16, 1, 1, 1))
    assert got.dtype == torch.bfloat16
    torch.testing.assert_close(got, want.to(torch.bfloat16), rtol=0, atol=0)
