"""What steers a video, read from a door's `Steering` (world/settings.py): keys (an action string, a `.txt` file of
one, or key files), a camera path (a trajectory folder or a preset such as dolly_in) or nothing.

- The base models (`base_control`): a camera path or keys -> the packed Plücker tensor (Cam), or the 7-channel
  Act tensor (keys, or the release's Act input: a folder with action.npy + poses.npy + intrinsics.npy).
- The causal models (`camera_source`): the part's `CameraSource`, planned into chunks by the session.
- Before anything loads (`check_actions`, `requested_frames`): the action string's grammar and the length it sets.
The path a video follows comes back with it (`PathPicture`); the door draws it where it writes pictures.
Everything raises ValueError subclasses with one line (exit code 2 at the CLI).
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import numpy as np
import torch

from ..wan.control.act_control import act_condition
from ..wan.control.control_kind import ACT, CAMERA, check_control
from ..wan.sampling.fast_parts import CameraSource
from .cameras import camera_condition
from .settings import Steering

# What a door that holds its own camera or keys (a ComfyUI node's inputs) builds a base model's control with: the
# model's control kinds and their check, the Act tensor, the Plücker tensor; a causal part's CameraSource.
__all__ = ["ACT", "CAMERA", "BaseControl", "CameraSource", "PathPicture", "act_condition", "base_control",
           "base_kind", "camera_condition", "camera_path", "camera_source", "check_actions", "check_control",
           "control_label", "input_file", "model_kind", "part_picture", "read_keys", "requested_frames",
           "sets_its_length", "short", "trajectory_picture"]

DEFAULT_STEPS = {CAMERA: 70, ACT: 20}  # Act: the release's README runs 20 steps
DEFAULT_FRAMES = 81  # the release's default, and what key files are cut to (the release reads keys[:frame_num])
ACT_FIX = ("give it keys with --actions: an action string such as 'w-10,a-10,iw-15', or a folder with action.npy, "
           "poses.npy and intrinsics.npy like the release's examples/05")


@dataclass
class PathPicture:
    """The camera path a video follows, to draw (`trajectory_picture`): poses, intrinsics, a title, the keys."""

    poses: np.ndarray
    intrinsics: np.ndarray
    title: str
    keys: object = None  # a KeyTimeline drawn under the path


@dataclass
class BaseControl:
    """A base model's control input: the packed tensor (None: no control), the frames it covers, a note for the log
    (the camera's), a line for the console (the keys'), and the path to draw."""

    tensor: Optional[torch.Tensor]
    frames: int
    note: Optional[str] = None
    line: Optional[str] = None
    picture: Optional[PathPicture] = None


# ---- before anything loads ---------------------------------------------------------------------------------------
def check_actions(spec: str) -> None:
    """The action string `spec` gives (itself, or a `.txt` file's contents), parsed: its grammar is wrong, or its
    file cannot be read, in one line (ValueError / OSError); key files are read later."""
    from ..loaders.action_files import action_string_of
    from ..wan.control.actions import parse_action_string

    text = action_string_of(spec)
    if text is not None:
        parse_action_string(text)


def requested_frames(actions: Optional[str], frames: Optional[int]) -> int:
    """The frames a video asks for before any file is read: `frames`, an action string's length (4n+1), else 81."""
    from ..loaders.action_files import action_string_of
    from ..wan.control.actions import pad_to_4n1, parse_action_string

    if frames is not None:
        return int(frames)
    text = action_string_of(actions) if actions else None
    if text is not None:
        return pad_to_4n1(sum(seg.frames for seg in parse_action_string(text)))
    return DEFAULT_FRAMES


def sets_its_length(actions: Optional[str]) -> bool:
    """Keys that set the video's length themselves: an action string, or a `.txt` file of one (key files do not)."""
    from ..loaders.action_files import action_text_file, looks_like_path

    return bool(actions) and (not looks_like_path(actions) or action_text_file(actions) is not None)


def input_file(spec) -> Optional[Path]:
    """The file or folder a control input (or any path flag) names, when it exists; None for an action string, however
    long, and for anything no file can be named."""
    from ..loaders.action_files import path_exists

    return Path(spec) if spec and path_exists(str(spec)) else None


def read_keys(spec: str):
    """The KeyTimeline of an action string, a `.txt` file of one, or key files."""
    from ..loaders.action_files import read_key_source

    return read_key_source(spec).keys


# ---- camera paths ------------------------------------------------------------------------------------------------
def camera_path(spec: str, frames: int, speed: float):
    """(CameraPath, follows per-frame intrinsics) of a camera: a trajectory folder / poses.npy, or a preset name
    ('+'-combinations allowed). Zoom lives in the intrinsics, so zoom presets follow them per frame (as the camera
    preset node does)."""
    from ..loaders.action_files import path_exists
    from .cameras import CameraFileNotFoundError, load_camera, preset_path

    if path_exists(spec):
        return load_camera(Path(spec).expanduser()), False
    if _names_a_path(spec):  # a typo in a folder's name is not an unknown preset
        raise CameraFileNotFoundError(f"--camera {spec}: no such folder; give a trajectory folder holding "
                                      f"poses.npy and intrinsics.npy, or a preset such as dolly_in")
    return preset_path(spec, frames, speed)


def _names_a_path(spec: str) -> bool:
    """A camera written as a path (presets are plain names)."""
    s = spec.strip()
    return "/" in s or "\\" in s or s.startswith((".", "~")) or s.endswith(".npy")


# ---- the causal models -------------------------------------------------------------------------------------------
def camera_source(steering: Steering, frames: Optional[int],
                  continuation: bool = False) -> tuple[CameraSource, Optional[int]]:
    """(what steers the part: keys, a camera (trajectory folder or preset) or nothing, the frames the part asks for:
    `frames`, or DEFAULT_FRAMES for key files of a first part without a frame count)."""
    from ..loaders.action_files import read_key_source

    if steering.actions:
        src = read_key_source(steering.actions)
        if frames is None and src.from_file and not continuation:
            frames = DEFAULT_FRAMES  # key files are cut to the video (the release reads keys[:frame_num])
        return CameraSource(keys=src.keys, intrinsics=src.intrinsics, label=src.label, from_file=src.from_file), frames
    if steering.camera:
        want = (frames or 12) + 1 if continuation else (frames or DEFAULT_FRAMES)
        path, zoom = camera_path(steering.camera, max(want, 2), steering.camera_speed)
        return CameraSource(poses=path.poses, intrinsics=path.intrinsics,
                            per_frame_intrinsics=bool(steering.per_frame_intrinsics or zoom),
                            label=str(steering.camera)), frames
    return CameraSource(), frames


def control_label(source: CameraSource, still: bool = False) -> str:
    """What steers a part, for the log line and the state's history (keys steer the camera too)."""
    if source.label:
        return source.label
    if source.kind == "none":
        return "none (the camera stands still)" if still else "none"
    return source.kind


def part_picture(part, source: CameraSource) -> Optional[PathPicture]:
    """The path a causal part follows, with its key timeline for keys (None: the part has no camera)."""
    if part.path is None:
        return None
    title = f"{source.label}: {part.keys.to_string()}" if part.keys is not None and not source.from_file else source.label
    return PathPicture(part.path, part.intrinsics, short(title or "camera"), part.keys)


# ---- the base models ---------------------------------------------------------------------------------------------
def model_kind(high: Path, low: Path) -> str:
    """'camera' or 'act' from the experts' weights (header reads only); refuses a Cam/Act mix."""
    from ..loaders.expert_format import check_control_pair, detect_format

    return check_control_pair(detect_format(high), detect_format(low))


def base_kind(steering: Steering, steps: Optional[int], high: Path, low: Path,
              log: logging.Logger) -> tuple[str, int]:
    """Model kind, mismatch checks and the model's defaults, before any expensive work. Returns (the kind, the
    steps: `steps`, else the kind's default)."""
    kind = model_kind(high, low)
    if steering.camera and steering.actions:
        raise ValueError("give either --camera (a trajectory) or --actions (keys), not both")
    if steering.camera:
        check_control(kind, CAMERA, ACT_FIX)
    if steps is None:
        steps = DEFAULT_STEPS[kind]
    if kind == ACT:
        log.info("Act model (7-channel control: ray directions + WASD keys, from the weights); %d steps", steps)
        if not steering.actions:
            log.warning("Act model without --actions: its control layers are skipped (plain image-to-video)")
    return kind, steps


def base_control(steering: Steering, precision: str, kind: str, frames: int, height: int, width: int,
                 log: logging.Logger) -> BaseControl:
    """The control of a base video: a trajectory or preset (Plücker), or keys (a camera path for Cam, the 7-channel
    tensor for Act); `frames` the video's frames without keys."""
    if steering.actions:
        return _key_control(steering.actions, steering.frames, precision, kind, height, width, log)
    spec = steering.camera
    if not spec:
        return BaseControl(None, frames)
    path, zoom = camera_path(spec, frames, steering.camera_speed)
    cond = camera_condition(path.poses, path.intrinsics, height, width, frames,
                            per_frame_intrinsics=steering.per_frame_intrinsics or zoom, precision=precision)
    return BaseControl(cond.plucker, cond.frames, note=cond.message,
                       picture=PathPicture(path.poses[:cond.frames], path.intrinsics, str(spec)))


def _key_control(spec: str, frames: Optional[int], precision: str, kind: str, height: int, width: int,
                 log: logging.Logger) -> BaseControl:
    """Keys `spec` (`frames`: the frames asked for): the Plücker tensor (Cam) or the Act tensor."""
    from ..loaders.action_files import read_key_source
    from .keys import KeyTimeline, has_act_files, keys_for_video, keys_to_camera, read_act_folder

    if kind == ACT and has_act_files(Path(spec).expanduser()):
        act = read_act_folder(spec)
        cond = act_condition(act.path.poses, act.path.intrinsics, act.actions, height, width,
                             frames or DEFAULT_FRAMES, precision=precision, actions_name=f"{spec}/action.npy")
        if cond.message:
            log.warning("actions: %s", cond.message)
        keys = KeyTimeline.from_arrays(wasd=act.actions[:cond.frames])  # the W/A/S/D channels as a timeline
        line = f"actions: {spec} (action.npy + poses.npy) -> {cond.frames} frames, {cond.latent_frames} latent"
        return BaseControl(cond.tensor, cond.frames, line=line, picture=PathPicture(
            cond.poses.numpy(), cond.intrinsics.numpy(), f"{act.label}: Act input (poses.npy + action.npy)", keys))

    src = read_key_source(spec)
    if frames is None and src.from_file:
        frames = DEFAULT_FRAMES  # key files are cut to the video (the release reads keys[:frame_num])
    keys, frames, note = keys_for_video(src.keys, frames, source=src.label, from_file=src.from_file)
    if note:
        log.warning("actions: %s", note)
    path, _ = keys_to_camera(keys, src.intrinsics)
    if kind == ACT:
        cond = act_condition(path.poses, path.intrinsics, keys.wasd, height, width, frames, includes_end_pose=True,
                             precision=precision, actions_name=src.label)
        tensor = cond.tensor
    else:
        cond = camera_condition(path.poses, path.intrinsics, height, width, frames, includes_end_pose=True,
                                precision=precision)
        tensor = cond.plucker
    line = (f"actions: {src.label} -> {src.keys.frames} frames of keys, video of {cond.frames} frames "
            f"({cond.latent_frames} latent), {'Act control' if kind == ACT else 'camera path'}")
    title = f"{src.label}: {keys.to_string()}" if not src.from_file else f"{src.label} ({keys.frames} frames)"
    return BaseControl(tensor, cond.frames, line=line,
                       picture=PathPicture(np.asarray(path.poses), path.intrinsics, short(title), keys))


# ---- pictures ----------------------------------------------------------------------------------------------------
def trajectory_picture(picture: PathPicture):
    """The path drawn (a PIL image), with the key timeline under it for keys."""
    from .cameras import plot_trajectory

    return plot_trajectory(picture.poses, picture.intrinsics, title=picture.title, keys=picture.keys)


def short(text: str, limit: int = 110) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."
