"""LingBot LoRA Loader: a LoRA file in any Wan key format (ComfyUI, diffusers `transformer.*`, kohya/musubi
`lora_unet_*`) onto a LingBot MODEL, with a report of how many keys matched and a clear refusal of LoRAs for other
models. ComfyUI's own LoraLoaderModelOnly works on the same MODEL for the formats ComfyUI maps. The Fast model's
LoRAs: LingBot Fast LoRA Loader (fast.py).
"""
from __future__ import annotations

from .adapters import comfy_paths, model_check
from .adapters.lora_attach import patcher_with_lora
from .adapters.payloads import CATEGORY
from .adapters.progress import show_on_node
from .adapters.ui_hints import short_labels
from .model import lingbot_patcher


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
