"""Console progress line and the end-of-run summary (time per stage, peak RAM and VRAM)."""
from __future__ import annotations

import sys
import time
from pathlib import Path

import torch

from ..memory.memstats import peak_rss_bytes


class ProgressLine:
    """`step 12/70 [high] 1.9 s/step, ETA 1m52s` redrawn on one stderr line."""

    def __init__(self, total: int, enabled: bool = True):
        self.total, self.enabled = total, enabled
        self.t0 = time.perf_counter()

    def update(self, info) -> None:
        if not self.enabled:
            return
        done = info.index + 1
        per = (time.perf_counter() - self.t0) / done
        eta = per * (info.total - done)
        bar = "#" * int(24 * done / info.total)
        sys.stderr.write(f"\r[{bar:<24}] step {done}/{info.total} [{info.expert}] t={info.timestep:4d} "
                         f"{per:.2f} s/step ETA {int(eta // 60)}m{int(eta % 60):02d}s ")
        sys.stderr.flush()

    def close(self) -> None:
        if self.enabled:
            sys.stderr.write("\n")


class RunStats:
    def __init__(self):
        self.t_start = self.t_last = time.perf_counter()
        self.stages: list[tuple[str, float]] = []
        if torch.cuda.is_available():
            torch.cuda.reset_peak_memory_stats()

    def mark(self, stage: str) -> None:
        now = time.perf_counter()
        self.stages.append((stage, now - self.t_last))
        self.t_last = now

    def summary(self, out: Path, seed: int, device) -> str:
        total = time.perf_counter() - self.t_start
        parts = ", ".join(f"{name} {sec:.1f}s" for name, sec in self.stages)
        lines = [f"wrote {out}", f"seed {seed}; total {total:.1f}s ({parts})",
                 f"peak RAM (this process) {(peak_rss_bytes() or 0) / 2**30:.2f} GiB"]
        if torch.device(device).type == "cuda":
            lines.append(f"peak VRAM {torch.cuda.max_memory_allocated() / 2**30:.2f} GiB allocated, "
                         f"{torch.cuda.max_memory_reserved() / 2**30:.2f} GiB reserved")
        return "\n".join(lines)
