"""`generate`'s key options: `--actions` (action string or key files) for every model, the Act model's defaults,
`--trajectory-picture` and `--camera-precision`. generate.py calls `prepare` once the checkpoint is known and
`control` once the video size is known; everything raises ValueError subclasses with one line (exit code 2).

- Cam / Fast model: keys -> camera path (act-to-camera, fast-act spec §7) -> Plücker tensor.
- Act model: a folder with action.npy + poses.npy + intrinsics.npy (the release's Act input), or keys: the key
  path gives the orientation, the W/A/S/D keys the action channels (fast-act spec §6).
"""
from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Optional

import numpy as np
import torch

from ..wan.control.camera import DEFAULT_POSE_PRECISION, POSE_PRECISIONS
from ..wan.control.control_kind import ACT, CAMERA, check_control

DEFAULT_STEPS = {CAMERA: 70, ACT: 20}  # Act: the release's README runs 20 steps
DEFAULT_FRAMES = 81
PICTURE_NEXT_TO_VIDEO = "next-to-video"
ACT_FIX = ("give it keys with --actions: an action string such as 'w-10,a-10,iw-15', or a folder with action.npy, "
           "poses.npy and intrinsics.npy like the release's examples/05")


def add_arguments(parser) -> None:
    g = parser.add_argument_group(
        "keys and actions", "steer with keys: every model takes --actions (the Act model needs it for its control)")
    g.add_argument("--actions", default=None, metavar="KEYS_OR_PATH",
                   help="an action string, e.g. 'w-10,a-10,d-10,iw-15,none-10' (KEYS-FRAMES segments; keys w a s d move, "
                        "i k look up/down, j l turn; 'none' = no key; padded to 4n+1 frames), or key files: a folder "
                        "with wasd_action.npy / ijkl_action.npy (Cam, Fast) or action.npy + poses.npy (Act), or one "
                        "[N, 4] .npy key file. Without --frames the video is as long as the keys.")
    g.add_argument("--trajectory-picture", nargs="?", const=PICTURE_NEXT_TO_VIDEO, default=None, type=str,
                   metavar="PNG", help="write a picture of the camera path (with the key timeline for --actions); "
                   "without a file name it goes next to the video")
    g.add_argument("--camera-precision", choices=POSE_PRECISIONS, default=DEFAULT_POSE_PRECISION,
                   help="arithmetic of the relative camera poses: float32 reproduces the reference (default), "
                        "float64 is exact (differs from the reference's float32 noise far from the world origin)")


def model_kind(high: Path, low: Path) -> str:
    """'camera' or 'act' from the experts' weights (header reads only); refuses a Cam/Act mix."""
    from ..loaders.expert_format import check_control_pair, detect_format

    return check_control_pair(detect_format(high), detect_format(low))


def prepare(camera: Optional[str], actions: Optional[str], steps: Optional[int], high: Path, low: Path,
            log: logging.Logger) -> tuple[str, int]:
    """Model kind, mismatch checks and the model's defaults, before any expensive work. Returns (the kind, the
    steps: --steps, else the kind's default)."""
    kind = model_kind(high, low)
    if camera and actions:
        raise ValueError("give either --camera (a trajectory) or --actions (keys), not both")
    if camera:
        check_control(kind, CAMERA, ACT_FIX)
    if steps is None:
        steps = DEFAULT_STEPS[kind]
    if kind == ACT:
        log.info("Act model (7-channel control: ray directions + WASD keys, from the weights); %d steps", steps)
        if not actions:
            log.warning("Act model without --actions: its control layers are skipped (plain image-to-video)")
    return kind, steps


def _write_picture(image, target: Path) -> Path:
    from ..loaders.atomic import atomic_path

    with atomic_path(target) as tmp:  # the folder was checked with every output (cli/outputs.py)
        image.save(tmp, format="PNG")
    return target


def picture_path(picture: Optional[str], video: Optional[Path] = None) -> Optional[Path]:
    """--trajectory-picture's file (`picture`: the flag's value): the name given, or `<video>_trajectory.png` next
    to the video (without one, a timestamped name in the current folder)."""
    if picture is None:
        return None
    if picture != PICTURE_NEXT_TO_VIDEO:
        return Path(picture).expanduser()
    out = video or Path(f"lingbot_{time.strftime('%Y%m%d_%H%M%S')}.mp4")
    return out.with_name(out.stem + "_trajectory.png")


def write_trajectory_picture(target: Optional[Path], poses, intrinsics, title: str, keys=None) -> Optional[Path]:
    """The path picture (key timeline under it for keys) at `target` (picture_path's), or nothing without one."""
    if target is None:
        return None
    from ..wan.control.trajectory_plot import plot_trajectory

    return _write_picture(plot_trajectory(poses, intrinsics, title=title, keys=keys), target)


def control(spec: str, frames: Optional[int], precision: str, kind: str, height: int, width: int,
            log: logging.Logger, *, picture: Optional[Path] = None, quiet: bool = False) -> tuple[int, torch.Tensor]:
    """(frames, control tensor) for --actions `spec` (--frames `frames`, --camera-precision `precision`): the
    Plücker tensor (Cam/Fast) or the Act tensor; the path picture goes to `picture` (picture_path's)."""
    from ..loaders.action_files import has_act_files, read_act_folder, read_key_source
    from ..wan.control.act_control import act_condition
    from ..wan.control.act_to_camera import keys_to_camera
    from ..wan.control.actions import keys_for_video
    from ..wan.control.camera import camera_condition

    if kind == ACT and has_act_files(Path(spec).expanduser()):
        act = read_act_folder(spec)
        cond = act_condition(act.path.poses, act.path.intrinsics, act.actions, height, width,
                             frames or DEFAULT_FRAMES, precision=precision, actions_name=f"{spec}/action.npy")
        if cond.message:
            log.warning("actions: %s", cond.message)
        _say(quiet, f"actions: {spec} (action.npy + poses.npy) -> {cond.frames} frames, {cond.latent_frames} latent")
        from ..wan.control.actions import KeyTimeline

        keys = KeyTimeline.from_arrays(wasd=act.actions[:cond.frames])  # the W/A/S/D channels as a timeline
        write_trajectory_picture(picture, cond.poses.numpy(), cond.intrinsics.numpy(), f"{act.label}: Act input "
                                 f"(poses.npy + action.npy)", keys=keys)
        return cond.frames, cond.tensor

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
    _say(quiet, f"actions: {src.label} -> {src.keys.frames} frames of keys, video of {cond.frames} frames "
               f"({cond.latent_frames} latent), {'Act control' if kind == ACT else 'camera path'}")
    title = f"{src.label}: {keys.to_string()}" if not src.from_file else f"{src.label} ({keys.frames} frames)"
    write_trajectory_picture(picture, np.asarray(path.poses), path.intrinsics, _short(title), keys=keys)
    return cond.frames, tensor


def _say(quiet: bool, line: str) -> None:
    if not quiet:
        print(line, flush=True)


def _short(text: str, limit: int = 110) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."
