"""`check-expert` and `convert-expert` sub-commands, driven through their own argparse registration."""
import argparse
import json

import torch

from lingbot_world.cli import check_expert, convert
from lingbot_world.loaders.nf4_writer import random_expert_state, write_official_expert
from lingbot_world.wan.dit.model import DiTConfig, WanDiT


def _cli(argv):
    parser = argparse.ArgumentParser(prog="lingbot-world")
    sub = parser.add_subparsers(dest="command", required=True)
    check_expert.add_parser(sub)
    convert.add_parser(sub)
    args = parser.parse_args(argv)
    return args.func(args)


def test_convert_then_check(tmp_path, capsys):
    cfg = DiTConfig.tiny()
    src = tmp_path / "high_noise_model"
    write_official_expert(random_expert_state(cfg), cfg, src, dtype=torch.float32, max_shard_bytes=400_000)
    out = tmp_path / "high_noise_model_bnb_nf4"
    assert _cli(["convert-expert", str(src), str(out), "--device", "cpu"]) == 0
    conv = json.loads(capsys.readouterr().out)
    assert conv["ok"] and conv["linear_layers_quantized"] == 37 and (out / "quantization_meta.json").is_file()

    assert _cli(["check-expert", str(out), "--device", "cpu"]) == 0
    rep = json.loads(capsys.readouterr().out)
    assert rep["format"] == "nf4_community" and rep["mode"] == "nf4" and rep["device"] == "cpu"
    assert rep["param_count"] == sum(p.numel() for p in WanDiT(cfg, device="meta").parameters())
    assert rep["bytes_on_device"] > 0 and rep["seconds"] > 0 and rep["gb_per_s"] > 0
    assert rep["peak_rss_growth_bytes"] is not None and rep["file_bytes"] == (out / "model.safetensors").stat().st_size

    assert _cli(["check-expert", str(src), "--device", "cpu", "--mode", "bf16"]) == 0
    rep = json.loads(capsys.readouterr().out)
    assert rep["format"] == "official_sharded" and rep["mode"] == "bf16" and rep["compute_dtype"] == "bfloat16"

    assert _cli(["check-expert", str(tmp_path / "missing"), "--device", "cpu"]) == 2  # bad input
    err = json.loads(capsys.readouterr().out)
    assert not err["ok"] and "expert path not found" in err["error"]
