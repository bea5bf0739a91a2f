"""Video output: the target is checked before the run (`plan_output`) and written atomically (`write_video`).

.mp4 (H.264), .webm (VP9) and .gif go through the ffmpeg binary of imageio-ffmpeg (optional: `pip install
.[video]`); a path without an extension is a folder of PNG frames. The video is encoded into a temp file
beside the target; ffmpeg's exit status and the frame count read back from that file are checked before it
is renamed over the target, so a failed or interrupted write never leaves a truncated video under the
final name (nor clobbers the previous one), and success is reported only for a file that exists. The frames of
an interrupted run, where they are kept (`VideoWriter.keep_partial`), go to a new name (loaders/atomic.py).

ffmpeg runs in a session of its own: Ctrl-C at a terminal (SIGINT to the whole process group) and a service
manager's SIGTERM to the group reach only this process, which then finishes or stops the encoder itself.
"""
from __future__ import annotations

import errno
import logging
import os
import re
import signal
import subprocess
from dataclasses import dataclass
from pathlib import Path
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Optional

import numpy as np
import torch

from ..text_encoder.child_process import own_session
from .outputs import check_folder
from ..loaders.atomic import (atomic_dir, commit, commit_new, naming_full_disk, out_of_room, remove_path,
                              remove_stale_temps, temp_path)

log = logging.getLogger(__name__)

# container -> ffmpeg output arguments (after the raw RGB input)
FFMPEG_ARGS = {
    ".mp4": ["-c:v", "libx264", "-pix_fmt", "yuv420p", "-crf", "10", "-movflags", "+faststart", "-f", "mp4"],
    ".webm": ["-c:v", "libvpx-vp9", "-pix_fmt", "yuv420p", "-crf", "24", "-b:v", "0", "-row-mt", "1",
              "-deadline", "good", "-cpu-used", "4", "-f", "webm"],
    ".gif": ["-vf", "split[a][b];[a]palettegen=stats_mode=diff[p];[b][p]paletteuse", "-loop", "0", "-f", "gif"],
}
FRAME_NAME = "frame_{:04d}.png"
PNG_THREADS = max(1, min(8, (os.cpu_count() or 2) - 1))
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


def default_output_name(prompt: str, prefix: str = "lingbot_") -> Path:
    """--out without a value: `<prefix><the prompt's first 50 characters>_<time>.mp4` in the current folder."""
    import time

    stem = "".join(c if c.isalnum() else "_" for c in prompt[:50]).strip("_") or "video"
    return Path(f"{prefix}{stem}_{time.strftime('%Y%m%d_%H%M%S')}.mp4")


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
        check_folder(flag, out, OutputPathError)
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
    check_folder(flag, out, OutputPathError)
    return OutputTarget(out, None, None)


def to_uint8_frames(video: torch.Tensor) -> np.ndarray:
    """[3, F, H, W] in [-1, 1] -> [F, H, W, 3] uint8, truncating like the reference's save_video."""
    v = ((video.float().clamp(-1, 1) + 1) / 2 * 255).to(torch.uint8)
    return v.permute(1, 2, 3, 0).contiguous().cpu().numpy()


def _ffmpeg_frames(ffmpeg: str, path: Path) -> Optional[int]:
    """Frames in a written video, counted by ffmpeg reading it back: one framecrc line per packet of the video
    stream (stream copy: nothing is decoded). Not from the progress line on stderr: ffmpeg 7.0 leaves `frame=` out
    of it for a stream copy."""
    r = subprocess.run([ffmpeg, "-hide_banner", "-nostdin", "-loglevel", "error", "-i", str(path), "-map", "0:v:0",
                        "-c", "copy", "-f", "framecrc", "-"], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                       stderr=subprocess.DEVNULL, **own_session())
    if r.returncode != 0:
        return None
    return sum(1 for line in r.stdout.decode("ascii", "replace").splitlines() if line and not line.startswith("#"))


class VideoWriter:
    """Writes a video to `target` frame by frame, atomically: frames go to a temp sibling (ffmpeg reading raw RGB
    from a pipe, or a temp folder of PNG frames) and `close()` checks the encoder's exit status and the frame count
    before renaming it over the target. `abort()` removes the temp and leaves the target as it was.

    The Fast model appends each chunk as it is decoded; on an interrupt the caller may `keep_partial()` the
    frames made so far (a shorter but complete video) under a new name, and says so. A writer is finished once:
    after `close()`, `abort()` or a failed close, `close()` raises the reason again (it never runs twice).
    """

    def __init__(self, target: OutputTarget, fps: int = 16):
        self.target = target
        self.fps = fps
        self.frames = 0
        self._finished: Optional[str] = None  # why the writer cannot close (again): closed, stopped, failed
        self._proc: Optional[subprocess.Popen] = None
        self._size: Optional[tuple[int, int]] = None
        remove_stale_temps(target.path)
        self._tmp = temp_path(target.path)
        if target.container is None:
            self._tmp.mkdir()
        # Encoding runs on worker threads (zlib and the pipe write release the GIL), so the next chunk samples on
        # the GPU meanwhile; PNG frames in parallel, the ffmpeg pipe in order on one thread.
        workers = PNG_THREADS if target.container is None else 1
        self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="video-writer")
        self._pending: list[Future] = []

    def append(self, video: torch.Tensor) -> None:
        """Frames [3, T, H, W] in [-1, 1]; copied to host memory here, encoded in the background (errors are raised
        by the next append or by close)."""
        self.append_frames(to_uint8_frames(video))

    def append_frames(self, frames: np.ndarray) -> None:
        """Frames [T, H, W, 3] uint8 (already converted, e.g. a World session's)."""
        self._raise_failed()
        if self.target.container is None:
            for f in frames:
                self._pending.append(self._pool.submit(self._png, f, self._tmp / FRAME_NAME.format(self.frames)))
                self.frames += 1
            return
        size = (frames.shape[2], frames.shape[1])
        if self._proc is None:
            self._size = size
            cmd = [self.target.ffmpeg or "ffmpeg", "-hide_banner", "-y", "-v", "error", "-f", "rawvideo", "-pix_fmt",
                   "rgb24", "-s", f"{size[0]}x{size[1]}", "-r", str(self.fps), "-i", "-",
                   *FFMPEG_ARGS[self.target.container], str(self._tmp)]
            self._proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                          **own_session())
        elif size != self._size:
            raise VideoWriteError(f"frame size {size} differs from the first frames' {self._size}")
        self._pending.append(self._pool.submit(self._pipe, np.ascontiguousarray(frames)))
        self.frames += len(frames)

    def _png(self, frame: np.ndarray, path: Path) -> None:
        try:
            _save_png(frame, path)
        except OSError as e:  # named by the target, not by the temp folder the frames go to first
            full = out_of_room(e, self.target.path)
            if full is not None:
                raise full from None
            raise VideoWriteError(f"cannot write the PNG frames of {self.target.path} ({e.strerror or e})") from None

    def _pipe(self, frames: np.ndarray) -> None:
        try:
            self._proc.stdin.write(frames.tobytes())
        except BrokenPipeError:
            self._fail_encoder()

    def _raise_failed(self) -> None:
        """The first error of a finished background write, if any."""
        done = [f for f in self._pending if f.done()]
        self._pending = [f for f in self._pending if not f.done()]
        for f in done:
            f.result()

    def _drain(self) -> None:
        """Wait for every queued frame; raise the first error."""
        pending, self._pending = self._pending, []
        errors = []
        for f in pending:
            try:
                f.result()
            except BaseException as e:
                errors.append(e)
        if errors:
            raise errors[0]

    def _fail_encoder(self) -> None:
        proc = self._proc
        err = b""
        if proc is not None:
            if proc.stdin and not proc.stdin.closed:
                try:
                    proc.stdin.close()
                except BrokenPipeError:
                    pass
            try:
                err = proc.stderr.read() if proc.stderr else b""
            finally:
                proc.wait()
        raise _encoder_error(self.target.path, proc.returncode if proc else "?", err)

    @property
    def open(self) -> bool:
        """True until close(), abort() or a failed close."""
        return self._finished is None

    def close(self) -> Path:
        """Finish, verify and rename into place; returns the path written (it exists)."""
        return self._finish(partial=False)

    def keep_partial(self) -> Optional[Path]:
        """After an interrupt or a failure elsewhere: the frames so far, verified, under a new name beside the
        target (`<stem>_partial<suffix>`: the target itself, maybe a complete earlier video, is never touched).
        Returns that name, or None when nothing could be kept (no frames, or the write failed: a warning says
        why). Never raises an Exception, so the caller's own error is the one reported."""
        if not self.open:
            return None
        if not self.frames:
            self.abort()
            return None
        try:
            return self._finish(partial=True)
        except Exception as e:  # noqa: BLE001 - the interrupt or failure that got here is the one to report
            log.warning("the %d frames made so far could not be kept: %s", self.frames, e)
            return None

    def _finish(self, partial: bool) -> Path:
        if not self.open:
            raise VideoWriteError(f"{self.target.path}: the video writer was {self._finished}; nothing more is written")
        try:
            self._drain()
            self._pool.shutdown()
            if self.frames == 0:
                raise VideoWriteError("no frames to write")
            if self.target.container is not None:
                proc = self._proc
                try:
                    proc.stdin.close()
                except BrokenPipeError:
                    pass
                err = proc.stderr.read() if proc.stderr else b""
                proc.wait()
                if proc.returncode != 0:
                    raise _encoder_error(self.target.path, proc.returncode, err)
                got = _ffmpeg_frames(self.target.ffmpeg or "ffmpeg", self._tmp)
                if got != self.frames:
                    raise VideoWriteError(f"ffmpeg wrote {got} of {self.frames} frames; the video was not saved")
            else:
                written = len(list(self._tmp.glob("frame_*.png")))
                if written != self.frames:
                    raise VideoWriteError(f"{written} of {self.frames} PNG frames were written; the folder was not saved")
            path = self._commit(partial)
        except BaseException as e:
            self.abort()
            self._finished = f"stopped after a failed close ({e or type(e).__name__})"
            raise
        self._finished = "closed"
        if not path.exists():  # never report a file that is not there
            raise VideoWriteError(f"{path} is missing after writing it")
        return path

    def _commit(self, partial: bool) -> Path:
        with naming_full_disk(self.target.path):
            return self._commit_now(partial)

    def _commit_now(self, partial: bool) -> Path:
        if partial:
            return commit_new(self._tmp, self.target.path)
        if self.target.container is not None:
            return commit(self._tmp, self.target.path)
        with atomic_dir(self.target.path, replace=True) as tmp:
            tmp.rmdir()
            os.replace(self._tmp, tmp)
        return self.target.path

    def abort(self) -> None:
        """Stop the encoder and remove the temp; the target keeps its old content."""
        if self._finished is None:
            self._finished = "stopped"
        for f in self._pending:
            f.cancel()
        proc, self._proc = self._proc, None
        if proc is not None and proc.poll() is None:
            proc.kill()  # a write blocked on the pipe fails now instead of waiting
        self._pool.shutdown(wait=True)
        self._pending = []
        if proc is not None:
            proc.wait()
        remove_path(self._tmp)


# what ffmpeg prints when its output cannot grow (strerror of ENOSPC, EDQUOT, EFBIG)
_NO_ROOM = {"No space left on device": errno.ENOSPC, "File too large": errno.EFBIG,
            "Disk quota exceeded": getattr(errno, "EDQUOT", errno.ENOSPC)}


def _encoder_error(target: Path, code, err: bytes) -> Exception:
    """ffmpeg's failure as one line naming the target: a full disk says what to do, anything else ffmpeg's last
    line."""
    tail = (err or b"").decode("utf-8", "replace").strip().splitlines()
    if hasattr(signal, "SIGXFSZ") and code == -signal.SIGXFSZ:  # killed for passing the file size limit
        tail.append("File too large")
    for text, number in _NO_ROOM.items():
        if any(text in line for line in tail):
            full = out_of_room(OSError(number, text), target)
            if full is not None:
                return full
    return VideoWriteError(f"ffmpeg failed writing {target} (exit code {code})" + (f": {tail[-1]}" if tail else ""))


def _save_png(frame: np.ndarray, path: Path) -> None:
    from PIL import Image

    Image.fromarray(frame).save(path)


def write_video(video: torch.Tensor, target: OutputTarget, fps: int = 16) -> Path:
    """Encode [3, F, H, W] in [-1, 1] to `target` atomically; returns the path written (it exists)."""
    writer = VideoWriter(target, fps)
    try:
        writer.append(video)
    except BaseException:  # interrupted while encoding: stop ffmpeg, the target keeps its old content
        writer.abort()
        raise
    return writer.close()
