"""Streaming decode (wan/vae/streaming.py): chunk by chunk with the causal feature cache carried over equals one
whole-video decode, bit for bit (the same operations run: conv2 and the decoder per latent frame)."""
import pytest
import torch

from lingbot_world.speed.decode import decode_precision
from lingbot_world.wan.vae.model import VAEConfig, WanVAE
from lingbot_world.wan.vae.streaming import StreamingDecoder, streaming_decode_bytes


@pytest.fixture(scope="module")
def vae():
    torch.manual_seed(1)
    return WanVAE(VAEConfig.tiny()).eval()


@pytest.mark.parametrize("tiled", [False, True])
def test_chunk_by_chunk_equals_the_whole_decode(vae, tiled):
    z = torch.randn(1, 16, 9, 4, 6, generator=torch.Generator().manual_seed(2))
    kw = dict(tiled=True, tile=4, overlap=1) if tiled else {}
    whole = vae.decode(z, **kw)
    dec = StreamingDecoder(vae, **kw)
    parts = [dec.decode(z[:, :, s:s + 3]) for s in range(0, 9, 3)]
    assert [p.shape[2] for p in parts] == [9, 12, 12] and dec.frames == 33 == whole.shape[2]
    assert torch.equal(torch.cat(parts, dim=2), whole)
    dec.close()
    assert not dec.caches


def test_stream_refuses_a_chunk_of_another_video(vae):
    dec = StreamingDecoder(vae)
    dec.decode(torch.zeros(1, 16, 3, 4, 6))
    with pytest.raises(ValueError, match="does not continue"):
        dec.decode(torch.zeros(1, 16, 3, 4, 8))


def test_streaming_decode_bytes_grow_with_the_frame_area():
    cfg = VAEConfig.tiny()
    small, big = streaming_decode_bytes(cfg, 64, 96), streaming_decode_bytes(cfg, 128, 192)
    assert 0 < small < big < 5 * small


def _cache_bytes(dec: StreamingDecoder) -> tuple[int, int]:
    """(ring bytes, other feature-cache bytes) a decoder holds between chunks."""
    from lingbot_world.wan.vae.blocks import FrameRing

    held = [v for c in dec.caches.values() for v in c.values()]
    rings = sum(v.nbytes for v in held if isinstance(v, FrameRing))
    return rings, sum(v.numel() * v.element_size() for v in held if isinstance(v, torch.Tensor))


def _held_after_two_chunks(vae, h: int, w: int, dtype: str) -> tuple[int, int]:
    dec = StreamingDecoder(vae)
    with decode_precision("cpu", dtype):
        for _ in range(2):
            dec.decode(torch.randn(1, 16, 3, h // 8, w // 8))
    return _cache_bytes(dec)


@pytest.mark.parametrize("half", ["bf16", "fp16"])
def test_a_half_precision_decode_is_planned_with_half_the_ring_bytes(vae, half):
    """Under bf16 or fp16 autocast (the presets' decode levers) the decoder's rings take half the bytes, and the
    estimate the memory plan reserves for the decoder is smaller by exactly that half of the rings a float32 decode
    holds; what the half-precision decode really holds between chunks stays within the estimate's caches."""
    h, w = 48, 64
    rings32, other32 = _held_after_two_chunks(vae, h, w, "float32")
    rings16, other16 = _held_after_two_chunks(vae, h, w, half)
    assert rings32 > 4 * other32 > 0 and rings16 * 2 == rings32
    f32, b16 = streaming_decode_bytes(vae.cfg, h, w), streaming_decode_bytes(vae.cfg, h, w, half=True)
    assert abs((f32 - b16) - rings32 / 2) <= 1
    assert rings16 + other16 <= rings32 / 2 + other32
