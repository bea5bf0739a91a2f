"""A LoRA file on a LingBot patcher (an expert's MODEL or the Fast model): read and matched once, attached as
ComfyUI patches that the patcher hangs on the NF4 linears when the model loads."""
from __future__ import annotations

import logging

from ...loaders.lora_files import LoraFileError, dit_weight_shapes, load_lora
from . import comfy_paths

log = logging.getLogger(__name__)

_lora_cache: dict = {}


def read_lora(lora_name: str, cfg):
    """The LoRA file `lora_name` (models/loras) parsed against the model's shapes; one file cached at a time, like
    ComfyUI's LoraLoader. A LoRA for another model raises one line naming the first key and both shapes."""
    path = comfy_paths.resolve_lora(lora_name)
    key = (str(path), path.stat().st_mtime_ns, cfg)
    lora = _lora_cache.get(key)
    if lora is None:
        try:
            lora = load_lora(path, dit_weight_shapes(cfg))
        except LoraFileError as e:
            raise ValueError(str(e)) from None
        _lora_cache.clear()
        _lora_cache[key] = lora
    log.info("LingBot-World LoRA: %s", lora.report())
    return lora


def patcher_with_lora(patcher, lora_name: str, strength: float):
    """A clone of `patcher` with the LoRA's patches at `strength` (the LoRA object too, for its report)."""
    from .lora_patches import patches_from_lora

    lora = read_lora(lora_name, patcher.weights.fmt.config)
    out = patcher.clone()
    added = out.add_patches(patches_from_lora(lora), float(strength))
    if len(added) != len(lora.weights):  # every parsed weight names a key of the model
        raise RuntimeError(f"{lora_name}: {len(lora.weights) - len(added)} LoRA weights found no model key")
    return out, lora
