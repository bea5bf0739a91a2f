"""LingBot Save Camera: a camera trajectory written as poses.npy + intrinsics.npy into a new folder under
ComfyUI/output (LingBot's action_path layout, which LingBot Camera From Files reads)."""
from __future__ import annotations

import logging
import os
from pathlib import Path

from ..world.cameras import save_camera_folder
from .adapters.payloads import CAMERA, CATEGORY, CameraInput
from .adapters.progress import show_on_node

log = logging.getLogger(__name__)


class LingBotSaveCamera:
    """Writes a trajectory as poses.npy + intrinsics.npy into a new folder under ComfyUI/output."""

    @classmethod
    def INPUT_TYPES(cls):
        return {
            "required": {
                "camera": (CAMERA, {"tooltip": "The trajectory to save"}),
                "filename_prefix": ("STRING", {"default": "lingbot_camera/trajectory", "tooltip": (
                    "Folder name prefix inside ComfyUI/output; a counter is appended (trajectory_00001_).")}),
            }
        }

    RETURN_TYPES = ("STRING",)
    RETURN_NAMES = ("folder",)
    OUTPUT_TOOLTIPS = ("Absolute path of the written folder (usable by LingBot Camera From Files)",)
    FUNCTION = "save"
    OUTPUT_NODE = True
    CATEGORY = CATEGORY
    DESCRIPTION = "Saves a camera trajectory in LingBot's action_path layout (poses.npy, intrinsics.npy)."

    def save(self, camera: CameraInput, filename_prefix: str = "lingbot_camera/trajectory"):
        import folder_paths

        out_dir = folder_paths.get_output_directory()
        full, name, counter, subfolder, _ = folder_paths.get_save_image_path(filename_prefix, out_dir)
        folder = Path(full) / f"{name}_{counter:05}_"
        save_camera_folder(folder, camera.poses, camera.intrinsics)
        rel = os.path.relpath(folder, out_dir)
        log.info("LingBot-World: saved camera trajectory to %s", folder)
        show_on_node(f"saved to output/{Path(rel).as_posix()}")
        return {"ui": {"text": [rel]}, "result": (str(folder),)}
