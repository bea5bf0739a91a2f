"""Keys -> a camera path for the Cam and Fast models: the release's act-to-camera walk (fast-act spec §7).

The camera starts at the identity pose and, for every frame, applies that frame's keys:
- pitch: +2 deg for i, -2 deg for k; a step that would take the accumulated pitch past +-85 deg is dropped
  (yaw still applies in that frame);
- yaw: -2 deg for j, +2 deg for l;
- rotation R <- R_y(yaw) R R_x(pitch): yaw about the world's vertical axis, pitch about the camera's own x axis,
  so looking up never tilts the horizon;
- translation += 0.05 * (+-flat_forward for w/s, +-flat_right for d/a), where flat_* are the camera's forward
  and right axes projected onto the ground plane (y = 0) and normalised (|v| + 1e-6): walking stays level
  while looking up or down. Opposite keys cancel exactly (w+s, a+d, i+k, j+l).
F frames of keys give F + 1 poses (the camera before each frame and after the last), float64 numpy as in the
reference; `camera_condition(..., includes_end_pose=True)` resamples them at linspace(0, F, (F-1)//4 + 1).

`walk` returns the state after the last frame, so a path can be built segment by segment (continuation): walking
`keys[:a]` then `keys[a:]` from the returned state gives the same poses as walking `keys` at once.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional, Sequence

import numpy as np

from .actions import KEYS, KeyTimeline
from .camera import CameraPath

MOVE_PER_FRAME = 0.05  # scene units per frame (only relative sizes reach the model: translations are normalised)
TURN_PER_FRAME_DEG = 2.0
PITCH_LIMIT_DEG = 85.0
W, A, S, D, I, J, K, L = range(len(KEYS))


def rotation_x(angle: float) -> np.ndarray:
    c, s = np.cos(angle), np.sin(angle)
    return np.array([[1.0, 0.0, 0.0], [0.0, c, -s], [0.0, s, c]])


def rotation_y(angle: float) -> np.ndarray:
    c, s = np.cos(angle), np.sin(angle)
    return np.array([[c, 0.0, s], [0.0, 1.0, 0.0], [-s, 0.0, c]])


def _flat(v: np.ndarray) -> np.ndarray:
    """v projected onto the ground plane (y = 0) and normalised like the reference (norm + 1e-6)."""
    flat = np.array([v[0], 0.0, v[2]])
    norm = np.linalg.norm(flat)
    return flat / (norm + 1e-6) if norm > 0 else flat


@dataclass(frozen=True)
class WalkState:
    """The walking camera between frames: its camera-to-world pose and accumulated pitch (radians)."""

    c2w: np.ndarray = field(default_factory=lambda: np.eye(4))
    pitch: float = 0.0

    def step(self, pressed: Sequence[bool]) -> "WalkState":
        """The state after one frame with `pressed` (8 booleans in KEYS order)."""
        turn = float(np.deg2rad(TURN_PER_FRAME_DEG))
        limit = float(np.deg2rad(PITCH_LIMIT_DEG))
        pitch_delta = (turn if pressed[I] else 0.0) - (turn if pressed[K] else 0.0)
        pitch = self.pitch + pitch_delta
        if -limit <= pitch <= limit:
            new_pitch = pitch
        else:  # past +-85 degrees: this frame does not pitch
            new_pitch, pitch_delta = self.pitch, 0.0
        yaw_delta = (turn if pressed[L] else 0.0) - (turn if pressed[J] else 0.0)
        rot = rotation_y(yaw_delta) @ self.c2w[:3, :3] @ rotation_x(pitch_delta)
        forward, right = _flat(rot[:, 2]), _flat(rot[:, 0])
        move = np.zeros(3)
        for key, sign, axis in ((W, 1, forward), (S, -1, forward), (D, 1, right), (A, -1, right)):
            if pressed[key]:
                move = move + sign * axis * MOVE_PER_FRAME
        c2w = np.eye(4)
        c2w[:3, :3] = rot
        c2w[:3, 3] = self.c2w[:3, 3] + move
        return WalkState(c2w, new_pitch)


def walk(keys: KeyTimeline, start: Optional[WalkState] = None) -> tuple[np.ndarray, WalkState]:
    """Poses [F + 1, 4, 4] float64 (start pose first) for F frames of keys, and the state after the last frame."""
    state = start or WalkState()
    poses = [state.c2w]
    for row in keys.pressed:
        state = state.step(row)
        poses.append(state.c2w)
    return np.stack(poses), state


def keys_to_camera(keys: KeyTimeline, intrinsics: Optional[np.ndarray] = None,
                   start: Optional[WalkState] = None) -> tuple[CameraPath, WalkState]:
    """A camera path for `keys`: F + 1 float64 poses (use `includes_end_pose=True` downstream) and intrinsics rows.

    intrinsics: [4] or [M, 4] (fx, fy, cx, cy) at 480x832; the first row is used for every pose, as the
    reference uses only the first frame's. Default: the shipped examples' calibration.
    """
    from .camera_presets import DEFAULT_INTRINSICS

    poses, end = walk(keys, start)
    k = np.asarray(DEFAULT_INTRINSICS if intrinsics is None else intrinsics, dtype=np.float32).reshape(-1, 4)[:1]
    return CameraPath(poses, np.repeat(k, poses.shape[0], axis=0)), end
