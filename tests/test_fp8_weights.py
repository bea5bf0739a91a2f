"""Stored FP8 weights (`--weights fp8`, issue 26), checked against formulas written here (float32, tiny, CPU).

- the converter: every linear's e4m3 weight and scale equal a per-row amax / 448 quantization done here, from the
  bf16 checkpoint and from an NF4 folder (dequantized first); the other tensors as stored; the metadata; an
  interrupted or refused conversion leaves no folder and never replaces one;
- the linear: (x8 @ w8^T) * sx * sw + b with the activations quantized here per row;
- a whole tiny Fast forward from the FP8 folder == the model built here from the dequantized weights with the same
  FP8 activation formula, and within a stated tolerance of the bf16 model;
- refusals in one line: a card without FP8, NF4 <-> FP8 mixed up, damaged files;
- the memory estimate: 1 byte a weight + a float32 scale per output channel.
"""
from __future__ import annotations

import argparse
import json
import math
import shutil
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file

from lingbot_world.loaders.expert_format import ExpertLoadError, detect_format
from lingbot_world.loaders.expert_loader import check_expert_keys, device_bytes, load_expert
from lingbot_world.loaders.nf4_writer import convert_official_to_nf4, random_expert_state, write_official_expert
from lingbot_world.loaders.safetensors_stream import SafetensorsWriter
from lingbot_world.quant.nf4_format import nf4_linear_names
from lingbot_world.wan.dit.kv_cache import KVCache
from lingbot_world.wan.dit.model import DiTConfig, StateDictMismatch, WanDiT

E4M3 = torch.float8_e4m3fn
CFG = DiTConfig.tiny(num_layers=2, text_dim=16, text_len=8, causal=True)
LINEARS = nf4_linear_names(CFG.num_layers)
LAT_H, LAT_W = 4, 6


def ref_quantize(t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per row: scale = amax / 448, q = t / scale rounded to e4m3 (float32 maths); an all-zero row (padded text)
    is all zeros whatever its scale."""
    t = t.float()
    scale = t.abs().amax(dim=1) / 448.0
    q = torch.where(scale[:, None] > 0, t / scale[:, None], torch.zeros_like(t))
    return q.to(E4M3), scale


def ref_fp8_linear(x: torch.Tensor, w8: torch.Tensor, sw: torch.Tensor, b) -> torch.Tensor:
    x2 = x.reshape(-1, x.shape[-1]).float()
    x8, sx = ref_quantize(x2)
    y = (x8.float() @ w8.float().t()) * sx[:, None] * sw[None, :]
    if b is not None:
        y = y + b.float()
    return y.reshape(*x.shape[:-1], w8.shape[0])


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.dtype == b.dtype and torch.equal(a.view(torch.uint8), b.view(torch.uint8))


@pytest.fixture(scope="module")
def release(tmp_path_factory):
    """The official Fast folder in bf16, its NF4 copy and the FP8 copies of both."""
    root = tmp_path_factory.mktemp("fp8release")
    from lingbot_world.loaders.lowp_writer import convert_to_fp8

    write_official_expert(random_expert_state(CFG, seed=4, dtype=torch.bfloat16), CFG, root / "lingbot_world_fast",
                          dtype=torch.bfloat16)
    convert_official_to_nf4(root / "lingbot_world_fast", root / "lingbot_world_fast_bnb_nf4", device="cpu")
    stats = {"bf16": convert_to_fp8(root / "lingbot_world_fast", root / "fp8_from_bf16", device="cpu"),
             "nf4": convert_to_fp8(root / "lingbot_world_fast_bnb_nf4", root / "fp8_from_nf4", device="cpu")}
    return root, stats


def source_tensors(root) -> dict:
    out = {}
    for f in sorted((root / "lingbot_world_fast").glob("*.safetensors")):
        out.update(load_file(str(f)))
    return out


# ---- the converter ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("source", ["bf16", "nf4"])
def test_converter_weights_and_scales_equal_a_per_row_quantization(release, source):
    root, stats = release
    src = source_tensors(root)
    if source == "nf4":  # the NF4 weights as bitsandbytes dequantizes them (what the converter starts from)
        nf4 = load_expert(root / "lingbot_world_fast_bnb_nf4", "cpu", "nf4")
        weights = {n: nf4.get_submodule(n).dequantized_weight(torch.float32) for n in LINEARS}
    else:
        weights = {n: src[f"{n}.weight"].float() for n in LINEARS}
    got = load_file(str(root / f"fp8_from_{source}" / "model.safetensors"))
    for name in LINEARS:
        w8, scale = ref_quantize(weights[name])
        assert got[f"{name}.weight_scale"].dtype == torch.float32
        assert torch.equal(got[f"{name}.weight_scale"], scale), name
        assert same_bits(got[f"{name}.weight"], w8), name
    plain = {k for k in src if not (k.endswith(".weight") and k[:-7] in LINEARS)}
    assert set(got) == plain | {f"{n}.weight" for n in LINEARS} | {f"{n}.weight_scale" for n in LINEARS}
    if source == "bf16":
        for k in plain:
            assert got[k].dtype == src[k].dtype and torch.equal(got[k], src[k]), k
    # the FP8 step's error as the converter reports it, recomputed here
    num = sum(float(((got[f"{n}.weight"].float() * got[f"{n}.weight_scale"][:, None]) - weights[n]).double()
                    .square().sum()) for n in LINEARS)
    den = sum(float(weights[n].double().square().sum()) for n in LINEARS)
    assert stats[source]["weight_rel_error"] == pytest.approx(math.sqrt(num / den), rel=1e-4)
    assert 0 < stats[source]["weight_rel_error"] < 0.05  # e4m3 keeps 3 mantissa bits: a few percent


@pytest.mark.parametrize("source", ["bf16", "nf4"])
def test_converter_metadata(release, source):
    root, stats = release
    out = root / f"fp8_from_{source}"
    with safe_open(str(out / "model.safetensors"), "pt") as f:
        meta = f.metadata()
    quant = json.loads(meta["quantization"])
    assert quant["format"] == "lingbot_fp8" and quant["version"] == 1 and quant["source"] == source
    assert DiTConfig.from_json(json.loads(meta["config"])) == CFG
    side = json.loads((out / "quantization_meta.json").read_text())
    assert side["quant"] == quant and side["source"]["weights"] == source
    assert json.loads((out / "config.json").read_text())["_class_name"] == "WanModelFast"  # still the Fast model
    assert stats[source]["source"] == source and stats[source]["linear_layers_quantized"] == len(LINEARS)
    if source == "nf4":  # the error adds up: said in the metadata and in the result the CLI prints
        assert "NF4" in quant["note"] and "adds" in quant["note"] and stats["nf4"]["note"] == quant["note"]
    else:
        assert "note" not in quant and "note" not in stats["bf16"]
    fmt = detect_format(out)
    assert fmt.kind == "fp8" and fmt.weights == "fp8" and fmt.quant_meta["source"] == source
    assert fmt.config.causal


def test_conversion_is_atomic(release, tmp_path, monkeypatch):
    from lingbot_world.loaders import lowp_writer as fp8_writer

    root, _ = release
    src = root / "lingbot_world_fast"
    existing = tmp_path / "taken"
    existing.mkdir()
    (existing / "keep.txt").write_text("mine")
    with pytest.raises(FileExistsError, match="taken"):
        fp8_writer.convert_to_fp8(src, existing, device="cpu")
    assert [p.name for p in existing.iterdir()] == ["keep.txt"]

    calls = []

    def failing(w, kind):
        calls.append(1)
        if len(calls) == 5:
            raise KeyboardInterrupt("killed mid-conversion")
        return real(w, kind)

    real = fp8_writer.quantize_weight
    monkeypatch.setattr(fp8_writer, "quantize_weight", failing)
    with pytest.raises(KeyboardInterrupt):
        fp8_writer.convert_to_fp8(src, tmp_path / "out_fp8", device="cpu")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["taken"]  # no folder, no temp sibling left


def test_convert_fp8_cli(release, tmp_path, capsys):
    from lingbot_world.cli import convert as convert_fp8

    parser = argparse.ArgumentParser(prog="lingbot-world")
    convert_fp8.add_parser(parser.add_subparsers(dest="command", required=True))

    def cli(argv):
        args = parser.parse_args(argv)
        return args.func(args)

    root, _ = release
    out = tmp_path / "lingbot_world_fast_fp8"
    assert cli(["convert-fp8", str(root / "lingbot_world_fast_bnb_nf4"), str(out), "--device", "cpu"]) == 0
    res = json.loads(capsys.readouterr().out)
    assert res["ok"] and res["source"] == "nf4" and "adds" in res["note"]
    assert cli(["convert-fp8", str(root / "lingbot_world_fast"), str(out), "--device", "cpu"]) == 2  # exists
    assert "already exists" in json.loads(capsys.readouterr().out)["error"]


# ---- the linear --------------------------------------------------------------------------------------------------
def test_fp8_linear_equals_the_emulated_formula():
    from lingbot_world.quant.lowp_linear import Fp8Linear

    g = torch.Generator().manual_seed(0)
    w = torch.randn(48, 32, generator=g) / 6
    b = torch.randn(48, generator=g) / 10
    w8, sw = ref_quantize(w)
    lin = Fp8Linear(32, 48, compute_dtype=torch.float32)
    lin.load_stored(w8.clone(), sw.clone())
    lin.bias = torch.nn.Parameter(b.clone(), requires_grad=False)
    x = torch.randn(2, 5, 32, generator=g)
    lin.lowp_min_rows = 1
    torch.testing.assert_close(lin(x), ref_fp8_linear(x, w8, sw, b), rtol=1e-6, atol=1e-6)
    # few rows (below lowp_min_rows): the dequantized weight, activations not quantized
    lin.lowp_min_rows = 1024
    torch.testing.assert_close(lin(x), x @ (w8.float() * sw[:, None]).t() + b, rtol=1e-6, atol=1e-6)
    # the float32 regions read the same weight
    torch.testing.assert_close(lin.dequantized_weight(torch.float32), w8.float() * sw[:, None], rtol=0, atol=0)


def test_lora_on_fp8_weights_is_a_side_path_and_weight_patches_requantize():
    from lingbot_world.quant.lowp_linear import Fp8Linear
    from lingbot_world.quant.lora import LinearLora, LowRank, attach

    g = torch.Generator().manual_seed(1)
    w = torch.randn(32, 32, generator=g) / 6
    w8, sw = ref_quantize(w)
    lin = Fp8Linear(32, 32, bias=False, compute_dtype=torch.float32)
    lin.load_stored(w8.clone(), sw.clone())
    lin.lowp_min_rows = 1
    x = torch.randn(7, 32, generator=g)
    up, down = torch.randn(32, 4, generator=g), torch.randn(4, 32, generator=g)
    attach(lin, LinearLora([LowRank(up, down, 0.5)]))
    torch.testing.assert_close(lin(x), ref_fp8_linear(x, w8, sw, None) + 0.5 * (x @ down.t()) @ up.t(),
                               rtol=1e-5, atol=1e-5)
    assert same_bits(lin.weight.data, w8)  # the stored weight is untouched
    attach(lin, LinearLora(weight_patches=[lambda t: t * 1.25]))
    p8, sp = ref_quantize((w8.float() * sw[:, None]) * 1.25)
    torch.testing.assert_close(lin(x), ref_fp8_linear(x, p8, sp, None), rtol=1e-6, atol=1e-6)


# ---- a whole tiny Fast forward -------------------------------------------------------------------------------------
def fast_inputs(frames: int = 3, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(1, 16, frames, LAT_H, LAT_W, generator=g)
    y = torch.randn(1, 20, frames, LAT_H, LAT_W, generator=g)
    cam = torch.randn(1, 384, frames, LAT_H, LAT_W, generator=g)
    ctx = torch.randn(1, 5, CFG.text_dim, generator=g)
    return x, y, cam, ctx


def fast_forward(model, frames: int = 3):
    x, y, cam, ctx = fast_inputs(frames)
    fsl = (LAT_H // 2) * (LAT_W // 2)
    cache = KVCache.allocate(CFG.num_layers, frames * fsl, CFG.num_heads, CFG.head_dim, dtype=torch.float32)
    with torch.no_grad():
        return model(x, torch.tensor([937]), ctx, y, camera=cam, kv_cache=cache).float()


def model_built_here(folder, ref_linear):
    """A float32 WanDiT of the folder's dequantized weights whose quantized linears compute
    ref_linear(x, stored weight, scale, bias) (the formula a test writes for its kind)."""
    stored = load_file(str(folder / "model.safetensors"))
    ref = WanDiT(CFG).eval()
    sd = {k: v.float() for k, v in stored.items() if not k.endswith(".weight_scale")}
    for n in LINEARS:
        sd[f"{n}.weight"] = stored[f"{n}.weight"].float() * stored[f"{n}.weight_scale"][:, None]
    ref.load_state_dict(sd)
    for n in LINEARS:
        lin = ref.get_submodule(n)
        w8, sw = stored[f"{n}.weight"], stored[f"{n}.weight_scale"]
        lin.register_forward_hook(lambda mod, inp, out, w8=w8, sw=sw: ref_linear(inp[0], w8, sw, mod.bias))
    return ref


def test_fast_forward_from_the_fp8_folder_equals_the_model_built_here(release):
    from lingbot_world.quant.lowp_linear import Fp8Linear

    root, _ = release
    folder = root / "fp8_from_bf16"
    model = load_expert(folder, "cpu", "fp8")
    fp8_linears = [m for m in model.modules() if isinstance(m, Fp8Linear)]
    assert len(fp8_linears) == len(LINEARS)
    for m in fp8_linears:
        m.lowp_min_rows = 1  # every GEMM in FP8 (the tiny video has few tokens)
        assert m.in_features % 16 == 0 and m.out_features % 16 == 0  # so the formula below applies to all
    got = fast_forward(model)
    torch.testing.assert_close(got, fast_forward(model_built_here(folder, ref_fp8_linear)), rtol=1e-5, atol=1e-5)

    # against the bf16 model of the original weights (relative L2 of the velocity): 0.070 measured here (FP8 weights
    # alone 0.056, the activations the rest); the NF4 model of the same weights, the pack's default, is off by 0.21
    bf16 = fast_forward(load_expert(root / "lingbot_world_fast", "cpu", "bf16"))
    nf4 = fast_forward(load_expert(root / "lingbot_world_fast", "cpu", "nf4"))
    rel, rel_nf4 = (float((a - bf16).norm() / bf16.norm()) for a in (got, nf4))
    assert rel < 0.1 and rel < rel_nf4 / 2, (rel, rel_nf4)


# ---- refusals ------------------------------------------------------------------------------------------------------
def test_a_card_without_fp8_is_refused_in_one_line_before_anything_loads(release, monkeypatch):
    from lingbot_world.quant import compute
    from lingbot_world.world.files import WorldFiles
    from lingbot_world.world.assembly import open_session
    from lingbot_world.world.settings import WorldSettings

    monkeypatch.setattr(compute, "_capability", lambda device: (8, 6))
    problem = compute.stored_weights_unavailable("fp8", torch.device("cuda", 0))
    assert problem == ("--weights fp8 needs an Ada/Hopper GPU (sm89+); this card is sm86: use --weights nf4")
    assert compute.stored_weights_unavailable("fp8", torch.device("cpu")) is None  # the emulated GEMM
    root, _ = release
    files = WorldFiles(root, root / "fp8_from_bf16", root / "missing_t5.pth", root / "missing_vae.pth", None)
    with pytest.raises(compute.LowpWeightsUnsupported) as e:
        open_session(files, WorldSettings(weights="fp8"), device=torch.device("cuda", 0))
    assert str(e.value) == problem and "\n" not in str(e.value)


def test_nf4_and_fp8_folders_are_not_mixed_up(release):
    root, _ = release
    nf4, fp8 = detect_format(root / "lingbot_world_fast_bnb_nf4"), detect_format(root / "fp8_from_bf16")
    with pytest.raises(ExpertLoadError, match="holds NF4 weights; --weights fp8 reads an FP8 folder") as e:
        check_expert_keys(nf4, "fp8")
    assert "\n" not in str(e.value) and "convert-fp8" in str(e.value)
    with pytest.raises(ExpertLoadError, match="holds FP8 weights .* --weights fp8") as e:
        load_expert(fp8, "cpu", "nf4")
    assert "\n" not in str(e.value) and "model.safetensors" in str(e.value)
    # the official float folder runs as FP8 too: quantized while loading, the converter's weights exactly
    a, b = load_expert(root / "lingbot_world_fast", "cpu", "fp8"), load_expert(fp8, "cpu", "fp8")
    for n in LINEARS:
        assert same_bits(a.get_submodule(n).weight.data, b.get_submodule(n).weight.data)
        assert torch.equal(a.get_submodule(n).weight_scale, b.get_submodule(n).weight_scale)
    # bf16 mode reads an FP8 folder as its dequantized weights
    plain = load_expert(fp8, "cpu", "bf16")
    torch.testing.assert_close(plain.blocks[0].ffn[0].weight.float(),
                               b.blocks[0].ffn[0].dequantized_weight(torch.bfloat16).float(), rtol=0, atol=0)


def rewrite(src, dst, metadata=None, change=None, drop=()):
    """A copy of the FP8 model.safetensors with other metadata, tensors changed or dropped."""
    with safe_open(str(src), "pt") as f:
        meta = dict(f.metadata())
    meta.update(metadata or {})
    tensors = load_file(str(src))
    with SafetensorsWriter(dst, meta) as w:
        for k, v in tensors.items():
            if k not in drop:
                w.add(k, (change or {}).get(k, v))


def test_damaged_or_foreign_fp8_files_are_named_in_one_line(release, tmp_path):
    root, _ = release
    good = root / "fp8_from_bf16"

    def folder(name, **kw):
        out = tmp_path / name
        shutil.copytree(good, out)
        rewrite(good / "model.safetensors", out / "model.safetensors", **kw)
        return out

    newer = folder("newer", metadata={"quantization": json.dumps({"format": "lingbot_fp8", "version": 2,
                                                                  "source": "bf16"})})
    with pytest.raises(ExpertLoadError, match="version 2") as e:
        detect_format(newer)
    assert str(newer / "model.safetensors") in str(e.value) and "\n" not in str(e.value)

    foreign = folder("foreign", metadata={"quantization": json.dumps({"format": "fbgemm_fp8"})})
    with pytest.raises(ExpertLoadError, match="'fbgemm_fp8'") as e:
        detect_format(foreign)
    assert str(foreign / "model.safetensors") in str(e.value) and "\n" not in str(e.value)

    name = "blocks.1.ffn.0"
    zero = folder("zero_scale", change={f"{name}.weight_scale": torch.zeros(CFG.ffn_dim)})
    with pytest.raises(ValueError, match="weight_scale holds zero") as e:
        load_expert(zero, "cpu", "fp8")
    assert str(zero / "model.safetensors") in str(e.value) and name in str(e.value) and "\n" not in str(e.value)

    no_scale = folder("no_scale", drop={f"{name}.weight_scale"})
    with pytest.raises(StateDictMismatch, match=f"missing key {name}.weight_scale") as e:
        check_expert_keys(detect_format(no_scale), "fp8")
    assert str(e.value).splitlines()[0].startswith(str(no_scale / "model.safetensors"))

    truncated = tmp_path / "truncated"
    shutil.copytree(good, truncated)
    data = (truncated / "model.safetensors").read_bytes()
    (truncated / "model.safetensors").write_bytes(data[: len(data) // 2])
    with pytest.raises(Exception) as e:
        load_expert(truncated, "cpu", "fp8")
    assert str(truncated / "model.safetensors") in str(e.value).splitlines()[0]


# ---- memory ------------------------------------------------------------------------------------------------------
def test_memory_estimate_of_an_fp8_model(release):
    from lingbot_world.memory.estimates import expert_sizes

    root, _ = release
    meta = WanDiT(CFG, device="meta")
    want = 0
    for key, p in meta.named_parameters():
        if key.endswith(".weight") and key[:-7] in LINEARS:
            want += p.shape[0] * p.shape[1] + 4 * p.shape[0]  # e4m3 weight + float32 scale per output channel
        else:
            want += p.numel() * 4  # float32 on the CPU
    sizes = expert_sizes(CFG, "fp8", compute_bytes=4)
    assert sizes.total == want
    model = load_expert(root / "fp8_from_bf16", "cpu", "fp8")
    assert device_bytes(model)[0] == want  # what the loaded model really holds
    full = {w: expert_sizes(DiTConfig(causal=True), w).total for w in ("nf4", "fp8", "bf16")}
    # the quantized linears of the full-size DiT hold 18.54e9 weights (not the guess of 14e9): 18.56 GB
    assert full["fp8"] == pytest.approx(18.56e9, rel=2e-3)
    assert full["nf4"] < full["fp8"] < full["bf16"]


def test_the_demo_plays_from_fp8_weights(copy_demo, demo_text_cache):
    import numpy as np

    from lingbot_world.loaders.demo_checkpoint import DEMO_PROMPT
    from lingbot_world.world.demos import demo_ready
    from lingbot_world.world.models import V1_FAST
    from lingbot_world.quant.lowp_linear import Fp8Linear
    from lingbot_world.world import TextSettings, WorldFiles, WorldSettings, open_session

    root = copy_demo()
    assert not demo_ready(V1_FAST, root, "fp8")
    files = WorldFiles.demo(root, weights="fp8")  # converted from the demo's NF4 Fast model, once
    assert files.dit.name == "lingbot_world_fast_fp8" and demo_ready(V1_FAST, root, "fp8")
    fmt, _, notes = files.check("fp8")
    assert fmt.kind == "fp8" and fmt.quant_meta["source"] == "nf4" and notes == []
    assert WorldFiles.demo(root).dit.name == "lingbot_world_fast_bnb_nf4"  # the NF4 demo is unchanged

    settings = WorldSettings(size="64*112", weights="fp8", text=TextSettings(device="cpu", cache_dir=demo_text_cache))
    session = open_session(files, settings, device="cpu")
    try:
        session.start(Path(__file__).resolve().parents[1] / "assets/examples/00/image.jpg", DEMO_PROMPT)
        frames = np.concatenate([b.frames for b in session.step("w-8")])
        assert frames.dtype == np.uint8 and frames.shape[1:] == (48, 112, 3) and len(frames) == 9
        assert sum(isinstance(m, Fp8Linear) for m in session.model.modules()) == len(LINEARS)
    finally:
        session.close()
