"""Camera geometry invariants and the 384/1536-channel packing (spec §3, §4)."""
import numpy as np
import pytest
import torch
from einops import rearrange
from scipy.spatial.transform import Rotation, Slerp

from lingbot_world.wan.control.camera import (
    CAMERA_CHANNELS,
    CameraInputError,
    camera_condition,
    latent_targets,
    pack_plucker,
    packed_plucker,
    plucker_rays,
    relative_poses,
    resample_poses,
    scale_intrinsics,
    usable_frames,
)

K_EXAMPLE = np.array([502.9116, 503.10812, 415.77786, 239.77779], dtype=np.float32)


def rigid(rot: np.ndarray, t) -> np.ndarray:
    m = np.eye(4)
    m[:3, :3] = rot
    m[:3, 3] = t
    return m


def smooth_trajectory(n: int, seed: int = 0, dtype=np.float32) -> np.ndarray:
    """A wandering camera: smoothly varying rotation and translation, far from the origin."""
    rng = np.random.default_rng(seed)
    s = np.linspace(0, 1, n)[:, None]
    rotvecs = rng.normal(size=(1, 3)) + s * rng.normal(size=(1, 3)) + 0.3 * np.sin(6 * s) * rng.normal(size=(1, 3))
    trans = 50 * rng.normal(size=(1, 3)) + s**2 * rng.normal(size=(1, 3)) * 5
    rots = Rotation.from_rotvec(rotvecs).as_matrix()
    return np.stack([rigid(r, t) for r, t in zip(rots, trans)]).astype(dtype)


def intr(n: int) -> np.ndarray:
    return np.tile(K_EXAMPLE, (n, 1))


# ---- rotations and resampling -----------------------------------------------------------------------------


def test_resample_keeps_short_arcs_when_quaternion_signs_flip():
    # Rotations 10 degrees apart around y whose matrices give quaternions of alternating sign in scipy's
    # convention would slerp the long way round without the sign fix; the midpoint must be 5 degrees.
    rots = Rotation.from_rotvec(np.radians([[0, 0, 0], [0, 10, 0], [0, 200, 0], [0, 210, 0]]))
    poses = np.stack([rigid(r, [0, 0, 0]) for r in rots.as_matrix()])
    mid = resample_poses(poses, np.array([0.5, 2.5]))
    angles = Rotation.from_matrix(mid[:, :3, :3].numpy()).as_rotvec()
    assert np.allclose(np.degrees(angles[0]), [0, 5, 0], atol=1e-9)
    assert np.allclose(np.degrees(Rotation.from_matrix(mid[1, :3, :3].numpy()).magnitude()), 155, atol=1e-9)


def test_resample_at_integer_targets_returns_the_inputs_and_matches_scipy_between():
    poses = torch.from_numpy(smooth_trajectory(33, dtype=np.float64))  # exactly orthonormal
    same = resample_poses(poses, latent_targets(33))
    assert torch.allclose(same, poses[::4], atol=1e-12)
    targets = torch.tensor([0.0, 2.5, 7.25, 31.9, 32.0], dtype=torch.float64)
    got = resample_poses(poses, targets).numpy()
    p = poses.numpy()
    ref_rot = Slerp(np.arange(33), Rotation.from_matrix(p[:, :3, :3]))(targets.numpy()).as_matrix()
    ref_t = np.stack([np.interp(targets.numpy(), np.arange(33), p[:, i, 3]) for i in range(3)], axis=1)
    assert np.abs(got[:, :3, :3] - ref_rot).max() < 1e-12
    assert np.abs(got[:, :3, 3] - ref_t).max() < 1e-12
    assert torch.equal(resample_poses(poses, targets)[:, 3], torch.tensor([0.0, 0, 0, 1]).expand(5, 4).double())


# ---- relative poses and Plücker invariants ------------------------------------------------------------------


def test_static_trajectory_gives_identity_poses_and_a_constant_field():
    pose = smooth_trajectory(1)[0]
    cond = camera_condition(np.repeat(pose[None], 81, 0), intr(81), 64, 112, 81)
    eye = torch.eye(4).expand(21, 4, 4)
    assert torch.allclose(cond.relative_poses, eye, atol=1e-6)
    p = cond.plucker
    assert torch.allclose(p, p[:, :, :1].expand_as(p), atol=1e-6)
    assert torch.all(p[:, :192] == 0)  # origin channels: the camera never moves


def test_directions_are_unit_and_origins_are_camera_centres():
    poses = smooth_trajectory(41, seed=5)
    cond = camera_condition(poses, intr(41), 48, 80, 41, precision="float64")
    field = rearrange(cond.plucker[0], "(c py px) f lh lw -> f (lh py) (lw px) c", c=6, py=8, px=8)
    norms = field[..., 3:].norm(dim=-1)
    assert (norms - 1).abs().max() < 1e-6
    # origin = the relative camera centre of that latent frame, the same at every pixel
    centres = cond.relative_poses[:, :3, 3]
    assert torch.equal(field[..., :3], centres[:, None, None, :].expand(-1, 48, 80, -1))
    # and that centre is camera f's position in camera f-1's axes, divided by the largest such step
    c2w = poses[::4].astype(np.float64)
    steps = np.stack([np.linalg.inv(c2w[i - 1]) @ c2w[i] for i in range(1, len(c2w))])[:, :3, 3]
    steps /= np.linalg.norm(steps, axis=1).max()
    assert np.abs(centres[1:].numpy() - steps).max() < 1e-6
    assert torch.equal(centres[0], torch.zeros(3))


def test_pure_forward_move_has_only_z_translation():
    rot = Rotation.from_euler("xyz", [20, -130, 7], degrees=True).as_matrix()
    forward = rot[:, 2]  # camera z axis in world coordinates
    poses = np.stack([rigid(rot, [10, -3, 4] + 0.37 * i * forward) for i in range(81)]).astype(np.float32)
    rel = relative_poses(torch.from_numpy(poses[::4]), precision="float64")
    assert torch.allclose(rel[:, :3, :3], torch.eye(3, dtype=torch.float64).expand(21, 3, 3), atol=1e-6)
    assert rel[:, :2, 3].abs().max() < 1e-5
    assert torch.allclose(rel[1:, 2, 3], torch.ones(20, dtype=torch.float64), atol=1e-5)


def test_translation_normalised_by_the_largest_step():
    # accelerate: steps grow, so only the last one has unit length
    poses = np.stack([rigid(np.eye(3), [0.0, 0.0, 0.01 * i * i]) for i in range(21)])
    rel = relative_poses(torch.from_numpy(poses), precision="float64")
    lengths = rel[:, :3, 3].norm(dim=-1)
    assert lengths.max() == pytest.approx(1.0) and lengths.argmax() == 20
    assert lengths[1] == pytest.approx(1 / 39)  # (1^2 - 0^2) / (20^2 - 19^2)


def test_scaled_intrinsics_match_spec_worked_values():
    k = scale_intrinsics(K_EXAMPLE[None], 464, 832)[0]
    assert torch.allclose(k, torch.tensor([502.9116, 486.33786, 415.77786, 231.78519], dtype=torch.float64), atol=1e-4)


# ---- frame-count rule ---------------------------------------------------------------------------------------


def test_frame_count_rule():
    assert usable_frames(961, 81) == (81, None)
    frames, msg = usable_frames(561, 961)
    assert frames == 561 and "561" in msg and "961" in msg
    assert usable_frames(30, 81)[0] == 29
    assert usable_frames(1, 1) == (1, None)
    assert usable_frames(5, 5) == (5, None)
    with pytest.raises(CameraInputError, match="at least 5 poses"):
        usable_frames(4, 81)
    with pytest.raises(ValueError, match="4n\\+1"):
        usable_frames(100, 80)


def test_condition_reduces_frames_and_says_so():
    poses = smooth_trajectory(30)
    cond = camera_condition(poses, intr(30), 32, 48, 81)
    assert cond.frames == 29 and cond.plucker.shape == (1, 384, 8, 4, 6)
    assert "29 frames" in cond.message and "81" in cond.message
    assert cond.poses.shape == (29, 4, 4) and cond.intrinsics.shape == (29, 4)
    assert camera_condition(poses, intr(30), 32, 48, 29).message is None


def test_too_few_poses_for_one_latent_step():
    with pytest.raises(CameraInputError, match="3 camera pose.*at least 5"):
        camera_condition(smooth_trajectory(3), intr(3), 32, 48, 81)
    one = camera_condition(smooth_trajectory(3), intr(3), 32, 48, 1)  # a single frame needs one pose
    assert one.frames == 1 and one.plucker.shape == (1, 384, 1, 4, 6)


def test_condition_rejects_sizes_that_do_not_patchify():
    with pytest.raises(ValueError, match="multiples of 16"):
        camera_condition(smooth_trajectory(5), intr(5), 40, 48, 5)


# ---- packing ------------------------------------------------------------------------------------------------


def test_packing_lands_at_the_spec_channel_index_after_dit_patchify():
    f_lat, h, w = 3, 32, 48
    lat_h, lat_w = h // 8, w // 8
    # a distinct, exactly representable value for every (frame, row, col, channel)
    field = torch.arange(f_lat * h * w * 6, dtype=torch.float32).reshape(f_lat, h, w, 6)
    packed = pack_plucker(field)
    assert packed.shape == (1, CAMERA_CHANNELS, f_lat, lat_h, lat_w)
    # the DiT's patchify (wan/dit/model.py camera_tokens)
    tokens = rearrange(packed, "b c f (h q) (w r) -> b (f h w) (c q r)", q=2, r=2)
    assert tokens.shape == (1, f_lat * (lat_h // 2) * (lat_w // 2), 1536)
    for f, hp, wp in [(0, 0, 0), (1, 1, 2), (2, 1, 0), (2, 0, 2)]:
        token = (f * (lat_h // 2) + hp) * (lat_w // 2) + wp
        for c6 in range(6):
            for py in range(8):
                for px in range(8):
                    for qy in range(2):
                        for qx in range(2):
                            k = ((c6 * 64 + py * 8 + px) * 4) + qy * 2 + qx  # spec §3
                            row, col = (2 * hp + qy) * 8 + py, (2 * wp + qx) * 8 + px
                            assert tokens[0, token, k] == field[f, row, col, c6]


def test_streamed_packing_equals_pack_of_full_field_with_per_frame_intrinsics():
    rel = relative_poses(torch.from_numpy(smooth_trajectory(6, seed=2)))
    ks = scale_intrinsics(np.array([[500, 480, 400, 250], [520, 500, 410, 240]] * 3, dtype=np.float64), 48, 64)
    full = pack_plucker(plucker_rays(rel, ks, 48, 64))
    assert torch.allclose(packed_plucker(rel, ks, 48, 64), full, atol=2e-7)
    assert torch.allclose(packed_plucker(rel, ks[0], 48, 64), pack_plucker(plucker_rays(rel, ks[0], 48, 64)), atol=2e-7)


def test_per_frame_intrinsics_follow_a_zoom():
    n = 21
    k = intr(n).astype(np.float64)
    k[:, :2] *= np.linspace(1, 1.5, n)[:, None]
    poses = np.repeat(np.eye(4, dtype=np.float32)[None], n, 0)
    first = camera_condition(poses, k.astype(np.float32), 32, 48, n)
    per = camera_condition(poses, k.astype(np.float32), 32, 48, n, per_frame_intrinsics=True)
    assert "first frame" in first.message and per.message is None
    assert torch.allclose(first.plucker, first.plucker[:, :, :1].expand_as(first.plucker), atol=1e-7)
    assert torch.allclose(per.scaled_intrinsics[-1, 0], torch.tensor(502.9116 * 1.5 * 48 / 832), rtol=1e-6)
    # zooming in narrows the rays: the corner ray leans less away from the axis at the end
    corner = lambda cond, f: cond.plucker[0, 3 * 64, f, 0, 0].abs()  # d_x of pixel (0, 0)
    assert corner(per, -1) < corner(per, 0) and torch.equal(per.plucker[:, :, 0], first.plucker[:, :, 0])
