"""Write decoded frames as H.264 mp4 (imageio-ffmpeg, optional) or as PNG frames."""
from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import torch

log = logging.getLogger(__name__)


def to_uint8_frames(video: torch.Tensor) -> np.ndarray:
    """[3, F, H, W] in [-1, 1] -> [F, H, W, 3] uint8, truncating like the reference's save_video."""
    v = ((video.float().clamp(-1, 1) + 1) / 2 * 255).to(torch.uint8)
    return v.permute(1, 2, 3, 0).contiguous().cpu().numpy()


def write_video(video: torch.Tensor, out: Path, fps: int = 16) -> Path:
    frames = to_uint8_frames(video)
    out = Path(out)
    if out.suffix.lower() == ".mp4":
        try:
            import imageio.v2 as imageio

            with imageio.get_writer(out, fps=fps, codec="libx264", quality=8, macro_block_size=8) as w:
                for f in frames:
                    w.append_data(f)
            return out
        except ImportError:
            log.warning("imageio/imageio-ffmpeg not installed (pip install 'lingbot-world-nf4[video]'): "
                        "writing PNG frames instead")
            out = out.with_suffix("")
    from PIL import Image

    out.mkdir(parents=True, exist_ok=True)
    for i, f in enumerate(frames):
        Image.fromarray(f).save(out / f"frame_{i:04d}.png")
    return out
