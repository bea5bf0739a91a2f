"""Write decoded frames as H.264 mp4 (imageio-ffmpeg, optional) or as PNG frames."""
from __future__ import annotations

import logging
from pathlib import Path
from typing import Optional

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


class FrameWriter:
    """Writes a video chunk by chunk as it is decoded (the Fast model's streaming output).

    mp4: frames go to `<name>.partial.mp4`, renamed to `out` by close(), so an interrupted run leaves a playable
    file of what was decoded (close() is called for that too) and never a half-written `out`. Without
    imageio-ffmpeg, or for a folder name: PNG frames appear in the folder as they come.
    """

    def __init__(self, out: Path, fps: int = 16):
        self.out = Path(out)
        self.fps = fps
        self.frames = 0
        self._writer = None
        self._folder: Optional[Path] = None
        if self.out.suffix.lower() == ".mp4":
            try:
                import imageio.v2 as imageio

                self._tmp = self.out.with_name(self.out.stem + ".partial.mp4")
                self._writer = imageio.get_writer(self._tmp, fps=fps, codec="libx264", quality=8, macro_block_size=8)
            except ImportError:
                log.warning("imageio/imageio-ffmpeg not installed (pip install 'lingbot-world-nf4[video]'): "
                            "writing PNG frames instead")
                self.out = self.out.with_suffix("")
        if self._writer is None:
            self._folder = self.out
            self._folder.mkdir(parents=True, exist_ok=True)

    def append(self, video: torch.Tensor) -> None:
        """Frames [3, T, H, W] in [-1, 1]."""
        from PIL import Image

        for f in to_uint8_frames(video):
            if self._writer is not None:
                self._writer.append_data(f)
            else:
                Image.fromarray(f).save(self._folder / f"frame_{self.frames:04d}.png")
            self.frames += 1

    def close(self) -> Path:
        if self._writer is not None:
            self._writer.close()
            self._writer = None
            self._tmp.replace(self.out)
        return self.out

    def discard(self) -> None:
        """Close without keeping anything (no frame was written)."""
        if self._writer is not None:
            try:
                self._writer.close()
            except Exception:  # ffmpeg may refuse to finish a file without frames
                pass
            self._writer = None
            self._tmp.unlink(missing_ok=True)
