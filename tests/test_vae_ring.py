"""The VAE decoder's one-frame steps through FrameRings (wan/vae/blocks.py) against the concatenating path."""
import torch

from lingbot_world.wan.vae.blocks import CausalConv3d, FrameRing, ResidualBlock


def _randomize(module: torch.nn.Module, seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in module.named_parameters():
            p.copy_(1 + 0.2 * torch.randn(p.shape, generator=g) if name.endswith("gamma")
                    else torch.randn(p.shape, generator=g) / max(1, p[0].numel()) ** 0.5)


def test_ring_slots_hold_the_taps_in_turn():
    ring = FrameRing(torch.zeros(1, 2, 1, 3, 4), torch.float32)
    seen = []
    for _ in range(4):
        slot = ring.next_slot()
        assert slot.shape == (1, 2, 1, 3, 4)
        slot.fill_(len(seen) + 1.0)
        ring.advance()
        seen.append(ring.taps())
        newest = ring.taps().index(2)
        assert ring.buf[:, :, :, newest].eq(len(seen)).all()  # the slot with tap 2 holds the frame just written
    assert seen == [(2, 0, 1), (1, 2, 0), (0, 1, 2), (2, 0, 1)]
    assert ring.stacked().shape == (1, 6, 3, 4) and ring.stacked().is_contiguous(memory_format=torch.channels_last)
    assert ring.nbytes == 1 * 3 * 4 * 3 * 2 * 4


def test_residual_block_steps_equal_its_forward_one_frame_at_a_time():
    torch.manual_seed(0)
    for cin, cout in ((6, 6), (4, 6)):  # identity and 1x1x1 shortcut
        block = ResidualBlock(cin, cout).eval()
        _randomize(block, cin + cout)
        frames = torch.randn(1, cin, 5, 6, 7)
        with torch.inference_mode():
            ref_cache, ring_cache = {}, {}
            ref = [block(frames[:, :, i:i + 1], ref_cache) for i in range(5)]
            got = [block.step(frames[:, :, i:i + 1], ring_cache) for i in range(5)]
        assert all(isinstance(ring_cache[m], FrameRing) for m in (block.residual[2], block.residual[6]))
        for a, b in zip(got, ref):
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)  # the same sums, taps in another order
        # the whole clip through the 3-tap conv at once: the reference's chunked semantics
        with torch.inference_mode():
            whole = block(frames, {})
        torch.testing.assert_close(torch.cat(got, dim=2), whole, rtol=1e-5, atol=1e-6)


def test_ring_weights_follow_an_in_place_change_of_the_weight():
    conv = CausalConv3d(3, 4, 3, padding=1).eval()
    x = torch.randn(1, 3, 1, 5, 5)
    with torch.inference_mode():
        cache = {}
        ring = conv.ring(cache, x)
        ring.next_slot().copy_(x)
        before = conv.conv_ring(ring)
        conv.weight.mul_(2.0)
        conv.bias.zero_()
        ring.next_slot().copy_(x)
        after = conv.conv_ring(ring)
        # the reference: the concatenating path on the same two frames with the doubled weight
        ref = conv.conv_after(torch.cat([x, x], dim=2))[:, :, -1:]
    torch.testing.assert_close(after, ref, rtol=1e-5, atol=1e-6)
    assert not torch.allclose(before, after)


def test_rings_store_and_compute_in_autocast_dtype():
    block = ResidualBlock(6, 6).eval()
    _randomize(block, 3)
    frames = torch.randn(1, 6, 3, 6, 7)
    with torch.inference_mode(), torch.autocast("cpu", dtype=torch.bfloat16):
        cache = {}
        got = torch.cat([block.step(frames[:, :, i:i + 1], cache) for i in range(3)], dim=2)
    with torch.inference_mode():
        ref = block(frames, {})
    assert cache[block.residual[2]].buf.dtype == torch.bfloat16 and got.dtype == torch.bfloat16
    assert ((got.float() - ref).norm() / ref.norm()).item() < 2e-2  # bf16 rounding of the same sums


def test_a_decoder_runs_the_norm_silu_it_is_given_and_the_cpu_gets_the_eager_ops():
    from lingbot_world.speed.vae_norm import decoder_norm_silu, fused_norm_silu
    from lingbot_world.wan.vae.blocks import norm_silu_into
    from lingbot_world.wan.vae.model import VAEConfig, WanVAE
    from lingbot_world.wan.vae.streaming import StreamingDecoder

    assert decoder_norm_silu("cpu") is None
    torch.manual_seed(0)
    vae = WanVAE(VAEConfig.tiny()).eval()
    z = torch.randn(1, 16, 3, 4, 6)
    calls = []

    def counting(norm, x, out):
        calls.append(x.shape)
        norm_silu_into(norm, x, out)

    base = vae.decode(z)
    assert torch.equal(vae.decode(z, norm_silu=counting), base)
    n_tail = len(calls)
    assert n_tail > 0 and all(s[2] == 1 for s in calls)  # one frame at a time, every tail norm
    assert torch.equal(StreamingDecoder(vae, norm_silu=counting).decode(z), base) and len(calls) == 2 * n_tail
    # the fused op on CPU tensors falls back to the eager ops: the same bits
    assert torch.equal(vae.decode(z, norm_silu=fused_norm_silu), base)


def test_rings_run_on_weights_made_under_inference_mode():
    from lingbot_world.wan.vae.model import VAEConfig, WanVAE

    torch.manual_seed(0)
    vae = WanVAE(VAEConfig.tiny()).eval()
    z = torch.randn(1, 16, 2, 4, 6)
    want = vae.decode(z)
    with torch.inference_mode():  # as ComfyUI loads models: the weights become inference tensors
        frozen = WanVAE(VAEConfig.tiny()).eval()
        frozen.load_state_dict(vae.state_dict())
    assert frozen.decoder.head[2].weight.is_inference()
    assert torch.equal(frozen.decode(z), want)
