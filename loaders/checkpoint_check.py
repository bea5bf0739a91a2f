"""Pre-flight of a checkpoint: every file's header and sizes checked in seconds, before any expensive work.

A truncated expert, T5 or VAE file (an interrupted download) is found here, not after minutes of text
encoding and VAE encoding. Nothing is loaded: safetensors headers give each tensor's byte range (checked
against the file size by `read_header`), and a torch `.pth`/`.pt` is a zip whose central directory sits at
the very end of the file, so a truncated one has none (checked here with `zipfile`); then each part's keys
and shapes are matched against the model it must be.
"""
from __future__ import annotations

import os
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Union

from .checkpoint_dir import CheckpointFiles
from .expert_format import ExpertFormat, detect_format
from .safetensors_stream import read_header

PathLike = Union[str, os.PathLike]
TORCH_ZIP_SUFFIXES = (".pth", ".pt", ".ckpt", ".bin")
_ZIP_MAGIC = b"PK\x03\x04"
_LOCAL_HEADER = 30  # fixed part of a zip local file header


class CheckpointFileError(ValueError):
    """A weights file is truncated or damaged; the message names it and says to download it again."""


def check_torch_zip(path: PathLike, what: str = "weights") -> None:
    """A torch zip checkpoint is complete: its central directory is readable and every member lies inside
    the file. Files that are not zips (PyTorch's legacy format) are left to their loader."""
    path = Path(path)
    size = path.stat().st_size
    with open(path, "rb") as f:
        if f.read(len(_ZIP_MAGIC)) != _ZIP_MAGIC:
            return
    redo = "the file is truncated or damaged (an interrupted download?); download it again"
    try:
        with zipfile.ZipFile(path) as z:
            members = z.infolist()
    except (zipfile.BadZipFile, OSError, ValueError) as e:
        raise CheckpointFileError(f"{what} file {path} ({size} bytes): no readable zip directory ({e}); {redo}") from None
    for m in members:
        end = m.header_offset + _LOCAL_HEADER + len(m.filename.encode("utf-8")) + m.compress_size
        if end > size:
            raise CheckpointFileError(
                f"{what} file {path}: member {m.filename!r} ends at byte {end}, the file has {size}; {redo}"
            )


def check_weights_file(path: PathLike, what: str = "weights") -> None:
    """Header and sizes of one .safetensors or torch zip file (no tensor data is read)."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{what} file {path} does not exist")
    if path.suffix == ".safetensors":
        read_header(path)
    elif path.suffix in TORCH_ZIP_SUFFIXES:
        check_torch_zip(path, what)


def _expert_files(path: Path) -> list[Path]:
    """The torch files an expert path may hold (safetensors headers are checked by detect_format)."""
    if path.is_file():
        return [path] if path.suffix in TORCH_ZIP_SUFFIXES else []
    pt = path / "model.pt"
    return [pt] if pt.is_file() else []


@dataclass
class CheckedCheckpoint:
    high: ExpertFormat
    low: ExpertFormat


def check_checkpoint(files: CheckpointFiles, vae_config=None) -> CheckedCheckpoint:
    """Check both experts, the text encoder, its tokenizer and the VAE; raises the first problem found.

    Errors are ValueError / FileNotFoundError subclasses naming the file. vae_config: the VAE's config when
    it is not the release's (the demo checkpoint).
    """
    from .t5_files import inspect_t5_file
    from .t5_tokenizer import resolve_tokenizer_source
    from .vae_files import check_vae_file

    experts = {}
    for name, what in (("high", "high-noise expert"), ("low", "low-noise expert")):
        path = Path(getattr(files, name)).expanduser()
        for f in _expert_files(path):
            check_torch_zip(f, what)
        experts[name] = detect_format(path)  # every safetensors header, key set and config
    if experts["high"].config.dim != experts["low"].config.dim:
        raise CheckpointFileError(
            f"the experts do not match: {files.high} has width {experts['high'].config.dim}, {files.low} has "
            f"{experts['low'].config.dim}; use the high- and low-noise experts of one release"
        )
    check_weights_file(files.t5, "text encoder")
    t5 = inspect_t5_file(files.t5)
    if t5.config.dim != experts["high"].config.text_dim:
        raise CheckpointFileError(
            f"text encoder {files.t5} gives {t5.config.dim}-wide embeddings, the experts take "
            f"{experts['high'].config.text_dim}; use the umT5-XXL encoder of the release"
        )
    resolve_tokenizer_source(files.tokenizer, files.t5)
    check_weights_file(files.vae, "VAE")
    check_vae_file(files.vae, vae_config)
    return CheckedCheckpoint(experts["high"], experts["low"])

