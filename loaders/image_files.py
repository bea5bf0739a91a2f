"""The first frame from an image file, decoded the way users expect, or one clear error.

Like ComfyUI's LoadImage (so the CLI and a graph give the same video for the same file): the EXIF
orientation is applied (phone photos come out upright) and an alpha channel is dropped (the colour under
transparent pixels is used, as the reference's `convert("RGB")` does). Beyond a plain `convert("RGB")`:
16-bit greyscale is scaled from its full range (Pillow would clip it to near-white), palette and CMYK
images are converted properly, and Pillow's decompression-bomb limit becomes a message with the numbers.
"""
from __future__ import annotations

import os
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Union

import numpy as np
import torch

PathLike = Union[str, os.PathLike]


class ImageFileError(ValueError):
    """The image file cannot be used; the message names the file and what to do."""


@dataclass
class DecodedImage:
    pixels: torch.Tensor  # [3, H, W] float32 in [-1, 1] (the reference's to_tensor * 2 - 1)
    notes: list[str] = field(default_factory=list)  # what was done beyond a plain decode (alpha, rotation)

    @property
    def size(self) -> tuple[int, int]:
        return int(self.pixels.shape[1]), int(self.pixels.shape[2])


_EXIF_ORIENTATION = 0x0112
_SIXTEEN_BIT = ("I;16", "I;16L", "I;16B", "I;16N")


def _to_unit_rgb(im, path: Path, notes: list[str]) -> np.ndarray:
    """Pillow image of any mode -> [H, W, 3] float32 in [0, 1]."""
    mode = im.mode
    if mode in _SIXTEEN_BIT or mode == "I":
        # 16-bit greyscale (mode I: older Pillow's 16-bit PNGs, 16/32-bit TIFFs): scale the 16-bit range
        arr = np.asarray(im, dtype=np.float64)
        if arr.min() < 0 or arr.max() > 65535:
            raise ImageFileError(f"image {path}: 32-bit integer pixels ({arr.min():.0f}..{arr.max():.0f}) are not "
                                 "supported; save it as an 8- or 16-bit PNG or a JPEG")
        grey = (arr / 65535.0).astype(np.float32)
        return np.repeat(grey[..., None], 3, axis=-1)
    if mode == "F":
        arr = np.asarray(im, dtype=np.float32)
        if not np.isfinite(arr).all() or arr.min() < 0 or arr.max() > 1:
            raise ImageFileError(f"image {path}: floating-point pixels outside 0..1 are not supported; save it as "
                                 "an 8- or 16-bit PNG or a JPEG")
        return np.repeat(arr[..., None], 3, axis=-1)
    if mode == "P":
        im = im.convert("RGBA" if "transparency" in im.info else "RGB")
        mode = im.mode
    if mode in ("RGBA", "LA", "RGBa", "La", "PA"):
        notes.append("its alpha channel is ignored (like the reference and ComfyUI's LoadImage); flatten it onto "
                     "a background first if transparent areas should have a colour")
    try:
        rgb = im.convert("RGB")
    except (ValueError, OSError) as e:
        raise ImageFileError(f"image {path}: colour mode {mode} cannot be converted to RGB ({e}); save it as an RGB "
                             "PNG or JPEG") from None
    return np.asarray(rgb, dtype=np.float32) / 255.0


def load_image(path: PathLike) -> DecodedImage:
    """Decode `path` to [3, H, W] float32 in [-1, 1]. Raises ImageFileError / FileNotFoundError."""
    from PIL import Image, ImageOps, UnidentifiedImageError

    path = Path(path).expanduser()
    if not path.exists():
        raise FileNotFoundError(f"image {path} does not exist")
    if not path.is_file():
        raise ImageFileError(f"image {path} is not a file; give the path of a PNG or JPEG")
    notes: list[str] = []
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)  # large but allowed: decoded below
            with Image.open(path) as im:
                im.load()
                w, h = im.size
                if im.getexif().get(_EXIF_ORIENTATION, 1) not in (1, None):
                    im = ImageOps.exif_transpose(im)
                    notes.append("rotated upright by its EXIF orientation (as ComfyUI's LoadImage does)")
                arr = _to_unit_rgb(im, path, notes)
    except Image.DecompressionBombError as e:
        raise ImageFileError(
            f"image {path} is too large to decode safely ({e}); this is Pillow's decompression-bomb limit. "
            "Downscale it first: the model uses at most 1280x720"
        ) from None
    except UnidentifiedImageError:
        raise ImageFileError(f"{path} is not an image Pillow can read; give a PNG, JPEG or WebP file") from None
    except ImageFileError:
        raise
    except (OSError, SyntaxError, ValueError) as e:
        raise ImageFileError(f"image {path} is damaged or truncated ({e}); export it again") from None
    if arr.shape[0] < 1 or arr.shape[1] < 1:
        raise ImageFileError(f"image {path} has no pixels ({w}x{h})")
    pixels = torch.from_numpy(np.ascontiguousarray(arr)).permute(2, 0, 1).contiguous() * 2 - 1
    return DecodedImage(pixels, notes)
