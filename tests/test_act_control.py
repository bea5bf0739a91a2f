"""The Act model's 7-channel control (fast-act spec §6): layout against the spec's formula, the release's Act
inputs, the Act DiT's input width, and the refusal of a control that does not fit the model."""
import numpy as np
import pytest
import torch
from einops import rearrange

from lingbot_world.loaders.action_files import read_act_folder
from lingbot_world.wan.control.act_control import ACT_TENSOR_CHANNELS, act_condition, check_actions
from lingbot_world.wan.control.act_to_camera import keys_to_camera
from lingbot_world.wan.control.actions import KeyTimeline
from lingbot_world.wan.control.camera import CameraInputError, camera_condition
from lingbot_world.wan.control.control_kind import ControlMismatchError, check_control
from lingbot_world.wan.dit.model import DiTConfig, WanDiT

from tests.conftest import load_sibling


def _wandering(n: int, seed: int = 0) -> np.ndarray:
    from scipy.spatial.transform import Rotation

    rng = np.random.default_rng(seed)
    s = np.linspace(0, 1, n)[:, None]
    rots = Rotation.from_rotvec(rng.normal(size=(1, 3)) * 0.3 + s * rng.normal(size=(1, 3))).as_matrix()
    poses = np.tile(np.eye(4), (n, 1, 1))
    poses[:, :3, :3] = rots
    poses[:, :3, 3] = 20 * rng.normal(size=(1, 3)) + s * rng.normal(size=(1, 3))
    return poses.astype(np.float32)


K = np.array([502.9116, 503.10812, 415.77786, 239.77779], dtype=np.float32)


def test_tensor_layout_matches_the_spec_formula_after_patchify():
    n, h, w = 9, 32, 48
    poses = _wandering(n)
    actions = np.random.default_rng(1).integers(0, 2, size=(n, 4)).astype(np.int32)
    cond = act_condition(poses, np.tile(K, (n, 1)), actions, h, w, n)
    f_lat, lat_h, lat_w = 3, h // 8, w // 8
    assert cond.tensor.shape == (1, ACT_TENSOR_CHANNELS, f_lat, lat_h, lat_w) == (1, 448, 3, 4, 6)
    assert cond.tensor.dtype == torch.float32
    assert torch.equal(cond.latent_actions, torch.from_numpy(actions[::4].astype(np.float32)))
    # independent per-pixel field [F, h, w, 7]: d = R normalize(((u+.5-cx)/fx, (v+.5-cy)/fy, 1)), then the action row
    k = cond.scaled_intrinsics[0].double().numpy()
    u, v = np.meshgrid(np.arange(w) + 0.5, np.arange(h) + 0.5)
    d_cam = np.stack([(u - k[2]) / k[0], (v - k[3]) / k[1], np.ones_like(u)], -1)
    d_cam /= np.linalg.norm(d_cam, axis=-1, keepdims=True)
    field = np.empty((f_lat, h, w, 7))
    for f in range(f_lat):
        field[f, ..., :3] = d_cam @ cond.relative_poses[f, :3, :3].double().numpy().T
        field[f, ..., 3:] = actions[4 * f]
    tokens = rearrange(cond.tensor, "b c f (h q) (w r) -> b (f h w) (c q r)", q=2, r=2)  # the DiT's patchify
    assert tokens.shape == (1, f_lat * (lat_h // 2) * (lat_w // 2), 1792)
    worst = 0.0
    for f, hp, wp in [(0, 0, 0), (1, 1, 2), (2, 1, 0), (2, 0, 1)]:
        token = (f * (lat_h // 2) + hp) * (lat_w // 2) + wp
        for c7 in range(7):
            for py in range(8):
                for px in range(8):
                    for qy in range(2):
                        for qx in range(2):
                            kk = ((c7 * 64 + py * 8 + px) * 4) + qy * 2 + qx
                            row, col = (2 * hp + qy) * 8 + py, (2 * wp + qx) * 8 + px
                            worst = max(worst, abs(tokens[0, token, kk].item() - field[f, row, col, c7]))
    assert worst < 1e-6


def test_release_act_input_of_example_05_matches_the_reference(examples_dir):
    act = read_act_folder(examples_dir / "05")
    assert act.actions.dtype == np.int32 and act.actions.shape == (961, 4)
    cond = act_condition(act.path.poses, act.path.intrinsics, act.actions, 48, 80, 121)
    assert cond.frames == 121 and cond.tensor.shape == (1, 448, 31, 6, 10)
    num = load_sibling("test_camera_numerics")
    ref_rel = num.reference_relative(act.path.poses[:121], np.linspace(0, 120, 31))
    ref = num.reference_plucker(ref_rel, act.path.intrinsics, 48, 80)[:, 192:]  # rays_d only
    assert (cond.tensor[:, :192] - ref).abs().max().item() <= 1e-6
    expect = torch.from_numpy(act.actions[:121][::4].astype(np.float32))
    got = cond.tensor[0, 192:].view(4, 64, 31, 6, 10)
    assert torch.equal(got, expect.T[:, None, :, None, None].expand_as(got))
    # rays match the camera conditioning's direction channels exactly (same geometry, same packing)
    cam = camera_condition(act.path.poses, act.path.intrinsics, 48, 80, 121)
    assert torch.equal(cam.plucker[:, 192:], cond.tensor[:, :192])


def test_frames_are_limited_by_poses_and_actions():
    poses, k = _wandering(41), np.tile(K, (41, 1))
    cond = act_condition(poses, k, np.zeros((30, 4)), 32, 48, 41)
    assert cond.frames == 29 and "cover 30 frames" in cond.message
    cond = act_condition(poses[:21], k[:21], np.zeros((41, 4)), 32, 48, 41)
    assert cond.frames == 21 and "21 poses" in cond.message
    with pytest.raises(CameraInputError, match=r"action.npy: shape \(41, 3\)"):
        act_condition(poses, k, np.zeros((41, 3)), 32, 48, 41, actions_name="action.npy")
    with pytest.raises(CameraInputError, match="NaN"):
        check_actions(np.full((5, 4), np.nan))


def test_act_from_keys_uses_the_key_path_rotation_and_the_wasd_keys():
    keys = KeyTimeline.from_string("wi-8,dl-8,none-1")
    path, _ = keys_to_camera(keys)
    cond = act_condition(path.poses, path.intrinsics, keys.wasd, 32, 48, 17, includes_end_pose=True)
    cam = camera_condition(path.poses, path.intrinsics, 32, 48, 17, includes_end_pose=True)
    assert torch.equal(cond.tensor[:, :192], cam.plucker[:, 192:])
    assert cond.latent_actions.tolist() == [[1, 0, 0, 0], [1, 0, 0, 0], [0, 0, 0, 1], [0, 0, 0, 1], [0, 0, 0, 0]]


def _inputs(cfg: DiTConfig, control_channels: int):
    g = torch.Generator().manual_seed(0)
    f, h, w = 2, 4, 4
    return dict(x=torch.randn(1, cfg.out_dim, f, h, w, generator=g), t=torch.tensor([900]),
                context=torch.randn(1, 5, cfg.text_dim, generator=g),
                y=torch.randn(1, cfg.in_dim - cfg.out_dim, f, h, w, generator=g),
                camera=torch.randn(1, control_channels, f, h, w, generator=g))


def test_act_dit_takes_the_448_channel_tensor_and_refuses_a_camera(randomise_dit):
    cfg = DiTConfig.tiny(control_in=1792)
    assert (cfg.control_channels, cfg.control_kind, cfg.control_tensor_channels) == (7, "act", 448)
    assert (DiTConfig.tiny().control_kind, DiTConfig.tiny().control_in) == ("camera", 1536)
    model = WanDiT(cfg).eval()
    randomise_dit(model, torch.Generator().manual_seed(1))
    assert model.patch_embedding_wancamctrl.in_features == 1792
    with torch.no_grad():
        out = model(**_inputs(cfg, 448))
        assert out.shape == (1, 16, 2, 4, 4) and torch.isfinite(out).all()
        plain = model(**{**_inputs(cfg, 448), "camera": None})
        assert not torch.allclose(out, plain)  # the control reaches the output
        with pytest.raises(ValueError, match="384 channels; this model \\(act control, 7 per pixel\\) takes 448"):
            model(**_inputs(cfg, 384))
    with pytest.raises(ValueError, match="control_in 1600"):
        DiTConfig.tiny(control_in=1600).validate()


def test_control_kind_mismatch_messages():
    check_control("act", "act")
    check_control("camera", None)
    with pytest.raises(ControlMismatchError, match="an Act model .* but the input is a camera trajectory.*give keys"):
        check_control("act", "camera", "give keys")
    with pytest.raises(ControlMismatchError, match="a Cam model .* but the input is Act control"):
        check_control("camera", "act")
