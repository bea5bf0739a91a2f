"""A Triton kernel loaded on first use, and why it cannot serve here (shared by the pack's Triton kernels).

Triton is imported lazily: CPU wheels and some Windows installs have none, and then the callers' torch ops serve.
A kernel that fails to build or launch once is given up for the rest of the session (one log line), so a broken
Triton costs one failed call, not one per layer.

    ROWS = TritonKernel(_load, "Triton row quantizer")   # _load() imports the kernel module and returns the kernel
    found = ROWS.get()                                   # (triton, kernel) or None
    ROWS.give_up(error)                                  # after a failed build / launch
"""
from __future__ import annotations

import logging
from typing import Any, Callable, Optional

log = logging.getLogger(__name__)

_UNSET = object()


class TritonKernel:
    def __init__(self, load: Callable[[], Any], what: str):
        self._load = load
        self.what = what
        self.failed: Optional[str] = None  # why it failed here (then the torch ops serve)
        self._found: Any = _UNSET

    def get(self) -> Optional[tuple]:
        """(triton, the kernel), or None where Triton or the kernel module cannot be imported."""
        if self._found is _UNSET:
            try:
                import triton

                self._found = (triton, self._load())
            except Exception:  # noqa: BLE001 - no Triton here: the torch ops serve
                self._found = None
        return self._found

    def give_up(self, error: Exception) -> None:
        self.failed = f"{type(error).__name__}: {str(error).partition(chr(10))[0][:200]}"
        log.warning("the %s failed (%s); using torch's ops for the rest of this session", self.what, self.failed)
