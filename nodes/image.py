"""Image to video: the first frame, the size and the frame count as LingBot-World's image conditioning.

- LingBot Image To Video: the first frame VAE-encoded, then zero frames (the I2V conditioning y) for LingBot Sampler
  and LingBot Fast Sampler, through LingBot VAE Loader's VAE (float32, reference-exact) or ComfyUI's Wan 2.1 VAE.
- LingBot Image To Video (native): WanImageToVideo with the reference's first-frame handling (bicubic resize of
  the image in [-1, 1] without antialias, grey frames after it) through a native Wan 2.1 VAE, plus an optional
  camera, on native CONDITIONING; outputs the empty video LATENT to sample.
"""
from __future__ import annotations

import logging
from typing import Optional

import torch

from ..world.vae import VAEConfig, build_i2v_condition, first_frame_mask, image_to_model_range, vae_work_bytes
from .adapters.conditioning import SPATIAL, TEMPORAL, plucker_for_latent, with_values
from .adapters.payloads import CAMERA, CATEGORY, I2V, VAE, CameraInput, I2VCondition, VAEHandle
from .adapters.progress import show_on_node
from .adapters.ui_hints import show_if
from .adapters.video_setup import (CUSTOM_SIZE, LATENT_CHANNELS, MAX_FRAMES, MAX_SIDE, SIZE_CHOICES, check_wan21_vae,
                                   choose_size, first_frame_video, load_vae_to_device, video_frames, video_summary)

log = logging.getLogger(__name__)


def native_vae_condition(vae, image_hwc: torch.Tensor, height: int, width: int, frames: int) -> torch.Tensor:
    """The 20-channel y through ComfyUI's own Wan 2.1 VAE: its raw latent of `first_frame_video`, normalised with
    ComfyUI's Wan 2.1 latent format, after the first-frame mask."""
    import comfy.latent_formats

    check_wan21_vae(vae)
    raw = vae.encode(first_frame_video(image_hwc, height, width, frames)).float().cpu()
    latent = comfy.latent_formats.Wan21().process_in(raw)
    mask = first_frame_mask(latent.shape[2], latent.shape[3], latent.shape[4]).to(latent)
    return torch.cat([mask[None], latent], dim=1)


def encode_first_frame_video(vae, video: torch.Tensor) -> torch.Tensor:
    """The raw Wan 2.1 latent [1, 16, f, h, w] of a native IMAGE batch [F, H, W, 3] in 0..1, through ComfyUI's VAE or
    the pack's (LINGBOT_VAE: float32, the reference's maths; the tiny demo's VAE is one)."""
    if not isinstance(vae, VAEHandle):
        return vae.encode(video)
    f, h, w = video.shape[0], video.shape[1], video.shape[2]
    model = load_vae_to_device(vae, vae_work_bytes(vae.model.cfg, h, w, f, False, 256))
    pixels = (video * 2.0 - 1.0).permute(3, 0, 1, 2)[None].to(model.device, torch.float32)
    return model.encode_raw(pixels).float().cpu()


class LingBotImageToVideo:
    """First frame + size + frame count -> the I2V conditioning y (mask + VAE latent of the image)."""

    @classmethod
    def INPUT_TYPES(cls):
        return {
            "required": {
                "vae": (f"{VAE},VAE", {"tooltip": (
                    "Wan2.1 VAE from LingBot VAE Loader (float32, reference-exact), or ComfyUI's own Load VAE with "
                    "wan_2.1_vae.safetensors")}),
                "image": ("IMAGE", {"tooltip": "The first frame (e.g. from Load Image); only the first image is used"}),
                "size": (list(SIZE_CHOICES), {"default": "480p", "tooltip": (
                    "480p: about 480x832 pixels, 720p: about 720x1280, with the aspect ratio of the image (e.g. "
                    "1280x720 -> 464x832 at 480p); the image is resized, not cropped. custom: width x height below.")}),
                "width": ("INT", {"default": 832, "min": 16, "max": MAX_SIDE, "step": 16,
                                  **show_if(size=[CUSTOM_SIZE]), "tooltip": (
                    "custom size only: output width, a multiple of 16")}),
                "height": ("INT", {"default": 480, "min": 16, "max": MAX_SIDE, "step": 16,
                                   **show_if(size=[CUSTOM_SIZE]), "tooltip": (
                    "custom size only: output height, a multiple of 16")}),
                "frames": ("INT", {"default": 81, "min": 1, "max": MAX_FRAMES, "step": 4, "tooltip": (
                    "Frames to generate, 4n+1 (81 = 5 s at 16 fps); other counts are rounded down to 4n+1. A "
                    "shorter camera trajectory lowers it. The node shows the size and frames it used.")}),
                "tiled": ("BOOLEAN", {"default": False, "tooltip": (
                    "Encode in overlapping spatial tiles (less VRAM at 720p, tiny seams).")}),
            },
            "optional": {
                "camera": (CAMERA, {"tooltip": (
                    "Optional: like the reference, the frame count is limited to what the trajectory covers.")}),
            },
        }

    RETURN_TYPES = (I2V, "INT", "INT", "INT")
    RETURN_NAMES = ("i2v", "width", "height", "frames")
    OUTPUT_TOOLTIPS = ("Conditioning for LingBot Sampler", "Video width", "Video height", "Frame count")
    FUNCTION = "encode"
    CATEGORY = CATEGORY
    DESCRIPTION = "Builds LingBot-World's image conditioning: the first frame VAE-encoded, then zero frames."

    def encode(self, vae: VAEHandle, image: torch.Tensor, size: str = "480p", width: int = 832, height: int = 480,
               frames: int = 81, tiled: bool = False, camera: CameraInput | None = None):
        import comfy.model_management as mm

        if image.dim() != 4 or image.shape[-1] != 3:
            raise ValueError(f"image must be an IMAGE batch [B, H, W, 3], got shape {tuple(image.shape)}")
        if image.shape[0] > 1:
            log.warning("LingBot-World: %d images given; only the first one starts the video", image.shape[0])
        h, w = choose_size(size, image.shape[1], image.shape[2], width, height)
        frames, notes = video_frames(int(frames), camera.num_frames if camera is not None else None)
        note = " ".join(notes) or None
        if note:
            log.warning("LingBot-World: %s", note)
        show_on_node(video_summary(w, h, frames, notes))
        first, handle = None, None
        if not isinstance(vae, VAEHandle):  # a native VAE (Load VAE)
            y = native_vae_condition(vae, image[0], h, w, frames)
            cfg = VAEConfig()  # the Wan 2.1 latent statistics (check_wan21_vae made sure that is what it is)
        else:
            model = load_vae_to_device(vae, vae_work_bytes(vae.model.cfg, h, w, frames, tiled, 256))
            first, handle = image_to_model_range(image[0]).cpu(), vae  # for LingBot Fast Continue's later frames
            y = build_i2v_condition(model, first, h, w, frames, tiled=tiled)
            cfg = vae.model.cfg
        y = y.to(mm.intermediate_device())
        cond = I2VCondition(y, h, w, frames, tuple(cfg.latent_mean), tuple(cfg.latent_std), note, first, handle,
                            bool(tiled))
        return (cond, w, h, frames)


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
