"""Shared helpers for the benchmarks: child processes returning JSON, machine info, tables (memory readings
live in memory/memstats.py)."""
from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
from pathlib import Path
from typing import Optional, Sequence

import torch

from ..memory.memstats import (  # noqa: F401  (re-exported for the benchmarks)
    PeakRSS,
    peak_rss_bytes,
    peak_vram_bytes,
    proc_status_bytes,
    reset_peak_rss,
    reset_peak_vram,
    rss_bytes,
    vram_bytes,
)

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


def earlier_results(out, fresh: bool, bench: str) -> dict:
    """The results JSON at `out` that this call adds its cases to (earlier calls' cases kept), or a new one when
    `fresh`, missing or unreadable."""
    res: dict = {"bench": bench, "cases": {}}
    if out is not None and Path(out).is_file() and not fresh:
        try:
            res = json.loads(Path(out).read_text())
            res.setdefault("cases", {})
        except json.JSONDecodeError:
            pass
    return res


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
