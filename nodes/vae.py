"""The Wan 2.1 VAE: LingBot VAE Loader (float32, the reference's maths) and LingBot VAE Decode (a raw Wan latent to
native IMAGE frames)."""
from __future__ import annotations

import torch

from ..world.decoding import decode_in
from ..world.vae import DEFAULT_OVERLAP, decoder_norm_silu, read_vae, vae_work_bytes
from .adapters import comfy_paths, host_memory, model_check, model_fetch
from .adapters.comfy_paths import _combo
from .adapters.payloads import CATEGORY, CONTEXT_KEY, DECODE_KEY, VAE, VAEHandle
from .adapters.ui_hints import short_labels, show_if
from .adapters.video_setup import load_vae_to_device


class LingBotVAELoader:
    """The Wan2.1 VAE (release `Wan2.1_VAE.pth` or ComfyUI's `wan_2.1_vae.safetensors`), kept in float32."""

    @classmethod
    def INPUT_TYPES(cls):
        vaes = comfy_paths.list_vaes()
        names, opts = _combo(vaes, "wan")
        return {
            "required": {
                "vae_name": (names, {**opts, **short_labels(), "tooltip": (
                    "Wan 2.1 VAE: wan_2.1_vae.safetensors (Comfy-Org/Wan_2.1_ComfyUI_repackaged) in models/vae, or "
                    "the release's Wan2.1_VAE.pth in models/lingbot_world (lingbot-world-base-cam/Wan2.1_VAE.pth is "
                    "downloaded from the release with the download switch on).")}),
            },
            "optional": {"download": model_fetch.DOWNLOAD},
        }

    @classmethod
    def VALIDATE_INPUTS(cls, vae_name=None, download=None):
        return model_check.vae(vae_name, bool(download))

    RETURN_TYPES = (VAE,)
    RETURN_NAMES = ("vae",)
    OUTPUT_TOOLTIPS = ("The Wan2.1 VAE, moved to the GPU by ComfyUI when an encode/decode needs it",)
    FUNCTION = "load"
    CATEGORY = CATEGORY
    DESCRIPTION = "Loads the Wan2.1 video VAE used by LingBot-World (float32, exact reference maths)."

    def load(self, vae_name: str, download: bool = False):
        import comfy.model_management as mm
        import comfy.model_patcher

        from .adapters.patchers import VAEContainer

        path = model_fetch.resolve(vae_name, "vae_name", comfy_paths.resolve_vae, bool(download))
        vae = read_vae(path, mm.vae_offload_device())
        host_memory.track(vae)
        patcher = comfy.model_patcher.ModelPatcher(VAEContainer(vae), mm.vae_device(), mm.vae_offload_device())
        return (VAEHandle(patcher, path),)


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
    DESCRIPTION = ("Decodes a LingBot-World latent video with the Wan2.1 VAE, output clamped like the reference, in "
                   "the precision its sampler's speed preset names: float32 with exact (or a latent from elsewhere), "
                   "fp16 on a GPU with auto, fast and draft, as the command line and LingBot Play decode it.")

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
        norm_silu = decoder_norm_silu(model.device)  # as the pack's other decodes on this device (fused on CUDA)
        dtype = str(samples.get(DECODE_KEY) or "float32")  # the sampler's speed plan's (absent: the release's)
        out = []
        for b in range(mu.shape[0]):
            video = decode_in(model.device, dtype, lambda: model.decode_raw(
                mu[b:b + 1], tiled=tiled, tile=int(tile_size), overlap=overlap, norm_silu=norm_silu))  # [1,3,F,H,W]
            if context:
                video = video[:, :, 1 + t * (context - 1):]
            out.append(((video[0].permute(1, 2, 3, 0) + 1.0) * 0.5).to(mm.intermediate_device(), torch.float32))
            del video
        return (torch.cat(out, 0),)
