"""ComfyUI-LingBot-World: LingBot-World (Wan2.2 I2V-A14B + camera) from NF4 weights.

ComfyUI imports this file by path from `custom_nodes/`; pip installs the same tree as the package
`lingbot_world`. Nodes register only when ComfyUI itself is importable, so the library, the CLI and
the tests import this package without ComfyUI.
"""
import logging

NODE_CLASS_MAPPINGS = {}
NODE_DISPLAY_NAME_MAPPINGS = {}

try:  # ComfyUI present?
    import comfy.model_management  # noqa: F401
    import folder_paths  # noqa: F401
except ImportError:
    pass
else:
    try:
        from .nodes import NODE_CLASS_MAPPINGS, NODE_DISPLAY_NAME_MAPPINGS  # noqa: F811
    except Exception:  # never break ComfyUI's start-up because of this pack
        logging.getLogger(__name__).exception("LingBot-World nodes failed to load")

__all__ = ["NODE_CLASS_MAPPINGS", "NODE_DISPLAY_NAME_MAPPINGS"]
