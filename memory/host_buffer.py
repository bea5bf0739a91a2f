"""Flat host (CPU) buffers for weights and caches, and handing freed host memory back to the OS.

`HostBuffer` is one flat uint8 CPU tensor, page-locked when asked so device copies are asynchronous. Pinned host
memory is plain pageable memory of the exact size registered with `cudaHostRegister`: PyTorch's pinned allocator
rounds each allocation up to a power of two (a 9.6 GB expert would lock 16 GB). `pair_views` lays two tensors (a
layer's K and V) in one such buffer. `discard_host_pages` (madvise) and `return_freed_host_memory` (malloc_trim)
give pages back to the OS. The weights of a model move through these buffers in pinned.py.
"""
from __future__ import annotations

import ctypes
import functools
import logging
import sys
from typing import Optional, Sequence

import torch

log = logging.getLogger(__name__)


# ---- host memory -----------------------------------------------------------------------------------------
def _cuda_ok(rc) -> bool:
    return int(getattr(rc, "value", rc)) == 0


PREFAULT_MIN_BYTES = 16 * 1024**2


def tensor_bytes(shape: Sequence[int], dtype: torch.dtype) -> int:
    n = 1
    for d in shape:
        n *= int(d)
    return n * torch.empty(0, dtype=dtype).element_size()


def pair_views(flat: torch.Tensor, shape: Sequence[int], dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """Two tensors of `shape` and `dtype` laid one after the other in a flat uint8 buffer (a layer's K and V, a
    block's FiLM scale and shift): one buffer, so the pair moves with one allocation and one pinning."""
    half = tensor_bytes(shape, dtype)
    return flat[:half].view(dtype).view(tuple(shape)), flat[half:2 * half].view(dtype).view(tuple(shape))


class HostBuffer:
    """A flat uint8 CPU tensor, page-locked when asked (and CUDA is there) so device copies are asynchronous.

    how: "registered" (exact size, cudaHostRegister), "pinned" (PyTorch pinned allocator, rounded up),
    or "pageable".
    """

    def __init__(self, nbytes: int, pin: bool, prefault: Optional[bool] = None):
        self.nbytes = nbytes
        self.tensor = torch.empty(max(nbytes, 1), dtype=torch.uint8)
        self.how = "pageable"
        self._registered_ptr: Optional[int] = None
        if pin and torch.cuda.is_available():
            # Touch every page with torch's threads first: registering resident pages ran at 10.8 GB/s on the
            # H100 host against 2.2 GB/s when cudaHostRegister faults them in itself (bench_pinned).
            if prefault if prefault is not None else nbytes >= PREFAULT_MIN_BYTES:
                self.tensor.zero_()
            self._pin()

    def _pin(self) -> None:
        ptr = self.tensor.data_ptr()
        try:
            rc = torch.cuda.cudart().cudaHostRegister(ptr, self.tensor.numel(), 0)
            if _cuda_ok(rc):
                self._registered_ptr = ptr
                self.how = "registered"
                return
            log.debug("cudaHostRegister failed (%s); using the pinned allocator", rc)
        except (AttributeError, RuntimeError, TypeError) as exc:  # bindings differ across torch builds
            log.debug("cudaHostRegister unavailable (%s); using the pinned allocator", exc)
        self.tensor = self.tensor.pin_memory()
        self.how = "pinned"

    @property
    def pinned(self) -> bool:
        return self.how != "pageable"

    def close(self, discard_pages: bool = False) -> None:
        """Unregister and drop the memory. discard_pages: hand the pages back to the OS first, outside the GIL
        (freeing a big tensor unmaps its pages while holding it: ~50 ms per GB); only when nothing else views the
        buffer any more, since its bytes read as zeros afterwards."""
        if self._registered_ptr is not None:
            try:
                torch.cuda.cudart().cudaHostUnregister(self._registered_ptr)
            except Exception:  # interpreter shutdown: the process is going away anyway
                pass
            self._registered_ptr = None
        if discard_pages and self.how != "pinned" and self.tensor.numel() >= PREFAULT_MIN_BYTES:
            discard_host_pages(self.tensor)  # not memory of torch's pinned allocator: it caches and reuses that
        self.tensor = torch.empty(0, dtype=torch.uint8)

    def __del__(self) -> None:
        self.close()


# ---- giving host memory back to the OS -------------------------------------------------------------------
@functools.cache
def _malloc_trim():
    """glibc's malloc_trim from the symbols already in the process (no library search, no subprocess), or None."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        return ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError):  # not glibc (musl has no malloc_trim)
        return None


@functools.cache
def _madvise():
    if not sys.platform.startswith("linux"):
        return None
    try:
        fn = ctypes.CDLL(None, use_errno=True).madvise  # a CDLL call releases the GIL while it runs
    except (OSError, AttributeError):
        return None
    fn.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)
    fn.restype = ctypes.c_int
    return fn


MADV_DONTNEED = 4
PAGE_BYTES = 4096


def discard_host_pages(t: torch.Tensor) -> bool:
    """Give the whole pages of a contiguous CPU tensor back to the OS (madvise MADV_DONTNEED; Linux), without
    holding the GIL. The tensor's bytes read as zeros afterwards: for memory about to be freed. False where it
    cannot (another OS, not a CPU tensor)."""
    fn = _madvise()
    if fn is None or t.device.type != "cpu" or not t.is_contiguous():
        return False
    start, end = t.data_ptr(), t.data_ptr() + t.numel() * t.element_size()
    a, b = -(-start // PAGE_BYTES) * PAGE_BYTES, end // PAGE_BYTES * PAGE_BYTES
    return b <= a or fn(a, b - a, MADV_DONTNEED) == 0


def return_freed_host_memory() -> None:
    """Give freed heap pages back to the OS (glibc `malloc_trim`; a no-op elsewhere).

    Weight tensors of 10-40 MB come from the malloc heap, and glibc keeps their pages after they are freed. When
    the tensors of a streamed block are gathered into one pinned buffer, those pages would otherwise stay
    resident next to the buffer: measured on the H100, 27 streamed blocks (6.4 GB) left 11.1 GB resident instead
    of 6.9 GB.
    """
    trim = _malloc_trim()
    if trim is not None:
        trim(0)
