"""A causal model's load at start-up (the CLI's): in turn, or on a thread beside the image's VAE encode.

The load is disk reads and host-to-GPU copies; the VAE encode is GPU compute. When the memory planner
(memory/overlap.py) admits both at once, `ModelLoad.start()` runs the load on a thread with its own CUDA stream
(its copies do not queue behind the encode's kernels) while the main thread encodes; `result()` joins it. The
model's bytes are the same either way. An error on the thread is raised once, by `result()`, in the main thread;
`close()` (an error or Ctrl-C on the main thread) stops the load at its next tensor and joins the thread, and the
loader frees what it had placed: nothing stays half-loaded on the GPU and no thread outlives the run.
"""
from __future__ import annotations

import threading
import time
from typing import Callable, Optional

import torch


class LoadStopped(Exception):
    """The load was stopped because the run ended (an error elsewhere, Ctrl-C)."""


class ModelLoad:
    """load_fn(progress) -> model, run by `result()` in turn, or from `start()` on on a thread.

    before() runs first, in the thread that loads (the background imports' wait: the model needs bitsandbytes).
    `seconds` is the load's own time (after before()), `imports_s` the wait in before()."""

    def __init__(self, load_fn: Callable[[Callable[[int, int], None]], torch.nn.Module], device: torch.device,
                 before: Optional[Callable[[], None]] = None):
        self._load_fn = load_fn
        self.device = torch.device(device)
        if self.device.type == "cuda" and self.device.index is None:  # the thread starts on device 0: name it
            self.device = torch.device("cuda", torch.cuda.current_device())
        self._before = before
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None
        self._model: Optional[torch.nn.Module] = None
        self._error: Optional[BaseException] = None
        self.seconds = 0.0
        self.imports_s = 0.0

    @property
    def background(self) -> bool:
        return self._thread is not None

    def _check(self, done: int, total: int) -> None:
        if self._stop.is_set():
            raise LoadStopped("the model's load was stopped")

    def _load(self) -> torch.nn.Module:
        t = time.perf_counter()
        if self._before is not None:
            self._before()
        t1 = time.perf_counter()
        self.imports_s = t1 - t
        model = self._load_fn(self._check)
        self.seconds = time.perf_counter() - t1
        return model

    def _run(self) -> None:
        try:
            if self.device.type == "cuda":
                # The thread's own stream: the loader's copies and kernels wait for nothing the main thread queued.
                # The loader synchronizes the device at its end, so the weights are ready for any stream.
                torch.cuda.set_device(self.device)
                with torch.cuda.stream(torch.cuda.Stream(self.device)):
                    self._model = self._load()
            else:
                self._model = self._load()
        except BaseException as e:  # handed to the main thread by result()
            self._error = e

    def start(self) -> "ModelLoad":
        if self._thread is None and self._model is None:
            self._thread = threading.Thread(target=self._run, name="lingbot-model-load", daemon=True)
            self._thread.start()
        return self

    def result(self) -> torch.nn.Module:
        """The loaded model (loading it now if no thread was started); the load's error is raised here, once."""
        if self._thread is None:
            if self._model is None:
                self._model = self._load()
            return self._model
        self._thread.join()
        self._thread = None
        if self._error is not None:
            error, self._error = self._error, None
            raise error
        return self._model  # type: ignore[return-value]

    def close(self) -> None:
        """Stop a load still running (at its next tensor) and wait for the thread; its error, if any, is dropped
        (the run is ending for another reason). Idempotent."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        self._error = None
        self._model = None  # the placement that loaded it frees it
