""""Render this path": the recorded keys replayed by `lingbot-world generate` in a background child process.

Two targets: the base Cam model (full quality, 70 steps with CFG) or the Fast model at 720p (the played rule,
window and sink). The command is always shown, so it can also be run by hand later. One job at a time; the
child is stopped and reaped when the player exits.
"""
from __future__ import annotations

import asyncio
import re
import shlex
import time
from pathlib import Path
from typing import Awaitable, Callable, Optional

from .options import RenderSource

TARGETS = ("cam", "fast720")
FAST_RENDER_SIZE = "720*1280"
_STEP = re.compile(r"step (\d+)/(\d+)")
STOP_WAIT_S = 10.0


def render_command(src: RenderSource, target: str, actions: str, image: Path, prompt: str, out: Path) -> list[str]:
    """The `python -m lingbot_world generate` argv replaying `actions` from the same image, prompt and seed."""
    if target not in TARGETS:
        raise ValueError(f"render target {target!r}: choose one of {', '.join(TARGETS)}")
    if not actions:
        raise ValueError("nothing to render yet: play at least one chunk first")
    cmd = [src.python, "-m", "lingbot_world", "generate", *src.checkpoint_args, "--image", str(image),
           "--prompt", prompt, "--seed", str(src.seed), "--actions", actions, "--device", src.device, "--noise", src.noise]
    if target == "fast720":
        cmd += ["--model", src.model, "--rule", "continuable",
                "--size", src.size if src.demo else FAST_RENDER_SIZE]  # the tiny demo stays tiny
        if src.window is not None:
            cmd += ["--window", str(src.window), "--sink", str(src.sink)]
        if src.fast_weights != "nf4":
            cmd += ["--weights", src.fast_weights]
        cmd += list(src.fast_speed_args)
    elif src.demo:
        cmd += ["--size", src.size]
    return cmd + ["--out", str(out)]


def printable(cmd: list[str]) -> str:
    return " ".join(shlex.quote(c) for c in cmd)


Report = Callable[[dict], Awaitable[None]]


class RenderJob:
    """At most one background render; `report` gets {"status", "progress", "line", "out", "command"} dicts."""

    def __init__(self):
        self._proc: Optional[asyncio.subprocess.Process] = None
        self._task: Optional[asyncio.Task] = None

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.returncode is None

    async def start(self, cmd: list[str], out: Path, report: Report, cwd: Path) -> None:
        if self.running:
            raise ValueError("a render is already running; wait for it or cancel it")
        self._proc = await asyncio.create_subprocess_exec(
            *cmd, cwd=str(cwd), stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT)
        self._task = asyncio.ensure_future(self._follow(self._proc, out, printable(cmd), report))

    async def _follow(self, proc, out: Path, command: str, report: Report) -> None:
        t0 = time.monotonic()
        tail: list[str] = []
        await report({"status": "running", "progress": 0.0, "line": "", "out": str(out), "command": command})
        buf = b""
        while True:
            data = await proc.stdout.read(4096)
            if not data:
                break
            buf += data
            *lines, buf = re.split(rb"[\r\n]", buf)
            for raw in lines:
                line = raw.decode(errors="replace").strip()
                if not line:
                    continue
                tail = (tail + [line])[-5:]
                m = _STEP.search(line)
                progress = int(m.group(1)) / int(m.group(2)) if m else None
                await report({"status": "running", "progress": progress, "line": line, "out": str(out),
                              "command": command})
        code = await proc.wait()
        status = "done" if code == 0 else "failed"
        await report({"status": status, "progress": 1.0 if code == 0 else None, "code": code,
                      "line": tail[-1] if tail else "", "out": str(out), "command": command,
                      "seconds": round(time.monotonic() - t0, 1)})

    async def stop(self) -> None:
        """Stops a running child (SIGTERM: it cleans up its own children and temp files), then reaps it."""
        proc = self._proc
        if proc is not None and proc.returncode is None:
            proc.terminate()
            try:
                await asyncio.wait_for(proc.wait(), STOP_WAIT_S)
            except asyncio.TimeoutError:
                proc.kill()
                await proc.wait()
        if self._task is not None:
            try:
                await asyncio.wait_for(self._task, STOP_WAIT_S)
            except (asyncio.TimeoutError, asyncio.CancelledError, ConnectionError):
                self._task.cancel()
