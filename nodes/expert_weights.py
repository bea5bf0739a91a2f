"""Where one expert's weights come from when ComfyUI loads it, and where they go when it unloads it.

Load = stream the file straight to the device (`load_expert`: no host copy of the 9.6 GB expert), or take
the copy parked in host RAM if the user chose the RAM cache. Unload = drop the weights (the next load
streams them again), or park them in (pinned, when CUDA is present) host RAM for a fast switch.
No ComfyUI imports: the ModelPatcher in `patchers.py` calls this.
"""
from __future__ import annotations

import gc
import logging
import math
from typing import Callable, Optional

import torch

from ..loaders.expert_format import ExpertFormat
from ..loaders.expert_loader import load_expert
from ..loaders.nf4_writer import nf4_expert_bytes
from ..wan.dit import WanDiT

log = logging.getLogger(__name__)

Progress = Callable[[int, int], None]

# Seam for issue 9's placement code: a better host-parking function (pinned copies with non_blocking
# transfers) can be installed here; the fallback below moves the module and pins what it can.
PARK_HOOK: Optional[Callable[[torch.nn.Module], torch.nn.Module]] = None


def expert_device_bytes(fmt: ExpertFormat, mode: str) -> int:
    """Bytes the expert takes on the compute device once loaded (for ComfyUI's memory accounting)."""
    if mode == "bf16":
        return sum(math.prod(p.shape) for p in WanDiT(fmt.config, device="meta").parameters()) * 2
    if fmt.quantized:
        return fmt.file_bytes  # packed codes + statistics + bf16 plain tensors, as stored
    return nf4_expert_bytes(fmt.config)  # float release, quantized while streaming


def _quant_state_tensors(p: torch.nn.Parameter) -> list[tuple[object, str]]:
    qs = getattr(p, "quant_state", None)
    if qs is None:
        return []
    out = [(qs, "absmax"), (qs, "code")]
    if getattr(qs, "nested", False):
        out += [(qs, "offset"), (qs.state2, "absmax"), (qs.state2, "code")]
    return out


def park_on_host(model: torch.nn.Module) -> torch.nn.Module:
    """Move a loaded expert to host RAM, pinned when CUDA is available (fast copies back)."""
    if PARK_HOOK is not None:
        return PARK_HOOK(model)
    model.to("cpu")
    if not torch.cuda.is_available():
        return model
    try:
        for m in model.modules():
            for p in m._parameters.values():
                if p is None:
                    continue
                if not p.data.is_pinned():
                    p.data = p.data.pin_memory()
                for owner, attr in _quant_state_tensors(p):
                    t = getattr(owner, attr)
                    if isinstance(t, torch.Tensor) and not t.is_pinned():
                        setattr(owner, attr, t.pin_memory())
    except RuntimeError as e:  # pinning can fail when page-locked memory runs out: pageable still works
        log.warning("LingBot-World: could not pin the parked expert in RAM (%s); keeping pageable memory", e)
    return model


def _move(model: torch.nn.Module, device: torch.device) -> torch.nn.Module:
    model.to(device)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return model


class ExpertWeights:
    """One expert's weight lifecycle: `materialize(device)` -> WanDiT, `evict(model)` -> dropped or parked."""

    def __init__(self, name: str, fmt: ExpertFormat, mode: str = "nf4", keep_in_ram: bool = False):
        if mode not in ("nf4", "bf16"):
            raise ValueError(f"weight mode must be 'nf4' or 'bf16', got {mode!r}")
        self.name = name
        self.fmt = fmt
        self.mode = mode
        self.keep_in_ram = keep_in_ram
        self.parked: Optional[torch.nn.Module] = None
        self.progress: Optional[Progress] = None  # set by the sampler while it waits for a load
        self.loads_from_disk = 0
        self.loads_from_ram = 0

    @property
    def label(self) -> str:
        return f"{self.name}-noise expert ({self.fmt.path})"

    def estimated_bytes(self) -> int:
        return expert_device_bytes(self.fmt, self.mode)

    def materialize(self, device) -> WanDiT:
        device = torch.device(device)
        if self.parked is not None:
            model, self.parked = self.parked, None
            self.loads_from_ram += 1
            return _move(model, device)
        model = load_expert(self.fmt, device, self.mode, progress=self.progress)
        self.loads_from_disk += 1
        return model

    def evict(self, model: torch.nn.Module, device) -> None:
        """Called with the last reference the patcher holds; keeps a host copy only with the RAM cache."""
        if self.keep_in_ram:
            self.parked = park_on_host(model)
        # else: nothing keeps the weights; the caller drops its reference and memory is returned
        del model
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()

    def forget(self) -> None:
        """Drop the RAM copy too (used when the loader node's output is replaced)."""
        self.parked = None
