"""On-disk cache of prompt embeddings, so a repeated prompt never starts the 11 GB text encoder again.

An entry is one safetensors file holding `embedding` [L, dim] and, in its metadata, the full key it was
written for. The key covers the encoder file's identity (absolute path, size, mtime_ns), the tokenizer's
identity, the text and its length, the dtype and max length. Writes are atomic (temp file + os.replace);
an entry that fails to load or whose metadata does not match is deleted and reported as a miss.
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Union

import torch
from safetensors import safe_open
from safetensors.torch import save_file

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
        """The cached embedding, or None (missing, unreadable or mismatched entries are removed)."""
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
            return tensor.clone()  # own memory: the entry may be replaced or deleted later
        except Exception as e:
            log.warning("dropping corrupt text-embedding cache entry %s: %s", path, e)
            try:
                path.unlink()
            except OSError:
                pass
            return None

    def put(self, key: CacheKey, embedding: torch.Tensor) -> Path:
        """Store atomically; returns the entry's path."""
        if embedding.dim() != 2:
            raise ValueError(f"embedding must be [L, dim], got {tuple(embedding.shape)}")
        self.root.mkdir(parents=True, exist_ok=True)
        path = self.path_for(key)
        fd, tmp = tempfile.mkstemp(prefix=path.stem[:16] + ".", suffix=".tmp", dir=self.root)
        os.close(fd)
        try:
            save_file({_TENSOR: embedding.detach().to("cpu").contiguous()}, tmp, metadata={"key": key.canonical()})
            os.replace(tmp, path)
        except BaseException:
            try:
                os.unlink(tmp)
            except OSError:
                pass
            raise
        return path
