"""Checks of a camera input: poses and intrinsics validated, and the frame count they cover (steps 1-2 of camera.py).

`check_camera` validates a pose / intrinsics pair (shapes, finiteness, orthonormal rotations, positive focal
lengths) and its errors name the file and the fix; `usable_frames` applies the ((N-1)//4)*4+1 frame-count rule
(spec §4.1). Poses are OpenCV camera-to-world matrices (x right, y down, z forward); intrinsics are (fx, fy, cx, cy)
of a 480x832 frame.
"""
from __future__ import annotations

import warnings
from typing import NamedTuple, Optional, Union

import numpy as np
import torch

from ..sizes import VAE_TEMPORAL_STRIDE, check_frames

ArrayLike = Union[np.ndarray, torch.Tensor]

# The reference assumes every intrinsics.npy is calibrated for a 480x832 (H x W) frame (spec §4.4).
INTRINSICS_HEIGHT = 480
INTRINSICS_WIDTH = 832

# max |R^T R - I| of a pose's rotation: above WARN it is re-orthonormalised (SVD) with a warning,
# above REFUSE the matrix is not a rotation that lost some precision but a different kind of matrix.
ORTHONORMAL_WARN_TOL = 1e-4
ORTHONORMAL_REFUSE_TOL = 1e-1
BOTTOM_ROW_TOL = 1e-5


class CameraInputError(ValueError):
    """Camera poses or intrinsics that cannot be used; the message names the source and the fix."""


class CameraPath(NamedTuple):
    """A camera trajectory as poses.npy / intrinsics.npy hold it."""

    poses: np.ndarray  # [N, 4, 4] float32, OpenCV camera-to-world
    intrinsics: np.ndarray  # [N, 4] float32, (fx, fy, cx, cy) in pixels of a 480x832 frame


# ---- validation ------------------------------------------------------------------------------------------


def _as_numpy(a: object, name: str) -> np.ndarray:
    if isinstance(a, torch.Tensor):
        a = a.detach().cpu().numpy()
    if not isinstance(a, np.ndarray):
        raise CameraInputError(f"{name}: expected a numpy array or torch tensor, got {type(a).__name__}")
    if a.dtype.kind != "f":
        raise CameraInputError(
            f"{name}: dtype {a.dtype} is not floating point; save it as float32 (array.astype(np.float32))"
        )
    return a


def _first_bad_rows(mask: np.ndarray, limit: int = 5) -> str:
    rows = np.flatnonzero(mask)
    shown = ", ".join(str(int(r)) for r in rows[:limit])
    return shown + (f", ... ({len(rows)} in all)" if len(rows) > limit else "")


def check_poses(poses: ArrayLike, name: str = "poses", dtype: Optional[type] = np.float32) -> np.ndarray:
    """Validate [N,4,4] camera-to-world poses; return them as `dtype`, rotations re-orthonormalised if needed.

    dtype=None keeps float64 input in float64 (key-built paths, whose exact values the reference resamples)
    and returns anything else as float32.
    Raises CameraInputError naming `name` for a wrong shape or dtype, NaN/inf, a bottom row other than
    (0,0,0,1), or a 3x3 block that is far from a rotation (|R^T R - I| > 0.1 or det <= 0). Rotations
    off by more than 1e-4 (but less than 0.1) are projected onto the nearest rotation with a warning.
    """
    p = _as_numpy(poses, name)
    given = p.dtype
    if p.ndim != 3 or p.shape[1:] != (4, 4) or p.shape[0] < 1:
        raise CameraInputError(
            f"{name}: shape {tuple(p.shape)} is not [N, 4, 4] camera-to-world matrices (N >= 1)"
        )
    p = p.astype(np.float64)
    finite = np.isfinite(p).all(axis=(1, 2))
    if not finite.all():
        raise CameraInputError(f"{name}: NaN or inf in pose(s) {_first_bad_rows(~finite)}")
    bottom_ok = (np.abs(p[:, 3] - np.array([0.0, 0.0, 0.0, 1.0])) <= BOTTOM_ROW_TOL).all(axis=1)
    if not bottom_ok.all():
        raise CameraInputError(
            f"{name}: bottom row of pose(s) {_first_bad_rows(~bottom_ok)} is not (0, 0, 0, 1); "
            "poses must be 4x4 rigid camera-to-world matrices"
        )
    rot = p[:, :3, :3]
    err = np.abs(np.einsum("nji,njk->nik", rot, rot) - np.eye(3)).max(axis=(1, 2))
    det = np.linalg.det(rot)
    bad = (err > ORTHONORMAL_REFUSE_TOL) | (det <= 0)
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        raise CameraInputError(
            f"{name}: the 3x3 rotation of pose(s) {_first_bad_rows(bad)} is not a rotation "
            f"(pose {i}: max |R^T R - I| = {err[i]:.3g}, det = {det[i]:.3g}; tolerance {ORTHONORMAL_REFUSE_TOL}); "
            "check that the file holds camera-to-world matrices without scale or mirroring"
        )
    drift = err > ORTHONORMAL_WARN_TOL
    if drift.any():
        warnings.warn(
            f"{name}: rotation(s) of pose(s) {_first_bad_rows(drift)} are not orthonormal "
            f"(max |R^T R - I| = {err.max():.3g} > {ORTHONORMAL_WARN_TOL}); using the nearest rotations",
            stacklevel=2,
        )
        u, _, vt = np.linalg.svd(rot[drift])
        p[drift, :3, :3] = u @ vt  # det > 0 was checked, so this is a proper rotation
    p[:, 3] = (0.0, 0.0, 0.0, 1.0)
    if dtype is None:
        dtype = np.float64 if given == np.float64 else np.float32
    return p.astype(dtype)


def check_intrinsics(intrinsics: ArrayLike, num_poses: Optional[int] = None, name: str = "intrinsics") -> np.ndarray:
    """Validate [N,4] (fx, fy, cx, cy) intrinsics of a 480x832 frame; return them as float32."""
    k = _as_numpy(intrinsics, name)
    if k.ndim != 2 or k.shape[1] != 4 or k.shape[0] < 1:
        raise CameraInputError(f"{name}: shape {tuple(k.shape)} is not [N, 4] rows of (fx, fy, cx, cy)")
    finite = np.isfinite(k).all(axis=1)
    if not finite.all():
        raise CameraInputError(f"{name}: NaN or inf in row(s) {_first_bad_rows(~finite)}")
    focal_ok = (k[:, 0] > 0) & (k[:, 1] > 0)
    if not focal_ok.all():
        raise CameraInputError(
            f"{name}: focal length fx or fy <= 0 in row(s) {_first_bad_rows(~focal_ok)}; "
            "focal lengths are in pixels of a 480x832 frame (about 500 for the shipped examples)"
        )
    if num_poses is not None and k.shape[0] != num_poses:
        raise CameraInputError(
            f"{name}: {k.shape[0]} rows but there are {num_poses} poses; give one (fx, fy, cx, cy) row per pose"
        )
    return k.astype(np.float32)


def check_camera(
    poses: ArrayLike, intrinsics: ArrayLike, poses_name: str = "poses", intrinsics_name: str = "intrinsics",
    pose_dtype: Optional[type] = np.float32,
) -> CameraPath:
    """Validate a pose/intrinsics pair (see check_poses / check_intrinsics)."""
    p = check_poses(poses, poses_name, pose_dtype)
    return CameraPath(p, check_intrinsics(intrinsics, p.shape[0], intrinsics_name))


# ---- frame count -----------------------------------------------------------------------------------------


def usable_frames(num_poses: int, frames: int) -> tuple[int, Optional[str]]:
    """Frame count the poses allow for a 4n+1 request, and a note when it had to be reduced (spec §4.1).

    N poses cover ((N-1)//4)*4+1 frames. A request for more than one frame needs at least 5 poses (one
    latent step); with fewer the trajectory cannot move the camera and we refuse rather than silently
    generating a single still frame.
    """
    check_frames(frames)
    if num_poses < 1:
        raise CameraInputError("no camera poses given")
    if frames > 1 and num_poses < VAE_TEMPORAL_STRIDE + 1:
        raise CameraInputError(
            f"{num_poses} camera pose(s) cover less than one latent step; a {frames}-frame video needs at "
            f"least {VAE_TEMPORAL_STRIDE + 1} poses (ideally {frames}, one per frame)"
        )
    covered = ((num_poses - 1) // VAE_TEMPORAL_STRIDE) * VAE_TEMPORAL_STRIDE + 1
    if frames <= covered:
        return frames, None
    return covered, (
        f"The camera trajectory has {num_poses} poses, enough for {covered} frames; "
        f"generating {covered} frames instead of the requested {frames}."
    )

