"""Frames on the wire: JPEG bytes behind an 8-byte header (chunk number, frame number in the video).

Binary WebSocket message = uint32 BE chunk | uint32 BE frame | JPEG. Chunk 0 is the start image. The frame word's
top bit marks a preview (the chunk's frames after its first denoising step, replaced by the real frames of the same
numbers when they come); a real frame's header is what it always was.
"""
from __future__ import annotations

import base64
import io
import struct
from pathlib import Path

import numpy as np

HEADER = struct.Struct(">II")
PREVIEW_BIT = 1 << 31
JPEG_QUALITY = 90


def jpeg(frame: np.ndarray, quality: int = JPEG_QUALITY) -> bytes:
    """[H, W, 3] uint8 RGB -> JPEG bytes."""
    from PIL import Image

    buf = io.BytesIO()
    Image.fromarray(np.ascontiguousarray(frame)).save(buf, format="JPEG", quality=quality)
    return buf.getvalue()


def frame_message(chunk: int, frame: int, data: bytes, preview: bool = False) -> bytes:
    if not 0 <= frame < PREVIEW_BIT:
        raise ValueError(f"frame number {frame} does not fit the header")
    return HEADER.pack(chunk, frame | (PREVIEW_BIT if preview else 0)) + data


def read_frame_message(message: bytes) -> tuple[int, int, bytes]:
    """(chunk, frame number, JPEG) of a message, a preview's frame number without its mark (`is_preview`)."""
    chunk, frame = HEADER.unpack_from(message)
    return chunk, frame & ~PREVIEW_BIT, message[HEADER.size:]


def is_preview(message: bytes) -> bool:
    return bool(HEADER.unpack_from(message)[1] & PREVIEW_BIT)


def image_preview(path: Path, width: int, height: int) -> bytes:
    """The start image as the page shows it before the first chunk: EXIF-rotated, RGB, fitted to the video size."""
    from PIL import Image, ImageOps

    with Image.open(path) as im:
        im = ImageOps.exif_transpose(im).convert("RGB")
        return jpeg(np.asarray(ImageOps.fit(im, (width, height))))


def png_data_url(picture) -> str:
    """A PIL picture (the minimap) as a data: URL for the page; '' for None."""
    if picture is None:
        return ""
    buf = io.BytesIO()
    picture.save(buf, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode("ascii")
