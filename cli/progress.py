"""Console progress line and the end-of-run summary (time per stage, peak RAM and VRAM)."""
from __future__ import annotations

import contextlib
import logging
import sys
import time
from pathlib import Path
from typing import Optional

import torch

from ..world.machine import peak_rss_bytes


_active: Optional["ProgressLine"] = None  # the line currently drawn on the terminal, if any


def break_progress_line() -> None:
    """End a half-drawn progress line so the next message starts on its own line."""
    if _active is not None:
        _active.break_line()


class ProgressLine:
    """`step 12/70 [high] 1.9 s/step, ETA 1m52s` on stderr: redrawn in place on a terminal, one line per step
    otherwise (a log file gets no carriage returns). Log lines and errors end a half-drawn line first."""

    def __init__(self, total: int, enabled: bool = True, stream=None):
        self.total, self.enabled = total, enabled
        self.stream = stream if stream is not None else sys.stderr
        isatty = getattr(self.stream, "isatty", None)
        self.redraw = bool(isatty and isatty())
        self.t0 = time.perf_counter()
        self._dirty = False  # a redrawn line without its newline is on the terminal

    def update(self, info) -> None:
        global _active
        if not self.enabled:
            return
        done = info.index + 1
        per = (time.perf_counter() - self.t0) / done
        eta = per * (info.total - done)
        text = (f"step {done}/{info.total} [{info.expert}] t={info.timestep:4d} {per:.2f} s/step "
                f"ETA {int(eta // 60)}m{int(eta % 60):02d}s")
        if self.redraw:
            bar = "#" * int(24 * done / info.total)
            self.stream.write(f"\r[{bar:<24}] {text}\x1b[K")
            self._dirty = True
            _active = self
        else:
            self.stream.write(text + "\n")
        self.stream.flush()

    def break_line(self) -> None:
        if self._dirty:
            self.stream.write("\n")
            self.stream.flush()
            self._dirty = False

    def close(self) -> None:
        global _active
        self.break_line()
        if _active is self:
            _active = None


class ProgressAwareHandler(logging.StreamHandler):
    """A stderr log handler that never glues a message onto a half-drawn progress line."""

    def emit(self, record) -> None:
        break_progress_line()
        super().emit(record)


@contextlib.contextmanager
def cli_logging(quiet: bool):
    """The CLI's log format while the block runs: bare messages on stderr, INFO unless --quiet (then WARNING)."""
    root = logging.getLogger()
    handler = ProgressAwareHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(message)s"))
    level = root.level
    root.addHandler(handler)
    root.setLevel(logging.WARNING if quiet else logging.INFO)
    try:
        yield
    finally:
        root.removeHandler(handler)
        root.setLevel(level)


class RunStats:
    def __init__(self):
        self.t_start = self.t_last = time.perf_counter()
        self.stages: list[tuple[str, float]] = []
        if torch.cuda.is_available():
            torch.cuda.reset_peak_memory_stats()

    def mark(self, stage: str) -> None:
        """A stage of the main thread: the seconds since the last mark."""
        now = time.perf_counter()
        self.stages.append((stage, now - self.t_last))
        self.t_last = now

    def note(self, stage: str, seconds: float) -> None:
        """Work that ran beside the marked stages (another thread, or a part of one): listed with its own seconds,
        which the marked stages do not add up with ("load (beside ...)", "of which ...")."""
        self.stages.append((stage, seconds))

    def summary(self, out: Path, seed: int, device) -> str:
        total = time.perf_counter() - self.t_start
        parts = ", ".join(f"{name} {sec:.1f}s" for name, sec in self.stages)
        lines = [f"wrote {out}", f"seed {seed}; total {total:.1f}s ({parts})",
                 f"peak RAM (this process) {(peak_rss_bytes() or 0) / 2**30:.2f} GiB"]
        if torch.device(device).type == "cuda":
            lines.append(f"peak VRAM {torch.cuda.max_memory_allocated() / 2**30:.2f} GiB allocated, "
                         f"{torch.cuda.max_memory_reserved() / 2**30:.2f} GiB reserved")
        return "\n".join(lines)
