"""A prompt's embedding as a door asks for it, outside a world's start-up (ComfyUI's text node; the CLI's is
world/text_stage.py): umT5 runs in a child process (text_encoder/encode.py) that exits after encoding, and its
embeddings are cached on disk by the encoder's and tokenizer's identity and the text (text_encoder/cache.py).

Here: the encode, whether every text is cached already (then no child and no device memory are needed), the device
memory the child takes, the model's default negative prompt and the length of its embeddings.
"""
from __future__ import annotations

from pathlib import Path
from typing import Optional, Sequence

from ..loaders.t5_tokenizer import MAX_LENGTH as TEXT_LENGTH
from ..text_encoder.child_process import TextEncoderStopped, stop_all_text_encoders
from ..text_encoder.encode import encode_prompts, estimate_child_vram_bytes
from ..wan.text.prompts import DEFAULT_NEGATIVE_PROMPT

__all__ = ["DEFAULT_NEGATIVE_PROMPT", "EMBEDDING_DTYPE", "TEXT_LENGTH", "TextEncoderStopped", "all_cached",
           "encode_prompts", "estimate_child_vram_bytes", "stop_all_text_encoders"]

EMBEDDING_DTYPE = "bfloat16"  # what the encoder's child computes and the cache keeps


def all_cached(encoder: Path, tokenizer: Optional[Path], texts: Sequence[str], cache_dir: Path,
               dtype: str = EMBEDDING_DTYPE) -> bool:
    """Whether `encode_prompts` would serve every text from the cache; an unreadable encoder or tokenizer is not
    cached."""
    from ..loaders.t5_tokenizer import resolve_tokenizer_source
    from ..text_encoder.cache import CacheKey, EmbeddingCache, file_identity

    try:
        tok = resolve_tokenizer_source(tokenizer, encoder)
        ids = file_identity(encoder), tok.identity()
    except (OSError, ValueError):
        return False
    cache = EmbeddingCache(cache_dir)
    return all(cache.path_for(CacheKey(*ids, text, dtype, TEXT_LENGTH)).is_file() for text in texts)
