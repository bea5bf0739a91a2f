"""Memory modes: where the two experts live while the sampler runs (the `ExpertProvider`s of wan/sampling/sampler.py).

- resident:    both experts on the device for the whole run (loaded on first use, no reload at the switch).
- swap:        one expert on the device at a time. The released one is dropped (streamed from disk again next
               time; host RAM stays small) or, with keep_in_ram, kept in pinned host RAM for a fast switch.
- block_swap:  one expert at a time, and only its first N blocks (plus embeddings and head) on the device; the
               other blocks stream from pinned host RAM one block ahead of the compute (memory/block_swap.py).
- auto:        picks one of these from free VRAM / RAM, the expert sizes and an activation estimate for the video
               size (`plan_memory`, memory/expert_plan.py), also the CFG mode (batch, layered or sequential), and
               logs the choice and why in one line.

`make_provider(...)` builds any of them. Nothing here imports ComfyUI.
"""
from __future__ import annotations

import gc
import logging
import time
from pathlib import Path
from typing import Callable, Optional, Union

import torch
import torch.nn as nn

from ..quant.nf4_format import default_compute_dtype
from ..wan.dit.blocks import DEFAULT_TOKEN_CHUNK
from ..wan.dit.model import DiTConfig
from .block_swap import BlockSwapper, _empty_part, streamed_block_keys
from .estimates import WEIGHTS, available_ram_bytes, free_vram_bytes
from .expert_plan import MODES, MemoryPlan, plan_memory
from .pinned import WeightPart, clear_device_caches, dit_parts, free_device_memory, synchronize

_log = logging.getLogger(__name__)

EXPERT_NAMES = ("high", "low")

Log = Callable[[str], None]
Loader = Callable[..., nn.Module]
PathLike = Union[str, Path]


# ---- providers ------------------------------------------------------------------------------------------
def _default_loader(path, device, mode, compute_dtype, host=None):
    from ..loaders.expert_loader import load_expert

    return load_expert(path, device=device, mode=mode, compute_dtype=compute_dtype, host=host)


def _as_log(log) -> Log:
    if log is None:
        return _log.info
    if isinstance(log, logging.Logger):
        return log.info
    return log


class PlacementProvider:
    """Shared parts of the providers: paths, loading with timing, events for benchmarks, close()."""

    mode = "?"

    def __init__(
        self,
        paths: dict[str, PathLike],
        device: Union[str, torch.device] = "cuda",
        weights: str = "nf4",
        compute_dtype: Optional[torch.dtype] = None,
        log: Optional[Union[Log, logging.Logger]] = None,
        loader: Optional[Loader] = None,
        plan: Optional[MemoryPlan] = None,
        prepare: Optional[Callable[[nn.Module], object]] = None,
    ):
        missing = [n for n in EXPERT_NAMES if n not in paths]
        if missing:
            raise ValueError(f"no path for the {', '.join(missing)}-noise expert")
        if weights not in WEIGHTS:
            raise ValueError(f"weights {weights!r}: choose one of {WEIGHTS}")
        self.paths = {n: paths[n] for n in EXPERT_NAMES}
        self.device = torch.device(device)
        if self.device.type == "cuda" and self.device.index is None and torch.cuda.is_available():
            self.device = torch.device("cuda", torch.cuda.current_device())
        self.weights = weights
        self.compute_dtype = compute_dtype or (torch.bfloat16 if weights == "bf16" else default_compute_dtype(self.device))
        self.log = _as_log(log)
        self.loader = loader or _default_loader
        self.plan = plan
        self.prepare = prepare  # called on every expert placed on the device (speed options)
        self.events: list[dict] = []  # one per acquire/release: op, name, source, seconds

    def _load(self, name: str, device: torch.device, **kw) -> nn.Module:
        t0 = time.perf_counter()
        model = self.loader(self.paths[name], device=device, mode=self.weights, compute_dtype=self.compute_dtype, **kw)
        synchronize(device)
        dt = time.perf_counter() - t0
        info = getattr(model, "load_info", None)
        self.log(f"{name}-noise expert loaded from disk {load_words(device, dt, info)}")
        return model

    def _prepare(self, model: nn.Module) -> nn.Module:
        if self.plan is not None and self.plan.token_chunk is not None and hasattr(model, "set_token_chunk"):
            model.set_token_chunk(self.plan.token_chunk)
        if self.prepare is not None:
            self.prepare(model)
        return model

    def _event(self, op: str, name: str, source: str, t0: float) -> None:
        synchronize(self.device)
        rec = {"op": op, "name": name, "source": source, "seconds": time.perf_counter() - t0}
        if self.device.type == "cuda":
            rec["allocated_after"] = torch.cuda.memory_allocated(self.device)
        self.events.append(rec)

    def close(self) -> None:
        """Free every expert (device and host copies)."""

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class ResidentProvider(PlacementProvider):
    """Both experts stay on the device once loaded."""

    mode = "resident"

    def __init__(self, *args, **kw):
        super().__init__(*args, **kw)
        self.models: dict[str, nn.Module] = {}

    def acquire(self, name: str) -> nn.Module:
        t0 = time.perf_counter()
        source = "resident"
        if name not in self.models:
            self.models[name] = self._prepare(self._load(name, self.device))
            source = "disk"
        self._event("acquire", name, source, t0)
        return self.models[name]

    def release(self, name: str) -> None:
        self.events.append({"op": "release", "name": name, "source": "kept", "seconds": 0.0})

    def close(self) -> None:
        self.models.clear()
        free_device_memory(self.device)


class SwapProvider(PlacementProvider):
    """One expert on the device at a time; the released one is dropped or kept in pinned host RAM."""

    mode = "swap"

    def __init__(self, *args, keep_in_ram: bool = False, **kw):
        super().__init__(*args, **kw)
        self.keep_in_ram = keep_in_ram
        self.active: Optional[str] = None
        self.model: Optional[nn.Module] = None
        self.kept: dict[str, tuple[nn.Module, list[WeightPart]]] = {}  # name -> model with host copies

    def acquire(self, name: str) -> nn.Module:
        if self.active == name:
            return self.model
        if self.active is not None:
            self.release(self.active)  # the one-at-a-time promise holds even if a caller forgets to release
        t0 = time.perf_counter()
        if name in self.kept:
            model, parts = self.kept[name]
            for p in parts:
                p.to_device(self.device)
            source = "ram"
            synchronize(self.device)
            self.log(f"{name}-noise expert restored from pinned RAM in {time.perf_counter() - t0:.2f} s")
        else:
            model = self._load(name, self.device)
            source = "disk"
        self.model, self.active = self._prepare(model), name
        self._event("acquire", name, source, t0)
        return model

    def release(self, name: str) -> None:
        if self.active != name:
            return
        t0 = time.perf_counter()
        model, self.model, self.active = self.model, None, None
        if self.keep_in_ram:
            parts = self.kept[name][1] if name in self.kept else dit_parts(model)
            for p in parts:
                p.to_host(pin=True)
            clear_device_caches(model)
            self.kept[name] = (model, parts)
            source = "to_ram"
        else:
            _drop_model(model)
            source = "dropped"
        del model
        free_device_memory(self.device)
        self._event("release", name, source, t0)

    def close(self) -> None:
        if self.active is not None:
            model, self.model, self.active = self.model, None, None
            _drop_model(model)
            del model
        for model, parts in self.kept.values():
            for p in parts:
                _empty_part(p)
        self.kept.clear()
        free_device_memory(self.device)


class BlockSwapProvider(PlacementProvider):
    """One expert at a time with only `blocks_on_gpu` blocks resident; the rest stream from pinned RAM."""

    mode = "block_swap"

    def __init__(self, *args, blocks_on_gpu: int = 0, keep_in_ram: bool = False, **kw):
        super().__init__(*args, **kw)
        if not isinstance(blocks_on_gpu, int) or isinstance(blocks_on_gpu, bool) or blocks_on_gpu < 0:
            raise ValueError(f"blocks_on_gpu must be an integer >= 0, got {blocks_on_gpu!r}")
        self.blocks_on_gpu = blocks_on_gpu
        self.keep_in_ram = keep_in_ram
        self.active: Optional[str] = None
        self.model: Optional[nn.Module] = None
        self.swapper: Optional[BlockSwapper] = None
        self.kept: dict[str, tuple[nn.Module, list[WeightPart]]] = {}
        self.last_stats: dict = {}

    def acquire(self, name: str) -> nn.Module:
        if self.active == name:
            return self.model
        if self.active is not None:
            self.release(self.active)
        t0 = time.perf_counter()
        if name in self.kept:
            model, parts = self.kept.pop(name)
            source = "ram"
        else:
            # Base and blocks 0..N-1 straight to the device, the streamed blocks to host memory (then pinned).
            model, parts = self._load(name, self.device, host=streamed_block_keys(self.blocks_on_gpu)), None
            source = "disk"
        self.swapper = BlockSwapper(model, self.device, self.blocks_on_gpu, parts=parts, pin=True).install()
        self.model, self.active = self._prepare(model), name
        self.log(
            f"{name}-noise expert placed for block swap: {self.swapper.resident}/{self.swapper.num_blocks} blocks on "
            f"{self.device}, the rest streamed from pinned RAM ({time.perf_counter() - t0:.1f} s)"
        )
        self._event("acquire", name, source, t0)
        return model

    def release(self, name: str) -> None:
        if self.active != name:
            return
        t0 = time.perf_counter()
        self.last_stats = self.swapper.stats()
        parts = self.swapper.remove(keep_host=self.keep_in_ram)
        model, self.model, self.active, self.swapper = self.model, None, None, None
        if self.keep_in_ram:
            self.kept[name] = (model, parts)
        del model, parts
        free_device_memory(self.device)
        self._event("release", name, "to_ram" if self.keep_in_ram else "dropped", t0)

    def close(self) -> None:
        if self.active is not None:
            self.swapper.remove(keep_host=False)
            self.model, self.active, self.swapper = None, None, None
        for model, parts in self.kept.values():
            for p in parts:
                _empty_part(p)
        self.kept.clear()
        free_device_memory(self.device)


def _drop_model(model: nn.Module) -> None:
    """Cut the model's tensors loose now (callers may still hold the module object)."""
    for p in dit_parts(model):
        _empty_part(p)
    clear_device_caches(model)
    gc.collect()


# ---- the factory ----------------------------------------------------------------------------------------
def read_expert_config(path: PathLike) -> DiTConfig:
    from ..loaders.expert_format import detect_format

    return detect_format(path).config


def make_provider(
    mode: str,
    high_path: PathLike,
    low_path: PathLike,
    device: Union[str, torch.device] = "cuda",
    weights: str = "nf4",
    keep_in_ram: Optional[bool] = None,
    blocks_on_gpu: Optional[int] = None,
    *,
    video: Optional[tuple[int, int, int]] = None,
    cfg_mode: str = "auto",
    camera: bool = True,
    compute_dtype: Optional[torch.dtype] = None,
    token_chunk: Optional[int] = DEFAULT_TOKEN_CHUNK,
    vram_free: Optional[int] = None,
    ram_free: Optional[int] = None,
    log: Optional[Union[Log, logging.Logger]] = None,
    loader: Optional[Loader] = None,
    prepare: Optional[Callable[[nn.Module], object]] = None,
    seq_parallel: int = 1,
) -> PlacementProvider:
    """Build the ExpertProvider for a memory mode ("auto", "resident", "swap", "swap_pinned", "block_swap").

    video: (frames, height, width) of the generation; needed by "auto" and by "block_swap" without
    blocks_on_gpu, and used to decide the CFG mode, batch / layered / sequential (`provider.plan.cfg_mode`, to pass to
    SamplingSettings when the user chose "auto"). keep_in_ram: None = decide from free RAM (swap, block_swap).
    prepare: called with every expert placed on the device (e.g. `speed.options.apply_speed`).
    vram_free / ram_free: override the measured free memory (tests, simulated cards).
    seq_parallel: ranks splitting each forward's tokens (parallel/ulysses.py); activations are planned for this
    rank's share.
    The chosen plan is on `provider.plan` and is logged in one line.
    """
    if mode not in MODES:
        raise ValueError(f"memory mode {mode!r}: choose one of {', '.join(MODES)}")
    device = torch.device(device)
    needs_video = mode == "auto" or (mode == "block_swap" and blocks_on_gpu is None)
    if needs_video and video is None:
        raise ValueError(f"memory mode {mode!r} needs video=(frames, height, width) to size the activations")
    cfg = read_expert_config(high_path)
    plan = None
    if video is not None:
        if vram_free is None and device.type == "cuda":
            vram_free = free_vram_bytes(device)  # on the CPU it stays None: no device budget
        if ram_free is None:
            ram_free = available_ram_bytes()
        cdt = compute_dtype or (torch.bfloat16 if weights == "bf16" else default_compute_dtype(device))
        plan = plan_memory(
            video, cfg, vram_free, ram_free, weights=weights, mode=mode, keep_in_ram=keep_in_ram,
            blocks_on_gpu=blocks_on_gpu, cfg_mode=cfg_mode, camera=camera,
            compute_bytes=torch.empty(0, dtype=cdt).element_size(), token_chunk=token_chunk,
            seq_parallel=seq_parallel,
        )
    else:
        name = "swap" if mode == "swap_pinned" else mode
        keep = True if mode == "swap_pinned" else bool(keep_in_ram)
        plan = MemoryPlan(name, keep, blocks_on_gpu, cfg_mode == "batch", f"requested: {name}", token_chunk,
                          cfg_layered=cfg_mode == "layered")
    _as_log(log)(f"memory plan: {plan.reason}")

    common = dict(paths={"high": high_path, "low": low_path}, device=device, weights=weights,
                  compute_dtype=compute_dtype, log=log, loader=loader, plan=plan, prepare=prepare)
    if plan.mode == "resident":
        return ResidentProvider(**common)
    if plan.mode == "swap":
        return SwapProvider(**common, keep_in_ram=plan.keep_in_ram)
    return BlockSwapProvider(**common, blocks_on_gpu=int(plan.blocks_on_gpu or 0), keep_in_ram=plan.keep_in_ram)


def load_words(device: torch.device, seconds: float, info=None) -> str:
    """"into RAM in 0.1 s (2.3 MB, 21 MB/s)" / "to cuda:0 in 4.1 s (9.61 GB, 2.35 GB/s)": where a load put the
    weights, in units that say something for a tiny model too."""
    where = "into RAM" if torch.device(device).type == "cpu" else f"to {device}"
    if info is None or not info.bytes_read:
        return f"{where} in {seconds:.1f} s"
    size, rate = info.bytes_read, info.bytes_read / info.seconds if info.seconds > 0 else None
    return f"{where} in {seconds:.1f} s ({_amount(size)}" + (f", {_amount(rate)}/s)" if rate else ")")


def _amount(n: float) -> str:
    return f"{n / 1e9:.2f} GB" if n >= 1e9 else f"{n / 1e6:.1f} MB"
