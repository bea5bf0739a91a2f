"""Start images sent by the page: read from a multipart form, checked from their header before any pixel is
decoded, kept only in the player's uploads folder.

A picture's pixel count is read from its header and bounded (a 500 KB PNG can declare 16000x11000 pixels: gigabytes
once decoded), so nothing large is ever decoded for it. Every refusal is an HTTP 400 or 413 with one line of text the
page shows.
"""
from __future__ import annotations

import io
import os
import re
import secrets
import time
import warnings
from pathlib import Path
from typing import Optional

from aiohttp import BodyPartReader, web

UPLOAD_TYPES = {"PNG": ".png", "JPEG": ".jpg", "WEBP": ".webp", "BMP": ".bmp"}
MAX_UPLOAD_BYTES = 32 * 1024 * 1024
MAX_START_PIXELS = 40_000_000  # 40 megapixels (a 7700x5200 photo); the video itself is at most 0.9
FORM_FIELD = "image"
_SAFE_NAME = re.compile(r"^[A-Za-z0-9_.-]{1,128}$")


class ImageRefused(ValueError):
    """A start image the player does not take; `status` is the HTTP code (400 or 413)."""

    def __init__(self, message: str, status: int = 400):
        super().__init__(message)
        self.status = status


def check_image_header(data_or_path) -> str:
    """The picture's format (PNG, JPEG, WEBP or BMP), read from its header only; ImageRefused for anything that is
    not such a picture or has more than MAX_START_PIXELS pixels."""
    from PIL import Image, UnidentifiedImageError

    source = io.BytesIO(data_or_path) if isinstance(data_or_path, (bytes, bytearray)) else data_or_path
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)  # the bound below decides
            with Image.open(source) as im:
                fmt, (width, height) = im.format, im.size
                if width * height <= MAX_START_PIXELS:
                    im.verify()  # the file's structure (chunk checksums), still without decoding the pixels
    except Image.DecompressionBombError as e:  # past PIL's own bound: it refuses to open it at all
        found = re.search(r"\((\d+) pixels\)", str(e))
        size = f"has {int(found.group(1)) / 1e6:.0f} megapixels" if found else "is far too large"
        raise ImageRefused(f"upload: the picture {size}; the player takes at most {MAX_START_PIXELS // 1_000_000} "
                           "megapixels: scale it down", 413) from None
    except (UnidentifiedImageError, OSError, ValueError, SyntaxError, EOFError):
        raise ImageRefused("upload: not a PNG, JPEG, WebP or BMP picture") from None
    if width * height > MAX_START_PIXELS:
        raise ImageRefused(f"upload: the picture is {width}x{height} ({width * height / 1e6:.0f} megapixels); the "
                           f"player takes at most {MAX_START_PIXELS // 1_000_000} megapixels: scale it down", 413)
    if fmt not in UPLOAD_TYPES:
        raise ImageRefused(f"upload: a {fmt} picture; send a PNG, JPEG, WebP or BMP")
    return fmt


async def read_upload(request: web.Request) -> bytes:
    """The bytes of the form's `image` field; ImageRefused for any other body (one line, never a traceback)."""
    if request.content_type != "multipart/form-data":
        raise ImageRefused(f"upload: send a multipart/form-data form with the picture in the field '{FORM_FIELD}' "
                           f"(got {request.content_type or 'no content type'})")
    if request.content_length is not None and request.content_length > MAX_UPLOAD_BYTES + (1 << 20):
        raise _too_big()
    try:
        reader = await request.multipart()
        field = await reader.next()
        while field is not None and not (isinstance(field, BodyPartReader) and field.name == FORM_FIELD):
            field = await reader.next()  # other fields (a file name, say) are skipped, never kept
        if field is None:
            raise ImageRefused(f"upload: the form has no field '{FORM_FIELD}' with the picture")
        data = bytearray()
        while chunk := await field.read_chunk():
            data += chunk
            if len(data) > MAX_UPLOAD_BYTES:
                raise _too_big()
    except (ValueError, AssertionError, KeyError, UnicodeError) as e:
        if isinstance(e, ImageRefused):
            raise
        raise ImageRefused(f"upload: the form could not be read ({_first_line(e)}); send the picture as a "
                           f"multipart/form-data field '{FORM_FIELD}'") from None
    if not data:
        raise ImageRefused("upload: the picture is empty")
    return bytes(data)


def keep_upload(folder: Path, data: bytes, fmt: str) -> str:
    """Writes the checked picture into `folder` under a fresh name (whole or not at all); its name."""
    folder.mkdir(parents=True, exist_ok=True)
    name = f"upload_{time.strftime('%Y%m%d_%H%M%S')}_{secrets.token_hex(3)}{UPLOAD_TYPES[fmt]}"
    tmp = folder / f".{name}.part"
    try:
        tmp.write_bytes(data)
        os.replace(tmp, folder / name)
    finally:
        tmp.unlink(missing_ok=True)  # a failed write leaves nothing behind
    return name


def refusal(e: ImageRefused) -> web.HTTPException:
    """The HTTP answer to a refused upload: its one line as the body."""
    if e.status == 413:
        return web.HTTPRequestEntityTooLarge(MAX_UPLOAD_BYTES, 0, text=str(e))
    return web.HTTPBadRequest(text=str(e))


def _too_big() -> ImageRefused:
    return ImageRefused(f"upload: the file is larger than {MAX_UPLOAD_BYTES // 2**20} MB; send a smaller picture", 413)


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    return text.splitlines()[0][:160] if text else type(e).__name__


def existing_upload(folder: Path, name: Optional[str]) -> Optional[Path]:
    """The upload `name` in `folder` if it is one (a plain name of a picture file there), else None."""
    if not isinstance(name, str) or not _SAFE_NAME.match(name) or name.startswith("."):
        return None
    path = folder / name
    return path if path.suffix in UPLOAD_TYPES.values() and path.is_file() else None
