"""The chunk decode levers (issue 26, speed/decode.py): in order, the same frames as the streaming decoder, bf16
under autocast bounded; on a GPU the side-stream decode gives the same bits (tests/test_fast_speed_cuda.py)."""
from __future__ import annotations

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


def test_bf16_decode_is_close_and_float32_out():
    vae, z = _vae_and_latent()
    ref = StreamingDecoder(vae)
    want = torch.cat([ref.decode(z[:, :, :2]), ref.decode(z[:, :, 2:])], dim=2)
    dec = ChunkDecoder(StreamingDecoder(vae).decode, "cpu", bf16=True)
    got = torch.cat([dec.submit(z[:, :, :2]).result(), dec.submit(z[:, :, 2:]).result()], dim=2)
    err = ((got - want).norm() / want.norm()).item()
    assert got.dtype == torch.float32 and got.shape == want.shape and 1e-4 < err < 0.05


def test_the_decode_levers_are_described_and_exactness_follows_them():
    assert ChunkLevers(decode_overlap=True).exact  # the same frames, only later
    assert not ChunkLevers(decode_bf16=True).exact
    notes = ChunkLevers(decode_overlap=True, decode_bf16=True).describe()
    assert any("side stream" in n for n in notes) and any("bf16" in n for n in notes)
    assert ChunkLevers(decode_overlap=True).fast_run_options(V1_FAST.recipe) == {}  # the chunk loop itself is unchanged
