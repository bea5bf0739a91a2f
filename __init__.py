"""ComfyUI-LingBot-World: LingBot-World (Wan2.2 I2V-A14B + camera) from NF4 weights.

ComfyUI imports this file by path from `custom_nodes/`; pip installs the same tree as the package
`lingbot_world`. Nodes register only inside a running ComfyUI (its `folder_paths` and
`comfy.model_management` are already imported then), so the library, the CLI and the tests import this
package without ComfyUI and without importing any of ComfyUI's modules.

Inside ComfyUI a failure to import the nodes is NOT caught: ComfyUI then reports the pack as
"IMPORT FAILED" with the reason, instead of the user finding red nodes. A missing dependency is re-raised
with the package to install and the command that installs it.
"""
import sys

NODE_CLASS_MAPPINGS = {}
NODE_DISPLAY_NAME_MAPPINGS = {}
WEB_DIRECTORY = "./web"  # the small frontend extension (widget visibility, short combo labels, uploads)

# pip names of the requirements whose import name differs
_PIP_NAMES = {"PIL": "pillow", "imageio_ffmpeg": "imageio-ffmpeg", "yaml": "pyyaml"}


def inside_comfyui() -> bool:
    """True when ComfyUI is loading us: it imports these two modules before any custom node."""
    return "folder_paths" in sys.modules and "comfy.model_management" in sys.modules


def missing_dependency_message(error: ImportError) -> str:
    """One line: which package is missing, for which Python, and the command that installs it."""
    import os

    top = (error.name or "").split(".")[0]
    pack = os.path.dirname(os.path.abspath(__file__))
    requirements = os.path.join(pack, "requirements.txt")
    return (f"LingBot-World needs the Python package '{_PIP_NAMES.get(top, top)}', which is not installed in "
            f"ComfyUI's Python ({sys.executable}): run `{sys.executable} -m pip install -r {requirements}` and "
            f"restart ComfyUI")


def _is_missing_dependency(error: ImportError) -> bool:
    """A third-party module is missing (not one of this pack's own modules, which would be a bug)."""
    name = getattr(error, "name", None)
    return isinstance(error, ModuleNotFoundError) and bool(name) and not name.startswith(__name__)


if inside_comfyui():
    try:
        from .nodes import NODE_CLASS_MAPPINGS, NODE_DISPLAY_NAME_MAPPINGS  # noqa: F811
    except ImportError as e:
        if _is_missing_dependency(e):
            raise ImportError(missing_dependency_message(e), name=e.name) from e
        raise

__all__ = ["NODE_CLASS_MAPPINGS", "NODE_DISPLAY_NAME_MAPPINGS", "WEB_DIRECTORY"]
