"""ComfyUI node classes: the only layer that imports comfy / folder_paths.

Node modules import ComfyUI lazily (inside functions), so this package imports without ComfyUI; the
model folder `lingbot_world` is registered only when ComfyUI's folder_paths is there.
"""
import logging

from .camera_nodes import LingBotCameraFromFiles, LingBotCameraPreset, LingBotSaveCamera
from .i2v_nodes import LingBotImageToVideo, LingBotVAEDecode
from .loader_nodes import LingBotExpertLoader, LingBotVAELoader
from .sampler_node import LingBotSampler
from .text_node import LingBotTextEncode

NODE_CLASS_MAPPINGS = {
    "LingBotExpertLoader": LingBotExpertLoader,
    "LingBotVAELoader": LingBotVAELoader,
    "LingBotTextEncode": LingBotTextEncode,
    "LingBotCameraFromFiles": LingBotCameraFromFiles,
    "LingBotCameraPreset": LingBotCameraPreset,
    "LingBotSaveCamera": LingBotSaveCamera,
    "LingBotImageToVideo": LingBotImageToVideo,
    "LingBotSampler": LingBotSampler,
    "LingBotVAEDecode": LingBotVAEDecode,
}

NODE_DISPLAY_NAME_MAPPINGS = {
    "LingBotExpertLoader": "LingBot Expert Loader",
    "LingBotVAELoader": "LingBot VAE Loader",
    "LingBotTextEncode": "LingBot Text Encode (umT5)",
    "LingBotCameraFromFiles": "LingBot Camera From Files",
    "LingBotCameraPreset": "LingBot Camera Preset",
    "LingBotSaveCamera": "LingBot Save Camera",
    "LingBotImageToVideo": "LingBot Image To Video",
    "LingBotSampler": "LingBot Sampler",
    "LingBotVAEDecode": "LingBot VAE Decode",
}


def _setup_inside_comfyui() -> None:
    try:
        import folder_paths  # noqa: F401
    except ImportError:
        return  # outside ComfyUI (tests, CLI)
    from . import host_memory
    from .comfy_paths import register_model_folders

    host_memory.install()
    try:
        register_model_folders()
    except Exception:
        logging.getLogger(__name__).exception("LingBot-World: could not register the lingbot_world model folder")


_setup_inside_comfyui()

__all__ = ["NODE_CLASS_MAPPINGS", "NODE_DISPLAY_NAME_MAPPINGS"]
