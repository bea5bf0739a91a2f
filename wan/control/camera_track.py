"""A camera path built part by part: the camera of a Fast video that is continued with new keys or a new camera.

The reference builds a video's camera at once (spec §4, fast-act spec §2, §7): the poses are resampled at the
latent frames spread over the *whole* path (for keys: `linspace(0, F, lat)`, non-integer), made relative to the
first, framewise, and the translations divided by the largest step of the *whole* video. Two of those depend on
frames that a continuation does not know yet, so a run that is continued cannot be one reference run. The track
uses a rule that never looks ahead (the "continuable" rule), so that building the camera part by part gives
exactly the tensor of building it at once for the concatenated input:

- latent frame 0 is the start pose; every later latent frame advances the camera by 4 video frames: for keys,
  the release's walk (`act_to_camera`) over 4 more frames of keys; for camera files, pose 4j of the part (integer
  positions, no time compression);
- relative to latent frame 0 and framewise as the reference, in its float32 arithmetic by default, one latent
  frame at a time (`rel_l = inv(P_0) P_l`, `step_l = inv(rel_{l-1}) rel_l`);
- translation divided by a normaliser that does not depend on the future: for keys one latent frame of walking with
  one move key (4 x 0.05): a walk has steps of 1, as in a reference run that walks (the reference would scale a
  diagonal w+d step to 1 and straight steps to 0.71 when both occur, here they are 1.41 and 1); for a camera part
  its own largest step, as a reference run of that part.

A part of camera files continues from where the video is: its first pose is put on the last latent frame's pose and
the rest follow relative to it. Keys continue the walk (yaw about the world's vertical, the +-85 deg pitch limit).
After a reference-rule first part (`record`), the track continues from that part's last latent frame.

`form` ("v1" | "v2", camera_forms.py) is the float rounding of the intrinsics and rays, kept with the track (and in
its saved state; a state saved before forms existed loads as "v1", what it was made with).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Optional

import numpy as np
import torch

from ..sizes import VAE_TEMPORAL_STRIDE
from .act_to_camera import MOVE_PER_FRAME, WalkState, walk
from .actions import KeyTimeline
from .camera import (DEFAULT_POSE_PRECISION, CameraGeometry, CameraInputError, check_camera, check_form,
                     check_precision, invert_rigid, packed_plucker, scale_intrinsics)
from .camera_forms import DEFAULT_CAMERA_FORM
from .camera_presets import DEFAULT_INTRINSICS

# One latent frame (4 video frames) of walking with one move key: the unit translation of key-driven parts.
KEY_STEP = VAE_TEMPORAL_STRIDE * MOVE_PER_FRAME


def pitch_of(c2w: np.ndarray) -> float:
    """The walk's pitch (radians, up positive) of a camera-to-world pose: the elevation of its forward axis."""
    f = np.asarray(c2w, dtype=np.float64)[:3, 2]
    return float(math.atan2(-f[1], math.hypot(f[0], f[2])))


@dataclass
class CameraPart:
    """The camera of one part: the packed Plücker tensor and the poses behind it."""

    plucker: torch.Tensor  # [1, 384, n, lat_h, lat_w] float32 (CPU)
    steps: torch.Tensor  # [n, 4, 4] framewise relative poses, translation normalised (float32)
    latent_poses: np.ndarray  # [n, 4, 4] float64 absolute poses of the part's latent frames
    path: np.ndarray  # [m, 4, 4] float64 absolute poses of every video frame of the part (for pictures)
    intrinsics: np.ndarray  # [4] float32 (fx, fy, cx, cy) at 480x832 used for the part
    normaliser: float


@dataclass
class CameraTrack:
    """Where the camera of a video is after its latent frames so far, and how the next part continues it."""

    height: int
    width: int
    precision: str = DEFAULT_POSE_PRECISION
    latent_frames: int = 0
    origin: np.ndarray = field(default_factory=lambda: np.eye(4))  # pose of latent frame 0 (float64)
    anchor: np.ndarray = field(default_factory=lambda: np.eye(4))  # pose of the last latent frame (float64)
    relative: np.ndarray = field(default_factory=lambda: np.eye(4))  # last latent frame rel. to frame 0 (precision)
    walker: WalkState = field(default_factory=WalkState)  # where the next keys walk from
    intrinsics: np.ndarray = field(default_factory=lambda: np.asarray(DEFAULT_INTRINSICS, dtype=np.float32))
    form: str = DEFAULT_CAMERA_FORM  # float rounding of the intrinsics and rays (camera_forms.py)

    def __post_init__(self):
        check_precision(self.precision)
        check_form(self.form)

    def copy(self) -> "CameraTrack":
        return replace(self, origin=self.origin.copy(), anchor=self.anchor.copy(), relative=self.relative.copy(),
                       intrinsics=self.intrinsics.copy())

    # ---- parts ---------------------------------------------------------------------------------------------
    def keys_needed(self, latent_frames: int) -> int:
        """Frames of keys that `latent_frames` more latent frames take (latent frame 0 of the video takes none)."""
        return VAE_TEMPORAL_STRIDE * (latent_frames - (1 if self.latent_frames == 0 else 0))

    def poses_needed(self, latent_frames: int) -> int:
        """Poses a camera part of `latent_frames` latent frames takes (its first pose is where the video is)."""
        return self.keys_needed(latent_frames) + 1

    def keys(self, keys: KeyTimeline, latent_frames: int, intrinsics: Optional[np.ndarray] = None) -> CameraPart:
        """The next `latent_frames` latent frames from keys (exactly `keys_needed` frames of them)."""
        need = self.keys_needed(latent_frames)
        if keys.frames != need:
            raise ValueError(f"{latent_frames} latent frames take {need} frames of keys, got {keys.frames}")
        if intrinsics is not None:
            self.intrinsics = np.asarray(intrinsics, dtype=np.float32).reshape(-1, 4)[0].copy()
        poses, end = walk(keys, self.walker)
        picks = range(0 if self.latent_frames == 0 else VAE_TEMPORAL_STRIDE, poses.shape[0], VAE_TEMPORAL_STRIDE)
        latent = poses[list(picks)]
        part = self._part(latent, self._key_normaliser(), poses)
        self.walker = end
        return part

    def skip(self, latent_frames: int) -> None:
        """Latent frames made without camera control (the camera is taken to stay where it is)."""
        self.latent_frames += int(latent_frames)

    def still(self, latent_frames: int) -> CameraPart:
        """The next latent frames without keys (the camera stands still)."""
        return self.keys(KeyTimeline.none(self.keys_needed(latent_frames)), latent_frames)

    def poses(self, poses: np.ndarray, intrinsics: np.ndarray, latent_frames: int,
              per_frame_intrinsics: bool = False, name: str = "camera") -> CameraPart:
        """The next latent frames from camera files: poses [N, 4, 4] (N >= poses_needed), intrinsics [N, 4].

        The first pose is the camera where the video is now (the last latent frame; the start of a new video),
        pose 4j is latent frame j of the part. Translations are divided by the part's largest step."""
        path = check_camera(poses, intrinsics, f"{name} poses", f"{name} intrinsics", pose_dtype=None)
        need = self.poses_needed(latent_frames)
        if path.poses.shape[0] < need:
            raise CameraInputError(f"{name}: {path.poses.shape[0]} poses cover {path.poses.shape[0] - 1} frames; "
                                   f"{latent_frames} latent frames need {need} poses")
        q = path.poses[:need].astype(np.float64)
        k = path.intrinsics[:need]
        if self.latent_frames:  # put the part's first pose on the camera where the video is
            q = self.anchor @ np.linalg.inv(q[0]) @ q
            q[:, 3] = (0.0, 0.0, 0.0, 1.0)
        picks = list(range(0 if self.latent_frames == 0 else VAE_TEMPORAL_STRIDE, need, VAE_TEMPORAL_STRIDE))
        rows = k[picks] if per_frame_intrinsics else k[:1]
        self.intrinsics = np.asarray(rows[-1], dtype=np.float32).copy()
        part = self._part(q[picks], None, q, rows)
        self.walker = WalkState(self.anchor.copy(), pitch_of(self.anchor))
        return part

    def record(self, geometry: CameraGeometry, walker: Optional[WalkState] = None) -> None:
        """Continue after a part built by the reference's rule (`camera_condition` over the whole first part)."""
        if self.latent_frames:
            raise ValueError("only the first part of a video can follow the reference's rule")
        lat = geometry.latent_poses.to(torch.float64).numpy()
        self.precision = geometry.precision
        self.form = geometry.form
        self.origin, self.anchor = lat[0].copy(), lat[-1].copy()
        dtype = check_precision(self.precision)
        if lat.shape[0] > 1:
            first = torch.from_numpy(self.origin).to(dtype)
            self.relative = (invert_rigid(first) @ torch.from_numpy(self.anchor).to(dtype)).double().numpy()
        self.latent_frames = lat.shape[0]
        self.intrinsics = geometry.intrinsics[0].numpy().astype(np.float32)
        self.walker = walker if walker is not None else WalkState(self.anchor.copy(), pitch_of(self.anchor))

    # ---- the arithmetic ------------------------------------------------------------------------------------
    def _key_normaliser(self) -> float:
        return KEY_STEP

    def _part(self, latent: np.ndarray, normaliser: Optional[float], path: np.ndarray,
              rows: Optional[np.ndarray] = None) -> CameraPart:
        dtype = check_precision(self.precision)
        steps = [self._advance(p, dtype) for p in latent]
        steps = torch.stack(steps)
        if normaliser is None:  # a camera part: its own largest step, like a reference run of it
            largest = steps[:, :3, 3].norm(dim=-1).max()
        else:
            largest = torch.tensor(normaliser, dtype=dtype)
        if largest > 0:
            steps[:, :3, 3] = steps[:, :3, 3] / largest
        rows = self.intrinsics[None] if rows is None else np.asarray(rows, dtype=np.float32)
        ks = scale_intrinsics(rows, self.height, self.width, self.form).to(torch.float32)
        ks = ks.expand(steps.shape[0], 4) if ks.shape[0] == 1 else ks
        steps32 = steps.to(torch.float32)
        plucker = packed_plucker(steps32, ks.contiguous(), self.height, self.width, form=self.form)
        return CameraPart(plucker, steps32, latent.copy(), np.asarray(path, dtype=np.float64),
                          self.intrinsics.copy(), float(largest))

    def _advance(self, pose: np.ndarray, dtype: torch.dtype) -> torch.Tensor:
        """The framewise step into the next latent frame at absolute `pose` (one latent frame at a time, so a
        part gives the same values however the video is cut into parts)."""
        pose = np.asarray(pose, dtype=np.float64)
        if self.latent_frames == 0:
            self.origin = pose.copy()
            rel = torch.eye(4, dtype=dtype)
            step = rel.clone()
        else:
            rel = invert_rigid(torch.from_numpy(self.origin).to(dtype)) @ torch.from_numpy(pose).to(dtype)
            step = invert_rigid(torch.from_numpy(self.relative).to(dtype)) @ rel
        self.relative = rel.double().numpy()
        self.anchor = pose.copy()
        self.latent_frames += 1
        return step

    # ---- saving --------------------------------------------------------------------------------------------
    def to_state(self) -> tuple[dict, dict]:
        """(tensors, JSON values) that `from_state` turns back into this track."""
        tensors = {"origin": torch.from_numpy(self.origin.copy()), "anchor": torch.from_numpy(self.anchor.copy()),
                   "relative": torch.from_numpy(self.relative.copy()),
                   "walk_c2w": torch.from_numpy(np.asarray(self.walker.c2w, dtype=np.float64).copy()),
                   "intrinsics": torch.from_numpy(self.intrinsics.astype(np.float32).copy())}
        values = {"height": self.height, "width": self.width, "precision": self.precision,
                  "latent_frames": self.latent_frames, "walk_pitch": float(self.walker.pitch), "form": self.form}
        return tensors, values

    @classmethod
    def from_state(cls, tensors: dict, values: dict) -> "CameraTrack":
        t = {k: v.numpy() for k, v in tensors.items()}
        return cls(int(values["height"]), int(values["width"]), str(values["precision"]), int(values["latent_frames"]),
                   t["origin"].astype(np.float64), t["anchor"].astype(np.float64), t["relative"].astype(np.float64),
                   WalkState(t["walk_c2w"].astype(np.float64), float(values["walk_pitch"])),
                   t["intrinsics"].astype(np.float32), str(values.get("form", DEFAULT_CAMERA_FORM)))
