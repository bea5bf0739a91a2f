"""LingBot text embeddings <-> native CONDITIONING, and a LingBot camera rasterised for a native video latent.

ComfyUI is imported only inside `with_values` (node_helpers).

Native CONDITIONING is a list of `[tensor [1, L, width], {options}]`. ComfyUI's umT5 (CLIPLoader type "wan")
pads to at least 512 rows and zeroes the padded rows, which is what LingBot-World's DiT does with its
unpadded embeddings (zero rows, no mask), so the two convert without loss.
"""
from __future__ import annotations

import logging

import torch

from ...world.cameras import camera_condition
from ...wan.dit.model import pad_context
from .payloads import CameraInput, TextEmbeds
from .video_setup import LATENT_CHANNELS

log = logging.getLogger(__name__)

UMT5_HINT = "umT5-XXL: CLIPLoader with umt5_xxl_fp16 / fp8 .safetensors and type 'wan', or LingBot Text Encode"

TEMPORAL = 4  # pixel frames per latent frame (after the first)
SPATIAL = 8


def to_conditioning(embedding: torch.Tensor, text_len: int) -> list:
    """[L, 4096] LingBot embedding -> native CONDITIONING with one [1, text_len, 4096] float32 entry."""
    return [[pad_context([embedding.float()], text_len), {}]]


def from_conditioning(cond, what: str, text_dim: int, text_len: int) -> torch.Tensor:
    """Native CONDITIONING -> the [L, text_dim] embedding LingBot Sampler uses (the first entry's tensor)."""
    if not isinstance(cond, list) or not cond or not isinstance(cond[0], (list, tuple)) or not isinstance(cond[0][0], torch.Tensor):
        raise ValueError(f"{what}: expected native CONDITIONING (e.g. from CLIPTextEncode), got {type(cond).__name__}")
    if len(cond) > 1:
        log.warning("LingBot-World: %s has %d conditioning entries (combined / area prompts); LingBot Sampler uses "
                    "the first one", what, len(cond))
    t = cond[0][0]
    if t.dim() != 3 or t.shape[0] != 1:
        raise ValueError(f"{what}: conditioning tensor {tuple(t.shape)}; expected [1, tokens, {text_dim}]")
    if t.shape[-1] != text_dim:
        raise ValueError(f"{what} is {t.shape[-1]} wide but LingBot-World takes {text_dim}: encode it with {UMT5_HINT}")
    if t.shape[1] > text_len:
        log.warning("LingBot-World: %s has %d tokens; the model reads the first %d (the reference truncates there)",
                    what, t.shape[1], text_len)
    return t[0, :text_len].float().cpu()


def text_from_conditioning(positive, negative, text_dim: int, text_len: int) -> TextEmbeds:
    return TextEmbeds(from_conditioning(positive, "positive", text_dim, text_len),
                      from_conditioning(negative, "negative", text_dim, text_len), "", "")


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


def with_values(conditioning, values: dict):
    import node_helpers

    return node_helpers.conditioning_set_values(conditioning, values)
