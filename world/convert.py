"""Stored copies of a model's DiT: NF4 (`convert-expert`), FP8 and INT8 (`convert-fp8`, `convert-int8`), made once
and read by every later load.

The source is told from its weights (world/detect.py); a config-less release (the v2 1.3B) is marked as the kind
of model it is, so that the copy's config.json says so. Every copy records the model's registry name and its
licence (the v2 weights are CC BY-NC-SA 4.0: a copy is adapted material and keeps that licence).
"""
from __future__ import annotations

from pathlib import Path
from typing import Callable, Optional, Union

from ..loaders.expert_format import assume_model_kind, detect_format
from .detect import identify, model_tags

WEIGHTS = ("nf4", "fp8", "int8")


def convert(src: Union[str, Path], out: Union[str, Path], weights: str, *, model: Optional[str] = None,
            device=None, progress: Optional[Callable[[int, int], None]] = None) -> dict:
    """Write the `weights` copy of the DiT at `src` to the new folder `out`; returns the converter's statistics with
    the model's name and licence (and a note when the files could not say which model they are: `model` decides)."""
    if weights not in WEIGHTS:
        raise ValueError(f"weights {weights!r}: choose one of {', '.join(WEIGHTS)}")
    fmt = detect_format(src)
    entry, note = identify(fmt, model)
    fmt = assume_model_kind(fmt, "fast" if entry.causal else "base")
    tags = model_tags(entry)
    if weights == "nf4":
        from ..loaders.nf4_writer import convert_official_to_nf4

        stats = convert_official_to_nf4(fmt, out, device=device, progress=progress, tags=tags)
    else:
        from ..loaders.lowp_writer import convert_to_lowp

        stats = convert_to_lowp(fmt, out, weights, device=device, progress=progress, tags=tags)
    stats = {**stats, "model": entry.name, "licence": entry.licence.line()}
    if note:
        stats["model_note"] = note
    return stats
