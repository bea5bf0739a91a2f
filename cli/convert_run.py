"""What the converters (`convert-expert`, `convert-fp8`, `convert-int8`) share: progress on stderr, one JSON result on stdout."""
from __future__ import annotations

import json
import sys
import time
from typing import Callable, Optional

from .errors import exit_code_for

PROGRESS_EVERY_S = 2.0


def run_converter(convert: Callable[..., dict], src: str, out: str, device: Optional[str]) -> int:
    """convert(src, out, device=, progress=) -> stats; prints them as JSON (or the error, with its exit code)."""
    last = [0.0]

    def progress(done: int, total: int) -> None:
        now = time.monotonic()
        if now - last[0] > PROGRESS_EVERY_S or done == total:
            last[0] = now
            print(f"  {done / 1e9:.2f} / {total / 1e9:.2f} GB", file=sys.stderr, flush=True)

    t0 = time.perf_counter()
    try:
        stats = convert(src, out, device=device, progress=progress)
    except (OSError, ValueError, RuntimeError) as e:  # JSON for scripts; the exit code says whose fault
        print(json.dumps({"ok": False, "src": src, "error": f"{type(e).__name__}: {e}"}, indent=2))
        return exit_code_for(e)
    print(json.dumps({"ok": True, "src": src, "out": out, **stats, "seconds": round(time.perf_counter() - t0, 2)},
                     indent=2))
    return 0
