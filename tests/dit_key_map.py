"""Released (Wan `WanModel`) DiT key names -> diffusers `WanTransformer3DModel` key names.

Only used by the parity test. The LingBot camera keys have no diffusers counterpart; `to_diffusers_key`
returns None for them. Note the swapped LayerNorm names: the released `norm3` (affine, before
cross-attention) is diffusers' `norm2`; the released non-affine `norm1`/`norm2` have no keys.
"""
from __future__ import annotations

import re
from typing import Mapping, Optional

import torch

# (released regex, diffusers template); the first match wins.
_RULES: tuple[tuple[str, str], ...] = (
    (r"patch_embedding\.(weight|bias)", r"patch_embedding.\1"),
    (r"text_embedding\.0\.(weight|bias)", r"condition_embedder.text_embedder.linear_1.\1"),
    (r"text_embedding\.2\.(weight|bias)", r"condition_embedder.text_embedder.linear_2.\1"),
    (r"time_embedding\.0\.(weight|bias)", r"condition_embedder.time_embedder.linear_1.\1"),
    (r"time_embedding\.2\.(weight|bias)", r"condition_embedder.time_embedder.linear_2.\1"),
    (r"time_projection\.1\.(weight|bias)", r"condition_embedder.time_proj.\1"),
    (r"blocks\.(\d+)\.modulation", r"blocks.\1.scale_shift_table"),
    (r"blocks\.(\d+)\.self_attn\.([qkv])\.(weight|bias)", r"blocks.\1.attn1.to_\2.\3"),
    (r"blocks\.(\d+)\.self_attn\.o\.(weight|bias)", r"blocks.\1.attn1.to_out.0.\2"),
    (r"blocks\.(\d+)\.self_attn\.(norm_[qk])\.weight", r"blocks.\1.attn1.\2.weight"),
    (r"blocks\.(\d+)\.cross_attn\.([qkv])\.(weight|bias)", r"blocks.\1.attn2.to_\2.\3"),
    (r"blocks\.(\d+)\.cross_attn\.o\.(weight|bias)", r"blocks.\1.attn2.to_out.0.\2"),
    (r"blocks\.(\d+)\.cross_attn\.(norm_[qk])\.weight", r"blocks.\1.attn2.\2.weight"),
    (r"blocks\.(\d+)\.norm3\.(weight|bias)", r"blocks.\1.norm2.\2"),
    (r"blocks\.(\d+)\.ffn\.0\.(weight|bias)", r"blocks.\1.ffn.net.0.proj.\2"),
    (r"blocks\.(\d+)\.ffn\.2\.(weight|bias)", r"blocks.\1.ffn.net.2.\2"),
    (r"head\.head\.(weight|bias)", r"proj_out.\1"),
    (r"head\.modulation", r"scale_shift_table"),
)
_CAMERA = re.compile(r"(patch_embedding_wancamctrl|c2ws_hidden_states_layer[12]|blocks\.\d+\.cam_\w+)\.(weight|bias)")


def to_diffusers_key(key: str) -> Optional[str]:
    """Diffusers name of a released key; None for LingBot camera keys; KeyError for anything unknown."""
    if _CAMERA.fullmatch(key):
        return None
    for pattern, template in _RULES:
        if re.fullmatch(pattern, key):
            return re.sub(pattern, template, key)
    raise KeyError(f"no diffusers name for released DiT key {key!r}")


def to_diffusers_state_dict(sd: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Rename a released-style state dict for diffusers, dropping the camera weights."""
    out: dict[str, torch.Tensor] = {}
    for key, value in sd.items():
        new = to_diffusers_key(key)
        if new is None:
            continue
        if new in out:
            raise KeyError(f"two released keys map to diffusers key {new!r}")
        out[new] = value
    return out
