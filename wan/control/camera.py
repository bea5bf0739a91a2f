"""Camera conditioning of LingBot-World: camera poses + intrinsics -> packed Plücker tensor (spec §3, §4).

Pipeline (one call: `camera_condition`; `camera_geometry` stops before the rays, for the Act tensor):
  1. validate the arrays (shapes, finiteness, orthonormal rotations, positive focal lengths);
  2. frame-count rule: ((N-1)//4)*4+1 usable frames, the request is clipped to it (§4.1);
  3. resample the kept poses to one pose per latent frame with scipy, exactly as the reference does (linear
     translation, quaternion slerp after a sign fix, §4.2), in float64;
  4. framewise relative poses with the translation divided by the largest step (§4.3), in the reference's
     operation order and, by default, in its float32 precision (fast-act spec §8);
  5. first-frame intrinsics rescaled from the 480x832 calibration frame to the output size (§4.4; optionally
     per latent frame, as later reference revisions do);
  6. per-pixel rays [o, d] with pixel centres at +0.5 (§4.5), packed to [1, 384, F_lat, lat_h, lat_w]
     with channel c = c6*64 + py*8 + px (the DiT's 2x2 patchify then gives the 1536 order of §3).

`form=` picks the float rounding of steps 5-6: "v1" (default, this project's since the v1 releases) or "v2"
(LingBot-World v2's float32 arithmetic, bit-identical to its cam_utils on the CPU); see camera_forms.py.

Poses are OpenCV camera-to-world matrices (x right, y down, z forward).

Precision of step 4 (`precision=`): the reference casts the resampled poses to float32 and multiplies them in
float32. Far from the world origin (example 02 sits ~2,500 units out) that float32 arithmetic loses much of a
small per-step move to cancellation, and the normalisation by the largest step then scales that noise up: on
the shipped examples the exact (float64) result differs from the reference's by up to 5e-2 on 17-frame clips.
The model was trained and is run by the release on the float32 values, so "float32" (the default) reproduces
them operation for operation; "float64" gives the exact geometry, for poses whose float32 noise you do not
want (e.g. your own trajectories with large world offsets and tiny moves).
"""
from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import NamedTuple, Optional, Union

import numpy as np
import torch
from einops import rearrange

from ..sizes import VAE_STRIDE, VAE_TEMPORAL_STRIDE, check_frames, latent_size
from .camera_forms import CAMERA_FORMS, DEFAULT_CAMERA_FORM, directions_v2, scale_intrinsics_v2

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
# Arithmetic of the relative-pose step: the reference's float32 (default) or exact float64 (see the docstring).
POSE_PRECISIONS = ("float32", "float64")
DEFAULT_POSE_PRECISION = "float32"


class CameraInputError(ValueError):
    """Camera poses or intrinsics that cannot be used; the message names the source and the fix."""


class CameraPath(NamedTuple):
    """A camera trajectory as poses.npy / intrinsics.npy hold it."""

    poses: np.ndarray  # [N, 4, 4] float32, OpenCV camera-to-world
    intrinsics: np.ndarray  # [N, 4] float32, (fx, fy, cx, cy) in pixels of a 480x832 frame


@dataclass
class CameraGeometry:
    """The pose part of one camera input, resampled to latent frames (everything but the per-pixel rays)."""

    frames: int  # frame count to generate (the request, possibly reduced to what the poses cover)
    message: Optional[str]  # human note when something was changed or ignored, else None
    poses: torch.Tensor  # [frames (+1), 4, 4] float32: the input poses actually used
    intrinsics: torch.Tensor  # [frames (+1), 4] float32: the input intrinsics actually used (480x832 pixels)
    latent_poses: torch.Tensor  # [F_lat, 4, 4] float32: poses resampled to latent frames (absolute)
    relative_poses: torch.Tensor  # [F_lat, 4, 4] float32: framewise relative, translation normalised
    scaled_intrinsics: torch.Tensor  # [F_lat, 4] float32: (fx, fy, cx, cy) per latent frame at height x width
    height: int
    width: int
    precision: str = DEFAULT_POSE_PRECISION  # arithmetic of the relative-pose step
    form: str = DEFAULT_CAMERA_FORM  # float rounding of the intrinsics and rays ('v1' | 'v2', camera_forms.py)

    @property
    def latent_frames(self) -> int:
        return self.relative_poses.shape[0]


@dataclass
class CameraCondition(CameraGeometry):
    """Everything the sampler and the UI need from one camera input."""

    plucker: Optional[torch.Tensor] = None  # [1, 384, F_lat, lat_h, lat_w] float32, CPU


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


# ---- pose resampling and relative poses ------------------------------------------------------------------


def check_precision(precision: str) -> torch.dtype:
    """The torch dtype of a pose precision name ('float32' | 'float64')."""
    if precision not in POSE_PRECISIONS:
        raise CameraInputError(f"pose precision {precision!r}: choose one of {', '.join(POSE_PRECISIONS)}")
    return torch.float32 if precision == "float32" else torch.float64


def check_form(form: str) -> str:
    """`form` if it names a camera form ('v1' | 'v2', camera_forms.py); raises CameraInputError otherwise."""
    if form not in CAMERA_FORMS:
        raise CameraInputError(f"camera form {form!r}: choose one of {', '.join(CAMERA_FORMS)}")
    return form


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


# ---- intrinsics and rays ---------------------------------------------------------------------------------


def scale_intrinsics(intrinsics: ArrayLike, height: int, width: int, form: str = DEFAULT_CAMERA_FORM) -> torch.Tensor:
    """(fx, fy, cx, cy) rows [..., 4] of a 480x832 calibration rescaled to height x width (spec §4.4).

    fx, cx scale with width/832 and fy, cy with height/480; there is no crop offset. form "v1": float64 products
    (float64 result); "v2": v2's float32 products (float32 result).
    """
    if check_form(form) == "v2":
        return scale_intrinsics_v2(torch.as_tensor(np.asarray(intrinsics)), height, width,
                                   INTRINSICS_HEIGHT, INTRINSICS_WIDTH)
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


def camera_directions(intrinsics: torch.Tensor, height: int, width: int, form: str = DEFAULT_CAMERA_FORM) -> torch.Tensor:
    """Unit ray directions [height, width, 3] float32 in camera axes through the pixel centres (col+0.5, row+0.5).

    form "v1": computed in float64 and rounded; "v2": v2's float32 arithmetic (camera_forms.directions_v2)."""
    if check_form(form) == "v2":
        return directions_v2(intrinsics, height, width)
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


def plucker_rays(rel_poses: torch.Tensor, intrinsics: torch.Tensor, height: int, width: int,
                 form: str = DEFAULT_CAMERA_FORM) -> torch.Tensor:
    """Unpacked embedding [F, height, width, 6] = [o, d] per pixel (spec §4.5), float32.

    rel_poses [F, 4, 4]; intrinsics [4] (shared) or [F, 4] at height x width. o is the frame's (relative)
    camera centre, d = R d_cam the unit ray direction. Memory is F*h*w*6 floats, so use `camera_condition`
    (which packs frame by frame) for full-size videos. form: camera_directions' rounding; "v2" also rotates as
    v2 does (R @ d over the pixels), "v1" as the v1 reference (d @ R^T).
    """
    ks = _per_frame(intrinsics, rel_poses.shape[0])
    rel = rel_poses.to(torch.float32)
    fields = []
    for f in range(rel.shape[0]):
        dirs = camera_directions(ks[f], height, width, form)
        if form == "v2":
            d = (rel[f, :3, :3] @ dirs.reshape(-1, 3).T).T.reshape(height, width, 3)
        else:
            d = dirs @ rel[f, :3, :3].T
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


def packed_plucker(
    rel_poses: torch.Tensor, intrinsics: torch.Tensor, height: int, width: int, origins: bool = True,
    form: str = DEFAULT_CAMERA_FORM,
) -> torch.Tensor:
    """pack_plucker(plucker_rays(...)) without the F*h*w*6 intermediate: [1, 384, F, h/8, w/8] float32.

    The camera-space directions are packed once per distinct intrinsics row ([3, 64*lat_h*lat_w]); each
    frame is then a 3x3 rotation of them plus a constant origin, written straight into the output.
    origins=False leaves the origins out: the ray directions alone, [1, 192, F, h/8, w/8] (the Act tensor's
    first three channels, fast-act spec §6). form: the directions' rounding (camera_directions); the rotation
    R @ d is the same for both and is v2's to the bit.
    """
    if height % VAE_STRIDE or width % VAE_STRIDE:
        raise ValueError(f"frame size {width}x{height} (width x height) must be a multiple of {VAE_STRIDE} to pack into VAE cells")
    lat_h, lat_w = height // VAE_STRIDE, width // VAE_STRIDE
    cell = VAE_STRIDE * VAE_STRIDE
    rel = rel_poses.to(torch.float32)
    frames = rel.shape[0]
    ks = _per_frame(intrinsics, frames)
    first = 3 if origins else 0  # channel of d_x
    out = torch.empty(1, first + 3, cell, frames, lat_h * lat_w, dtype=torch.float32)
    dirs, dirs_k = None, None
    for f in range(frames):
        if dirs_k is None or not torch.equal(ks[f], dirs_k):
            dirs_k = ks[f]
            dirs = rearrange(
                camera_directions(dirs_k, height, width, form),
                "(lh py) (lw px) c -> c (py px lh lw)",
                py=VAE_STRIDE,
                px=VAE_STRIDE,
            )
        if origins:
            out[0, :3, :, f] = rel[f, :3, 3][:, None, None]
        out[0, first:, :, f] = (rel[f, :3, :3] @ dirs).view(3, cell, lat_h * lat_w)
    return out.view(1, (first + 3) * cell, frames, lat_h, lat_w)


# ---- top level -------------------------------------------------------------------------------------------


def camera_geometry(
    poses: ArrayLike,
    intrinsics: ArrayLike,
    height: int,
    width: int,
    frames: int,
    per_frame_intrinsics: bool = False,
    *,
    includes_end_pose: bool = False,
    precision: str = DEFAULT_POSE_PRECISION,
    latent_frames: Optional[int] = None,
    form: str = DEFAULT_CAMERA_FORM,
) -> CameraGeometry:
    """Steps 1-5 of the conditioning: the poses and intrinsics of each latent frame (see `camera_condition`)."""
    dtype = check_precision(precision)
    check_form(form)
    path = check_camera(poses, intrinsics, pose_dtype=None)  # float64 key-built paths stay float64
    latent_size(height, width)  # validates the size
    n = path.poses.shape[0]
    if includes_end_pose:
        # A key-built path: pose i is the camera before frame i, the last one after the last frame.
        if n < 2:
            raise CameraInputError("a path with an end pose needs at least 2 poses (one frame)")
        frames, note = usable_frames(n - 1, frames)
        used = frames + 1
    else:
        frames, note = usable_frames(n, frames)
        used = frames
    notes = [note] if note else []

    used_poses = torch.from_numpy(path.poses[:used].copy())
    used_k = torch.from_numpy(path.intrinsics[:used].copy())
    targets = latent_targets(frames, includes_end_pose, latent_frames)
    focal = used_k[:, :2].double()
    if not per_frame_intrinsics and ((focal - focal[0]).abs() / focal[0]).max() > ZOOM_NOTE_TOL:
        notes.append(
            f"The intrinsics change over the frames (fx {focal[0, 0]:.1f} -> {focal[-1, 0]:.1f}) but, as in the "
            "reference, only the first frame's are used, so that zoom does not reach the model "
            "(enable per-frame intrinsics to follow it)."
        )
    if per_frame_intrinsics:
        k = scale_intrinsics(resample_intrinsics(used_k, targets), height, width, form)
    else:
        k = scale_intrinsics(used_k[:1], height, width, form).expand(targets.shape[0], 4)

    latent = resample_poses(used_poses, targets)
    # The reference casts the resampled poses to float32 (`torch.from_numpy(poses).float()`) before the products.
    rel = relative_poses(latent.to(dtype), precision)
    return CameraGeometry(
        frames=frames,
        message=" ".join(notes) if notes else None,
        poses=used_poses.to(torch.float32),
        intrinsics=used_k,
        latent_poses=latent.to(torch.float32),
        relative_poses=rel.to(torch.float32),
        scaled_intrinsics=k.to(torch.float32).contiguous(),
        height=height,
        width=width,
        precision=precision,
        form=form,
    )


def camera_condition(
    poses: ArrayLike,
    intrinsics: ArrayLike,
    height: int,
    width: int,
    frames: int,
    per_frame_intrinsics: bool = False,
    *,
    includes_end_pose: bool = False,
    precision: str = DEFAULT_POSE_PRECISION,
    latent_frames: Optional[int] = None,
    form: str = DEFAULT_CAMERA_FORM,
) -> CameraCondition:
    """LingBot camera input for a `frames`-frame video of height x width pixels.

    poses: [N, 4, 4] OpenCV camera-to-world; intrinsics: [N, 4] (fx, fy, cx, cy) at 480x832.
    height, width: output size, multiples of 16 (see sizes.target_size). frames: requested 4n+1 count;
    it is reduced to what the poses cover and `message` says so.
    per_frame_intrinsics: False (spec §4.4, reference at 6ca87d4) uses the first frame's intrinsics for every
    latent frame, so a zoom in the intrinsics is ignored; True interpolates them per latent frame like later
    reference revisions (`resample_camera_intrinsics`).
    includes_end_pose: the poses are a path built from keys (`act_to_camera`): frames + 1 of them, the last one
    after the last frame, resampled over all of them at non-integer positions (fast-act spec §7).
    precision: "float32" (default, the reference's arithmetic) or "float64" for the relative-pose step.
    latent_frames: resample the poses at this many latent frames (default (frames-1)//4+1); the Fast model passes
    its chunk-rounded count.
    form: float rounding of the intrinsics and rays, "v1" (default: this project's, unchanged since the v1
    releases) or "v2" (LingBot-World v2's float32 arithmetic, bit-identical to its cam_utils on the CPU; the pose
    processing is the same for both). See camera_forms.py.
    Raises CameraInputError on bad input.
    """
    geo = camera_geometry(poses, intrinsics, height, width, frames, per_frame_intrinsics,
                          includes_end_pose=includes_end_pose, precision=precision, latent_frames=latent_frames,
                          form=form)
    # The rays come from the relative poses in `precision`; float32 covers the reference's values exactly.
    plucker = packed_plucker(geo.relative_poses, geo.scaled_intrinsics, height, width, form=form)
    return CameraCondition(**vars(geo), plucker=plucker)
