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

With an FP8 cache (`fp8=True`, the `fast` and `draft` presets' kv_fp8 lever) the layers in the ring hold codes,
uploaded and decoded on their way in (memory/kv_fp8_layers.py); the layers the card keeps may be codes too
(`code_layers`, when RAM is short), and `layer_places` spreads the host layers among them. A layer's storage is
memory/kv_host_layers.py's, its host memory is allocated and freed by memory/kv_host_alloc.py.
"""
from __future__ import annotations

import logging
import os
import threading
from typing import Callable, Optional

import torch
import torch.nn as nn

from ..speed.kv_fp8_fused import EAGER, Fp8Ops, kv_fp8_ops
from ..wan.dit.kv_cache import ForwardPlan, KVCache
from .block_swap import _Ring
from .kv_fp8_layers import _CodeUploads, _FP8DeviceLayer, _FP8HostLayer, fp8_pair_bytes
from .kv_host_alloc import HostLayers, host_layer, release_host_layers
from .kv_host_layers import _HostLayer, _kv_views, _SlotMap
from .host_buffer import tensor_bytes

log = logging.getLogger(__name__)

# "1" / "0": FP8 host layers upload ahead, or one layer ahead, whatever the layout (benchmarks' A/B)
UPLOAD_AHEAD_ENV = "LINGBOT_KV_UPLOAD_AHEAD"


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
