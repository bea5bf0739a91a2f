"""Act experts are recognised from their weights (patch_embedding_wancamctrl takes 1792 inputs) in every format
the Cam experts load in: official shards (NF4 while loading, or bf16), community NF4 folder, single file,
convert-expert; config.json is the release's (it says nothing about Cam or Act)."""
import json

import pytest
import torch

from lingbot_world.loaders.expert_format import ExpertLoadError, check_control_pair, detect_format
from lingbot_world.loaders.expert_loader import load_expert
from lingbot_world.loaders.nf4_writer import (
    convert_official_to_nf4,
    make_random_nf4_expert,
    random_expert_state,
    write_official_expert,
)
from lingbot_world.loaders.safetensors_stream import SafetensorsWriter
from lingbot_world.wan.dit.model import DiTConfig

ACT = DiTConfig.tiny(control_in=1792)
CAM = DiTConfig.tiny()


def _release_config(folder):
    """The release's config.json has no control field: drop ours, so only the weights can tell."""
    p = folder / "config.json"
    cfg = json.loads(p.read_text())
    cfg.pop("control_in", None)
    p.write_text(json.dumps(cfg))


@pytest.fixture(scope="module")
def official_act(tmp_path_factory):
    d = tmp_path_factory.mktemp("act") / "high_noise_model"
    write_official_expert(random_expert_state(ACT, seed=3), ACT, d, dtype=torch.float32, max_shard_bytes=300_000)
    _release_config(d)
    return d


def _inputs(f=2, h=4, w=4):
    g = torch.Generator().manual_seed(0)
    return dict(x=torch.randn(1, 16, f, h, w, generator=g), t=torch.tensor([937]),
                context=torch.randn(1, 6, ACT.text_dim, generator=g), y=torch.randn(1, 20, f, h, w, generator=g),
                camera=torch.randn(1, 448, f, h, w, generator=g))


def test_official_act_shards_are_detected_and_load_as_nf4_and_bf16(official_act):
    fmt = detect_format(official_act)
    assert fmt.kind == "official_sharded" and fmt.config_source == "config.json"
    assert (fmt.config.control_in, fmt.config.control_kind) == (1792, "act")
    nf4 = load_expert(official_act, "cpu")
    bf16 = load_expert(official_act, "cpu", mode="bf16")
    assert nf4.cfg.control_kind == bf16.cfg.control_kind == "act"
    with torch.no_grad():
        a, b = nf4(**_inputs()), bf16(**_inputs())
    assert torch.isfinite(a).all() and torch.isfinite(b).all()


def test_convert_expert_keeps_the_act_width(official_act, tmp_path):
    out = tmp_path / "high_noise_model_bnb_nf4"
    convert_official_to_nf4(official_act, out, device="cpu")
    fmt = detect_format(out)
    assert fmt.kind == "nf4_community" and fmt.config.control_kind == "act"
    assert "control_in" not in json.loads((out / "config.json").read_text())  # the release's config, copied


def test_community_nf4_and_single_file_act_experts(tmp_path):
    folder = tmp_path / "low_noise_model_bnb_nf4"
    make_random_nf4_expert(ACT, folder, device="cpu", seed=1)
    _release_config(folder)
    fmt = detect_format(folder)
    assert fmt.kind == "nf4_community" and fmt.config.control_in == 1792
    model = load_expert(folder, "cpu")
    assert model.patch_embedding_wancamctrl.in_features == 1792
    # single plain safetensors files: the config in the metadata (without a control field), or none at all
    meta_cfg = {k: v for k, v in ACT.to_json().items() if k != "control_in"}
    wide = DiTConfig.tiny(dim=128, num_heads=1, num_layers=1, control_in=1792)  # heads = dim / 128 when inferred
    for name, cfg, meta, source in (("meta", ACT, {"config": json.dumps(meta_cfg)}, "safetensors metadata"),
                                    ("shapes", wide, {}, "inferred from shapes")):
        single = tmp_path / f"lingbot_act_{name}.safetensors"
        w = SafetensorsWriter(single, {"format": "pt", **meta})
        for k, t in random_expert_state(cfg, seed=5, dtype=torch.bfloat16):
            w.add(k, t)
        w.close()
        fmt = detect_format(single)
        assert fmt.kind == "single_file_plain" and fmt.config_source == source
        assert fmt.config.control_kind == "act" and fmt.config.dim == cfg.dim


def test_cam_and_act_experts_do_not_pair(official_act, tmp_path):
    cam = tmp_path / "low_noise_model_bnb_nf4"
    make_random_nf4_expert(CAM, cam, device="cpu", seed=2)
    high, low = detect_format(official_act), detect_format(cam)
    assert low.config.control_kind == "camera"
    assert check_control_pair(high, high) == "act"
    with pytest.raises(ExpertLoadError, match="is an Act model .* but the low-noise expert .* is a Cam model"):
        check_control_pair(high, low)


def test_an_unknown_control_width_is_refused(tmp_path):
    folder = tmp_path / "odd"
    folder.mkdir()
    w = SafetensorsWriter(folder / "model.safetensors", {"format": "pt"})
    for k, t in random_expert_state(CAM, seed=5, dtype=torch.bfloat16):
        if k == "patch_embedding_wancamctrl.weight":
            t = torch.zeros(t.shape[0], 1600, dtype=torch.bfloat16)
        w.add(k, t)
    w.close()
    (folder / "config.json").write_text(json.dumps(CAM.to_json()))
    with pytest.raises(ExpertLoadError, match="takes 1600 inputs, which is neither"):
        detect_format(folder)


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_act_expert_on_cuda_matches_cpu(official_act, tmp_path, examples_dir):
    """The Act expert loaded straight to the GPU (NF4) takes example 05's 7-channel tensor like the CPU load does."""
    import numpy as np

    from lingbot_world.loaders.action_files import read_act_folder
    from lingbot_world.wan.control.act_control import act_condition

    act = read_act_folder(examples_dir / "05")
    cond = act_condition(act.path.poses, act.path.intrinsics, act.actions, 32, 32, 5)
    inputs = {**_inputs(f=2, h=4, w=4), "camera": cond.tensor[:, :, :2]}
    cpu = load_expert(official_act, "cpu")
    gpu = load_expert(official_act, "cuda")
    assert gpu.patch_embedding_wancamctrl.weight.is_cuda or any(p.is_cuda for p in gpu.parameters())
    with torch.no_grad():
        a = cpu(**inputs)
        b = gpu(**{k: v.cuda() for k, v in inputs.items()}).cpu()
    assert np.isfinite(b.numpy()).all()
    assert (a - b).abs().max() / a.abs().max() < 5e-2  # bf16 GEMMs on the GPU vs the CPU's compute dtype
