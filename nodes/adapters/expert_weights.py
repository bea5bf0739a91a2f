"""Where one expert's weights come from when ComfyUI loads it, and where they go when it unloads it.

Load = stream the file straight to the device (`load_expert`: no host copy of the 9.6 GB expert), or take
the copy parked in pinned host RAM if the plan keeps one. With block swap, the non-block weights and the first
N blocks are streamed to the device and the other blocks to host memory; `loaders.block_swap.BlockSwapper`
pins those and streams them to the device during each forward. Unload = drop the weights (the next load streams them
again) or park them in pinned RAM. No ComfyUI imports: the ModelPatcher in `patchers.py` calls this.
"""
from __future__ import annotations

import gc
import logging
from typing import Callable, Optional

import torch

from ...loaders.expert_loader import load_expert
from ...memory.block_swap import BlockSwapper, streamed_block_keys
from ...memory.pinned import park_on_host, unpark
from ...memory.estimates import expert_sizes
from ...quant.nf4 import default_compute_dtype
from ...wan.dit.model import WanDiT
from ...world.detect import ExpertFormat
from ...world.settings import LOWP_WEIGHTS
from . import host_memory

log = logging.getLogger(__name__)

Progress = Callable[[int, int], None]


def compute_dtype_for(device: torch.device, mode: str) -> torch.dtype:
    return torch.bfloat16 if mode == "bf16" else default_compute_dtype(device)


def compute_bytes_for(device: torch.device, mode: str) -> int:
    return torch.empty(0, dtype=compute_dtype_for(device, mode)).element_size()


class ExpertWeights:
    """One expert's weight lifecycle: `materialize(device)` -> WanDiT, `evict(model)` -> dropped or parked.

    keep_in_ram and blocks_on_gpu are set by the sampler's memory plan before each load.
    """

    def __init__(self, name: str, fmt: ExpertFormat, mode: str = "nf4", keep_in_ram: bool = False, speed=None):
        if mode not in ("nf4", "bf16") and not (mode in LOWP_WEIGHTS and name == "fast"):
            raise ValueError(f"weight mode must be 'nf4' or 'bf16' (or one of {LOWP_WEIGHTS} for the Fast model), "
                             f"got {mode!r}")
        self.name = name
        self.fmt = fmt
        self.mode = mode
        self.keep_in_ram = keep_in_ram
        self.blocks_on_gpu: Optional[int] = None  # None: the whole expert on the device
        self.parked: Optional[WanDiT] = None  # whole model with pinned host copies (keep_in_ram)
        self.swapper: Optional[BlockSwapper] = None
        self.kept_parts: Optional[tuple[WanDiT, list]] = None  # block swap host copies (keep_in_ram)
        self.lora_merge = False  # merge LoRAs into the NF4 weights at load (re-quantized) instead of on the fly
        self.progress: Optional[Progress] = None  # set by the sampler while it waits for a load
        self.loads_from_disk = 0
        self.loads_from_ram = 0
        self.speed = speed  # speed.options.SpeedPlan, applied after every load (flags and shared compiled code)

    @property
    def label(self) -> str:
        what = {"high": "high-noise expert", "low": "low-noise expert", "fast": "Fast model"}.get(
            self.name, "LingBot-World expert")
        return f"{what} ({self.fmt.path})"

    @property
    def num_blocks(self) -> int:
        return self.fmt.config.num_layers

    def block_swapping(self) -> bool:
        return self.blocks_on_gpu is not None and self.blocks_on_gpu < self.num_blocks

    def device_bytes(self, device) -> int:
        """Bytes on the compute device under the current placement (for ComfyUI's memory accounting)."""
        sizes = expert_sizes(self.fmt.config, self.mode, compute_bytes_for(torch.device(device), self.mode))
        if not self.block_swapping():
            return sizes.total
        return sizes.base + (self.blocks_on_gpu + 2) * sizes.block  # + two ring buffers for streamed blocks

    def set_placement(self, keep_in_ram: bool, blocks_on_gpu: Optional[int]) -> bool:
        """Apply a memory plan; returns True when host copies of the other placement kind had to go."""
        changed = (blocks_on_gpu is not None) != (self.blocks_on_gpu is not None) or (
            self.kept_parts is not None and blocks_on_gpu != self.blocks_on_gpu)
        self.keep_in_ram, self.blocks_on_gpu = keep_in_ram, blocks_on_gpu
        if changed or not keep_in_ram:
            self.forget()
        return changed

    def materialize(self, device) -> WanDiT:
        device = torch.device(device)
        if self.block_swapping():
            model = self._place_blocks(device)
        elif self.parked is not None:
            model, self.parked = self.parked, None
            self.loads_from_ram += 1
            model = unpark(model, device)
        else:
            model = load_expert(self.fmt, device, self.mode, progress=self.progress)
            self.loads_from_disk += 1
        if self.speed is not None:
            from ...world.speed import apply_speed

            apply_speed(model, self.speed)
        return model

    def _place_blocks(self, device: torch.device) -> WanDiT:
        if self.kept_parts is not None:
            model, parts = self.kept_parts
            self.kept_parts = None
            self.loads_from_ram += 1
        else:
            # Base and blocks 0..N-1 straight to the device, the streamed blocks to host memory (then pinned).
            model = load_expert(self.fmt, device, self.mode, progress=self.progress,
                                host=streamed_block_keys(int(self.blocks_on_gpu)))
            parts = None
            self.loads_from_disk += 1
        self.swapper = BlockSwapper(model, device, int(self.blocks_on_gpu), parts=parts, pin=True).install()
        log.info("LingBot-World: %s placed for block swap: %d/%d blocks on %s, the rest streamed from pinned RAM",
                 self.label, self.swapper.resident, self.swapper.num_blocks, device)
        return model

    def evict(self, model: torch.nn.Module, device) -> None:
        """Called with the last reference the patcher holds; keeps a host copy only with the RAM cache."""
        pin = torch.cuda.is_available()
        if self.swapper is not None:
            parts = self.swapper.remove(keep_host=self.keep_in_ram, pin=pin)
            self.swapper = None
            if self.keep_in_ram:
                self.kept_parts = (model, parts)
            del parts
        elif self.keep_in_ram:
            self.parked = park_on_host(model, pin=pin)
        # else: nothing keeps the weights; the caller drops its reference and the memory is returned
        del model
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()

    def _comfy_cache_tensors(self) -> list:
        """Host copies (parked expert, block-swap blocks in pinned RAM) for ComfyUI's RAM-pressure node cache."""
        host = [self.parked]
        parts = list(getattr(self.swapper, "parts", None) or [])
        if self.kept_parts is not None:
            model, kept = self.kept_parts
            host.append(model)
            parts += list(kept or [])
        host += [getattr(p, "host", None) for p in parts]  # memory.pinned.WeightPart: one flat host buffer each
        return host_memory.host_tensors(*host)

    def forget(self) -> None:
        """Drop host copies (the plan changed, or the loader node's output was replaced)."""
        if self.parked is not None or self.kept_parts is not None:
            host_memory.note_released()
        self.parked = None
        self.kept_parts = None
