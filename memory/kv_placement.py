"""Carrying a Fast memory plan out: the K/V cache placed as planned (`place_kv_cache`: all on the device, or its
later layers streamed from pinned host RAM by memory/kv_stream.py) and, for the CLI and the benchmarks, the Fast model
loaded whole or block-swapped beside it (`FastPlacement`).

The plan is memory/fast_plan.py's, decided by memory/fast_planner.py. Nothing here imports ComfyUI.
"""
from __future__ import annotations

import logging
import threading
from dataclasses import dataclass
from typing import Callable, Optional

import torch
import torch.nn as nn

from ..speed.kv_fp8_fused import kv_fp8_ops
from ..wan.dit.kv_cache import KVCache
from ..wan.dit.model import DiTConfig
from .block_swap import BlockSwapper, streamed_block_keys
from .fast_plan import FastMemoryPlan
from .kv_host_alloc import HostLayers
from .kv_stream import KVStreamer
from .pinned import free_device_memory
from .placement import _drop_model

log = logging.getLogger(__name__)


@dataclass
class CachePlacement:
    """A KVCache placed by a plan, with the streamer (host layers) when there is one. close() frees both."""

    cache: KVCache
    streamer: Optional[KVStreamer] = None

    def close(self, background: bool = False) -> Optional[threading.Thread]:
        """Free the cache. background=True: the host layers are freed on a thread, returned (join it)."""
        thread = None
        if self.streamer is not None:
            thread = self.streamer.close(background)
            self.streamer = None
        self.cache.release()
        return thread

    def stats(self) -> dict:
        return self.streamer.stats() if self.streamer is not None else {"layers_on_device": self.cache.num_layers}


def place_kv_cache(plan: FastMemoryPlan, model: nn.Module, device, dtype: torch.dtype, *, batch: int = 1,
                   pin: Optional[bool] = None, fill: Optional[Callable] = None,
                   host_layers: Optional[HostLayers] = None) -> CachePlacement:
    """Allocate the cache of `plan` for `model` (a causal WanDiT) and hook the streamer into it if needed.
    fill(i, k, v): restore layer i right after it is allocated (memory/kv_park.py: a continued video).
    host_layers: the streamed layers' host memory, allocated ahead (`host_layers_for`); taken here."""
    cfg = model.cfg
    device = torch.device(device)
    heads = plan.cache_heads or cfg.num_heads
    if plan.cache == "gpu" or (plan.cache_layers_on_gpu >= cfg.num_layers and not plan.code_layers_on_gpu):
        cache = plan.layout.make(cfg.num_layers, heads, cfg.head_dim, batch=batch, dtype=dtype,
                                 device=device, cache_text=plan.cache_text, fill=fill,
                                 round_kv=kv_fp8_ops(device).round if plan.kv_fp8 else None)
        return CachePlacement(cache)
    pin = (device.type == "cuda") if pin is None else pin
    streamer = KVStreamer.build(plan.layout, cfg.num_layers, heads, cfg.head_dim, device=device,
                                layers_on_device=plan.cache_layers_on_gpu - plan.code_layers_on_gpu,
                                code_layers=plan.code_layers_on_gpu, dtype=dtype, batch=batch, pin=pin,
                                cache_text=plan.cache_text, fill=fill, host_layers=host_layers, fp8=plan.kv_fp8)
    streamer.install(model)
    return CachePlacement(streamer.cache, streamer)


def host_layers_for(plan: FastMemoryPlan, cfg: DiTConfig, device, dtype: torch.dtype, *, batch: int = 1,
                    pin: Optional[bool] = None) -> Optional[HostLayers]:
    """Start allocating the host part of `plan`'s cache now (worker threads), before the model exists: the
    layers `place_kv_cache` would put in host RAM. None when the plan streams nothing from host memory."""
    device = torch.device(device)
    if plan.cache != "host" or plan.cache_layers_on_gpu >= cfg.num_layers:
        return None
    heads = plan.cache_heads or cfg.num_heads
    pin = (device.type == "cuda") if pin is None else pin
    return HostLayers(KVStreamer.host_shape(plan.layout, heads, cfg.head_dim, batch), dtype,
                      plan.host_layer_indices(), pin, plan.kv_fp8)


class FastPlacement:
    """The Fast model loaded as planned (whole, or block-swapped) and its cache; close() frees everything.

    Used by the CLI and the benchmark (ComfyUI places the model through its own model management and only calls
    `place_kv_cache`).
    """

    def __init__(self, plan: FastMemoryPlan, device, log_fn: Optional[Callable[[str], None]] = None):
        self.plan = plan
        self.device = torch.device(device)
        self.log = log_fn or log.info
        self.model: Optional[nn.Module] = None
        self.swapper: Optional[BlockSwapper] = None
        self.placement: Optional[CachePlacement] = None
        self._host_layers: Optional[HostLayers] = None  # allocated ahead (start_host_memory), taken by make_cache
        self._release: Optional[threading.Thread] = None  # the host layers being freed (release_cache)
        self.host_memory_s: Optional[float] = None  # how long the host layers allocated ahead took

    def start_host_memory(self, cfg: DiTConfig, dtype: torch.dtype) -> bool:
        """Allocate the cache's host layers from now on, on worker threads, while the caller loads the model and
        encodes the inputs; make_cache() joins them. The device part keeps its place (after the model's load).
        False when the plan streams nothing from host memory."""
        if self._host_layers is None:
            self._host_layers = host_layers_for(self.plan, cfg, self.device, dtype)
        return self._host_layers is not None

    def load_model(self, path, weights: str = "nf4", compute_dtype: Optional[torch.dtype] = None,
                   loader: Optional[Callable[..., nn.Module]] = None,
                   progress: Optional[Callable[[int, int], None]] = None) -> nn.Module:
        """Load the model as planned. progress(done, total) after each tensor (raising from it cancels the load;
        nothing stays on the device)."""
        from ..loaders.expert_loader import load_expert

        loader = loader or load_expert
        blocks = self.plan.blocks_on_gpu
        kw = {} if blocks is None else {"host": streamed_block_keys(blocks)}
        if progress is not None:
            kw["progress"] = progress
        model = loader(path, device=self.device, mode=weights, compute_dtype=compute_dtype, **kw)
        if blocks is not None:
            self.swapper = BlockSwapper(model, self.device, blocks, pin=self.device.type == "cuda").install()
            self.log(f"Fast model placed for block swap: {blocks}/{len(model.blocks)} blocks on {self.device}")
        if self.plan.token_chunk is not None and hasattr(model, "set_token_chunk"):
            model.set_token_chunk(self.plan.token_chunk)
        self.model = model
        return model

    def make_cache(self, dtype: Optional[torch.dtype] = None, fill: Optional[Callable] = None) -> KVCache:
        if self.model is None:
            raise RuntimeError("load_model() first: the cache hooks into the model")
        dtype = dtype or self.model.dtype_for_compute()
        ahead, self._host_layers = self._host_layers, None
        if ahead is not None and (fill is not None or ahead.dtype != dtype):
            ahead.close()  # allocated for another dtype (not expected): allocate again below
            ahead = None
        try:
            self.placement = place_kv_cache(self.plan, self.model, self.device, dtype, fill=fill, host_layers=ahead)
            self.host_memory_s = None if ahead is None else ahead.seconds
        except BaseException:
            if ahead is not None:
                ahead.close()  # freed already if the allocation itself failed; idempotent
            raise
        return self.placement.cache

    def release_cache(self) -> None:
        """Free the cache now (the last chunk no longer needs it), the host layers on a thread, so that freeing
        them overlaps the last chunk's decode and the frames' writing; close() joins it."""
        if self.placement is not None:
            self._release = self.placement.close(background=True)
            self.placement = None

    def close(self) -> None:
        if self._host_layers is not None:
            self._host_layers.close()
            self._host_layers = None
        if self.placement is not None:
            self.placement.close()
            self.placement = None
        if self._release is not None:
            self._release.join()
            self._release = None
        if self.swapper is not None:
            self.swapper.remove(keep_host=False)
            self.swapper = None
        elif self.model is not None:
            _drop_model(self.model)  # callers may still hold the module: its tensors go now
        self.model = None
        free_device_memory(self.device)

    def __enter__(self) -> "FastPlacement":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
