"""ComfyUI node classes: the only layer that imports comfy / folder_paths.

Node modules import ComfyUI lazily (inside functions), so this package imports without ComfyUI; the
model folder `lingbot_world` is registered only when ComfyUI's folder_paths is there.
"""
import logging

from .action_nodes import LingBotActions
from .camera_nodes import LingBotCameraFromFiles, LingBotCameraPreset, LingBotSaveCamera
from .fast_continue_node import LingBotFastContinue
from .fast_nodes import LingBotFastLoader, LingBotFastSampler
from .i2v_nodes import LingBotImageToVideo, LingBotVAEDecode
from .loader_nodes import LingBotExpertLoader, LingBotVAELoader
from .native_conditioning import LingBotCameraConditioning, LingBotImageToVideoNative
from .native_nodes import LingBotExpertsFromModels, LingBotLoraLoader, LingBotModelLoader
from .sampler_node import LingBotSampler
from .speed_node import LingBotSpeedOptions
from .text_node import LingBotTextEncode

NODE_CLASS_MAPPINGS = {
    "LingBotExpertLoader": LingBotExpertLoader,
    "LingBotVAELoader": LingBotVAELoader,
    "LingBotTextEncode": LingBotTextEncode,
    "LingBotCameraFromFiles": LingBotCameraFromFiles,
    "LingBotCameraPreset": LingBotCameraPreset,
    "LingBotSaveCamera": LingBotSaveCamera,
    "LingBotActions": LingBotActions,
    "LingBotImageToVideo": LingBotImageToVideo,
    "LingBotSampler": LingBotSampler,
    "LingBotVAEDecode": LingBotVAEDecode,
    "LingBotFastLoader": LingBotFastLoader,
    "LingBotFastSampler": LingBotFastSampler,
    "LingBotFastContinue": LingBotFastContinue,
    "LingBotSpeedOptions": LingBotSpeedOptions,
    # native door (issue 16): LingBot experts as MODEL, camera / first frame on CONDITIONING, LoRA
    "LingBotModelLoader": LingBotModelLoader,
    "LingBotLoraLoader": LingBotLoraLoader,
    "LingBotExpertsFromModels": LingBotExpertsFromModels,
    "LingBotCameraConditioning": LingBotCameraConditioning,
    "LingBotImageToVideoNative": LingBotImageToVideoNative,
}

NODE_DISPLAY_NAME_MAPPINGS = {
    "LingBotExpertLoader": "LingBot Expert Loader",
    "LingBotVAELoader": "LingBot VAE Loader",
    "LingBotTextEncode": "LingBot Text Encode (umT5)",
    "LingBotCameraFromFiles": "LingBot Camera From Files",
    "LingBotCameraPreset": "LingBot Camera Preset",
    "LingBotSaveCamera": "LingBot Save Camera",
    "LingBotActions": "LingBot Actions",
    "LingBotImageToVideo": "LingBot Image To Video",
    "LingBotSampler": "LingBot Sampler",
    "LingBotVAEDecode": "LingBot VAE Decode",
    "LingBotFastLoader": "LingBot Fast Model Loader",
    "LingBotFastSampler": "LingBot Fast Sampler",
    "LingBotFastContinue": "LingBot Fast Continue",
    "LingBotSpeedOptions": "LingBot Speed Options",
    "LingBotModelLoader": "LingBot NF4 Model Loader",
    "LingBotLoraLoader": "LingBot LoRA Loader (NF4)",
    "LingBotExpertsFromModels": "LingBot Experts From Models",
    "LingBotCameraConditioning": "LingBot Camera Conditioning",
    "LingBotImageToVideoNative": "LingBot Image To Video (native)",
}


def _register_folders() -> None:
    try:
        import folder_paths  # noqa: F401
    except ImportError:
        return  # outside ComfyUI (tests, CLI)
    from .comfy_paths import register_model_folders

    try:
        register_model_folders()
    except Exception:
        logging.getLogger(__name__).exception("LingBot-World: could not register the lingbot_world model folder")


_register_folders()

__all__ = ["NODE_CLASS_MAPPINGS", "NODE_DISPLAY_NAME_MAPPINGS"]
