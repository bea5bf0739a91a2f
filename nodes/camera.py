"""Camera trajectory nodes: from poses.npy/intrinsics.npy, from a preset, and on native CONDITIONING.

The trajectory travels as poses + intrinsics (LINGBOT_CAMERA); the sampler rasterises it to the packed
Plücker tensor at the video's size and frame count. The two sources also output a picture of the path.
LingBot Camera Conditioning rasterises it for a native video latent and sets it as `camera_conditions` on positive
and negative (like WanCameraImageToVideo does for Wan-Fun cameras; LingBot's tensor is its own 384-channel kind),
for KSampler(Advanced) on LingBot MODELs. Saving one to the output folder: LingBot Save Camera (save.py).
"""
from __future__ import annotations

import logging
from pathlib import Path

from ..world.cameras import (INTRINSICS_FILE, POSES_FILE, PRESET_NAMES, image_to_tensor, plot_trajectory, preset_path,
                             read_camera, usable_frames)
from .adapters import comfy_paths
from .adapters.conditioning import SPATIAL, camera_for_latent, with_values
from .adapters.example_inputs import EXAMPLE_TRAJECTORY
from .adapters.payloads import CAMERA, CATEGORY, CameraInput
from .adapters.progress import show_on_node
from .adapters.ui_hints import short_labels, show_if, upload

log = logging.getLogger(__name__)

INTRINSICS_MODES = ("first_frame", "per_frame")
CUSTOM_PATH = "(custom path)"
NO_PRESET = "none"
MAX_FRAMES = 1601


def trajectory_image(cam: CameraInput):
    """IMAGE [1, H, W, 3] of the path (top and side views)."""
    title = f"{cam.label} - {cam.num_frames} poses" if cam.label else f"{cam.num_frames} poses"
    return image_to_tensor(plot_trajectory(cam.poses, cam.intrinsics, title=title))


def frames_note(num_poses: int) -> str:
    """How much video a trajectory covers, for the node's text."""
    try:
        covered, _ = usable_frames(num_poses, MAX_FRAMES)
    except ValueError:
        return "too few for a moving camera (at least 5 are needed)"
    return f"enough for {covered} video frames ({covered / 16:.1f} s at 16 fps)"


def _mtimes(*paths: Path) -> str:
    out = []
    for p in paths:
        for q in ([p / POSES_FILE, p / INTRINSICS_FILE] if p.is_dir() else [p]):
            try:
                out.append(f"{q}:{q.stat().st_mtime_ns}")
            except OSError:
                out.append(f"{q}:missing")
    return "|".join(out)


class LingBotCameraFromFiles:
    """A recorded trajectory: a folder with poses.npy + intrinsics.npy (LingBot's action_path), picked from the
    folders under ComfyUI/input (or uploaded on the node), or given as a path."""

    @classmethod
    def INPUT_TYPES(cls):
        folders = comfy_paths.list_trajectories()
        default = EXAMPLE_TRAJECTORY if EXAMPLE_TRAJECTORY in folders else (folders[0] if folders else CUSTOM_PATH)
        return {
            "required": {
                "trajectory": (folders + [CUSTOM_PATH], {"default": default, **short_labels(), **upload("camera_npy"),
                                                         "tooltip": (
                    "A folder under ComfyUI/input holding poses.npy ([N,4,4] OpenCV camera-to-world) and "
                    "intrinsics.npy ([N,4] fx, fy, cx, cy for a 480x832 frame), as in the release's examples. The "
                    "upload button copies your two files into a new folder here. lingbot_examples/00 is the "
                    "release's example 00. 'custom path': use the path below.")}),
                "intrinsics": (list(INTRINSICS_MODES), {"default": "first_frame", "tooltip": (
                    "first_frame: like the reference, the first frame's intrinsics for every frame (zoom is ignored). "
                    "per_frame: follow changing intrinsics (zoom).")}),
            },
            "optional": {
                "path": ("STRING", {"default": "", **show_if(trajectory=[CUSTOM_PATH]), "tooltip": (
                    "trajectory = custom path only: a folder with poses.npy + intrinsics.npy, or a poses .npy file; "
                    "absolute, or relative to ComfyUI/input.")}),
                "intrinsics_path": ("STRING", {"default": "", **show_if(trajectory=[CUSTOM_PATH]), "tooltip": (
                    "custom path only, when 'path' is a poses file whose intrinsics are not beside it: the "
                    "intrinsics .npy file.")}),
            },
        }

    RETURN_TYPES = (CAMERA, "IMAGE")
    RETURN_NAMES = ("camera", "trajectory")
    OUTPUT_TOOLTIPS = ("Camera trajectory for LingBot Sampler (and LingBot Image To Video to clip the frames)",
                       "Top and side views of the path")
    FUNCTION = "load"
    CATEGORY = CATEGORY
    DESCRIPTION = "Loads a LingBot-World camera trajectory (poses.npy + intrinsics.npy)."

    @staticmethod
    def _sources(trajectory: str, path: str, intrinsics_path: str) -> tuple[Path, Path | None]:
        if trajectory != CUSTOM_PATH:
            return comfy_paths.resolve_trajectory(trajectory), None
        p = comfy_paths.resolve_input_path(path, "camera path (trajectory = custom path)")
        k = comfy_paths.resolve_input_path(intrinsics_path, "intrinsics path") if intrinsics_path.strip() else None
        return p, k

    @classmethod
    def IS_CHANGED(cls, trajectory: str, intrinsics: str = "first_frame", path: str = "", intrinsics_path: str = ""):
        try:
            p, k = cls._sources(trajectory, path, intrinsics_path)
        except (OSError, ValueError) as e:
            return f"missing: {e}"  # load() reports it
        return f"{intrinsics}|{_mtimes(p, *([k] if k is not None else []))}"

    def load(self, trajectory: str, intrinsics: str = "first_frame", path: str = "", intrinsics_path: str = ""):
        if intrinsics not in INTRINSICS_MODES:
            raise ValueError(f"intrinsics must be one of {INTRINSICS_MODES}, got {intrinsics!r}")
        p, k = self._sources(trajectory, path, intrinsics_path)
        path = read_camera(p, k)  # a folder, a poses file + intrinsics file, or a poses.npy beside its intrinsics
        cam = CameraInput(path.poses, path.intrinsics, intrinsics == "per_frame", label=p.name if p.is_dir() else p.stem)
        show_on_node(f"{p.name}: {cam.num_frames} poses, {frames_note(cam.num_frames)}")
        return (cam, trajectory_image(cam))


class LingBotCameraPreset:
    """A camera move generated in code (pan, tilt, dolly, truck, pedestal, orbit, zoom, or two combined)."""

    @classmethod
    def INPUT_TYPES(cls):
        return {
            "required": {
                "preset": (list(PRESET_NAMES), {"default": "dolly_in", "tooltip": (
                    "Camera move. pan/tilt: turn 0.5 deg per frame; dolly/truck/pedestal: move forward/sideways/up; "
                    "orbit: circle a point 2 units ahead; zoom: change the focal length.")}),
                "combine_with": ([NO_PRESET] + list(PRESET_NAMES), {"default": NO_PRESET, "tooltip": (
                    "Optional second move added to the first (e.g. dolly_in + pan_right curves to the right).")}),
                "speed": ("FLOAT", {"default": 1.0, "min": 0.0, "max": 10.0, "step": 0.05, "tooltip": (
                    "Multiplies every motion (1.0 = 0.5 deg or 0.05 units per frame).")}),
                "frames": ("INT", {"default": 81, "min": 1, "max": MAX_FRAMES, "step": 4, "tooltip": (
                    "Number of poses; use the video's frame count (4n+1, e.g. 81 = 5 s at 16 fps).")}),
            }
        }

    RETURN_TYPES = (CAMERA, "IMAGE")
    RETURN_NAMES = ("camera", "trajectory")
    OUTPUT_TOOLTIPS = ("Camera trajectory for LingBot Sampler", "Top and side views of the path")
    FUNCTION = "make"
    CATEGORY = CATEGORY
    DESCRIPTION = "Builds a camera trajectory from presets (zoom presets use per-frame intrinsics)."

    def make(self, preset: str, combine_with: str = NO_PRESET, speed: float = 1.0, frames: int = 81):
        names = [preset] if combine_with in (NO_PRESET, "", None) else [preset, combine_with]
        path, zoom = preset_path(names, int(frames), float(speed))  # a zoom is followed frame by frame
        cam = CameraInput(path.poses, path.intrinsics, per_frame_intrinsics=zoom,
                          label="+".join(names) + (f" x{speed:g}" if speed != 1.0 else ""))
        show_on_node(f"{cam.label}: {cam.num_frames} poses, {frames_note(cam.num_frames)}")
        return (cam, trajectory_image(cam))


class LingBotCameraConditioning:
    """Puts a LingBot camera trajectory on native CONDITIONING (positive and negative)."""

    @classmethod
    def INPUT_TYPES(cls):
        return {
            "required": {
                "positive": ("CONDITIONING", {"tooltip": "Prompt conditioning (e.g. after WanImageToVideo)"}),
                "negative": ("CONDITIONING", {"tooltip": "Negative conditioning"}),
                "camera": (CAMERA, {"tooltip": "LingBot Camera Preset / From Files"}),
                "latent": ("LATENT", {"tooltip": (
                    "The video latent to sample (its frames and size decide the camera tensor's)")}),
            }
        }

    RETURN_TYPES = ("CONDITIONING", "CONDITIONING")
    RETURN_NAMES = ("positive", "negative")
    OUTPUT_TOOLTIPS = ("Positive with the camera", "Negative with the same camera (as the reference does)")
    FUNCTION = "apply"
    CATEGORY = CATEGORY
    DESCRIPTION = "Adds a LingBot-World camera trajectory to native conditioning for KSampler on LingBot MODELs."

    def apply(self, positive, negative, camera: CameraInput, latent: dict):
        cc = camera_for_latent(camera, latent["samples"])
        _, _, f, h, w = latent["samples"].shape
        show_on_node("\n".join([f"{camera.label or 'camera'}: {cc.frames} frames at {w * SPATIAL}x{h * SPATIAL} "
                                 f"({f} latent frames)"] + ([cc.message] if cc.message else [])))
        values = {"camera_conditions": cc.plucker}
        return (with_values(positive, values), with_values(negative, values))
