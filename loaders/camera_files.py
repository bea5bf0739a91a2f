"""Camera trajectories on disk: `poses.npy` + `intrinsics.npy`, the layout of LingBot's `action_path` folders.

poses.npy: float [N, 4, 4] OpenCV camera-to-world; intrinsics.npy: float [N, 4] (fx, fy, cx, cy) in pixels
of a 480x832 frame (spec §4.1, §4.4). Files are read with allow_pickle=False and validated by
`wan.camera.check_camera`, so every error names the offending file.
"""
from __future__ import annotations

from pathlib import Path
from typing import Optional, Union

import numpy as np

from .atomic import atomic_write
from ..wan.control.camera import CameraInputError, CameraPath, check_camera

POSES_FILE = "poses.npy"
INTRINSICS_FILE = "intrinsics.npy"

PathLike = Union[str, Path]


class CameraFileError(CameraInputError):
    """A camera file exists but cannot be used (unreadable, pickled, wrong shape or values)."""


class CameraFileNotFoundError(FileNotFoundError):
    """A camera file or folder is missing."""


NPY_MAGIC = b"\x93NUMPY"
ZIP_MAGIC = b"PK\x03\x04"


def read_npy(path: Path) -> np.ndarray:
    """One array saved with np.save, read without pickle; every failure names the file."""
    if not path.is_file():
        raise CameraFileNotFoundError(f"camera file not found: {path}")
    with open(path, "rb") as fh:
        magic = fh.read(len(NPY_MAGIC))
    if magic.startswith(ZIP_MAGIC):
        raise CameraFileError(f"{path}: is an .npz archive; expected a single array saved with np.save")
    if magic != NPY_MAGIC:
        raise CameraFileError(f"{path}: not a .npy file (no NumPy header); save the array with np.save")
    try:
        return np.load(path, allow_pickle=False)
    except (ValueError, OSError, EOFError) as exc:
        if "pickle" in str(exc):  # object arrays need pickle, which we never enable
            raise CameraFileError(
                f"{path}: holds Python objects that would need pickle; save a plain float32 array"
            ) from exc
        raise CameraFileError(f"{path}: damaged or truncated .npy file ({exc})") from exc


def load_camera_files(poses_path: PathLike, intrinsics_path: PathLike) -> CameraPath:
    """Load and validate a poses file and an intrinsics file; returns float32 arrays."""
    poses_path, intrinsics_path = Path(poses_path), Path(intrinsics_path)
    poses = read_npy(poses_path)
    intrinsics = read_npy(intrinsics_path)
    try:
        return check_camera(poses, intrinsics, str(poses_path), str(intrinsics_path))
    except CameraFileError:
        raise
    except CameraInputError as exc:
        raise CameraFileError(str(exc)) from exc


def load_camera_folder(folder: PathLike) -> CameraPath:
    """Load `poses.npy` and `intrinsics.npy` from a folder (a LingBot `action_path`)."""
    folder = Path(folder)
    if not folder.is_dir():
        raise CameraFileNotFoundError(f"camera folder not found: {folder}")
    missing = [name for name in (POSES_FILE, INTRINSICS_FILE) if not (folder / name).is_file()]
    if missing:
        raise CameraFileNotFoundError(
            f"camera folder {folder} has no {' and no '.join(missing)}; it needs {POSES_FILE} ([N,4,4] "
            f"camera-to-world) and {INTRINSICS_FILE} ([N,4] fx, fy, cx, cy at 480x832)"
        )
    return load_camera_files(folder / POSES_FILE, folder / INTRINSICS_FILE)


def load_camera(path: PathLike, intrinsics_path: Optional[PathLike] = None) -> CameraPath:
    """Load a trajectory from a folder, or from a poses file plus `intrinsics_path`."""
    path = Path(path)
    if intrinsics_path is not None:
        return load_camera_files(path, intrinsics_path)
    if path.is_dir():
        return load_camera_folder(path)
    if path.is_file():
        raise CameraFileError(
            f"{path} is a file; give the folder holding {POSES_FILE} and {INTRINSICS_FILE}, "
            "or pass the intrinsics file as well"
        )
    raise CameraFileNotFoundError(f"camera path not found: {path}")


def save_camera_folder(folder: PathLike, poses: np.ndarray, intrinsics: np.ndarray) -> Path:
    """Validate and write `poses.npy` + `intrinsics.npy` (float32) into `folder` (created if needed).

    Existing files of those names are replaced, each atomically (a crash never leaves a truncated .npy).
    Returns the folder.
    """
    folder = Path(folder)
    path = check_camera(poses, intrinsics, f"poses to save in {folder}", f"intrinsics to save in {folder}")
    folder.mkdir(parents=True, exist_ok=True)
    for name, array in ((POSES_FILE, path.poses), (INTRINSICS_FILE, path.intrinsics)):
        with atomic_write(folder / name) as fh:  # each file whole or not replaced at all
            np.save(fh, array, allow_pickle=False)
    return folder
