"""LingBot Fast LoRA Loader: a Wan 14B LoRA on the Fast model, applied on its NF4 weights when it loads (the same
patching as the experts' LoRAs: low-rank terms beside the NF4 GEMMs, stackable)."""
from __future__ import annotations

from dataclasses import replace

from .adapters import comfy_paths
from .adapters.fast_host import FAST_MODEL, FastModel
from .adapters.lora_attach import patcher_with_lora
from .adapters.payloads import CATEGORY
from .adapters.progress import show_on_node
from .adapters.ui_hints import short_labels


class LingBotFastLoraLoader:
    @classmethod
    def INPUT_TYPES(cls):
        return {
            "required": {
                "fast_model": (FAST_MODEL, {"tooltip": "From LingBot Fast Model Loader (or another Fast LoRA Loader)"}),
                "lora_name": (comfy_paths.list_loras(), {**short_labels(), "tooltip": (
                    "A .safetensors LoRA from models/loras (ComfyUI, diffusers, kohya/musubi or PEFT keys) made for "
                    "a Wan 2.1/2.2 14B model. Pickled .pt/.ckpt files are refused.")}),
                "strength": ("FLOAT", {"default": 1.0, "min": -10.0, "max": 10.0, "step": 0.01, "tooltip": (
                    "LoRA strength (0 = no LoRA). Stack several loaders for several LoRAs.")}),
            }
        }

    RETURN_TYPES = (FAST_MODEL,)
    RETURN_NAMES = ("fast_model",)
    OUTPUT_TOOLTIPS = ("The Fast model with the LoRA attached (applied when it loads)",)
    FUNCTION = "load"
    CATEGORY = CATEGORY
    DESCRIPTION = "Puts a Wan 14B LoRA on the LingBot-World Fast model; refuses LoRAs made for other models."

    def load(self, fast_model: FastModel, lora_name: str, strength: float = 1.0):
        if not isinstance(fast_model, FastModel):
            raise ValueError("fast_model must come from LingBot Fast Model Loader")
        if float(strength) == 0.0:
            show_on_node("strength 0: the model is passed on unchanged")
            return (fast_model,)
        patcher, lora = patcher_with_lora(fast_model.patcher, lora_name, strength)
        show_on_node(lora.report())
        return (replace(fast_model, patcher=patcher),)
