"""LoRA on NF4 linears (quant/lora.py): on the fly, stacked, strength 0, fp32 regions, merge-and-requantize.

The reference for "LoRA applied" is written here independently: a float32 DiT whose every linear weight is the
NF4 expert's dequantized weight plus `strength * alpha/rank * up @ down`.

Tolerance of on-the-fly NF4 vs "merge in bf16, then quantize to NF4": the on-the-fly output is the NF4 base plus
the exact low-rank term, i.e. y = x (Q(W) + dW)^T; merging re-quantizes, y' = x Q(W + dW)^T. Their difference is
x ((Q(W) - W) - (Q(W + dW) - (W + dW)))^T: two NF4 rounding errors of similar size, so it is bounded by twice
(and for independent rounding about sqrt(2) times) the NF4 error of the base layer itself, which the test
measures on the same inputs (about 8-9% relative for random weights). On-the-fly vs the float merge is exactly the
base's NF4 error (the low-rank term adds none).
"""
from __future__ import annotations

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from lingbot_world.loaders.expert_loader import load_expert
from lingbot_world.loaders.lora_files import lora_hooks, parse_lora, dit_weight_shapes
from lingbot_world.loaders.nf4_writer import make_random_nf4_expert
from lingbot_world.quant.lora import LinearLora, LowRank, apply_lora, attach, detach, lora_scale, merge
from lingbot_world.quant.nf4 import NF4Linear, nf4_linear_names, quantize_nf4
from lingbot_world.wan.dit.blocks import linear_fp32
from lingbot_world.wan.dit.model import DiTConfig, WanDiT

CFG = DiTConfig.tiny(dim=64, ffn_dim=128, num_heads=4, num_layers=2, text_dim=32)


def _nf4_linear(out_f=192, in_f=256, seed=0, bias=True) -> NF4Linear:
    g = torch.Generator().manual_seed(seed)
    lin = NF4Linear(in_f, out_f, bias=bias, compute_dtype=torch.float32)
    lin.load_float_weight(torch.randn(out_f, in_f, generator=g) / in_f**0.5)
    if bias:
        lin.bias = nn.Parameter(0.1 * torch.randn(out_f, generator=g), requires_grad=False)
    return lin


def _pair(out_f, in_f, rank, seed, magnitude=0.5):
    g = torch.Generator().manual_seed(seed)
    up = torch.randn(out_f, rank, generator=g) * magnitude / rank**0.5
    down = torch.randn(rank, in_f, generator=g) / in_f**0.5
    return up, down


def _rel(a, b):
    return ((a - b).norm() / b.norm()).item()


# ---- one linear ----------------------------------------------------------------------------------------------------
def test_on_the_fly_term_is_exact_on_top_of_the_nf4_base():
    lin = _nf4_linear()
    x = torch.randn(7, 256)
    up, down = _pair(192, 256, 8, seed=1)
    scale = lora_scale(0.8, alpha=4.0, rank=8)
    assert scale == pytest.approx(0.4)
    base = F.linear(x, lin.dequantized_weight(torch.float32), lin.bias)
    attach(lin, LinearLora([LowRank(up, down, scale)]))
    with torch.no_grad():
        out = lin(x)
    torch.testing.assert_close(out, base + scale * (x @ down.T) @ up.T, rtol=1e-5, atol=1e-5)
    detach(lin)
    assert lin.lora is None
    assert torch.equal(lin(x), base) or torch.allclose(lin(x), base, atol=1e-6)


def test_nf4_on_the_fly_vs_merged_then_quantized_within_nf4_tolerance():
    torch.manual_seed(3)
    out_f, in_f = 256, 512
    w = torch.randn(out_f, in_f) / in_f**0.5
    up, down = _pair(out_f, in_f, 16, seed=4)
    scale = lora_scale(1.0, alpha=16.0, rank=16)
    dw = scale * up @ down
    x = torch.randn(64, in_f)

    base = NF4Linear(in_f, out_f, bias=False, compute_dtype=torch.float32)
    base.load_float_weight(w)
    with torch.no_grad():
        nf4_error = _rel(base(x), x @ w.T)  # the NF4 error of the layer itself
        attach(base, LinearLora([LowRank(up, down, scale)]))
        on_the_fly = base(x)
    merged = NF4Linear(in_f, out_f, bias=False, compute_dtype=torch.float32)
    merged.load_float_weight((w + dw).to(torch.bfloat16))  # merge in bf16, then quantize
    with torch.no_grad():
        merged_q = merged(x)
    exact = x @ (w + dw).T
    assert 0.03 < nf4_error < 0.15, nf4_error
    # vs the float merge: only the base's NF4 error (the low-rank term is exact)
    assert _rel(on_the_fly, exact) == pytest.approx(_rel(base.dequantized_weight(torch.float32) @ x.T, w @ x.T), rel=0.35)
    assert _rel(on_the_fly, exact) < 1.25 * nf4_error
    # vs merged-then-quantized: two NF4 roundings, bounded by 2x the layer's NF4 error
    diff = _rel(on_the_fly, merged_q)
    assert 0 < diff < 2 * nf4_error, (diff, nf4_error)


def test_strength_zero_is_exactly_no_lora():
    lin = _nf4_linear()
    x = torch.randn(5, 256)
    up, down = _pair(192, 256, 4, seed=2)
    with torch.no_grad():
        ref = lin(x)
        lora = LinearLora([LowRank(up, down, lora_scale(0.0, 4.0, 4))])
        assert lora.empty
        attach(lin, lora)
        assert torch.equal(lin(x), ref)


def test_stacked_loras_are_fused_into_one_pair_and_sum():
    lin = _nf4_linear()
    x = torch.randn(9, 256)
    pairs = [_pair(192, 256, r, seed=10 + r) for r in (4, 8)]
    terms = [LowRank(u, d, s) for (u, d), s in zip(pairs, (0.7, -1.3))]
    lora = LinearLora(terms)
    assert lora.rank == 12 and lora.up.shape == (192, 12) and lora.down.shape == (12, 256)
    base = F.linear(x, lin.dequantized_weight(torch.float32), lin.bias)
    attach(lin, lora)
    with torch.no_grad():
        out = lin(x)
    expect = base + sum(t.scale * (x @ t.down.T) @ t.up.T for t in terms)
    torch.testing.assert_close(out, expect, rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="different shapes"):
        LinearLora([terms[0], LowRank(torch.zeros(10, 2), torch.zeros(2, 256), 1.0)])


def test_weight_patch_goes_between_dequantize_and_gemm():
    lin = _nf4_linear()
    x = torch.randn(4, 256)
    diff = 0.01 * torch.randn(192, 256)
    seen = []

    def patch(w):
        seen.append(w.dtype)
        return w + diff

    attach(lin, LinearLora(weight_patches=[patch]))
    with torch.no_grad():
        out = lin(x)
    assert seen == [torch.float32]
    torch.testing.assert_close(out, F.linear(x, lin.dequantized_weight(torch.float32) + diff, lin.bias),
                               rtol=1e-5, atol=1e-5)


def test_fp32_region_honours_the_lora():
    lin = _nf4_linear(64, 32)
    x = torch.randn(2, 32)
    up, down = _pair(64, 32, 4, seed=5)
    attach(lin, LinearLora([LowRank(up, down, 0.5)]))
    ref = F.linear(x, lin.dequantized_weight(torch.float32) + 0.5 * up @ down, lin.bias)
    torch.testing.assert_close(linear_fp32(lin, x), ref, rtol=1e-5, atol=1e-6)


def test_plain_linear_gets_the_same_hook():
    lin = nn.Linear(48, 40)
    x = torch.randn(3, 48)
    up, down = _pair(40, 48, 4, seed=6)
    with torch.no_grad():
        base = lin(x)
        attach(lin, LinearLora([LowRank(up, down, 2.0)]))
        torch.testing.assert_close(lin(x), base + 2.0 * (x @ down.T) @ up.T, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(linear_fp32(lin, x), base + 2.0 * (x @ down.T) @ up.T, rtol=1e-5, atol=1e-5)
        detach(lin)
        assert torch.equal(lin(x), base)


def test_merge_requantizes_once():
    lin = _nf4_linear(bias=False)
    up, down = _pair(192, 256, 8, seed=7)
    lora = LinearLora([LowRank(up, down, 0.5)])
    expect_w = lin.dequantized_weight(torch.float32) + 0.5 * up @ down
    merge(lin, lora)
    packed, state = quantize_nf4(expect_w)
    ref = NF4Linear(256, 192, bias=False, compute_dtype=torch.float32)
    ref.load_float_weight(expect_w)
    assert torch.equal(lin.weight.data, ref.weight.data) and torch.equal(lin.weight.data, packed)
    assert lin.lora is None  # nothing left to run per step


# ---- a whole NF4 DiT -------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def nf4_dit(tmp_path_factory):
    out = tmp_path_factory.mktemp("lora") / "expert"
    make_random_nf4_expert(CFG, out, device="cpu", seed=21)
    return out


def _inputs(seed=0):
    g = torch.Generator().manual_seed(seed)
    f, h, w = 2, 4, 6
    return dict(x=torch.randn(1, 16, f, h, w, generator=g), t=torch.tensor([873]),
                context=torch.randn(1, 5, CFG.text_dim, generator=g),
                y=torch.randn(1, CFG.in_dim - 16, f, h, w, generator=g),
                camera=torch.randn(1, 384, f, h, w, generator=g))


def _random_lora(rank=4, seed=0, alpha=2.0, extra=True) -> dict:
    """A ComfyUI-format LoRA on every linear of CFG (camera layers included), plus a norm diff and a bias diff."""
    g = torch.Generator().manual_seed(seed)
    shapes = dit_weight_shapes(CFG)
    sd = {}
    for name in nf4_linear_names(CFG.num_layers):
        out_f, in_f = shapes[f"{name}.weight"]
        sd[f"diffusion_model.{name}.lora_down.weight"] = torch.randn(rank, in_f, generator=g) / in_f**0.5
        sd[f"diffusion_model.{name}.lora_up.weight"] = 0.3 * torch.randn(out_f, rank, generator=g)
        sd[f"diffusion_model.{name}.alpha"] = torch.tensor(alpha)
    if extra:
        sd["diffusion_model.blocks.1.norm3.diff"] = 0.1 * torch.randn(CFG.dim, generator=g)
        sd["diffusion_model.head.head.diff_b"] = 0.1 * torch.randn(64, generator=g)
    return sd


def _float_reference(model: WanDiT, loras: list[tuple[dict, float]]) -> WanDiT:
    """A float32 DiT with the NF4 model's dequantized weights and every LoRA merged in (written independently)."""
    ref = WanDiT(CFG, device="meta")
    sd = {}
    for name, mod in model.named_modules():
        if isinstance(mod, NF4Linear):
            sd[f"{name}.weight"] = mod.dequantized_weight(torch.float32).clone()
            sd[f"{name}.bias"] = mod.bias.float().clone()
    for k, v in model.named_parameters():
        if k not in sd:
            sd[k] = v.detach().float().clone()
    for lora, strength in loras:
        for key, t in lora.items():
            if key.endswith(".lora_up.weight"):
                name = key[len("diffusion_model."):-len(".lora_up.weight")]
                down = lora[f"diffusion_model.{name}.lora_down.weight"]
                alpha = float(lora[f"diffusion_model.{name}.alpha"])
                sd[f"{name}.weight"] += strength * alpha / down.shape[0] * t @ down
            elif key.endswith(".diff"):
                sd[key[len("diffusion_model."):-len(".diff")] + ".weight"] += strength * t
            elif key.endswith(".diff_b"):
                sd[key[len("diffusion_model."):-len(".diff_b")] + ".bias"] += strength * t
    ref.load_state_dict(sd, assign=True)
    ref.compute_dtype = torch.float32
    return ref.eval()


def _run(model):
    with torch.no_grad():
        return model(**_inputs())


def test_whole_dit_with_stacked_loras_equals_float_merge(nf4_dit):
    model = load_expert(nf4_dit, "cpu")
    before = _run(model)
    shapes = dit_weight_shapes(CFG)
    a, b = _random_lora(seed=1), _random_lora(rank=8, seed=2, alpha=8.0, extra=False)
    loras = [(parse_lora(a, shapes, "a"), 0.9), (parse_lora(b, shapes, "b"), -0.5)]
    hooks, plain = lora_hooks(loras, nf4_linear_names(CFG.num_layers))
    assert len(hooks) == 37 and set(plain) == {"blocks.1.norm3.weight"} and hooks["head.head"].bias is not None
    ref = _run(_float_reference(model, [(a, 0.9), (b, -0.5)]))
    applied = apply_lora(model, hooks, plain)
    out = _run(model)
    assert _rel(out, before) > 0.05  # the LoRA does something
    torch.testing.assert_close(out, ref, rtol=1e-4, atol=1e-4)
    applied.remove()
    assert torch.equal(_run(model), before)  # removed without a trace


def test_lora_on_one_linear_only_changes_that_linear(nf4_dit):
    model = load_expert(nf4_dit, "cpu")
    before = _run(model)
    shapes = dit_weight_shapes(CFG)
    only = {k: v for k, v in _random_lora(seed=3, extra=False).items() if ".blocks.0.cross_attn.k." in k}
    lora = parse_lora(only, shapes, "one")
    assert lora.matched == 1 and list(lora.weights) == ["blocks.0.cross_attn.k.weight"]
    ref = _run(_float_reference(model, [(only, 1.0)]))
    applied = apply_lora(model, *lora_hooks([(lora, 1.0)], nf4_linear_names(CFG.num_layers)))
    assert applied.hooked == ["blocks.0.cross_attn.k"]
    torch.testing.assert_close(_run(model), ref, rtol=1e-4, atol=1e-4)
    applied.remove()
    assert torch.equal(_run(model), before)


def test_merged_dit_equals_requantized_weights(nf4_dit):
    model = load_expert(nf4_dit, "cpu")
    shapes = dit_weight_shapes(CFG)
    sd = _random_lora(seed=4, extra=False)
    lora = parse_lora(sd, shapes, "m")
    ref = _float_reference(model, [(sd, 1.0)])
    hooks, plain = lora_hooks([(lora, 1.0)], nf4_linear_names(CFG.num_layers))
    applied = apply_lora(model, hooks, plain, merge_linears=True)
    assert applied.needs_reload and not applied.hooked
    for name in nf4_linear_names(CFG.num_layers):
        mod = model.get_submodule(name)
        assert isinstance(mod, NF4Linear) and mod.lora is None
        packed, _ = quantize_nf4(ref.get_submodule(name).weight)
        assert torch.equal(mod.weight.data, packed), name
    out = _run(model)
    assert out.isfinite().all() and not torch.equal(out, _run(load_expert(nf4_dit, "cpu")))


def test_bench_lora_smoke(tmp_path):
    """bench/bench_lora.py --tiny (the hook path; the ComfyUI path runs on the GPU box)."""
    import json

    from lingbot_world.bench.bench_lora import main

    out = tmp_path / "lora.json"
    assert main(["--tiny", "--device", "cpu", "--out", str(out), "--workdir", str(tmp_path), "--calls", "1",
                 "--path", "hook", "--rank", "8"]) == 0
    r = json.loads(out.read_text())
    assert r["path"] == "hook" and r["lora"]["linears"] == 2 * 14 + 9 and r["lora"]["rank"] == 8
    assert set(r["overhead"]) == {"on_the_fly", "merged", "none_again"}
    assert all(r[k]["s_per_step"] > 0 for k in ("none", "on_the_fly", "merged", "none_again"))
    c = r["checks"]
    assert c["finite"] and c["lora_effect"] > 1e-4 and c["none_again_vs_none"] == 0.0 and c["merged_vs_on_the_fly"] < 0.5
