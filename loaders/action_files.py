"""Key and action files of the release's example folders (fast-act spec §6-7), and `--actions`-style sources.

- `wasd_action.npy` / `ijkl_action.npy`: [N, 4] keys per frame (w,a,s,d / i,j,k,l; pressed when > 0.5) for the
  act-to-camera path of the Cam and Fast models; `intrinsics.npy` beside them is used when present.
- `action.npy` + `poses.npy` + `intrinsics.npy`: the Act model's input (WASD values per frame, the poses give
  the orientation).
Files are read without pickle (`camera_files.read_npy`); every error names the file.

A source is an action string (`w-10,a-10,...`), a text file holding one (`.txt`, as the player saves it: a played
hour is longer than a command line may be), a folder with key files, or one key file (a `.npy` whose name starts
with `ijkl` holds i,j,k,l keys, any other w,a,s,d).
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
ACTION_TEXT_SUFFIX = ".txt"
MAX_ACTION_TEXT_BYTES = 16 * 1024 * 1024  # ~100 hours of played chunks; a bigger file is not an action string

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
    return path_exists(folder) and folder.is_dir() and all((folder / n).is_file() for n in (ACT_FILE, POSES_FILE, INTRINSICS_FILE))


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


def path_exists(path: PathLike) -> bool:
    """Whether `path` names something on disk; False for a name no file can have (too long, a NUL byte, an unknown
    ~user), which Path.exists() raises on."""
    try:
        return Path(path).expanduser().exists()
    except (OSError, ValueError, RuntimeError):
        return False


def looks_like_path(spec: str) -> bool:
    """A source that names a file or folder rather than an action string."""
    s = spec.strip()
    return s.endswith((".npy", ACTION_TEXT_SUFFIX)) or "/" in s or "\\" in s or path_exists(s)


def action_text_file(spec: str) -> Optional[Path]:
    """The text file an action-string source names (a `.txt`), else None."""
    s = spec.strip()
    return Path(s).expanduser() if s.endswith(ACTION_TEXT_SUFFIX) else None


def read_action_text(path: PathLike) -> str:
    """The action string in a text file (surrounding whitespace and line breaks dropped)."""
    path = Path(path).expanduser()
    if not path.is_file():
        raise CameraFileNotFoundError(f"action file not found: {path}" + (
            " (that is a folder; give the .txt file the player saved)" if path.is_dir() else ""))
    size = path.stat().st_size
    if size > MAX_ACTION_TEXT_BYTES:
        raise ActionFileError(f"{path}: {size / 2**20:.0f} MB is not an action string (at most "
                              f"{MAX_ACTION_TEXT_BYTES // 2**20} MB)")
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise ActionFileError(f"{path}: not a text file; an action file holds keys such as 'w-8,a-4'") from None
    text = "".join(text.split())
    if not text:
        raise ActionFileError(f"{path} is empty; it should hold keys such as 'w-8,a-4'")
    return text


def action_string_of(spec: str) -> Optional[str]:
    """The action string a source gives: the string itself, or a `.txt` file's contents; None for key files."""
    if not looks_like_path(spec):
        return spec
    text_file = action_text_file(spec)
    return read_action_text(text_file) if text_file is not None else None


def read_key_source(spec: str, base: Optional[Path] = None) -> KeySource:
    """An action string, a text file holding one, or key files (a folder or one .npy; relative to `base` when
    given)."""
    if looks_like_path(spec):
        p = Path(spec.strip()).expanduser()
        p = base / p if base is not None and not p.is_absolute() else p
        if p.suffix == ACTION_TEXT_SUFFIX:
            return KeySource(_keys_of_string(read_action_text(p), f"{p.name}"), f"actions in {p.name}", False)
        return read_key_files(p)
    return KeySource(KeyTimeline.from_string(spec), "action string", False)


def _keys_of_string(text: str, name: str) -> KeyTimeline:
    try:
        return KeyTimeline.from_string(text)
    except ValueError as e:
        raise ActionFileError(f"{name}: {e}") from None
