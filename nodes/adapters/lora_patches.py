"""ComfyUI's weight patches (ModelPatcher.patches) -> the LoRA hooks of the NF4 DiT (quant/lora.py), and back:
our parsed LoRA files (loaders/lora_files.py) -> ComfyUI patches, so both loaders feed the same patcher.

A patch list of a linear's weight made only of plain LoRAs (up/down/alpha, no DoRA/mid/reshape, no offset or
function) becomes fused low-rank terms added to the NF4 GEMM's output; a linear's bias made only of plain
differences becomes the hook's bias term. Anything else (LoHa, LoKr, DoRA, ...) runs through ComfyUI's own
`comfy.lora.calculate_weight` on the dequantized float32 weight (exact ComfyUI semantics, slower). Plain tensors
(norms, modulation, the patch conv) are patched once with `calculate_weight` at load.
"""
from __future__ import annotations

import logging
from typing import Mapping

import torch
import torch.nn as nn

import comfy.lora
from comfy.weight_adapter import LoRAAdapter

from ...loaders.lora_files import LoraSet
from ...quant.lora import QUANTIZED, LinearLora, LowRank, WeightPatch, lora_scale

log = logging.getLogger(__name__)

PREFIX = "diffusion_model."


def _low_rank(entry, key: str, shape) -> LowRank | None:
    strength, v, strength_model, offset, function = entry
    if offset is not None or function is not None or strength_model != 1.0 or not isinstance(v, LoRAAdapter):
        return None
    up, down, alpha, mid, dora_scale, reshape = v.weights
    if mid is not None or dora_scale is not None or reshape is not None or up.dim() != 2 or down.dim() != 2:
        return None
    if (up.shape[0], down.shape[1]) != tuple(shape) or up.shape[1] != down.shape[0]:
        raise ValueError(f"LoRA for {key}: up {tuple(up.shape)} x down {tuple(down.shape)} does not fit the weight "
                         f"{tuple(shape)}; this LoRA was made for another model")
    return LowRank(up, down, lora_scale(strength, alpha, down.shape[0]))


def _bias_diff(entry, key: str, shape) -> torch.Tensor | None:
    strength, v, strength_model, offset, function = entry
    if offset is not None or function is not None or strength_model != 1.0:
        return None
    if isinstance(v, tuple) and len(v) == 2 and v[0] == "diff" and len(v[1]) == 1:
        diff = v[1][0]
        if tuple(diff.shape) != tuple(shape):
            raise ValueError(f"LoRA for {key}: a bias difference of shape {tuple(diff.shape)} for a bias of "
                             f"{tuple(shape)}; this LoRA was made for another model")
        return strength * diff.float()
    return None


def _comfy_patch(plist: list, key: str) -> WeightPatch:
    def patch(w: torch.Tensor) -> torch.Tensor:
        return comfy.lora.calculate_weight(plist, w, key)
    return patch


def hooks_from_patches(patches: Mapping[str, list], model: nn.Module
                       ) -> tuple[dict[str, LinearLora], dict[str, WeightPatch]]:
    """ModelPatcher.patches ({"diffusion_model.<key>": [(strength, adapter, strength_model, offset, fn), ...]})
    -> (linear hooks, plain-tensor patches) for `quant.lora.apply_lora`."""
    linears = {n: m for n, m in model.named_modules() if isinstance(m, (*QUANTIZED, nn.Linear))}
    terms: dict[str, list[LowRank]] = {}
    weight_patches: dict[str, list[WeightPatch]] = {}
    biases: dict[str, torch.Tensor] = {}
    plain: dict[str, WeightPatch] = {}
    for key, plist in patches.items():
        if not key.startswith(PREFIX):
            log.warning("LingBot-World: ignoring a weight patch for %s (not a diffusion-model key)", key)
            continue
        name = key[len(PREFIX):]
        module, _, pname = name.rpartition(".")
        lin = linears.get(module)
        if lin is not None and pname == "weight":
            simple = [_low_rank(e, key, (lin.out_features, lin.in_features)) for e in plist]
            if all(s is not None for s in simple):
                terms.setdefault(module, []).extend(simple)
            else:
                weight_patches.setdefault(module, []).append(_comfy_patch(plist, key))
        elif lin is not None and pname == "bias" and lin.bias is not None:
            diffs = [_bias_diff(e, key, tuple(lin.bias.shape)) for e in plist]
            if all(d is not None for d in diffs):
                biases[module] = sum(diffs)
            else:
                plain[name] = _comfy_patch(plist, key)
        else:
            plain[name] = _comfy_patch(plist, key)
    hooks = {m: LinearLora(terms.get(m, ()), weight_patches.get(m, ()), biases.get(m))
             for m in set(terms) | set(weight_patches) | set(biases)}
    return hooks, plain


def patches_from_lora(lora: LoraSet) -> dict:
    """A parsed LoRA file as ComfyUI patches (what `comfy.lora.load_lora` would give for these keys)."""
    out = {}
    for target, w in lora.weights.items():
        key = PREFIX + target
        if w.low_rank:
            out[key] = LoRAAdapter({w.file_key}, (w.up, w.down, w.alpha, None, None, None))
        else:
            out[key] = ("diff", (w.diff,))
    return out
