"""Prompt embeddings from umT5-XXL, computed in a short-lived child process and cached on disk.

The 11 GB encoder never enters the caller's process (ComfyUI or the CLI): `worker.py` is started in a child
process (child_process.py: the run, its errors, stopping live children), which loads the encoder on CUDA when it
fits (else the CPU), encodes, writes safetensors into a private temp dir and exits, returning all of its memory. A
repeated prompt is served from the cache without starting the child. Here: the cached entry point
(`encode_prompts`, `all_prompts_cached`) and what the child will take (`estimate_child_vram_bytes` /
`estimate_child_ram_bytes`).
"""
from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Callable, Optional, Sequence, Union

import torch

from .cache import CacheKey, EmbeddingCache, all_finite, file_identity
from .child_process import Progress, TextEncoderError, _check_choices, run_text_encoder
from ..loaders.t5_tokenizer import MAX_LENGTH, TokenizerSource, resolve_tokenizer_source

log = logging.getLogger(__name__)


# ---- public entry point -----------------------------------------------------------------------------

def estimate_child_vram_bytes(encoder_path: Union[str, os.PathLike], dtype: str = "bfloat16") -> int:
    """VRAM the child takes when it runs on CUDA: weights in `dtype` (token table stays on the CPU) plus
    the worker's margin. Reads only the file's header / pickle index."""
    from ..loaders.t5_files import inspect_t5_file
    from .worker import CUDA_MARGIN_BYTES

    _check_choices("auto", dtype)
    return inspect_t5_file(encoder_path).device_bytes(getattr(torch, dtype)) + CUDA_MARGIN_BYTES



# The child's resident RAM while it encodes on CUDA (bench_t5 on the H100: 1.22 GB peak RSS; the 2 GB token table
# is memory-mapped), with room to spare.
CHILD_CUDA_RAM_BYTES = 2 * 1024**3


def estimate_child_ram_bytes(encoder_path: Union[str, os.PathLike], device: str) -> int:
    """Host RAM the child takes while it runs on `device` ("cuda[:N]" or "cpu"): on the CPU the whole encoder in
    bf16 (10.1 GB peak RSS for the release file), on CUDA the measured resident set."""
    if device.startswith("cuda"):
        return CHILD_CUDA_RAM_BYTES
    from ..loaders.t5_files import inspect_t5_file

    return inspect_t5_file(encoder_path).device_bytes(torch.bfloat16, embedding_on_device=True) + CHILD_CUDA_RAM_BYTES


def _cache_keys(enc: Path, tok: TokenizerSource, prompts: Sequence[str], dtype: str, max_length: int) -> list:
    enc_id, tok_id = file_identity(enc), tok.identity()
    return [CacheKey(enc_id, tok_id, text, dtype, max_length) for text in prompts]


def all_prompts_cached(
    encoder_path: Union[str, os.PathLike],
    tokenizer_source: Union[str, os.PathLike, TokenizerSource, None],
    prompts: Sequence[str],
    dtype: str = "bfloat16",
    cache_dir: Union[str, os.PathLike, None] = None,
    max_length: int = MAX_LENGTH,
) -> bool:
    """Would `encode_prompts` serve every prompt from the cache (no child, no VRAM)? Stat calls only;
    False when the files cannot be found."""
    try:
        enc = Path(encoder_path).expanduser().resolve()
        tok = tokenizer_source if isinstance(tokenizer_source, TokenizerSource) else resolve_tokenizer_source(
            tokenizer_source, enc
        )
        keys = _cache_keys(enc, tok, prompts, dtype, max_length)
    except (OSError, ValueError):
        return False
    cache = EmbeddingCache(cache_dir)
    return all(cache.path_for(k).is_file() for k in keys)


def encode_prompts(
    encoder_path: Union[str, os.PathLike],
    tokenizer_source: Union[str, os.PathLike, TokenizerSource, None],
    prompts: Sequence[str],
    device: str = "auto",
    dtype: str = "bfloat16",
    cache_dir: Union[str, os.PathLike, None] = None,
    use_cache: bool = True,
    timeout: Optional[float] = None,
    cancel_check: Optional[Callable[[], bool]] = None,
    max_length: int = MAX_LENGTH,
    stats: Optional[dict] = None,
    progress: Optional[Progress] = None,
) -> list[torch.Tensor]:
    """Embeddings [L_i, dim] (dtype `dtype`, on the CPU) for each prompt, trimmed to its true length.

    tokenizer_source: a tokenizer folder/file, a umt5 safetensors with `spiece_model`, or None to look in
    and beside the encoder file. Cache hits never start the child; misses are encoded in one child run
    (identical texts once). `stats`, if given, receives {"cache_hits", "encoded", "worker": status}.
    `progress` receives the child's stages (see run_text_encoder); it is not called when the cache serves all.
    Raises FileNotFoundError / TokenizerNotFoundError before starting anything when inputs are missing,
    and TextEncoderError subclasses when the child fails.
    """
    _check_choices(device, dtype)
    enc = Path(encoder_path).expanduser().resolve()
    if not enc.is_file():
        raise FileNotFoundError(f"text encoder file {enc} does not exist")
    tok = tokenizer_source if isinstance(tokenizer_source, TokenizerSource) else resolve_tokenizer_source(
        tokenizer_source, enc
    )
    cache = EmbeddingCache(cache_dir) if use_cache else None
    keys = _cache_keys(enc, tok, prompts, dtype, max_length) if cache is not None else []
    results: list[Optional[torch.Tensor]] = [cache.get(k) if cache else None for k in keys] or [None] * len(prompts)

    todo = list(dict.fromkeys(text for text, r in zip(prompts, results) if r is None))
    status = None
    if todo:
        embeddings, status = run_text_encoder(
            enc, tok, todo, device=device, dtype=dtype, max_length=max_length, timeout=timeout,
            cancel_check=cancel_check, progress=progress,
        )
        startup = ", ".join(f"{k[:-2]} {v:.1f} s" for k, v in (status.get("startup") or {}).items())
        log.info("text encoder: %d prompt(s) on %s in %.1f s (load %.1f s; before it: %s)", len(todo),
                 status.get("device"), status.get("total_s", 0.0), status.get("load_s", 0.0), startup or "?")
        for text, e in zip(todo, embeddings):
            if not all_finite(e):
                raise TextEncoderError(
                    f"the text encoder produced NaN or infinite values for the prompt {text[:60]!r}; its weights "
                    f"({enc.name}) may be damaged: download the file again"
                )
        by_text = dict(zip(todo, embeddings))
        for i, text in enumerate(prompts):
            if results[i] is None:
                results[i] = by_text[text]
                if cache is not None:
                    try:
                        cache.put(keys[i], results[i])
                    except OSError as e:  # a full disk or read-only cache folder costs a re-encode later, no more
                        log.warning("text-embedding cache: cannot store the entry in %s (%s)", cache.root, e)
    if stats is not None:
        stats.update({"cache_hits": len(prompts) - sum(1 for t in prompts if t in todo), "encoded": len(todo),
                      "worker": status})
    return results  # type: ignore[return-value]
