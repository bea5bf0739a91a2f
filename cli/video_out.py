"""Video output: the target is checked before the run (`plan_output`) and written atomically (`write_video`).

.mp4 (H.264), .webm (VP9) and .gif go through the ffmpeg binary of imageio-ffmpeg (optional: `pip install
.[video]`); a path without an extension is a folder of PNG frames. The video is encoded into a temp file
beside the target; ffmpeg's exit status and the frame count read back from that file are checked before it
is renamed over the target, so a failed or interrupted write never leaves a truncated video under the
final name (nor clobbers the previous one), and success is reported only for a file that exists.
"""
from __future__ import annotations

import logging
import os
import re
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import numpy as np
import torch

from ..loaders.atomic import atomic_dir, atomic_path

log = logging.getLogger(__name__)

# container -> ffmpeg output arguments (after the raw RGB input)
FFMPEG_ARGS = {
    ".mp4": ["-c:v", "libx264", "-pix_fmt", "yuv420p", "-crf", "10", "-movflags", "+faststart", "-f", "mp4"],
    ".webm": ["-c:v", "libvpx-vp9", "-pix_fmt", "yuv420p", "-crf", "24", "-b:v", "0", "-row-mt", "1",
              "-deadline", "good", "-cpu-used", "4", "-f", "webm"],
    ".gif": ["-vf", "split[a][b];[a]palettegen=stats_mode=diff[p];[b][p]paletteuse", "-loop", "0", "-f", "gif"],
}
FRAME_NAME = "frame_{:04d}.png"
_FRAME_FILE = re.compile(r"^frame_\d{4,}\.png$")


class OutputPathError(ValueError):
    """--out cannot be written; the message says why and what to use."""


class VideoWriteError(RuntimeError):
    """The encoder failed or wrote fewer frames than given; the target was left as it was."""


@dataclass(frozen=True)
class OutputTarget:
    path: Path
    container: Optional[str]  # ".mp4" | ".webm" | ".gif"; None = a folder of PNG frames
    ffmpeg: Optional[str] = None  # the ffmpeg executable for containers


def find_ffmpeg() -> Optional[str]:
    """imageio-ffmpeg's ffmpeg binary, or None when it is not installed."""
    try:
        import imageio_ffmpeg

        return imageio_ffmpeg.get_ffmpeg_exe()
    except (ImportError, RuntimeError):
        return None


def _check_writable(folder: Path, flag: str) -> None:
    if not folder.exists():
        raise OutputPathError(f"{flag}: folder {folder} does not exist; create it first or choose another path")
    if not folder.is_dir():
        raise OutputPathError(f"{flag}: {folder} is not a folder")
    try:
        fd, probe = tempfile.mkstemp(prefix=".lingbot-write-probe-", dir=folder)
    except OSError as e:
        raise OutputPathError(f"{flag}: cannot write in {folder} ({e.strerror or e}); choose a writable folder") from None
    os.close(fd)
    os.unlink(probe)


def plan_output(out: Path, ffmpeg: Optional[str] = "auto", flag: str = "--out") -> OutputTarget:
    """Check an output path before any work: a known extension (or none, for PNG frames), not a folder where a
    file is wanted, an existing, writable parent folder. ffmpeg="auto" looks for imageio-ffmpeg's binary;
    without it a video path falls back to a PNG folder of the same stem, with a warning now, not at the end."""
    out = Path(out).expanduser()
    suffix = out.suffix.lower()
    if suffix in FFMPEG_ARGS:
        if out.is_dir():
            raise OutputPathError(f"{flag} {out} is an existing folder; give a file name such as {out / 'video'}{suffix}")
        exe = find_ffmpeg() if ffmpeg == "auto" else ffmpeg
        if exe is None:
            folder = out.with_suffix("")
            log.warning("imageio-ffmpeg is not installed (pip install 'lingbot-world-nf4[video]'): writing PNG frames "
                        "to %s instead of %s", folder, out)
            return plan_output(folder, None, flag)
        _check_writable(out.parent, flag)
        return OutputTarget(out, suffix, exe)
    if suffix and not out.is_dir():
        raise OutputPathError(
            f"{flag} {out}: unknown extension {out.suffix!r}; use .mp4, .webm or .gif, or a folder name without an "
            "extension for PNG frames"
        )
    # a folder of PNG frames: new, or one holding only frames of an earlier run (it is replaced as a whole)
    if out.exists():
        if not out.is_dir():
            raise OutputPathError(f"{flag} {out} is an existing file; PNG frames need a folder name")
        others = [p.name for p in out.iterdir() if not _FRAME_FILE.match(p.name)]
        if others:
            raise OutputPathError(
                f"{flag} {out} is a folder holding other files ({', '.join(sorted(others)[:3])}); PNG frames are "
                "written to a folder of their own, which replaces any earlier frames: choose a new folder name"
            )
    _check_writable(out.parent, flag)
    return OutputTarget(out, None, None)


def to_uint8_frames(video: torch.Tensor) -> np.ndarray:
    """[3, F, H, W] in [-1, 1] -> [F, H, W, 3] uint8, truncating like the reference's save_video."""
    v = ((video.float().clamp(-1, 1) + 1) / 2 * 255).to(torch.uint8)
    return v.permute(1, 2, 3, 0).contiguous().cpu().numpy()


def _ffmpeg_frames(ffmpeg: str, path: Path) -> Optional[int]:
    """Frames in a written video, counted by ffmpeg reading it back (stream copy: nothing is decoded)."""
    r = subprocess.run([ffmpeg, "-hide_banner", "-nostdin", "-i", str(path), "-map", "0:v:0", "-c", "copy", "-f", "null",
                        "-"], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    found = re.findall(r"frame=\s*(\d+)", r.stderr.decode("utf-8", "replace"))
    return int(found[-1]) if r.returncode == 0 and found else None


def _encode(frames: np.ndarray, ffmpeg: str, container: str, fps: int, tmp: Path) -> None:
    n, h, w, _ = frames.shape
    cmd = [ffmpeg, "-hide_banner", "-y", "-v", "error", "-f", "rawvideo", "-pix_fmt", "rgb24",
           "-s", f"{w}x{h}", "-r", str(fps), "-i", "-", *FFMPEG_ARGS[container], str(tmp)]
    proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        _, err = proc.communicate(np.ascontiguousarray(frames).tobytes())
    finally:
        if proc.poll() is None:  # interrupted while encoding: stop ffmpeg, the temp file is removed by the caller
            proc.kill()
            proc.wait()
    if proc.returncode != 0:
        tail = (err or b"").decode("utf-8", "replace").strip().splitlines()
        raise VideoWriteError(f"ffmpeg failed writing {tmp.name} (exit code {proc.returncode})"
                              + (f": {tail[-1]}" if tail else ""))
    got = _ffmpeg_frames(ffmpeg, tmp)
    if got != n:
        raise VideoWriteError(f"ffmpeg wrote {got} of {n} frames; the video was not saved")


def write_video(video: torch.Tensor, target: OutputTarget, fps: int = 16) -> Path:
    """Encode [3, F, H, W] in [-1, 1] to `target` atomically; returns the path written (it exists)."""
    frames = to_uint8_frames(video)
    if target.container is not None:
        with atomic_path(target.path) as tmp:
            _encode(frames, target.ffmpeg or "ffmpeg", target.container, fps, tmp)
    else:
        from PIL import Image

        with atomic_dir(target.path, replace=True) as tmp:
            for i, f in enumerate(frames):
                Image.fromarray(f).save(tmp / FRAME_NAME.format(i))
            written = len(list(tmp.glob("frame_*.png")))
            if written != len(frames):
                raise VideoWriteError(f"{written} of {len(frames)} PNG frames were written; the folder was not saved")
    if not target.path.exists():  # never report a file that is not there
        raise VideoWriteError(f"{target.path} is missing after writing it")
    return target.path
