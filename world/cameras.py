"""Camera paths as the doors read, make, fit, draw and save them: a recorded trajectory (poses.npy +
intrinsics.npy, a folder or a pair of files), a preset move (dolly_in, or two combined: dolly_in+pan_right), the
frames a path covers, the packed Plücker tensor of a path at a video's size, and the picture of a path.
loaders/camera_files.py reads and writes the files; wan/control/ does the maths. world/controls.py builds a video's
control from these; a door that holds a path of its own (a ComfyUI node's camera input) uses them directly.
"""
from __future__ import annotations

from pathlib import Path
from typing import Optional, Sequence, Union

from ..loaders.camera_files import (INTRINSICS_FILE, POSES_FILE, CameraFileNotFoundError, load_camera,
                                    load_camera_files, save_camera_folder)
from ..wan.control.camera import CameraPath, camera_condition, usable_frames
from ..wan.control.camera_presets import PRESET_NAMES, PRESETS, parse_preset, preset_camera
from ..wan.control.trajectory_plot import image_to_tensor, plot_trajectory

__all__ = ["INTRINSICS_FILE", "POSES_FILE", "PRESET_NAMES", "CameraFileNotFoundError", "CameraPath",
           "camera_condition", "image_to_tensor", "load_camera", "plot_trajectory", "preset_path", "read_camera",
           "save_camera_folder", "usable_frames"]


def read_camera(path: Path, intrinsics: Optional[Path] = None) -> CameraPath:
    """A recorded trajectory: a folder holding both files, a poses file and the intrinsics file given, or a poses
    file whose intrinsics.npy sits beside it."""
    if intrinsics is not None:
        return load_camera_files(path, intrinsics)
    beside = path.parent / INTRINSICS_FILE
    if path.is_file() and beside.is_file() and path.name != INTRINSICS_FILE:
        return load_camera_files(path, beside)
    return load_camera(path)


def preset_path(names: Union[str, Sequence[str]], frames: int, speed: float = 1.0) -> tuple[CameraPath, bool]:
    """(the preset move's path over `frames` poses at `speed` times its speed, whether it zooms). A zoom lives in the
    intrinsics, so a zooming path is followed frame by frame."""
    return preset_camera(names, frames=frames, speed=speed), any(PRESETS[n].zoom for n in parse_preset(names))
