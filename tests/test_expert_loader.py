"""Expert loading end to end on tiny experts (CPU): every format, NF4 vs float references, stats, cleanup."""
import gc
import json
import shutil
import weakref

import pytest
import torch
from bitsandbytes.functional import has_avx512bf16
from bitsandbytes.nn import Linear4bit, Params4bit
from safetensors.torch import load_file as st_load_file

import lingbot_world.loaders.expert_loader as expert_loader
from lingbot_world.loaders.expert_format import detect_format
from lingbot_world.loaders.expert_loader import load_expert, load_expert_with_info
from lingbot_world.quant.nf4 import QUANT_STATE_KEY, NF4Linear, nf4_linear_names
from lingbot_world.loaders.nf4_writer import (
    QUANT_RECIPE,
    convert_official_to_nf4,
    random_expert_state,
    write_official_expert,
)
from lingbot_world.loaders.safetensors_stream import SafetensorsWriter, iter_tensors
from lingbot_world.wan.dit.model import DiTConfig, WanDiT

CFG = DiTConfig.tiny()  # dim 64, 2 blocks


def _inputs(cfg=CFG, seed=0):
    g = torch.Generator().manual_seed(seed)
    f, h, w = 2, 4, 4
    return dict(
        x=torch.randn(1, cfg.out_dim, f, h, w, generator=g),
        t=torch.tensor([937]),
        context=torch.randn(1, 6, cfg.text_dim, generator=g),
        y=torch.randn(1, cfg.in_dim - cfg.out_dim, f, h, w, generator=g),
        camera=torch.randn(1, 384, f, h, w, generator=g),
    )


def _run(model, cfg=CFG):
    with torch.no_grad():
        return model(**_inputs(cfg))


@pytest.fixture(scope="module")
def official(tmp_path_factory):
    d = tmp_path_factory.mktemp("lb") / "high_noise_model"
    files = write_official_expert(random_expert_state(CFG, seed=3), CFG, d, dtype=torch.float32, max_shard_bytes=300_000)
    assert len(files) >= 2
    return d


@pytest.fixture(scope="module")
def converted(official, tmp_path_factory):
    out = tmp_path_factory.mktemp("lb") / "high_noise_model_bnb_nf4"
    stats = convert_official_to_nf4(official, out, device="cpu")
    assert stats["linear_layers_quantized"] == len(nf4_linear_names(CFG.num_layers)) == 37
    return out


@pytest.fixture(scope="module")
def nf4_model(converted):
    return load_expert(converted, "cpu")


def _float_model(official) -> WanDiT:
    sd = {}
    for p in sorted(official.glob("*.safetensors")):
        sd.update(st_load_file(str(p)))
    m = WanDiT(CFG)
    m.load_state_dict(sd)
    return m.eval()


def test_detect_formats(official, converted, tmp_path):
    f = detect_format(official)
    assert f.kind == "official_sharded" and len(f.files) >= 2 and f.config == CFG and f.config_source == "config.json"
    c = detect_format(converted)
    assert c.kind == "nf4_community" and c.quant_meta["quant"] == QUANT_RECIPE and c.config == CFG
    meta = json.loads((converted / "quantization_meta.json").read_text())
    assert {"source", "model_config", "files", "stats", "tool_versions", "generated_at"} <= meta.keys()
    assert json.loads((converted / "config.json").read_text()) == json.loads((official / "config.json").read_text())
    single = detect_format(converted / "model.safetensors")  # e.g. dropped into ComfyUI's diffusion_models
    assert single.kind == "single_file_nf4" and single.config_source == "safetensors metadata" and single.config == CFG
    shard = sorted(official.glob("*.safetensors"))[0]
    lone = tmp_path / "lingbot_high.safetensors"
    shutil.copy(shard, lone)
    with pytest.raises(ValueError):  # one shard alone is not an expert
        load_expert(lone, "cpu")


def test_converted_file_has_the_community_layout(converted):
    """Checked with safetensors' own reader: the packed keys of spec §1.2, bf16 plain tensors, config metadata."""
    from safetensors import safe_open

    with safe_open(str(converted / "model.safetensors"), "pt") as f:
        keys = set(f.keys())
        assert json.loads(f.metadata()["config"]) == CFG.to_json()
        linears = nf4_linear_names(CFG.num_layers)
        pieces = {"weight": torch.uint8, "weight.absmax": torch.uint8, "weight.quant_map": torch.float32,
                  "weight.nested_absmax": torch.float32, "weight.nested_quant_map": torch.float32,
                  f"weight.{QUANT_STATE_KEY}": torch.uint8}
        for name in linears:
            for suffix, dtype in pieces.items():
                t = f.get_tensor(f"{name}.{suffix}")
                assert t.dtype == dtype, (name, suffix)
            m = WanDiT(CFG, device="meta").get_submodule(name)
            assert f.get_slice(f"{name}.weight").get_shape() == [m.out_features * m.in_features // 2, 1]
        plain = set(WanDiT(CFG, device="meta").state_dict()) - {f"{n}.weight" for n in linears}
        assert keys == plain | {f"{n}.{s}" for n in linears for s in pieces}
        assert all(f.get_tensor(k).dtype == torch.bfloat16 for k in plain)


def test_official_on_the_fly_equals_convert_then_load(official, nf4_model):
    fly = load_expert(official, "cpu")
    assert fly.load_info.format.kind == "official_sharded"
    a, b = fly.state_dict(), nf4_model.state_dict()
    assert a.keys() == b.keys()
    assert all(torch.equal(a[k], b[k]) for k in a), [k for k in a if not torch.equal(a[k], b[k])][:3]
    assert torch.equal(_run(fly), _run(nf4_model))


def test_nf4_model_is_float_model_with_dequantized_weights(nf4_model):
    ref = WanDiT(CFG, device="meta")
    sd = {}
    for name, mod in nf4_model.named_modules():
        if isinstance(mod, NF4Linear):
            sd[f"{name}.weight"] = mod.dequantized_weight(torch.float32)
            sd[f"{name}.bias"] = mod.bias
    for k, v in nf4_model.named_parameters():
        if k not in sd and not isinstance(v, Params4bit):
            sd[k] = v
    ref.load_state_dict(sd, assign=True)
    ref.compute_dtype = torch.float32
    out = _run(nf4_model)
    assert out.shape == (1, 16, 2, 4, 4) and out.dtype == torch.float32 and out.isfinite().all()
    torch.testing.assert_close(out, _run(ref), rtol=1e-4, atol=1e-4)
    assert sum(isinstance(m, NF4Linear) for m in nf4_model.modules()) == 37


def test_bf16_mode_matches_float_model(official, converted):
    fm = _float_model(official)
    bf = load_expert(official, "cpu", mode="bf16")
    assert not any(isinstance(m, NF4Linear) for m in bf.modules())
    assert {p.dtype for p in bf.parameters()} == {torch.bfloat16} and bf.compute_dtype == torch.bfloat16
    ref, out = _run(fm), _run(bf)
    rel = (out - ref).norm() / ref.norm()
    assert rel < 2e-2, rel
    # bf16 mode from an NF4 file: weights are bnb's bf16 dequantization
    nf = load_expert(converted, "cpu", mode="bf16")
    q = load_expert(converted, "cpu", compute_dtype=torch.bfloat16)
    assert torch.equal(nf.blocks[1].ffn[2].weight, q.blocks[1].ffn[2].dequantized_weight(torch.bfloat16))
    with pytest.raises(ValueError, match="bfloat16"):
        load_expert(converted, "cpu", mode="bf16", compute_dtype=torch.float32)


def test_community_style_loader_reads_our_file(converted, nf4_model):
    """The way community scripts read the file: load_file + bnb Linear4bit + Params4bit.from_prequantized
    (bnb 0.50's Linear4bit has no load_state_dict path for packed 4-bit weights) + load_state_dict for the rest."""
    sd = st_load_file(str(converted / "model.safetensors"))
    model = WanDiT(CFG, device="meta")
    for name in nf4_linear_names(CFG.num_layers):
        parent, _, child = name.rpartition(".")
        old = model.get_submodule(name)
        lin = Linear4bit(old.in_features, old.out_features, compute_dtype=torch.float32, quant_type="nf4", device="meta")
        setattr(model.get_submodule(parent) if parent else model, child, lin)
        stats = {k[len(name) + 8:]: sd.pop(k) for k in list(sd) if k.startswith(name + ".weight.")}
        lin.weight = Params4bit.from_prequantized(sd.pop(name + ".weight"), stats, device="cpu", module=lin)
    result = model.load_state_dict({k: v.float() for k, v in sd.items()}, strict=False, assign=True)
    assert not result.unexpected_keys
    assert all(k.endswith(".weight") for k in result.missing_keys)  # only the packed weights, set above
    exact = not has_avx512bf16()  # else bnb repacks with bf16 block scales: close, not identical
    ours = dict(nf4_model.named_modules())
    for name in nf4_linear_names(CFG.num_layers):
        theirs, mine = model.get_submodule(name), ours[name]
        x = torch.randn(3, theirs.in_features)
        with torch.no_grad():
            a, b = theirs(x), mine(x)
        assert torch.equal(a, b) if exact else torch.allclose(a, b, rtol=2e-2, atol=2e-2), name
    mine_params = dict(nf4_model.named_parameters())
    for k, v in model.named_parameters():
        if not isinstance(v, Params4bit):
            assert torch.equal(v, mine_params[k]), k


def test_single_file_without_config_infers_it(tmp_path):
    cfg = DiTConfig(dim=256, ffn_dim=320, freq_dim=64, num_heads=2, num_layers=1, text_dim=48)
    official = tmp_path / "off"
    write_official_expert(random_expert_state(cfg, seed=5), cfg, official, dtype=torch.bfloat16)
    nf4 = tmp_path / "nf4"
    convert_official_to_nf4(official, nf4, device="cpu")
    bare = tmp_path / "lingbot_nf4.safetensors"  # no config.json, no config in __metadata__
    with SafetensorsWriter(bare) as w:
        for k, t in iter_tensors(nf4 / "model.safetensors"):
            w.add(k, t)
    f = detect_format(bare)
    assert f.kind == "single_file_nf4" and f.config_source == "inferred from shapes" and f.config == cfg
    # a plain single file with ComfyUI-style key prefix
    plain = tmp_path / "lingbot_bf16.safetensors"
    with SafetensorsWriter(plain) as w:
        for p in sorted(official.glob("*.safetensors")):
            for k, t in iter_tensors(p):
                w.add("model.diffusion_model." + k, t)
    g = detect_format(plain)
    assert g.kind == "single_file_plain" and g.key_prefix == "model.diffusion_model." and g.config == cfg
    a, b = load_expert(bare, "cpu"), load_expert(plain, "cpu")
    assert torch.equal(_run(a, cfg), _run(b, cfg))


def test_model_pt_variant(converted, nf4_model, tmp_path):
    d = tmp_path / "old_bnb_nf4"
    d.mkdir()
    torch.save(st_load_file(str(converted / "model.safetensors")), d / "model.pt")
    shutil.copy(converted / "config.json", d / "config.json")
    m = load_expert(d, "cpu")
    assert m.load_info.format.kind == "nf4_pt"
    assert torch.equal(_run(m), _run(nf4_model))


def test_progress_and_stats(converted):
    seen = []
    model, info = load_expert_with_info(converted, "cpu", progress=lambda d, t: seen.append((d, t)))
    assert seen and all(a[0] < b[0] for a, b in zip(seen, seen[1:])) and seen[-1][0] == seen[-1][1]
    assert info.bytes_read == seen[-1][1]
    assert info.param_count == sum(p.numel() for p in WanDiT(CFG, device="meta").parameters())
    # state dict minus the JSON blobs (parsed, not kept), plus each linear's fp32 nested offset scalar
    held = sum(t.numel() * t.element_size() for k, t in model.state_dict().items() if not k.endswith(QUANT_STATE_KEY))
    assert info.bytes_on_device == held + 4 * 37
    assert info.tensors == len(st_load_file(str(converted / "model.safetensors")))
    assert info.seconds > 0 and info.gb_per_s > 0
    js = info.to_json()
    assert js["format"] == "nf4_community" and js["device"] == "cpu" and js["compute_dtype"] == "float32"


def test_failure_mid_load_frees_everything(converted, monkeypatch):
    placed = []
    real = expert_loader._set_param

    def spy(model, key, value):
        real(model, key, value)
        placed.append(weakref.ref(model.get_parameter(key)))

    monkeypatch.setattr(expert_loader, "_set_param", spy)

    def cancel(done, total):
        if done > total // 2:
            raise KeyboardInterrupt("user cancelled")

    with pytest.raises(KeyboardInterrupt, match="user cancelled") as err:
        load_expert(converted, "cpu", progress=cancel)
    gc.collect()
    # The caller still holds the exception (and so its traceback), yet no half-loaded tensor survives.
    assert err.value.__traceback__ is not None
    assert placed and all(r() is None for r in placed)

