"""The Fast model through the existing loaders: the official float folder quantized to NF4 while loading, bf16
mode, a convert-expert NF4 copy, and the bad inputs (base expert given as Fast, missing tensor) named early."""
import json

import pytest
import torch

from lingbot_world.loaders.expert_format import ExpertLoadError, check_model_kind, detect_format, model_kind
from lingbot_world.loaders.expert_loader import check_expert_keys, load_expert
from lingbot_world.loaders.nf4_writer import convert_official_to_nf4, random_expert_state, write_official_expert
from lingbot_world.wan.dit.model import DiTConfig, StateDictMismatch

CFG = DiTConfig.tiny(num_layers=2, causal=True)


@pytest.fixture(scope="module")
def official(tmp_path_factory):
    root = tmp_path_factory.mktemp("release")
    write_official_expert(random_expert_state(CFG, seed=2), CFG, root / "lingbot_world_fast", max_shard_bytes=200_000)
    return root / "lingbot_world_fast"


def test_official_fast_folder_loads_as_nf4_and_bf16_and_converts(official, tmp_path):
    fmt = detect_format(official)
    assert fmt.kind == "official_sharded" and len(fmt.files) > 1
    assert model_kind(fmt) == "fast" and json.loads((official / "config.json").read_text())["_class_name"] == "WanModelFast"
    nf4 = load_expert(official, "cpu", "nf4")
    bf16 = load_expert(official, "cpu", "bf16")
    assert nf4.cfg.causal and bf16.cfg.causal
    nf4_copy = tmp_path / "lingbot_world_fast_bnb_nf4"
    convert_official_to_nf4(official, nf4_copy, device="cpu")
    fmt2 = detect_format(nf4_copy)
    assert fmt2.kind == "nf4_community" and model_kind(fmt2) == "fast"  # the class name survives the conversion
    check_expert_keys(fmt2, "nf4")
    again = load_expert(nf4_copy, "cpu", "nf4")
    w = "blocks.1.self_attn.q"
    torch.testing.assert_close(again.get_submodule(w).dequantized_weight(torch.float32),
                               nf4.get_submodule(w).dequantized_weight(torch.float32), rtol=0, atol=0)


def test_kind_checks(official, tmp_path):
    base = tmp_path / "high_noise_model"
    base_cfg = DiTConfig.tiny(num_layers=1, dim=128, num_heads=1)  # head_dim 128: shapes alone give a config
    write_official_expert(random_expert_state(base_cfg, seed=3), base_cfg, base)
    with pytest.raises(ExpertLoadError, match="is a base .* not the Fast model"):
        check_model_kind(detect_format(base), "fast")
    with pytest.raises(ExpertLoadError, match="is the Fast \\(causal\\) model"):
        check_model_kind(detect_format(official), "base")
    # without a config the weights cannot tell: used as asked, with a note
    (base / "config.json").unlink()
    note = check_model_kind(detect_format(base), "fast")
    assert note and "tensors are identical" in note


def test_missing_tensor_is_named_before_loading(official, tmp_path):
    import shutil

    from safetensors.torch import load_file, save_file

    broken = tmp_path / "lingbot_world_fast"
    shutil.copytree(official, broken)
    index = json.loads((broken / "diffusion_pytorch_model.safetensors.index.json").read_text())
    shard = broken / index["weight_map"]["blocks.1.ffn.0.weight"]
    sd = load_file(str(shard))
    del sd["blocks.1.ffn.0.weight"]
    save_file(sd, str(shard))
    del index["weight_map"]["blocks.1.ffn.0.weight"]
    (broken / "diffusion_pytorch_model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(StateDictMismatch, match="missing key blocks.1.ffn.0.weight"):
        check_expert_keys(detect_format(broken), "nf4")
