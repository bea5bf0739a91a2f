"""Which registry model a DiT on disk is, told from what its files hold (never from a folder name).

In order:
1. a name our writers recorded (`convert-expert`, `convert-fp8` / `convert-int8` and the demos write
   `lingbot_model` into the safetensors metadata and config.json);
2. the shapes: the v2 1.3B is the only model 1536 wide; a 5120-wide model is a base expert (config class WanModel,
   Cam or Act by its control width) or a causal one (WanModelFast);
3. v1 Fast and the v2 14B have the same tensors: the layout tells them apart (v1 ships
   `diffusion_pytorch_model-*.safetensors`, v2 `model-*.safetensors` with `model.safetensors.index.json`), then the
   config's window (v2's config keeps `local_attn_size` 18); where one file cannot say, the name the user gave
   (`--model`) decides, and otherwise v1 Fast is assumed with a note saying how to choose.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

# An expert's headers read and checked (a door checks a file a user picked with these, before anything loads).
from ..loaders.expert_format import (ExpertFormat, ExpertLoadError, check_control_pair, check_model_kind, detect_format,
                                     model_kind)
from . import models as registry
from .models import ModelEntry

__all__ = ["ExpertFormat", "ExpertLoadError", "LICENCE_TAG", "MODEL_TAG", "V2_INDEX", "check_control_pair",
           "check_model_kind", "describe_folder", "detect_format", "identify", "model_tags", "recorded_model"]

MODEL_TAG = "lingbot_model"  # our writers' record of the model's registry name
LICENCE_TAG = "lingbot_licence"
V2_INDEX = "model.safetensors.index.json"


def model_tags(entry: ModelEntry) -> dict:
    """What a writer records in a copy of `entry`'s weights: its name and its licence."""
    return {MODEL_TAG: entry.name, LICENCE_TAG: entry.licence.line()}


def recorded_model(fmt: ExpertFormat) -> Optional[str]:
    """The registry name our writers recorded in these files, if any."""
    for header in fmt.headers.values():
        name = header.metadata.get(MODEL_TAG)
        if name:
            return name
    folder = fmt.path if fmt.path.is_dir() else fmt.path.parent
    cfg = folder / "config.json"
    if cfg.is_file():
        try:
            raw = json.loads(cfg.read_text())
        except (OSError, ValueError):
            return None
        if isinstance(raw, dict) and isinstance(raw.get(MODEL_TAG), str):
            return raw[MODEL_TAG]
    return None


def _same_shape(a, b) -> bool:
    keys = ("dim", "ffn_dim", "num_heads", "num_layers", "in_dim", "out_dim", "text_dim", "control_in")
    return all(getattr(a, k) == getattr(b, k) for k in keys)


def _v2_layout(fmt: ExpertFormat) -> Optional[bool]:
    """True for upstream v2's shard naming, False for v1's diffusers naming, None when the files do not say (one
    file of ours, a single file)."""
    names = [p.name for p in fmt.files]
    folder = fmt.path if fmt.path.is_dir() else fmt.path.parent
    if (folder / V2_INDEX).is_file() or any(n.startswith("model-") for n in names):
        return True
    if any(n.startswith("diffusion_pytorch_model") for n in names):
        return False
    return None


def _config_window(fmt: ExpertFormat) -> Optional[int]:
    return fmt.config.local_attn_size if fmt.config_source != "inferred from shapes" else None


def identify(fmt: ExpertFormat, wanted: Optional[str] = None) -> tuple[ModelEntry, Optional[str]]:
    """(the registry entry of the DiT `fmt` describes, a note when it had to be assumed). `wanted`: a registry name
    or alias the user gave; refused in one line when the files are another model."""
    want = registry.model(wanted) if wanted else None
    tag = recorded_model(fmt)
    if tag is not None:
        try:
            found = registry.model(tag)
        except KeyError:
            raise ExpertLoadError(f"{fmt.path} says it holds the model {tag!r}, which this version does not know; "
                                  "update the pack") from None
        _check_wanted(fmt, found, want)
        return found, None
    kind = model_kind(fmt)  # "fast" / "base" from the config, None when inferred from shapes
    causal = None if kind is None else kind == "fast"
    if not fmt.config.causal and fmt.config_source != "inferred from shapes":
        causal = False
    candidates = [e for e in registry.entries() if _same_shape(e.dit, fmt.config)
                  and (causal is None or e.causal == causal) and e.control == fmt.config.control_kind]
    if not candidates:  # a size no release has (a tiny test model): what the user asked for, or by kind and window
        if want is not None:
            return want, None
        pool = [e for e in registry.entries() if e.control == fmt.config.control_kind
                and (e.causal if causal is None else e.causal == causal)]
        v2 = _v2_layout(fmt)  # the release's file names, as for the real sizes: they rule out the other generation
        if v2 is not None:
            pool = [e for e in pool if e.generation != ("v1" if v2 else "v2")] or pool
        if v2 and not (Path(fmt.path) / "config.json").is_file() and fmt.path.is_dir():
            pool = [e for e in pool if not e.files.has_config] or pool  # the v2 1.3B ships no config.json
        window = _config_window(fmt)
        return next((e for e in pool if window and e.window == window), pool[0]), None
    if len(candidates) > 1:
        v2 = _v2_layout(fmt)
        window = _config_window(fmt)
        by_layout = [e for e in candidates if v2 is None or (e.generation == "v2") == v2]
        if v2 is None and window is not None and window > 0:
            by_layout = [e for e in candidates if e.window == window] or by_layout
        candidates = by_layout or candidates
    if want is not None and want in candidates:
        return want, None
    if want is not None:
        _check_wanted(fmt, candidates[0], want)
    note = None
    if len(candidates) > 1:
        others = ", ".join(f"--model {e.name}" for e in candidates[1:])
        note = (f"{fmt.path}: these weights could be {' or '.join(e.title for e in candidates)} (the same tensors); "
                f"using {candidates[0].title}. If it is the other, say so: {others}")
    return candidates[0], note


def _check_wanted(fmt: ExpertFormat, found: ModelEntry, want: Optional[ModelEntry]) -> None:
    if want is None or want == found:
        return
    if want.causal != found.causal:
        return  # the kind check (check_model_kind) names the fix for a base expert given as a causal model
    raise ExpertLoadError(f"{fmt.path} holds {found.title}, not {want.title}: run it with --model {found.name} "
                          f"(or pick the {want.title} files)")


def describe_folder(root: Path) -> str:
    """What a folder seems to hold, for a message (the DiT folders of every registry model found in it)."""
    found = []
    for e in registry.entries():
        for d in e.files.dit_dirs:
            if d and (root / d).is_dir() and f"{d}/" not in found:
                found.append(f"{d}/")
    return ", ".join(found) or "no model folder"
