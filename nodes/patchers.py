"""ComfyUI ModelPatchers for the pack's models, so ComfyUI's model management can load and evict them.

- `ExpertPatcher`: one NF4 (or bf16) DiT expert. ComfyUI's stock loading moves modules piecewise and
  backs weights up on the host; neither works for bitsandbytes' packed NF4 weights (no
  `comfy_cast_weights`, no float casts). Here "load" streams the expert from disk straight onto the
  device (or takes the copy parked in RAM) and "unload" drops it (or parks it). A partial unload is
  refused, which makes ComfyUI unload the whole expert instead.
- `VAEContainer`: the Wan VAE is a plain float32 module; the stock ModelPatcher handles it, wrapped in a
  container because ModelPatcher assigns `model.device` (WanVAE exposes it read-only).
- `TextEncoderSlot`: stands in ComfyUI's loaded-model list for the umT5 child process while it runs:
  loading it makes ComfyUI free VRAM for the child first, and unloading it (free memory, OOM recovery)
  stops the child.

Imported only inside ComfyUI (it subclasses comfy.model_patcher.ModelPatcher).
"""
from __future__ import annotations

import logging
from typing import Optional

import torch

import comfy.model_management as mm
import comfy.model_patcher
import comfy.utils
from comfy.patcher_extension import CallbacksMP

from ..text_encoder.encode import stop_all_text_encoders
from . import host_memory
from .expert_weights import ExpertWeights

log = logging.getLogger(__name__)


class ExpertOutOfMemory(torch.cuda.OutOfMemoryError):
    """Not enough VRAM for an expert; a CUDA OOM subclass so ComfyUI's OOM handling (tips, unload) applies."""


class ExpertContainer(torch.nn.Module):
    """What the patcher wraps: the DiT sits in `diffusion_model` only while it is loaded."""

    def __init__(self, weights: ExpertWeights):
        super().__init__()
        self.weights = weights
        self.diffusion_model: Optional[torch.nn.Module] = None

    def get_dtype(self) -> torch.dtype:
        return torch.bfloat16  # compute dtype on GPUs (NF4 storage is uint8, but nothing casts it here)


def _module_device(module: torch.nn.Module) -> Optional[torch.device]:
    for p in module.parameters():
        return p.device
    return None


def _same_device(a: Optional[torch.device], b: torch.device) -> bool:
    if a is None:
        return False
    if a.type != b.type:
        return False
    return a.type != "cuda" or (a.index or 0) == (b.index if b.index is not None else torch.cuda.current_device())


class ExpertPatcher(comfy.model_patcher.ModelPatcher):
    """A ModelPatcher whose load streams an NF4 expert and whose unload drops (or parks) it."""

    @property
    def weights(self) -> ExpertWeights:
        return self.model.weights

    def is_loaded(self) -> bool:
        return self.model.diffusion_model is not None

    def load(self, device_to=None, lowvram_model_memory=0, force_patch_weights=False, full_load=False, **kwargs):
        c = self.model
        device = torch.device(device_to) if device_to is not None else torch.device(self.load_device)
        with self.use_ejected():
            if c.diffusion_model is not None and not _same_device(_module_device(c.diffusion_model), device):
                self._release_weights()
            if c.diffusion_model is None:
                if not full_load and 0 < lowvram_model_memory < self.model_size():
                    # NF4 layers cannot be split between devices: the expert is loaded whole or not at all.
                    log.info("LingBot-World: %s loads whole (%.2f GB) although ComfyUI offered %.2f GB",
                             self.weights.label, self.model_size() / 1e9, lowvram_model_memory / 1e9)
                try:
                    dit = self.weights.materialize(device)
                except torch.cuda.OutOfMemoryError as e:
                    raise ExpertOutOfMemory(
                        f"Not enough GPU memory to load the {self.weights.label}: it needs about "
                        f"{self.model_size() / 2**30:.1f} GiB plus the activations. Choose memory_mode 'swap' "
                        f"(one expert at a time) or 'block_swap', a smaller size or fewer frames, or close other "
                        f"programs using the GPU. ({e})"
                    ) from None
                c.diffusion_model = dit
                info = getattr(dit, "load_info", None)
                if info is not None and info.bytes_on_device > 0 and not self.weights.block_swapping():
                    self.size = info.bytes_on_device  # exact figure for ComfyUI's accounting
            c.device = device
            c.model_loaded_weight_memory = self.model_size()
            c.model_lowvram = False
            c.lowvram_patch_counter = 0
            c.current_weight_patches_uuid = self.patches_uuid
            for callback in self.get_all_callbacks(CallbacksMP.ON_LOAD):
                callback(self, device_to, lowvram_model_memory, force_patch_weights, full_load)

    def _release_weights(self) -> None:
        c = self.model
        dit, c.diffusion_model = c.diffusion_model, None
        c.model_loaded_weight_memory = 0
        c.device = self.offload_device
        if dit is not None:
            self.weights.evict(dit, self.load_device)
            del dit
            mm.soft_empty_cache()
            host_memory.trim_now()  # on the CPU (or with pinned copies) the weights were host RAM

    def unpatch_model(self, device_to=None, unpatch_weights=True, **kwargs):
        self.eject_model()
        if unpatch_weights:
            self._release_weights()
            self.model.current_weight_patches_uuid = None
            self.backup.clear()
        for k in list(self.object_patches_backup.keys()):
            comfy.utils.set_attr(self.model, k, self.object_patches_backup[k])
        self.object_patches_backup.clear()

    def partially_unload(self, device_to, memory_to_free=0, *args, **kwargs):
        return 0  # nothing can be offloaded piecewise; ComfyUI then detaches (= unloads) the whole expert

    def add_patches(self, *args, **kwargs):
        raise NotImplementedError("LoRA / weight patches are not supported on LingBot-World NF4 experts")


class VAEContainer(torch.nn.Module):
    def __init__(self, vae: torch.nn.Module):
        super().__init__()
        self.vae = vae

    def get_dtype(self) -> torch.dtype:
        return torch.float32


class _EmptyContainer(torch.nn.Module):
    def get_dtype(self) -> torch.dtype:
        return torch.bfloat16


class TextEncoderSlot(comfy.model_patcher.ModelPatcher):
    """Accounts for the text-encoder child's VRAM in ComfyUI; unloading the slot stops the child."""

    def __init__(self, size: int, load_device, offload_device):
        super().__init__(_EmptyContainer(), load_device, offload_device, size=max(int(size), 1))

    def load(self, device_to=None, lowvram_model_memory=0, force_patch_weights=False, full_load=False, **kwargs):
        self.model.device = device_to if device_to is not None else self.load_device
        self.model.model_loaded_weight_memory = self.model_size()
        self.model.model_lowvram = False
        self.model.current_weight_patches_uuid = self.patches_uuid

    def unpatch_model(self, device_to=None, unpatch_weights=True, **kwargs):
        self.eject_model()
        if unpatch_weights and self.model.model_loaded_weight_memory:
            stopped = stop_all_text_encoders()
            if stopped:
                log.info("LingBot-World: stopped %d text-encoder process(es) to free memory", stopped)
            self.model.model_loaded_weight_memory = 0
            self.model.current_weight_patches_uuid = None
        self.model.device = self.offload_device

    def partially_unload(self, device_to, memory_to_free=0, *args, **kwargs):
        return 0


def is_registered(patcher) -> bool:
    """Is this patcher in ComfyUI's list of loaded models?"""
    return any(lm.model is patcher for lm in mm.current_loaded_models)


def unload_patcher(patcher) -> bool:
    """Unload one model the way ComfyUI's free_memory does, and drop it from the loaded-model list."""
    for i, lm in enumerate(mm.current_loaded_models):
        if lm.model is patcher:
            mm.current_loaded_models.pop(i)
            lm.model_unload()
            mm.soft_empty_cache()
            return True
    if getattr(patcher, "model", None) is not None and patcher.model.model_loaded_weight_memory:
        patcher.detach(unpatch_all=True)
    return False
