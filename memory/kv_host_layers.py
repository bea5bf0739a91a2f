"""A streamed K/V layer's storage: K and V in one (pinned) host buffer, and the map from cache slots to its positions.

A layer has the `part` protocol of memory/block_swap.py's ring, which memory/kv_stream.py drives. With a window the
host layers are a ring after the sink, so `_SlotMap` turns a run of cache slots into at most three runs of host
positions and an eviction moves no bytes. The FP8 cache's layers are memory/kv_fp8_layers.py's.
"""
from __future__ import annotations

import contextlib
from typing import Optional

import torch

from ..wan.dit.kv_cache import KVCache
from .host_buffer import HostBuffer, pair_views, tensor_bytes

_kv_views = pair_views  # a layer's K and V in one flat buffer


class _SlotMap:
    """Cache slot -> host position: slots below the sink stay put, the rest rotate by `offset` (evictions)."""

    def __init__(self, capacity: int, sink: int):
        self.capacity, self.sink, self.offset = capacity, sink, 0

    def advance(self, evicted: int) -> None:
        self.offset = (self.offset + evicted) % (self.capacity - self.sink)

    def pieces(self, a: int, b: int) -> list[tuple[int, int, int]]:
        """[a, b) as (slot, host position, count) runs."""
        out = []
        if a < self.sink:
            n = min(b, self.sink) - a
            out.append((a, a, n))
            a += n
        ring = self.capacity - self.sink
        while a < b:
            pos = self.sink + (a - self.sink + self.offset) % ring
            n = min(b - a, self.capacity - pos)
            out.append((a, pos, n))
            a += n
        return out


class _HostLayer:
    """One streamed layer: K and V in one (pinned) host buffer, and the `part` protocol of the ring."""

    link = True  # its bytes cross the link (a layer of FP8 codes kept on the device does not)

    def __init__(self, shape: tuple, dtype: torch.dtype, pin: bool):
        self.cache: Optional[KVCache] = None  # set once the cache exists
        self.slots: Optional[_SlotMap] = None  # shared by every host layer of the cache
        self.half = tensor_bytes(shape, dtype)
        self.capacity = shape[1]
        self.buffer = HostBuffer(2 * self.half, pin)
        self.k, self.v = _kv_views(self.buffer.tensor, shape, dtype)

    def slot_bytes(self, a: int, b: int) -> int:
        return 2 * max(0, b - a) * (self.half // self.capacity)

    @property
    def nbytes(self) -> int:
        """Bytes the next upload moves: the past the current forward attends to."""
        p = self.cache.plan if self.cache is not None else None
        return 0 if p is None else self.slot_bytes(*p.past)

    def fill(self, flat: torch.Tensor, stream=None) -> None:
        """Copy the past this forward attends to into the device buffer `flat` (same slots)."""
        a, b = self.cache.plan.past
        if b <= a:
            return
        k, v = _kv_views(flat, tuple(self.k.shape), self.k.dtype)
        ctx = torch.cuda.stream(stream) if stream is not None else contextlib.nullcontext()
        with ctx:
            for slot, pos, n in self.slots.pieces(a, b):
                k[:, slot:slot + n].copy_(self.k[:, pos:pos + n], non_blocking=self.buffer.pinned)
                v[:, slot:slot + n].copy_(self.v[:, pos:pos + n], non_blocking=self.buffer.pinned)

    def write_back(self, k: torch.Tensor, v: torch.Tensor, a: int, b: int) -> None:
        """Device slots [a, b) of this layer -> their host positions (on the current stream)."""
        for slot, pos, n in self.slots.pieces(a, b):
            self.k[:, pos:pos + n].copy_(k[:, slot:slot + n], non_blocking=self.buffer.pinned)
            self.v[:, pos:pos + n].copy_(v[:, slot:slot + n], non_blocking=self.buffer.pinned)

    def read(self, pieces: list[tuple[int, int, int]], n: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Slots [0, n) as host tensors in slot order (pieces: _SlotMap.pieces(0, n)); views when not rotated."""
        if all(slot == pos for slot, pos, _ in pieces):  # the ring never turned
            return self.k[:, :n], self.v[:, :n]  # views keep the host buffer's memory alive
        k = torch.empty((self.k.shape[0], n, *self.k.shape[2:]), dtype=self.k.dtype)
        v = torch.empty_like(k)
        for slot, pos, count in pieces:
            k[:, slot:slot + count] = self.k[:, pos:pos + count]
            v[:, slot:slot + count] = self.v[:, pos:pos + count]
        return k, v

    def close(self, discard_pages: bool = False) -> None:
        self.k = self.v = None
        self.buffer.close(discard_pages)
