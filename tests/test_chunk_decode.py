"""The chunk decode levers (issue 26, speed/decode.py): in order, the same frames as the streaming decoder, fp16
and bf16 under autocast bounded; on a GPU the side-stream decode gives the same bits (tests/test_fast_speed_cuda.py)."""
from __future__ import annotations

import pytest
import torch

from lingbot_world.speed.decode import ChunkDecoder
from lingbot_world.speed.levers import ChunkLevers
from lingbot_world.wan.vae.model import VAEConfig, WanVAE
from lingbot_world.wan.vae.streaming import StreamingDecoder
from lingbot_world.world.models import V1_FAST


def _vae_and_latent():
    torch.manual_seed(0)
    vae = WanVAE(VAEConfig.tiny()).eval().requires_grad_(False)
    return vae, torch.randn(1, 16, 4, 4, 4, generator=torch.Generator().manual_seed(2))


def test_the_plain_decoder_gives_the_streaming_decoders_frames():
    vae, z = _vae_and_latent()
    ref = StreamingDecoder(vae)
    want = [ref.decode(z[:, :, :2]), ref.decode(z[:, :, 2:])]
    dec = ChunkDecoder(StreamingDecoder(vae).decode, "cpu", overlap=True)  # no side stream off CUDA
    assert not dec.overlapped
    pending = [dec.submit(z[:, :, :2]), dec.submit(z[:, :, 2:])]
    assert all(p.ready() for p in pending)
    for p, w in zip(pending, want):
        assert torch.equal(p.result(), w)


def _half_decode_error(dtype: str) -> float:
    vae, z = _vae_and_latent()
    ref = StreamingDecoder(vae)
    want = torch.cat([ref.decode(z[:, :, :2]), ref.decode(z[:, :, 2:])], dim=2)
    dec = ChunkDecoder(StreamingDecoder(vae).decode, "cpu", dtype=dtype)
    got = torch.cat([dec.submit(z[:, :, :2]).result(), dec.submit(z[:, :, 2:]).result()], dim=2)
    assert got.dtype == torch.float32 and got.shape == want.shape
    return ((got - want).norm() / want.norm()).item()


def test_half_precision_decodes_are_close_float32_out_and_fp16_is_the_closer():
    bf16, fp16 = _half_decode_error("bf16"), _half_decode_error("fp16")
    assert 1e-4 < bf16 < 0.05
    assert 0 < fp16 < bf16 / 3  # 10 bits of mantissa against 7


def test_an_unknown_decode_dtype_is_refused_by_name():
    with pytest.raises(ValueError, match="decode dtype 'fp8'.*float32, fp16, bf16"):
        ChunkDecoder(lambda z: z, "cpu", dtype="fp8")
    with pytest.raises(ValueError, match="decode_dtype='half'"):
        ChunkLevers(decode_dtype="half")


def test_the_decode_levers_are_described_and_exactness_follows_them():
    assert ChunkLevers(decode_overlap=True).exact  # the same frames, only later
    assert not ChunkLevers(decode_dtype="bf16").exact and not ChunkLevers(decode_dtype="fp16").exact
    notes = ChunkLevers(decode_overlap=True, decode_dtype="fp16").describe()
    assert any("side stream" in n for n in notes) and any("decode in fp16" in n for n in notes)
    assert ChunkLevers(decode_overlap=True).fast_run_options(V1_FAST.recipe) == {}  # the chunk loop itself is unchanged


def test_every_world_decode_runs_in_the_plans_precision_and_refuses_non_finite_frames():
    from lingbot_world.speed.options import SpeedPlan
    from lingbot_world.world.decoding import plan_decode
    from lingbot_world.world.errors import WorldError

    seen = []

    def decode(value=0.5):
        seen.append(torch.get_autocast_dtype("cpu") if torch.is_autocast_enabled("cpu") else torch.float32)
        return torch.full((3, 2, 4, 4), value)

    fp16 = SpeedPlan("off", "bf16", "sdpa", "cpu", levers=ChunkLevers(decode_dtype="fp16"))
    assert plan_decode("cpu", fp16, decode).eq(0.5).all()
    plan_decode("cpu", None, decode)  # no plan: the release's float32
    assert seen == [torch.float16, torch.float32]
    with pytest.raises(WorldError, match=r"inf/NaN: the VAE decode runs in fp16 .*--speed exact"):
        plan_decode("cpu", fp16, lambda: decode(float("nan")))
    with pytest.raises(WorldError, match=r"inf/NaN: the float32 decode of finite latents .*check the VAE"):
        plan_decode("cpu", None, lambda: decode(float("inf")))
