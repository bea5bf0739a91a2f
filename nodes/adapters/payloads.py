"""What travels along the pack's custom links (LINGBOT_EXPERTS, LINGBOT_TEXT, ...). No ComfyUI imports.

ComfyUI passes these objects between nodes and caches them as node outputs, so they stay small: tensors
on the CPU, paths, and for the experts the ModelPatchers that own the (lazily loaded) weights.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

import numpy as np
import torch

from ...world.detect import ExpertFormat
from ...world.settings import LOWP_WEIGHTS

# Custom link types; native IMAGE / LATENT are used wherever they fit.
EXPERTS = "LINGBOT_EXPERTS"
TEXT = "LINGBOT_TEXT"
CAMERA = "LINGBOT_CAMERA"
ACT = "LINGBOT_ACT"
VAE = "LINGBOT_VAE"
I2V = "LINGBOT_I2V"
SPEED = "LINGBOT_SPEED"
CONTEXT_KEY = "lingbot_context_latents"  # LATENT key: leading latent frames decoded for context, not output
# LATENT key: the VAE decode's precision the sampler's speed plan names (float32 / fp16 / bf16; absent: float32), so
# LingBot VAE Decode gives the frames the CLI and LingBot Play give for the same preset
DECODE_KEY = "lingbot_decode_dtype"

CATEGORY = "LingBot-World"
WEIGHT_MODES = ("nf4", "bf16")
# stored FP8 / INT8 weights exist for the Fast model only (convert-fp8 / convert-int8)
FAST_WEIGHT_MODES = WEIGHT_MODES + LOWP_WEIGHTS
MEMORY_MODES = ("auto", "resident", "swap", "swap_pinned", "block_swap")


def latent_payload(latent, speed, **extra) -> dict:
    """A sampler's LATENT output: the raw latent, the decode precision of its speed plan, and `extra` keys."""
    from ...world.decoding import decode_dtype_of

    return {"samples": latent, DECODE_KEY: decode_dtype_of(speed), **extra}


@dataclass
class ExpertPair:
    """LINGBOT_EXPERTS: the two DiT experts, not loaded yet; the sampler loads them phase by phase."""

    high: Any  # ExpertPatcher (a comfy ModelPatcher subclass) for the high-noise expert
    low: Any  # ... for the low-noise expert
    formats: dict[str, ExpertFormat]
    weights: str  # "nf4" | "bf16"
    memory_mode: str  # one of MEMORY_MODES
    blocks_on_gpu: int  # block_swap only: DiT blocks kept on the GPU; -1 = planned from free VRAM
    speed: Any = None  # speed.options.SpeedPlan applied to each expert when it loads

    def _comfy_cache_tensors(self) -> list:
        """What ComfyUI's RAM-pressure node cache counts for this output: the experts' host copies."""
        out = []
        for patcher in (self.high, self.low):
            hook = getattr(getattr(getattr(patcher, "model", None), "weights", None), "_comfy_cache_tensors", None)
            out += hook() if hook is not None else []
        return out

    def patcher(self, name: str) -> Any:
        if name not in ("high", "low"):
            raise ValueError(f"expert name must be 'high' or 'low', got {name!r}")
        return self.high if name == "high" else self.low

    @property
    def text_len(self) -> int:
        return self.formats["high"].config.text_len

    @property
    def text_dim(self) -> int:
        return self.formats["high"].config.text_dim


@dataclass
class TextEmbeds:
    """LINGBOT_TEXT: umT5 embeddings trimmed to their true length, [L, dim] each, on the CPU."""

    positive: torch.Tensor
    negative: torch.Tensor
    prompt: str
    negative_prompt: str

    def _comfy_cache_tensors(self) -> list:
        return [self.positive, self.negative]


@dataclass
class CameraInput:
    """LINGBOT_CAMERA: a trajectory (poses + intrinsics at 480x832); rasterised to Plücker at the sampler."""

    poses: np.ndarray  # [N, 4, 4] float32 OpenCV camera-to-world (float64 for a path built from keys)
    intrinsics: np.ndarray  # [N, 4] float32 (fx, fy, cx, cy)
    per_frame_intrinsics: bool = False
    label: str = ""
    includes_end_pose: bool = False  # a path built from keys: frames + 1 poses (see wan.control.act_to_camera)
    keys: Any = None  # the KeyTimeline the path was walked from (LingBot Fast Continue walks on from a state)

    @property
    def num_frames(self) -> int:
        return int(self.poses.shape[0]) - int(self.includes_end_pose)


@dataclass
class ActInput:
    """LINGBOT_ACT: the Act model's control before rasterising: poses (orientation) + w,a,s,d per frame."""

    poses: np.ndarray  # [N, 4, 4] camera-to-world (N = frames + 1 when includes_end_pose)
    intrinsics: np.ndarray  # [N, 4] (fx, fy, cx, cy) at 480x832
    actions: np.ndarray  # [M, 4] w, a, s, d values per frame
    label: str = ""
    includes_end_pose: bool = False

    @property
    def num_frames(self) -> int:
        return min(int(self.poses.shape[0]) - int(self.includes_end_pose), int(self.actions.shape[0]))


@dataclass
class VAEHandle:
    """LINGBOT_VAE: the Wan2.1 VAE inside a ComfyUI ModelPatcher (loaded to the GPU on use)."""

    patcher: Any
    path: Path

    @property
    def model(self):
        return self.patcher.model.vae

    def _comfy_cache_tensors(self) -> list:
        from .host_memory import host_tensors

        return host_tensors(self.model)  # its weights while offloaded to the CPU


@dataclass
class I2VCondition:
    """LINGBOT_I2V: the 20-channel conditioning y and the sizes it was built for."""

    y: torch.Tensor  # [1, 20, F_lat, h/8, w/8] float32, CPU
    height: int
    width: int
    frames: int
    latent_mean: tuple = field(default_factory=tuple)  # the VAE's latent statistics (raw = z*std + mean)
    latent_std: tuple = field(default_factory=tuple)
    note: Optional[str] = None
    # what the conditioning of later frames needs (a continued Fast video): the image as encoded, the VAE, tiling
    image: Optional[torch.Tensor] = None  # [3, H, W] in [-1, 1] (before the resize), CPU
    vae: Any = None  # VAEHandle
    tiled: bool = False
    track: Any = None  # wan.i2v.ConditionTrack, built on the first continuation and kept with this output

    @property
    def latent_shape(self) -> tuple[int, int, int, int, int]:
        _, _, f, h, w = self.y.shape
        return (1, len(self.latent_mean) or 16, f, h, w)

    def to_raw_latent(self, z: torch.Tensor) -> torch.Tensor:
        """Normalised latent (what the DiT samples) -> raw VAE latent (ComfyUI's LATENT for Wan)."""
        shape = (1, z.shape[1], 1, 1, 1)
        mean = torch.tensor(self.latent_mean, dtype=torch.float32, device=z.device).view(shape)
        std = torch.tensor(self.latent_std, dtype=torch.float32, device=z.device).view(shape)
        return z.float() * std + mean
