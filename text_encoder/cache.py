"""On-disk cache of prompt embeddings, so a repeated prompt never starts the 11 GB text encoder again.

An entry is one safetensors file holding `embedding` [L, dim] and, in its metadata, the full key it was
written for and the sha256 of the tensor's bytes. The key covers the encoder file's identity (absolute
path, size, mtime_ns), the tokenizer's identity, the text and its length, the dtype and max length.
Writes are atomic (loaders/atomic.py). Every read checks the key, the checksum and that all values are
finite: an altered or NaN entry would otherwise make every later video of that prompt black, so a bad
entry is deleted with a warning and reported as a miss (the prompt is encoded again).
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Union

import numpy as np
import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import save_file

from ..loaders.atomic import atomic_path

log = logging.getLogger(__name__)

CACHE_FORMAT = 1
_TENSOR = "embedding"


def default_cache_dir() -> Path:
    """`$XDG_CACHE_HOME/lingbot-world/text`, i.e. `~/.cache/lingbot-world/text` by default."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "lingbot-world" / "text"


def file_identity(path: Union[str, os.PathLike]) -> dict:
    """Identity of a weights file without reading it: absolute path, size and mtime in ns."""
    p = Path(path).expanduser().resolve()
    st = p.stat()
    return {"path": str(p), "size": st.st_size, "mtime_ns": st.st_mtime_ns}


@dataclass(frozen=True)
class CacheKey:
    encoder: dict
    tokenizer: dict
    text: str
    dtype: str = "bfloat16"
    max_length: int = 512

    def canonical(self) -> str:
        return json.dumps(
            {"format": CACHE_FORMAT, "encoder": self.encoder, "tokenizer": self.tokenizer, "text": self.text,
             "text_len": len(self.text), "dtype": self.dtype, "max_length": self.max_length},
            sort_keys=True, ensure_ascii=False,
        )

    def digest(self) -> str:
        return hashlib.sha256(self.canonical().encode("utf-8")).hexdigest()


class EmbeddingCache:
    def __init__(self, root: Union[str, os.PathLike, None] = None):
        self.root = Path(root).expanduser() if root is not None else default_cache_dir()

    def path_for(self, key: CacheKey) -> Path:
        return self.root / f"{key.digest()}.safetensors"

    def get(self, key: CacheKey) -> Optional[torch.Tensor]:
        """The cached embedding, or None. A missing entry is a miss; an unreadable, mismatched, altered
        (checksum) or non-finite one is deleted with a warning and is a miss too, so it gets encoded again."""
        path = self.path_for(key)
        if not path.is_file():
            return None
        try:
            with safe_open(str(path), framework="pt") as f:
                meta = f.metadata() or {}
                if meta.get("key") != key.canonical():
                    raise ValueError("metadata does not match the key")
                tensor = f.get_tensor(_TENSOR)
            if tensor.dim() != 2 or str(tensor.dtype).replace("torch.", "") != key.dtype:
                raise ValueError(f"unexpected tensor {tuple(tensor.shape)} {tensor.dtype}")
            if "sha256" not in meta:
                raise ValueError("no checksum (written by an older version)")
            if tensor_sha256(tensor) != meta["sha256"]:
                raise ValueError("its data does not match its checksum (the file was altered or damaged)")
            if not all_finite(tensor):
                raise ValueError("it holds NaN or infinite values")
            return tensor.clone()  # own memory: the entry may be replaced or deleted later
        except Exception as e:
            log.warning("text-embedding cache: dropping entry %s (%s); the prompt is encoded again", path.name, e)
            try:
                path.unlink()
            except OSError:
                pass
            return None

    def put(self, key: CacheKey, embedding: torch.Tensor) -> Path:
        """Store atomically (temp file + rename), with a checksum of the data; returns the entry's path. A write that
        fails (full disk, read-only folder) raises OSError and leaves no temp file.
        Non-finite embeddings are refused (ValueError): they would turn every later run of the prompt black."""
        if embedding.dim() != 2:
            raise ValueError(f"embedding must be [L, dim], got {tuple(embedding.shape)}")
        tensor = embedding.detach().to("cpu").contiguous()
        if not all_finite(tensor):
            raise ValueError("embedding holds NaN or infinite values; not cached")
        self.root.mkdir(parents=True, exist_ok=True)
        path = self.path_for(key)
        with atomic_path(path) as tmp:
            try:
                save_file({_TENSOR: tensor}, str(tmp), metadata={"key": key.canonical(),
                                                                  "sha256": tensor_sha256(tensor)})
            except SafetensorError as e:  # a full disk surfaces as safetensors' own error, not an OSError
                raise OSError(f"cannot write {path.name}: {e}") from None
        return path


def all_finite(t: torch.Tensor) -> bool:
    """No NaN or inf in a CPU tensor. Through numpy, several times faster than torch.isfinite on the CPU for a
    [512, 4096] entry; bfloat16 (which numpy lacks) by its exponent bits: all ones means NaN or inf."""
    t = t.detach().contiguous()
    if t.dtype == torch.bfloat16:
        bits = t.view(torch.int16).numpy()
        return not bool(((bits & 0x7F80) == 0x7F80).any())
    return bool(np.isfinite(t.numpy()).all())


def tensor_sha256(t: torch.Tensor) -> str:
    """sha256 of a tensor's raw bytes (any dtype, bfloat16 included)."""
    flat = t.detach().contiguous().view(-1)
    return hashlib.sha256(flat.view(torch.uint8).numpy().tobytes() if flat.numel() else b"").hexdigest()
