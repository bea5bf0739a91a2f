"""Host and GPU memory readings: current and peak RSS from /proc/self/status, VRAM peaks.

Peak host memory is VmHWM; `reset_peak_rss()` sets it back to the current RSS (write "5" to
/proc/self/clear_refs), so one phase of a process can be measured on its own.
"""
from __future__ import annotations

from typing import Optional

import torch

_STATUS = "/proc/self/status"


def proc_status_bytes(field: str) -> Optional[int]:
    """A `kB` field of /proc/self/status (VmRSS, VmHWM, ...) in bytes, or None off Linux."""
    try:
        with open(_STATUS) as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def rss_bytes() -> Optional[int]:
    return proc_status_bytes("VmRSS")


def peak_rss_bytes() -> Optional[int]:
    return proc_status_bytes("VmHWM")


def reset_peak_rss() -> bool:
    """Make VmHWM equal the current RSS; False where the kernel does not allow it."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


class PeakRSS:
    """Peak host RSS growth over a `with` block (VmHWM after minus RSS before, with VmHWM reset at entry)."""

    def __enter__(self) -> "PeakRSS":
        self.was_reset = reset_peak_rss()
        self.start = (rss_bytes() if self.was_reset else peak_rss_bytes()) or 0
        self.growth: Optional[int] = None
        return self

    def __exit__(self, *exc) -> None:
        peak = peak_rss_bytes()
        self.growth = None if peak is None else max(0, peak - self.start)


def reset_peak_vram(device=None) -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)


def peak_vram_bytes(device=None) -> Optional[int]:
    return torch.cuda.max_memory_allocated(device) if torch.cuda.is_available() else None


def vram_bytes(device=None) -> Optional[int]:
    return torch.cuda.memory_allocated(device) if torch.cuda.is_available() else None
