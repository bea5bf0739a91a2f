"""A causal chunk in one token slice runs the block with each sub-layer's end joined to the next one's start
(token_ops.gated_residual_film_norm, residual_modulate: one compiled kernel each instead of three).

- eager, the joined path gives the bits of the separate phases, with the camera FiLM computed, kept from an
  earlier call or absent;
- compiled (dynamo + AOT functionalization), it gives the eager bits and goes through the joined phases;
- inductor's fused kernel of a joined phase stays within float32 reduction order of eager.
"""
from __future__ import annotations

import pytest
import torch

from lingbot_world.speed import compile as compile_mod
from lingbot_world.speed.options import compiled_token_ops
from lingbot_world.wan.dit import blocks as dit_blocks
from lingbot_world.wan.dit import token_ops
from lingbot_world.wan.dit.blocks import WanLayerNorm
from lingbot_world.wan.dit.film_cache import FilmCache
from lingbot_world.wan.dit.kv_cache import KVCache
from lingbot_world.wan.dit.model import DiTConfig, WanDiT

CFG = DiTConfig.tiny(num_layers=2, text_dim=16, text_len=8)
LAT_H, LAT_W, FRAMES = 4, 6, 3
FSL = (LAT_H // 2) * (LAT_W // 2)
TOKENS = FRAMES * FSL


@pytest.fixture
def model(randomise_dit):
    m = WanDiT(CFG).eval().requires_grad_(False)
    randomise_dit(m, torch.Generator().manual_seed(11))
    return m


def inputs(seed: int = 0, camera: bool = True):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(1, 16, FRAMES, LAT_H, LAT_W, generator=g)
    y = torch.randn(1, 20, FRAMES, LAT_H, LAT_W, generator=g)
    cam = torch.randn(1, 384, FRAMES, LAT_H, LAT_W, generator=g) if camera else None
    ctx = torch.randn(1, 5, CFG.text_dim, generator=g)
    return x, y, cam, ctx


def causal_calls(model: WanDiT, token_chunk: int, camera: bool = True, film: bool = False) -> list[torch.Tensor]:
    """Two denoising calls and a context pass over one chunk, a K/V cache (and a FiLM cache) shared by them."""
    model.set_token_chunk(token_chunk)
    x, y, cam, ctx = inputs(camera=camera)
    cache = KVCache.allocate(CFG.num_layers, 2 * TOKENS, CFG.num_heads, CFG.head_dim, dtype=torch.float32)
    films = FilmCache.on_device(CFG.num_layers) if film else None
    outs = []
    with torch.no_grad():
        for t, final in ((999, False), (500, False), (0, True)):
            outs.append(model(x * (t + 1) / 1000, torch.tensor([t]), ctx, y, camera=cam, kv_cache=cache,
                              cache_final=final, film=films))
    return outs


def count_calls(monkeypatch, ops: token_ops.TokenOps) -> dict:
    calls = {"gated_residual_film_norm": 0, "residual_modulate": 0}
    for name in calls:
        fn = getattr(ops, name)

        def counted(*args, _fn=fn, _name=name, **kw):
            calls[_name] += 1
            return _fn(*args, **kw)

        monkeypatch.setattr(ops, name, counted)
    return calls


@pytest.mark.parametrize("camera,film", [(True, False), (True, True), (False, False)],
                         ids=["film-computed", "film-kept", "no-camera"])
def test_one_slice_gives_the_bits_of_the_separate_phases(model, monkeypatch, camera, film):
    calls = count_calls(monkeypatch, token_ops.EAGER)
    joined = causal_calls(model, token_chunk=TOKENS, camera=camera, film=film)
    assert calls == {"gated_residual_film_norm": 3 * CFG.num_layers, "residual_modulate": 3 * CFG.num_layers}
    monkeypatch.setattr(dit_blocks, "JOIN_PHASES", False)
    separate = causal_calls(model, token_chunk=TOKENS, camera=camera, film=film)
    assert calls == {"gated_residual_film_norm": 3 * CFG.num_layers, "residual_modulate": 3 * CFG.num_layers}
    for a, b in zip(joined, separate):
        assert torch.equal(a, b)


@pytest.fixture
def aot_eager(monkeypatch):
    monkeypatch.setattr(compile_mod, "BACKEND", "aot_eager")
    yield


def test_compiled_joined_phases_give_the_eager_bits(model, monkeypatch, aot_eager):
    eager = causal_calls(model, token_chunk=TOKENS, film=True)
    ops = compiled_token_ops(strict=True)
    calls = count_calls(monkeypatch, ops)
    model.set_token_ops(ops)
    try:
        compiled = causal_calls(model, token_chunk=TOKENS, film=True)
    finally:
        model.set_token_ops(token_ops.EAGER)
    assert calls["gated_residual_film_norm"] == 3 * CFG.num_layers and calls["residual_modulate"] == 3 * CFG.num_layers
    for a, b in zip(compiled, eager):
        assert torch.equal(a, b)


@pytest.mark.slow  # builds the joined phases' C++ kernels with inductor: ~10 s on two cores
def test_inductor_joined_phases_stay_within_float32_order(tmp_path, monkeypatch):
    if compile_mod.unavailable_reason(torch.device("cpu")):
        pytest.skip(compile_mod.unavailable_reason(torch.device("cpu")))
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path))
    gen = torch.Generator().manual_seed(3)
    dim = 256
    x = torch.randn(1, 96, dim, generator=gen)
    y = torch.randn(1, 96, dim, generator=gen).bfloat16()
    gate = torch.randn(1, 1, dim, generator=gen)
    scale1 = (1 + 0.1 * torch.randn(1, 96, dim, generator=gen)).bfloat16()
    shift = torch.randn(1, 96, dim, generator=gen).bfloat16()
    shift_f, scale1_f = torch.randn(1, 1, dim, generator=gen), 1 + 0.1 * torch.randn(1, 1, dim, generator=gen)
    norm3 = WanLayerNorm(dim, 1e-6, elementwise_affine=True).requires_grad_(False)
    norm3.weight.copy_(1 + 0.2 * torch.randn(dim, generator=gen))
    norm3.bias.copy_(0.1 * torch.randn(dim, generator=gen))
    norm2 = WanLayerNorm(dim, 1e-6, elementwise_affine=False)
    with torch.inference_mode():
        x_e, x_c = x.clone(), x.clone()
        xn_e = token_ops.gated_residual_film_norm(x_e, y, gate, scale1, shift, norm3, torch.bfloat16)
        joined = compile_mod.CompiledFn(token_ops.gated_residual_film_norm, strict=True, backend="inductor")
        xn_c = joined(x_c, y, gate, scale1, shift, norm3, torch.bfloat16)
        assert (x_c - x_e).abs().max() <= 1e-5 * x_e.abs().max()  # the residual stream, updated in place
        assert xn_c.dtype == torch.bfloat16
        assert (xn_c.float() - xn_e.float()).abs().max() <= 2 ** -7 * xn_e.float().abs().max()
        assert (xn_c != xn_e).float().mean() <= 1e-2  # a rare one-ulp flip from the reduction's order
        h_e = token_ops.residual_modulate(x_e, y, norm2, shift_f, scale1_f, torch.bfloat16)
        h_c = compile_mod.CompiledFn(token_ops.residual_modulate, strict=True, backend="inductor")(
            x_c, y, norm2, shift_f, scale1_f, torch.bfloat16)
        assert (x_c - x_e).abs().max() <= 1e-5 * x_e.abs().max()
        assert (h_c.float() - h_e.float()).abs().max() <= 2 ** -7 * h_e.float().abs().max()
