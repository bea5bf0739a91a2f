"""The run's heavy imports on a background thread, while the main thread checks the inputs, decodes the image,
starts the text encoder and encodes the image.

bitsandbytes takes seconds to import (7.8 s of a Fast run's wall clock on the H100 host): its default backend
decorates functions with torch.compile when it is imported, which imports torch._dynamo and torch._inductor. A
run needs it only to build the model, so `generate --model fast` starts the import here first and the main
thread calls `wait()` right before its first use of those modules (the model's load, or a torch.compile check).

Python's import system makes this safe only under one condition, which the callers keep. Every module has its own
import lock, held by the thread that runs the module's body. A thread importing a module another thread is
importing waits for it; two threads that each hold a module the other needs deadlock, or (when CPython spots the
cycle) one of them gets the other's module half-initialised. Neither can happen when the main thread imports
none of the modules this thread imports before it calls `wait()`: it never takes a lock this thread needs nor
waits for one this thread holds. The modules the main thread imports before `wait()` (our checks, the image, the
text stage, the VAE: bitsandbytes-free, see quant/nf4_format.py) and the import closure of bitsandbytes are
disjoint; tests/test_heavy_imports.py checks that on the real CLI, and runs it with the import slowed down so
that both threads import at the same time throughout.

An import error is not raised here: the main thread's own import of the module runs it again and raises it
where it always did. Bitsandbytes is never patched, nor is torch.
"""
from __future__ import annotations

import importlib
import logging
import sys
import threading
import time
from typing import Sequence

from .. import quant  # noqa: F401 - its log filter must be in place before bitsandbytes is imported

log = logging.getLogger(__name__)

# What a run certainly imports and takes long: bitsandbytes (with torch._inductor), on the thread.
HEAVY_MODULES = ("bitsandbytes",)
# Imported on the calling thread before the thread starts: torch builds every model and VAE on the `meta` device
# (the checks, the memory plan, the VAE's load) through Python reference kernels that import torch._dynamo on their
# first call (torch._disable_dynamo), and einops' torch backend imports it too, so the main thread needs it within a
# second anyway. Importing it here, first, keeps the two threads' imports apart; so does importing html here (the
# prompt cleaner's, loaders/t5_tokenizer.py; torch._inductor imports it too).
MAIN_THREAD_FIRST = ("torch._dynamo", "html")


class BackgroundImports:
    """Import `modules` on a thread from construction on (background=True), or in `wait()` (background=False).

    The thread is a daemon: a run that stops early (bad input, Ctrl-C) exits without waiting for an import that
    nothing will use (an import cannot be interrupted)."""

    def __init__(self, modules: Sequence[str] = HEAVY_MODULES, background: bool = True,
                 first: Sequence[str] = MAIN_THREAD_FIRST):
        for name in first:
            importlib.import_module(name)
        self.modules = tuple(m for m in modules if m not in sys.modules)
        self.seconds = 0.0  # the imports' own time
        self.waited_s = 0.0  # how long wait() blocked the caller
        self._lock = threading.Lock()
        self._thread = None
        if self.modules and background:
            self._thread = threading.Thread(target=self._import, name="lingbot-imports", daemon=True)
            self._thread.start()

    @property
    def background(self) -> bool:
        return self._thread is not None

    def _import(self) -> None:
        t = time.perf_counter()
        for name in self.modules:
            try:
                importlib.import_module(name)
            except BaseException as e:  # noqa: BLE001 - the caller's own import raises it again
                log.debug("background import of %s failed (%s: %s)", name, type(e).__name__, e)
                break
        self.seconds = time.perf_counter() - t

    def wait(self) -> None:
        """Return once the modules are imported (or their import failed). Safe from any thread, any number of
        times; without a background thread the first call imports them here."""
        t = time.perf_counter()
        if self._thread is not None:
            self._thread.join()
        else:
            with self._lock:
                if self.modules and not self.seconds:
                    self._import()
        self.waited_s += time.perf_counter() - t

