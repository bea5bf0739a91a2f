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

Precision of step 4 (`precision=`): the reference's float32 arithmetic by default, or exact float64; why, in
camera_poses.py.

The steps live in camera_input.py (1-2), camera_poses.py (3-4) and camera_rays.py (5-6); this module runs them
and hands on their names, so that a caller imports the camera conditioning from one place.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch

from ..sizes import latent_size
from .camera_forms import DEFAULT_CAMERA_FORM
from .camera_input import (BOTTOM_ROW_TOL, INTRINSICS_HEIGHT, INTRINSICS_WIDTH, ORTHONORMAL_REFUSE_TOL,
                           ORTHONORMAL_WARN_TOL, ArrayLike, CameraInputError, CameraPath, check_camera,
                           check_intrinsics, check_poses, usable_frames)
from .camera_poses import (DEFAULT_POSE_PRECISION, POSE_PRECISIONS, check_precision, invert_rigid, latent_targets,
                           relative_poses, resample_poses)
from .camera_rays import (CAMERA_CHANNELS, PLUCKER_CHANNELS, camera_directions, check_form, pack_plucker,
                          packed_plucker, plucker_rays, resample_intrinsics, scale_intrinsics)

__all__ = ["BOTTOM_ROW_TOL", "CAMERA_CHANNELS", "DEFAULT_POSE_PRECISION", "INTRINSICS_HEIGHT", "INTRINSICS_WIDTH",
           "ORTHONORMAL_REFUSE_TOL", "ORTHONORMAL_WARN_TOL", "PLUCKER_CHANNELS", "POSE_PRECISIONS", "ZOOM_NOTE_TOL",
           "ArrayLike", "CameraCondition", "CameraGeometry", "CameraInputError", "CameraPath", "camera_condition",
           "camera_directions", "camera_geometry", "check_camera", "check_form", "check_intrinsics", "check_poses",
           "check_precision", "invert_rigid", "latent_targets", "pack_plucker", "packed_plucker", "plucker_rays",
           "relative_poses", "resample_intrinsics", "resample_poses", "scale_intrinsics", "usable_frames"]

# Relative change of fx/fy over the used frames above which we tell the user that zoom is ignored.
ZOOM_NOTE_TOL = 1e-3


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
