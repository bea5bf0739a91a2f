"""The layers of an FP8 K/V cache that go through the ring (memory/kv_stream.py), and the uploads of their codes.

A host layer holds e4m3 codes and one exponent byte per token and head (wan/dit/kv_fp8.py): its upload moves those
into a device staging buffer on a stream of its own (`_CodeUploads`), and the copy stream decodes them into the
layer's bf16 buffer; a write-back encodes the chunk's slots there first. The layers the card keeps may be codes too
(`_FP8DeviceLayer`, when RAM is short): half a bf16 layer's bytes, decoded into the ring before their block like a
host layer, with nothing to upload. The host layers are then spread among them (memory/kv_stream.layer_places) and
each upload starts as soon as the staging buffer is free, so it hides under the blocks of the code layers before it.
The cache writes FP8-rounded K/V into every layer, so the decoded values are the bits a device layer holds.
"""
from __future__ import annotations

import contextlib
from typing import Optional

import torch

from ..speed.kv_fp8_fused import EAGER, Fp8Ops
from ..wan.dit import kv_fp8
from .kv_host_layers import _HostLayer, _kv_views
from .host_buffer import HostBuffer


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
