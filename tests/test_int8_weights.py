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

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file

from lingbot_world.loaders.expert_format import ExpertLoadError, detect_format
from lingbot_world.loaders.expert_loader import check_expert_keys, device_bytes, load_expert
from lingbot_world.quant.nf4_format import nf4_linear_names
from lingbot_world.wan.dit.model import DiTConfig, WanDiT

from tests.conftest import load_sibling


FP8_TEST = load_sibling("test_fp8_weights")  # its tiny Fast config and forward serve both stored kinds
CFG, fast_forward, source_tensors = FP8_TEST.CFG, FP8_TEST.fast_forward, FP8_TEST.source_tensors
LINEARS = nf4_linear_names(CFG.num_layers)


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


fp8_release = FP8_TEST.release  # the FP8 test's release folder (bf16, NF4 and FP8 copies), built here once too
SOURCES = {"bf16": "lingbot_world_fast", "nf4": "lingbot_world_fast_bnb_nf4"}


@pytest.fixture(scope="module")
def release(fp8_release):
    """That folder with the INT8 copies of the bf16 checkpoint and of its NF4 copy added."""
    from lingbot_world.loaders.lowp_writer import convert_to_int8

    root, _ = fp8_release
    return root, {src: convert_to_int8(root / folder, root / f"int8_from_{src}", device="cpu")
                  for src, folder in SOURCES.items()}


@pytest.mark.parametrize("source", ["bf16", "nf4"])
def test_converter_weights_and_scales_equal_round_w_over_amax_127(release, source):
    root, stats = release
    src = source_tensors(root)
    if source == "bf16":
        start = {n: src[f"{n}.weight"].float() for n in LINEARS}
    else:  # what the converter starts from: the NF4 weights as bitsandbytes dequantizes them
        nf4 = load_expert(root / SOURCES["nf4"], "cpu", "nf4")
        start = {n: nf4.get_submodule(n).dequantized_weight(torch.float32) for n in LINEARS}
    got = load_file(str(root / f"int8_from_{source}" / "model.safetensors"))
    want = {}
    for n, w in start.items():
        want[f"{n}.weight"], want[f"{n}.weight_scale"] = ref_weight(w)
    assert {k: got[k].dtype for k in want} == {k: v.dtype for k, v in want.items()}  # int8 and float32
    assert [k for k in want if not torch.equal(got[k], want[k])] == []
    others = set(got) - set(want)
    assert others == {k for k in src if not (k.endswith(".weight") and k[:-7] in LINEARS)}
    assert source == "nf4" or all(torch.equal(got[k], src[k]) and got[k].dtype == src[k].dtype for k in others)
    # the step's error as the converter reports it: sqrt(sum |W8 * s - W|^2 / sum |W|^2), recomputed here
    err2 = sum(float((want[f"{n}.weight"].double() * want[f"{n}.weight_scale"].double()[:, None]
                      - w.double()).square().sum()) for n, w in start.items())
    ref2 = sum(float(w.double().square().sum()) for w in start.values())
    assert stats[source]["weight_rel_error"] == pytest.approx(math.sqrt(err2 / ref2), rel=1e-4)
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


@pytest.mark.parametrize("bias", [True, False])
def test_int8_linear_equals_the_formula(bias):
    from lingbot_world.quant.lowp_linear import Int8Linear

    out_f, in_f = 64, 48
    g = torch.Generator().manual_seed(1)
    w = torch.randn(out_f, in_f, generator=g) * torch.linspace(0.01, 1.0, out_f)[:, None]  # rows of unlike ranges
    lin = Int8Linear(in_f, out_f, bias=bias, compute_dtype=torch.float32)
    lin.load_float_weight(w)
    w8, sw = ref_weight(w.to(torch.bfloat16))  # from its bf16 value, as every format loads
    assert torch.equal(lin.weight, w8) and torch.equal(lin.weight_scale, sw)
    b = torch.randn(out_f, generator=g) if bias else None
    if bias:
        lin.bias = torch.nn.Parameter(b, requires_grad=False)
    x = torch.randn(3, 7, in_f, generator=g)
    # token-wise (enough rows): the INT8 GEMM; few rows: the dequantized weight, activations as they are
    for min_rows, want in ((1, ref_int8_linear(x, w8, sw, b)),
                           (10 ** 6, torch.nn.functional.linear(x, w8.float() * sw[:, None], b))):
        lin.lowp_min_rows = min_rows
        torch.testing.assert_close(lin(x), want, rtol=1e-6, atol=1e-6)
    assert lin.compute_mode == "int8" and torch.equal(lin.dequantized_weight(torch.float32), w8.float() * sw[:, None])


def test_fast_forward_from_the_int8_folder_equals_the_model_built_here(release):
    from lingbot_world.quant.lowp_linear import Int8Linear

    root, _ = release

    def velocity(path, weights: str) -> torch.Tensor:
        """The tiny Fast forward of a folder loaded as `weights`, every stored-kind GEMM in low precision."""
        model = load_expert(root / path, "cpu", weights)
        for n in LINEARS if weights in ("fp8", "int8") else ():
            model.get_submodule(n).lowp_min_rows = 1  # the tiny video has few tokens
        return fast_forward(model)

    assert sum(isinstance(m, Int8Linear) for m in load_expert(root / "int8_from_bf16", "cpu", "int8").modules()) \
        == len(LINEARS)
    got = velocity("int8_from_bf16", "int8")
    want = fast_forward(FP8_TEST.model_built_here(root / "int8_from_bf16", ref_int8_linear))  # this kind's formula
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)

    # against the bf16 model of the original weights (relative L2 of the velocity), beside the other formats of
    # the same weights; measured here: int8 0.021, fp8 0.070, nf4 (the pack's default) 0.21
    bf16 = velocity(SOURCES["bf16"], "bf16")
    rel = {w: float((v - bf16).norm() / bf16.norm()) for w, v in (
        ("int8", got), ("fp8", velocity("fp8_from_bf16", "fp8")), ("nf4", velocity(SOURCES["bf16"], "nf4")))}
    assert rel["int8"] < 0.05 and rel["int8"] < rel["fp8"] < rel["nf4"], rel


# ---- refusals ------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("kind,cap,line", [
    ("int8", (7, 5), "--weights int8 needs an Ampere-or-newer GPU (sm80+); this card is sm75: use --weights nf4"),
    ("fp8", (8, 6), "--weights fp8 needs an Ada/Hopper GPU (sm89+); this card is sm86: use --weights nf4"),
])
def test_each_stored_kind_is_refused_in_one_line_where_its_gemm_cannot_run(release, monkeypatch, kind, cap, line):
    from lingbot_world.quant import compute
    from lingbot_world.world.files import WorldFiles
    from lingbot_world.world.assembly import open_session
    from lingbot_world.world.settings import WorldSettings

    monkeypatch.setattr(compute, "_capability", lambda device: cap)
    cuda, cpu = torch.device("cuda", 0), torch.device("cpu")
    assert compute.stored_weights_unavailable(kind, cuda) == line
    assert compute.stored_weights_unavailable(kind, cpu) is None  # the CPU runs both (tests, the demo)
    root, _ = release
    folder = root / f"{kind}_from_bf16"
    shared = {name: root / f"missing_{name}" for name in ("t5", "vae")}  # never reached: refused first
    with pytest.raises(compute.LowpWeightsUnsupported) as e:
        open_session(WorldFiles(root, folder, tokenizer=None, **shared), WorldSettings(weights=kind), device=cuda)
    assert str(e.value) == line
    if kind == "int8":  # an Ampere card passes the INT8 check up to the test GEMM (no CUDA here: not run)
        monkeypatch.setattr(compute, "_capability", lambda device: (8, 6))
        monkeypatch.setattr(compute, "_probe", lambda mode, device: None)
        assert compute.stored_weights_unavailable("int8", cuda) is None


def test_int8_folders_are_not_mixed_up(release):
    root, _ = release
    nf4, fp8, int8 = (detect_format(root / d) for d in (SOURCES["nf4"], "fp8_from_bf16", "int8_from_bf16"))
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
    from lingbot_world.memory.estimates import expert_sizes

    root, _ = release
    params = dict(WanDiT(CFG, device="meta").named_parameters())
    shapes = [tuple(params[f"{n}.weight"].shape) for n in LINEARS]
    others = sum(p.numel() for k, p in params.items() if not (k.endswith(".weight") and k[:-7] in LINEARS))
    want = sum(o * i + 4 * o for o, i in shapes) + 4 * others  # int8 + a float32 scale a row; the rest float32
    assert expert_sizes(CFG, "int8", compute_bytes=4).total == want
    assert device_bytes(load_expert(root / "int8_from_bf16", "cpu", "int8"))[0] == want
    full = DiTConfig(causal=True)
    assert expert_sizes(full, "int8").total == expert_sizes(full, "fp8").total  # 1 byte a weight either way
