"""Keys -> camera path (fast-act spec §7): trajectory rules against an independent formulation, and the
act-to-camera conditioning against the reference's float32 arithmetic."""
import numpy as np
import pytest
import torch
from scipy.spatial.transform import Rotation

from lingbot_world.loaders.action_files import read_key_source
from lingbot_world.wan.control.act_to_camera import WalkState, keys_to_camera, walk
from lingbot_world.wan.control.actions import KeyTimeline, keys_for_video
from lingbot_world.wan.control.camera import camera_condition

from tests.conftest import load_sibling


def independent_walk(keys: KeyTimeline) -> np.ndarray:
    """Spec §7 written as accumulated angles: R_n = R_y(yaw_n) R_x(pitch_n), since yaw multiplies from the left
    and pitch from the right; the pitch is clamped by skipping steps beyond +-85 degrees."""
    yaw = pitch = 0.0
    pos = np.zeros(3)
    out = [np.eye(4)]
    for f in range(keys.frames):
        k = keys.keys_at(f)
        dp = np.radians(2.0) * (("i" in k) - ("k" in k))
        if abs(pitch + dp) <= np.radians(85) + 1e-12:
            pitch += dp
        yaw += np.radians(2.0) * (("l" in k) - ("j" in k))
        rot = Rotation.from_euler("y", yaw).as_matrix() @ Rotation.from_euler("x", pitch).as_matrix()
        ground = lambda v: np.array([v[0], 0.0, v[2]]) / (np.hypot(v[0], v[2]) + 1e-6)
        fwd, right = ground(rot[:, 2]), ground(rot[:, 0])
        pos = pos + 0.05 * ((("w" in k) - ("s" in k)) * fwd + (("d" in k) - ("a" in k)) * right)
        m = np.eye(4)
        m[:3, :3], m[:3, 3] = rot, pos
        out.append(m)
    return np.stack(out)


@pytest.mark.parametrize("text", [
    "w-10,a-10,d-10,iw-15,none-10,j-10,l-10,s-15",
    "il-30,wd-20,kj-50,sa-7",
    "i-60,wk-25,l-200",
])
def test_walk_matches_the_independent_formulation(text):
    keys = KeyTimeline.from_string(text)
    poses, end = walk(keys)
    assert poses.shape == (keys.frames + 1, 4, 4) and poses.dtype == np.float64
    assert np.array_equal(poses[0], np.eye(4))
    assert np.abs(poses - independent_walk(keys)).max() < 1e-12
    assert np.array_equal(end.c2w, poses[-1])


def test_pitch_clamps_at_85_degrees_and_yaw_still_turns():
    poses, end = walk(KeyTimeline.from_string("i-60"))
    pitch = np.degrees(np.arctan2(-poses[:, 1, 2], poses[:, 2, 2]))  # forward axis above the horizon
    assert pitch[42] == pytest.approx(84) and np.allclose(pitch[42:], 84)  # 43rd step would reach 86: dropped
    assert np.degrees(end.pitch) == pytest.approx(84)
    down, _ = walk(KeyTimeline.from_string("i-60,k-10"), None)
    assert np.degrees(np.arctan2(-down[-1, 1, 2], down[-1, 2, 2])) == pytest.approx(64)
    turned, _ = walk(KeyTimeline.from_string("i-50,il-5"))  # at the limit: pitch steps dropped, yaw applied
    yaw = np.degrees(np.arctan2(turned[-1, 0, 2], turned[-1, 2, 2]))
    assert yaw == pytest.approx(10) and np.degrees(np.arcsin(-turned[-1, 1, 2])) == pytest.approx(84)


@pytest.mark.parametrize("text", ["ws-10", "ad-10", "ik-10", "jl-10", "wasdijkl-10"])
def test_opposite_keys_cancel(text):
    poses, _ = walk(KeyTimeline.from_string(text))
    assert np.array_equal(poses, np.broadcast_to(np.eye(4), poses.shape))


def test_yaw_about_the_world_vertical_and_pitch_about_the_camera_axis():
    poses, _ = walk(KeyTimeline.from_string("il-20"))
    r = poses[-1, :3, :3]
    assert abs(r[1, 0]) < 1e-15  # the camera's right axis stays horizontal: no roll, the horizon is level
    expect = Rotation.from_euler("y", 40, degrees=True).as_matrix() @ Rotation.from_euler("x", 40, degrees=True).as_matrix()
    assert np.abs(r - expect).max() < 1e-12
    wrong = Rotation.from_euler("x", 40, degrees=True).as_matrix() @ Rotation.from_euler("y", 40, degrees=True).as_matrix()
    assert np.abs(r - wrong).max() > 0.1


def test_walking_while_looking_up_stays_level_and_moves_0_05_per_frame():
    poses, _ = walk(KeyTimeline.from_string("i-20,wi-10,w-10"))
    centres = poses[:, :3, 3]
    assert np.abs(centres[:, 1]).max() == 0.0  # flat forward: never leaves the ground plane
    steps = np.linalg.norm(np.diff(centres, axis=0), axis=1)
    assert np.allclose(steps[:20], 0) and np.allclose(steps[20:], 0.05 / (1 + 1e-6))


def test_walking_in_segments_continues_from_the_end_state():
    keys = KeyTimeline.from_string("w-10,a-10,d-10,iw-15,none-10,j-10,l-10,s-15,i-40")
    whole, end = walk(keys)
    a, mid = walk(keys[:37])
    b, end2 = walk(keys[37:], mid)
    assert np.array_equal(np.concatenate([a, b[1:]]), whole)
    assert np.array_equal(end2.c2w, end.c2w) and end2.pitch == end.pitch
    assert isinstance(WalkState().c2w, np.ndarray)


def test_act_to_camera_conditioning_reproduces_the_reference():
    """README example: 93 frames, 94 poses resampled at linspace(0, 93, 24), then the float32 relative poses."""
    keys, frames, _ = keys_for_video(KeyTimeline.from_string("w-10,a-10,d-10,iw-15,none-10,j-10,l-10,s-15"))
    path, _ = keys_to_camera(keys)
    assert path.poses.shape == (94, 4, 4) and path.intrinsics.shape == (94, 4)
    cond = camera_condition(path.poses, path.intrinsics, 48, 80, frames, includes_end_pose=True)
    assert cond.frames == 93 and cond.plucker.shape == (1, 384, 24, 6, 10) and cond.message is None
    num = load_sibling("test_camera_numerics")
    ref = num.reference_relative(path.poses, np.linspace(0, 93, 24))
    assert (cond.relative_poses - ref).abs().max().item() <= 1e-7
    assert (cond.plucker - num.reference_plucker(ref, path.intrinsics, 48, 80)).abs().max().item() <= 1e-6
    # the targets are not integers: the per-frame rule (94 poses -> 93 frames at 0, 4, ..., 92) differs
    per_frame = camera_condition(path.poses, path.intrinsics, 48, 80, 93)
    assert (per_frame.relative_poses - cond.relative_poses).abs().max() > 1e-3


@pytest.mark.parametrize("name", ["00", "01", "02", "05"])
def test_key_files_of_the_examples_reproduce_the_reference(examples_dir, name):
    src = read_key_source(str(examples_dir / name))
    keys, frames, note = keys_for_video(src.keys, 81, source=src.label, from_file=True)
    assert frames == 81 and "first 81" in note
    path, _ = keys_to_camera(keys, src.intrinsics)
    cond = camera_condition(path.poses, path.intrinsics, 48, 80, 81, includes_end_pose=True)
    num = load_sibling("test_camera_numerics")
    ref = num.reference_relative(path.poses, np.linspace(0, 81, 21))
    assert (cond.relative_poses - ref).abs().max().item() <= 1e-7
    assert torch.isfinite(cond.plucker).all()
