"""Helpers of the player tests (no tests here): a real `lingbot-world play --demo` server process, and its
process tree. Loaded by path from test_player_*.py (tests/ is not a package)."""
from __future__ import annotations

import os
import queue
import re
import signal
import struct
import subprocess
import sys
import threading
import time
import zlib
from pathlib import Path
from typing import Optional

REPO = Path(__file__).resolve().parents[1]
READY = re.compile(r"player ready: (http://\S+)")
START_TIMEOUT_S = 300.0  # builds the demo checkpoint the first time


def child_env(cache: Path) -> dict:
    """The test's environment for child processes: a private cache (demo checkpoint, prompt cache), this checkout
    importable as lingbot_world, no browser."""
    env = dict(os.environ, XDG_CACHE_HOME=str(cache), CI="1")
    env.pop("LINGBOT_WORLD_CACHE", None)
    return env


def shared_cache(tmp_path_factory) -> Path:
    """One cache folder for every player test of the run (the demo checkpoint is built once)."""
    path = tmp_path_factory.getbasetemp() / "player_cache"
    path.mkdir(exist_ok=True)
    return path


class PlayServer:
    """`python -m lingbot_world play --demo --port 0 ...` with its output read on a thread."""

    def __init__(self, cache: Path, out_dir: Path, *extra: str):
        self.out_dir = out_dir
        self.lines: list[str] = []
        self._eof = False
        self._lines: queue.Queue = queue.Queue()
        cmd = [sys.executable, "-m", "lingbot_world", "play", "--demo", "--no-browser", "--port", "0",
               "--out-dir", str(out_dir), "--cache-dir", str(cache / "text"), *extra]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                     env=child_env(cache), cwd=str(out_dir.parent))
        threading.Thread(target=self._read, daemon=True).start()
        self.url = self._wait_ready()
        m = re.match(r"http://([^/]+)/\?token=(\S+)", self.url)
        self.base, self.token = f"http://{m.group(1)}", m.group(2)
        self.port = int(m.group(1).rsplit(":", 1)[1])

    def _read(self) -> None:
        for line in self.proc.stdout:
            self._lines.put(line.rstrip("\n"))
        self._lines.put(None)

    def _wait_ready(self) -> str:
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            try:
                line = self._lines.get(timeout=1.0)
            except queue.Empty:
                continue
            if line is None:
                raise AssertionError("the player exited before it was ready:\n" + "\n".join(self.lines))
            self.lines.append(line)
            m = READY.search(line)
            if m:
                return m.group(1)
        self.stop()
        raise AssertionError("the player was not ready in time:\n" + "\n".join(self.lines))

    def output(self) -> str:
        """What the server printed so far; once it has exited, all of it (the reader thread is waited for)."""
        exited = self.proc.poll() is not None
        while not self._eof:
            try:
                line = self._lines.get(timeout=60) if exited else self._lines.get_nowait()
            except queue.Empty:
                break
            if line is None:
                self._eof = True
            else:
                self.lines.append(line)
        return "\n".join(self.lines)

    def url_for(self, path: str, token: Optional[str] = "") -> str:
        token = self.token if token == "" else token
        return f"{self.base}{path}" + ("" if token is None else f"?token={token}")

    def stop(self, sig: int = signal.SIGINT, timeout: float = 120.0) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode


def run_batch(argv: list[str], cache: Path) -> None:
    """`lingbot-world generate ...` (argv after the program name) in a process started like the player server (the
    same environment, so the same CPU threads: a played clip can equal it bit for bit whatever this test process's
    own environment holds), with the players' cache."""
    cmd = [sys.executable, "-m", "lingbot_world", *argv]
    r = subprocess.run(cmd, env=child_env(cache), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT, text=True, timeout=START_TIMEOUT_S)
    assert r.returncode == 0, f"the batch run failed ({r.returncode}): {' '.join(argv)}\n{r.stdout[-2000:]}"


def descendants(pid: int) -> list[int]:
    """Every living process below `pid` (from /proc: parent ids)."""
    parents: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        parents.setdefault(ppid, []).append(int(entry.name))
    out, todo = [], [pid]
    while todo:
        for child in parents.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


def alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def chromium_path() -> Optional[str]:
    """Debian's chromium (installed by .ci/run), never a downloaded browser."""
    import shutil

    for name in ("chromium", "chromium-browser"):
        found = shutil.which(name)
        if found:
            return found
    return None


def png_header(width: int, height: int) -> bytes:
    """A valid PNG (checksums right) that declares width x height pixels in a few hundred bytes: decoded, it would
    take width x height bytes and more."""
    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)

    rows = zlib.compress(b"\0" * (width + 1) * 4)
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0))
            + chunk(b"IDAT", rows) + chunk(b"IEND", b""))
