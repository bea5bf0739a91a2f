"""The streamed layers' host memory, allocated and freed off the main thread.

Pinning a 480p video's cache takes seconds, and so does handing it back: `HostLayers` allocates the layers on worker
threads while the caller loads the model, `release_host_layers` frees them on a thread while the last chunk decodes.
`host_layer` makes one layer of either kind (memory/kv_host_layers.py, memory/kv_fp8_layers.py).
"""
from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor, wait
from typing import Optional, Sequence

import torch

from .kv_fp8_layers import _FP8HostLayer, fp8_pair_bytes
from .kv_host_layers import _HostLayer
from .host_buffer import tensor_bytes

HOST_ALLOC_THREADS = 4


def host_layer(shape: tuple, dtype: torch.dtype, pin: bool, fp8: bool = False) -> _HostLayer:
    return _FP8HostLayer(shape, dtype, pin) if fp8 else _HostLayer(shape, dtype, pin)


class KVHostMemoryError(RuntimeError):
    """The streamed layers' host memory could not be allocated; the message says how much and why."""


class HostLayers:
    """The streamed layers' (pinned) host buffers, allocated by HOST_ALLOC_THREADS worker threads.

    Pinning is page faulting and locking: a few layers at a time is 7x faster than one by one (27 x 640 MiB:
    8.3 s -> 1.2 s on the H100 host, bench_pinned). Construction starts the work and returns at once, so a caller
    may load the model meanwhile (the Fast CLI starts it right after the memory plan); `take()` waits and hands
    the layers over. `close()`, at any time (an error, Ctrl-C), stops it, waits for the workers and frees what
    was allocated: nothing stays allocated or page-locked and no worker keeps running.
    """

    def __init__(self, shape: tuple, dtype: torch.dtype, layers: Sequence[int], pin: bool, fp8: bool = False):
        self.shape, self.dtype, self.layers, self.pin, self.fp8 = tuple(shape), dtype, tuple(layers), pin, fp8
        self._stop = threading.Event()
        self._t0 = self._t_last = time.perf_counter()
        self._pool = ThreadPoolExecutor(max(1, min(HOST_ALLOC_THREADS, len(self.layers))),
                                        thread_name_prefix="kv-host-alloc")
        self._futures = {i: self._pool.submit(self._one) for i in self.layers}
        self._pool.shutdown(wait=False)  # no more work: the threads exit when the layers are done

    def _one(self) -> Optional[_HostLayer]:
        if self._stop.is_set():
            return None
        layer = host_layer(self.shape, self.dtype, self.pin, self.fp8)
        self._t_last = max(self._t_last, time.perf_counter())
        return layer

    @property
    def seconds(self) -> float:
        """From the start to the last layer allocated so far."""
        return self._t_last - self._t0

    @property
    def nbytes(self) -> int:
        per = fp8_pair_bytes(self.shape) if self.fp8 else 2 * tensor_bytes(self.shape, self.dtype)
        return len(self.layers) * per

    def matches(self, shape: tuple, dtype: torch.dtype, layers: Sequence[int], fp8: bool = False) -> bool:
        return (self.shape, self.dtype, self.layers, self.fp8) == (tuple(shape), dtype, tuple(layers), fp8)

    def take(self) -> dict[int, _HostLayer]:
        """Wait for every layer and hand them over (the caller frees them from then on). On a failure every layer
        is freed and KVHostMemoryError raised (one line: how much, and the cause)."""
        try:
            wait(list(self._futures.values()))
            for i, f in self._futures.items():
                e = f.exception()
                if e is not None:
                    raise KVHostMemoryError(
                        f"the K/V cache's {'pinned ' if self.pin else ''}host memory could not be allocated "
                        f"({len(self.layers)} layers, {self.nbytes / 1e9:.1f} GB; layer {i} failed: "
                        f"{type(e).__name__}: {str(e).strip().splitlines()[0] if str(e).strip() else ''}); free "
                        "some RAM, or make the cache smaller (fewer frames, a window, max attention)") from e
            layers = {i: f.result() for i, f in self._futures.items()}
        except BaseException:
            self.close()
            raise
        self._futures = {}
        return layers

    def close(self) -> None:
        """Stop, wait for the workers, free every layer not handed over. Idempotent."""
        self._stop.set()
        futures, self._futures = self._futures, {}
        for f in futures.values():
            f.cancel()
        self._pool.shutdown(wait=True)
        for f in futures.values():
            if not f.cancelled() and f.exception() is None and f.result() is not None:
                f.result().close()


def release_host_layers(layers: Sequence[_HostLayer]) -> threading.Thread:
    """Free host layers on a thread (started; join it): unregistering and handing the pages back to the OS take
    seconds for a 480p video's cache (18 GB) and need not hold up the video's last chunk nor the exit. The pages
    go back with madvise outside the GIL (HostBuffer.close), so the main thread keeps running meanwhile."""
    layers = list(layers)

    def release() -> None:
        for h in layers:
            h.close(discard_pages=True)
        layers.clear()

    thread = threading.Thread(target=release, name="kv-host-release")
    thread.start()
    return thread
