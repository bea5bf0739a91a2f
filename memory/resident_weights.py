"""Resident GEMM weights: every block's NF4 linears keep the weight their GEMMs multiply (dequantized, or FP8 / INT8
rows) on the device for good, instead of preparing it from the NF4 codes at every call (NF4Linear.keep_weight).

The memory plan (memory/fast_planner.py) decides it, all blocks or none, when the card has room for them after
everything else; the World session carries it out before a part runs (`apply_resident_weights`). The same bits:
the kept tensor is the one a call would prepare. Costs the prepared bytes (bf16: 2 per weight, FP8 / INT8: 1 plus a
float32 scale per row) beside the NF4 codes; saves the preparation per call (on an H200 0.017 s of a rolled 0.87 s
`auto` chunk of the v2 1.3B), and a captured CUDA graph then reads the weights with no dequantization kernels.

Kept: the linears every call runs over the video tokens (q, k, v, o, the cross-attention's q and o, the FFN). Not the
cross-attention's k / v (their GEMMs take the 512 text rows once per prompt while the cache keeps the text K/V), nor
the camera layers: the plan keeps the weights only where every block's camera FiLM fits before them, so those run
once per chunk. Never for a block whose weights block swap moves between host and device (`model.streamed_blocks`).
"""
from __future__ import annotations

import logging
from typing import Optional

import torch.nn as nn

from ..quant.nf4_format import BLOCK_NF4_LINEARS, prepared_weight_bytes
from ..wan.dit.blocks import WanBlock
from ..wan.dit.model import DiTConfig

log = logging.getLogger(__name__)

TEXT_LINEARS = ("cross_attn.k", "cross_attn.v")
CAMERA_LINEARS = ("cam_injector_layer1", "cam_injector_layer2", "cam_scale_layer", "cam_shift_layer")
RESIDENT_LINEARS = tuple(n for n in BLOCK_NF4_LINEARS if n not in TEXT_LINEARS + CAMERA_LINEARS)


def resident_weight_bytes(cfg: DiTConfig, compute: str = "bf16", compute_bytes: int = 2) -> int:
    """Device bytes of every block's kept weights for GEMMs in `compute` ("bf16", "fp8", "int8", "fp16acc") with a
    compute dtype of `compute_bytes` (the planner's arithmetic; `apply_resident_weights` returns what was kept)."""
    block = WanBlock(cfg.dim, cfg.ffn_dim, cfg.num_heads, cfg.eps, device="meta")
    per_block = 0
    for name in RESIDENT_LINEARS:
        lin = block.get_submodule(name)
        per_block += prepared_weight_bytes(lin.out_features, lin.in_features, compute, compute_bytes)
    return per_block * cfg.num_layers


def _linears(block: nn.Module):
    for name in RESIDENT_LINEARS:
        lin = block.get_submodule(name)
        if hasattr(lin, "keep_weight"):
            yield lin


def apply_resident_weights(model: nn.Module, plan) -> int:
    """Keep (or drop) the blocks' prepared weights as `plan` (a FastMemoryPlan) says; returns the bytes kept. Cheap
    when they are kept already (each linear checks its copy is still its weight's), so a session calls it before
    every part: a weight changed since (a LoRA put on, a reload) is prepared again."""
    keep = bool(getattr(plan, "resident_weights", False))
    streamed = set(getattr(model, "streamed_blocks", ()))
    blocks = getattr(model, "blocks", ())
    kept_before = kept_bytes(model)
    total = 0
    for i, block in enumerate(blocks):
        for lin in _linears(block):
            if keep and i not in streamed:
                total += lin.keep_weight()
            else:
                lin.drop_kept_weight()
    if total and total != kept_before:
        log.info("memory plan: the blocks' prepared GEMM weights kept on the device (%.1f GB): no NF4 "
                 "dequantization per call", total / 1e9)
    return total


def drop_resident_weights(model: Optional[nn.Module], blocks=None) -> None:
    """Drop the kept weights of `blocks` (indices; None: everywhere in the model)."""
    if model is None:
        return
    if blocks is None:
        modules = model.modules()
    else:
        modules = (m for i in blocks for m in model.blocks[i].modules())
    for m in modules:
        drop = getattr(m, "drop_kept_weight", None)
        if drop is not None:
            drop()


def kept_bytes(model: nn.Module) -> int:
    """Device bytes of the prepared weights the model keeps now."""
    return sum(t.numel() * t.element_size() for m in model.modules() if hasattr(m, "kept_tensors")
               for t in m.kept_tensors())
