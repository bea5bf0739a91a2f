"""ComfyUI node classes: the only layer that imports comfy / folder_paths.

Where a node is: `LingBot<Word>...` is in `nodes/<word>.py`, <word> being the first word of the class name after
`LingBot`, in lower case and without a plural s (a run of capitals such as VAE is one word): LingBotVAEDecode is in
vae.py, LingBotFastContinue in fast.py, LingBotExpertsFromModels in expert.py, LingBotSaveCamera in save.py. A family
file holds its nodes and their own small helpers. What several families share to talk to ComfyUI (model folders,
payload types, the patchers, memory, progress and previews, errors and queue-time checks, UI hints, native
CONDITIONING, example inputs, workflow conversion) is in nodes/adapters/, which holds no node.
tests/test_node_files.py keeps both true.

Node modules import ComfyUI lazily (inside functions), so this package imports without ComfyUI; the
model folder `lingbot_world` is registered only when ComfyUI's folder_paths is there.
"""
import logging

from .. import quant  # noqa: F401 - its log filter must be in place before a node module imports bitsandbytes

from .action import LingBotActions
from .camera import LingBotCameraConditioning, LingBotCameraFromFiles, LingBotCameraPreset
from .expert import LingBotExpertLoader, LingBotExpertsFromModels
from .fast import LingBotFastContinue, LingBotFastLoader, LingBotFastLoraLoader, LingBotFastSampler
from .image import LingBotImageToVideo, LingBotImageToVideoNative
from .lora import LingBotLoraLoader
from .model import LingBotModelLoader
from .play import LingBotPlay
from .sampler import LingBotSampler
from .save import LingBotSaveCamera
from .speed import LingBotSpeedOptions
from .text import LingBotTextEncode
from .vae import LingBotVAEDecode, LingBotVAELoader
from .adapters import node_errors  # noqa: E402

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
    "LingBotFastLoraLoader": LingBotFastLoraLoader,
    "LingBotPlay": LingBotPlay,
    "LingBotSpeedOptions": LingBotSpeedOptions,
    # native door (issue 16): LingBot experts as MODEL, camera / first frame on CONDITIONING, LoRA
    "LingBotModelLoader": LingBotModelLoader,
    "LingBotLoraLoader": LingBotLoraLoader,
    "LingBotExpertsFromModels": LingBotExpertsFromModels,
    "LingBotCameraConditioning": LingBotCameraConditioning,
    "LingBotImageToVideoNative": LingBotImageToVideoNative,
}

node_errors.install(NODE_CLASS_MAPPINGS.values())

# The frontend's node search matches the class and display names only (fuzzily, near their start): every display
# name says "LingBot" and "Wan" (within its first 30 characters) so searching either finds the pack.
NODE_DISPLAY_NAME_MAPPINGS = {
    "LingBotExpertLoader": "LingBot Expert Loader (Wan)",
    "LingBotVAELoader": "LingBot VAE Loader (Wan)",
    "LingBotTextEncode": "LingBot Text Encode (Wan umT5)",
    "LingBotCameraFromFiles": "LingBot Camera From Files (Wan)",
    "LingBotCameraPreset": "LingBot Camera Preset (Wan)",
    "LingBotSaveCamera": "LingBot Save Camera (Wan)",
    "LingBotActions": "LingBot Actions (Wan)",
    "LingBotImageToVideo": "LingBot Image To Video (Wan)",
    "LingBotSampler": "LingBot Sampler (Wan)",
    "LingBotVAEDecode": "LingBot VAE Decode (Wan)",
    "LingBotFastLoader": "LingBot Fast Model Loader (Wan)",
    "LingBotFastSampler": "LingBot Fast Sampler (Wan)",
    "LingBotFastContinue": "LingBot Fast Continue (Wan)",
    "LingBotFastLoraLoader": "LingBot Fast LoRA Loader (Wan NF4)",
    "LingBotPlay": "LingBot Play (Wan Fast, live)",
    "LingBotSpeedOptions": "LingBot Speed Options (Wan)",
    "LingBotModelLoader": "LingBot NF4 Model Loader (Wan)",
    "LingBotLoraLoader": "LingBot LoRA Loader (Wan NF4)",
    "LingBotExpertsFromModels": "LingBot Experts From Models (Wan)",
    "LingBotCameraConditioning": "LingBot Camera Conditioning (Wan)",
    "LingBotImageToVideoNative": "LingBot Image To Video (Wan native)",
}


# Current ComfyUI's node search also matches SEARCH_ALIASES (server.node_info); the display names keep "LingBot" and
# "Wan" for 0.3.x frontends, whose search knows only the names.
COMMON_ALIASES = ["LingBot", "LingBot-World", "Wan", "Wan 2.2", "world model", "camera control"]
EXTRA_ALIASES = {
    "LingBotExpertLoader": ["NF4 experts", "high noise", "low noise"],
    "LingBotModelLoader": ["NF4", "diffusion model", "unet loader"],
    "LingBotSampler": ["KSampler", "image to video", "i2v"],
    "LingBotFastSampler": ["Fast", "real time", "streaming"],
    "LingBotActions": ["WASD", "keys", "Act"],
    "LingBotCameraPreset": ["trajectory", "dolly", "orbit", "pan"],
    "LingBotImageToVideo": ["i2v", "first frame"],
    "LingBotImageToVideoNative": ["i2v", "WanImageToVideo"],
}
for _name, _cls in NODE_CLASS_MAPPINGS.items():
    if "SEARCH_ALIASES" not in _cls.__dict__:
        _cls.SEARCH_ALIASES = COMMON_ALIASES + EXTRA_ALIASES.get(_name, [])


def _setup_inside_comfyui() -> None:
    try:
        import folder_paths  # noqa: F401
    except ImportError:
        return  # outside ComfyUI (tests, CLI)
    from pathlib import Path

    from .adapters import host_memory
    from .adapters.comfy_paths import register_model_folders
    from .adapters.example_inputs import install_example_inputs

    host_memory.install()
    from .play import install_routes

    install_routes()  # the live player's page on ComfyUI's server (token-protected)
    try:
        register_model_folders()
    except Exception:
        logging.getLogger(__name__).exception("LingBot-World: could not register the lingbot_world model folder")
    try:
        from .adapters.prompt_guard import install as install_prompt_guard

        install_prompt_guard(NODE_CLASS_MAPPINGS)
    except Exception:
        logging.getLogger(__name__).exception("LingBot-World: could not register the model check for queued prompts")
    try:
        install_example_inputs(Path(folder_paths.get_input_directory()))
    except Exception:  # never stop ComfyUI for an example file
        logging.getLogger(__name__).exception("LingBot-World: could not copy the example inputs")


_setup_inside_comfyui()

__all__ = ["NODE_CLASS_MAPPINGS", "NODE_DISPLAY_NAME_MAPPINGS"]
