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

from ...memory.estimates import expert_sizes
from ...world.text import stop_all_text_encoders
from . import host_memory
from .dit_slot import DiTSlot
from .expert_weights import ExpertWeights, compute_bytes_for

log = logging.getLogger(__name__)


class ExpertOutOfMemory(torch.cuda.OutOfMemoryError):
    """Not enough VRAM for an expert; a CUDA OOM subclass so ComfyUI's OOM handling (tips, unload) applies."""


class ExpertContainer(torch.nn.Module):
    """What the LINGBOT_EXPERTS patchers wrap (the native MODEL wraps `native_model.LingBotWorldModel`, which has
    the same `weights` / `slot` / LoRA fields): the DiT is attached to `slot` only while it is loaded."""

    def __init__(self, weights: ExpertWeights, compute_dtype: torch.dtype = torch.bfloat16):
        super().__init__()
        self.weights = weights
        self.__dict__["slot"] = DiTSlot(weights.fmt.config, compute_dtype)
        self.applied_lora = None  # quant.lora.AppliedLora of the patches on the loaded DiT
        self.lora_uuid = None  # ModelPatcher.patches_uuid of those patches

    @property
    def diffusion_model(self) -> Optional[torch.nn.Module]:
        return self.slot.dit

    def state_dict(self, *args, **kwargs):
        return self.slot.keys_state_dict()  # names for LoRA key maps, nothing loaded

    def get_dtype(self) -> torch.dtype:
        return self.slot.dtype


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


NO_LIMIT = 1e31  # LoadedModel.model_load passes 1e32 for "load everything"
SMALLEST_BUDGET = 1  # bytes: "as little as possible" (load() reads a budget of 0 as "no limit")


def load_budget(used: int, extra_memory: float) -> tuple[bool, int]:
    """(full load?, lowvram budget for `load`) from what partially_load is offered.

    Newer ComfyUI computes the low-VRAM budget as max(0, free - reserve) - loaded, so `extra_memory` can be <= 0:
    there is no room beyond what the expert already holds, or less. The pack cannot give back part of a loaded expert
    piecewise, so it places the expert as small as it goes (block swap, no block resident) instead of ignoring it.
    """
    if extra_memory >= NO_LIMIT:
        return True, 0
    budget = int(used + extra_memory)
    if budget <= 0:
        log.info("LingBot-World: ComfyUI offers no VRAM for this expert (%.2f GiB): the fewest blocks on the GPU",
                 budget / 2**30)
    return False, max(budget, SMALLEST_BUDGET)


class ExpertPatcher(comfy.model_patcher.ModelPatcher):
    """A ModelPatcher whose load streams an NF4 expert and whose unload drops (or parks) it.

    ComfyUI's piecewise loading cannot split bitsandbytes' packed weights, so the budget ComfyUI offers is honoured
    the pack's way: the whole expert when it fits, else block swap with as many blocks on the GPU as the budget
    holds (the rest streamed from pinned RAM each step). A forced full load (LingBot Sampler) keeps the placement
    its memory plan set. LoRA patches (`add_patches`, e.g. from LoraLoaderModelOnly) are hung on the loaded linears
    (`quant.lora`), and swapped without reloading the expert when another clone's patches are needed.
    """

    @property
    def weights(self) -> ExpertWeights:
        return self.model.weights

    @property
    def dit(self) -> Optional[torch.nn.Module]:
        return self.model.slot.dit

    def is_loaded(self) -> bool:
        return self.model.slot.dit is not None

    def add_patches(self, patches, strength_patch=1.0, strength_model=1.0):
        added = super().add_patches(patches, strength_patch, strength_model)
        if added and strength_patch != 0:
            self.size = self.model_size() + lora_device_bytes([patches[k] for k in added], self.model.get_dtype())
        return added

    # ---- loading ---------------------------------------------------------------------------------------------
    def partially_load(self, device_to, extra_memory=0, force_patch_weights=False):
        with self.use_ejected(skip_and_inject_on_exit_only=True):
            c = self.model
            used = c.model_loaded_weight_memory
            self.unpatch_model(self.offload_device, unpatch_weights=False)  # the last clone's object patches out
            self.patch_model(load_weights=False)  # this clone's in (ModelSamplingSD3, ...)
            full, budget = load_budget(used, extra_memory)
            try:
                self.load(device_to, lowvram_model_memory=budget, force_patch_weights=force_patch_weights,
                          full_load=full)
            except BaseException:  # newer ComfyUI's InterruptProcessingException is a BaseException: clean up too
                self.detach()
                raise
            return c.model_loaded_weight_memory - used

    def load(self, device_to=None, lowvram_model_memory=0, force_patch_weights=False, full_load=False, **kwargs):
        c = self.model
        w = self.weights
        device = torch.device(device_to) if device_to is not None else torch.device(self.load_device)
        with self.use_ejected():
            if not full_load and lowvram_model_memory != 0:  # 0: no limit; below 0: newer ComfyUI has no room left
                self._place_for_budget(device, max(int(lowvram_model_memory), SMALLEST_BUDGET))
            if self.is_loaded() and self._needs_reload(device):
                self._release_weights()
            if not self.is_loaded():
                try:
                    dit = w.materialize(device)
                except torch.cuda.OutOfMemoryError as e:
                    raise ExpertOutOfMemory(
                        f"Not enough GPU memory to load the {w.label}: it needs about "
                        f"{self.model_size() / 2**30:.1f} GiB plus the activations. Choose memory_mode 'swap' "
                        f"(one expert at a time) or 'block_swap', a smaller size or fewer frames, or close other "
                        f"programs using the GPU. ({e})"
                    ) from None
                c.slot.attach(dit)
            self._apply_lora(device)
            lora_bytes = c.applied_lora.nbytes if c.applied_lora is not None else 0
            info = getattr(c.slot.dit, "load_info", None)
            if info is not None and info.bytes_on_device > 0 and not w.block_swapping():
                weight_bytes = info.bytes_on_device
                self.size = weight_bytes + lora_bytes  # exact figure for ComfyUI's accounting
            else:
                weight_bytes = w.device_bytes(device)
            c.device = device
            c.model_loaded_weight_memory = weight_bytes + lora_bytes
            c.model_lowvram = w.block_swapping()
            c.lowvram_patch_counter = 0
            c.current_weight_patches_uuid = self.patches_uuid
            for callback in self.get_all_callbacks(CallbacksMP.ON_LOAD):
                callback(self, device_to, lowvram_model_memory, force_patch_weights, full_load)

    def _place_for_budget(self, device: torch.device, budget: int) -> None:
        """ComfyUI offers `budget` bytes: the whole expert if it fits, else block swap with what fits."""
        w = self.weights
        if device.type != "cuda":
            return
        lora = lora_device_bytes(self.patches.values(), self.model.get_dtype()) if self.patches else 0
        sizes = expert_sizes(w.fmt.config, w.mode, compute_bytes_for(device, w.mode))
        if budget >= sizes.total + lora:
            blocks = None
        else:
            blocks = int((budget - lora - sizes.base - 2 * sizes.block) // max(sizes.block, 1))
            blocks = max(0, min(blocks, sizes.num_blocks - 1))
        if blocks != w.blocks_on_gpu:
            if blocks is not None:
                log.info("LingBot-World: ComfyUI offers %.2f GiB for the %s (%.2f GiB whole): %d of %d blocks on the "
                         "GPU, the rest streamed from pinned RAM (block swap)", budget / 2**30, w.label,
                         (sizes.total + lora) / 2**30, blocks, sizes.num_blocks)
            w.set_placement(w.keep_in_ram, blocks)

    def _needs_reload(self, device: torch.device) -> bool:
        w, c = self.weights, self.model
        if not _same_device(_module_device(c.slot.dit), device):
            return True
        placed = w.swapper.resident if w.swapper is not None else None
        if placed != (w.blocks_on_gpu if w.block_swapping() else None):
            return True
        # merged LoRA weights cannot be taken out again: another clone's patches need a fresh copy
        want = self.patches_uuid if self.patches else None
        return c.applied_lora is not None and c.applied_lora.needs_reload and c.lora_uuid != want

    def _apply_lora(self, device: torch.device) -> None:
        c = self.model
        want = self.patches_uuid if self.patches else None
        if c.lora_uuid == want:
            return
        if c.applied_lora is not None:
            c.applied_lora.remove()
            c.applied_lora = None
        c.lora_uuid = None
        if not self.patches:
            return
        from ...quant.lora import apply_lora
        from .lora_patches import hooks_from_patches

        dit, w = c.slot.dit, self.weights
        hooks, plain = hooks_from_patches(self.patches, dit)
        merge = w.lora_merge
        if w.block_swapping():
            if merge:
                log.info("LingBot-World: %s runs with block swap; its LoRA is applied on the fly instead of merged",
                         w.label)
                merge = False
            streamed = [k for k in plain if k.startswith("blocks.") and int(k.split(".")[1]) >= w.swapper.resident]
            if streamed:
                raise ValueError(
                    f"this LoRA changes {len(streamed)} norm/modulation tensors of DiT blocks that block swap streams "
                    f"from RAM (e.g. {streamed[0]}), which cannot be patched there: give the {w.label} more VRAM "
                    f"(unload other models, or a smaller video) so it loads whole, or use a LoRA without those keys")
        c.applied_lora = apply_lora(dit, hooks, plain, merge_linears=merge, dtype=dit.compute_dtype, device=device)
        c.lora_uuid = want
        log.info("LingBot-World: LoRA on the %s: %d linears %s, %d other tensors patched", w.label,
                 len(c.applied_lora.merged or c.applied_lora.hooked), "merged into NF4" if merge else "on the fly",
                 len(plain))

    def _release_weights(self) -> None:
        c = self.model
        merged = False
        if c.applied_lora is not None:  # hooks off and plain tensors restored before any host copy is made
            merged = c.applied_lora.needs_reload
            c.applied_lora.remove()
            c.applied_lora = None
        c.lora_uuid = None
        dit = c.slot.detach()
        c.model_loaded_weight_memory = 0
        c.device = self.offload_device
        if dit is not None:
            self.weights.evict(dit, self.load_device)
            del dit
            if merged:
                self.weights.forget()  # a parked copy would hold the merged weights: the next load reads the file
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


def lora_device_bytes(patch_lists, dtype: torch.dtype) -> int:
    """Device bytes of the low-rank factors of some patches (in the compute dtype)."""
    size = torch.empty(0, dtype=dtype).element_size()
    n = 0
    for plist in patch_lists:
        for entry in plist if isinstance(plist, list) else [(1.0, plist)]:
            v = entry[1]
            for t in getattr(v, "weights", ())[:2]:
                if isinstance(t, torch.Tensor):
                    n += t.numel() * size
    return n


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
