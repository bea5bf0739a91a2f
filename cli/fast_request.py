"""The Fast model's pre-flight (`generate --model fast`, first part or `--continue-from`): the same bar as the base
model's cli/preflight.py. Each check is one line naming the flag (exit code 2), before the model, the text encoder
or the VAE start:
- `check_flags(request)`, first thing (no I/O; the typed request, cli/generate_request.py): the flags that do not apply to the Fast model or to a continuation,
  every number's range (cli/flag_checks.py), the action string, LoRA strengths, the size and frame count;
- `check_video_fits(...)`, once the video's size is known: the per-frame tensors a run holds against the RAM;
- `check_targets(...)`, once the part is planned and before anything is written: every output (the video or PNG
  folder, the saved state with its estimated size, the whole video of a continuation, the trajectory picture)
  against the others, the inputs and the free space (cli/outputs.py).
"""
from __future__ import annotations

from pathlib import Path
from typing import Optional

from .errors import UsageError
from .generate_request import GenerateRequest
from .flag_checks import check_generate_flags
from .outputs import OutputSpec, check_outputs, generate_inputs, picture_spec, video_spec

DEFAULT_FRAMES = 81  # the release's default, and what key files are cut to
# Host bytes per pixel per frame a Fast run holds for the whole part, at least: the packed camera input (384 fp32
# channels per 4 frames x 8x8 pixels: 6), the latents and the conditioning (~1); a video decoded at the end
# (--stream-decode off) holds the decoded frames and their uint8 copy too (27).
CAMERA_BYTES_PER_PIXEL_FRAME = 6
LATENT_BYTES_PER_PIXEL_FRAME = 1
DECODED_BYTES_PER_PIXEL_FRAME = 27


def check_flags(request: GenerateRequest) -> None:
    """Everything about the flags that needs no file: called before the demo defaults, the parallel session or any
    import of the model's modules."""
    from ..wan.sizes import check_frames, max_area_for

    check_generate_flags(request)
    try:
        if request.frames is not None:
            check_frames(request.frames)
    except ValueError as e:
        raise UsageError(f"--frames: {e}") from None
    if request.continue_from is None:
        try:
            max_area_for(request.size)
        except ValueError as e:
            raise UsageError(f"--size: {e}") from None


def requested_frames(request: GenerateRequest) -> int:
    """The frames the flags ask for before any file is read: --frames, an action string's length (4n+1), else 81."""
    from ..loaders.action_files import action_string_of
    from ..wan.control.actions import parse_action_string, pad_to_4n1

    if request.frames is not None:
        return int(request.frames)
    text = action_string_of(request.actions) if request.actions else None
    if text is not None:
        return pad_to_4n1(sum(seg.frames for seg in parse_action_string(text)))
    return DEFAULT_FRAMES


def check_video_fits(request: GenerateRequest, height: int, width: int, frames: Optional[int] = None,
                     total_ram: Optional[int] = None) -> None:
    """Refuse a video whose per-frame tensors alone exceed this machine's RAM (instead of an allocation that fails
    after the model has loaded, or runs for minutes)."""
    from .preflight import total_ram_bytes

    frames = requested_frames(request) if frames is None else frames
    per_pixel = LATENT_BYTES_PER_PIXEL_FRAME
    if request.camera or request.actions:
        per_pixel += CAMERA_BYTES_PER_PIXEL_FRAME
    if request.stream_decode == "off":
        per_pixel += DECODED_BYTES_PER_PIXEL_FRAME
    need = frames * height * width * per_pixel
    total = total_ram_bytes() if total_ram is None else total_ram
    if need > total:
        raise UsageError(f"--frames {frames} at {width}x{height} needs at least {need / 2**30:.1f} GiB of RAM "
                         f"({per_pixel} bytes per pixel per frame for the camera input and the latents"
                         + (" and the frames decoded at the end" if per_pixel > 7 else "")
                         + f"), more than this machine's {total / 2**30:.1f} GiB; use fewer frames or a smaller size")


def check_targets(request: GenerateRequest, target, frames: int, height: int, width: int, *, save=None, whole=None,
                  whole_frames: int = 0, files=None) -> None:
    """Every output of the part, checked together before anything is written (cli/outputs.py): `target` the
    part's video (cli/video_out.OutputTarget), `save` the --save-state plan (cli/fast_parts.SaveState), `whole` the
    --whole-video target of a continuation (`whole_frames` long)."""
    specs = [video_spec("--out", target, frames, height, width)]
    if whole is not None:
        specs.append(video_spec("--whole-video", whole, whole_frames, height, width))
    if save is not None:
        specs.append(OutputSpec("--save-state", save.path, save.estimate, may_replace=("--continue-from",)))
    specs += picture_spec(request.trajectory_picture, picture_video(request, target))
    check_outputs(specs, inputs=generate_inputs(request, files))


def picture_video(request: GenerateRequest, target) -> Path:
    """The video --trajectory-picture goes next to: --out as given, else the planned target's path."""
    return Path(request.out) if request.out is not None else target.path
