"""Every output target of a run, checked together before any work (`check_outputs`), and the pictures written.

One call with every file or folder a run will write (the video or PNG folder, the saved state, the whole video,
the trajectory picture, ...) and every file it reads. Refused with one line naming the flag, before the model,
the text encoder or the VAE start:
- a target that exists and is not a regular file (a folder, a link, a device, a pipe): it would not be replaced
  cleanly; a PNG-frame target is a folder and may be one (cli/video_out.plan_output checks what it holds);
- a folder that does not exist, is not a folder, or cannot be written (probed with a real file);
- two targets that are the same path, or one inside the other's folder (`--save-state X --out X`, `--out X
  --whole-video X`): one would overwrite the other;
- a target that is one of the inputs (or a folder target holding one): the run would destroy what it reads,
  unless the pair is declared replaceable (a continuation may save its state over the state it continues);
- less free space on a file system than the targets on it are estimated to take (the temp copy is written beside
  the old file before the rename, so the old file's size does not count as free).
The writers keep the rest of the promise (loaders/atomic.py): an interrupted or failed run never truncates or
replaces an existing output.
"""
from __future__ import annotations

import os
import shutil
import stat
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Iterable, Optional, Sequence, Union

from .errors import UsageError

if TYPE_CHECKING:
    from .requests import GenerateRequest

PathLike = Union[str, os.PathLike]
# Free space wanted beyond the estimates (file-system metadata, rounding): 2% and 256 kB.
SPACE_MARGIN_FRACTION = 0.02
SPACE_MARGIN_BYTES = 256 * 1024
# Bytes per pixel per frame, a generous bound of what each container takes (H.264 at CRF 10 of a real video is
# ~0.1-0.3; random-noise demo frames ~0.7), so a check never refuses a video that would fit.
VIDEO_BYTES_PER_PIXEL = {".mp4": 1.0, ".webm": 1.0, ".gif": 1.5, None: 3.2}


PICTURE_NEXT_TO_VIDEO = "next-to-video"  # --trajectory-picture without a file name
EXAMPLE_NAMES = {"--save-state": "video.state", "--trajectory-picture": "trajectory.png", "--timings": "timings.json"}


@dataclass(frozen=True)
class OutputSpec:
    """One target: the flag that names it (for the message), the path, the bytes it is estimated to take.

    folder: a folder target (PNG frames), which may exist as a folder. may_replace: input flags whose file this
    target may replace (a continuation saving its state over the state it read)."""

    flag: str
    path: PathLike
    estimate_bytes: int = 0
    folder: bool = False
    may_replace: tuple[str, ...] = field(default_factory=tuple)


def video_estimate(frames: int, height: int, width: int, container: Optional[str]) -> int:
    """A generous bound of a video's size on disk (container None: a folder of PNG frames)."""
    return int(frames * height * width * VIDEO_BYTES_PER_PIXEL.get(container, 3.2))


def _absolute(path: PathLike) -> Path:
    """The path as the writer will use it: user folder expanded, the parent's links resolved, the name kept (the
    target itself may be a link, which is refused, not followed)."""
    p = Path(path).expanduser()
    return p.parent.resolve() / p.name


def _inside(child: Path, folder: Path) -> bool:
    return child != folder and folder in child.parents


def _describe(st: os.stat_result) -> str:
    mode = st.st_mode
    if stat.S_ISDIR(mode):
        return "a folder"
    if stat.S_ISLNK(mode):
        return "a symbolic link"
    if stat.S_ISFIFO(mode):
        return "a pipe"
    if stat.S_ISSOCK(mode):
        return "a socket"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    return "not a regular file"


def _check_kind(spec: OutputSpec, path: Path) -> None:
    try:
        st = path.lstat()
    except FileNotFoundError:
        return
    except OSError as e:
        raise UsageError(f"{spec.flag} {path}: cannot be checked ({e.strerror or e}); choose another path") from None
    if stat.S_ISREG(st.st_mode) or (spec.folder and stat.S_ISDIR(st.st_mode)):
        return
    what = _describe(st)
    example = path / EXAMPLE_NAMES.get(spec.flag, "video.mp4")
    fix = f"give a file name inside it, e.g. {example}" if what == "a folder" \
        else "give the path of a regular file (it is replaced only when the run succeeds)"
    raise UsageError(f"{spec.flag} {path} is {what}, not a file; {fix}")


def check_folder(flag: str, path: Path, error: type = UsageError) -> None:
    """The folder `path` goes in exists and can be written (a real probe file), else `error` naming the flag."""
    folder = path.parent
    if not folder.exists():
        raise error(f"{flag} {path}: the folder {folder} does not exist; create it first or choose another path")
    if not folder.is_dir():
        raise error(f"{flag} {path}: {folder} is not a folder")
    try:
        fd, probe = tempfile.mkstemp(prefix=".lingbot-write-probe-", dir=folder)
    except OSError as e:
        raise error(f"{flag} {path}: cannot write in {folder} ({e.strerror or e}); choose a writable "
                    "folder") from None
    os.close(fd)
    os.unlink(probe)


def _same_file(a: Path, b: Path) -> bool:
    if a == b:
        return True
    try:
        return a.exists() and b.exists() and os.path.samefile(a, b)
    except OSError:
        return False


def _check_collisions(targets: Sequence[tuple[OutputSpec, Path]]) -> None:
    for i, (a, pa) in enumerate(targets):
        for b, pb in targets[i + 1:]:
            if _same_file(pa, pb):
                raise UsageError(f"{a.flag} and {b.flag} both name {pa}: one would overwrite the other; give each "
                                 "its own path")
            for outer, po, inner, pi in ((a, pa, b, pb), (b, pb, a, pa)):
                if outer.folder and _inside(pi, po):
                    raise UsageError(f"{inner.flag} {pi} is inside the folder {outer.flag} {po}, which is replaced "
                                     "as a whole; put it elsewhere")


def _check_inputs(targets: Sequence[tuple[OutputSpec, Path]], inputs: Iterable[tuple[str, PathLike]]) -> None:
    for in_flag, in_path in inputs:
        if in_path is None:
            continue
        pi = _absolute(in_path)
        for spec, po in targets:
            if in_flag in spec.may_replace:
                continue
            if _same_file(po, pi):
                raise UsageError(f"{spec.flag} {po} is also the input {in_flag}: the run would replace what it reads; "
                                 "give the output another name")
            if spec.folder and _inside(pi, po):
                raise UsageError(f"{spec.flag} {po} is a folder holding the input {in_flag} {pi}, and it is replaced "
                                 "as a whole; give the output another name")


def _check_space(targets: Sequence[tuple[OutputSpec, Path]]) -> None:
    by_device: dict[int, list[tuple[OutputSpec, Path]]] = {}
    for spec, path in targets:
        by_device.setdefault(os.stat(path.parent).st_dev, []).append((spec, path))
    for group in by_device.values():
        need = sum(max(0, int(s.estimate_bytes)) for s, _ in group)
        if need <= 0:
            continue
        folder = group[0][1].parent
        free = shutil.disk_usage(folder).free
        if need * (1 + SPACE_MARGIN_FRACTION) + SPACE_MARGIN_BYTES > free:
            flags = " + ".join(f"{s.flag} {_size(s.estimate_bytes)}" for s, _ in group if s.estimate_bytes > 0)
            raise UsageError(f"{group[0][0].flag} {group[0][1]}: not enough free space in {folder} ({_size(free)} "
                             f"free, the run writes about {_size(need)}: {flags}); free some space or choose "
                             "another folder")


def _size(n: float) -> str:
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{int(n)} B"


def check_outputs(specs: Sequence[OutputSpec], inputs: Iterable[tuple[str, PathLike]] = ()) -> list[Path]:
    """Check every target of a run before any work (see the module's docstring); returns their absolute paths.
    Raises UsageError with one line naming the flag. `inputs`: (flag, path) of every file the run reads."""
    targets = [(spec, _absolute(spec.path)) for spec in specs]
    _check_collisions(targets)  # what the flags say first, then what the disk says
    _check_inputs(targets, list(inputs))
    for spec, path in targets:
        check_folder(spec.flag, path)
        _check_kind(spec, path)
    _check_space(targets)
    return [p for _, p in targets]


# ---- `generate`'s targets and inputs ------------------------------------------------------------------------------
def video_spec(flag: str, target, frames: int, height: int, width: int) -> OutputSpec:
    """An OutputSpec for a planned video (cli/video_out.OutputTarget: a container file or a PNG folder)."""
    return OutputSpec(flag, target.path, video_estimate(frames, height, width, target.container),
                      folder=target.container is None)


def picture_spec(picture: Optional[str], video_path: PathLike) -> list[OutputSpec]:
    """--trajectory-picture's target (`picture`: the flag's value; next to the video by default), or nothing."""
    path = picture_path(picture, Path(video_path))
    return [] if path is None else [OutputSpec("--trajectory-picture", path, 2 * 1024**2)]


def generate_inputs(request: "GenerateRequest", files=None) -> list[tuple[str, PathLike]]:
    """(flag, path) of every file `generate` reads: the image, key/trajectory files, LoRAs, a state to continue, the
    model files (`files`: the checkpoint's, when found)."""
    from ..world.controls import input_file
    from .checks import parse_spec

    found = []
    for flag in ("--image", "--continue-from", "--camera", "--actions"):
        value = getattr(request, flag.lstrip("-").replace("-", "_"))
        if value and input_file(value) is not None:  # an action string is no file name, however long
            found.append((flag, value))
    for flag in ("--lora", "--lora-high", "--lora-low"):
        for spec in getattr(request, flag.lstrip("-").replace("-", "_")):
            found.append((flag, parse_spec(spec, flag)[0]))
    for name in ("high", "low", "dit", "t5", "vae", "tokenizer"):
        value = getattr(files, name, None) if files is not None else None
        if value is not None:
            found.append((f"the model file ({name})", value))
    return found


def check_targets(request: "GenerateRequest", target, frames: int, height: int, width: int, *, save=None, whole=None,
                  whole_frames: int = 0, files=None) -> None:
    """Every output of a causal part, checked together before anything is written: `target` the part's video
    (cli/video_out.OutputTarget), `save` the --save-state target (world/saving.StateTarget), `whole` the
    --whole-video target of a continuation (`whole_frames` long)."""
    specs = [video_spec("--out", target, frames, height, width)]
    if whole is not None:
        specs.append(video_spec("--whole-video", whole, whole_frames, height, width))
    if save is not None:
        specs.append(OutputSpec("--save-state", save.path, save.estimate, may_replace=("--continue-from",)))
    specs += picture_spec(request.trajectory_picture, picture_video(request, target))
    check_outputs(specs, inputs=generate_inputs(request, files))


def picture_video(request: "GenerateRequest", target) -> Path:
    """The video --trajectory-picture goes next to: --out as given, else the planned target's path."""
    return Path(request.out) if request.out is not None else target.path


# ---- the trajectory picture ---------------------------------------------------------------------------------------
def picture_path(picture: Optional[str], video: Optional[Path] = None) -> Optional[Path]:
    """--trajectory-picture's file (`picture`: the flag's value): the name given, or `<video>_trajectory.png` next
    to the video (without one, a timestamped name in the current folder)."""
    import time

    if picture is None:
        return None
    if picture != PICTURE_NEXT_TO_VIDEO:
        return Path(picture).expanduser()
    out = video or Path(f"lingbot_{time.strftime('%Y%m%d_%H%M%S')}.mp4")
    return out.with_name(out.stem + "_trajectory.png")


def write_picture(target: Optional[Path], picture) -> Optional[Path]:
    """The path a video follows (a world.controls.PathPicture) drawn at `target` (picture_path's), atomically (the
    folder was checked with every output); nothing without a target or a path."""
    if target is None or picture is None:
        return None
    from ..loaders.atomic import atomic_path
    from ..world.controls import trajectory_picture

    image = trajectory_picture(picture)
    with atomic_path(target) as tmp:
        image.save(tmp, format="PNG")
    return target
