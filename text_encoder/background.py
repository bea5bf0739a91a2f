"""The prompts' encoding running while this process loads the models.

The child process does the work; a thread here only waits for it (`encode_prompts` polls the child), so the
main thread can encode the image and load the DiT meanwhile. Whether both fit in VRAM at once is the caller's
decision (memory/overlap.py). `stop()` kills the child and joins the thread: nothing outlives an error or Ctrl-C.
"""
from __future__ import annotations

import threading
from typing import Callable, Optional

import torch


class BackgroundEncoding:
    """encode(cancel_check=...) -> list of embeddings, run in a thread from construction on."""

    def __init__(self, encode: Callable[..., list]):
        self._stop = threading.Event()
        self._result: Optional[list] = None
        self._error: Optional[BaseException] = None
        self._thread = threading.Thread(target=self._run, args=(encode,), name="text-encoder", daemon=True)
        self._thread.start()

    def _run(self, encode: Callable[..., list]) -> None:
        try:
            self._result = encode(cancel_check=self._stop.is_set)
        except BaseException as e:  # handed to the waiting thread
            self._error = e

    @property
    def running(self) -> bool:
        return self._thread.is_alive()

    def result(self) -> list[torch.Tensor]:
        """Wait for the embeddings; the child's error is raised here, in the caller's thread."""
        self._thread.join()
        if self._error is not None:
            raise self._error
        return self._result  # type: ignore[return-value]

    def stop(self) -> None:
        """Kill the child if it still works and wait for the thread (idempotent)."""
        self._stop.set()
        self._thread.join()

    def __enter__(self) -> "BackgroundEncoding":
        return self

    def __exit__(self, *exc) -> None:
        self.stop()
