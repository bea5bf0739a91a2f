"""Putting read LoRA files on a loaded model (the base experts and the Fast model alike)."""
from __future__ import annotations

import logging
from typing import Optional, Sequence

import torch
import torch.nn as nn

from ..quant.lora import AppliedLora, apply_lora
from ..quant.nf4_format import nf4_linear_names
from .lora_files import LoraSet, lora_hooks

log = logging.getLogger(__name__)


def put_loras(model: nn.Module, loras: Sequence[tuple[LoraSet, float]], *, dtype: Optional[torch.dtype] = None,
              device=None, name: str = "the model") -> Optional[AppliedLora]:
    """Low-rank terms next to the model's NF4 linears and patches of its plain tensors; None without LoRAs."""
    if not loras:
        return None
    hooks, plain = lora_hooks(loras, nf4_linear_names(model.cfg.num_layers))
    applied = apply_lora(model, hooks, plain, dtype=dtype, device=device)
    log.info("%d LoRA(s) on %s: %d linears, %d other tensors", len(loras), name, len(applied.hooked), len(plain))
    return applied
