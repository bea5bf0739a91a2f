"""Image-to-video conditioning (VAE encode of the first frame) and VAE decode to native IMAGE frames."""
from __future__ import annotations

import logging

import torch

from ..wan.i2v import build_i2v_condition, first_frame_mask, image_to_model_range
from ..wan.vae.footprint import vae_work_bytes
from ..wan.vae.model import DEFAULT_OVERLAP, VAEConfig
from .adapters.payloads import CAMERA, CATEGORY, I2V, VAE, CameraInput, I2VCondition, VAEHandle
from .adapters.progress import show_on_node
from .adapters.ui_hints import show_if
from .adapters.video_setup import (CUSTOM_SIZE, FPS, MAX_FRAMES, MAX_SIDE, SIZE_CHOICES, check_wan21_vae,  # noqa: F401
                                   choose_size, first_frame_video, load_vae_to_device, video_frames, video_summary)

log = logging.getLogger(__name__)

CONTEXT_KEY = "lingbot_context_latents"  # LATENT key: leading latent frames decoded for context, not output


def native_vae_condition(vae, image_hwc: torch.Tensor, height: int, width: int, frames: int) -> torch.Tensor:
    """The 20-channel y through ComfyUI's own Wan 2.1 VAE: its raw latent of `first_frame_video`, normalised with
    ComfyUI's Wan 2.1 latent format, after the first-frame mask."""
    import comfy.latent_formats

    check_wan21_vae(vae)
    raw = vae.encode(first_frame_video(image_hwc, height, width, frames)).float().cpu()
    latent = comfy.latent_formats.Wan21().process_in(raw)
    mask = first_frame_mask(latent.shape[2], latent.shape[3], latent.shape[4]).to(latent)
    return torch.cat([mask[None], latent], dim=1)


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


class LingBotVAEDecode:
    """Raw Wan latent (native LATENT) -> video frames as a native IMAGE batch [F, H, W, 3] in 0..1."""

    @classmethod
    def INPUT_TYPES(cls):
        return {
            "required": {
                "vae": (VAE, {"tooltip": "Wan2.1 VAE from LingBot VAE Loader"}),
                "samples": ("LATENT", {"tooltip": "Latent video from LingBot Sampler (raw Wan 2.1 latent, [B,16,T,h,w])"}),
                "tiled": ("BOOLEAN", {"default": False, "tooltip": (
                    "Decode in overlapping spatial tiles: much less VRAM at 720p, tiny blending seams.")}),
                "tile_size": ("INT", {"default": 32, "min": 8, "max": 256, "step": 8, **show_if(tiled=[True]), "tooltip": (
                    "Tile edge in latent cells (x8 pixels), tiled only.")}),
            }
        }

    RETURN_TYPES = ("IMAGE",)
    RETURN_NAMES = ("images",)
    OUTPUT_TOOLTIPS = ("Video frames [F, H, W, 3] in 0..1, e.g. for Create Video -> Save Video (16 fps)",)
    FUNCTION = "decode"
    CATEGORY = CATEGORY
    DESCRIPTION = "Decodes a LingBot-World latent video with the Wan2.1 VAE (float32, output clamped like the reference)."

    def decode(self, vae: VAEHandle, samples: dict, tiled: bool = False, tile_size: int = 32):
        import comfy.model_management as mm

        mu = samples.get("samples") if isinstance(samples, dict) else None
        cfg = vae.model.cfg
        if mu is None or mu.dim() != 5 or mu.shape[1] != cfg.z_dim:
            got = tuple(mu.shape) if isinstance(mu, torch.Tensor) else type(mu).__name__
            raise ValueError(f"expected a Wan video latent [B, {cfg.z_dim}, T, h, w], got {got}; connect LingBot Sampler's LATENT")
        s, t = cfg.spatial_factor, cfg.temporal_factor
        # a continued Fast part (LingBot Fast Continue's `segment`) carries latent frames before it, decoded only so
        # that its own frames come out exactly as in the whole video
        context = int(samples.get(CONTEXT_KEY, 0) or 0)
        frames = 1 + t * (mu.shape[2] - 1)
        overlap = min(DEFAULT_OVERLAP, max(int(tile_size) // 4, 1))
        work = vae_work_bytes(cfg, mu.shape[3] * s, mu.shape[4] * s, frames, tiled, int(tile_size) * s)
        model = load_vae_to_device(vae, work)
        from ..speed.vae_norm import decoder_norm_silu

        norm_silu = decoder_norm_silu(model.device)  # as the pack's other decodes on this device (fused on CUDA)
        out = []
        for b in range(mu.shape[0]):
            video = model.decode_raw(mu[b:b + 1], tiled=tiled, tile=int(tile_size), overlap=overlap,
                                     norm_silu=norm_silu)  # [1,3,F,H,W]
            if context:
                video = video[:, :, 1 + t * (context - 1):]
            out.append(((video[0].permute(1, 2, 3, 0) + 1.0) * 0.5).to(mm.intermediate_device(), torch.float32))
            del video
        return (torch.cat(out, 0),)

