"""Is a requested video possible at all on this machine? Checked from shapes before any work starts.

Not a plan (that is expert_plan.py, which picks a memory mode once the run is under way), only a floor: a
video whose unavoidable tensors alone exceed the machine's total RAM (or, on a GPU, the card's total memory)
is refused with the numbers, instead of failing after minutes or asking the allocator for 119 GiB.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from ..wan.dit.model import DiTConfig
from .estimates import estimate_activation_bytes

# Host bytes per pixel per frame that a run holds at its peak, at least: the VAE's input video (fp32 RGB, 12),
# the packed Plücker camera input (384 fp32 channels per 4 frames x 8x8 pixels, 6), the decoded video and its
# uint8 conversion (12 + 12 + 3), and the frames handed to the encoder (3).
HOST_BYTES_PER_PIXEL_FRAME = 48


class VideoTooLargeError(ValueError):
    """The requested size / frame count cannot fit this machine; the message gives the numbers."""


def _gib(n: float) -> str:
    return f"{n / 2**40:.1f} TiB" if n >= 2**40 else f"{n / 2**30:.1f} GiB"


@dataclass(frozen=True)
class VideoMemoryNeeds:
    host_bytes: int  # RAM for the pixel-space tensors (plus the DiT activations when computing on the CPU)
    device_bytes: int  # GPU memory for one DiT forward's activations (sequential CFG, chunked), 0 on the CPU


def video_memory_needs(frames: int, height: int, width: int, cfg: DiTConfig, on_gpu: bool,
                       camera: bool = True) -> VideoMemoryNeeds:
    """The least memory a frames x height x width run needs (the cheapest plan: sequential CFG, chunked)."""
    pixels = frames * height * width * HOST_BYTES_PER_PIXEL_FRAME
    act = estimate_activation_bytes(frames, height, width, cfg, cfg_batch=False, camera=camera,
                                    compute_bytes=2 if on_gpu else 4)
    return VideoMemoryNeeds(pixels + (0 if on_gpu else act), act if on_gpu else 0)


def check_video_fits(frames: int, height: int, width: int, cfg: DiTConfig, *, total_ram: int,
                     total_vram: Optional[int] = None, camera: bool = True,
                     what: str = "") -> VideoMemoryNeeds:
    """Raise VideoTooLargeError when the video cannot fit the machine's total memory; returns the needs.

    total_vram: the GPU's total memory when computing on a GPU, None on the CPU. `what` names the flags that
    set the size (for the message), e.g. "--frames 161 --size 720*1280".
    """
    needs = video_memory_needs(frames, height, width, cfg, total_vram is not None, camera)
    video = f"{frames} frames at {width}x{height}" + (f" ({what})" if what else "")
    if needs.host_bytes > total_ram:
        raise VideoTooLargeError(
            f"{video} needs at least {_gib(needs.host_bytes)} of RAM ({HOST_BYTES_PER_PIXEL_FRAME} bytes per pixel "
            f"per frame for the video and camera tensors"
            + ("" if total_vram is not None else ", plus the model's activations on the CPU")
            + f"), more than this machine's {_gib(total_ram)}; use fewer frames or a smaller size"
        )
    if total_vram is not None and needs.device_bytes > total_vram:
        raise VideoTooLargeError(
            f"{video} needs at least {_gib(needs.device_bytes)} of GPU memory for the model's activations alone, "
            f"more than the GPU's {_gib(total_vram)}; use fewer frames or a smaller size"
        )
    return needs
