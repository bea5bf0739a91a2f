"""Camera FiLM cache: each block's (1 + scale, shift) for one camera, computed by a model's first forward and read
by its later ones.

The camera FiLM (spec §2.4 step 6.2) depends on the camera tokens and the block's four camera linears alone: not
on the latent, the timestep or the text. In a sampling run an expert sees the same camera at every step and in
both CFG passes, so those four GEMMs per block (about a quarter of a forward's GEMM time) recompute the same bf16
values 2 x steps times. The cache stores the values as the block computes them, so a forward that reads them is
bit-identical to one that computes them.

A cache serves one model and one camera tensor at a time: a forward of another model (the expert switch) or over
another camera tensor starts it over. Where the values live is a store: `DeviceFilmStore` (tensors on the compute
device) or memory/film_stream.py's `HostFilmStore` (pinned host memory, streamed to the device one block ahead).
"""
from __future__ import annotations

import weakref
from typing import Optional, Protocol, Sequence

import torch


class FilmStore(Protocol):
    """Where cached FiLM values live. Shapes are [B, L, dim] (the camera's batch, its tokens)."""

    def prepare(self, blocks: Sequence[int], shape: tuple, dtype: torch.dtype, device: torch.device) -> None:
        """Hold values of this shape for these blocks (earlier values are discarded)."""

    def write(self, i: int, sl: slice, scale1: torch.Tensor, shift: torch.Tensor) -> None:
        """Store block i's values of the tokens `sl` (on the current stream)."""

    def begin(self, ready: Sequence[int]) -> None:
        """A forward starts that will read these blocks, in this order."""

    def read(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Block i's (1 + scale, shift) on the compute device, ready for the current stream."""

    def done(self, i: int) -> None:
        """The current stream has queued every kernel that reads block i's values."""

    def close(self) -> None:
        """Free everything."""

    def release(self) -> None:
        """Free what a later cache of the same shape cannot reuse, keep what it can (a store that outlives one
        cache; see FilmCache.close)."""


class DeviceFilmStore:
    """The values in tensors on the compute device: the fastest store, 2 x B x L x dim x 2 bytes per block."""

    def __init__(self):
        self.values: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
        self._spec: Optional[tuple] = None

    def prepare(self, blocks, shape, dtype, device) -> None:
        """Every block's tensors now; the same ones again for the same blocks and shape (the next chunk of a
        video): CUDA graphs captured over their addresses then replay (speed/block_graphs.py)."""
        spec = (tuple(shape), dtype, torch.device(device))
        if spec == self._spec and set(blocks) == set(self.values):
            return
        self._spec, self.values = spec, {}  # the old tensors go before the new ones are made
        self.values = {i: (torch.empty(shape, dtype=dtype, device=device),
                           torch.empty(shape, dtype=dtype, device=device)) for i in blocks}

    def write(self, i, sl, scale1, shift) -> None:
        self.values[i][0][:, sl].copy_(scale1)
        self.values[i][1][:, sl].copy_(shift)

    def begin(self, ready) -> None:
        pass

    def read(self, i):
        return self.values[i]

    def done(self, i) -> None:
        pass

    @property
    def nbytes(self) -> int:
        return sum(2 * v[0].numel() * v[0].element_size() for v in self.values.values())

    def close(self) -> None:
        self.values = {}
        self._spec = None

    def release(self) -> None:
        """Keep the tensors for the next cache of the same shape (a store that outlives one cache: a video's)."""


class FilmLayer:
    """Block i's view of the cache, handed to `WanBlock.forward_layered`."""

    __slots__ = ("cache", "index")

    def __init__(self, cache: "FilmCache", index: int):
        self.cache, self.index = cache, index

    @property
    def ready(self) -> bool:
        return self.index in self.cache.valid

    def read(self) -> tuple[torch.Tensor, torch.Tensor]:
        self.cache.stats["read"] += 1
        return self.cache.store_of(self.index).read(self.index)

    def done(self) -> None:
        self.cache.store_of(self.index).done(self.index)

    def addresses(self) -> tuple[int, int]:
        """Where its device-store values live (not counted as a read): a CUDA graph over them replays there."""
        return tuple(t.data_ptr() for t in self.cache.store_of(self.index).read(self.index))

    def replayed(self, wrote: bool) -> None:
        """A CUDA graph replayed this block (speed/block_graphs.py): the bookkeeping its Python did at capture."""
        if wrote:
            self.written()
        else:
            self.cache.stats["read"] += 1

    def write(self, sl: slice, scale1: torch.Tensor, shift: torch.Tensor) -> None:
        self.cache.store_of(self.index).write(self.index, sl, scale1, shift)

    def written(self) -> None:
        """Every token of this block was written in this forward: later forwards read it."""
        self.cache.valid.add(self.index)
        self.cache.stats["filled"] += 1


class FilmCache:
    """Cached camera FiLM values of some blocks (`device_blocks` in a DeviceFilmStore, `host_blocks` in
    `host_store`); the other blocks compute theirs at every forward.

    `WanDiT.forward(film=cache)` calls `begin()` with itself and the camera tensor, then hands each block its
    `layer(i)`. The cache is an argument of the forward, like the Fast model's K/V cache: the sampler that knows
    the camera is fixed for the run makes one, passes it to every model call and closes it at the end.
    """

    def __init__(self, device_blocks: Sequence[int] = (), host_blocks: Sequence[int] = (),
                 host_store: Optional[FilmStore] = None, own_host_store: bool = True,
                 device_store: Optional[DeviceFilmStore] = None):
        overlap = set(device_blocks) & set(host_blocks)
        if overlap:
            raise ValueError(f"blocks {sorted(overlap)[:5]} are given both a device and a host place")
        if host_blocks and host_store is None:
            raise ValueError("host_blocks need a host_store (memory/film_stream.HostFilmStore)")
        self.device_blocks = tuple(sorted(set(device_blocks)))
        self.host_blocks = tuple(sorted(set(host_blocks)))
        self.stores: dict[str, FilmStore] = {}
        self._own_host_store = own_host_store
        self._own_device_store = device_store is None  # a given one outlives this cache (a video's chunks)
        if self.device_blocks:
            self.stores["device"] = device_store if device_store is not None else DeviceFilmStore()
        if self.host_blocks:
            self.stores["host"] = host_store
        self._place = {i: "device" for i in self.device_blocks}
        self._place.update({i: "host" for i in self.host_blocks})
        self.valid: set[int] = set()
        self._model: Optional[weakref.ref] = None
        self._camera: Optional[weakref.ref] = None
        self._shape: Optional[tuple] = None  # (shape, dtype) of the stored values
        self.stats = {"forwards": 0, "filled": 0, "read": 0, "restarts": 0}

    @classmethod
    def on_device(cls, num_layers: int) -> "FilmCache":
        """Every block's values on the compute device (tests, cards with room for them)."""
        return cls(device_blocks=range(num_layers))

    @property
    def blocks(self) -> tuple[int, ...]:
        return tuple(sorted(self._place))

    def store_of(self, i: int) -> FilmStore:
        return self.stores[self._place[i]]

    def begin(self, model: torch.nn.Module, camera: torch.Tensor, shape: tuple, dtype: torch.dtype,
              device: torch.device) -> None:
        """A forward of `model` over `camera` whose blocks see FiLM values of `shape` [B, L, dim] starts."""
        # the dtype too: values stored in another compute dtype (a plan applied since) are not this forward's
        same = (self._model is not None and self._model() is model and self._camera is not None
                and self._camera() is camera and self._shape == (tuple(shape), dtype))
        if not same:
            if self._model is not None:
                self.stats["restarts"] += 1
            self.valid = set()
            self._model, self._camera, self._shape = weakref.ref(model), weakref.ref(camera), (tuple(shape), dtype)
            for place, store in self.stores.items():
                store.prepare([i for i in self.blocks if self._place[i] == place], shape, dtype, device)
        self.stats["forwards"] += 1
        for place, store in self.stores.items():
            store.begin([i for i in self.blocks if self._place[i] == place and i in self.valid])

    def complete(self, num_layers: int) -> bool:
        """Does every block of the model read its values (so the forward needs no camera tokens)?"""
        return all(i in self.valid for i in range(num_layers))

    def layer(self, i: int) -> Optional[FilmLayer]:
        return FilmLayer(self, i) if i in self._place else None

    def close(self) -> None:
        """Free the values. A store that outlives this cache (a host store given with own_host_store=False, a
        given device store) is only released: the host store frees its device buffer and keeps its host buffers,
        the device store keeps its tensors, for the next cache."""
        for place, store in self.stores.items():
            if not (self._own_host_store if place == "host" else self._own_device_store):
                store.release()
            else:
                store.close()
        self.valid = set()
        self._model = self._camera = None

    def to_json(self) -> dict:
        return {"device_blocks": len(self.device_blocks), "host_blocks": len(self.host_blocks), **self.stats}
