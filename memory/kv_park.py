"""A Fast run's K/V cache kept in host memory between two parts of one video, and put back for the next part.

After a part, the cache's filled slots `[0, local_end)` (in slot order) and its two counters are everything a
continuation needs: the text K/V are recomputed from the prompt on the next call. `park(placement)` takes them out
of a placement layer by layer: device layers are copied to host memory and dropped at once, layers that already
live in (pinned) host memory are kept where they are (a view, no copy, when their ring was never rotated). Host
RAM then holds the cache exactly once and the device none of it: 26.8 GB for 81 frames at 480x832 in bf16.

`fill(i, k, v, move=True)` writes layer i into the tensors of a new placement (bigger, for the longer video) and,
with move, drops the parked layer right away: restoring needs one layer more than the new cache, never two caches
(used as the `fill` hook of `place_kv_cache`, which calls it as each layer is allocated). `move=False` copies and
keeps the parked cache intact (a state that may be continued again). `copy_out` copies the cache out and leaves it
in place (a video that goes on while its state is continued elsewhere). Nothing here imports ComfyUI.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch

from ..wan.dit.kv_cache import KVCache
from .kv_placement import CachePlacement


class ParkedKVError(RuntimeError):
    """A parked cache that cannot be restored (released already, or too big for the new cache)."""


@dataclass
class ParkedKV:
    """Per layer K and V `[B, tokens, heads, head_dim]` in host memory, in slot order, plus the counters."""

    k: list[Optional[torch.Tensor]]
    v: list[Optional[torch.Tensor]]
    global_end: int  # tokens of the video the cache has seen
    local_end: int  # tokens held (= the tensors' length)

    @property
    def num_layers(self) -> int:
        return len(self.k)

    @property
    def tokens(self) -> int:
        return self.local_end

    @property
    def complete(self) -> bool:
        return all(t is not None for t in self.k) and all(t is not None for t in self.v)

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (*self.k, *self.v) if t is not None)

    @property
    def dtype(self) -> torch.dtype:
        return next(t for t in self.k if t is not None).dtype

    def shape(self) -> tuple[int, int, int, int]:
        t = next(t for t in self.k if t is not None)
        return tuple(t.shape)

    def truncated(self, global_end: int, local_end: int) -> "ParkedKV":
        """The cache as it was at an earlier chunk boundary (views; valid only while nothing was evicted)."""
        if local_end > self.local_end or global_end > self.global_end or global_end - local_end != self.global_end - self.local_end:
            raise ParkedKVError(f"cannot go back from {self.local_end} cached tokens (video token {self.global_end}) "
                                f"to {local_end} (video token {global_end})")
        return ParkedKV([None if t is None else t[:, :local_end] for t in self.k],
                        [None if t is None else t[:, :local_end] for t in self.v], global_end, local_end)

    def fill(self, i: int, k: torch.Tensor, v: torch.Tensor, move: bool = True) -> None:
        """Write layer i into a new cache's tensors (slots [0, tokens)); with move, drop it here afterwards."""
        src_k, src_v = self.k[i], self.v[i]
        if src_k is None or src_v is None:
            raise ParkedKVError(f"layer {i} of the saved cache was moved out already (a state is continued once at a "
                                "time)")
        n = self.local_end
        if k.shape[1] < n:
            raise ParkedKVError(f"a cache of {k.shape[1]} tokens cannot take the {n} saved ones")
        if (k.shape[0], k.shape[2], k.shape[3]) != (src_k.shape[0], src_k.shape[2], src_k.shape[3]):
            raise ParkedKVError(f"saved K/V {tuple(src_k.shape)} do not fit a cache of {tuple(k.shape)}")
        k[:, :n].copy_(src_k)
        v[:, :n].copy_(src_v)
        if move:
            self.k[i] = self.v[i] = None

    def restore_counters(self, cache: KVCache) -> None:
        """Set a freshly filled cache's counters (call after every layer was filled)."""
        if self.local_end > cache.capacity:
            raise ParkedKVError(f"a cache of {cache.capacity} tokens cannot take the {self.local_end} saved ones")
        cache.global_end, cache.local_end, cache.plan = self.global_end, self.local_end, None

    def copy(self) -> "ParkedKV":
        return ParkedKV([None if t is None else t.clone() for t in self.k],
                        [None if t is None else t.clone() for t in self.v], self.global_end, self.local_end)

    def release(self) -> None:
        self.k = [None] * len(self.k)
        self.v = [None] * len(self.v)


def park(placement: CachePlacement, global_end: Optional[int] = None, local_end: Optional[int] = None) -> ParkedKV:
    """Take the filled slots of `placement`'s cache into host memory (see the module docstring), layer by layer.

    global_end/local_end: park the cache as it was at an earlier chunk boundary (a run stopped mid-chunk: its
    counters include the unfinished chunk); only without eviction since then. The placement's device memory for
    the cache is given up as it goes; close the placement afterwards as usual.
    """
    cache = placement.cache
    ge = cache.global_end if global_end is None else int(global_end)
    n = cache.local_end if local_end is None else int(local_end)
    if not 0 <= n <= cache.local_end or ge - n != cache.global_end - cache.local_end:
        raise ParkedKVError(f"cannot park {n} tokens at video token {ge} from a cache holding {cache.local_end} "
                            f"tokens up to video token {cache.global_end}")
    _settle(placement)
    ks: list[Optional[torch.Tensor]] = []
    vs: list[Optional[torch.Tensor]] = []
    for i in range(cache.num_layers):
        k, v = layer_on_host(placement, i, n, drop=True)
        ks.append(k)
        vs.append(v)
    return ParkedKV(ks, vs, ge, n)


def copy_out(placement: CachePlacement) -> ParkedKV:
    """A copy of the filled slots of `placement`'s cache in host memory, the placement left as it is: the state of a
    video that goes on (LingBot Play's state output). Device layers come to the host as copies already; host layers
    and a CPU cache come as views of the live cache, whose slots change as the video goes on, so those are cloned."""
    cache = placement.cache
    ks: list[Optional[torch.Tensor]] = []
    vs: list[Optional[torch.Tensor]] = []
    for k, v in placement_layers(placement):
        ks.append(k.clone() if k._base is not None else k)
        vs.append(v.clone() if v._base is not None else v)
    return ParkedKV(ks, vs, cache.global_end, cache.local_end)


def filled_bytes(cache: KVCache) -> int:
    """Host bytes of the cache's filled slots: what `park` or `copy_out` hold."""
    return 2 * cache.num_layers * cache.batch * cache.local_end * cache.heads * cache.head_dim * cache.dtype.itemsize


def placement_layers(placement: CachePlacement, local_end: Optional[int] = None):
    """Yield each layer's filled K/V in host memory, one layer at a time (writing a state file straight from a
    placement: device layers are copied one by one, never the whole cache at once)."""
    n = placement.cache.local_end if local_end is None else int(local_end)
    _settle(placement)
    for i in range(placement.cache.num_layers):
        yield layer_on_host(placement, i, n, drop=False)


def _settle(placement: CachePlacement) -> None:
    """Wait for the streamer's copies: the last context pass writes its chunk back to host layers (and to the codes
    kept on the device) on the copy stream, which the compute stream's results do not wait for."""
    if placement.streamer is not None:
        placement.streamer.synchronize()


def layer_on_host(placement: CachePlacement, i: int, n: int, drop: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """Layer i's slots [0, n) as host tensors `[B, n, heads, head_dim]` in slot order. Layers kept in host buffers
    come as views when their ring was never rotated (an FP8 cache's, and its codes kept on the device: decoded
    copies); device layers are copied (and, with drop, released)."""
    cache, streamer = placement.cache, placement.streamer
    host = streamer.ringed.get(i) if streamer is not None else None  # in RAM, or FP8 codes on the device
    if host is not None:
        return host.read(streamer.slots.pieces(0, n), n)
    k, v = _to_host(cache.k[i][:, :n]), _to_host(cache.v[i][:, :n])
    if drop:
        cache.k[i] = cache.v[i] = torch.empty(0)  # the device copy goes now, not at close()
    return k, v


def _to_host(t: torch.Tensor) -> torch.Tensor:
    return t.to("cpu") if t.device.type != "cpu" else t
