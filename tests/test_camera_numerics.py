"""Camera numerics like the reference: float32 relative/framewise products in its operation order (fast-act §8).

The reference (cam_utils at 9660e94) resamples with scipy in float64, casts the poses to float32
(`torch.from_numpy(poses).float()`), then multiplies in float32: SE3 inverse of frame 0 times every pose, frame 0
set to I, framewise `bmm(inverse(rel[:-1]), rel[1:])`, translations divided by the largest norm, and builds the
rays in float32. `reference_float32` below writes those formulas out independently, in that order; the library's
default must reproduce them on the shipped examples, while its float64 option gives the exact geometry.
"""
import numpy as np
import pytest
import torch
from scipy.interpolate import interp1d
from scipy.spatial.transform import Rotation, Slerp

from lingbot_world.loaders.camera_files import load_camera_folder
from lingbot_world.wan.control.camera import CameraInputError, camera_condition

EXAMPLES = ("00", "01", "02", "03", "05")


def _se3_inverse(t: torch.Tensor) -> torch.Tensor:
    r_inv = t[:, :3, :3].transpose(-1, -2)
    out = torch.eye(4, dtype=t.dtype)[None].repeat(t.shape[0], 1, 1)
    out[:, :3, :3] = r_inv
    out[:, :3, 3:] = -torch.bmm(r_inv, t[:, :3, 3:])
    return out


def reference_relative(c2ws: np.ndarray, targets: np.ndarray) -> torch.Tensor:
    """Resample (scipy, float64) -> float32 -> relative, framewise, normalised, in the reference's order."""
    n = len(c2ws)
    src = np.linspace(0, n - 1, n)
    trans = interp1d(src, c2ws[:, :3, 3], axis=0, kind="linear", bounds_error=False, fill_value="extrapolate")(targets)
    quats = Rotation.from_matrix(c2ws[:, :3, :3]).as_quat().copy()
    for i in range(1, n):
        if np.dot(quats[i], quats[i - 1]) < 0:
            quats[i] = -quats[i]
    rots = Slerp(src, Rotation.from_quat(quats))(targets).as_matrix()
    poses = np.zeros((len(targets), 4, 4))
    poses[:, :3, :3], poses[:, :3, 3], poses[:, 3, 3] = rots, trans, 1.0
    c = torch.from_numpy(poses).float()
    rel = torch.matmul(_se3_inverse(c[0:1]), c)
    rel[0] = torch.eye(4)
    rel[1:] = torch.bmm(_se3_inverse(rel[:-1]), rel[1:])
    t = rel[:, :3, 3]
    largest = torch.norm(t, dim=-1).max()
    if largest > 0:
        rel[:, :3, 3] = t / largest
    return rel


def reference_plucker(rel: torch.Tensor, k: np.ndarray, h: int, w: int) -> torch.Tensor:
    """[o, d] per pixel in float32 (first-frame intrinsics at h x w), packed c6*64 + py*8 + px."""
    kk = torch.from_numpy(k[:1].astype(np.float32)).repeat(rel.shape[0], 1)
    fx, fy, cx, cy = (kk[:, i:i + 1] * s for i, s in enumerate((w / 832, h / 480, w / 832, h / 480)))
    gy, gx = torch.meshgrid(torch.arange(h, dtype=torch.float32), torch.arange(w, dtype=torch.float32), indexing="ij")
    u, v = gx.reshape(1, -1) + 0.5, gy.reshape(1, -1) + 0.5
    d = torch.stack([(u - cx) / fx, (v - cy) / fy, torch.ones(rel.shape[0], h * w)], dim=-1)
    d = d / d.norm(dim=-1, keepdim=True)
    rays_d = d @ rel[:, :3, :3].transpose(-1, -2)
    rays_o = rel[:, None, :3, 3].expand_as(rays_d)
    field = torch.cat([rays_o, rays_d], -1).view(rel.shape[0], h // 8, 8, w // 8, 8, 6)
    return field.permute(5, 2, 4, 0, 1, 3).reshape(1, 384, rel.shape[0], h // 8, w // 8)


@pytest.fixture(scope="module")
def examples(examples_dir):
    return {name: load_camera_folder(examples_dir / name) for name in EXAMPLES}


@pytest.mark.parametrize("frames", [17, 81])
@pytest.mark.parametrize("name", EXAMPLES)
def test_float32_default_reproduces_the_reference_arithmetic(examples, name, frames):
    cam = examples[name]
    ref_rel = reference_relative(cam.poses[:frames], np.linspace(0, frames - 1, (frames - 1) // 4 + 1))
    got = camera_condition(cam.poses, cam.intrinsics, 48, 80, frames)
    assert got.precision == "float32"
    rel_err = (got.relative_poses - ref_rel).abs().max().item()
    ray_err = (got.plucker - reference_plucker(ref_rel, cam.intrinsics, 48, 80)).abs().max().item()
    print(f"example {name}, {frames} frames: relative poses {rel_err:.3g}, Plücker {ray_err:.3g}")
    assert rel_err <= 1e-7  # the same float32 operations: identical up to an ulp
    assert ray_err <= 1e-6  # directions: float64 rounded to float32 vs float32 arithmetic


def test_float64_option_is_exact_and_differs_from_the_reference_on_short_clips(examples):
    worst = 0.0
    for name in EXAMPLES:
        cam = examples[name]
        f32 = camera_condition(cam.poses, cam.intrinsics, 48, 80, 17)
        f64 = camera_condition(cam.poses, cam.intrinsics, 48, 80, 17, precision="float64")
        assert f64.precision == "float64"
        # exact maths: inv(c2w_{i-1}) c2w_i of the float32 input in float64, normalised
        c = cam.poses[:17:4].astype(np.float64)
        steps = np.stack([np.linalg.inv(c[i - 1]) @ c[i] for i in range(1, len(c))])[:, :3, 3]
        steps /= np.linalg.norm(steps, axis=1).max()
        assert np.abs(f64.relative_poses[1:, :3, 3].numpy() - steps).max() < 1e-6
        worst = max(worst, (f32.relative_poses - f64.relative_poses).abs().max().item())
    print(f"largest float32 - float64 difference on 17-frame clips: {worst:.3g}")
    # far from the world origin float32 cancellation is visible: the reason the reference's arithmetic is default
    assert worst > 1e-3


def test_unknown_precision_is_refused(examples):
    cam = examples["00"]
    with pytest.raises(CameraInputError, match="float16.*float32, float64"):
        camera_condition(cam.poses, cam.intrinsics, 48, 80, 17, precision="float16")
