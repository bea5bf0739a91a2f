"""A K/V cache whose later layers live in pinned host memory and stream to the device one layer ahead.

The released Fast pipeline keeps the whole video's K/V on the GPU: 26.8 GB in bf16 at 480x832x81, more than a
24 GB card holds next to the 9.6 GB NF4 model. Here layers 0..N-1 keep their K/V on the device and the others
keep them in page-locked host memory. While a streamed layer runs, its K/V sit in one of two device buffers (the
block-swap ring of memory/block_swap.py, reused): before block i the cached past it attends to is copied in (queued
one layer ahead on a side stream, so the copy of layer i+1 overlaps block i's compute); the block writes the
chunk's K/V into the buffer and attends there; after block i, only in the forward whose K/V are final (the context
pass), the chunk's slots are copied back to host memory. Within a chunk the four denoising calls and the context
pass attend to the same past, and the chunk's own K/V never come from the host.

Per forward the copies are the past of every streamed layer in (host -> device) and, on the context pass, one
chunk per streamed layer out. Nothing else: no second host copy of the cache exists. With a window the host layers
are a ring after the sink: an eviction only advances the ring's offset (no bytes move in host memory), and the
copies map cache slots to ring positions (at most three pieces per copy), so the device buffer holds the slots in
the cache's order and attention sees exactly the keys of an all-resident cache. On a CPU "device" the same
schedule runs with synchronous copies (the CI tests use that to check the bookkeeping and the outputs).

With an FP8 cache (`fp8=True`, the `fast` and `draft` presets' kv_fp8 lever) a host layer holds e4m3 codes and one
exponent byte per token and head (wan/dit/kv_fp8.py): its upload moves those into a device staging buffer on a
stream of its own, and the copy stream decodes them into the layer's bf16 buffer; a write-back encodes the chunk's
slots there first. The layers the card keeps may be codes too (`code_layers`, when RAM is short): half a bf16
layer's bytes, decoded into the ring before their block like a host layer, with nothing to upload. The host layers
are then spread among them (`layer_places`) and each upload starts as soon as the staging buffer is free, so it
hides under the blocks of the code layers before it. The cache writes
FP8-rounded K/V into every layer, so the decoded values are the bits a device layer holds.
"""
from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor, wait
from typing import Callable, Optional, Sequence

import torch
import torch.nn as nn

from ..speed.kv_fp8_fused import EAGER, Fp8Ops, kv_fp8_ops
from ..wan.dit import kv_fp8
from ..wan.dit.kv_cache import ForwardPlan, KVCache
from .block_swap import _Ring
from .pinned import HostBuffer, pair_views, tensor_bytes

log = logging.getLogger(__name__)

HOST_ALLOC_THREADS = 4
# "1" / "0": FP8 host layers upload ahead, or one layer ahead, whatever the layout (benchmarks' A/B)
UPLOAD_AHEAD_ENV = "LINGBOT_KV_UPLOAD_AHEAD"


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


class _FP8HostLayer(_HostLayer):
    """A streamed layer of an FP8 cache: K and V as e4m3 codes [B, capacity, H, D] and int8 exponents
    [B, capacity, H, 1], in one (pinned) host buffer. `k` / `v` are bf16 placeholders on `meta` (the cache's view
    of a layer that is not on the device: reading them fails loudly); the streamer sets `uploads` (the codes'
    way over the link into the device's staging buffer, _CodeUploads), `index` (this layer's) and `ops`, the
    device's encode / decode (speed/kv_fp8_fused.py)."""

    def __init__(self, shape: tuple, dtype: torch.dtype, pin: bool, device: Optional[torch.device] = None):
        self.cache, self.slots, self.uploads, self.index = None, None, None, -1
        self.ops: Fp8Ops = EAGER
        self.capacity = shape[1]
        self.dtype = dtype
        self.code_shape = tuple(shape)
        self.half = fp8_pair_bytes(shape) // 2
        self.buffer = HostBuffer(2 * self.half, pin) if device is None else _DeviceCodes(2 * self.half, device)
        self.kc, self.ke, self.vc, self.ve = fp8_views(self.buffer.tensor, shape)
        self.k = torch.empty(shape, dtype=dtype, device="meta")
        self.v = torch.empty(shape, dtype=dtype, device="meta")

    def upload(self, staging: torch.Tensor, stream=None) -> None:
        """Copy the codes of the past this forward attends to into the device buffer `staging` (same slots)."""
        a, b = self.cache.plan.past
        kc, ke, vc, ve = fp8_views(staging, self.code_shape)
        ctx = torch.cuda.stream(stream) if stream is not None else contextlib.nullcontext()
        pinned = self.buffer.pinned
        with ctx:
            for slot, pos, n in self.slots.pieces(a, b):
                for dst, src in ((kc, self.kc), (ke, self.ke), (vc, self.vc), (ve, self.ve)):
                    dst[:, slot:slot + n].copy_(src[:, pos:pos + n], non_blocking=pinned)

    def fill(self, flat: torch.Tensor, stream=None) -> None:
        """Decode the uploaded past into the bf16 buffer `flat` (on `stream`, once its upload is done)."""
        staging = self.uploads.take(self.index, stream)
        a, b = self.cache.plan.past
        k, v = _kv_views(flat, self.code_shape, self.dtype)
        kc, ke, vc, ve = fp8_views(staging, self.code_shape)
        ctx = torch.cuda.stream(stream) if stream is not None else contextlib.nullcontext()
        with ctx:
            if b > a:
                self.ops.decode(kc[:, a:b], ke[:, a:b], out=k[:, a:b])
                self.ops.decode(vc[:, a:b], ve[:, a:b], out=v[:, a:b])
        self.uploads.release(stream)

    def write_back(self, k: torch.Tensor, v: torch.Tensor, a: int, b: int) -> None:
        """Device slots [a, b) (FP8-rounded values) -> codes at their host positions (on the current stream: the
        codes are made in temporaries of that stream, which it frees only after the copies)."""
        pinned = self.buffer.pinned
        for src, codes, exps in ((k, self.kc, self.ke), (v, self.vc, self.ve)):
            c, e = self.ops.encode(src[:, a:b])
            for slot, pos, n in self.slots.pieces(a, b):
                codes[:, pos:pos + n].copy_(c[:, slot - a:slot - a + n], non_blocking=pinned)
                exps[:, pos:pos + n].copy_(e[:, slot - a:slot - a + n], non_blocking=pinned)

    def store(self, k: torch.Tensor, v: torch.Tensor) -> None:
        """Every slot from host tensors in slot order (a restored layer; the ring is not rotated yet)."""
        for x, codes, exps in ((k, self.kc, self.ke), (v, self.vc, self.ve)):
            c, e = kv_fp8.encode(x)
            codes.copy_(c)
            exps.copy_(e)

    def read(self, pieces: list[tuple[int, int, int]], n: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Slots [0, n) decoded to host tensors (the cache's dtype) in slot order."""
        k = torch.empty((self.code_shape[0], n, *self.code_shape[2:]), dtype=self.dtype)
        v = torch.empty_like(k)
        for out, codes, exps in ((k, self.kc, self.ke), (v, self.vc, self.ve)):
            for slot, pos, count in pieces:
                kv_fp8.decode(codes[:, pos:pos + count].cpu(), exps[:, pos:pos + count].cpu(),
                              out=out[:, slot:slot + count])
        return k, v

    def close(self, discard_pages: bool = False) -> None:
        self.kc = self.ke = self.vc = self.ve = self.k = self.v = None
        self.buffer.close(discard_pages)


class _FP8DeviceLayer(_FP8HostLayer):
    """A layer of an FP8 cache whose codes stay on the device: half a bf16 layer's bytes, so a card keeps about
    twice as many layers as in bf16 and fewer stream from RAM. It goes through the ring like a host layer: before
    its block the past is decoded from these codes into a ring buffer (on the copy stream, nothing crosses the
    link), and the context pass encodes the chunk's slots back here, at the ring positions a host layer uses."""

    link = False

    def __init__(self, shape: tuple, dtype: torch.dtype, device: torch.device):
        super().__init__(shape, dtype, pin=False, device=device)

    @property
    def nbytes(self) -> int:
        return 0  # nothing to upload

    def fill(self, flat: torch.Tensor, stream=None) -> None:
        """Decode the past this forward attends to from the device codes into the bf16 buffer `flat`."""
        a, b = self.cache.plan.past
        k, v = _kv_views(flat, self.code_shape, self.dtype)
        ctx = torch.cuda.stream(stream) if stream is not None else contextlib.nullcontext()
        with ctx:
            for slot, pos, n in self.slots.pieces(a, b):
                self.ops.decode(self.kc[:, pos:pos + n], self.ke[:, pos:pos + n], out=k[:, slot:slot + n])
                self.ops.decode(self.vc[:, pos:pos + n], self.ve[:, pos:pos + n], out=v[:, slot:slot + n])


class _DeviceCodes:
    """The device buffer of an _FP8DeviceLayer, with the part of HostBuffer's interface the layer uses."""

    pinned = True  # copies from and to it never block the host

    def __init__(self, nbytes: int, device: torch.device):
        self.nbytes = nbytes
        self.tensor = torch.empty(max(nbytes, 1), dtype=torch.uint8, device=device)

    def close(self, discard_pages: bool = False) -> None:
        self.tensor = None


class _CodeUploads:
    """The FP8 host layers' codes on their way over the link into one device staging buffer, on a stream of their
    own, as early as the buffer allows: the next host layer's upload starts as soon as the one before was decoded
    out of the buffer. Between two host layers run the blocks of the layers kept on the device, so an upload
    hides under several blocks' compute instead of one (the ring's buffers are filled one layer ahead only).
    Uploads go in layer order within a forward; `start` begins a forward's, after its plan is fixed.
    ahead=False: a layer's upload goes only when the ring loads it, one layer ahead of its block, as a streamed
    layer always did. The streamer uploads ahead only when code layers sit between its host layers (the layout
    this is for); with the host layers after the device's, ahead bought nothing measurable on an H100 (one pair:
    0.854 s against 0.839 s one ahead, bench/results/fast_rolling_kv_codes_a_h100.json) and its earlier copies
    would queue before a block-swapped model's weights on the link."""

    def __init__(self, staging: torch.Tensor, device: torch.device, host: dict, after: Optional[object] = None,
                 ahead: bool = False):
        self.staging = staging
        self.ahead = ahead
        self.cuda = device.type == "cuda"
        self.stream = torch.cuda.Stream(device) if self.cuda else None
        self.after = after  # the ring's stream: host codes it writes back are read only after those copies
        self.uploaded = torch.cuda.Event() if self.cuda else None
        self.free = torch.cuda.Event() if self.cuda else None
        self.host = host
        self.order = sorted(host)  # the host layers (the streamer passes those only)
        self.pending: Optional[int] = None  # the layer whose codes are (being) uploaded into the staging buffer
        self.next = 0  # position in `order` of the next layer to upload in this forward

    def start(self) -> None:
        """A forward begins: its first host layer's upload goes now."""
        if self.cuda and self.after is not None:
            self.stream.wait_stream(self.after)  # the last context pass's write-backs reach RAM first
        self.pending, self.next = None, 0
        if self.ahead:
            self._issue()

    def _issue(self) -> None:
        if self.pending is not None or self.next >= len(self.order):
            return
        i = self.order[self.next]
        self.next += 1
        layer = self.host[i]
        if self.cuda:
            self.stream.wait_event(self.free)  # the buffer's last layer is decoded
            layer.upload(self.staging, self.stream)
            self.uploaded.record(self.stream)
        else:
            layer.upload(self.staging)
        self.pending = i

    def take(self, i: int, stream=None) -> torch.Tensor:
        """The staging buffer holding layer i's codes, once `stream` waits for their upload."""
        if self.pending != i:  # not uploaded ahead (a forward entered at another layer): upload it now
            self.pending, self.next = None, self.order.index(i)
            self._issue()
        if self.cuda:
            (stream or torch.cuda.current_stream()).wait_event(self.uploaded)
        return self.staging

    def release(self, stream=None) -> None:
        """Layer i's decode is queued on `stream`: the buffer is free once it ran, and the next upload goes."""
        if self.cuda:
            self.free.record(stream or torch.cuda.current_stream())
        self.pending = None
        if self.ahead:
            self._issue()

    def synchronize(self) -> None:
        if self.cuda:
            self.stream.synchronize()


def fp8_pair_bytes(shape: tuple) -> int:
    """Bytes of a layer's K and V [B, tokens, H, D] as codes plus exponents."""
    return kv_fp8.pair_bytes(*shape)


def fp8_views(flat: torch.Tensor, shape: tuple) -> tuple[torch.Tensor, ...]:
    """(K codes, K exponents, V codes, V exponents) laid one after the other in a flat uint8 buffer."""
    b, n, h, d = shape
    codes, exps = b * n * h * d, b * n * h
    out, at = [], 0
    for size, dtype, view in ((codes, kv_fp8.CODE, shape), (exps, torch.int8, (b, n, h, 1))) * 2:
        out.append(flat[at:at + size].view(dtype).view(view))
        at += size
    return tuple(out)


def host_layer(shape: tuple, dtype: torch.dtype, pin: bool, fp8: bool = False) -> _HostLayer:
    return _FP8HostLayer(shape, dtype, pin) if fp8 else _HostLayer(shape, dtype, pin)


def layer_places(num_layers: int, resident: int, codes: int = 0) -> tuple[str, ...]:
    """Where each layer of a streamed cache lives: "device" (its K/V on the device in the cache's dtype: the first
    `resident`), then the layers that go through the ring: "codes" (an FP8 cache's codes kept on the device,
    `codes` of them) and "host" (pinned RAM, the rest). The host layers are spread evenly among the ring's layers,
    the last one last, so each upload has the blocks of the code layers before it to hide under."""
    ringed = num_layers - resident
    if not 0 <= resident <= num_layers or not 0 <= codes <= ringed:
        raise ValueError(f"{resident} resident and {codes} code layers do not fit {num_layers} layers")
    hosted = ringed - codes
    places = ["device"] * resident + ["codes"] * ringed
    for j in range(hosted):  # the (j+1)-th of `hosted` even steps over the ring, rounded half up
        places[resident + (2 * (j + 1) * ringed + hosted) // (2 * hosted) - 1] = "host"
    return tuple(places)


def host_indices(num_layers: int, resident: int, codes: int = 0) -> tuple[int, ...]:
    """The layers `layer_places` puts in host RAM."""
    return tuple(i for i, p in enumerate(layer_places(num_layers, resident, codes)) if p == "host")


_kv_views = pair_views  # a layer's K and V in one flat buffer


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


class KVStreamer:
    """A KVCache with layers >= `layers_on_device` in (pinned) host memory, streamed to `device` during forwards.

    `KVStreamer.build(...)` allocates the resident layers on the device and the streamed ones in host memory
    (so host RAM holds exactly the streamed layers, device memory the resident ones plus two one-layer buffers)
    and returns the streamer; its `cache` is an ordinary KVCache. `install(model)` hooks the DiT's
    before_block/after_block (earlier hooks, e.g. block swap of the weights, keep running) and the cache's
    eviction hook.
    """

    def __init__(self, cache: KVCache, ringed: dict, device, fp8_ops: Fp8Ops = EAGER):
        self.cache = cache
        self.device = torch.device(device)
        self.ringed: dict[int, _HostLayer] = ringed  # every layer that goes through the ring
        self.host: dict[int, _HostLayer] = {i: h for i, h in ringed.items() if h.link}
        self.codes: dict[int, _HostLayer] = {i: h for i, h in ringed.items() if i not in self.host}
        self.resident = min(ringed) if ringed else cache.num_layers
        self.slots = _SlotMap(cache.capacity, cache.sink_tokens)
        for layer in ringed.values():
            layer.cache, layer.slots = cache, self.slots
        cache.self_evicting = set(ringed)
        self.ring: Optional[_Ring] = None
        self._views: list[tuple[torch.Tensor, torch.Tensor]] = []
        self.staging: Optional[torch.Tensor] = None  # an FP8 cache's host codes, uploaded here and decoded to the ring
        self.uploads: Optional[_CodeUploads] = None
        if ringed:
            layer = next(iter(ringed.values()))
            shape = tuple(layer.k.shape)
            self.ring = _Ring(2 * tensor_bytes(shape, cache.dtype), self.device)
            self._views = [_kv_views(buf, shape, cache.dtype) for buf in self.ring.buffers]
            if isinstance(layer, _FP8HostLayer):
                if self.host:
                    self.staging = torch.empty(fp8_pair_bytes(shape), dtype=torch.uint8, device=self.device)
                    ahead = os.environ.get(UPLOAD_AHEAD_ENV, "1" if self.codes else "0") != "0"
                    self.uploads = _CodeUploads(self.staging, self.device, self.host, after=self.ring.stream,
                                                ahead=ahead)
                for i, h in ringed.items():
                    h.uploads, h.index, h.ops = self.uploads, i, fp8_ops
        self._current: Optional[int] = None
        self._model: Optional[nn.Module] = None
        self._prev: Optional[tuple[Optional[Callable], Optional[Callable]]] = None
        self._prev_evict: Optional[Callable] = None
        self.uploaded_bytes = 0
        self.written_back_bytes = 0

    @staticmethod
    def host_shape(layout, heads: int, head_dim: int, batch: int = 1) -> tuple:
        """The shape of one streamed layer's K (and V) in host memory."""
        return (batch, layout.capacity, heads, head_dim)

    @classmethod
    def build(cls, layout, num_layers: int, heads: int, head_dim: int, *, device, layers_on_device: int,
              code_layers: int = 0, dtype: torch.dtype = torch.bfloat16, batch: int = 1, pin: bool = True,
              cache_text: bool = True, fill: Optional[Callable] = None,
              host_layers: Optional[HostLayers] = None, fp8: bool = False) -> "KVStreamer":
        """Allocate a cache of `layout` (wan.dit.kv_cache.CacheLayout) with its first `layers_on_device` layers on
        `device`. fill(i, k, v) runs right after layer i is allocated (see KVCache.allocate). host_layers: the
        streamed layers' host buffers, allocation already started (HostLayers of this shape, dtype and layers);
        taken here. fp8: an FP8 cache (wan/dit/kv_fp8.py): every layer holds FP8-rounded K/V, the host layers
        their codes (rounded, encoded and decoded on the device by speed/kv_fp8_fused.py). code_layers (FP8
        only): of the other layers, this many keep their codes on the device (`layer_places` says which)."""
        ops = kv_fp8_ops(device) if fp8 else EAGER
        if isinstance(layers_on_device, bool) or not isinstance(layers_on_device, int) \
                or not 0 <= layers_on_device <= num_layers:
            raise ValueError(f"layers_on_device must be an integer in 0..{num_layers}, got {layers_on_device!r}")
        if code_layers and not fp8:
            raise ValueError("code_layers keep FP8 codes on the device: only an FP8 cache has them")
        places = layer_places(num_layers, layers_on_device, code_layers)
        shape = cls.host_shape(layout, heads, head_dim, batch)
        streamed = tuple(i for i, p in enumerate(places) if p == "host")
        if host_layers is not None and (fill is not None or not host_layers.matches(shape, dtype, streamed, fp8)):
            raise ValueError("host_layers were allocated for another cache (shape, dtype or layers differ)")
        host: dict[int, _HostLayer] = {}
        try:
            if fill is None:
                source = host_layers if host_layers is not None else HostLayers(shape, dtype, streamed, pin, fp8)
                host.update(source.take())
            # With fill (restoring a parked cache, memory/kv_park.py) each host layer is allocated only once the one
            # before was restored and dropped: one layer more than the new cache in RAM, never both whole caches
            # (serial prefaulted pinning costs 1.7 s instead of 1.2 s for 27 x 640 MiB, bench_pinned).
            k, v = [], []
            for i in range(num_layers):
                if places[i] != "device":
                    if i not in host:
                        host[i] = (_FP8DeviceLayer(shape, dtype, torch.device(device)) if places[i] == "codes"
                                   else host_layer(shape, dtype, pin, fp8))
                    k.append(host[i].k)
                    v.append(host[i].v)
                else:
                    k.append(torch.empty(shape, dtype=dtype, device=device))
                    v.append(torch.empty(shape, dtype=dtype, device=device))
                if fill is not None and isinstance(host.get(i), _FP8HostLayer):
                    tk, tv = torch.zeros(shape, dtype=dtype), torch.zeros(shape, dtype=dtype)
                    fill(i, tk, tv)
                    host[i].store(tk, tv)
                    del tk, tv
                elif fill is not None:
                    fill(i, k[-1], v[-1])
            cache = KVCache(k, v, sink_tokens=layout.sink_tokens, evict=layout.evict,
                            max_attention=layout.max_attention, cache_text=cache_text,
                            round_kv=ops.round if fp8 else None)
            return cls(cache, host, device, ops)
        except BaseException:
            for h in host.values():
                h.close()
            raise

    @property
    def streamed(self) -> range:
        """The layers that go through the ring (in host RAM, or as FP8 codes on the device)."""
        return range(self.resident, self.cache.num_layers)

    @property
    def host_bytes(self) -> int:
        return sum(h.buffer.nbytes for h in self.host.values())

    @property
    def code_bytes(self) -> int:
        """Device bytes of the layers kept there as FP8 codes."""
        return sum(h.buffer.nbytes for h in self.codes.values())

    # ---- hooks --------------------------------------------------------------------------------------------
    def install(self, model: nn.Module) -> "KVStreamer":
        self._model = model
        self._prev = (model.before_block, model.after_block)
        model.before_block, model.after_block = self.before_block, self.after_block
        self._prev_evict = self.cache.on_evict
        self.cache.on_evict = self._before_evict
        return self

    def before_block(self, i: int) -> None:
        prev = self._prev[0] if self._prev else None
        if prev is not None:
            prev(i)
        if self.ring is None:
            return
        if i == 0:
            self.ring.forget()  # the buffers hold the previous forward's slots; the plan may have changed
            self._current = None
            for j, h in self.ringed.items():  # after an interrupted forward a layer may still point at a buffer
                self.cache.k[j], self.cache.v[j] = h.k, h.v
            if self.uploads is not None:
                self.uploads.start()
            if self.resident > 0:  # start the first streamed layer's copy behind the resident layers' compute
                self._load(self.resident)
        if i < self.resident:
            return
        s = self._load(i)
        self.ring.use(s)
        self.cache.k[i], self.cache.v[i] = self._views[s]
        self._current = s
        if i + 1 < self.cache.num_layers:
            self._load(i + 1, avoid=s)

    def after_block(self, i: int) -> None:
        if i >= self.resident and self.ring is not None and self._current is not None:
            s, self._current = self._current, None
            self.ring.done(s)
            plan = self.cache.plan
            if plan is not None and plan.final:
                self._write_back(i, s, plan)
            layer = self.ringed[i]
            self.cache.k[i], self.cache.v[i] = layer.k, layer.v
        prev = self._prev[1] if self._prev else None
        if prev is not None:
            prev(i)

    def _load(self, i: int, avoid: Optional[int] = None) -> int:
        before = self.ring.copied_bytes
        s = self.ring.load(i, self.ringed[i], avoid=avoid)
        self.uploaded_bytes += self.ring.copied_bytes - before
        return s

    def _write_back(self, i: int, s: int, plan: ForwardPlan) -> None:
        """The chunk's final K/V of layer i: device buffer s -> its host (or device code) layer, after block i's
        kernels."""
        k, v = self._views[s]
        host = self.ringed[i]
        if self.ring.cuda:
            stream = self.ring.stream
            stream.wait_event(self.ring.free[s])  # recorded by done(s) after the block's kernels
            with torch.cuda.stream(stream):
                host.write_back(k, v, plan.write_start, plan.write_end)
        else:
            host.write_back(k, v, plan.write_start, plan.write_end)
        if host.link:
            self.written_back_bytes += host.slot_bytes(plan.write_start, plan.write_end)

    def _before_evict(self, plan: ForwardPlan) -> None:
        # Host layers are a ring: the eviction is a new offset, no bytes move (the device layers are shifted by
        # the cache). Copies in flight use positions they computed already, and later ones queue behind them.
        self.slots.advance(plan.evicted)
        if self._prev_evict is not None:
            self._prev_evict(plan)

    def synchronize(self) -> None:
        if self.uploads is not None:
            self.uploads.synchronize()
        if self.ring is not None and self.ring.cuda:
            self.ring.stream.synchronize()

    def stats(self) -> dict:
        return {"layers_on_device": self.resident, "streamed_layers": len(self.host),
                "code_layers_on_device": len(self.codes), "code_bytes": self.code_bytes,
                "host_bytes": self.host_bytes, "uploaded_bytes": self.uploaded_bytes,
                "written_back_bytes": self.written_back_bytes, "ring_offset": self.slots.offset}

    # ---- teardown -------------------------------------------------------------------------------------------
    def close(self, background: bool = False) -> Optional[threading.Thread]:
        """Unhook, finish the copies and free the host buffers, the ring and the cache's tensors (the cache must not
        be used again). background=True: the host buffers are freed on a thread, returned (join it)."""
        if self._model is not None and self._prev is not None:
            self._model.before_block, self._model.after_block = self._prev
        self._model, self._prev = None, None
        if self.cache.on_evict == self._before_evict:
            self.cache.on_evict = self._prev_evict
        self.cache.self_evicting = set()
        if self.uploads is not None:
            self.uploads.synchronize()  # no upload may still read host memory
            self.uploads = None
        if self.ring is not None:
            self.ring.close()
            self.ring = None
        self._views = []
        self.staging = None
        self.cache.release()  # the device layers and the text K/V too
        for h in self.codes.values():
            h.close()
        host, self.host, self.codes, self.ringed = list(self.host.values()), {}, {}, {}
        if background and host:
            return release_host_layers(host)
        for h in host:
            h.close()
        return None
