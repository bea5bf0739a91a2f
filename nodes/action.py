"""The LingBot Actions node: steer with keys. An action string or key files -> camera control for the Cam and Fast
models (act-to-camera) and Act control for the Act model, with a picture of the path and its key timeline."""
from __future__ import annotations

import logging
from pathlib import Path
from typing import Optional

import numpy as np
import torch

from ..world.cameras import image_to_tensor, plot_trajectory, usable_frames
from ..world.keys import (ACT_FILE, GRAMMAR, IJKL_FILE, WASD_FILE, ActFiles, KeySource, KeyTimeline, check_act_keys,
                          has_act_files, keys_for_video, keys_to_camera, read_act_folder, read_key_files)
from .adapters import comfy_paths
from .adapters.payloads import ACT, CAMERA, CATEGORY, ActInput, CameraInput
from .adapters.progress import show_on_node
from .adapters.ui_hints import short_labels, show_if

log = logging.getLogger(__name__)

MAX_FRAMES = 1601
FILE_FRAMES = 81  # key files with frames = 0: the first 81 frames (the release reads keys[:frame_num])
EXAMPLE = "w-10,a-10,d-10,iw-15,none-10,j-10,l-10,s-15"
PICTURE_SIZE = (960, 480)
ACTION_STRING = "(action string)"  # key_files: use the action string
CUSTOM_PATH = "(custom path)"  # key_files: use the path below
FPS = 16


def _picture(poses: np.ndarray, intrinsics: np.ndarray, keys: KeyTimeline, title: str) -> torch.Tensor:
    return image_to_tensor(plot_trajectory(poses, intrinsics, title=title, size=PICTURE_SIZE, keys=keys))


def _short(text: str, limit: int = 100) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _mtimes(path: Path) -> str:
    files = [path] if path.is_file() else [path / n for n in (WASD_FILE, IJKL_FILE, ACT_FILE, "poses.npy", "intrinsics.npy")]
    out = []
    for f in files:
        try:
            out.append(f"{f.name}:{f.stat().st_mtime_ns}")
        except OSError:
            out.append(f"{f.name}:missing")
    return "|".join(out)


def read_sources(path: Path) -> tuple[Optional[KeySource], Optional[ActFiles]]:
    """Key files and/or the Act files (action.npy + poses.npy + intrinsics.npy) at `path`; at least one."""
    act = read_act_folder(path) if has_act_files(path) else None
    has_keys = path.is_file() or (path.is_dir() and ((path / WASD_FILE).is_file() or (path / IJKL_FILE).is_file()))
    if act is not None and not has_keys:
        return None, act
    return read_key_files(path), act  # raises the clear "no key files" error when neither is there


class LingBotActions:
    """Keys per frame from an action string or key files, for every LingBot-World model."""

    @classmethod
    def INPUT_TYPES(cls):
        folders = comfy_paths.list_key_folders()
        return {
            "required": {
                "key_files": ([ACTION_STRING] + folders + [CUSTOM_PATH], {
                    "default": ACTION_STRING, **short_labels(), "tooltip": (
                        "Where the keys come from. (action string): the string below. A folder under ComfyUI/input "
                        "like the release's examples (lingbot_examples/05 is the release's Act example): "
                        "wasd_action.npy / ijkl_action.npy ([N,4] keys w,a,s,d / i,j,k,l, pressed > 0.5) for the "
                        "camera output, action.npy + poses.npy + intrinsics.npy for the act output (the Act model's "
                        "own input). (custom path): the path below.")}),
                "actions": ("STRING", {"default": EXAMPLE, **show_if(key_files=[ACTION_STRING]), "tooltip": (
                    f"Keys per frame: {GRAMMAR}. Full-width commas and spaces are fine. The example walks forward, "
                    "left, right, forward while looking up, stands, turns left and right, walks back: 90 frames, "
                    "padded to 93.")}),
                "frames": ("INT", {"default": 0, "min": 0, "max": MAX_FRAMES, "tooltip": (
                    "Video frames (4n+1). 0 = as long as the action string (padded with frames without keys to "
                    f"4n+1), or the first {FILE_FRAMES} frames of key files. A longer video pads the string with "
                    "frames without keys; key files are cut to it. The node shows the frames it used.")}),
            },
            "optional": {
                "path": ("STRING", {"default": "", **show_if(key_files=[CUSTOM_PATH]), "tooltip": (
                    "key_files = custom path only: a folder with those files, or one [N,4] .npy key file "
                    "(ijkl*.npy = turning keys, else w,a,s,d); absolute, or relative to ComfyUI/input.")}),
            },
        }

    RETURN_TYPES = (CAMERA, ACT, "IMAGE", "INT")
    RETURN_NAMES = ("camera", "act", "trajectory", "frames")
    OUTPUT_TOOLTIPS = (
        "For Cam and Fast models: the keys walked into a camera path (LingBot Sampler's camera input)",
        "For the Act model: ray directions + WASD keys (LingBot Sampler's act input)",
        "The camera path (top and side views) with the key timeline under it; a second picture for the Act files",
        "Frame count of the video the keys cover: connect it to LingBot Image To Video's frames",
    )
    FUNCTION = "build"
    CATEGORY = CATEGORY
    DESCRIPTION = ("Steer the world with keys (W A S D move, I K look up/down, J L turn): camera control for Cam/Fast "
                   "models, Act control for the Act model, and a picture of the path.")

    @staticmethod
    def _source(key_files: str, path: str) -> Optional[Path]:
        """The key files' folder or file, or None for the action string."""
        if key_files in (ACTION_STRING, "", None):
            return None
        if key_files == CUSTOM_PATH:
            return comfy_paths.resolve_input_path(path, "key files (key_files = custom path)")
        return comfy_paths.resolve_key_folder(key_files)

    @classmethod
    def IS_CHANGED(cls, actions: str = EXAMPLE, frames: int = 0, key_files: str = ACTION_STRING, path: str = ""):
        try:
            source = cls._source(key_files, path)
        except (OSError, ValueError) as e:
            return f"missing: {e}"  # build() reports it
        if source is None:
            return f"{actions}|{frames}"
        return f"{frames}|{_mtimes(source)}"

    def build(self, actions: str = EXAMPLE, frames: int = 0, key_files: str = ACTION_STRING, path: str = ""):
        want = int(frames) or None
        act_files = None
        source = self._source(key_files, path)
        if source is not None:
            src, act_files = read_sources(source)
        else:
            src = KeySource(KeyTimeline.from_string(actions), "action string", False)
        lines = []

        pictures = []
        if src is not None:
            keys, frames_out, note = keys_for_video(src.keys, want or (FILE_FRAMES if src.from_file else None),
                                                    source=src.label, from_file=src.from_file)
            if note:
                log.info("LingBot-World actions: %s", note)
            walk, _ = keys_to_camera(keys, src.intrinsics)
            label = _short(src.label if src.from_file else keys.to_string())
            given = keys[:min(src.keys.frames, keys.frames)]  # the keys as written, without the 4n+1 padding
            camera = CameraInput(walk.poses, walk.intrinsics, label=label, includes_end_pose=True, keys=given)
            act = ActInput(walk.poses, walk.intrinsics, keys.wasd, label=label, includes_end_pose=True)
            pictures.append(_picture(walk.poses, walk.intrinsics, keys, f"{label} - {frames_out} frames"))
            lines.append(f"{_short(label, 60)}: {frames_out} frames ({frames_out / FPS:.1f} s at {FPS} fps)")
            lines += [note] if note else []
        if act_files is not None:
            acts = check_act_keys(act_files.actions, str(source / ACT_FILE))
            n = min(act_files.path.poses.shape[0], acts.shape[0])
            act_frames, note = usable_frames(n, want or (frames_out if src is not None else FILE_FRAMES))
            if note:
                log.info("LingBot-World actions: %s", note)
            label = f"{act_files.label}: poses.npy + action.npy"
            act = ActInput(act_files.path.poses, act_files.path.intrinsics, acts, label=label)
            if src is None:  # no key files: the recorded poses are the camera path, as in the release
                camera = CameraInput(act_files.path.poses, act_files.path.intrinsics, label=f"{act_files.label} poses.npy")
                frames_out = act_frames
            timeline = KeyTimeline.from_arrays(wasd=acts[:act_frames])
            pictures.append(_picture(act_files.path.poses[:act_frames], act_files.path.intrinsics, timeline,
                                     f"act output: {label} - {act_frames} frames"))
            lines.append(f"act output: {label}, {act_frames} frames")
            lines += [note] if note else []
        show_on_node("\n".join(lines))
        return (camera, act, torch.cat(pictures), frames_out)
