"""Expert placement inside ComfyUI: the sampler's ExpertProvider on top of ComfyUI's model management.

Each expert is loaded with `load_models_gpu([patcher], memory_required=<activations>, force_full_load=True)`
right before its phase, so ComfyUI first evicts whatever else it holds (other models, our VAE, the other
expert if needed) and can unload ours later ("free memory", OOM recovery, the next workflow's models).

The memory mode is planned by `memory.expert_plan.plan_memory` (issue 9) from the video size, the expert
config, the VRAM ComfyUI could make free and the host RAM:
- resident: both experts stay loaded after use (ComfyUI may still evict one when something else needs room);
- swap: each expert is released right after its phase, dropped or (keep_in_ram, "swap_pinned") parked in
  pinned RAM for a fast switch back;
- block_swap: one expert at a time with only N blocks on the GPU, the rest streamed from pinned RAM;
- auto: the planner picks one of these and the CFG mode (batch, layered or sequential), and logs why.
"""
from __future__ import annotations

import logging
from typing import Callable, Optional

import torch.nn as nn

from ...memory.estimates import available_ram_bytes
from ...memory.expert_plan import MemoryPlan, plan_memory
from .expert_weights import compute_bytes_for
from .payloads import ExpertPair

log = logging.getLogger(__name__)

GiB = 1024**3


def free_memory(mm, device, patcher=None) -> int:
    """Free device memory as current ComfyUI counts it: `ModelPatcher.get_free_memory(device)` (newer cores; it also
    counts what dynamic VRAM holds and would give up), else model_management's `get_free_memory` (0.3.x)."""
    counted = getattr(patcher, "get_free_memory", None)
    if callable(counted):
        try:
            return int(counted(device))
        except TypeError:  # a different signature: fall back to the module function
            pass
    return int(mm.get_free_memory(device))


def vram_comfy_can_free(mm, device, patcher=None) -> Optional[int]:
    """Free device memory now plus what ComfyUI holds in models it may evict for us; None on the CPU (ComfyUI
    --cpu: host RAM holds everything and the planner has no device budget to respect)."""
    if mm.is_device_cpu(device):
        return None
    held = sum(_held(lm) for lm in mm.current_loaded_models if lm.device == device)
    return int(free_memory(mm, device, patcher) + held)


def _held(lm) -> int:
    """What one of ComfyUI's loaded models holds on its device that it would give up for ours. An entry whose
    patcher is gone (a dead weak reference: core's free_memory skips it too) holds nothing. A dynamic-VRAM model
    (newer cores with comfy-aimdo: `is_dynamic()`) counts only its weights loaded outside aimdo's pages: the pages
    are in `ModelPatcher.get_free_memory` already (free_memory above), as core's own callers count them."""
    model = getattr(lm, "model", lm)
    if model is None:
        return 0
    dynamic = getattr(model, "is_dynamic", None)
    if callable(dynamic) and dynamic():
        return int(getattr(getattr(model, "model", None), "model_loaded_weight_memory", 0) or 0)
    return int(lm.model_loaded_memory())


def plan_for(experts: ExpertPair, video: tuple[int, int, int], cfg_mode: str, camera: bool,
             vram_free: Optional[int], ram_free: Optional[int] = None, device=None) -> MemoryPlan:
    """The memory plan for this run: the user's memory_mode / blocks_on_gpu, the rest decided by the planner."""
    import torch

    mode = experts.memory_mode
    keep = {"swap": False, "swap_pinned": True, "resident": False}.get(mode)  # None: planner decides from RAM
    blocks = experts.blocks_on_gpu if experts.blocks_on_gpu >= 0 else None
    device = torch.device(device) if device is not None else torch.device("cpu")
    return plan_memory(video, experts.formats["high"].config, vram_free,
                       ram_free if ram_free is not None else available_ram_bytes(), weights=experts.weights,
                       mode=mode, keep_in_ram=keep, blocks_on_gpu=blocks, cfg_mode=cfg_mode, camera=camera,
                       compute_bytes=compute_bytes_for(device, experts.weights))


def camera_cache_for(choice: str, experts: ExpertPair, video: tuple[int, int, int], camera: bool, steps: int,
                     cfg_mode: str, plan: MemoryPlan, device=None):
    """The camera FiLM cache for this run (memory/camera_cache.py), planned next to the memory plan; None = off."""
    import torch

    from ...memory.camera_cache import camera_cache_for_run

    device = torch.device(device) if device is not None else torch.device("cpu")
    return camera_cache_for_run(choice, video, experts.formats["high"].config, plan, camera=camera, steps=steps,
                                cfg_mode=cfg_mode, device=device,
                                compute_bytes=compute_bytes_for(device, experts.weights),
                                log=lambda line: log.info("LingBot-World camera cache: %s", line))


def activation_bytes(plan: MemoryPlan) -> int:
    return plan.activation_bytes


class ComfyExpertProvider:
    """`wan.sampler.ExpertProvider` backed by ComfyUI's `load_models_gpu` and our ExpertPatchers."""

    def __init__(self, experts: ExpertPair, plan: MemoryPlan, progress: Optional[Callable[[str], Callable]] = None):
        import comfy.model_management as mm

        from .patchers import unload_patcher

        self.mm = mm
        self.experts = experts
        self.plan = plan
        self.activation_bytes = activation_bytes(plan)
        self.progress = progress
        self.events: list[tuple[str, str]] = []
        blocks = plan.blocks_on_gpu if plan.mode == "block_swap" else None
        for name in ("high", "low"):
            patcher = experts.patcher(name)
            w = patcher.weights
            if patcher.is_loaded() and (blocks != w.blocks_on_gpu):
                unload_patcher(patcher)  # placed differently last run: reload under this plan
            w.set_placement(plan.keep_in_ram, blocks)
            if not patcher.is_loaded():
                patcher.size = w.device_bytes(patcher.load_device)

    def _fits_beside_other(self, patcher) -> bool:
        mm = self.mm
        device = patcher.load_device
        if mm.is_device_cpu(device):
            return True  # host RAM: ComfyUI does not budget it either
        need = patcher.model_size() + self.activation_bytes + mm.minimum_inference_memory()
        return free_memory(mm, device, patcher) >= need

    def acquire(self, name: str) -> nn.Module:
        from .patchers import is_registered, unload_patcher

        patcher = self.experts.patcher(name)
        other = self.experts.patcher("low" if name == "high" else "high")
        if self.plan.mode == "resident" and other.is_loaded() and not patcher.is_loaded():
            if not self._fits_beside_other(patcher):
                log.info("LingBot-World: the %s-noise expert does not fit beside the other one any more; "
                         "releasing the other first", name)
                unload_patcher(other)
        if not patcher.is_loaded():
            log.info("LingBot-World: loading the %s (%.2f GiB on the device)", patcher.weights.label,
                     patcher.model_size() / GiB)
        if self.progress is not None:
            patcher.weights.progress = self.progress(name)
        try:
            self.mm.load_models_gpu([patcher], memory_required=self.activation_bytes, force_full_load=True)
        finally:
            patcher.weights.progress = None
        if not patcher.is_loaded() or not is_registered(patcher):
            raise RuntimeError(f"ComfyUI did not load the {name}-noise expert; see the log above")
        model = patcher.dit
        if self.plan.token_chunk is not None and hasattr(model, "set_token_chunk"):
            model.set_token_chunk(self.plan.token_chunk)
        self.events.append(("acquire", name))
        return model

    def release(self, name: str) -> None:
        from .patchers import unload_patcher

        self.events.append(("release", name))
        if self.plan.mode in ("swap", "block_swap"):
            unload_patcher(self.experts.patcher(name))
