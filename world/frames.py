"""What a World session hands its doors: decoded frames, chunk timings, a fixed-length conditioning."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from .errors import WorldError


@dataclass
class ChunkFrames:
    """Frames of the video as they are decoded: `frames` uint8 [n, H, W, 3], the first at `first_frame`. A preview
    (`WorldSession.step(on_preview=...)`) is the chunk's frames as its first denoising step saw them: shown until the
    real frames of the same numbers come, never part of the video."""

    chunk: int
    first_frame: int
    frames: np.ndarray
    preview: bool = False


class FixedCondition:
    """The conditioning of a video whose length is known (a plain `build_i2v_condition` result): the
    `ConditionTrack.frames` interface over the frames it has."""

    def __init__(self, y: torch.Tensor):
        self.y = y

    def frames(self, start: int, count: int) -> torch.Tensor:
        if start + count > self.y.shape[2]:
            raise WorldError(f"the conditioning covers {self.y.shape[2]} latent frames; this video needs "
                             f"{start + count}: build a ConditionTrack to make a longer video")
        return self.y[:, :, start:start + count]


def to_uint8(frames: torch.Tensor) -> np.ndarray:
    """Decoded frames [1, 3, T, H, W] in [-1, 1] -> uint8 [T, H, W, 3], truncating like the reference's save_video
    (the conversion every video writer of the package uses)."""
    x = ((frames[0].float().clamp(-1, 1) + 1) / 2 * 255).to(torch.uint8)
    return x.permute(1, 2, 3, 0).contiguous().cpu().numpy()


@dataclass
class ChunkTimes:
    dit: float = 0.0
    decode: float = 0.0
    total: float = 0.0
    preview: float = 0.0  # decoding a played chunk's preview (inside the model's run, not counted in `dit`)

    def to_json(self) -> dict:
        out = {"dit": round(self.dit, 4), "decode": round(self.decode, 4), "total": round(self.total, 4)}
        if self.preview:
            out["preview"] = round(self.preview, 4)
        return out
