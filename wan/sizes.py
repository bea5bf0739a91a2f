"""Output sizes and frame counts of the LingBot-World pipeline (spec §5.2).

The output keeps the image's aspect ratio inside a pixel budget (`max_area`); both sides are multiples of
16 so that the 8x VAE and the 2x2 DiT patchify divide them. Frame counts are 4n+1 because the VAE packs
frames 1.. in groups of four behind the first one.
"""
from __future__ import annotations

import math
import numbers
from typing import Optional

VAE_STRIDE = 8  # pixels per latent cell (spatial)
VAE_TEMPORAL_STRIDE = 4  # frames per latent frame after the first
PATCH = 2  # DiT patch side in latent cells

# `--size` strings of the reference generate.py -> pixel budget (H*W).
SIZE_AREAS: dict[str, int] = {
    "480p": 480 * 832,
    "720p": 720 * 1280,
}


def height_width(size: str) -> Optional[tuple[int, int]]:
    """(H, W) of an "H*W" / "HxW" string such as "480*832" (both positive), else None (a size name, or no size)."""
    key = size.strip().lower()
    for sep in ("*", "x"):
        a, _, b = key.partition(sep)
        if b and a.strip().isdigit() and b.strip().isdigit() and int(a) > 0 and int(b) > 0:
            return int(a), int(b)
    return None


def max_area_for(size: str) -> int:
    """Pixel budget for a size name ("480p", "720p") or an "H*W" / "HxW" string such as "480*832"."""
    key = size.strip().lower()
    if key in SIZE_AREAS:
        return SIZE_AREAS[key]
    hw = height_width(key)
    if hw is not None:
        return hw[0] * hw[1]
    raise ValueError(f"unknown size {size!r}: use one of {sorted(SIZE_AREAS)} or 'H*W' such as '480*832'")


def target_size(img_h: int, img_w: int, max_area: int) -> tuple[int, int]:
    """(h, w) in pixels the reference resizes an img_h x img_w image to (spec §5.2; no crop).

    lat = floor(floor(sqrt(max_area * ar) / 8) / 2) * 2 with ar = img_h / img_w (width uses 1/ar),
    then h = 8 * lat_h, w = 8 * lat_w. The float arithmetic mirrors the reference so that borderline
    aspect ratios round the same way. Example: 720x1280 at 480*832 -> (464, 832).
    """
    if img_h <= 0 or img_w <= 0:
        raise ValueError(f"image size must be positive, got {img_h}x{img_w}")
    if max_area <= 0:
        raise ValueError(f"max_area must be positive, got {max_area}")
    ar = img_h / img_w
    lat_h = round(math.sqrt(max_area * ar) // VAE_STRIDE // PATCH * PATCH)
    lat_w = round(math.sqrt(max_area / ar) // VAE_STRIDE // PATCH * PATCH)
    if lat_h < PATCH or lat_w < PATCH:
        raise ValueError(
            f"image {img_h}x{img_w} at max_area {max_area} gives a latent of {lat_h}x{lat_w}; "
            f"the aspect ratio is too extreme or max_area too small (each side needs >= {PATCH * VAE_STRIDE} px)"
        )
    return VAE_STRIDE * lat_h, VAE_STRIDE * lat_w


def latent_size(h: int, w: int) -> tuple[int, int]:
    """Latent (lat_h, lat_w) of an h x w frame; both must be multiples of 16 (8 VAE x 2 patch)."""
    step = VAE_STRIDE * PATCH
    if h <= 0 or w <= 0 or h % step or w % step:
        raise ValueError(f"frame size {w}x{h} (width x height) must be positive multiples of {step}; use target_size() to pick one")
    return h // VAE_STRIDE, w // VAE_STRIDE


# The longest video a run makes (1 h 44 min at 16 fps): a run holds per-frame tensors (the camera input, the
# latents) for the whole video, so a larger count (a typo, an overflowing script) is refused up front instead of
# asking for terabytes of RAM.
MAX_FRAMES = 100_001


def _is_int(value: object) -> bool:
    # numpy integers count, bools do not (True would otherwise pass as 1 frame)
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def frames_ok(frames: int) -> bool:
    """True when `frames` has the 4n+1 form the VAE needs (1, 5, 9, ..., 81, ..., 161)."""
    return _is_int(frames) and frames >= 1 and (frames - 1) % VAE_TEMPORAL_STRIDE == 0


def frames_at_most(frames: int) -> int:
    """The largest 4n+1 frame count <= frames (>= 1): what a latent video of that length can hold."""
    return ((max(int(frames), 1) - 1) // VAE_TEMPORAL_STRIDE) * VAE_TEMPORAL_STRIDE + 1


def check_frames(frames: int) -> int:
    """Return `frames` if it is 4n+1, otherwise raise a ValueError that names the nearest valid counts."""
    if not frames_ok(frames):
        if not _is_int(frames) or frames < 1:
            raise ValueError(f"frame count must be a positive integer of the form 4n+1, got {frames!r}")
        frames = int(frames)
        below = frames_at_most(frames)
        raise ValueError(
            f"frame count {frames} is not of the form 4n+1; use {below} or {below + VAE_TEMPORAL_STRIDE}"
        )
    if frames > MAX_FRAMES:
        raise ValueError(f"frame count {frames} is more than {MAX_FRAMES}, the longest video a run makes (1 h 44 min "
                         "at 16 fps: every frame's camera and latents are held for the whole run); ask for fewer")
    return int(frames)


def latent_frames(frames: int) -> int:
    """Latent frames F_lat = (F - 1) / 4 + 1 of a 4n+1 frame count."""
    return (check_frames(frames) - 1) // VAE_TEMPORAL_STRIDE + 1


def token_count(frames: int, h: int, w: int) -> int:
    """DiT sequence length L = F_lat * lat_h * lat_w / 4 (e.g. 81 frames at 464x832 -> 31,668)."""
    lat_h, lat_w = latent_size(h, w)
    return latent_frames(frames) * (lat_h // PATCH) * (lat_w // PATCH)
