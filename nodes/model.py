"""The native door's model: LingBot-World experts as native MODELs.

- LingBot NF4 Model Loader: one expert -> MODEL (one node per expert, like UNETLoader in ComfyUI's Wan 2.2
  template, so each expert gets its own LoRA / ModelSamplingSD3 / KSamplerAdvanced chain and a LoRA can go on
  one expert only). Nothing is read here but headers; ComfyUI's model management loads it for a sampler.
- `lingbot_patcher`: the LingBot model behind a MODEL link, for the nodes that take one: LingBot LoRA Loader
  (lora.py) and LingBot Experts From Models (expert.py: two MODELs -> LINGBOT_EXPERTS for the reference-exact
  LingBot Sampler: flow UniPC, the 0.947 boundary, memory modes).
"""
from __future__ import annotations

import logging

import torch

from ..world.detect import detect_format
from .adapters import comfy_paths, host_memory, model_check, model_fetch
from .adapters.comfy_paths import _expert_combo
from .adapters.expert_weights import ExpertWeights, compute_dtype_for
from .adapters.payloads import CATEGORY, WEIGHT_MODES
from .adapters.ui_hints import short_labels

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
            },
            "optional": {"download": model_fetch.DOWNLOAD},
        }

    @classmethod
    def VALIDATE_INPUTS(cls, expert=None, download=None):
        return model_check.expert("expert", expert, download=bool(download))

    RETURN_TYPES = ("MODEL",)
    RETURN_NAMES = ("model",)
    OUTPUT_TOOLTIPS = ("The expert as a native MODEL: KSampler(Advanced), LoRA loaders, ModelSamplingSD3 (shift 10 "
                       "by default), EasyCache and TorchCompileModel work on it",)
    FUNCTION = "load"
    CATEGORY = CATEGORY
    DESCRIPTION = ("Loads one LingBot-World expert (NF4) as a native ComfyUI MODEL; ComfyUI's model management "
                   "streams it to the GPU when a sampler needs it.")

    def load(self, expert: str, weights: str = "nf4", lora_apply: str = "on_the_fly", keep_in_ram: bool = False,
             download: bool = False):
        import comfy.model_management as mm

        from .adapters.native_model import LingBotWorldModel
        from .adapters.patchers import ExpertPatcher

        if weights not in WEIGHT_MODES:
            raise ValueError(f"weights must be one of {WEIGHT_MODES}, got {weights!r}")
        if lora_apply not in LORA_APPLY:
            raise ValueError(f"lora_apply must be one of {LORA_APPLY}, got {lora_apply!r}")
        read = model_fetch.read_folder(expert, "expert", weights, bool(download), mm.get_torch_device())
        path = read.path
        if read.said.startswith(("made", "read the")):
            from .adapters.progress import show_on_node

            show_on_node(read.said)
        fmt = detect_format(path)  # header checks only: a wrong file fails here, before anything is loaded
        device = mm.get_torch_device()
        w = ExpertWeights(role_of(path), fmt, weights, keep_in_ram=bool(keep_in_ram))
        w.lora_merge = lora_apply == "merge"
        host_memory.track(w)  # dropped with ComfyUI's node cache: give its host copies back to the OS
        model = LingBotWorldModel(w, compute_dtype_for(device, weights))
        patcher = ExpertPatcher(model, device, torch.device("cpu"), size=w.device_bytes(device))
        log.info("LingBot-World: %s as a native MODEL (%s, %s weights)", w.label, fmt.kind, weights)
        return (patcher,)
