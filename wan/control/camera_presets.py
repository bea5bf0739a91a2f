"""Camera trajectory presets generated in code, in the poses.npy / intrinsics.npy format (OpenCV axes).

Each preset is a constant per-frame motion expressed in the camera's own axes (x right, y down, z forward):
a rotation vector, a translation, and a relative focal-length change. Presets combine by adding those
per-frame motions ("dolly_in+pan_right" moves forward while turning right, i.e. along an arc), and the
trajectory is the per-frame motion applied `frames - 1` times starting from the identity pose.

Units at speed = 1.0 (speed multiplies all of them):
- pan / tilt / orbit: 0.5 degrees per frame (8 deg/s at 16 fps, 40 degrees over 81 frames);
- dolly / truck / pedestal: 0.05 scene units per frame. LingBot divides translations by the largest
  per-step move (spec §4.3), so for a constant-speed move the absolute scale does not reach the model;
  it only matters relative to the other parts of a combination (e.g. against an orbit's arc);
- orbit: circles a pivot ORBIT_RADIUS = 2 scene units in front of the camera, keeping it centred;
- zoom: focal length x exp(+-0.005) per frame (about x1.49 over 81 frames). The reference (spec §4.4)
  uses only the first frame's intrinsics, so zoom reaches the model only with per-frame intrinsics
  (`camera_condition(..., per_frame_intrinsics=True)`).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence, Union

import numpy as np

from .camera import CameraPath

# Intrinsics of the shipped examples (fx, fy, cx, cy in a 480x832 frame, spec §4.6).
DEFAULT_INTRINSICS = (502.9116, 503.10812, 415.77786, 239.77779)

ROTATION_DEG_PER_FRAME = 0.5
TRANSLATION_PER_FRAME = 0.05
ZOOM_PER_FRAME = 0.005
ORBIT_RADIUS = 2.0


@dataclass(frozen=True)
class Motion:
    """Per-frame motion at speed 1 in the current camera's axes (x right, y down, z forward)."""

    rotation_deg: tuple[float, float, float] = (0.0, 0.0, 0.0)  # rotation vector, degrees
    translation: tuple[float, float, float] = (0.0, 0.0, 0.0)  # scene units
    zoom: float = 0.0  # log focal-length change

    def __add__(self, other: "Motion") -> "Motion":
        return Motion(
            tuple(a + b for a, b in zip(self.rotation_deg, other.rotation_deg)),
            tuple(a + b for a, b in zip(self.translation, other.translation)),
            self.zoom + other.zoom,
        )


def _orbit(direction: int) -> Motion:
    """Circle a pivot ORBIT_RADIUS ahead: step sideways along the arc while turning to keep it centred.

    direction -1 = orbit left (camera moves to its left, turns right), +1 = orbit right.
    """
    a = math.radians(ROTATION_DEG_PER_FRAME)
    # New camera centre, in the previous camera's axes, for a turn by a about the pivot (0, 0, r).
    step = (direction * ORBIT_RADIUS * math.sin(a), 0.0, ORBIT_RADIUS * (1 - math.cos(a)))
    return Motion((0.0, -direction * ROTATION_DEG_PER_FRAME, 0.0), step)


_R = ROTATION_DEG_PER_FRAME
_T = TRANSLATION_PER_FRAME
# Signs in OpenCV axes: +y rotation turns the view right, +x rotation tilts it up, -y translation is up.
PRESETS: dict[str, Motion] = {
    "static": Motion(),
    "pan_left": Motion(rotation_deg=(0.0, -_R, 0.0)),
    "pan_right": Motion(rotation_deg=(0.0, _R, 0.0)),
    "tilt_up": Motion(rotation_deg=(_R, 0.0, 0.0)),
    "tilt_down": Motion(rotation_deg=(-_R, 0.0, 0.0)),
    "dolly_in": Motion(translation=(0.0, 0.0, _T)),
    "dolly_out": Motion(translation=(0.0, 0.0, -_T)),
    "truck_left": Motion(translation=(-_T, 0.0, 0.0)),
    "truck_right": Motion(translation=(_T, 0.0, 0.0)),
    "pedestal_up": Motion(translation=(0.0, -_T, 0.0)),
    "pedestal_down": Motion(translation=(0.0, _T, 0.0)),
    "orbit_left": _orbit(-1),
    "orbit_right": _orbit(+1),
    "zoom_in": Motion(zoom=ZOOM_PER_FRAME),
    "zoom_out": Motion(zoom=-ZOOM_PER_FRAME),
}
PRESET_NAMES: tuple[str, ...] = tuple(PRESETS)


def parse_preset(names: Union[str, Sequence[str]]) -> tuple[str, ...]:
    """"dolly_in+pan_right" or ["dolly_in", "pan_right"] -> ("dolly_in", "pan_right"), names checked."""
    parts = names.split("+") if isinstance(names, str) else list(names)
    parts = [p.strip().lower().replace(" ", "_").replace("-", "_") for p in parts]
    parts = [p for p in parts if p]
    if not parts:
        raise ValueError(f"empty camera preset; choose from {', '.join(PRESET_NAMES)}")
    unknown = [p for p in parts if p not in PRESETS]
    if unknown:
        raise ValueError(
            f"unknown camera preset(s) {', '.join(unknown)}; choose from {', '.join(PRESET_NAMES)} "
            "(combine with '+', e.g. 'dolly_in+pan_right')"
        )
    return tuple(parts)


def _rotation_matrix(rotvec_rad: np.ndarray) -> np.ndarray:
    """Rodrigues' formula: rotation vector (axis * angle) -> 3x3 matrix."""
    angle = float(np.linalg.norm(rotvec_rad))
    if angle < 1e-12:
        return np.eye(3)
    k = rotvec_rad / angle
    kx = np.array([[0.0, -k[2], k[1]], [k[2], 0.0, -k[0]], [-k[1], k[0], 0.0]])
    return np.eye(3) + math.sin(angle) * kx + (1 - math.cos(angle)) * (kx @ kx)


def preset_camera(
    names: Union[str, Sequence[str]],
    frames: int = 81,
    speed: float = 1.0,
    intrinsics: Sequence[float] = DEFAULT_INTRINSICS,
) -> CameraPath:
    """Trajectory of `frames` poses for a preset or a '+'-combination of presets.

    Returns CameraPath(poses [frames, 4, 4] float32 OpenCV camera-to-world starting at the identity,
    intrinsics [frames, 4] float32 (fx, fy, cx, cy) at 480x832, fx/fy scaled by the zoom). speed >= 0
    scales every motion (see the module docstring for units).
    """
    motion = sum((PRESETS[n] for n in parse_preset(names)), Motion())
    if not (isinstance(frames, int) and frames >= 1):
        raise ValueError(f"frames must be a positive integer, got {frames!r}")
    if not (math.isfinite(speed) and speed >= 0):
        raise ValueError(f"speed must be a finite number >= 0, got {speed!r} (use the opposite preset to reverse)")
    if len(intrinsics) != 4 or not all(math.isfinite(v) for v in intrinsics) or min(intrinsics[:2]) <= 0:
        raise ValueError(f"intrinsics must be (fx, fy, cx, cy) with fx, fy > 0, got {tuple(intrinsics)}")

    step = np.eye(4)
    step[:3, :3] = _rotation_matrix(np.radians(np.array(motion.rotation_deg)) * speed)
    step[:3, 3] = np.array(motion.translation) * speed
    poses = np.empty((frames, 4, 4))
    poses[0] = np.eye(4)
    for i in range(1, frames):
        poses[i] = poses[i - 1] @ step  # the motion is in the current camera's axes: right-multiply

    k = np.tile(np.asarray(intrinsics, dtype=np.float64), (frames, 1))
    k[:, :2] *= np.exp(motion.zoom * speed * np.arange(frames))[:, None]
    return CameraPath(poses.astype(np.float32), k.astype(np.float32))
