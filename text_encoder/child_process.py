"""The umT5 worker (`worker.py`) run in a short-lived child process: one run, its errors, and the live children.

`run_text_encoder` starts the worker with `subprocess`, hands it a job file in a private temp dir, polls it (progress
lines, a cancel check, a timeout) and reads back the safetensors it wrote, with no cache (the cached entry point is
encode.py). Live children are registered so ComfyUI's interrupt / free-memory hooks can stop them
(`stop_all_text_encoders`); `own_session` starts a child outside this process group (also used for ffmpeg).
"""
from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Callable, Optional, Sequence, Union

import torch
from safetensors.torch import load_file

from .worker import PARENT_PID_ENV
from ..loaders.atomic import pid_alive
from ..loaders.t5_tokenizer import MAX_LENGTH, TokenizerSource

WORKER_SCRIPT = Path(__file__).resolve().with_name("worker.py")
KILLED_MESSAGE = "the text encoder process was killed, most likely out of RAM; try device=cuda or the fp8 encoder"
_STDERR_TAIL = 4000
_INPUT_ERRORS = {"FileNotFoundError", "TokenizerNotFoundError", "T5FormatError", "ValueError"}


class TextEncoderError(RuntimeError):
    """The text encoder process failed; the message says why and ends with its stderr tail."""


class TextEncoderKilled(TextEncoderError):
    """Killed by a signal nobody here sent (typically the kernel's OOM killer)."""


class TextEncoderStopped(TextEncoderError):
    """Stopped on purpose: stop_all_text_encoders() or a cancel check."""


class TextEncoderTimeout(TextEncoderError, TimeoutError):
    pass


class TextEncoderInputError(TextEncoderError, ValueError):
    """The worker rejected its inputs (missing/wrong encoder file, bad tokenizer)."""


# ---- registry of live children ----------------------------------------------------------------------

_lock = threading.Lock()
_live: dict[int, subprocess.Popen] = {}
_stopped: set[int] = set()


def live_text_encoder_pids() -> list[int]:
    with _lock:
        return list(_live)


def stop_all_text_encoders() -> int:
    """Kill every running text-encoder child (for ComfyUI's interrupt / free memory). Returns how many.

    The waiting `encode_prompts` call raises TextEncoderStopped; the caller's process is unaffected.
    """
    with _lock:
        procs = list(_live.values())
        for p in procs:
            _stopped.add(p.pid)
    for p in procs:
        try:
            p.kill()
        except OSError:
            pass
    return len(procs)


# ---- one child run ----------------------------------------------------------------------------------


def _tail(path: Path) -> str:
    try:
        data = path.read_bytes()[-_STDERR_TAIL:]
    except OSError:
        return ""
    return data.decode("utf-8", errors="replace").strip()


def _status(path: Path) -> Optional[dict]:
    """The worker's final status: its last JSON line that is not a progress line."""
    try:
        lines = path.read_text(encoding="utf-8", errors="replace").splitlines()
    except OSError:
        return None
    for line in reversed(lines):
        line = line.strip()
        if line.startswith("{"):
            try:
                msg = json.loads(line)
            except json.JSONDecodeError:
                return None
            if isinstance(msg, dict) and "stage" in msg:
                continue
            return msg
    return None


Progress = Callable[[str, int, int], None]  # (stage, done, total): "start", then "load" (bytes), "encode" (prompts)


class StageReader:
    """Hands the worker's progress lines ({"stage", "done", "total"} on its stdout file) to a callback as they
    appear; the rest of stdout (the final status) is read by `_status` after the child exits."""

    def __init__(self, path: Path, progress: Progress):
        self.path, self.progress = path, progress
        self.offset, self.partial = 0, b""

    def poll(self) -> None:
        try:
            with open(self.path, "rb") as f:
                f.seek(self.offset)
                data = f.read()
        except OSError:
            return
        self.offset += len(data)
        *lines, self.partial = (self.partial + data).split(b"\n")
        for line in lines:
            try:
                msg = json.loads(line)
            except ValueError:
                continue
            if isinstance(msg, dict) and "stage" in msg:
                self.progress(str(msg["stage"]), int(msg.get("done", 0)), int(msg.get("total", 0)))


def _with_tail(message: str, stderr_tail: str) -> str:
    return f"{message}\n--- text encoder stderr (tail) ---\n{stderr_tail}" if stderr_tail else message


def _failure(rc: int, status: Optional[dict], stopped: bool, stderr_tail: str) -> TextEncoderError:
    if stopped:
        return TextEncoderStopped("the text encoder process was stopped (interrupt or free-memory request)")
    if rc == -getattr(signal, "SIGKILL", 9) and os.name != "nt":
        return TextEncoderKilled(_with_tail(KILLED_MESSAGE, stderr_tail))
    if rc < 0:
        try:
            name = signal.Signals(-rc).name
        except ValueError:
            name = str(-rc)
        return TextEncoderError(_with_tail(f"the text encoder process died from signal {name}", stderr_tail))
    if status is not None and status.get("ok") is False:
        cls = TextEncoderInputError if status.get("error_type") in _INPUT_ERRORS else TextEncoderError
        hint = "; try device=cpu" if status.get("error_type") == "OutOfMemoryError" else ""
        return cls(_with_tail(f"text encoder failed: {status.get('error')}{hint}", stderr_tail))
    return TextEncoderError(_with_tail(f"the text encoder process exited with code {rc} and no result", stderr_tail))


def _worker_command(job_path: Path) -> list[str]:
    cmd = [sys.executable]
    if sys.version_info >= (3, 11):
        cmd.append("-P")  # do not put the worker's folder on sys.path (its files could shadow top-level names)
    return cmd + [str(WORKER_SCRIPT), str(job_path)]


def own_session() -> dict:
    """Popen arguments that start a child outside this process group (the text encoder here, ffmpeg in
    cli/video_out.py): a terminal's Ctrl-C or a group-wide SIGTERM then reaches only the parent, which stops or
    finishes its children itself instead of having them die mid-write."""
    if os.name == "nt":
        return {"creationflags": subprocess.CREATE_NEW_PROCESS_GROUP}
    return {"start_new_session": True}


def _kill(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        try:
            proc.kill()
        except OSError:
            pass
    proc.wait()
    if proc.stdin is not None:
        try:
            proc.stdin.close()
        except OSError:
            pass


WORKDIR_PREFIX = "lingbot-t5-"
_WORKDIR = re.compile(re.escape(WORKDIR_PREFIX) + r"(\d+)-")


def remove_stale_workdirs(tmp_root: Optional[Path] = None) -> list[Path]:
    """Remove child work folders left by parents that were SIGKILLed (a kill cannot be cleaned up after);
    a folder's name carries its parent's pid. Returns the folders removed."""
    root = Path(tmp_root or tempfile.gettempdir())
    removed = []
    try:
        entries = list(root.iterdir())
    except OSError:
        return removed
    for p in entries:
        m = _WORKDIR.match(p.name)
        if m and p.is_dir() and not pid_alive(int(m.group(1))):
            shutil.rmtree(p, ignore_errors=True)
            removed.append(p)
    return removed


def run_text_encoder(
    encoder_path: Union[str, os.PathLike],
    tokenizer: TokenizerSource,
    texts: Sequence[str],
    device: str = "auto",
    dtype: str = "bfloat16",
    max_length: int = MAX_LENGTH,
    timeout: Optional[float] = None,
    cancel_check: Optional[Callable[[], bool]] = None,
    poll_interval: float = 0.05,
    progress: Optional[Progress] = None,
) -> tuple[list[torch.Tensor], dict]:
    """Encode `texts` in a fresh child process (no cache). Returns the embeddings [L_i, dim] on the CPU and
    the child's JSON status (device, timings, peak RSS, VRAM).

    cancel_check is polled while waiting: returning True stops the child (TextEncoderStopped); if it raises
    (e.g. ComfyUI's interrupt exception) the child is killed and the exception propagates. progress(stage, done,
    total) is called from this thread as the child reports its stages ("start", "load", "encode"); an exception
    it raises stops the child the same way.
    """
    _check_choices(device, dtype)
    remove_stale_workdirs()
    workdir = Path(tempfile.mkdtemp(prefix=f"{WORKDIR_PREFIX}{os.getpid()}-"))  # mode 0700: private to this user
    try:
        job_path, out_path = workdir / "job.json", workdir / "embeddings.safetensors"
        stdout_path, stderr_path = workdir / "stdout.txt", workdir / "stderr.txt"
        job = {
            "encoder": str(Path(encoder_path).expanduser().resolve()),
            "tokenizer": {"kind": tokenizer.kind, "path": str(tokenizer.path)},
            "prompts": list(texts),
            "device": device,
            "dtype": dtype,
            "max_length": max_length,
            "out": str(out_path),
        }
        job_path.write_text(json.dumps(job, ensure_ascii=False), encoding="utf-8")
        env = {**os.environ, PARENT_PID_ENV: str(os.getpid())}
        with open(stdout_path, "wb") as out, open(stderr_path, "wb") as err:
            # stdin: a pipe we hold open and never write to; the child exits when it reads EOF (we are gone).
            # A session of its own: a terminal's Ctrl-C or a service manager's SIGTERM to the process group reaches
            # only this process, which stops the child itself (and reports 130/143, not "died from signal").
            proc = subprocess.Popen(_worker_command(job_path), stdin=subprocess.PIPE, stdout=out, stderr=err, env=env,
                                    **own_session())
        with _lock:
            _live[proc.pid] = proc
        t0 = time.monotonic()
        stages = StageReader(stdout_path, progress) if progress is not None else None
        try:
            if progress is not None:
                progress("start", 0, 1)
            while True:
                try:
                    rc = proc.wait(timeout=poll_interval)
                    break
                except subprocess.TimeoutExpired:
                    pass
                if stages is not None:
                    stages.poll()
                if cancel_check is not None and cancel_check():
                    _kill(proc)
                    raise TextEncoderStopped("text encoding was cancelled")
                if timeout is not None and time.monotonic() - t0 > timeout:
                    _kill(proc)
                    raise TextEncoderTimeout(_with_tail(
                        f"the text encoder process did not finish within {timeout:g} s and was stopped; "
                        "raise the timeout (the CPU path of the full-size encoder can take minutes)",
                        _tail(stderr_path),
                    ))
        finally:
            _kill(proc)
            with _lock:
                _live.pop(proc.pid, None)
                stopped = proc.pid in _stopped
                _stopped.discard(proc.pid)
        if stages is not None and rc == 0 and not stopped:
            stages.poll()  # the last stages, printed just before the child exited
        status = _status(stdout_path)
        if stopped or rc != 0 or not status or not status.get("ok"):
            raise _failure(rc, status, stopped, _tail(stderr_path))
        tensors = load_file(str(out_path))
        return [tensors[f"prompt_{i}"] for i in range(len(texts))], status
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


# ---- the choices a run takes ---------------------------------------------------------------------

DTYPES = ("bfloat16", "float32")
_DEVICE = re.compile(r"auto|cpu|cuda(:\d+)?")


def _check_choices(device: str, dtype: str) -> None:
    if not _DEVICE.fullmatch(device):
        raise ValueError(f"text encoder device must be 'auto', 'cpu' or 'cuda[:N]', got {device!r}")
    if dtype not in DTYPES:
        raise ValueError(f"text encoder dtype must be one of {DTYPES}, got {dtype!r} (umT5 overflows in float16)")
