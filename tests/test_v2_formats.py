"""The v2 checkpoint layouts, on tiny synthetic shard sets written here (lingbot-world-v2.md §7.1-7.3).

- the 1.3B: a flat folder of `model-0000k-of-0000N.safetensors` + `model.safetensors.index.json`, F32, no config.json:
  the config comes from the shapes alone, heads = dim / 128 (here dim 256 -> 2 heads, the 1.3B's 1536 -> 12);
- the 14B: the download root holds T5/VAE files and `transformers/` with those shards and a diffusers-style config.json
  of class WanModelFast;
- the shards without their index (a complete set), an incomplete set, an index naming a missing shard.
"""
from __future__ import annotations

import json
from dataclasses import replace

import pytest
import torch
from safetensors.torch import save_file

from lingbot_world.loaders.expert_format import (ExpertNotFoundError, assume_model_kind, check_model_kind,
                                                 detect_format, model_kind)
from lingbot_world.loaders.expert_loader import load_expert
from lingbot_world.loaders.nf4_writer import random_expert_state
from lingbot_world.loaders.shard_layout import is_sharded_folder
from lingbot_world.wan.dit.model import DiTConfig, WanDiT

# the 1.3B's proportions at a quarter of the width: head_dim 128, freq 256, text 4096 as released
CFG = DiTConfig(dim=256, ffn_dim=1504, num_heads=2, num_layers=3, freq_dim=256, text_dim=4096)


def write_shards(folder, state: dict, shards: int, index: bool = True, total=None) -> list:
    """The transformers-style shard set of the v2 releases: model-0000k-of-0000N.safetensors (+ the index)."""
    folder.mkdir(parents=True, exist_ok=True)
    keys = sorted(state)
    names, weight_map = [], {}
    total = total or shards
    for i in range(shards):
        name = f"model-{i + 1:05d}-of-{total:05d}.safetensors"
        part = {k: state[k].contiguous() for k in keys[i::shards]}
        save_file(part, str(folder / name))
        weight_map.update({k: name for k in part})
        names.append(folder / name)
    if index:
        meta = {"metadata": {"total_size": sum(t.numel() * 4 for t in state.values())}, "weight_map": weight_map}
        (folder / "model.safetensors.index.json").write_text(json.dumps(meta))
    return names


@pytest.fixture(scope="module")
def state():
    return dict(random_expert_state(CFG, seed=4, dtype=torch.float32))


def test_1_3b_flat_folder_without_config(tmp_path, state):
    folder = tmp_path / "lingbot-world-v2-1.3b-causal-fast"
    write_shards(folder, state, 3)
    assert is_sharded_folder(folder)
    fmt = detect_format(folder)
    assert fmt.kind == "official_sharded" and len(fmt.files) == 3 and fmt.key_prefix == ""
    assert fmt.config_source == "inferred from shapes"
    c = fmt.config
    assert (c.dim, c.num_heads, c.head_dim, c.num_layers, c.ffn_dim) == (256, 2, 128, 3, 1504)
    assert (c.freq_dim, c.text_dim, c.in_dim, c.out_dim, c.control_in) == (256, 4096, 36, 16, 1536)
    assert model_kind(fmt) is None and "no config says" in check_model_kind(fmt, "fast")
    # the weights load as they are (bf16 mode: no quantization of the float file)
    model = load_expert(folder, "cpu", mode="bf16")
    assert torch.equal(model.state_dict()["blocks.2.ffn.0.weight"].float(),
                       state["blocks.2.ffn.0.weight"].to(torch.bfloat16).float())


def test_an_inferred_config_takes_the_kind_it_is_given(tmp_path, state):
    write_shards(tmp_path / "m", state, 2)
    fmt = detect_format(tmp_path / "m")
    fast = assume_model_kind(fmt, "fast")
    assert fast.config.causal and model_kind(fast) == "fast" and check_model_kind(fast, "fast") is None
    assert fast.config.to_json()["_class_name"] == "WanModelFast" and fast.files == fmt.files
    with pytest.raises(ValueError, match="model kind"):
        assume_model_kind(fmt, "slow")


@pytest.mark.parametrize("index", ["model.safetensors.index.json", "diffusion_pytorch_model.safetensors.index.json"])
def test_14b_root_with_transformers_subfolder(tmp_path, state, index):
    """Third parties list model-0000k-of-00008 shards; upstream loads the folder with diffusers' from_pretrained,
    which only looks for the diffusers index name (and takes the shard names from it): either index is read."""
    root = tmp_path / "lingbot-world-v2-14b-causal-fast"
    dit = root / "transformers"
    write_shards(dit, state, 4)
    (dit / "model.safetensors.index.json").rename(dit / index)
    # diffusers writes the init arguments minus ignore_for_config (patch_size, cross_attn_norm, qk_norm, text_dim)
    cfg = {"_class_name": "WanModelFast", "_diffusers_version": "0.35.1", "model_type": "i2v", "dim": 256,
           "ffn_dim": 1504, "freq_dim": 256, "in_dim": 36, "out_dim": 16, "num_heads": 2, "num_layers": 3,
           "text_len": 512, "eps": 1e-6, "local_attn_size": -1, "sink_size": 0}
    (dit / "config.json").write_text(json.dumps(cfg))
    for name in ("Wan2.1_VAE.pth", "models_t5_umt5-xxl-enc-bf16.pth"):
        (root / name).write_bytes(b"not read")
    (root / "google" / "umt5-xxl").mkdir(parents=True)
    for where in (root, dit):
        fmt = detect_format(where)
        assert fmt.path == dit and fmt.kind == "official_sharded" and len(fmt.files) == 4
        assert fmt.config_source == "config.json" and fmt.config == replace(CFG, causal=True)
        assert model_kind(fmt) == "fast" and check_model_kind(fmt, "fast") is None


def test_shards_without_index_and_unfinished_downloads(tmp_path, state):
    write_shards(tmp_path / "bare", state, 3, index=False)
    fmt = detect_format(tmp_path / "bare")
    assert fmt.kind == "official_sharded" and [p.name for p in fmt.files] == [
        "model-00001-of-00003.safetensors", "model-00002-of-00003.safetensors", "model-00003-of-00003.safetensors"]
    assert fmt.config == detect_format(write_shards(tmp_path / "indexed", state, 3)[0].parent).config

    files = write_shards(tmp_path / "partial", state, 2, index=False, total=3)  # shard 3 of 3 never arrived
    assert not is_sharded_folder(tmp_path / "partial")
    with pytest.raises(ExpertNotFoundError, match="not one complete model-0000k-of-0000N set"):
        detect_format(files[0].parent)

    write_shards(tmp_path / "lost", state, 3)
    (tmp_path / "lost" / "model-00002-of-00003.safetensors").unlink()
    with pytest.raises(ExpertNotFoundError, match="model-00002-of-00003.safetensors: shard listed in "
                                                  "model.safetensors.index.json is missing"):
        detect_format(tmp_path / "lost")


def test_state_dict_names_are_the_models(state):
    """The synthetic sets hold exactly our DiT's tensors (the released 1.3B index matches this pattern list)."""
    with torch.device("meta"):
        assert set(WanDiT(CFG).state_dict()) == set(state)
