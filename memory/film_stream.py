"""Camera FiLM values in pinned host memory, streamed to the device one block ahead (a `FilmStore`).

At 464x832x81 one block's (1 + scale, shift) are 0.65 GB in bf16, 26 GB for the 40 blocks: far more than a
24 GB card spares, and cheap to move (a block's compute takes 80 ms on an H100 and ~0.7 s on a 3090; the copy
needs ~13 ms at PCIe 5 rates). So the values live in host RAM and ONE device buffer holds the block being
applied: the copy of the next block is queued on a side stream as soon as the current block's FiLM kernels are
queued, and runs under the rest of that block and the next block's self-attention. The first forward of a model
writes the values (device -> host on the compute stream, right after the block computes them).

Device memory: one block's values (0.65 GB at 480p; `slots` of them), allocated at the first forward that reads,
while that forward skips the camera tokens (0.32 GB) and the FiLM's temporaries. Host memory: the cached blocks' values,
page-locked by a few worker threads (like the K/V cache's host layers, memory/kv_host_alloc.py). On a CPU "device"
the same schedule runs with synchronous copies (the CI tests check the bookkeeping and outputs that way).

The writes go on the side stream too (the Fast model writes its chunk's values at every chunk, and a device-to-host
copy on the compute stream would hold the block up). A store can outlive one FilmCache: `release()` frees the
device buffer and keeps the pinned host buffers for the next cache of the same shape.
"""
from __future__ import annotations

import logging
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from typing import Optional, Sequence

import torch

from .host_buffer import HostBuffer, pair_views, tensor_bytes

log = logging.getLogger(__name__)

ALLOC_THREADS = 4
WRITES_IN_FLIGHT = 3  # blocks' values the host may queue for writing before it waits for the oldest copy


class InFlight:
    """Copies whose source memory the caching allocator holds back until they finish (`record_stream`), at most
    `limit` at a time: making room waits on the host for the oldest. Without a bound the host, running blocks
    ahead of the GPU, leaves one block's values per block it is ahead unusable, and the card's reserved memory
    grows with how fast the host is (0.3 GB more on a 24 GB H100 once the NF4 weights took fewer launches). With
    `limit` 3 the GPU still has two blocks of work queued when the host waits."""

    def __init__(self, limit: int):
        self.limit = limit
        self.events: deque = deque()

    def make_room(self) -> None:
        while len(self.events) >= self.limit:
            self.events.popleft().synchronize()

    def add(self, event) -> None:
        self.events.append(event)

    def clear(self) -> None:
        self.events.clear()


class FilmHostMemoryError(RuntimeError):
    """The cache's host memory could not be allocated; the message says how much."""


class HostFilmStore:
    """Cached FiLM values of some blocks in (pinned) host memory; see the module docstring."""

    def __init__(self, device, pin: bool = True, slots: int = 1, keep_buffers: bool = False):
        """slots: device buffers the blocks stream through, in turn. One: a block's copy starts once the block
        before has applied its values. Two: once the block two before has, so the copy has a whole block's compute
        more to hide under. keep_buffers: the device buffers stay from their first use until close(), instead of
        going at every restart and release (the Fast model's plan counts them as its own memory, for the whole
        video)."""
        if slots < 1:
            raise ValueError(f"a FiLM store needs at least one device buffer, got {slots}")
        self.device = torch.device(device)
        self.cuda = self.device.type == "cuda"
        self.pin = pin
        self.host: dict[int, HostBuffer] = {}
        self.views: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
        self._spec: Optional[tuple] = None
        self.buffers: list[Optional[torch.Tensor]] = [None] * slots  # the device buffers, allocated when read
        self._staged: list[Optional[tuple[torch.Tensor, torch.Tensor]]] = [None] * slots
        self.holds: list[Optional[int]] = [None] * slots  # the block each buffer holds (or is being copied)
        self.order: list[int] = []  # blocks the current forward reads, in order
        self.stream = torch.cuda.Stream(self.device) if self.cuda else None
        # one per buffer: its copy is done
        self.ready = [torch.cuda.Event() for _ in range(slots)] if self.cuda else None
        self.writes = InFlight(WRITES_IN_FLIGHT)  # the device -> host writes queued, bounded (InFlight)
        self.keep_buffers = keep_buffers
        self.uploads = 0
        self.uploaded_bytes = 0
        self.written_bytes = 0

    # ---- FilmStore ----------------------------------------------------------------------------------------------
    def prepare(self, blocks: Sequence[int], shape: tuple, dtype: torch.dtype, device) -> None:
        spec = (tuple(shape), dtype)
        self._sync()
        self.order = []
        # The staging buffer goes until a forward reads again: the filling forward has the camera tokens instead
        self._drop_staging(keep=self.keep_buffers)
        if spec == self._spec and set(self.host) == set(blocks):
            return  # same sizes (the other expert of the run): the host buffers are reused, their values rewritten
        self._drop_staging()  # other sizes: kept device buffers too
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
        if self.cuda and pinned:
            # On the side stream, after the kernels that computed the values: the compute stream goes on with the
            # block while the values go to RAM (the Fast model fills the store at every chunk). The stream's later
            # uploads queue behind these writes, so a block is never read before it is written.
            self.writes.make_room()
            self.stream.wait_stream(torch.cuda.current_stream(self.device))
            with torch.cuda.stream(self.stream):
                host_scale[:, sl].copy_(scale1, non_blocking=True)
                host_shift[:, sl].copy_(shift, non_blocking=True)
            scale1.record_stream(self.stream)  # their memory is not reused before the copies have read it
            shift.record_stream(self.stream)
            written = torch.cuda.Event()
            written.record(self.stream)
            self.writes.add(written)
        else:
            host_scale[:, sl].copy_(scale1, non_blocking=pinned)
            host_shift[:, sl].copy_(shift, non_blocking=pinned)
        self.written_bytes += 2 * scale1.numel() * scale1.element_size()

    def begin(self, ready: Sequence[int]) -> None:
        self.order = list(ready)
        for pos in range(min(len(self.buffers), len(self.order))):
            self._load(self.order[pos], pos)

    def read(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        slot = self._slot(i)
        self._load(i, slot)  # normally queued already
        if self.cuda:
            torch.cuda.current_stream(self.device).wait_event(self.ready[slot])
        return self._staged[slot]

    def done(self, i: int) -> None:
        """Block i has queued its last read of its buffer: the block `slots` places later goes there next."""
        if i not in self.order:
            return
        nxt = self.order.index(i) + len(self.buffers)
        if nxt < len(self.order):
            self._load(self.order[nxt], self._slot(i))

    def release(self) -> None:
        """Free the device buffers (unless kept), keep the host buffers (and their sizes) for a later cache of the
        same shape: the Fast model's World session keeps one store for every chunk instead of pinning RAM again."""
        self._sync()
        self._drop_staging(keep=self.keep_buffers)

    def close(self) -> None:
        self._sync()
        self._drop_staging()
        self._free_host()
        self._spec = None

    # ---- internals ------------------------------------------------------------------------------------------------
    @property
    def host_bytes(self) -> int:
        return sum(b.nbytes for b in self.host.values())

    @property
    def staging(self) -> Optional[torch.Tensor]:
        """The first device buffer (None until a forward reads, and after release)."""
        return self.buffers[0]

    @property
    def staging_bytes(self) -> int:
        return sum(b.numel() for b in self.buffers if b is not None)

    def _slot(self, i: int) -> int:
        return (self.order.index(i) if i in self.order else 0) % len(self.buffers)

    def _load(self, i: int, slot: int) -> None:
        if self.holds[slot] == i:
            return
        shape, dtype = self._spec
        if self.buffers[slot] is None:
            self.buffers[slot] = torch.empty(2 * self.block_bytes(shape, dtype), dtype=torch.uint8,
                                             device=self.device)
            self._staged[slot] = pair_views(self.buffers[slot], shape, dtype)
        self.holds[slot] = i
        src = self.views[i]
        if self.cuda:
            stream = self.stream
            # After every kernel queued so far: those that read the buffer last (its block's FiLM, done() is called
            # right after them) and the copies that wrote the host values (the filling forward).
            stream.wait_stream(torch.cuda.current_stream(self.device))
            with torch.cuda.stream(stream):
                for dst, s in zip(self._staged[slot], src):
                    dst.copy_(s, non_blocking=self.host[i].pinned)
            self.ready[slot].record(stream)
        else:
            for dst, s in zip(self._staged[slot], src):
                dst.copy_(s)
        self.uploads += 1
        self.uploaded_bytes += 2 * src[0].numel() * src[0].element_size()

    def _sync(self) -> None:
        if self.cuda:
            self.stream.synchronize()
            torch.cuda.current_stream(self.device).synchronize()
        self.writes.clear()

    def _drop_staging(self, keep: bool = False) -> None:
        """Forget what the buffers hold (the host values are rewritten); free them unless `keep`."""
        n = len(self.buffers)
        self.holds = [None] * n
        if not keep:
            self.buffers, self._staged = [None] * n, [None] * n

    def _free_host(self) -> None:
        for buf in self.host.values():
            buf.close()
        self.host, self.views = {}, {}

    def stats(self) -> dict:
        return {"host_blocks": len(self.host), "host_bytes": self.host_bytes, "uploads": self.uploads,
                "uploaded_bytes": self.uploaded_bytes, "written_bytes": self.written_bytes}
