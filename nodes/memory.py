"""Expert placement inside ComfyUI: the sampler's ExpertProvider on top of ComfyUI's model management.

Each expert is loaded with `load_models_gpu([patcher], memory_required=<activations>, force_full_load=True)`
right before its phase, so ComfyUI first evicts whatever else it holds (other models, our VAE, the other
expert if needed) and can unload ours later ("free memory", OOM recovery, the next workflow's models).

Memory modes (the loader node's `memory_mode`):
- resident: keep both experts loaded after use (ComfyUI may still evict one when something else needs room);
- swap: release each expert right after its phase (weights dropped, streamed from disk next time);
- swap_pinned: like swap, but the released expert is parked in pinned host RAM for a fast switch back;
- auto: resident when the low-noise expert fits beside the high-noise one, else release the high one first;
- block_swap: delegated to issue 9's `loaders.block_swap`, when present.
"""
from __future__ import annotations

import logging
from typing import Callable, Optional

import torch
import torch.nn as nn

from ..wan.dit import DiTConfig
from ..wan.sizes import PATCH
from .payloads import ExpertPair

log = logging.getLogger(__name__)

GiB = 1024**3


def estimate_activation_bytes(cfg: DiTConfig, latent_shape: tuple, cfg_batch: bool) -> int:
    """Peak extra VRAM of one DiT forward, beyond the weights (conservative; spec §10.2).

    Uses issue 9's measured estimate (`loaders.placement.estimate_activation_bytes`) when it exists;
    otherwise counts per token: the fp32 residual and its block temporaries (~8 x dim x 4 B), q/k/v and
    RoPE copies (~6 x dim x 4 B), the FFN hidden twice in bf16 (2 x ffn x 2 B), plus the largest
    dequantized weight (time_projection, 6 x dim^2 bf16).
    """
    _, _, f, h, w = latent_shape
    tokens = f * (h // PATCH) * (w // PATCH)
    batch = 2 if cfg_batch else 1
    try:
        from ..loaders import placement  # type: ignore  # issue 9, may not exist yet

        frames = 1 + 4 * (f - 1)
        return int(placement.estimate_activation_bytes(frames, h * 8, w * 8, cfg, cfg_batch))
    except (ImportError, AttributeError, TypeError):
        pass
    per_token = (8 + 6) * cfg.dim * 4 + 2 * cfg.ffn_dim * 2
    return int(batch * tokens * per_token + 6 * cfg.dim * cfg.dim * 2)


class ComfyExpertProvider:
    """`wan.sampler.ExpertProvider` backed by ComfyUI's `load_models_gpu` and our ExpertPatchers."""

    def __init__(self, experts: ExpertPair, activation_bytes: int, progress: Optional[Callable[[str], Callable]] = None):
        import comfy.model_management as mm

        mode = experts.memory_mode
        if mode == "block_swap":
            raise NotImplementedError(
                "memory_mode 'block_swap' needs loaders/block_swap.py (issue 9), which this build does not have "
                "yet; choose 'swap' (one expert on the GPU at a time) or 'auto'"
            )
        self.mm = mm
        self.experts = experts
        self.mode = mode
        self.activation_bytes = int(activation_bytes)
        self.progress = progress
        self.events: list[tuple[str, str]] = []

    def _other(self, name: str):
        return self.experts.patcher("low" if name == "high" else "high")

    def _fits_beside_other(self, patcher) -> bool:
        mm = self.mm
        device = patcher.load_device
        if mm.is_device_cpu(device):
            return True  # host RAM: ComfyUI does not budget it either
        need = patcher.model_size() + self.activation_bytes + mm.minimum_inference_memory()
        return mm.get_free_memory(device) >= need

    def acquire(self, name: str) -> nn.Module:
        from .patchers import is_registered, unload_patcher

        patcher = self.experts.patcher(name)
        other = self._other(name)
        if self.mode == "auto" and other.is_loaded() and not patcher.is_loaded():
            if not self._fits_beside_other(patcher):
                log.info("LingBot-World: auto memory: the %s-noise expert does not fit beside the other one; "
                         "releasing the other first", name)
                unload_patcher(other)
        if not patcher.is_loaded():
            log.info("LingBot-World: loading the %s (%.2f GiB)", patcher.weights.label, patcher.model_size() / GiB)
        if self.progress is not None:
            patcher.weights.progress = self.progress(name)
        try:
            self.mm.load_models_gpu([patcher], memory_required=self.activation_bytes, force_full_load=True)
        finally:
            patcher.weights.progress = None
        if not patcher.is_loaded() or not is_registered(patcher):
            raise RuntimeError(f"ComfyUI did not load the {name}-noise expert; see the log above")
        self.events.append(("acquire", name))
        return patcher.model.diffusion_model

    def release(self, name: str) -> None:
        from .patchers import unload_patcher

        self.events.append(("release", name))
        if self.mode in ("swap", "swap_pinned"):
            unload_patcher(self.experts.patcher(name))

