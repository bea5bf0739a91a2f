"""Camera poses resampled to latent frames and made framewise relative (spec §4.2, §4.3): steps 3-4 of camera.py.

Precision of step 4 (`precision=`): the reference casts the resampled poses to float32 and multiplies them in
float32. Far from the world origin (example 02 sits ~2,500 units out) that float32 arithmetic loses much of a
small per-step move to cancellation, and the normalisation by the largest step then scales that noise up: on
the shipped examples the exact (float64) result differs from the reference's by up to 5e-2 on 17-frame clips.
The model was trained and is run by the release on the float32 values, so "float32" (the default) reproduces
them operation for operation; "float64" gives the exact geometry, for poses whose float32 noise you do not
want (e.g. your own trajectories with large world offsets and tiny moves).
"""
from __future__ import annotations

from typing import Optional

import numpy as np
import torch

from ..sizes import VAE_TEMPORAL_STRIDE
from .camera_input import ArrayLike, CameraInputError

# Arithmetic of the relative-pose step: the reference's float32 (default) or exact float64 (see the docstring).
POSE_PRECISIONS = ("float32", "float64")
DEFAULT_POSE_PRECISION = "float32"


def check_precision(precision: str) -> torch.dtype:
    """The torch dtype of a pose precision name ('float32' | 'float64')."""
    if precision not in POSE_PRECISIONS:
        raise CameraInputError(f"pose precision {precision!r}: choose one of {', '.join(POSE_PRECISIONS)}")
    return torch.float32 if precision == "float32" else torch.float64


def latent_targets(num_frames: int, includes_end_pose: bool = False, count: Optional[int] = None) -> torch.Tensor:
    """Source-pose positions of the latent frames, float64 (spec §4.2; fast-act spec §2, §7).

    Per-frame poses (L = num_frames of them): linspace(0, L-1, (L-1)//4 + 1), i.e. 0, 4, 8, ...
    A path with an end pose (num_frames + 1 poses, built from keys): linspace(0, num_frames, (num_frames-1)//4 + 1),
    non-integer positions. count: resample at that many latent frames instead (the Fast model keeps a multiple of
    its chunk size, so the targets are not integers and the path is slightly time-compressed, fast-act spec §2).
    numpy's linspace, as the reference, so that the targets are bit-identical.
    """
    if count is None:
        count = (num_frames - 1) // VAE_TEMPORAL_STRIDE + 1
    if count < 1:
        raise ValueError(f"need at least one latent frame, got {count}")
    last = num_frames if includes_end_pose else num_frames - 1
    return torch.from_numpy(np.linspace(0, last, count))


def resample_poses(c2ws: ArrayLike, targets: ArrayLike) -> torch.Tensor:
    """Poses [L, 4, 4] at fractional pose positions `targets` [F] in [0, L-1] -> [F, 4, 4] float64.

    The reference's resampling, through the same scipy calls on the same inputs (so the results are
    bit-identical to it): translation by linear interpolation, rotation by quaternion slerp after flipping
    each quaternion into the hemisphere of the previous one (short arcs). The input keeps its dtype (float32
    for poses.npy, float64 for key-built paths), as in the reference.
    """
    from scipy.interpolate import interp1d
    from scipy.spatial.transform import Rotation, Slerp

    c = c2ws.detach().cpu().numpy() if isinstance(c2ws, torch.Tensor) else np.asarray(c2ws)
    tgt = targets.detach().cpu().numpy() if isinstance(targets, torch.Tensor) else np.asarray(targets)
    tgt = tgt.astype(np.float64)
    n = c.shape[0]
    if tgt.size and (tgt.min() < 0 or tgt.max() > n - 1):
        raise ValueError(f"resample targets must lie in [0, {n - 1}], got {tgt.min():.3f}..{tgt.max():.3f}")
    out = np.zeros((tgt.shape[0], 4, 4))
    out[:, 3, 3] = 1.0
    if n == 1:
        out[:, :3] = c[0, :3]
        return torch.from_numpy(out)
    src = np.linspace(0, n - 1, n)
    out[:, :3, 3] = interp1d(src, c[:, :3, 3], axis=0, kind="linear", bounds_error=False,
                             fill_value="extrapolate")(tgt)
    quats = Rotation.from_matrix(c[:, :3, :3]).as_quat().copy()
    for i in range(1, n):  # q and -q are one rotation: keep neighbours in one hemisphere
        if np.dot(quats[i], quats[i - 1]) < 0:
            quats[i] = -quats[i]
    out[:, :3, :3] = Slerp(src, Rotation.from_quat(quats))(tgt).as_matrix()
    return torch.from_numpy(out)


def invert_rigid(poses: torch.Tensor) -> torch.Tensor:
    """SE(3) inverse [R^T | -R^T t] of [..., 4, 4] rigid transforms."""
    rt = poses[..., :3, :3].transpose(-1, -2)
    inv = torch.zeros_like(poses)
    inv[..., :3, :3] = rt
    inv[..., :3, 3] = -(rt @ poses[..., :3, 3:]).squeeze(-1)
    inv[..., 3, 3] = 1
    return inv


def relative_poses(c2ws: torch.Tensor, precision: str = DEFAULT_POSE_PRECISION) -> torch.Tensor:
    """Framewise relative poses [F, 4, 4] with normalised translation (spec §4.3), in `precision`.

    rel_i = inv(c2w_0) c2w_i (frame 0 := I), then rel_i <- inv(rel_{i-1}) rel_i for i >= 1, i.e. the pose
    of frame i in the camera of frame i-1. Translations are divided by the largest translation norm
    (when it is > 0), so the biggest step has length 1; rotations are untouched. The products run in the
    reference's order; "float32" reproduces its arithmetic (see the module docstring), "float64" is exact.
    """
    c2ws = torch.as_tensor(c2ws).to(check_precision(precision))
    rel = invert_rigid(c2ws[:1]) @ c2ws
    rel[0] = torch.eye(4, dtype=c2ws.dtype)
    step = rel.clone()
    step[1:] = invert_rigid(rel[:-1]) @ rel[1:]
    largest = step[:, :3, 3].norm(dim=-1).max()
    if largest > 0:
        step[:, :3, 3] = step[:, :3, 3] / largest
    return step
