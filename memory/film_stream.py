"""Camera FiLM values in pinned host memory, streamed to the device one block ahead (a `FilmStore`).

At 464x832x81 one block's (1 + scale, shift) are 0.65 GB in bf16, 26 GB for the 40 blocks: far more than a
24 GB card spares, and cheap to move (a block's compute takes 80 ms on an H100 and ~0.7 s on a 3090; the copy
needs ~13 ms at PCIe 5 rates). So the values live in host RAM and ONE device buffer holds the block being
applied: the copy of the next block is queued on a side stream as soon as the current block's FiLM kernels are
queued, and runs under the rest of that block and the next block's self-attention. The first forward of a model
writes the values (device -> host on the compute stream, right after the block computes them).

Device memory: one block's values (0.65 GB at 480p), allocated at the first forward that reads, while that
forward skips the camera tokens (0.32 GB) and the FiLM's temporaries. Host memory: the cached blocks' values,
page-locked by a few worker threads (like the K/V cache's host layers, memory/kv_stream.py). On a CPU "device"
the same schedule runs with synchronous copies (the CI tests check the bookkeeping and outputs that way).
"""
from __future__ import annotations

import logging
from concurrent.futures import ThreadPoolExecutor
from typing import Optional, Sequence

import torch

from .pinned import HostBuffer, pair_views, tensor_bytes

log = logging.getLogger(__name__)

ALLOC_THREADS = 4


class FilmHostMemoryError(RuntimeError):
    """The cache's host memory could not be allocated; the message says how much."""


class HostFilmStore:
    """Cached FiLM values of some blocks in (pinned) host memory; see the module docstring."""

    def __init__(self, device, pin: bool = True):
        self.device = torch.device(device)
        self.cuda = self.device.type == "cuda"
        self.pin = pin
        self.host: dict[int, HostBuffer] = {}
        self.views: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
        self._spec: Optional[tuple] = None
        self.staging: Optional[torch.Tensor] = None  # the device buffer of the block being applied
        self._staged: Optional[tuple[torch.Tensor, torch.Tensor]] = None
        self.holds: Optional[int] = None  # block whose values are (being) copied into the staging buffer
        self.order: list[int] = []  # blocks the current forward reads, in order
        self.stream = torch.cuda.Stream(self.device) if self.cuda else None
        self.ready = torch.cuda.Event() if self.cuda else None  # the staged copy is done
        self.uploads = 0
        self.uploaded_bytes = 0
        self.written_bytes = 0

    # ---- FilmStore ----------------------------------------------------------------------------------------------
    def prepare(self, blocks: Sequence[int], shape: tuple, dtype: torch.dtype, device) -> None:
        spec = (tuple(shape), dtype)
        self._sync()
        self.order = []
        # The staging buffer goes until a forward reads again: the filling forward has the camera tokens instead
        self._drop_staging()
        if spec == self._spec and set(self.host) == set(blocks):
            return  # same sizes (the other expert of the run): the host buffers are reused, their values rewritten
        self._free_host()
        self._spec = spec
        nbytes = 2 * self.block_bytes(shape, dtype)
        blocks = list(blocks)
        try:
            with ThreadPoolExecutor(max(1, min(ALLOC_THREADS, len(blocks))), thread_name_prefix="film-host") as pool:
                for i, buf in zip(blocks, pool.map(lambda _: HostBuffer(nbytes, self.pin), blocks)):
                    self.host[i] = buf
        except (RuntimeError, MemoryError) as e:
            self._free_host()
            raise FilmHostMemoryError(
                f"the camera FiLM cache's host memory could not be allocated ({len(blocks)} blocks, "
                f"{len(blocks) * nbytes / 1e9:.1f} GB: {type(e).__name__}: {str(e).strip().splitlines()[0] if str(e).strip() else ''}); "
                "free some RAM or run with the camera cache off") from e
        self.views = {i: pair_views(buf.tensor, shape, dtype) for i, buf in self.host.items()}

    @staticmethod
    def block_bytes(shape: tuple, dtype: torch.dtype) -> int:
        """Bytes of one of a block's two tensors."""
        return tensor_bytes(shape, dtype)

    def write(self, i: int, sl: slice, scale1: torch.Tensor, shift: torch.Tensor) -> None:
        host_scale, host_shift = self.views[i]
        pinned = self.host[i].pinned
        host_scale[:, sl].copy_(scale1, non_blocking=pinned)
        host_shift[:, sl].copy_(shift, non_blocking=pinned)
        self.written_bytes += 2 * scale1.numel() * scale1.element_size()

    def begin(self, ready: Sequence[int]) -> None:
        self.order = list(ready)
        if self.order:
            self._load(self.order[0])

    def read(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        self._load(i)  # normally queued already
        if self.cuda:
            torch.cuda.current_stream(self.device).wait_event(self.ready)
        return self._staged

    def done(self, i: int) -> None:
        nxt = self.order.index(i) + 1 if i in self.order else len(self.order)
        if nxt < len(self.order):
            self._load(self.order[nxt])

    def close(self) -> None:
        self._sync()
        self._drop_staging()
        self._free_host()
        self._spec = None

    # ---- internals ------------------------------------------------------------------------------------------------
    @property
    def host_bytes(self) -> int:
        return sum(b.nbytes for b in self.host.values())

    def _load(self, i: int) -> None:
        if self.holds == i:
            return
        shape, dtype = self._spec
        if self.staging is None:
            self.staging = torch.empty(2 * self.block_bytes(shape, dtype), dtype=torch.uint8, device=self.device)
            self._staged = pair_views(self.staging, shape, dtype)
        self.holds = i
        src = self.views[i]
        if self.cuda:
            stream = self.stream
            # After every kernel queued so far: those that read the buffer last (its block's FiLM, done() is called
            # right after them) and the copies that wrote the host values (the filling forward).
            stream.wait_stream(torch.cuda.current_stream(self.device))
            with torch.cuda.stream(stream):
                for dst, s in zip(self._staged, src):
                    dst.copy_(s, non_blocking=self.host[i].pinned)
            self.ready.record(stream)
        else:
            for dst, s in zip(self._staged, src):
                dst.copy_(s)
        self.uploads += 1
        self.uploaded_bytes += 2 * src[0].numel() * src[0].element_size()

    def _sync(self) -> None:
        if self.cuda:
            self.stream.synchronize()
            torch.cuda.current_stream(self.device).synchronize()

    def _drop_staging(self) -> None:
        self.staging, self._staged, self.holds = None, None, None

    def _free_host(self) -> None:
        for buf in self.host.values():
            buf.close()
        self.host, self.views = {}, {}

    def stats(self) -> dict:
        return {"host_blocks": len(self.host), "host_bytes": self.host_bytes, "uploads": self.uploads,
                "uploaded_bytes": self.uploaded_bytes, "written_bytes": self.written_bytes}
