"""Stored INT8 weights (`--weights int8`, issue 26: the Ampere counterpart of `--weights fp8`), checked against
formulas written here (float32 and int32 maths, tiny, CPU; torch's CPU `_int_mm` runs the same int8 GEMM).

- the converter: every linear's int8 weight and scale equal round(w / (row amax / 127)) done here, from the bf16
  checkpoint and from an NF4 folder (dequantized first); the other tensors as stored; the metadata;
- the linear: (x8 @ w8^T) * sx * sw + b with the activations quantized here per token (quant/int8's way);
- a whole tiny Fast forward from the INT8 folder == the model built here from the same formula, and within a
  stated tolerance of the bf16 model;
- refusals in one line: a card without INT8 GEMMs, NF4 / FP8 / INT8 folders mixed up;
- the memory estimate: 1 byte a weight + a float32 scale per output channel;
- the demo plays from its INT8 copy.
"""
from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file

from lingbot_world.loaders.expert_format import ExpertLoadError, detect_format
from lingbot_world.loaders.expert_loader import check_expert_keys, device_bytes, load_expert
from lingbot_world.loaders.nf4_writer import convert_official_to_nf4, random_expert_state, write_official_expert
from lingbot_world.quant.nf4_format import nf4_linear_names
from lingbot_world.wan.dit.kv_cache import KVCache
from lingbot_world.wan.dit.model import DiTConfig, WanDiT

CFG = DiTConfig.tiny(num_layers=2, text_dim=16, text_len=8, causal=True)
LINEARS = nf4_linear_names(CFG.num_layers)
LAT_H, LAT_W = 4, 6


def ref_weight(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The stored weight: scale = row amax / 127, q = round(w / scale) (ties to even), float32 maths."""
    w = w.float()
    scale = w.abs().amax(dim=1) / 127.0
    return torch.round(w / scale[:, None]).to(torch.int8), scale


def ref_activation(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per token, as quant/int8.quantize_rows does it: scale = amax / 127, q = round(x * (1 / scale))."""
    scale = x.abs().amax(dim=1, keepdim=True).clamp_min(1e-12) / 127.0
    return torch.round(x * scale.reciprocal()).to(torch.int8), scale


def ref_int8_linear(x: torch.Tensor, w8: torch.Tensor, sw: torch.Tensor, b) -> torch.Tensor:
    x2 = x.reshape(-1, x.shape[-1]).float()
    x8, sx = ref_activation(x2)
    acc = x8.to(torch.int32) @ w8.to(torch.int32).t()  # exact: |sum| < 2^31
    y = acc.float() * sx * sw[None, :]
    if b is not None:
        y = y + b.float()
    return y.reshape(*x.shape[:-1], w8.shape[0])


@pytest.fixture(scope="module")
def release(tmp_path_factory):
    """The official Fast folder in bf16, its NF4 copy and the INT8 copies of both (and one FP8 copy)."""
    from lingbot_world.loaders.lowp_writer import convert_to_fp8, convert_to_int8

    root = tmp_path_factory.mktemp("int8release")
    write_official_expert(random_expert_state(CFG, seed=5, dtype=torch.bfloat16), CFG, root / "lingbot_world_fast",
                          dtype=torch.bfloat16)
    convert_official_to_nf4(root / "lingbot_world_fast", root / "lingbot_world_fast_bnb_nf4", device="cpu")
    stats = {"bf16": convert_to_int8(root / "lingbot_world_fast", root / "int8_from_bf16", device="cpu"),
             "nf4": convert_to_int8(root / "lingbot_world_fast_bnb_nf4", root / "int8_from_nf4", device="cpu")}
    convert_to_fp8(root / "lingbot_world_fast", root / "fp8_from_bf16", device="cpu")
    return root, stats


@pytest.mark.parametrize("source", ["bf16", "nf4"])
def test_converter_weights_and_scales_equal_round_w_over_amax_127(release, source):
    root, stats = release
    src = {}
    for f in sorted((root / "lingbot_world_fast").glob("*.safetensors")):
        src.update(load_file(str(f)))
    if source == "nf4":  # what the converter starts from: the NF4 weights as bitsandbytes dequantizes them
        nf4 = load_expert(root / "lingbot_world_fast_bnb_nf4", "cpu", "nf4")
        weights = {n: nf4.get_submodule(n).dequantized_weight(torch.float32) for n in LINEARS}
    else:
        weights = {n: src[f"{n}.weight"].float() for n in LINEARS}
    got = load_file(str(root / f"int8_from_{source}" / "model.safetensors"))
    for name in LINEARS:
        q, scale = ref_weight(weights[name])
        assert got[f"{name}.weight"].dtype == torch.int8 and torch.equal(got[f"{name}.weight"], q), name
        assert got[f"{name}.weight_scale"].dtype == torch.float32
        assert torch.equal(got[f"{name}.weight_scale"], scale), name
    plain = {k for k in src if not (k.endswith(".weight") and k[:-7] in LINEARS)}
    assert set(got) == plain | {f"{n}.weight" for n in LINEARS} | {f"{n}.weight_scale" for n in LINEARS}
    if source == "bf16":
        assert all(torch.equal(got[k], src[k]) and got[k].dtype == src[k].dtype for k in plain)
    num = sum(float((got[f"{n}.weight"].float() * got[f"{n}.weight_scale"][:, None] - weights[n]).double()
                    .square().sum()) for n in LINEARS)
    den = sum(float(weights[n].double().square().sum()) for n in LINEARS)
    assert stats[source]["weight_rel_error"] == pytest.approx(math.sqrt(num / den), rel=1e-4)
    assert 0 < stats[source]["weight_rel_error"] < 0.02  # 127 levels a row: under FP8's 3 mantissa bits' error


@pytest.mark.parametrize("source", ["bf16", "nf4"])
def test_converter_metadata(release, source):
    root, stats = release
    out = root / f"int8_from_{source}"
    with safe_open(str(out / "model.safetensors"), "pt") as f:
        quant = json.loads(f.metadata()["quantization"])
    assert quant["format"] == "lingbot_int8" and quant["version"] == 1 and quant["source"] == source
    assert quant["weight_dtype"] == "int8" and "127" in quant["scale"] and "nearest" in quant["rounding"]
    assert json.loads((out / "quantization_meta.json").read_text())["quant"] == quant
    assert ("INT8" in quant["note"] and stats["nf4"]["note"] == quant["note"]) if source == "nf4" else \
        "note" not in quant
    fmt = detect_format(out)
    assert fmt.kind == "int8" and fmt.weights == "int8" and fmt.quant_meta["source"] == source
    with pytest.raises(ExpertLoadError, match="holds INT8 weights already"):
        from lingbot_world.loaders.lowp_writer import convert_to_int8

        convert_to_int8(out, root / "never", device="cpu")
    assert not (root / "never").exists()


def test_int8_linear_equals_the_formula():
    from lingbot_world.quant.lowp_linear import Int8Linear

    g = torch.Generator().manual_seed(0)
    w = torch.randn(48, 32, generator=g) / 6
    b = torch.randn(48, generator=g) / 10
    w8, sw = ref_weight(w)
    lin = Int8Linear(32, 48, compute_dtype=torch.float32)
    lin.load_float_weight(w)  # quantized from its bf16 value, as every format loads
    q_bf16, s_bf16 = ref_weight(w.to(torch.bfloat16))
    assert torch.equal(lin.weight, q_bf16) and torch.equal(lin.weight_scale, s_bf16)
    lin.load_stored(w8.clone(), sw.clone())
    lin.bias = torch.nn.Parameter(b.clone(), requires_grad=False)
    x = torch.randn(2, 5, 32, generator=g)
    lin.lowp_min_rows = 1
    torch.testing.assert_close(lin(x), ref_int8_linear(x, w8, sw, b), rtol=1e-6, atol=1e-6)
    lin.lowp_min_rows = 1024  # few rows: the dequantized weight, activations not quantized
    torch.testing.assert_close(lin(x), x @ (w8.float() * sw[:, None]).t() + b, rtol=1e-6, atol=1e-6)
    assert torch.equal(lin.dequantized_weight(torch.float32), w8.float() * sw[:, None])
    assert lin.compute_mode == "int8"


def fast_forward(model, frames: int = 3):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(1, 16, frames, LAT_H, LAT_W, generator=g)
    y = torch.randn(1, 20, frames, LAT_H, LAT_W, generator=g)
    cam = torch.randn(1, 384, frames, LAT_H, LAT_W, generator=g)
    ctx = torch.randn(1, 5, CFG.text_dim, generator=g)
    fsl = (LAT_H // 2) * (LAT_W // 2)
    cache = KVCache.allocate(CFG.num_layers, frames * fsl, CFG.num_heads, CFG.head_dim, dtype=torch.float32)
    with torch.no_grad():
        return model(x, torch.tensor([937]), ctx, y, camera=cam, kv_cache=cache).float()


def test_fast_forward_from_the_int8_folder_equals_the_model_built_here(release):
    from lingbot_world.quant.lowp_linear import Int8Linear

    root, _ = release
    folder = root / "int8_from_bf16"
    model = load_expert(folder, "cpu", "int8")
    linears = [m for m in model.modules() if isinstance(m, Int8Linear)]
    assert len(linears) == len(LINEARS)
    for m in linears:
        m.lowp_min_rows = 1  # every GEMM in INT8 (the tiny video has few tokens)
    got = fast_forward(model)

    stored = load_file(str(folder / "model.safetensors"))
    ref = WanDiT(CFG).eval()
    sd = {k: v.float() for k, v in stored.items() if not k.endswith(".weight_scale")}
    for n in LINEARS:
        sd[f"{n}.weight"] = stored[f"{n}.weight"].float() * stored[f"{n}.weight_scale"][:, None]
    ref.load_state_dict(sd)
    for n in LINEARS:
        w8, sw = stored[f"{n}.weight"], stored[f"{n}.weight_scale"]
        ref.get_submodule(n).register_forward_hook(
            lambda mod, inp, out, w8=w8, sw=sw: ref_int8_linear(inp[0], w8, sw, mod.bias))
    torch.testing.assert_close(got, fast_forward(ref), rtol=1e-5, atol=1e-5)

    # against the bf16 model of the original weights (relative L2 of the velocity): 0.021 measured here; the NF4
    # model of the same weights, the pack's default, is off by 0.29 (FP8 weights: 0.07 in test_fp8_weights.py)
    bf16 = fast_forward(load_expert(root / "lingbot_world_fast", "cpu", "bf16"))
    nf4 = fast_forward(load_expert(root / "lingbot_world_fast", "cpu", "nf4"))
    rel, rel_nf4 = (float((a - bf16).norm() / bf16.norm()) for a in (got, nf4))
    assert rel < 0.05 and rel < rel_nf4 / 4, (rel, rel_nf4)


# ---- refusals ------------------------------------------------------------------------------------------------------
def test_a_card_without_int8_is_refused_in_one_line_before_anything_loads(release, monkeypatch):
    from lingbot_world.quant import compute
    from lingbot_world.world.files import FastFiles
    from lingbot_world.world.opening import open_pieces
    from lingbot_world.world.settings import WorldSettings

    monkeypatch.setattr(compute, "_capability", lambda device: (7, 5))
    problem = compute.int8_weights_unavailable(torch.device("cuda", 0))
    assert problem == "--weights int8 needs an Ampere-or-newer GPU (sm80+); this card is sm75: use --weights nf4"
    assert compute.int8_weights_unavailable(torch.device("cpu")) is None  # torch's CPU int8 GEMM
    root, _ = release
    files = FastFiles(root, root / "int8_from_bf16", root / "missing_t5.pth", root / "missing_vae.pth", None)
    with pytest.raises(compute.LowpWeightsUnsupported) as e:
        open_pieces(files, WorldSettings(weights="int8"), torch.device("cuda", 0))
    assert str(e.value) == problem and "\n" not in problem


def test_int8_folders_are_not_mixed_up(release):
    root, _ = release
    nf4, fp8, int8 = (detect_format(root / d) for d in ("lingbot_world_fast_bnb_nf4", "fp8_from_bf16", "int8_from_bf16"))
    with pytest.raises(ExpertLoadError, match="holds NF4 weights; --weights int8 reads an INT8 folder") as e:
        check_expert_keys(nf4, "int8")
    assert "\n" not in str(e.value) and "convert-int8" in str(e.value)
    with pytest.raises(ExpertLoadError, match="holds FP8 weights; --weights int8 reads an INT8 folder"):
        check_expert_keys(fp8, "int8")
    with pytest.raises(ExpertLoadError, match="holds INT8 weights; --weights fp8 reads an FP8 folder"):
        check_expert_keys(int8, "fp8")
    with pytest.raises(ExpertLoadError, match="holds INT8 weights .* --weights int8") as e:
        load_expert(int8, "cpu", "nf4")
    assert "\n" not in str(e.value)
    # the official float folder runs as INT8 too: quantized while loading, the converter's weights exactly
    a, b = load_expert(root / "lingbot_world_fast", "cpu", "int8"), load_expert(int8, "cpu", "int8")
    for n in LINEARS:
        assert torch.equal(a.get_submodule(n).weight, b.get_submodule(n).weight)
        assert torch.equal(a.get_submodule(n).weight_scale, b.get_submodule(n).weight_scale)
    plain = load_expert(int8, "cpu", "bf16")  # bf16 mode reads the dequantized weights
    torch.testing.assert_close(plain.blocks[0].ffn[0].weight.float(),
                               b.blocks[0].ffn[0].dequantized_weight(torch.bfloat16).float(), rtol=0, atol=0)


def test_memory_estimate_of_an_int8_model(release):
    from lingbot_world.memory.placement import expert_sizes

    root, _ = release
    want = 0
    for key, p in WanDiT(CFG, device="meta").named_parameters():
        if key.endswith(".weight") and key[:-7] in LINEARS:
            want += p.shape[0] * p.shape[1] + 4 * p.shape[0]  # int8 weight + float32 scale per output channel
        else:
            want += p.numel() * 4  # float32 on the CPU
    assert expert_sizes(CFG, "int8", compute_bytes=4).total == want
    assert device_bytes(load_expert(root / "int8_from_bf16", "cpu", "int8"))[0] == want
    full = DiTConfig(causal=True)
    assert expert_sizes(full, "int8").total == expert_sizes(full, "fp8").total  # 1 byte a weight either way


def test_the_demo_plays_from_int8_weights(copy_demo, demo_text_cache):
    import numpy as np

    from lingbot_world.loaders.demo_checkpoint import DEMO_PROMPT, demo_fast_ready
    from lingbot_world.quant.lowp_linear import Int8Linear
    from lingbot_world.world import FastFiles, TextSettings, WorldSession, WorldSettings

    root = copy_demo()
    assert not demo_fast_ready(root, "int8")
    files = FastFiles.demo(root, weights="int8")  # converted from the demo's NF4 Fast model, once
    assert files.fast.name == "lingbot_world_fast_int8" and demo_fast_ready(root, "int8")
    assert not demo_fast_ready(root, "fp8")  # only the copy asked for is made
    fmt, note = files.check("int8")
    assert fmt.kind == "int8" and fmt.quant_meta["source"] == "nf4" and note is None
    settings = WorldSettings(size="64*112", weights="int8", text=TextSettings(device="cpu", cache_dir=demo_text_cache))
    with WorldSession.open(files, settings, device="cpu") as session:
        session.start(Path(__file__).resolve().parents[1] / "assets/examples/00/image.jpg", DEMO_PROMPT)
        frames = np.concatenate([b.frames for b in session.step("w-8")])
        assert frames.dtype == np.uint8 and frames.shape[1:] == (48, 112, 3) and len(frames) == 9
        assert sum(isinstance(m, Int8Linear) for m in session.model.modules()) == len(LINEARS)
