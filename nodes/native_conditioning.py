"""LingBot camera and first frame on native CONDITIONING, for KSampler(Advanced) on LingBot MODELs.

- LingBot Camera Conditioning: a LINGBOT_CAMERA trajectory rasterised to LingBot's packed Plücker tensor at the
  latent's size and length, set as `camera_conditions` on positive and negative (like WanCameraImageToVideo does
  for Wan-Fun cameras; LingBot's tensor is its own 384-channel kind).
- LingBot Image To Video (native): WanImageToVideo with the reference's first-frame handling (bicubic resize of
  the image in [-1, 1] without antialias, grey frames after it) through a native Wan 2.1 VAE, plus an optional
  camera; outputs the empty video LATENT to sample.
"""
from __future__ import annotations

import logging
from typing import Optional

import torch

from ..wan.control.camera import camera_condition
from .adapters.video_setup import (CUSTOM_SIZE, LATENT_CHANNELS, MAX_FRAMES, MAX_SIDE, SIZE_CHOICES, check_wan21_vae,
                                   choose_size, first_frame_video, load_vae_to_device, video_frames, video_summary)
from .adapters.payloads import CAMERA, CATEGORY, VAE, CameraInput, VAEHandle
from .adapters.progress import show_on_node
from .adapters.ui_hints import show_if

log = logging.getLogger(__name__)

TEMPORAL = 4  # pixel frames per latent frame (after the first)
SPATIAL = 8


def camera_for_latent(camera: CameraInput, latent: torch.Tensor):
    """The camera rasterised for a video latent [B, 16, F, h, w] (`.plucker` [1, 384, F, h, w] float32, `.message`)."""
    if latent.dim() != 5 or latent.shape[1] != LATENT_CHANNELS:
        raise ValueError(f"expected a Wan video latent [B, 16, frames, h, w], got {tuple(latent.shape)}")
    _, _, f, h, w = latent.shape
    frames = (f - 1) * TEMPORAL + 1
    cc = camera_condition(camera.poses, camera.intrinsics, h * SPATIAL, w * SPATIAL, frames,
                          per_frame_intrinsics=camera.per_frame_intrinsics, includes_end_pose=camera.includes_end_pose)
    if cc.frames != frames:
        raise ValueError(f"the camera trajectory covers {cc.frames} frames but the latent has {frames}: give the "
                         f"video that length (or a longer trajectory)")
    if cc.message:
        log.info("LingBot-World camera: %s", cc.message)
    return cc


def plucker_for_latent(camera: CameraInput, latent: torch.Tensor) -> torch.Tensor:
    """The camera rasterised for a video latent [B, 16, F, h, w]: [1, 384, F, h, w] float32."""
    return camera_for_latent(camera, latent).plucker


def encode_first_frame_video(vae, video: torch.Tensor) -> torch.Tensor:
    """The raw Wan 2.1 latent [1, 16, f, h, w] of a native IMAGE batch [F, H, W, 3] in 0..1, through ComfyUI's VAE or
    the pack's (LINGBOT_VAE: float32, the reference's maths; the tiny demo's VAE is one)."""
    if not isinstance(vae, VAEHandle):
        return vae.encode(video)
    from ..wan.vae.footprint import vae_work_bytes

    f, h, w = video.shape[0], video.shape[1], video.shape[2]
    model = load_vae_to_device(vae, vae_work_bytes(vae.model.cfg, h, w, f, False, 256))
    pixels = (video * 2.0 - 1.0).permute(3, 0, 1, 2)[None].to(model.device, torch.float32)
    return model.encode_raw(pixels).float().cpu()


def with_values(conditioning, values: dict):
    import node_helpers

    return node_helpers.conditioning_set_values(conditioning, values)


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


class LingBotImageToVideoNative:
    """First frame (native IMAGE) through a native Wan 2.1 VAE onto native CONDITIONING, plus the camera."""

    @classmethod
    def INPUT_TYPES(cls):
        return {
            "required": {
                "positive": ("CONDITIONING", {"tooltip": "Prompt conditioning (CLIPTextEncode with umT5, or LingBot "
                                                         "Text Encode's positive)"}),
                "negative": ("CONDITIONING", {"tooltip": "Negative conditioning"}),
                "vae": (f"VAE,{VAE}", {"tooltip": (
                    "The Wan 2.1 VAE: Load VAE with wan_2.1_vae.safetensors, or LingBot VAE Loader (the tiny demo's "
                    "VAE, or the release's Wan2.1_VAE.pth)")}),
                "start_image": ("IMAGE", {"tooltip": "The first frame (only the first image is used)"}),
                "size": (list(SIZE_CHOICES), {"default": "480p", "tooltip": (
                    "480p: about 480x832 pixels, 720p: about 720x1280, with the aspect ratio of the image (resized, "
                    "not cropped, like the reference). custom: width x height below.")}),
                "width": ("INT", {"default": 832, "min": 16, "max": MAX_SIDE, "step": 16,
                                  **show_if(size=[CUSTOM_SIZE]), "tooltip": (
                    "custom size only: width, a multiple of 16")}),
                "height": ("INT", {"default": 480, "min": 16, "max": MAX_SIDE, "step": 16,
                                   **show_if(size=[CUSTOM_SIZE]), "tooltip": (
                    "custom size only: height, a multiple of 16")}),
                "length": ("INT", {"default": 81, "min": 1, "max": MAX_FRAMES, "step": 4, "tooltip": (
                    "Frames, 4n+1 (81 = 5 s at 16 fps); other counts are rounded down to 4n+1, a shorter camera "
                    "trajectory lowers it. The node shows the size and frames it used.")}),
            },
            "optional": {
                "camera": (CAMERA, {"tooltip": "Optional LingBot camera trajectory (preset or files)"}),
            },
        }

    RETURN_TYPES = ("CONDITIONING", "CONDITIONING", "LATENT")
    RETURN_NAMES = ("positive", "negative", "latent")
    OUTPUT_TOOLTIPS = ("Positive with the first frame (and camera)", "Negative with the same",
                       "The empty video latent to sample (KSampler / KSamplerAdvanced)")
    FUNCTION = "encode"
    CATEGORY = CATEGORY
    DESCRIPTION = ("LingBot-World's image conditioning for native samplers: the first frame resized like the reference, "
                   "VAE-encoded with grey frames after it, mask and camera on the conditioning.")

    def encode(self, positive, negative, vae, start_image: torch.Tensor, size: str = "480p", width: int = 832,
               height: int = 480, length: int = 81, camera: Optional[CameraInput] = None):
        import comfy.model_management as mm

        if not isinstance(vae, VAEHandle):
            check_wan21_vae(vae)
        if start_image.dim() != 4 or start_image.shape[-1] < 3:
            raise ValueError(f"start_image must be an IMAGE batch [B, H, W, 3], got {tuple(start_image.shape)}")
        h, w = choose_size(size, start_image.shape[1], start_image.shape[2], width, height)
        frames, notes = video_frames(int(length), camera.num_frames if camera is not None else None)
        if notes:
            log.warning("LingBot-World: %s", " ".join(notes))
        show_on_node(video_summary(w, h, frames, notes))
        latent_image = encode_first_frame_video(vae, first_frame_video(start_image[0], h, w, frames))
        f_lat = (frames - 1) // TEMPORAL + 1
        if tuple(latent_image.shape[1:]) != (LATENT_CHANNELS, f_lat, h // SPATIAL, w // SPATIAL):
            raise RuntimeError(f"the VAE returned a latent of {tuple(latent_image.shape)}; expected "
                               f"[1, 16, {f_lat}, {h // SPATIAL}, {w // SPATIAL}] from a Wan 2.1 VAE")
        mask = torch.ones(1, 1, f_lat, h // SPATIAL, w // SPATIAL)
        mask[:, :, 0] = 0.0  # keep the first latent frame (WAN21 turns this into the reference's mask)
        values = {"concat_latent_image": latent_image, "concat_mask": mask}
        latent = torch.zeros(1, LATENT_CHANNELS, f_lat, h // SPATIAL, w // SPATIAL, device=mm.intermediate_device())
        if camera is not None:
            values["camera_conditions"] = plucker_for_latent(camera, latent)
        return (with_values(positive, values), with_values(negative, values), {"samples": latent})

