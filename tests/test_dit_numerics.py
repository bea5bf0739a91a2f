"""Numerical behaviour of the DiT: RoPE against a complex float64 implementation, broadcast vs per-token time
modulation, FFN chunking, batching, bf16 smoke, and the timestep sinusoid (spec §2.4-2.7)."""
from __future__ import annotations

import math

import pytest
import torch

from lingbot_world.wan.dit import token_ops
from lingbot_world.wan.dit.blocks import DEFAULT_TOKEN_CHUNK
from lingbot_world.wan.dit.model import CAMERA_CHANNELS, DiTConfig, WanDiT, sinusoidal_embedding
from lingbot_world.wan.dit.rope import RopeCache, apply_rope, axis_dims

CFG = DiTConfig.tiny()



@pytest.fixture(scope="module")
def model(randomise_dit) -> WanDiT:
    m = WanDiT(CFG).eval()
    randomise_dit(m, torch.Generator().manual_seed(11))
    return m


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a - b).norm() / b.norm()).item()


def make_inputs(gen: torch.Generator, b: int = 2, f: int = 3, h: int = 6, w: int = 10):
    x = torch.randn(b, 16, f, h, w, generator=gen)
    y = torch.randn(b, 20, f, h, w, generator=gen)
    t = torch.tensor([999, 250, 3, 600][:b])
    context = [torch.randn(5 + 6 * i, CFG.text_dim, generator=gen) for i in range(b)]
    camera = torch.randn(b, CAMERA_CHANNELS, f, h, w, generator=gen)
    return x, t, context, y, camera


# ---- RoPE ---------------------------------------------------------------------------------------------
def polar_rope(x: torch.Tensor, grid: tuple[int, int, int]) -> torch.Tensor:
    """Independent reference: 1024-position complex tables per axis (torch.polar, float64), interleaved pairs."""
    f, h, w = grid
    d = x.shape[-1]
    d_hw = 2 * (d // 6)
    d_f = d - 2 * d_hw

    def table(dims: int) -> torch.Tensor:
        omega = 1.0 / 10000.0 ** (2 * torch.arange(dims // 2, dtype=torch.float64) / dims)
        angle = torch.arange(1024, dtype=torch.float64)[:, None] * omega[None, :]
        return torch.polar(torch.ones_like(angle), angle)

    tf, th, tw = table(d_f)[:f], table(d_hw)[:h], table(d_hw)[:w]
    rot = torch.cat(
        [
            tf[:, None, None, :].expand(f, h, w, -1),
            th[None, :, None, :].expand(f, h, w, -1),
            tw[None, None, :, :].expand(f, h, w, -1),
        ],
        dim=-1,
    ).reshape(f * h * w, 1, d // 2)
    xc = torch.view_as_complex(x.double().reshape(*x.shape[:-1], d // 2, 2).contiguous())
    return torch.view_as_real(xc * rot).reshape(x.shape)


def test_rope_split_matches_spec():
    assert axis_dims(128) == (44, 42, 42)  # 22 / 21 / 21 complex pairs
    assert axis_dims(16) == (8, 4, 4)


@pytest.mark.parametrize(
    "grid,head_dim,heads",
    [((3, 45, 80), 128, 2), ((5, 3, 7), 16, 4), ((2, 1, 1024), 128, 1)],  # 720p tokens, tiny, last position
)
def test_rope_matches_complex_float64(grid, head_dim, heads):
    gen = torch.Generator().manual_seed(sum(grid))
    seq = math.prod(grid)
    x = torch.randn(1, seq, heads, head_dim, generator=gen)
    cos, sin = RopeCache(head_dim).get(grid, torch.device("cpu"))
    ours = apply_rope(x, cos, sin)
    ref = polar_rope(x, grid)
    assert ours.dtype == torch.float32
    err = (ours.double() - ref).abs().max().item()
    assert err <= 1e-6, f"RoPE max abs error {err:.2e} for grid {grid}"
    # Token (0, 0, 0) is not rotated.
    assert torch.equal(ours[:, 0], x[:, 0])


# ---- time modulation ----------------------------------------------------------------------------------
def test_sinusoid_cos_first_float64():
    t = torch.tensor([0, 1, 999])
    out = sinusoidal_embedding(32, t)
    assert out.shape == (3, 32) and out.dtype == torch.float32
    omega = 10000.0 ** (-torch.arange(16, dtype=torch.float64) / 16)
    angle = t.double()[:, None] * omega
    torch.testing.assert_close(out, torch.cat([angle.cos(), angle.sin()], 1).float(), rtol=0, atol=1e-7)
    assert torch.equal(out[0], torch.cat([torch.ones(16), torch.zeros(16)]))


def per_token_block(block, x, e0_tokens, context, cam, rope, dtype):
    """The block with per-token modulation m = modulation + e0 [B, L, 6, dim] like the reference (spec §2.4 step
    6), through the same fused per-token phases as the block, so only the broadcasting differs."""
    m = block.modulation.float()[None] + e0_tokens  # [B, L, 6, dim]
    shift_a, scale_a, gate_a, shift_f, scale_f, gate_f = m.unbind(2)
    h = token_ops.modulate(block.norm1, x, shift_a, 1 + scale_a, dtype)
    x = token_ops.gated_residual(x.float().clone(), block.self_attn(h, rope, dtype), gate_a)
    if cam is not None:
        token_ops.film(x, *block.camera_film(cam, dtype))
    x = x + block.cross_attn(token_ops.norm_to(block.norm3, x, dtype), context, dtype)
    h = token_ops.gelu_tanh(block.ffn[0](token_ops.modulate(block.norm2, x, shift_f, 1 + scale_f, dtype)))
    return token_ops.gated_residual(x, block.ffn[2](h), gate_f)


def test_broadcast_modulation_equals_per_token(model):
    gen = torch.Generator().manual_seed(21)
    b, grid = 2, (3, 3, 5)
    seq = math.prod(grid)
    t = torch.tensor([999, 37])
    x = torch.randn(b, seq, CFG.dim, generator=gen)
    ctx = model.text_embedding(torch.randn(b, CFG.text_len, CFG.text_dim, generator=gen))
    cam = model.camera_tokens(torch.randn(b, CAMERA_CHANNELS, 3, 6, 10, generator=gen), torch.float32)
    rope = model.rope.get(grid, x.device)

    with torch.no_grad():
        # Reference way: t expanded to [B, L], sinusoid, time_embedding and time_projection per token.
        t_tokens = t[:, None].expand(b, seq).reshape(-1)
        e_tok = model.time_embedding(sinusoidal_embedding(CFG.freq_dim, t_tokens)).view(b, seq, CFG.dim)
        e0_tok = model.time_projection(e_tok).view(b, seq, 6, CFG.dim)
        # All tokens of a sample carry identical rows, so one row per sample holds everything...
        assert torch.equal(e0_tok, e0_tok[:, :1].expand_as(e0_tok))
        assert torch.equal(e_tok, e_tok[:, :1].expand_as(e_tok))
        # ...and the broadcast block with that row is bit-identical to the per-token block.
        for blk in model.blocks:
            for c in (None, cam):
                ref = per_token_block(blk, x, e0_tok, ctx, c, rope, torch.float32)
                ours = blk(x, e0_tok[:, 0], ctx, c, rope, torch.float32)
                assert (ours - ref).abs().max().item() == 0.0
        # Head: e broadcast vs per token.
        shift, scale = (model.head.modulation.float()[None] + e_tok[:, :, None]).unbind(2)
        head_ref = model.head.head(token_ops.modulate(model.head.norm, x, shift, 1 + scale, torch.float32))
        assert (model.head(x, e_tok[:, 0]) - head_ref).abs().max().item() == 0.0

        # Our one-row time_modulation agrees with the per-token rows up to GEMM rounding (a [B, .] and a
        # [B*L, .] matmul may round the last bit differently).
        e, e0 = model.time_modulation(t)
        torch.testing.assert_close(e, e_tok[:, 0], rtol=1e-6, atol=1e-6)
        torch.testing.assert_close(e0, e0_tok[:, 0], rtol=1e-6, atol=1e-6)


# ---- whole-model behaviour ----------------------------------------------------------------------------
def test_token_chunking_equals_whole_sequence(model):
    x, t, ctx, y, cam = make_inputs(torch.Generator().manual_seed(31))
    with torch.no_grad():
        try:
            model.set_token_chunk(None)
            whole = model(x, t, ctx, y, camera=cam)
            model.set_token_chunk(7)  # 45 tokens -> 7 chunks, the last one short
            chunked = model(x, t, ctx, y, camera=cam)
        finally:
            model.set_token_chunk(DEFAULT_TOKEN_CHUNK)
    # Not bit-exact: a GEMM over fewer rows may round differently (measured ~1e-6 max abs on outputs ~5).
    assert rel_err(chunked, whole) <= 1e-6


def test_batch_of_two_equals_two_single_calls(model):
    x, t, ctx, y, cam = make_inputs(torch.Generator().manual_seed(41))
    with torch.no_grad():
        both = model(x, t, ctx, y, camera=cam)
        singles = torch.cat([model(x[i : i + 1], t[i : i + 1], [ctx[i]], y[i : i + 1], camera=cam[i : i + 1]) for i in range(2)])
        # A shared y and camera (batch 1) broadcast over the batch like CFG's cond/uncond pair.
        shared = model(x, t, ctx, y[:1], camera=cam[:1])
        shared_ref = torch.cat([model(x[i : i + 1], t[i : i + 1], [ctx[i]], y[:1], camera=cam[:1]) for i in range(2)])
    assert rel_err(both, singles) <= 1e-6
    assert rel_err(shared, shared_ref) <= 1e-6
    assert rel_err(both[0], both[1]) > 0.1  # the samples differ, so a mix-up would show


def test_bf16_smoke_close_to_fp32(model):
    x, t, ctx, y, cam = make_inputs(torch.Generator().manual_seed(51))
    half = WanDiT(CFG, dtype=torch.bfloat16).eval()
    half.load_state_dict(model.state_dict())
    with torch.no_grad():
        ref = model(x, t, ctx, y, camera=cam)
        out = half(x, t, ctx, y, camera=cam)
    assert out.dtype == torch.float32 and out.shape == ref.shape
    assert torch.isfinite(out).all()
    rel = rel_err(out, ref)
    assert rel < 0.05, f"bf16 vs fp32 relative error {rel:.3f}"


def test_bf16_model_with_fp32_norm_gains(model):
    # A loader may keep the small norm tensors in fp32; the attention inputs must still share one dtype.
    x, t, ctx, y, cam = make_inputs(torch.Generator().manual_seed(52))
    half = WanDiT(CFG, dtype=torch.bfloat16).eval()
    half.load_state_dict(model.state_dict())
    mixed = WanDiT(CFG, dtype=torch.bfloat16).eval()
    mixed.load_state_dict(model.state_dict())
    with torch.no_grad():
        for name, mod in mixed.named_modules():
            if name.endswith(("norm_q", "norm_k", "norm3")):
                for p in mod.parameters():
                    p.data = p.data.float()
        out = mixed(x, t, ctx, y, camera=cam)
        ref = half(x, t, ctx, y, camera=cam)
    assert rel_err(out, ref) < 0.05


def test_input_errors(model):
    x, t, ctx, y, cam = make_inputs(torch.Generator().manual_seed(61))
    with pytest.raises(ValueError, match="conditioning y"):
        model(x, t, ctx, y[:, :, :2])
    with pytest.raises(ValueError, match="512"):
        model(x, t, [torch.zeros(513, CFG.text_dim)] * 2, y)
    with pytest.raises(ValueError, match="36|channels"):
        model(x, t, ctx, y[:, :16])
    with pytest.raises(ValueError, match="divisible"):
        model(x[..., :5], t, ctx, y[..., :5])  # odd latent width would lose a column in the patch conv
    with pytest.raises(ValueError, match="wide"):
        model(x, t, [torch.zeros(4, CFG.text_dim + 1)] * 2, y)
    with pytest.raises(ValueError, match="timestep t has batch 3"):
        model(x, torch.tensor([1, 2, 3]), ctx, y)
    with pytest.raises(ValueError, match="text context has batch 3"):
        model(x, t, [ctx[0]] * 3, y)
    with pytest.raises(ValueError, match="camera tensor has batch 3"):
        model(x, t, ctx, y, camera=torch.cat([cam, cam[:1]]))
    with pytest.raises(ValueError, match="conditioning y has batch 2"):
        model(x[:1], t[:1], ctx[:1], y)


def test_rope_tables_of_any_frame_offset_equal_the_whole_table_formula():
    """RopeCache builds a chunk's table from per-size height/width columns and per-offset frame columns: the same
    float32 bits as the cos/sin of rope_angles' whole float64 table, for the DiT's head dims and chunk grids."""
    from lingbot_world.wan.dit.rope import rope_angles

    for head_dim in (128, 24):
        cache = RopeCache(head_dim)
        for grid in ((3, 30, 52), (3, 2, 3), (1, 4, 6), (21, 45, 80)):
            for offset in (0, 3, 21, 600, 3000):
                cos, sin = cache.get(grid, torch.device("cpu"), frame_offset=offset)
                ang = rope_angles(grid, head_dim, frame_offset=offset)
                assert torch.equal(cos, ang.cos().float()) and torch.equal(sin, ang.sin().float()), (grid, offset)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_residual_stream_is_row_major_and_its_layout_changes_no_bit(model, dtype):
    """The blocks receive [B, L, dim] with each token's channels side by side (the patch conv's output transposed
    and copied once), so the per-token kernels read it coalesced; the same forward with the stream left
    channel-strided, as it was, gives the same bits: every op on it is per element or copies the row first."""
    net = model if dtype == torch.float32 else WanDiT(CFG, dtype=dtype).eval()
    if net is not model:
        net.load_state_dict(model.state_dict())
    x, t, ctx, y, cam = make_inputs(torch.Generator().manual_seed(61))
    seen = []
    block = net.blocks[0]
    own = block.forward_layered

    def record(hs, *args, **kw):
        seen.append(hs[0].stride())
        return own(hs, *args, **kw)

    def channel_strided(hs, *args, **kw):
        return own([h.transpose(1, 2).contiguous().transpose(1, 2) for h in hs], *args, **kw)

    with torch.no_grad():
        try:
            block.forward_layered = record
            rows = net(x, t, ctx, y, camera=cam)
            block.forward_layered = channel_strided
            columns = net(x, t, ctx, y, camera=cam)
        finally:
            del block.forward_layered
    assert seen and seen[0][-1] == 1
    assert torch.equal(rows, columns)
