"""An expert's DiTConfig, and the errors reading an expert raises (expert_format.py decides the kind on disk).

The config comes from config.json, else a JSON "config" entry in the safetensors `__metadata__`, else it is
inferred from tensor shapes (heads = dim / 128 as in Wan2.2 A14B). The control width (Cam 1536 / Act 1792, the
input of `patch_embedding_wancamctrl`) is always read from the weights: the release's config.json is the same
for Cam and Act, and a path name says nothing reliable (fast-act spec §1). `describe_foreign` names what a key set
that is no LingBot-World expert looks like, for the error messages.
"""
from __future__ import annotations

import json
import math
import re
from dataclasses import replace
from pathlib import Path
from typing import Mapping, Optional, Sequence

from ..wan.dit.model import DiTConfig
from .safetensors_stream import SafetensorsHeader


HEAD_DIM = 128  # every release: 14B 5120 / 40 heads, v2 1.3B 1536 / 12


class ExpertLoadError(ValueError):
    """The path exists but does not hold a usable LingBot-World expert (wrong model, bad file...)."""


class ExpertNotFoundError(FileNotFoundError):
    """The expert folder or one of its files is missing."""


def describe_foreign(keys: Sequence[str]) -> str:
    """A guess at what model a key set belongs to, for error messages."""
    ks = set(keys)
    sample = ", ".join(sorted(ks)[:3])
    if any(k.startswith(("encoder.", "decoder.")) for k in ks) and any("conv" in k for k in ks):
        what = "a video VAE (e.g. Wan2.1_VAE), not a DiT expert"
    elif "token_embedding.weight" in ks or "shared.weight" in ks or any(k.startswith("encoder.block.") for k in ks):
        what = "a T5 text encoder, not a DiT expert"
    elif "patch_embedding.weight" in ks and not any(k.startswith("patch_embedding_wancamctrl.") for k in ks):
        what = "a Wan2.x DiT without LingBot's camera layers (plain Wan2.2?), not a LingBot-World expert"
    else:
        what = "not a LingBot-World DiT expert"
    return f"its keys ({sample}, ...) look like {what}"


# ---- config ----------------------------------------------------------------------------------------------
CONTROL_PREFIX = "patch_embedding_wancamctrl"


def _linear_in(shapes: Mapping[str, Sequence[int]], prefix: str, need) -> int:
    """Input width of a Linear from its weight shape; packed NF4 weights are [out*in/2, 1], so in = 2*rows/out."""
    w, b = need(prefix + ".weight"), need(prefix + ".bias")
    if len(w) == 2 and w[1] != 1:
        return w[1]
    return 2 * w[0] // b[0]


def control_width(shapes: Mapping[str, Sequence[int]], source: str) -> int:
    """Input width of `patch_embedding_wancamctrl` in the weights: 1536 (Cam, Fast) or 1792 (Act)."""

    def need(k: str) -> tuple[int, ...]:
        if k not in shapes:
            raise ExpertLoadError(f"{source}: key {k!r} is missing; {describe_foreign(list(shapes))}")
        return tuple(shapes[k])

    return _linear_in(shapes, CONTROL_PREFIX, need)


def _with_weights_control(cfg: DiTConfig, shapes: Mapping[str, Sequence[int]], source: str) -> DiTConfig:
    """The config with the control width the weights have (config.json does not say Cam or Act)."""
    width = control_width(shapes, source)
    if width == cfg.control_in:
        return cfg
    try:
        out = replace(cfg, control_in=width)
        out.validate()
    except ValueError as e:
        raise ExpertLoadError(
            f"{source}: patch_embedding_wancamctrl takes {width} inputs, which is neither a Cam/Fast (1536) nor "
            f"an Act (1792) LingBot-World expert ({e})"
        ) from None
    return out


def _config_from_json_file(p: Path) -> DiTConfig:
    try:
        raw = json.loads(p.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ExpertLoadError(f"{p}: cannot read config ({e}); restore config.json from the release") from None
    if not isinstance(raw, dict):
        raise ExpertLoadError(f"{p}: config is not a JSON object")
    try:
        return DiTConfig.from_json(raw)
    except (TypeError, ValueError) as e:
        raise ExpertLoadError(f"{p}: not a LingBot-World DiT config ({e})") from None


def infer_config(shapes: Mapping[str, Sequence[int]], source: str) -> DiTConfig:
    """DiTConfig from tensor shapes (NF4 packed weights included: in = 2 * rows / out, out from the bias)."""

    def need(k: str) -> tuple[int, ...]:
        if k not in shapes:
            raise ExpertLoadError(f"{source}: cannot infer the config, key {k!r} is missing; {describe_foreign(list(shapes))}")
        return tuple(shapes[k])

    def linear_in(prefix: str) -> int:
        return _linear_in(shapes, prefix, need)

    pe = need("patch_embedding.weight")
    if len(pe) != 5:
        raise ExpertLoadError(f"{source}: patch_embedding.weight has shape {pe}, expected a Conv3d [dim, in, 1, 2, 2]")
    dim, in_dim, patch = pe[0], pe[1], tuple(pe[2:])
    blocks = sorted({int(m.group(1)) for k in shapes for m in [re.match(r"blocks\.(\d+)\.", k)] if m})
    if not blocks or blocks != list(range(len(blocks))):
        raise ExpertLoadError(f"{source}: block indices {blocks[:5]}... are not 0..N-1")
    if dim % HEAD_DIM:
        raise ExpertLoadError(f"{source}: dim {dim} is not a multiple of {HEAD_DIM}; put the expert's config.json beside it")
    head_out = need("head.head.bias")[0]
    cfg = dict(
        dim=dim,
        in_dim=in_dim,
        patch_size=list(patch),
        num_layers=len(blocks),
        ffn_dim=need("blocks.0.ffn.0.bias")[0],
        freq_dim=linear_in("time_embedding.0"),
        text_dim=linear_in("text_embedding.0"),
        out_dim=head_out // math.prod(patch),
        num_heads=dim // HEAD_DIM,
        control_in=linear_in(CONTROL_PREFIX),
    )
    try:
        return DiTConfig.from_json(cfg)
    except (TypeError, ValueError) as e:
        raise ExpertLoadError(f"{source}: inferred config {cfg} is invalid ({e}); put a config.json beside it") from None


def _config_from_metadata(header: SafetensorsHeader) -> Optional[DiTConfig]:
    raw = header.metadata.get("config")
    if raw is None:
        return None
    try:
        return DiTConfig.from_json(json.loads(raw))
    except (json.JSONDecodeError, TypeError, ValueError) as e:
        raise ExpertLoadError(f"{header.path}: the 'config' entry of __metadata__ is not a valid DiT config ({e})") from None


def _resolve_config(folder_cfg: Optional[Path], header: Optional[SafetensorsHeader], shapes, source: str):
    if folder_cfg is not None and folder_cfg.is_file():
        return _with_weights_control(_config_from_json_file(folder_cfg), shapes, source), "config.json"
    if header is not None:
        cfg = _config_from_metadata(header)
        if cfg is not None:
            return _with_weights_control(cfg, shapes, source), "safetensors metadata"
    return infer_config(shapes, source), "inferred from shapes"
