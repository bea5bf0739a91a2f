"""Wan2.1 VAE: key layout, parity with diffusers' AutoencoderKLWan, chunking, normalisation, tiling."""
import re

import pytest
import torch

from lingbot_world.wan.vae.model import (LATENT_MEAN, LATENT_STD, VAEConfig, WanVAE, check_video_size, ramp_weights,
                                   tile_spans)

diffusers = pytest.importorskip("diffusers")
from diffusers import AutoencoderKLWan  # noqa: E402

TINY = VAEConfig.tiny()


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a - b).abs().max() / b.abs().max()).item()


def randomize(model: torch.nn.Module) -> None:
    """Random weights everywhere (norm gammas too), decoder output kept inside (-1, 1) so clamping hides nothing."""
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("gamma"):
                p.copy_(1 + 0.2 * torch.randn(p.shape, generator=g))
            else:
                fan_in = p[0].numel() if p.dim() > 1 else 1
                p.copy_(torch.randn(p.shape, generator=g) / fan_in**0.5)
        model.decoder.head[2].weight.mul_(0.1)
        model.decoder.head[2].bias.zero_()


def to_diffusers_key(key: str, cfg: VAEConfig) -> str:
    """Our (= the release's) key -> diffusers' AutoencoderKLWan key."""
    top = {"conv1.": "quant_conv.", "conv2.": "post_quant_conv."}
    for a, b in top.items():
        if key.startswith(a):
            return b + key[len(a):]
    part, rest = key.split(".", 1)
    rest = re.sub(r"^conv1\.", "conv_in.", rest)
    rest = re.sub(r"^head\.0\.", "norm_out.", rest)
    rest = re.sub(r"^head\.2\.", "conv_out.", rest)
    rest = re.sub(r"^middle\.0\.", "mid_block.resnets.0.", rest)
    rest = re.sub(r"^middle\.1\.", "mid_block.attentions.0.", rest)
    rest = re.sub(r"^middle\.2\.", "mid_block.resnets.1.", rest)
    rest = rest.replace("downsamples.", "down_blocks.")
    m = re.match(r"^upsamples\.(\d+)\.(.*)$", rest)
    if m:  # the release's flat decoder list -> diffusers' per-level blocks
        flat, tail = int(m.group(1)), m.group(2)
        per_level = cfg.num_res_blocks + 2  # resnets + one upsampler (none on the last level)
        level, j = divmod(flat, per_level)
        rest = (f"up_blocks.{level}.resnets.{j}.{tail}" if j <= cfg.num_res_blocks
                else f"up_blocks.{level}.upsamplers.0.{tail}")
    for a, b in {"residual.0.": "norm1.", "residual.2.": "conv1.", "residual.3.": "norm2.",
                 "residual.6.": "conv2.", "shortcut.": "conv_shortcut."}.items():
        rest = rest.replace(a, b)
    return f"{part}.{rest}"


@pytest.fixture(scope="module")
def pair():
    torch.manual_seed(0)
    ours = WanVAE(TINY).eval()
    randomize(ours)
    ref = AutoencoderKLWan(base_dim=TINY.dim, z_dim=TINY.z_dim, dim_mult=list(TINY.dim_mult),
                           num_res_blocks=TINY.num_res_blocks,
                           temperal_downsample=list(TINY.temporal_downsample)).eval()
    converted = {to_diffusers_key(k, TINY): v for k, v in ours.state_dict().items()}
    ref.load_state_dict(converted, strict=True)
    return ours, ref


def test_full_size_layout_matches_release():
    with torch.device("meta"):
        vae = WanVAE()
    sd = vae.state_dict()
    assert len(sd) == 194
    assert sum(v.numel() for v in sd.values()) == 126_892_531
    assert sum(v.numel() for k, v in sd.items() if k.startswith("encoder.")) == 53_595_872
    assert sum(v.numel() for k, v in sd.items() if k.startswith("decoder.")) == 73_295_331
    assert sd["decoder.middle.0.residual.0.gamma"].shape == (384, 1, 1, 1)
    assert sd["decoder.middle.1.norm.gamma"].shape == (384, 1, 1)
    assert sd["encoder.head.2.weight"].shape == (32, 384, 3, 3, 3)
    assert sd["conv1.weight"].shape == (32, 32, 1, 1, 1) and sd["conv2.weight"].shape == (16, 16, 1, 1, 1)
    assert sd["decoder.upsamples.3.time_conv.weight"].shape == (768, 384, 3, 1, 1)
    assert sd["decoder.upsamples.11.resample.1.weight"].shape == (96, 192, 3, 3)
    assert sd["encoder.downsamples.5.time_conv.weight"].shape == (192, 192, 3, 1, 1)
    # every key maps onto diffusers' full-size model (the conversion used for parity is the right one)
    with torch.device("meta"):
        ref = AutoencoderKLWan()
    ref_sd = ref.state_dict()
    conv = {to_diffusers_key(k, VAEConfig()): tuple(v.shape) for k, v in sd.items()}
    assert conv == {k: tuple(v.shape) for k, v in ref_sd.items()}


def _frames_per_call(module: torch.nn.Module, calls: list):
    return module.register_forward_pre_hook(lambda m, args: calls.append(args[0].shape[2]))


def test_encode_parity_and_chunking(pair):
    ours, ref = pair
    video = torch.rand(1, 3, 9, 32, 48) * 2 - 1
    ours_calls, ref_calls = [], []
    h1 = _frames_per_call(ours.encoder, ours_calls)
    h2 = _frames_per_call(ref.encoder, ref_calls)
    try:
        with torch.no_grad():
            expected = ref.encode(video).latent_dist.mean  # raw mu
        got = ours.encode_raw(video)
    finally:
        h1.remove()
        h2.remove()
    assert ref_calls == [1, 4, 4] and ours_calls == [1, 4, 4]  # frame 0 alone, then chunks of 4
    assert got.shape == (1, 16, 3, 4, 6) and got.dtype == torch.float32
    err = rel_err(got, expected)
    print(f"\nencode parity vs diffusers: relative max error {err:.2e}")
    assert err <= 1e-5


def test_decode_parity_and_chunking(pair):
    ours, ref = pair
    mu = torch.randn(1, 16, 3, 4, 6)
    ours_calls, ref_calls = [], []
    h1 = _frames_per_call(ours.decoder, ours_calls)
    h2 = _frames_per_call(ref.decoder, ref_calls)
    try:
        with torch.no_grad():
            expected = ref.decode(mu).sample
        got = ours.decode_raw(mu)
    finally:
        h1.remove()
        h2.remove()
    assert ref_calls == [1, 1, 1] and ours_calls == [1, 1, 1]  # one latent frame at a time
    assert got.shape == (1, 3, 9, 32, 48)
    assert (got.abs() < 1).float().mean() > 0.99  # the comparison is not hidden by clamping
    err = rel_err(got, expected)
    print(f"\ndecode parity vs diffusers: relative max error {err:.2e}")
    assert err <= 1e-5


def test_normalisation(pair):
    ours, ref = pair
    assert torch.allclose(torch.tensor(ref.config.latents_mean), torch.tensor(LATENT_MEAN))
    assert torch.allclose(torch.tensor(ref.config.latents_std), torch.tensor(LATENT_STD))
    mu = torch.randn(2, 16, 2, 3, 5) * 3
    mean = torch.tensor(LATENT_MEAN).view(1, 16, 1, 1, 1)
    std = torch.tensor(LATENT_STD).view(1, 16, 1, 1, 1)
    z = ours.normalize(mu)
    torch.testing.assert_close(z, (mu - mean) / std, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(ours.denormalize(z), mu, rtol=1e-6, atol=1e-5)
    # encode/decode = raw paths plus (de)normalisation
    video = torch.rand(1, 3, 5, 32, 32) * 2 - 1
    torch.testing.assert_close(ours.encode(video), ours.normalize(ours.encode_raw(video)), rtol=0, atol=0)
    torch.testing.assert_close(ours.decode(z[:1]), ours.decode_raw(ours.denormalize(z[:1])), rtol=0, atol=0)


def test_batch_equals_one_by_one(pair):
    ours, _ = pair
    video = torch.rand(2, 3, 5, 32, 32) * 2 - 1
    z = ours.encode(video)
    torch.testing.assert_close(z[1:], ours.encode(video[1:]), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(ours.decode(z)[:1], ours.decode(z[:1]), rtol=1e-5, atol=1e-6)


def test_output_is_clamped_and_a_normal_tensor(pair):
    ours, _ = pair
    loud = WanVAE(TINY).eval()
    loud.load_state_dict(ours.state_dict())
    with torch.no_grad():
        loud.decoder.head[2].weight.mul_(1000)
    out = loud.decode(torch.randn(1, 16, 2, 2, 2))
    assert out.min() >= -1 and out.max() <= 1 and (out.abs() == 1).any()
    assert not out.is_inference()
    out.mul_(0.5)  # callers may modify results in place


def test_bad_shapes_are_refused(pair):
    ours, _ = pair
    with pytest.raises(ValueError, match=r"frames=8 is not 4n\+1 \(nearest valid: 5 or 9\)"):
        ours.encode(torch.zeros(1, 3, 8, 32, 32))
    with pytest.raises(ValueError, match=r"width=40 is not a multiple of 16 \(nearest valid: 32 or 48\)"):
        ours.encode(torch.zeros(1, 3, 5, 32, 40))
    with pytest.raises(ValueError, match=r"\[B,3,F,H,W\]"):
        ours.encode(torch.zeros(3, 5, 32, 32))
    with pytest.raises(ValueError, match=r"\[B,16,F_lat,h,w\]"):
        ours.decode(torch.zeros(1, 4, 2, 4, 4))
    with pytest.raises(ValueError, match=r"height=470 .*464 or 480"):
        check_video_size(81, 470, 832)
    check_video_size(81, 464, 832)


def test_tile_spans_and_ramps():
    assert tile_spans(20, 32, 8) == [(0, 20)]
    spans = tile_spans(58, 32, 8)
    assert spans[0][0] == 0 and spans[-1][1] == 58
    assert all(b[0] < a[1] - 7 for a, b in zip(spans, spans[1:]))  # overlaps of >= 8 cells
    assert tile_spans(104, 32, 8) == [(0, 32), (24, 56), (48, 80), (72, 104)]
    w = ramp_weights([(0, 4), (2, 6)], 2)
    torch.testing.assert_close(w[0][4:] + w[1][:4], torch.ones(4))  # a crossfade across the shared cells
    assert w[0][0] == 1 and w[1][-1] == 1 and (w[0][4:].diff() < 0).all()


def test_tile_blending_reassembles_a_known_field():
    """Tiles cut from one tensor blend back to exactly that tensor (weights form a partition of unity)."""
    full = torch.randn(1, 3, 5, 8 * 13, 8 * 21)
    out = torch.empty_like(full)
    WanVAE._blend_tiles(out, lambda ys, xs: full[..., ys[0] * 8:ys[1] * 8, xs[0] * 8:xs[1] * 8],
                        tile_spans(13, 6, 2), tile_spans(21, 8, 3), 8)
    torch.testing.assert_close(out, full, rtol=1e-5, atol=1e-5)


def test_tiled_equals_untiled_when_one_tile_covers_all(pair):
    ours, _ = pair
    mu = torch.randn(1, 16, 2, 4, 6)
    torch.testing.assert_close(ours.decode_raw(mu, tiled=True, tile=8), ours.decode_raw(mu), rtol=0, atol=0)
    video = torch.rand(1, 3, 5, 32, 48) * 2 - 1
    torch.testing.assert_close(ours.encode_raw(video, tiled=True, tile=8), ours.encode_raw(video), rtol=0, atol=0)


def _smooth_latent(t, h, w):
    """A low-frequency latent (real latents are smooth at tile scale), so tile errors measure seams."""
    coarse = torch.randn(1, 16, t, 3, 4)
    return torch.nn.functional.interpolate(coarse, size=(t, h, w), mode="trilinear", align_corners=True)


def test_tiled_decode_close_to_untiled(pair):
    ours, _ = pair
    mu = _smooth_latent(3, 16, 24)
    full = ours.decode_raw(mu)
    tiled = ours.decode_raw(mu, tiled=True, tile=10, overlap=4)
    err = (tiled - full).abs()
    # blend zones (where two tiles mix) vs the rest
    seam = torch.zeros(full.shape[-2:], dtype=torch.bool)
    for spans, axis in ((tile_spans(16, 10, 4), 0), (tile_spans(24, 10, 4), 1)):
        for a, b in zip(spans, spans[1:]):
            idx = slice(b[0] * 8, a[1] * 8)
            if axis == 0:
                seam[idx, :] = True
            else:
                seam[:, idx] = True
    rng = (full.max() - full.min()).item()
    print(f"\ntiled decode vs untiled (range {rng:.3f}): max {err.max():.2e}, mean {err.mean():.2e}, "
          f"mean in blend zones {err[..., seam].mean():.2e}, elsewhere {err[..., ~seam].mean():.2e}")
    assert err.mean() < 0.02 * rng and err.max() < 0.2 * rng


def test_tiled_encode_close_to_untiled(pair):
    ours, _ = pair
    coarse = torch.rand(1, 3, 5, 4, 6) * 2 - 1
    video = torch.nn.functional.interpolate(coarse, size=(5, 128, 192), mode="trilinear", align_corners=True)
    full = ours.encode_raw(video)
    tiled = ours.encode_raw(video, tiled=True, tile=10, overlap=4)
    err = (tiled - full).abs()
    rng = (full.max() - full.min()).item()
    print(f"\ntiled encode vs untiled (range {rng:.3f}): max {err.max():.2e}, mean {err.mean():.2e}")
    assert err.mean() < 0.02 * rng and err.max() < 0.2 * rng
