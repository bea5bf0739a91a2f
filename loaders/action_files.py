"""Key and action files of the release's example folders (fast-act spec §6-7), and `--actions`-style sources.

- `wasd_action.npy` / `ijkl_action.npy`: [N, 4] keys per frame (w,a,s,d / i,j,k,l; pressed when > 0.5) for the
  act-to-camera path of the Cam and Fast models; `intrinsics.npy` beside them is used when present.
- `action.npy` + `poses.npy` + `intrinsics.npy`: the Act model's input (WASD values per frame, the poses give
  the orientation).
Files are read without pickle (`camera_files.read_npy`); every error names the file.

A source is an action string (`w-10,a-10,...`), a folder with those files, or one key file (a `.npy` whose name
starts with `ijkl` holds i,j,k,l keys, any other w,a,s,d).
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Union

import numpy as np

from ..wan.control.actions import KeyInputError, KeyTimeline
from ..wan.control.camera import CameraPath
from .camera_files import INTRINSICS_FILE, POSES_FILE, CameraFileError, CameraFileNotFoundError, load_camera_folder, read_npy

WASD_FILE = "wasd_action.npy"
IJKL_FILE = "ijkl_action.npy"
ACT_FILE = "action.npy"

PathLike = Union[str, Path]


class ActionFileError(CameraFileError):
    """A key or action file exists but cannot be used."""


@dataclass
class KeySource:
    """Keys from an action string or key files, with the intrinsics found beside the files (if any)."""

    keys: KeyTimeline
    label: str  # what to call it in messages and pictures
    from_file: bool
    intrinsics: Optional[np.ndarray] = None  # [N, 4] at 480x832 from intrinsics.npy, else None (defaults)


@dataclass
class ActFiles:
    """The release's Act input: poses + intrinsics (orientation) and action.npy (w, a, s, d values per frame)."""

    path: CameraPath
    actions: np.ndarray  # [N, 4] as stored (int or float)
    label: str


def _keys_from_arrays(wasd, ijkl, wasd_name: str, ijkl_name: str) -> KeyTimeline:
    try:
        return KeyTimeline.from_arrays(wasd, ijkl, wasd_name, ijkl_name)
    except KeyInputError as e:
        raise ActionFileError(str(e)) from None


def _intrinsics_beside(folder: Path) -> Optional[np.ndarray]:
    p = folder / INTRINSICS_FILE
    return read_npy(p) if p.is_file() else None


def read_key_files(path: PathLike) -> KeySource:
    """Keys from a folder (wasd_action.npy and/or ijkl_action.npy) or one key file."""
    path = Path(path).expanduser()
    if path.is_dir():
        wasd_p, ijkl_p = path / WASD_FILE, path / IJKL_FILE
        if not wasd_p.is_file() and not ijkl_p.is_file():
            found = sorted(p.name for p in path.glob("*.npy"))
            raise CameraFileNotFoundError(
                f"{path} has no {WASD_FILE} or {IJKL_FILE} (key files: [N, 4] w,a,s,d / i,j,k,l per frame); "
                f"found {found or 'no .npy files'}"
            )
        wasd = read_npy(wasd_p) if wasd_p.is_file() else None
        ijkl = read_npy(ijkl_p) if ijkl_p.is_file() else None
        keys = _keys_from_arrays(wasd, ijkl, str(wasd_p), str(ijkl_p))
        return KeySource(keys, f"key files in {path.name}", True, _intrinsics_beside(path))
    if path.is_file():
        if path.suffix != ".npy":
            raise ActionFileError(f"{path}: a key file is a .npy array [N, 4]; give the file or its folder")
        turn = path.name.lower().startswith("ijkl")
        arr = read_npy(path)
        keys = _keys_from_arrays(None if turn else arr, arr if turn else None, str(path), str(path))
        return KeySource(keys, path.name, True, _intrinsics_beside(path.parent))
    raise CameraFileNotFoundError(f"key file or folder not found: {path}")


def has_act_files(folder: PathLike) -> bool:
    folder = Path(folder).expanduser()
    return folder.is_dir() and all((folder / n).is_file() for n in (ACT_FILE, POSES_FILE, INTRINSICS_FILE))


def read_act_folder(folder: PathLike) -> ActFiles:
    """poses.npy + intrinsics.npy + action.npy of an Act example folder (like the release's examples/05)."""
    folder = Path(folder).expanduser()
    missing = [n for n in (ACT_FILE, POSES_FILE, INTRINSICS_FILE) if not (folder / n).is_file()]
    if missing:
        raise CameraFileNotFoundError(
            f"{folder} has no {', '.join(missing)}; the Act model reads {ACT_FILE} ([N, 4] w,a,s,d per frame) with "
            f"{POSES_FILE} and {INTRINSICS_FILE} (or give key files / an action string instead)"
        )
    path = load_camera_folder(folder)
    actions = read_npy(folder / ACT_FILE)
    if actions.ndim != 2 or actions.shape[1] != 4:
        raise ActionFileError(f"{folder / ACT_FILE}: shape {tuple(actions.shape)} is not [N, 4] (w, a, s, d per frame)")
    return ActFiles(path, actions, folder.name)


def looks_like_path(spec: str) -> bool:
    """A source that names a file or folder rather than an action string."""
    s = spec.strip()
    return Path(s).expanduser().exists() or s.endswith(".npy") or "/" in s or "\\" in s


def read_key_source(spec: str, base: Optional[Path] = None) -> KeySource:
    """An action string, or key files (a folder or one .npy; relative to `base` when given)."""
    if looks_like_path(spec):
        p = Path(spec.strip()).expanduser()
        return read_key_files(base / p if base is not None and not p.is_absolute() else p)
    return KeySource(KeyTimeline.from_string(spec), "action string", False)
