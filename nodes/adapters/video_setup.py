"""The video a LingBot image-to-video node makes: its size (W×H) and frame count from the widgets, the summary the
node shows, the first-frame video a native Wan 2.1 VAE encodes, and the check that a native VAE is Wan 2.1's.

Shared by LingBot Image To Video and its native twin (image.py), LingBot VAE Decode (vae.py) and the Fast nodes
(fast_host.py).
"""
from __future__ import annotations

import torch

from ...world.cameras import usable_frames
from ...world.sizes import SIZE_AREAS, frames_at_most, latent_frames, latent_size, target_size
from ...world.vae import image_to_model_range, resize_first_frame
from .payloads import VAEHandle

CUSTOM_SIZE = "custom"
SIZE_CHOICES = tuple(SIZE_AREAS) + (CUSTOM_SIZE,)
MAX_SIDE = 4096
MAX_FRAMES = 1601
FPS = 16  # LingBot-World's frame rate
LATENT_CHANNELS = 16


def choose_size(size: str, image_h: int, image_w: int, width: int, height: int) -> tuple[int, int]:
    """(h, w): the reference's max-area rule for 480p/720p (aspect from the image), or an explicit size."""
    if size == CUSTOM_SIZE:
        w, h = int(width), int(height)
        if w <= 0 or h <= 0 or w % 16 or h % 16:
            near = (max(16, round(w / 16) * 16), max(16, round(h / 16) * 16))
            raise ValueError(f"custom size {w}x{h} (width x height): width and height must be multiples of 16, "
                             f"e.g. {near[0]}x{near[1]}")
        latent_size(h, w)
        return h, w
    if size not in SIZE_AREAS:
        raise ValueError(f"size must be one of {SIZE_CHOICES}, got {size!r}")
    return target_size(image_h, image_w, SIZE_AREAS[size])


def video_frames(requested: int, camera_poses: int | None) -> tuple[int, list[str]]:
    """Frames to generate and what was changed: rounded down to 4n+1, then limited to what the camera covers."""
    if requested < 1:
        raise ValueError(f"frames must be at least 1, got {requested}")
    frames, notes = frames_at_most(requested), []
    if frames != requested:
        notes.append(f"{requested} frames is not of the form 4n+1: using {frames}.")
    if camera_poses is not None:
        frames, clipped = usable_frames(camera_poses, frames)
        if clipped:
            notes.append(clipped)
    return frames, notes


def video_summary(width: int, height: int, frames: int, notes: list[str]) -> str:
    """The node's text: what will be generated, then any adjustment."""
    line = f"{width}x{height}, {frames} frames ({frames / FPS:.1f} s at {FPS} fps), {latent_frames(frames)} latent frames"
    return "\n".join([line] + notes)


def first_frame_video(image_hwc: torch.Tensor, height: int, width: int, frames: int) -> torch.Tensor:
    """The video the reference encodes for I2V, as a native IMAGE batch [frames, h, w, 3] in 0..1: the first frame
    resized like the reference (bicubic on [-1, 1], no antialias, no clamp), then grey (0 in [-1, 1]) frames.
    ComfyUI's VAE maps it back with x*2-1."""
    first = resize_first_frame(image_to_model_range(image_hwc[:, :, :3]), height, width)
    video = torch.full((frames, height, width, 3), 0.5)
    video[0] = (first.permute(1, 2, 0) + 1.0) * 0.5
    return video


def check_wan21_vae(vae) -> None:
    """Refuse a native VAE that is not Wan 2.1's (LingBot-World's latent space), naming what it is."""
    import comfy.ldm.wan.vae

    model = getattr(vae, "first_stage_model", None)
    channels = getattr(vae, "latent_channels", None)
    if isinstance(model, comfy.ldm.wan.vae.WanVAE) and channels == LATENT_CHANNELS:
        return
    kind = type(model).__name__ if model is not None else type(vae).__name__
    where = getattr(model, "__module__", "")
    if "vae2_2" in where:
        kind = "Wan 2.2's 48-channel VAE (for the 5B model)"
    raise ValueError(f"the VAE is {kind} with {channels} latent channels, not the Wan 2.1 VAE LingBot-World uses: "
                     f"load wan_2.1_vae.safetensors with Load VAE (or use LingBot VAE Loader)")


def load_vae_to_device(vae: VAEHandle, work_bytes: int) -> torch.nn.Module:
    import comfy.model_management as mm

    mm.load_models_gpu([vae.patcher], memory_required=work_bytes, force_full_load=True)
    return vae.model
