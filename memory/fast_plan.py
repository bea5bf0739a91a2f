"""What the Fast model's memory plan says (`FastMemoryPlan`): where the model, its K/V cache, the text K/V and the
camera FiLM go and whether the blocks keep their prepared GEMM weights, with the numbers and the reason in one line;
and `FastMemoryError`, when nothing fits.

Decided by memory/fast_planner.py, carried out by memory/kv_placement.py; the World session also makes each chunk's
camera FiLM cache from it (`make_film`, `make_film_store`) and keeps the GEMM weights it says
(memory/resident_weights.py).
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Optional

from ..wan.dit.blocks import DEFAULT_TOKEN_CHUNK
from ..wan.dit.film_cache import DeviceFilmStore, FilmCache
from ..wan.dit.kv_cache import CacheLayout
from .film_stream import HostFilmStore
from .kv_stream import host_indices


class FastMemoryError(MemoryError):
    """The Fast run cannot be placed (the cache does not fit even in host RAM); the message has the numbers."""


@dataclass
class FastMemoryPlan:
    cache: str  # "gpu" | "host"
    cache_layers_on_gpu: int  # layers whose K/V stay on the device (all of them for "gpu")
    cache_text: bool  # keep each layer's text K/V on the device
    blocks_on_gpu: Optional[int]  # None: the whole model on the device; else block swap with N resident blocks
    layout: CacheLayout
    reason: str
    fits: bool = True
    token_chunk: Optional[int] = DEFAULT_TOKEN_CHUNK
    estimates: dict = field(default_factory=dict)
    cache_heads: Optional[int] = None  # heads this process caches (a Ulysses rank holds H/N); None = all
    film_blocks: int = 0  # blocks (the first ones) whose camera FiLM a chunk's first call keeps for its later calls
    film_host_blocks: int = 0  # the next blocks: their FiLM kept in pinned RAM, streamed back ahead of the block
    kv_fp8: bool = False  # the K/V cache rounded to FP8 (wan/dit/kv_fp8.py), its host layers stored as codes
    code_layers_on_gpu: int = 0  # of cache_layers_on_gpu, those an FP8 cache keeps on the device as codes
    resident_weights: bool = False  # every block keeps its prepared GEMM weights (memory/resident_weights.py)

    @property
    def num_layers(self) -> int:
        return int(self.estimates.get("num_layers", 0))

    def make_film(self, device=None, host_store: Optional[HostFilmStore] = None,
                  device_store: Optional[DeviceFilmStore] = None) -> Optional[FilmCache]:
        """The camera FiLM cache of this plan (None: every call computes it); the run closes it. Blocks kept in
        pinned RAM go to `host_store` when given (a store that outlives the cache: its host buffers are pinned
        once for every chunk), else to a store of their own on `device`; the device's blocks likewise go to
        `device_store` when given (its tensors serve every chunk: CUDA graphs replay over their addresses)."""
        if not self.film_blocks and not self.film_host_blocks:
            return None
        device_blocks = range(self.film_blocks)
        if not self.film_host_blocks:
            return FilmCache(device_blocks=device_blocks, device_store=device_store)
        if host_store is None and device is None:
            raise ValueError("this plan keeps camera FiLM in host RAM: make_film needs the device or a host store")
        host_blocks = range(self.film_blocks, self.film_blocks + self.film_host_blocks)
        return FilmCache(device_blocks=device_blocks, host_blocks=host_blocks,
                         host_store=host_store or self.make_film_store(device), own_host_store=host_store is None,
                         device_store=device_store)

    def make_film_store(self, device) -> Optional[HostFilmStore]:
        """The pinned store of the host-kept FiLM blocks (None: the plan keeps none there), for a caller that keeps
        one store for many caches (the World session: every chunk of a video)."""
        if not self.film_host_blocks:
            return None
        slots = int(self.estimates.get("film_buffer_slots", 1))
        return HostFilmStore(device, slots=max(1, slots), keep_buffers=True)  # planned as the plan's own

    @property
    def resident_weight_bytes(self) -> int:
        """Device bytes of the kept GEMM weights (0 when the plan keeps none)."""
        return int(self.estimates.get("resident_weight_bytes", 0)) if self.resident_weights else 0

    @property
    def streamed_layers(self) -> int:
        return self.num_layers - self.cache_layers_on_gpu

    @property
    def device_cache_bytes(self) -> int:
        """Device bytes of the cache layers kept there (in the cache's dtype, or as FP8 codes)."""
        est = self.estimates
        codes = self.code_layers_on_gpu
        return ((self.cache_layers_on_gpu - codes) * int(est.get("cache_layer_bytes", 0))
                + codes * int(est.get("host_layer_bytes", 0)))

    def host_layer_indices(self) -> tuple[int, ...]:
        """The layers whose K/V live in pinned RAM (memory/kv_stream.layer_places: spread among the code layers)."""
        n = self.num_layers
        return host_indices(n, self.cache_layers_on_gpu - self.code_layers_on_gpu, self.code_layers_on_gpu)

    def to_json(self) -> dict:
        d = asdict(self)
        d["layout"] = asdict(self.layout)
        return d
