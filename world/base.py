"""`generate`'s pre-flight: every check that costs seconds, run before any that costs minutes.

Order: flag values (no I/O) -> device and noise source -> output path -> image decode -> checkpoint files
(headers, sizes, keys; the demo checkpoint is built first when asked for) -> the video's memory floor
-> camera. Each problem is one UsageError / ValueError / FileNotFoundError line naming the flag or file,
the value and what to use (exit code 2); nothing has been loaded or started yet when it is raised.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import torch

from . import actions_arg
from .errors import UsageError
from .flag_checks import check_generate_flags
from .generate_request import GenerateRequest
from .outputs import check_outputs, generate_inputs, picture_spec, video_spec
from .speed_flags import log_speed_plan, speed_plan
from .video_out import OutputTarget, plan_output

_DEVICE = re.compile(r"(cpu|cuda)(?::(\d+))?")


def check_flags(request: GenerateRequest) -> None:
    """Values that are wrong whatever the machine (no I/O); the flags' ranges are cli/flag_checks.py's."""
    from ..wan.sizes import check_frames, max_area_for

    check_generate_flags(request)
    if len(request.guide_scale) > 2:
        raise UsageError(f"--guide-scale takes one value or two (LOW HIGH), got {len(request.guide_scale)}")
    try:
        if request.frames is not None:  # None: 81, or as long as --actions
            check_frames(request.frames)
        max_area_for(request.size)
    except ValueError as e:
        flag = "--frames" if "frame" in str(e) else "--size"
        raise UsageError(f"{flag}: {e}") from None
    if request.image is None or request.prompt is None:
        raise UsageError("--image and --prompt are required (or use --demo)")
    if request.demo and request.ckpt_dir is not None:
        raise UsageError("--demo and --ckpt-dir exclude each other: the demo uses its own tiny checkpoint")


def resolve_device(name: str, flag: str = "--device") -> torch.device:
    """auto | cpu | cuda | cuda:N -> a device that exists here (UsageError otherwise)."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    m = _DEVICE.fullmatch(name.strip().lower())
    if m is None:
        raise UsageError(f"{flag} {name!r}: use auto, cpu, cuda or cuda:N")
    if m.group(1) == "cpu":
        if m.group(2) is not None:
            raise UsageError(f"{flag} {name!r}: the CPU has no index; use cpu")
        return torch.device("cpu")
    if not torch.cuda.is_available():
        raise UsageError(f"{flag} {name}: no CUDA GPU is available here; use {flag} cpu")
    index = int(m.group(2)) if m.group(2) is not None else None
    if index is not None and index >= torch.cuda.device_count():
        raise UsageError(f"{flag} {name}: this machine has {torch.cuda.device_count()} GPU(s), cuda:0 .. "
                         f"cuda:{torch.cuda.device_count() - 1}")
    return torch.device("cuda", index) if index is not None else torch.device("cuda")


def noise_source(choice: str, device: torch.device) -> str:
    if choice == "auto":
        return "cuda" if device.type == "cuda" else "cpu"
    if choice == "cuda" and not torch.cuda.is_available():
        raise UsageError("--noise cuda needs a CUDA GPU (it reproduces the reference's GPU noise); use --noise cpu")
    return choice


def check_t5_device(choice: str) -> None:
    if choice == "cuda" and not torch.cuda.is_available():
        raise UsageError("--t5-device cuda: no CUDA GPU is available here; use --t5-device cpu or auto")


def default_output_name(prompt: str) -> Path:
    import time

    stem = "".join(c if c.isalnum() else "_" for c in prompt[:50]).strip("_") or "video"
    return Path(f"lingbot_{stem}_{time.strftime('%Y%m%d_%H%M%S')}.mp4")


def total_ram_bytes() -> int:
    import psutil

    return int(psutil.virtual_memory().total)


def total_vram_bytes(device: torch.device) -> Optional[int]:
    if device.type != "cuda":
        return None
    index = device.index if device.index is not None else torch.cuda.current_device()
    return int(torch.cuda.get_device_properties(index).total_memory)


@dataclass
class Prepared:
    """What the pre-flight found; the run uses it as is."""

    device: torch.device
    noise: str
    output: OutputTarget
    image: torch.Tensor  # [3, H, W] in [-1, 1]
    files: object  # loaders.checkpoint_dir.CheckpointFiles
    vae_config: object  # None for a real checkpoint
    height: int
    width: int
    frames: int
    camera: Optional[torch.Tensor]  # packed Plücker input or None
    camera_note: Optional[str]
    speed: object  # speed.options.SpeedPlan: compile / compute / attention for this device
    loras: object  # cli.lora_run: the --lora files read and matched against the experts (or empty)
    steps: int  # --steps, else the model kind's default (cli/actions_arg.DEFAULT_STEPS)
    num_heads: int = 40  # attention heads of the experts (how far a sequence split can go)


def prepare(request: GenerateRequest, log) -> Prepared:
    """Run every check; returns what the run needs. Builds the demo checkpoint when --demo asks for it."""
    from ..loaders.checkpoint_check import check_checkpoint
    from ..loaders.demo_checkpoint import demo_vae_config
    from ..loaders.image_files import load_image
    from ..memory.bounds import check_video_fits
    from ..memory.placement import read_expert_config
    from .lora_run import read_cli_loras
    from ..wan.sizes import check_frames, max_area_for, target_size

    check_flags(request)
    device = resolve_device(request.device)
    noise = noise_source(request.noise, device)
    check_t5_device(request.t5_device)
    speed = speed_plan(request.speed_flags, device)  # refuses an impossible --compile/--compute/--attention first
    output = plan_output(request.out if request.out is not None else default_output_name(request.prompt))

    decoded = load_image(request.image)
    for note in decoded.notes:
        log.info("image %s: %s", request.image, note)

    files = _files(request)
    # Cam or Act, from the weights (refuses mismatches), and the kind's default steps
    kind, steps = actions_arg.prepare(request.camera, request.actions, request.steps, files.high, files.low, log)
    _warn_if_not_base(files, log)
    loras = read_cli_loras(request.loras, read_expert_config(files.high))  # a bad LoRA stops here, before any work
    vae_config = demo_vae_config(files.root)
    checked = check_checkpoint(files, vae_config)

    height, width = target_size(decoded.size[0], decoded.size[1], max_area_for(request.size))
    frames = check_frames(request.frames or actions_arg.DEFAULT_FRAMES)
    check_video_fits(frames, height, width, checked.high.config, total_ram=total_ram_bytes(),
                     total_vram=total_vram_bytes(device), camera=bool(request.camera or request.actions),
                     what=f"--frames {frames} --size {request.size}")
    check_outputs([video_spec("--out", output, frames, height, width),
                   *picture_spec(request.trajectory_picture, output.path)], inputs=generate_inputs(request, files))
    # the picture goes next to the video actually written (--out as given, else the planned name)
    picture = actions_arg.picture_path(request.trajectory_picture,
                                       Path(request.out) if request.out is not None else output.path)
    camera, note, frames = _camera(request, kind, frames, height, width, log, picture)
    log_speed_plan(speed, log)
    return Prepared(device, noise, output, decoded.pixels, files, vae_config, height, width, frames, camera, note,
                    speed, loras, steps, checked.high.config.num_heads)


def _files(request: GenerateRequest):
    from ..loaders.checkpoint_dir import CheckpointFiles, find_checkpoint_files
    from ..loaders.demo_checkpoint import build_demo_checkpoint

    if request.demo:
        files = build_demo_checkpoint(request.demo_dir, control=request.demo)
    elif request.ckpt_dir is not None:
        files = find_checkpoint_files(request.ckpt_dir)
    else:
        missing = ["--" + n for n in ("high", "low", "t5", "vae") if getattr(request, n) is None]
        if missing:
            raise UsageError(f"give --ckpt-dir (or --demo), or all of --high --low --t5 --vae (missing: "
                             f"{' '.join(missing)})")
        return CheckpointFiles(Path("."), request.high, request.low, request.t5, request.vae, request.tokenizer)
    for n in ("high", "low", "t5", "vae", "tokenizer"):
        if getattr(request, n) is not None:
            setattr(files, n, getattr(request, n))
    return files


def camera_path(spec: str, frames: int, speed: float):
    """(CameraPath, follows per-frame intrinsics) of --camera: a trajectory folder / poses.npy, or a preset name
    ('+'-combinations allowed). Zoom lives in the intrinsics, so zoom presets follow them per frame (as the camera
    preset node does)."""
    from ..loaders.action_files import path_exists
    from ..loaders.camera_files import CameraFileNotFoundError, load_camera
    from ..wan.control.camera_presets import PRESETS, parse_preset, preset_camera

    if path_exists(spec):
        return load_camera(Path(spec).expanduser()), False
    if _names_a_path(spec):  # a typo in a folder's name is not an unknown preset
        raise CameraFileNotFoundError(f"--camera {spec}: no such folder; give a trajectory folder holding "
                                      f"poses.npy and intrinsics.npy, or a preset such as dolly_in")
    return preset_camera(spec, frames=frames, speed=speed), any(PRESETS[n].zoom for n in parse_preset(spec))


def _names_a_path(spec: str) -> bool:
    """A --camera value written as a path (presets are plain names)."""
    s = spec.strip()
    return "/" in s or "\\" in s or s.startswith((".", "~")) or s.endswith(".npy")


def _camera(request: GenerateRequest, kind: str, frames: int, height: int, width: int, log,
            picture: Optional[Path]):
    """(packed control input or None, note for the log, frames the control covers): a trajectory or preset
    (--camera, Plücker) or keys (--actions: a camera path for Cam, the 7-channel tensor for Act); the path's
    picture goes to `picture` (--trajectory-picture's file, or None)."""
    from ..wan.control.camera import camera_condition

    if request.actions:
        frames, tensor = actions_arg.control(request.actions, request.frames, request.camera_precision, kind, height,
                                             width, log, picture=picture, quiet=request.quiet)
        return tensor, None, frames
    spec = request.camera
    if not spec:
        return None, None, frames
    path, zoom = camera_path(spec, frames, request.camera_speed)
    cond = camera_condition(path.poses, path.intrinsics, height, width, frames,
                            per_frame_intrinsics=request.per_frame_intrinsics or zoom,
                            precision=request.camera_precision)
    actions_arg.write_trajectory_picture(picture, path.poses[:cond.frames], path.intrinsics, str(spec))
    return cond.plucker, cond.message, cond.frames


def _warn_if_not_base(files, log) -> None:
    """The base path's note when a high/low-noise expert is the Fast model (headers only)."""
    from ..loaders.expert_format import check_model_kind, detect_format

    for path in (files.high, files.low):
        note = check_model_kind(detect_format(path), "base")
        if note:
            log.warning("%s", note)
