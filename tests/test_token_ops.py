"""The restructured per-token phases of the DiT block (issue 15): one block against the spec's formulas written
plainly here (float32), the whole model against the pre-issue block (bench/legacy_block.py) in float32 and
bf16, autograd still working, NF4 weights dequantized once per phase, and the compiled phases (dynamo +
AOT functionalization via the aot_eager backend) equal to eager across chunk lengths and model instances."""
from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from lingbot_world.bench.legacy_block import legacy_forward
from lingbot_world.speed import compile as compile_mod
from lingbot_world.speed.options import compiled_token_ops
from lingbot_world.wan.dit import token_ops
from lingbot_world.wan.dit.model import CAMERA_CHANNELS, DiTConfig, WanDiT

CFG = DiTConfig.tiny()


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.float() - b.float()).norm() / b.float().norm()).item()


@pytest.fixture(scope="module")
def model(randomise_dit) -> WanDiT:
    m = WanDiT(CFG).eval().requires_grad_(False)
    randomise_dit(m, torch.Generator().manual_seed(5))
    return m


def make_inputs(gen: torch.Generator, b: int = 2, f: int = 3, h: int = 6, w: int = 10):
    x = torch.randn(b, 16, f, h, w, generator=gen)
    y = torch.randn(b, 20, f, h, w, generator=gen)
    t = torch.tensor([999, 300][:b])
    context = [torch.randn(5 + 4 * i, CFG.text_dim, generator=gen) for i in range(b)]
    camera = torch.randn(b, CAMERA_CHANNELS, f, h, w, generator=gen)
    return x, t, context, y, camera


# ---- one block against the spec, written plainly ---------------------------------------------------------------
def spec_rope(x: torch.Tensor, grid) -> torch.Tensor:
    """Interleaved-pair 3D RoPE in float64 (spec §2.5): frame / height / width split of the head dim."""
    f, h, w = grid
    d = x.shape[-1]
    d_hw = 2 * (d // 6)
    parts = [(d - 2 * d_hw, torch.arange(f)), (d_hw, torch.arange(h)), (d_hw, torch.arange(w))]
    angles = []
    for dims, pos in parts:
        omega = 1.0 / 10000.0 ** (torch.arange(0, dims, 2, dtype=torch.float64) / dims)
        angles.append(pos.double()[:, None] * omega[None, :])
    ang = torch.cat([angles[0][:, None, None].expand(f, h, w, -1), angles[1][None, :, None].expand(f, h, w, -1),
                     angles[2][None, None, :].expand(f, h, w, -1)], dim=-1).reshape(f * h * w, 1, d // 2)
    xr = x.double().reshape(*x.shape[:-1], d // 2, 2)
    re, im = xr[..., 0], xr[..., 1]
    out = torch.stack([re * ang.cos() - im * ang.sin(), re * ang.sin() + im * ang.cos()], dim=-1)
    return out.reshape(x.shape).float()


def spec_block(blk, x, e0, ctx, cam, grid):
    """Spec §2.4 step 6 with §3's camera FiLM, float32, straight from the parameters."""
    b, seq, dim = x.shape
    heads = blk.self_attn.num_heads
    eps = blk.norm1.eps

    def lin(layer, v):
        return v @ layer.weight.T + layer.bias

    def ln(v, norm=None):
        return F.layer_norm(v, (dim,), None if norm is None else norm.weight, None if norm is None else norm.bias, eps)

    def rms(v, norm):
        return v * torch.rsqrt(v.pow(2).mean(-1, keepdim=True) + eps) * norm.weight

    def attend(q, k, v):
        q, k, v = (a.view(b, -1, heads, dim // heads).transpose(1, 2) for a in (q, k, v))
        p = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(dim // heads), dim=-1)
        return (p @ v).transpose(1, 2).reshape(b, -1, dim)

    shift_a, scale_a, gate_a, shift_f, scale_f, gate_f = (blk.modulation + e0).unsqueeze(2).unbind(1)
    sa, ca = blk.self_attn, blk.cross_attn
    h = ln(x) * (1 + scale_a) + shift_a
    q = spec_rope(rms(lin(sa.q, h), sa.norm_q).view(b, seq, heads, -1), grid).reshape(b, seq, dim)
    k = spec_rope(rms(lin(sa.k, h), sa.norm_k).view(b, seq, heads, -1), grid).reshape(b, seq, dim)
    x = x + lin(sa.o, attend(q, k, lin(sa.v, h))) * gate_a
    if cam is not None:
        g = lin(blk.cam_injector_layer2, F.silu(lin(blk.cam_injector_layer1, cam))) + cam
        x = (1 + lin(blk.cam_scale_layer, g)) * x + lin(blk.cam_shift_layer, g)
    x = x + lin(ca.o, attend(rms(lin(ca.q, ln(x, blk.norm3)), ca.norm_q), rms(lin(ca.k, ctx), ca.norm_k),
                             lin(ca.v, ctx)))
    ff = lin(blk.ffn[2], F.gelu(lin(blk.ffn[0], ln(x) * (1 + scale_f) + shift_f), approximate="tanh"))
    return x + ff * gate_f


@pytest.mark.parametrize("chunk", [None, 7])
@pytest.mark.parametrize("with_camera", [False, True])
def test_block_matches_the_spec_formulas(model, chunk, with_camera):
    gen = torch.Generator().manual_seed(3)
    b, grid = 2, (3, 3, 5)
    seq = math.prod(grid)
    x = torch.randn(b, seq, CFG.dim, generator=gen)
    e0 = 0.3 * torch.randn(b, 6, CFG.dim, generator=gen)
    ctx = torch.randn(b, 9, CFG.dim, generator=gen)
    cam = torch.randn(b, seq, CFG.dim, generator=gen) if with_camera else None
    blk = model.blocks[1]
    blk.token_chunk = chunk
    try:
        with torch.no_grad():
            ours = blk(x, e0, ctx, cam, model.rope.get(grid, x.device), torch.float32)
            ref = spec_block(blk, x, e0, ctx, cam, grid)
    finally:
        blk.token_chunk = token_ops_default_chunk()
    assert rel_err(ours, ref) <= 2e-6


def token_ops_default_chunk():
    from lingbot_world.wan.dit.blocks import DEFAULT_TOKEN_CHUNK

    return DEFAULT_TOKEN_CHUNK


# ---- whole model against the pre-issue block --------------------------------------------------------------------
def test_model_matches_the_pre_issue_block_float32(model):
    x, t, ctx, y, cam = make_inputs(torch.Generator().manual_seed(11))
    with torch.no_grad():
        model.set_token_chunk(16)  # 45 tokens: 3 chunks, the last one short
        ours = model(x, t, ctx, y, camera=cam)
        with legacy_forward():
            old = model(x, t, ctx, y, camera=cam)
        model.set_token_chunk(token_ops_default_chunk())
    assert rel_err(ours, old) <= 1e-6


def test_model_matches_the_pre_issue_block_bf16(model):
    half = WanDiT(CFG, dtype=torch.bfloat16).eval().requires_grad_(False)
    half.load_state_dict(model.state_dict())
    x, t, ctx, y, cam = make_inputs(torch.Generator().manual_seed(12))
    with torch.no_grad():
        half.set_token_chunk(16)
        ours = half(x, t, ctx, y, camera=cam)
        with legacy_forward():
            old = half(x, t, ctx, y, camera=cam)
        fp32 = model(x, t, ctx, y, camera=cam)
    # Only rounding order differs (fused multiply-adds, one-pass norms): far below bf16's own error.
    assert rel_err(ours, old) <= 5e-3
    assert rel_err(ours, old) < 0.5 * rel_err(old, fp32)


def test_forward_with_grad_enabled(model):
    # `out=` and in-place phases are for inference; with parameters that require grad (a model left in its
    # default state, called outside no_grad) the phases take their functional form and give the same values.
    m = WanDiT(CFG)
    m.load_state_dict(model.state_dict())
    x, t, ctx, y, cam = make_inputs(torch.Generator().manual_seed(13), b=1)
    out = m(x, t, ctx, y, camera=cam)
    with torch.no_grad():
        assert rel_err(out.detach(), model(x, t, ctx, y, camera=cam)) <= 1e-6


def test_quantized_weights_are_prepared_once_per_phase(model, monkeypatch):
    from lingbot_world.quant.nf4 import NF4Linear, replace_linears_with_nf4

    nf4 = WanDiT(CFG, device="meta")
    replace_linears_with_nf4(nf4, CFG.num_layers, torch.float32)
    sd = model.state_dict()
    for name, mod in nf4.named_modules():
        if isinstance(mod, NF4Linear):
            mod.load_float_weight(sd[f"{name}.weight"])
    nf4.load_state_dict({k: v for k, v in sd.items() if not (k.endswith(".weight") and isinstance(
        nf4.get_submodule(k[:-7]), NF4Linear))}, strict=False, assign=True)
    nf4.eval().requires_grad_(False)
    calls: dict[str, int] = {}
    original = NF4Linear.dequantized_weight

    def counting(self, dtype=None):
        calls[id(self)] = calls.get(id(self), 0) + 1
        return original(self, dtype)

    monkeypatch.setattr(NF4Linear, "dequantized_weight", counting)
    x, t, ctx, y, cam = make_inputs(torch.Generator().manual_seed(14), b=1)
    with torch.no_grad():
        nf4.set_token_chunk(None)
        whole = nf4(x, t, ctx, y, camera=cam)
        calls.clear()
        nf4.set_token_chunk(8)  # 45 tokens -> 6 chunks
        chunked = nf4(x, t, ctx, y, camera=cam)
    block_linears = [m for m in nf4.blocks.modules() if isinstance(m, NF4Linear)]
    assert all(calls.get(id(m)) == 1 for m in block_linears), "a block linear was dequantized more than once"
    assert rel_err(chunked, whole) <= 1e-6


# ---- compiled phases --------------------------------------------------------------------------------------------
@pytest.fixture()
def aot_eager(monkeypatch):
    """Compile through dynamo and AOT functionalization without building kernels (fast, deterministic)."""
    monkeypatch.setattr(compile_mod, "BACKEND", "aot_eager")
    yield


@pytest.mark.slow  # traces every phase once per dtype variant (token count symbolic from the start): ~10 s on two cores
def test_compiled_phases_equal_eager_for_every_chunk_and_expert(model, aot_eager):
    x, t, ctx, y, cam = make_inputs(torch.Generator().manual_seed(21), b=1)
    other = WanDiT(CFG).eval().requires_grad_(False)  # "the other expert": same code, other weights
    other.load_state_dict({k: v * 1.01 for k, v in model.state_dict().items()})
    with torch.no_grad():
        expected = {}
        for m in (model, other):
            m.set_token_chunk(16)
            expected[id(m)] = m(x, t, ctx, y, camera=cam)
        ops = compiled_token_ops(strict=True)
        for m in (model, other):
            m.set_token_ops(ops)
        try:
            assert torch.equal(model(x, t, ctx, y, camera=cam), expected[id(model)])
            graphs = compile_mod._graph_count()
            for chunk in (16, 13, 29):  # new chunk lengths reuse the dynamic graphs
                model.set_token_chunk(chunk)
                model(x, t, ctx, y, camera=cam)
            other.set_token_chunk(16)
            assert torch.equal(other(x, t, ctx, y, camera=cam), expected[id(other)])
            assert compile_mod._graph_count() == graphs, "recompiled for a new chunk length or the other expert"
        finally:
            for m in (model, other):
                m.set_token_ops(token_ops.EAGER)
                m.set_token_chunk(token_ops_default_chunk())


def test_compile_failure_falls_back_or_raises(aot_eager, caplog):
    def breaks_the_graph(x):
        print("dynamo cannot trace this with fullgraph=True")
        return x + 1

    x = torch.ones(3)
    lenient = compile_mod.CompiledFn(breaks_the_graph, strict=False, backend="aot_eager")
    assert torch.equal(lenient(x), x + 1) and lenient.failed
    assert "running it eagerly" in caplog.text
    strict = compile_mod.CompiledFn(breaks_the_graph, strict=True, backend="aot_eager")
    with pytest.raises(compile_mod.CompileUnavailable, match="breaks_the_graph"):
        strict(x)


@pytest.mark.slow  # builds two small C++ kernels with inductor: ~10 s on two cores
def test_inductor_phases_round_where_eager_rounds(tmp_path, monkeypatch):
    """Inductor keeps a fused kernel's bf16 intermediates in float32 unless told to emulate eager's casts; the
    camera FiLM's bf16 `1 + scale` alone then differed from eager by up to 1.2e-2 (measured; it is now rounded
    eagerly in WanBlock.camera_film). The compiled phases must round where eager (and the reference) rounds."""
    if compile_mod.unavailable_reason(torch.device("cpu")):
        pytest.skip(compile_mod.unavailable_reason(torch.device("cpu")))
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(compile_mod, "BACKEND", "inductor")
    assert compile_mod.inductor_options("inductor") == {"emulate_precision_casts": True}
    assert compile_mod.inductor_options("aot_eager") is None
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(1, 64, 256, generator=gen)
    scale = (0.05 * torch.randn(1, 64, 256, generator=gen)).bfloat16()
    shift = torch.randn(1, 64, 256, generator=gen).bfloat16()
    t = torch.randn(1, 64, 256, generator=gen).bfloat16()
    norm = token_ops_rms_norm(256, gen)
    cos, sin = (f(torch.rand(64, 64, generator=gen) * 6) for f in (torch.cos, torch.sin))
    with torch.inference_mode():
        eager_film = token_ops.film(x.clone(), 1 + scale, shift)
        film = compile_mod.CompiledFn(token_ops.film, strict=True, backend="inductor")
        assert (film(x.clone(), 1 + scale, shift) - eager_film).abs().max() <= 1e-5
        out_e, out_c = (torch.empty(1, 64, 2, 128, dtype=torch.bfloat16) for _ in range(2))
        token_ops.qk_norm_rope(t, norm, cos, sin, out_e)
        compile_mod.CompiledFn(token_ops.qk_norm_rope, strict=True, backend="inductor")(t, norm, cos, sin, out_c)
        # bf16 outputs: at most a rare one-ulp flip from float32 reduction order
        assert (out_c.float() - out_e.float()).abs().max() <= 2 ** -7 * out_e.float().abs().max()
        assert (out_c != out_e).float().mean() <= 1e-3


def token_ops_rms_norm(dim: int, gen: torch.Generator):
    from lingbot_world.wan.dit.blocks import WanRMSNorm

    norm = WanRMSNorm(dim, dtype=torch.bfloat16).requires_grad_(False)
    norm.weight.copy_(1 + 0.3 * torch.randn(dim, generator=gen))
    return norm
