"""Camera conditioning of LingBot-World: camera poses + intrinsics -> packed Plücker tensor (spec §3, §4).

Pipeline (one call: `camera_condition`):
  1. validate the arrays (shapes, finiteness, orthonormal rotations, positive focal lengths);
  2. frame-count rule: ((N-1)//4)*4+1 usable frames, the request is clipped to it (§4.1);
  3. resample the kept poses to one pose per latent frame (linear translation, quaternion slerp, §4.2);
  4. framewise relative poses with the translation divided by the largest step (§4.3);
  5. first-frame intrinsics rescaled from the 480x832 calibration frame to the output size (§4.4; optionally
     per latent frame, as later reference revisions do);
  6. per-pixel rays [o, d] with pixel centres at +0.5 (§4.5), packed to [1, 384, F_lat, lat_h, lat_w]
     with channel c = c6*64 + py*8 + px (the DiT's 2x2 patchify then gives the 1536 order of §3).

Poses are OpenCV camera-to-world matrices (x right, y down, z forward). The pose maths (a few dozen 4x4
matrices) runs in float64 so that scenes with large world offsets (example 01 sits ~5,700 units from the
origin) keep their small per-step moves; the per-pixel field is float32. The reference casts the resampled
poses to float32 before the relative-pose step, so its origins carry cancellation noise (up to ~4e-4 on the
shipped examples, ~6e-6 on example 00's worked values); ours follow the exact maths instead.
"""
from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import NamedTuple, Optional, Union

import numpy as np
import torch
from einops import rearrange

from ..sizes import VAE_STRIDE, VAE_TEMPORAL_STRIDE, check_frames, latent_size

ArrayLike = Union[np.ndarray, torch.Tensor]

# The reference assumes every intrinsics.npy is calibrated for a 480x832 (H x W) frame (spec §4.4).
INTRINSICS_HEIGHT = 480
INTRINSICS_WIDTH = 832
PLUCKER_CHANNELS = 6  # o_x, o_y, o_z, d_x, d_y, d_z
CAMERA_CHANNELS = PLUCKER_CHANNELS * VAE_STRIDE * VAE_STRIDE  # 384

# max |R^T R - I| of a pose's rotation: above WARN it is re-orthonormalised (SVD) with a warning,
# above REFUSE the matrix is not a rotation that lost some precision but a different kind of matrix.
ORTHONORMAL_WARN_TOL = 1e-4
ORTHONORMAL_REFUSE_TOL = 1e-1
BOTTOM_ROW_TOL = 1e-5
# Relative change of fx/fy over the used frames above which we tell the user that zoom is ignored.
ZOOM_NOTE_TOL = 1e-3


class CameraInputError(ValueError):
    """Camera poses or intrinsics that cannot be used; the message names the source and the fix."""


class CameraPath(NamedTuple):
    """A camera trajectory as poses.npy / intrinsics.npy hold it."""

    poses: np.ndarray  # [N, 4, 4] float32, OpenCV camera-to-world
    intrinsics: np.ndarray  # [N, 4] float32, (fx, fy, cx, cy) in pixels of a 480x832 frame


@dataclass
class CameraCondition:
    """Everything the sampler and the UI need from one camera input."""

    plucker: torch.Tensor  # [1, 384, F_lat, lat_h, lat_w] float32, CPU
    frames: int  # frame count to generate (the request, possibly reduced to what the poses cover)
    message: Optional[str]  # human note when something was changed or ignored, else None
    poses: torch.Tensor  # [frames, 4, 4] float32: the input poses actually used
    intrinsics: torch.Tensor  # [frames, 4] float32: the input intrinsics actually used (480x832 pixels)
    latent_poses: torch.Tensor  # [F_lat, 4, 4] float32: poses resampled to latent frames (absolute)
    relative_poses: torch.Tensor  # [F_lat, 4, 4] float32: framewise relative, translation normalised
    scaled_intrinsics: torch.Tensor  # [F_lat, 4] float32: (fx, fy, cx, cy) per latent frame at height x width
    height: int
    width: int

    @property
    def latent_frames(self) -> int:
        return self.plucker.shape[2]


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


def check_poses(poses: ArrayLike, name: str = "poses") -> np.ndarray:
    """Validate [N,4,4] camera-to-world poses; return them as float32, rotations re-orthonormalised if needed.

    Raises CameraInputError naming `name` for a wrong shape or dtype, NaN/inf, a bottom row other than
    (0,0,0,1), or a 3x3 block that is far from a rotation (|R^T R - I| > 0.1 or det <= 0). Rotations
    off by more than 1e-4 (but less than 0.1) are projected onto the nearest rotation with a warning.
    """
    p = _as_numpy(poses, name)
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
    return p.astype(np.float32)


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
    poses: ArrayLike, intrinsics: ArrayLike, poses_name: str = "poses", intrinsics_name: str = "intrinsics"
) -> CameraPath:
    """Validate a pose/intrinsics pair (see check_poses / check_intrinsics)."""
    p = check_poses(poses, poses_name)
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


# ---- rotations -------------------------------------------------------------------------------------------


def quaternion_from_matrix(rot: torch.Tensor) -> torch.Tensor:
    """Rotation matrices [..., 3, 3] -> unit quaternions [..., 4] as (w, x, y, z).

    Shepperd's method: of the four algebraically equal formulas, use the one whose pivot (4 q_i^2) is
    largest, which keeps the division well conditioned for every rotation angle.
    """
    m = rot
    m00, m01, m02 = m[..., 0, 0], m[..., 0, 1], m[..., 0, 2]
    m10, m11, m12 = m[..., 1, 0], m[..., 1, 1], m[..., 1, 2]
    m20, m21, m22 = m[..., 2, 0], m[..., 2, 1], m[..., 2, 2]
    pivots = torch.stack(
        [1 + m00 + m11 + m22, 1 + m00 - m11 - m22, 1 - m00 + m11 - m22, 1 - m00 - m11 + m22], dim=-1
    )
    # Each candidate is 4*q_i*q (unnormalised), built from the pivot component i.
    candidates = torch.stack(
        [
            torch.stack([pivots[..., 0], m21 - m12, m02 - m20, m10 - m01], dim=-1),
            torch.stack([m21 - m12, pivots[..., 1], m01 + m10, m02 + m20], dim=-1),
            torch.stack([m02 - m20, m01 + m10, pivots[..., 2], m12 + m21], dim=-1),
            torch.stack([m10 - m01, m02 + m20, m12 + m21, pivots[..., 3]], dim=-1),
        ],
        dim=-2,
    )
    best = pivots.argmax(dim=-1)
    q = torch.gather(candidates, -2, best[..., None, None].expand(*best.shape, 1, 4)).squeeze(-2)
    return q / q.norm(dim=-1, keepdim=True)


def matrix_from_quaternion(q: torch.Tensor) -> torch.Tensor:
    """Quaternions [..., 4] (w, x, y, z), any norm -> rotation matrices [..., 3, 3]."""
    q = q / q.norm(dim=-1, keepdim=True)
    w, x, y, z = q.unbind(-1)
    rows = [
        1 - 2 * (y * y + z * z), 2 * (x * y - w * z), 2 * (x * z + w * y),
        2 * (x * y + w * z), 1 - 2 * (x * x + z * z), 2 * (y * z - w * x),
        2 * (x * z - w * y), 2 * (y * z + w * x), 1 - 2 * (x * x + y * y),
    ]
    return torch.stack(rows, dim=-1).unflatten(-1, (3, 3))


def continuous_quaternions(q: torch.Tensor) -> torch.Tensor:
    """Flip the sign of each quaternion [N, 4] whose dot product with the previous one is negative.

    q and -q are the same rotation; keeping neighbours in one hemisphere makes slerp take the short way.
    """
    out = q.clone()
    for i in range(1, out.shape[0]):
        if torch.dot(out[i - 1], out[i]) < 0:
            out[i] = -out[i]
    return out


def slerp(q0: torch.Tensor, q1: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
    """Spherical interpolation of unit quaternions [..., 4] at fractions t [...] (0 -> q0, 1 -> q1)."""
    dot = (q0 * q1).sum(-1).clamp(-1.0, 1.0)
    q1 = torch.where(dot[..., None] < 0, -q1, q1)  # short arc
    dot = dot.abs()
    theta = torch.arccos(dot)
    sin_theta = torch.sin(theta)
    t = t[..., None]
    near = sin_theta[..., None] < 1e-8  # (nearly) equal rotations: the linear blend is exact enough
    sin_safe = torch.where(near, torch.ones_like(sin_theta[..., None]), sin_theta[..., None])
    w0 = torch.where(near, 1 - t, torch.sin((1 - t) * theta[..., None]) / sin_safe)
    w1 = torch.where(near, t, torch.sin(t * theta[..., None]) / sin_safe)
    q = w0 * q0 + w1 * q1
    return q / q.norm(dim=-1, keepdim=True)


# ---- pose resampling and relative poses ------------------------------------------------------------------


def latent_targets(num_frames: int, count: Optional[int] = None) -> torch.Tensor:
    """Source-frame positions of the latent frames: linspace(0, L-1, (L-1)//4 + 1) (spec §4.2).

    count: resample at that many latent frames instead (the Fast model keeps a multiple of its chunk size, so the
    targets are not integers and the path is slightly time-compressed, spec Fast §2).
    """
    if count is None:
        count = (num_frames - 1) // VAE_TEMPORAL_STRIDE + 1
    if count < 1:
        raise ValueError(f"need at least one latent frame, got {count}")
    return torch.linspace(0, num_frames - 1, count, dtype=torch.float64)


def resample_poses(c2ws: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Poses [L, 4, 4] at fractional frame positions `targets` [F] in [0, L-1] -> [F, 4, 4] (float64).

    Translation is interpolated linearly, rotation by slerp between hemisphere-aligned quaternions.
    At integer targets the result is the input pose (up to round-off).
    """
    c2ws = c2ws.to(torch.float64)
    targets = targets.to(torch.float64)
    n = c2ws.shape[0]
    if targets.numel() and (targets.min() < 0 or targets.max() > n - 1):
        raise ValueError(f"resample targets must lie in [0, {n - 1}], got {targets.min():.3f}..{targets.max():.3f}")
    out = torch.eye(4, dtype=torch.float64).repeat(targets.shape[0], 1, 1)
    if n == 1:
        out[:, :3] = c2ws[0, :3]
        return out
    lo = targets.floor().long().clamp(0, n - 2)
    frac = targets - lo
    quats = continuous_quaternions(quaternion_from_matrix(c2ws[:, :3, :3]))
    out[:, :3, :3] = matrix_from_quaternion(slerp(quats[lo], quats[lo + 1], frac))
    t0, t1 = c2ws[lo, :3, 3], c2ws[lo + 1, :3, 3]
    out[:, :3, 3] = t0 + frac[:, None] * (t1 - t0)
    return out


def invert_rigid(poses: torch.Tensor) -> torch.Tensor:
    """SE(3) inverse [R^T | -R^T t] of [..., 4, 4] rigid transforms."""
    rt = poses[..., :3, :3].transpose(-1, -2)
    inv = torch.zeros_like(poses)
    inv[..., :3, :3] = rt
    inv[..., :3, 3] = -(rt @ poses[..., :3, 3:]).squeeze(-1)
    inv[..., 3, 3] = 1
    return inv


def relative_poses(c2ws: torch.Tensor) -> torch.Tensor:
    """Framewise relative poses [F, 4, 4] with normalised translation (spec §4.3), float64.

    rel_i = inv(c2w_0) c2w_i (frame 0 := I), then rel_i <- inv(rel_{i-1}) rel_i for i >= 1, i.e. the pose
    of frame i in the camera of frame i-1. Translations are divided by the largest translation norm
    (when it is > 0), so the biggest step has length 1; rotations are untouched.
    """
    c2ws = c2ws.to(torch.float64)
    rel = invert_rigid(c2ws[:1]) @ c2ws
    rel[0] = torch.eye(4, dtype=torch.float64)
    step = rel.clone()
    step[1:] = invert_rigid(rel[:-1]) @ rel[1:]
    largest = step[:, :3, 3].norm(dim=-1).max()
    if largest > 0:
        step[:, :3, 3] = step[:, :3, 3] / largest
    return step


# ---- intrinsics and rays ---------------------------------------------------------------------------------


def scale_intrinsics(intrinsics: ArrayLike, height: int, width: int) -> torch.Tensor:
    """(fx, fy, cx, cy) rows [..., 4] of a 480x832 calibration rescaled to height x width (spec §4.4), float64.

    fx, cx scale with width/832 and fy, cy with height/480; there is no crop offset.
    """
    k = torch.as_tensor(np.asarray(intrinsics), dtype=torch.float64)
    scale = torch.tensor(
        [width / INTRINSICS_WIDTH, height / INTRINSICS_HEIGHT, width / INTRINSICS_WIDTH, height / INTRINSICS_HEIGHT],
        dtype=torch.float64,
    )
    return k * scale


def resample_intrinsics(intrinsics: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Intrinsics [L, 4] linearly interpolated at fractional frame positions `targets` [F] -> [F, 4] (float64)."""
    k = intrinsics.to(torch.float64)
    n = k.shape[0]
    if n == 1:
        return k.expand(targets.shape[0], 4).clone()
    lo = targets.floor().long().clamp(0, n - 2)
    frac = (targets.to(torch.float64) - lo)[:, None]
    return k[lo] + frac * (k[lo + 1] - k[lo])


def camera_directions(intrinsics: torch.Tensor, height: int, width: int) -> torch.Tensor:
    """Unit ray directions [height, width, 3] in camera axes through the pixel centres (col+0.5, row+0.5)."""
    fx, fy, cx, cy = intrinsics.to(torch.float64).tolist()
    u = (torch.arange(width, dtype=torch.float64) + 0.5 - cx) / fx
    v = (torch.arange(height, dtype=torch.float64) + 0.5 - cy) / fy
    d = torch.stack(
        [u.expand(height, width), v[:, None].expand(height, width), torch.ones(height, width, dtype=torch.float64)],
        dim=-1,
    )
    return (d / d.norm(dim=-1, keepdim=True)).to(torch.float32)


def _per_frame(intrinsics: torch.Tensor, frames: int) -> torch.Tensor:
    k = intrinsics.reshape(-1, 4)
    if k.shape[0] == 1:
        return k.expand(frames, 4)
    if k.shape[0] != frames:
        raise ValueError(f"got {k.shape[0]} intrinsics rows for {frames} frames; give one row or one per frame")
    return k


def plucker_rays(rel_poses: torch.Tensor, intrinsics: torch.Tensor, height: int, width: int) -> torch.Tensor:
    """Unpacked embedding [F, height, width, 6] = [o, d] per pixel (spec §4.5), float32.

    rel_poses [F, 4, 4]; intrinsics [4] (shared) or [F, 4] at height x width. o is the frame's (relative)
    camera centre, d = R d_cam the unit ray direction. Memory is F*h*w*6 floats, so use `camera_condition`
    (which packs frame by frame) for full-size videos.
    """
    ks = _per_frame(intrinsics, rel_poses.shape[0])
    rel = rel_poses.to(torch.float32)
    fields = []
    for f in range(rel.shape[0]):
        d = camera_directions(ks[f], height, width) @ rel[f, :3, :3].T
        o = rel[f, :3, 3].expand(height, width, 3)
        fields.append(torch.cat([o, d], dim=-1))
    return torch.stack(fields)


def pack_plucker(field: torch.Tensor) -> torch.Tensor:
    """[F, h, w, 6] per-pixel embedding -> [1, 384, F, h/8, w/8] with channel c = c6*64 + py*8 + px.

    Pixel (row, col) = (lat_row*8 + py, lat_col*8 + px). The DiT's patchify
    "b c f (h q) (w r) -> b (f h w) (c q r)" then yields k = ((c6*64 + py*8 + px)*4) + qy*2 + qx (spec §3).
    """
    if field.ndim != 4 or field.shape[-1] != PLUCKER_CHANNELS:
        raise ValueError(f"Plücker field must be [F, h, w, {PLUCKER_CHANNELS}], got {tuple(field.shape)}")
    packed = rearrange(field, "f (lh py) (lw px) c -> (c py px) f lh lw", py=VAE_STRIDE, px=VAE_STRIDE)
    return packed.unsqueeze(0).contiguous()


def packed_plucker(rel_poses: torch.Tensor, intrinsics: torch.Tensor, height: int, width: int) -> torch.Tensor:
    """pack_plucker(plucker_rays(...)) without the F*h*w*6 intermediate: [1, 384, F, h/8, w/8] float32.

    The camera-space directions are packed once per distinct intrinsics row ([3, 64*lat_h*lat_w]); each
    frame is then a 3x3 rotation of them plus a constant origin, written straight into the output.
    """
    if height % VAE_STRIDE or width % VAE_STRIDE:
        raise ValueError(f"frame size {height}x{width} must be a multiple of {VAE_STRIDE} to pack into VAE cells")
    lat_h, lat_w = height // VAE_STRIDE, width // VAE_STRIDE
    cell = VAE_STRIDE * VAE_STRIDE
    rel = rel_poses.to(torch.float32)
    frames = rel.shape[0]
    ks = _per_frame(intrinsics, frames)
    out = torch.empty(1, PLUCKER_CHANNELS, cell, frames, lat_h * lat_w, dtype=torch.float32)
    dirs, dirs_k = None, None
    for f in range(frames):
        if dirs_k is None or not torch.equal(ks[f], dirs_k):
            dirs_k = ks[f]
            dirs = rearrange(
                camera_directions(dirs_k, height, width),
                "(lh py) (lw px) c -> c (py px lh lw)",
                py=VAE_STRIDE,
                px=VAE_STRIDE,
            )
        out[0, :3, :, f] = rel[f, :3, 3][:, None, None]
        out[0, 3:, :, f] = (rel[f, :3, :3] @ dirs).view(3, cell, lat_h * lat_w)
    return out.view(1, CAMERA_CHANNELS, frames, lat_h, lat_w)


# ---- top level -------------------------------------------------------------------------------------------


def camera_condition(
    poses: ArrayLike,
    intrinsics: ArrayLike,
    height: int,
    width: int,
    frames: int,
    per_frame_intrinsics: bool = False,
    latent_frames: Optional[int] = None,
) -> CameraCondition:
    """LingBot camera input for a `frames`-frame video of height x width pixels.

    poses: [N, 4, 4] OpenCV camera-to-world; intrinsics: [N, 4] (fx, fy, cx, cy) at 480x832.
    height, width: output size, multiples of 16 (see sizes.target_size). frames: requested 4n+1 count;
    it is reduced to what the poses cover and `message` says so.
    per_frame_intrinsics: False (spec §4.4, reference at 6ca87d4) uses the first frame's intrinsics for every
    latent frame, so a zoom in the intrinsics is ignored; True interpolates them per latent frame like later
    reference revisions (`resample_camera_intrinsics`).
    latent_frames: resample the `frames` poses at this many latent frames (default (frames-1)//4+1); the Fast
    model passes its chunk-rounded count.
    Raises CameraInputError on bad input.
    """
    path = check_camera(poses, intrinsics)
    latent_size(height, width)  # validates the size
    frames, note = usable_frames(path.poses.shape[0], frames)
    notes = [note] if note else []

    used_poses = torch.from_numpy(path.poses[:frames].copy())
    used_k = torch.from_numpy(path.intrinsics[:frames].copy())
    targets = latent_targets(frames, latent_frames)
    focal = used_k[:, :2].double()
    if not per_frame_intrinsics and ((focal - focal[0]).abs() / focal[0]).max() > ZOOM_NOTE_TOL:
        notes.append(
            f"The intrinsics change over the frames (fx {focal[0, 0]:.1f} -> {focal[-1, 0]:.1f}) but, as in the "
            "reference, only the first frame's are used, so that zoom does not reach the model "
            "(enable per-frame intrinsics to follow it)."
        )
    if per_frame_intrinsics:
        k = scale_intrinsics(resample_intrinsics(used_k, targets), height, width)
    else:
        k = scale_intrinsics(used_k[:1], height, width).expand(targets.shape[0], 4)

    latent = resample_poses(used_poses, targets)
    rel = relative_poses(latent)
    plucker = packed_plucker(rel, k, height, width)
    return CameraCondition(
        plucker=plucker,
        frames=frames,
        message=" ".join(notes) if notes else None,
        poses=used_poses,
        intrinsics=used_k,
        latent_poses=latent.to(torch.float32),
        relative_poses=rel.to(torch.float32),
        scaled_intrinsics=k.to(torch.float32).contiguous(),
        height=height,
        width=width,
    )
