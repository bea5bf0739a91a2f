"""The LingBot Actions node, the sampler's control checks, and the Act graph end to end on the tiny Act demo,
with the stand-ins for ComfyUI of test_nodes.py / test_nodes_pipeline.py (loaded by path)."""
from __future__ import annotations

import shutil
import sys
import types

import numpy as np
import pytest
import torch

from tests.conftest import load_sibling


nodes_helpers = load_sibling("test_nodes")
pipeline_helpers = load_sibling("test_nodes_pipeline")
fake_folder_paths = nodes_helpers.fake_folder_paths  # the fixture, reused

from lingbot_world.nodes.action import ACTION_STRING, CUSTOM_PATH, LingBotActions  # noqa: E402
from lingbot_world.nodes.adapters.payloads import ActInput, CameraInput, I2VCondition  # noqa: E402
from lingbot_world.nodes.sampler import control_for  # noqa: E402
from lingbot_world.wan.control.actions import ActionStringError, KeyInputError  # noqa: E402
from lingbot_world.wan.control.control_kind import ControlMismatchError  # noqa: E402
from lingbot_world.wan.dit.model import DiTConfig  # noqa: E402

README = "w-10,a-10,d-10,iw-15,none-10,j-10,l-10,s-15"


def test_action_string_gives_camera_act_picture_and_frames():
    camera, act, picture, frames = LingBotActions().build(README, 0)
    assert frames == 93
    assert isinstance(camera, CameraInput) and camera.includes_end_pose and camera.poses.shape == (94, 4, 4)
    assert camera.num_frames == 93 and camera.label == "w-10,a-10,d-10,wi-15,none-10,j-10,l-10,s-15,none-3"
    assert isinstance(act, ActInput) and act.includes_end_pose and act.actions.shape == (93, 4)
    assert act.actions[30].tolist() == [1, 0, 0, 0] and act.num_frames == 93
    assert picture.shape[0] == 1 and picture.shape[2] == 960 and picture.shape[1] > 600 and picture.shape[3] == 3
    longer = LingBotActions().build(README, 97)
    assert longer[3] == 97 and longer[0].poses.shape == (98, 4, 4)
    with pytest.raises(KeyInputError, match="90 frames of keys but the video has 81"):
        LingBotActions().build(README, 81)
    with pytest.raises(ActionStringError, match="segment 2 'q-3'"):
        LingBotActions().build("w-3,q-3", 0)


def test_key_files_from_the_input_folder(fake_folder_paths, examples_dir):
    target = fake_folder_paths / "input" / "lingbot_examples" / "05"
    shutil.copytree(examples_dir / "05", target)
    node = LingBotActions()
    camera, act, picture, frames = node.build("ignored", 0, "lingbot_examples/05")
    assert frames == 81  # key files: the first 81 frames by default
    assert camera.includes_end_pose and camera.poses.shape == (82, 4, 4)  # walked from wasd/ijkl_action.npy
    assert not act.includes_end_pose and act.actions.shape == (961, 4)  # the release's Act input: action.npy
    np.testing.assert_array_equal(act.poses, np.load(target / "poses.npy"))
    assert picture.shape[0] == 2  # the key path, and the Act input's poses with action.npy's keys
    assert "action.npy" in node.IS_CHANGED("x", 0, "lingbot_examples/05")
    assert node.IS_CHANGED("x", 0, ACTION_STRING) == "x|0"  # the string decides
    listed = node.INPUT_TYPES()["required"]["key_files"][0]
    assert listed[0] == ACTION_STRING and listed[-1] == CUSTOM_PATH and "lingbot_examples/05" in listed

    only_act = fake_folder_paths / "input" / "act_only"
    only_act.mkdir()
    for name in ("action.npy", "poses.npy", "intrinsics.npy"):
        shutil.copy(target / name, only_act / name)
    camera, act, picture, frames = node.build("ignored", 17, "act_only")
    assert frames == 17 and not camera.includes_end_pose and camera.poses.shape == (961, 4, 4)  # poses.npy
    assert picture.shape[0] == 1
    # a folder outside input/ or a single key file: the custom path
    camera, act, picture, frames = node.build("ignored", 0, CUSTOM_PATH, str(target / "wasd_action.npy"))
    assert frames == 81 and camera.includes_end_pose

    empty = fake_folder_paths / "input" / "empty"
    empty.mkdir()
    assert "empty" not in node.INPUT_TYPES()["required"]["key_files"][0]  # not a key-file folder
    with pytest.raises(FileNotFoundError, match="has no wasd_action.npy or ijkl_action.npy"):
        node.build("ignored", 0, CUSTOM_PATH, "empty")
    with pytest.raises(FileNotFoundError, match="key-file folder 'gone' was not found"):
        node.build("ignored", 0, "gone")


def _experts(control_in: int):
    cfg = DiTConfig.tiny(control_in=control_in)
    return types.SimpleNamespace(formats={"high": types.SimpleNamespace(config=cfg)})


def test_sampler_takes_the_control_its_model_needs_and_refuses_the_other():
    i2v = I2VCondition(torch.zeros(1, 20, 5, 4, 6), 32, 48, 17, (0.0,) * 16, (1.0,) * 16)
    camera, act, _, _ = LingBotActions().build("wi-8,dl-8,none-1", 0)
    assert control_for(_experts(1792), i2v, None, act)[0].shape == (1, 448, 5, 4, 6)
    assert control_for(_experts(1536), i2v, camera, None)[0].shape == (1, 384, 5, 4, 6)
    assert control_for(_experts(1792), i2v, None, None) == (None, None)  # no control: plain image-to-video
    with pytest.raises(ControlMismatchError, match="an Act model.*camera trajectory.*'act' output of LingBot Actions"):
        control_for(_experts(1792), i2v, camera, None)
    with pytest.raises(ControlMismatchError, match="a Cam model.*Act control.*'camera' output of LingBot Actions"):
        control_for(_experts(1536), i2v, None, act)
    with pytest.raises(ValueError, match="both a camera and an act input"):
        control_for(_experts(1792), i2v, camera, act)
    short = LingBotActions().build("w-8,none-1", 0)[1]
    with pytest.raises(ValueError, match="act control covers 9 frames but the video has 17.*frames output"):
        control_for(_experts(1792), i2v, None, short)


# ---- the Act graph on the tiny Act demo, through the stand-ins for ComfyUI -----------------------------------
@pytest.fixture(scope="module")
def act_base(tmp_path_factory, examples_dir):
    from lingbot_world.loaders.demo_checkpoint import build_demo_checkpoint

    base = tmp_path_factory.mktemp("comfy_act")
    for d in ("models/diffusion_models", "models/text_encoders", "models/vae", "input", "output", "user"):
        (base / d).mkdir(parents=True, exist_ok=True)
    build_demo_checkpoint(base / "models" / "lingbot_world" / "lingbot-demo-act", control="act")
    shutil.copytree(examples_dir / "05", base / "input" / "lingbot_examples" / "05")
    return base


@pytest.fixture
def comfy_act(act_base, monkeypatch):
    mods = pipeline_helpers.make_comfy(act_base)
    for name, mod in mods.items():
        monkeypatch.setitem(sys.modules, name, mod)
    monkeypatch.delitem(sys.modules, "lingbot_world.nodes.adapters.patchers", raising=False)
    from lingbot_world.nodes.adapters import comfy_paths

    comfy_paths.register_model_folders()
    return mods["comfy.model_management"]


def test_act_graph_matches_the_library_and_refuses_a_camera(comfy_act, act_base):
    from lingbot_world.loaders.expert_loader import load_expert
    from lingbot_world.nodes import NODE_CLASS_MAPPINGS as N
    from lingbot_world.wan.control.act_control import act_condition
    from lingbot_world.wan.dit.model import pad_context
    from lingbot_world.wan.sampling.sampler import ResidentExperts, SamplingSettings, make_noise, sample

    demo = "lingbot-demo-act/"
    experts = N["LingBotExpertLoader"]().load(demo + "high_noise_model_bnb_nf4", demo + "low_noise_model_bnb_nf4",
                                              "nf4", "swap", -1)[0]
    assert experts.formats["high"].config.control_kind == "act"
    text = N["LingBotTextEncode"]().encode(demo + "models_t5_umt5-xxl-enc-bf16.pth", "auto", "a jungle", "", "auto", True)[0]
    camera, act, _, frames = N["LingBotActions"]().build("ignored", 9, "lingbot_examples/05")
    vae = N["LingBotVAELoader"]().load(demo + "Wan2.1_VAE.pth")[0]
    image = torch.rand(1, 36, 64, 3, generator=torch.Generator().manual_seed(3))
    i2v = N["LingBotImageToVideo"]().encode(vae, image, "custom", 48, 32, frames, False)[0]
    args = dict(steps=2, shift=10.0, boundary=0.947, guide_high=5.0, guide_low=4.0, seed=5, noise_source="cpu",
                solver="unipc", cfg_mode="sequential")
    with pytest.raises(ControlMismatchError, match="Act model"):
        N["LingBotSampler"]().sample(experts, text, i2v, camera=camera, **args)
    latent = N["LingBotSampler"]().sample(experts, text, i2v, act=act, **args)[0]["samples"]
    assert latent.shape == (1, 16, 3, 4, 6)

    high, low = (load_expert(experts.formats[n].path, "cpu") for n in ("high", "low"))
    cond = act_condition(np.load(act_base / "input/lingbot_examples/05/poses.npy"),
                         np.load(act_base / "input/lingbot_examples/05/intrinsics.npy"),
                         np.load(act_base / "input/lingbot_examples/05/action.npy"), 32, 48, 9)
    settings = SamplingSettings(steps=2, guide_high=5.0, guide_low=4.0, cfg_mode="sequential")
    z = sample(ResidentExperts(high, low), make_noise((1, 16, 3, 4, 6), 5, "cpu"), pad_context([text.positive], 512),
               pad_context([text.negative], 512), i2v.y, cond.tensor, settings)
    torch.testing.assert_close(latent, i2v.to_raw_latent(z), rtol=0, atol=0)
