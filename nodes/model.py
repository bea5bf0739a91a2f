"""The native door: LingBot-World experts as native MODELs, LoRAs on them, and MODELs back to LingBot Sampler.

- LingBot NF4 Model Loader: one expert -> MODEL (one node per expert, like UNETLoader in ComfyUI's Wan 2.2
  template, so each expert gets its own LoRA / ModelSamplingSD3 / KSamplerAdvanced chain and a LoRA can go on
  one expert only). Nothing is read here but headers; ComfyUI's model management loads it for a sampler.
- LingBot LoRA Loader: a LoRA file in any Wan key format (ComfyUI, diffusers `transformer.*`, kohya/musubi
  `lora_unet_*`) onto a LingBot MODEL, with a report of how many keys matched and a clear refusal of LoRAs for
  other models. ComfyUI's own LoraLoaderModelOnly works on the same MODEL for the formats ComfyUI maps.
- LingBot Experts From Models: two MODELs (with their LoRAs) -> LINGBOT_EXPERTS for the reference-exact
  LingBot Sampler (flow UniPC, the 0.947 boundary, memory modes).
"""
from __future__ import annotations

import logging

import torch

from ..loaders.expert_format import detect_format
from .adapters.lora_attach import patcher_with_lora
from .adapters import comfy_paths, host_memory, model_check
from .adapters.expert_weights import ExpertWeights, compute_dtype_for
from .adapters.payloads import CATEGORY, EXPERTS, MEMORY_MODES, WEIGHT_MODES, ExpertPair
from .adapters.progress import show_on_node
from .adapters.ui_hints import short_labels, show_if
from .expert import MAX_BLOCKS, _expert_combo, check_expert_pair

log = logging.getLogger(__name__)

LORA_APPLY = ("on_the_fly", "merge")


def role_of(path) -> str:
    """"high" / "low" from the file or folder name (for messages), else "expert"."""
    name = str(path).lower()
    for role in ("high", "low"):
        if f"{role}_noise" in name or f"{role}-noise" in name:
            return role
    return "expert"


def lingbot_patcher(model, what: str):
    """The ExpertPatcher behind a MODEL link, or a clear error naming what to connect."""
    from .adapters.native_model import LingBotWorldModel
    from .adapters.patchers import ExpertPatcher

    if not isinstance(model, ExpertPatcher) or not isinstance(getattr(model, "model", None), LingBotWorldModel):
        kind = type(getattr(model, "model", model)).__name__
        raise ValueError(f"{what} is a {kind}, not a LingBot-World model: connect a LingBot NF4 Model Loader "
                         f"(or LoRA / patch nodes after one)")
    return model


class LingBotModelLoader:
    """One LingBot-World expert as a native MODEL (NF4 weights streamed to the GPU when a sampler needs it)."""

    @classmethod
    def INPUT_TYPES(cls):
        experts = comfy_paths.list_experts()
        names, opts = _expert_combo(experts, "high")
        return {
            "required": {
                "expert": (names, {**opts, **short_labels(), "tooltip": (
                    "A LingBot-World expert: an NF4 folder (high_noise_model_bnb_nf4 / low_noise_model_bnb_nf4), the "
                    "official sharded folder, or a single .safetensors file, from models/lingbot_world or "
                    "models/diffusion_models. Use one loader per expert: high-noise for the first steps, low-noise "
                    "for the rest.")}),
                "weights": (list(WEIGHT_MODES), {"default": "nf4", "tooltip": (
                    "nf4: 4-bit weights on the GPU (about 9.6 GB per expert). bf16: plain bf16 weights (37 GB per "
                    "expert; for large GPUs and comparisons).")}),
                "lora_apply": (list(LORA_APPLY), {"default": "on_the_fly", "tooltip": (
                    "How LoRAs connected after this loader are applied. on_the_fly: a low-rank term next to each "
                    "NF4 layer (exact LoRA, no copy of the expert, a few % slower per step). merge: added to the "
                    "weights and re-quantized to NF4 once at load (no per-step cost; the LoRA is rounded to NF4 "
                    "too, and changing it reloads the expert).")}),
                "keep_in_ram": ("BOOLEAN", {"default": False, "tooltip": (
                    "When ComfyUI unloads this expert, keep a copy in pinned RAM (about 10 GB) so the next load "
                    "is a fast copy instead of a disk read.")}),
            }
        }

    @classmethod
    def VALIDATE_INPUTS(cls, expert=None):
        return model_check.expert("expert", expert)

    RETURN_TYPES = ("MODEL",)
    RETURN_NAMES = ("model",)
    OUTPUT_TOOLTIPS = ("The expert as a native MODEL: KSampler(Advanced), LoRA loaders, ModelSamplingSD3 (shift 10 "
                       "by default), EasyCache and TorchCompileModel work on it",)
    FUNCTION = "load"
    CATEGORY = CATEGORY
    DESCRIPTION = ("Loads one LingBot-World expert (NF4) as a native ComfyUI MODEL; ComfyUI's model management "
                   "streams it to the GPU when a sampler needs it.")

    def load(self, expert: str, weights: str = "nf4", lora_apply: str = "on_the_fly", keep_in_ram: bool = False):
        import comfy.model_management as mm

        from .adapters.native_model import LingBotWorldModel
        from .adapters.patchers import ExpertPatcher

        if weights not in WEIGHT_MODES:
            raise ValueError(f"weights must be one of {WEIGHT_MODES}, got {weights!r}")
        if lora_apply not in LORA_APPLY:
            raise ValueError(f"lora_apply must be one of {LORA_APPLY}, got {lora_apply!r}")
        path = comfy_paths.resolve_expert(expert, "expert")
        fmt = detect_format(path)  # header checks only: a wrong file fails here, before anything is loaded
        device = mm.get_torch_device()
        w = ExpertWeights(role_of(path), fmt, weights, keep_in_ram=bool(keep_in_ram))
        w.lora_merge = lora_apply == "merge"
        host_memory.track(w)  # dropped with ComfyUI's node cache: give its host copies back to the OS
        model = LingBotWorldModel(w, compute_dtype_for(device, weights))
        patcher = ExpertPatcher(model, device, torch.device("cpu"), size=w.device_bytes(device))
        log.info("LingBot-World: %s as a native MODEL (%s, %s weights)", w.label, fmt.kind, weights)
        return (patcher,)


class LingBotLoraLoader:
    """A LoRA (Wan 2.1/2.2 14B) on a LingBot-World MODEL, any common key format, applied on the NF4 weights."""

    @classmethod
    def INPUT_TYPES(cls):
        return {
            "required": {
                "model": ("MODEL", {"tooltip": "A LingBot-World expert (LingBot NF4 Model Loader)"}),
                "lora_name": (comfy_paths.list_loras(), {**short_labels(), "tooltip": (
                    "A .safetensors LoRA from models/loras: ComfyUI (diffusion_model.*), diffusers "
                    "(transformer.*) or kohya/musubi (lora_unet_*) keys. Pickled .pt/.ckpt files are refused.")}),
                "strength": ("FLOAT", {"default": 1.0, "min": -10.0, "max": 10.0, "step": 0.01, "tooltip": (
                    "LoRA strength (0 = no LoRA). Stack several loaders for several LoRAs.")}),
            }
        }

    @classmethod
    def VALIDATE_INPUTS(cls, lora_name=None):
        return model_check.lora(lora_name)

    RETURN_TYPES = ("MODEL",)
    RETURN_NAMES = ("model",)
    OUTPUT_TOOLTIPS = ("The model with the LoRA attached (applied when the expert loads)",)
    FUNCTION = "load"
    CATEGORY = CATEGORY
    DESCRIPTION = ("Puts a Wan 14B LoRA on a LingBot-World expert; logs how many of its modules matched and refuses "
                   "LoRAs made for other models.")

    def load(self, model, lora_name: str, strength: float = 1.0):
        patcher = lingbot_patcher(model, "model")
        if float(strength) == 0.0:
            show_on_node("strength 0: the model is passed on unchanged")
            return (model,)
        out, lora = patcher_with_lora(patcher, lora_name, strength)
        show_on_node(lora.report())
        return (out,)


class LingBotExpertsFromModels:
    """Two LingBot MODELs (with their LoRAs) -> the LINGBOT_EXPERTS that LingBot Sampler takes."""

    @classmethod
    def INPUT_TYPES(cls):
        return {
            "required": {
                "high_noise_model": ("MODEL", {"tooltip": "The high-noise expert (LingBot NF4 Model Loader, LoRAs)"}),
                "low_noise_model": ("MODEL", {"tooltip": "The low-noise expert"}),
                "memory_mode": (list(MEMORY_MODES), {"default": "auto", "tooltip": (
                    "As in LingBot Expert Loader: auto, resident (both stay loaded), swap (one at a time), "
                    "swap_pinned (the other waits in pinned RAM), block_swap (blocks streamed from RAM).")}),
                "blocks_on_gpu": ("INT", {"default": -1, "min": -1, "max": MAX_BLOCKS, "step": 1,
                                          **show_if(memory_mode=["block_swap"]), "tooltip": (
                    "block_swap only: DiT blocks kept on the GPU; -1 = as many as fit.")}),
            }
        }

    RETURN_TYPES = (EXPERTS,)
    RETURN_NAMES = ("experts",)
    OUTPUT_TOOLTIPS = ("The two experts for LingBot Sampler (their LoRAs included; ModelSamplingSD3 and other "
                       "sampling patches do not apply there: LingBot Sampler has its own shift and schedule)",)
    FUNCTION = "build"
    CATEGORY = CATEGORY
    DESCRIPTION = "Hands two LingBot-World MODELs (e.g. with LoRAs) to the reference-exact LingBot Sampler."

    def build(self, high_noise_model, low_noise_model, memory_mode: str = "auto", blocks_on_gpu: int = -1):
        if memory_mode not in MEMORY_MODES:
            raise ValueError(f"memory_mode must be one of {MEMORY_MODES}, got {memory_mode!r}")
        high = lingbot_patcher(high_noise_model, "high_noise_model")
        low = lingbot_patcher(low_noise_model, "low_noise_model")
        fh, fl = high.weights.fmt, low.weights.fmt
        check_expert_pair(fh.path, fl.path, fh, fl)
        if high.weights.mode != low.weights.mode:
            raise ValueError(f"the two experts are loaded with different weights ({high.weights.mode} / "
                             f"{low.weights.mode}); choose the same in both LingBot NF4 Model Loaders")
        if memory_mode == "block_swap" and int(blocks_on_gpu) > fh.config.num_layers:
            raise ValueError(f"blocks_on_gpu={blocks_on_gpu} but these experts have {fh.config.num_layers} blocks")
        if memory_mode == "swap_pinned":
            high.weights.keep_in_ram = low.weights.keep_in_ram = True
        return (ExpertPair(high, low, {"high": fh, "low": fl}, high.weights.mode, memory_mode, int(blocks_on_gpu)),)
