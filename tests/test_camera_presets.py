"""Code-generated camera presets: OpenCV directions, units of speed, combinations."""
import warnings

import numpy as np
import pytest
import torch

from lingbot_world.wan.control.camera import camera_condition, check_camera
from lingbot_world.wan.control.camera_presets import (
    DEFAULT_INTRINSICS,
    ORBIT_RADIUS,
    PRESET_NAMES,
    parse_preset,
    preset_camera,
)

REQUIRED = {
    "static", "pan_left", "pan_right", "tilt_up", "tilt_down", "dolly_in", "dolly_out", "truck_left",
    "truck_right", "pedestal_up", "pedestal_down", "orbit_left", "orbit_right", "zoom_in", "zoom_out",
}


def forward(pose):  # camera z axis (viewing direction) in first-camera coordinates
    return pose[:3, 2].astype(np.float64)


def test_names_and_format():
    assert REQUIRED <= set(PRESET_NAMES)
    for name in PRESET_NAMES:
        cam = preset_camera(name, frames=41)
        assert cam.poses.shape == (41, 4, 4) and cam.poses.dtype == np.float32
        assert cam.intrinsics.shape == (41, 4) and cam.intrinsics.dtype == np.float32
        np.testing.assert_array_equal(cam.poses[0], np.eye(4))
        np.testing.assert_allclose(cam.intrinsics[0], DEFAULT_INTRINSICS)
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # rotations stay orthonormal: no renormalisation warning
            check_camera(*cam)


def test_directions_in_opencv_axes():
    last = {name: preset_camera(name, frames=81).poses[-1] for name in PRESET_NAMES}
    assert forward(last["pan_right"])[0] > 0.1 and forward(last["pan_left"])[0] < -0.1
    assert forward(last["tilt_up"])[1] < -0.1 and forward(last["tilt_down"])[1] > 0.1  # y points down
    for name, axis, sign in [
        ("dolly_in", 2, 1), ("dolly_out", 2, -1), ("truck_right", 0, 1), ("truck_left", 0, -1),
        ("pedestal_up", 1, -1), ("pedestal_down", 1, 1),
    ]:
        centre = last[name][:3, 3]
        assert np.sign(centre[axis]) == sign and np.abs(np.delete(centre, axis)).max() < 1e-6, name
        np.testing.assert_allclose(last[name][:3, :3], np.eye(3), atol=1e-6)
    for name in ("pan_right", "tilt_up", "zoom_in", "static"):
        assert np.abs(last[name][:3, 3]).max() < 1e-6, name
    np.testing.assert_array_equal(preset_camera("static", 9).poses, np.repeat(np.eye(4, dtype=np.float32)[None], 9, 0))


@pytest.mark.parametrize("name, side", [("orbit_left", -1), ("orbit_right", 1)])
def test_orbit_circles_a_pivot_and_keeps_looking_at_it(name, side):
    poses = preset_camera(name, frames=81).poses.astype(np.float64)
    pivot = np.array([0.0, 0.0, ORBIT_RADIUS])
    for p in poses:
        to_pivot = pivot - p[:3, 3]
        assert np.linalg.norm(to_pivot) == pytest.approx(ORBIT_RADIUS, abs=1e-5)
        np.testing.assert_allclose(forward(p), to_pivot / ORBIT_RADIUS, atol=1e-5)
    assert np.sign(poses[-1, 0, 3]) == side and abs(poses[:, 1, 3]).max() < 1e-6


def test_speed_units():
    # pan: 0.5 degree per frame at speed 1 -> speed 2 over 80 steps = 80 degrees
    f = forward(preset_camera("pan_right", frames=81, speed=2.0).poses[-1])
    assert np.degrees(np.arctan2(f[0], f[2])) == pytest.approx(80.0, abs=1e-3)
    f = forward(preset_camera("tilt_up", frames=21, speed=1.0).poses[-1])
    assert np.degrees(np.arctan2(-f[1], f[2])) == pytest.approx(10.0, abs=1e-3)
    # dolly: 0.05 scene units per frame
    assert preset_camera("dolly_in", frames=81).poses[-1, 2, 3] == pytest.approx(4.0, abs=1e-5)
    assert preset_camera("truck_left", frames=11, speed=0.5).poses[-1, 0, 3] == pytest.approx(-0.25, abs=1e-6)
    # zoom: focal x exp(0.005) per frame; principal point fixed
    k = preset_camera("zoom_in", frames=81).intrinsics
    assert k[-1, 0] / k[0, 0] == pytest.approx(np.exp(0.4), rel=1e-6)
    assert k[-1, 1] / k[0, 1] == pytest.approx(np.exp(0.4), rel=1e-6)
    np.testing.assert_array_equal(k[:, 2:], np.tile(np.float32(DEFAULT_INTRINSICS[2:]), (81, 1)))
    assert preset_camera("zoom_out", frames=81).intrinsics[-1, 0] < DEFAULT_INTRINSICS[0]
    np.testing.assert_array_equal(preset_camera("pan_left", 9, speed=0).poses, preset_camera("static", 9).poses)


def test_combinations():
    a = preset_camera("dolly_in+pan_right", frames=41)
    b = preset_camera(["pan_right", "dolly_in"], frames=41)
    np.testing.assert_array_equal(a.poses, b.poses)
    assert parse_preset(" Dolly In + pan-right ") == ("dolly_in", "pan_right")
    # moving forward while turning right: an arc that bends to the right, looking along its tangent
    end = a.poses[-1].astype(np.float64)
    assert end[0, 3] > 0 and end[2, 3] > 0 and forward(end)[0] > 0
    np.testing.assert_allclose(end[:3, :3], preset_camera("pan_right", frames=41).poses[-1, :3, :3], atol=1e-6)
    # opposite moves cancel
    np.testing.assert_allclose(preset_camera("pan_left+pan_right+truck_left+truck_right", 9).poses,
                               preset_camera("static", 9).poses, atol=1e-7)


def test_bad_preset_requests():
    with pytest.raises(ValueError, match="unknown camera preset.*spin.*choose from static, pan_left"):
        preset_camera("dolly_in+spin")
    with pytest.raises(ValueError, match="empty camera preset"):
        preset_camera(" + ")
    with pytest.raises(ValueError, match="speed must be a finite number >= 0"):
        preset_camera("pan_left", speed=-1)
    with pytest.raises(ValueError, match="frames must be a positive integer"):
        preset_camera("pan_left", frames=0)
    with pytest.raises(ValueError, match="fx, fy > 0"):
        preset_camera("pan_left", intrinsics=(0, 500, 416, 240))


def test_presets_drive_the_conditioner():
    dolly = camera_condition(*preset_camera("dolly_in", frames=81), 32, 48, 81)
    rel = dolly.relative_poses
    assert rel[:, :2, 3].abs().max() < 1e-6 and torch.allclose(rel[1:, 2, 3], torch.ones(20), atol=1e-6)
    static = camera_condition(*preset_camera("static", frames=81), 32, 48, 81)
    zoom = preset_camera("zoom_in", frames=81)
    first_only = camera_condition(*zoom, 32, 48, 81)
    assert torch.equal(first_only.plucker, static.plucker) and "first frame" in first_only.message
    per_frame = camera_condition(*zoom, 32, 48, 81, per_frame_intrinsics=True)
    assert not torch.equal(per_frame.plucker, static.plucker)
