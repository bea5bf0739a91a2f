"""Shared helpers for benchmarks and memory checks: host RSS (VmRSS / VmHWM), VRAM peaks, JSON and tables.

Peak host memory is read from /proc/self/status (Linux). `reset_peak_rss()` sets VmHWM back to the current
RSS (write "5" to /proc/self/clear_refs), so a peak can be measured for one phase of a process.
"""
from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
from pathlib import Path
from typing import Optional, Sequence

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


def run_json_child(args: Sequence[str], timeout: float = 600, env: Optional[dict] = None) -> dict:
    """Run `python <args>` in a fresh process and parse the last line of its stdout as JSON."""
    proc = subprocess.run(
        [sys.executable, *args], capture_output=True, text=True, timeout=timeout, env={**os.environ, **(env or {})}
    )
    if proc.returncode != 0:
        raise RuntimeError(f"child {' '.join(args)} failed ({proc.returncode}):\n{proc.stderr[-4000:]}")
    lines = [ln for ln in proc.stdout.splitlines() if ln.strip()]
    if not lines:
        raise RuntimeError(f"child {' '.join(args)} printed nothing; stderr:\n{proc.stderr[-4000:]}")
    return json.loads(lines[-1])


def machine_info() -> dict:
    info = {"python": platform.python_version(), "torch": torch.__version__, "cpu_count": os.cpu_count()}
    if torch.cuda.is_available():
        p = torch.cuda.get_device_properties(0)
        info.update(gpu=p.name, gpu_memory_bytes=p.total_memory, cuda=torch.version.cuda)
    return info


def write_json(path, obj) -> None:
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(json.dumps(obj, indent=2, default=str))


def gb(n: Optional[float]) -> str:
    return "-" if n is None else f"{n / 1e9:.2f} GB"


def table(rows: Sequence[Sequence], header: Sequence[str]) -> str:
    """A plain fixed-width text table."""
    cells = [list(map(str, header))] + [[str(c) for c in r] for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(header))]
    fmt = "  ".join(f"{{:<{w}}}" for w in widths)
    lines = [fmt.format(*cells[0]), fmt.format(*["-" * w for w in widths])]
    lines += [fmt.format(*r) for r in cells[1:]]
    return "\n".join(lines)
