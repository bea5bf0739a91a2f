"""Where a loaded expert sits inside the object ComfyUI's ModelPatcher wraps. No ComfyUI imports.

The DiT is attached while ComfyUI has the expert loaded and detached when it unloads it; it is kept out of the
module tree (ComfyUI never moves or casts it, the patcher places it). A meta-device skeleton of the same config
answers for names and shapes while nothing is loaded (LoRA key maps, ComfyUI's `add_patches`).
"""
from __future__ import annotations

from typing import Optional

import torch
import torch.nn as nn

from ...wan.dit.model import DiTConfig, WanDiT

DIFFUSION_PREFIX = "diffusion_model."


class DiTSlot(nn.Module):
    def __init__(self, cfg: DiTConfig, dtype: torch.dtype):
        super().__init__()
        self.cfg = cfg
        self.dtype = dtype  # compute dtype of the expert (bf16 on GPUs, float32 on the CPU)
        self.__dict__["skeleton"] = WanDiT(cfg, device="meta")
        self.__dict__["dit"] = None

    @property
    def patch_embedding(self) -> nn.Module:
        return (self.dit or self.skeleton).patch_embedding

    def attach(self, dit: WanDiT) -> None:
        self.__dict__["dit"] = dit

    def detach(self) -> Optional[WanDiT]:
        dit, self.__dict__["dit"] = self.dit, None
        return dit

    def keys_state_dict(self, prefix: str = DIFFUSION_PREFIX) -> dict:
        """The expert's tensors as meta tensors of their float shapes, named like ComfyUI names a diffusion model."""
        return {prefix + k: v for k, v in self.skeleton.state_dict().items()}
