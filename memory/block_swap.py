"""Block swap: run a DiT whose blocks beyond the first N live in (pinned) host memory.

Blocks 0..N-1 and everything outside the blocks (embeddings, head) stay on the device. The other blocks are
copied into one of two device "ring" buffers just in time, one block ahead, on a side CUDA stream:

    before_block(i):  compute waits for block i's copy (an event), block i is pointed at its ring buffer, and the
                      copy of the next streamed block (wrapping to block N for the next forward) is queued into
                      the other ring buffer behind the compute that last used that buffer (another event);
    after_block(i):   records "ring buffer free" after block i's kernels and points block i back at its host copy.

So a copy overlaps the previous block's compute, device memory holds N blocks + 2 ring buffers, and the copies
are issued only from the DiT's `before_block` / `after_block` hooks. On a CPU device the same schedule runs with
synchronous copies (the CI tests use that to check the bookkeeping and the outputs).
"""
from __future__ import annotations

import logging
from typing import Callable, Optional

import torch
import torch.nn as nn

from .host_buffer import return_freed_host_memory
from .pinned import Device, WeightPart, clear_device_caches, dit_parts, synchronize
from .resident_weights import drop_resident_weights

log = logging.getLogger(__name__)


def streamed_block_keys(blocks_on_gpu: int) -> Callable[[str], bool]:
    """Predicate for `load_expert(host=...)`: True for the keys of blocks N.. (the ones block swap streams), so a
    load reads them into host memory and everything else straight to the device."""

    def streamed(key: str) -> bool:
        if not key.startswith("blocks."):
            return False
        index = key.split(".", 2)[1]
        return index.isdigit() and int(index) >= blocks_on_gpu

    return streamed


class _Ring:
    """Two device buffers for streamed blocks (or streamed K/V caches, memory/kv_stream.py), with the events that
    order copies against compute. A `part` is anything with `nbytes` and `fill(flat_buffer, stream=None)`."""

    def __init__(self, nbytes: int, device: torch.device):
        self.device = device
        self.cuda = device.type == "cuda"
        self.buffers = [torch.empty(max(nbytes, 1), dtype=torch.uint8, device=device) for _ in range(2)]
        self.holds: list[Optional[int]] = [None, None]  # block index whose bytes are (being) copied in
        self.last_use = [-1, -1]
        self.stream = torch.cuda.Stream(device) if self.cuda else None
        self.ready = [torch.cuda.Event() for _ in range(2)] if self.cuda else [None, None]  # copy done
        self.free = [torch.cuda.Event() for _ in range(2)] if self.cuda else [None, None]  # compute done
        self.copies = 0
        self.copied_bytes = 0
        self._tick = 0

    def slot_of(self, block: int) -> Optional[int]:
        return self.holds.index(block) if block in self.holds else None

    def load(self, block: int, part: WeightPart, avoid: Optional[int] = None) -> int:
        """Queue the copy of `block` into a buffer (not `avoid`, the one in use); returns the buffer index."""
        s = self.slot_of(block)
        if s is not None:
            return s
        candidates = [i for i in (0, 1) if i != avoid]
        s = min(candidates, key=lambda i: self.last_use[i])
        self.holds[s] = block
        if self.cuda:
            # Overwrite the buffer only after the kernels of the block that used it last are done.
            self.stream.wait_event(self.free[s])
            part.fill(self.buffers[s], stream=self.stream)
            self.ready[s].record(self.stream)
        else:
            part.fill(self.buffers[s])
        self.copies += 1
        self.copied_bytes += part.nbytes
        return s

    def use(self, s: int) -> None:
        """Make compute wait for buffer `s` to be filled."""
        self._tick += 1
        self.last_use[s] = self._tick
        if self.cuda:
            torch.cuda.current_stream(self.device).wait_event(self.ready[s])

    def done(self, s: int) -> None:
        if self.cuda:
            self.free[s].record(torch.cuda.current_stream(self.device))

    def forget(self) -> None:
        """Treat both buffers as empty: their contents are stale (streamed K/V caches change between forwards).
        Copies still in flight stay ordered by the events."""
        self.holds = [None, None]

    def close(self) -> None:
        if self.cuda:
            self.stream.synchronize()  # no copy may still read host memory or write a buffer we drop
        self.buffers = []
        self.holds = [None, None]


class BlockSwapper:
    """Places a DiT for block swap and drives the prefetch from its block hooks.

    model: a WanDiT whose tensors are anywhere (fresh CPU load, device, host copies). `parts` may be given to
    reuse host copies kept from an earlier placement. pin: page-lock the host copies (CUDA only).
    """

    def __init__(
        self,
        model: nn.Module,
        device: Device,
        blocks_on_gpu: int,
        parts: Optional[list[WeightPart]] = None,
        pin: bool = True,
    ):
        num = len(model.blocks)
        if not isinstance(blocks_on_gpu, int) or isinstance(blocks_on_gpu, bool) or blocks_on_gpu < 0:
            raise ValueError(f"blocks_on_gpu must be an integer >= 0, got {blocks_on_gpu!r}")
        self.model = model
        self.device = torch.device(device)
        self.num_blocks = num
        self.resident = min(blocks_on_gpu, num)
        self.pin = pin
        self.parts = parts if parts is not None else dit_parts(model)
        self.base, self.blocks = self.parts[0], self.parts[1:]
        self.ring: Optional[_Ring] = None
        self._prev_hooks: Optional[tuple[Optional[Callable], Optional[Callable]]] = None
        self._current: Optional[int] = None  # ring buffer of the block being computed
        # Views are cut once: every streamed block has the same layout, so ring views serve any of them.
        self._ring_views: list[list[torch.Tensor]] = []
        self._host_views: dict[int, list[torch.Tensor]] = {}

    # placement -------------------------------------------------------------------------------------------
    @property
    def streamed(self) -> range:
        return range(self.resident, self.num_blocks)

    def place(self) -> None:
        """Base and the first N blocks to the device, the rest to (pinned) host memory, ring allocated."""
        self.base.to_device(self.device)
        for i, part in enumerate(self.blocks):
            if i < self.resident:
                part.to_device(self.device)
            else:
                part.to_host(self.pin)
                return_freed_host_memory()  # the block's loaded tensors are freed now: keep the peak at one copy
        if len(self.streamed):
            sig = self.blocks[self.resident].signature()
            odd = [i for i in self.streamed if self.blocks[i].signature() != sig]
            if odd:
                raise ValueError(f"blocks {odd[:5]} differ in layout from block {self.resident}; cannot share ring buffers")
            self.ring = _Ring(self.blocks[self.resident].nbytes, self.device)
            part = self.blocks[self.resident]
            self._ring_views = [part.views(buf) for buf in self.ring.buffers]
            self._host_views = {i: self.blocks[i].views(self.blocks[i].host.tensor) for i in self.streamed}
        synchronize(self.device)

    def install(self) -> "BlockSwapper":
        """Place the model and hook into its forward (previous hooks keep running)."""
        drop_resident_weights(self.model, self.streamed)  # their weights move: a kept copy would outlive them
        self.model.streamed_blocks = self.streamed  # and none is kept for them later (memory/resident_weights.py)
        self.place()
        self._prev_hooks = (self.model.before_block, self.model.after_block)
        self.model.before_block = self.before_block
        self.model.after_block = self.after_block
        return self

    # hooks -----------------------------------------------------------------------------------------------
    def before_block(self, i: int) -> None:
        prev = self._prev_hooks[0] if self._prev_hooks else None
        if prev is not None:
            prev(i)
        if i < self.resident or self.ring is None:
            return
        s = self.ring.load(i, self.blocks[i])
        self.ring.use(s)
        _point(self.blocks[i], self._ring_views[s])
        self._current = s
        nxt = i + 1 if i + 1 < self.num_blocks else self.resident  # wrap: first streamed block of the next forward
        if nxt != i:
            self.ring.load(nxt, self.blocks[nxt], avoid=s)

    def after_block(self, i: int) -> None:
        if i >= self.resident and self.ring is not None and self._current is not None:
            self.ring.done(self._current)
            _point(self.blocks[i], self._host_views[i])
            self._current = None
        prev = self._prev_hooks[1] if self._prev_hooks else None
        if prev is not None:
            prev(i)

    # teardown --------------------------------------------------------------------------------------------
    def remove(self, keep_host: bool, pin: Optional[bool] = None) -> list[WeightPart]:
        """Unhook and take the model off the device.

        keep_host=True: every part ends up pointing at a (pinned) host copy, kept for the next placement
        (copies of the resident parts are made now, once). False: host copies are dropped too and the model's
        tensors are left pointing at empty placeholders; the caller discards the model.
        Returns the parts (reusable with keep_host=True).
        """
        pin = self.pin if pin is None else pin
        if self._prev_hooks is not None:
            self.model.before_block, self.model.after_block = self._prev_hooks
            self._prev_hooks = None
        self.model.__dict__.pop("streamed_blocks", None)
        synchronize(self.device)
        if self.ring is not None:
            self.ring.close()
            self.ring = None
        self._ring_views, self._host_views = [], {}
        for part in self.parts:
            if keep_host:
                part.to_host(pin)
            else:
                _empty_part(part)
        clear_device_caches(self.model)
        return_freed_host_memory()
        return self.parts

    def stats(self) -> dict:
        return {
            "blocks_on_gpu": self.resident,
            "streamed_blocks": len(self.streamed),
            "block_bytes": self.blocks[0].nbytes if self.blocks else 0,
            "ring_copies": self.ring.copies if self.ring else 0,
            "ring_copied_bytes": self.ring.copied_bytes if self.ring else 0,
        }


def _point(part: WeightPart, views: list[torch.Tensor]) -> None:
    for slot, view in zip(part.slots, views):
        slot.set(view)


def _empty_part(part: WeightPart) -> None:
    """Point every tensor at a zero-size placeholder so device and host memory can be freed."""
    for slot, e in zip(part.slots, part.entries):
        slot.set(torch.empty((0,), dtype=e.dtype))
    part.device_buffer = None
    part.drop_host()
