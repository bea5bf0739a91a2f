"""Putting an expert's tensors in place on a model built on `meta`, and counting what it holds.

`_set_param` puts one tensor in as the module's parameter (no empty module is ever copied to the device);
`_finish_packed` / `_finish_lowp` complete one NF4 / FP8 / INT8 linear once all its stored pieces have arrived
(kept as stored, or dequantized to a plain bf16 weight in "bf16" mode); `_weight_to_host` moves one linear's weight
to the CPU (block swap); `device_bytes` counts the weights a model holds on a device. expert_loader.py's load drives
them tensor by tensor.
"""
from __future__ import annotations

from typing import Optional

import torch
import torch.nn as nn

from ..quant.lowp_format import KIND_OF_DTYPE
from ..wan.dit.model import WanDiT


def _weight_to_host(model: nn.Module, linear: str) -> None:
    """Move one linear's weight (NF4 codes and their QuantState, an FP8 weight and its scale, or a plain weight)
    to the CPU."""
    from ..quant.nf4 import NF4Linear

    mod = model.get_submodule(linear)
    w = mod._parameters["weight"]
    if isinstance(mod, NF4Linear):
        w.quant_state.to("cpu")  # in place: absmax, code and the nested state
        w.data = w.data.cpu()
        return
    for name in ("weight", "weight_scale"):
        p = mod._parameters.get(name)
        if p is not None:
            mod._parameters[name] = nn.Parameter(p.data.cpu(), requires_grad=False)


def _set_param(model: nn.Module, key: str, value: torch.Tensor) -> None:
    mod_name, _, pname = key.rpartition(".")
    mod = model.get_submodule(mod_name) if mod_name else model
    mod._parameters[pname] = nn.Parameter(value, requires_grad=False)


def device_bytes(model: nn.Module, device: Optional[torch.device] = None) -> tuple[int, int]:
    """(bytes of the weights incl. NF4 statistics, logical parameter count); with `device`, only the weights
    that are on it are counted (block swap keeps some in host memory)."""
    from ..quant.lowp_linear import StoredLowpLinear
    from ..quant.nf4 import NF4Linear

    nbytes = count = 0
    for m in model.modules():
        for name, p in m._parameters.items():
            if p is None:
                continue
            if isinstance(m, NF4Linear) and name == "weight":
                qs = m.weight.quant_state
                parts = [p.data, qs.absmax, qs.code]
                if qs.nested:
                    parts += [qs.state2.absmax, qs.state2.code, qs.offset]
                held = sum(t.numel() * t.element_size() for t in parts)
                count += m.out_features * m.in_features
            elif name == "weight_scale" and isinstance(m, StoredLowpLinear):
                held = p.numel() * p.element_size()  # statistics, like NF4's absmax: bytes, no parameters
            else:
                held = p.numel() * p.element_size()
                count += p.numel()
            if device is None or p.device == device:
                nbytes += held
    return nbytes, count



def _finish_packed(model: WanDiT, name: str, pieces: dict, nf4: bool, where: str) -> None:
    from ..quant.nf4 import NF4Linear

    packed = pieces.pop("")
    if nf4:
        model.get_submodule(name).load_prequantized(packed, pieces, where)
        return
    # bf16 mode from an NF4 file: dequantize on the device with bnb, keep a plain bf16 weight.
    mod = model.get_submodule(name)
    tmp = NF4Linear(mod.in_features, mod.out_features, bias=False, compute_dtype=torch.bfloat16)
    tmp.load_prequantized(packed, pieces, where)
    _set_param(model, f"{name}.weight", tmp.dequantized_weight(torch.bfloat16))


def _finish_lowp(model: WanDiT, name: str, pieces: dict, where: str) -> None:
    """A stored FP8 / INT8 pair: kept as stored (its own mode; check_mode refused the other) or dequantized to a
    plain bf16 weight (bf16 mode)."""
    from ..quant.lowp_linear import LINEAR_CLASSES, StoredLowpLinear, dequantize

    mod = model.get_submodule(name)
    if isinstance(mod, StoredLowpLinear):
        mod.load_stored(pieces["weight"], pieces["scale"], where)
        return
    kind = KIND_OF_DTYPE[pieces["weight"].dtype]  # checked like the stored mode would, then dequantized
    LINEAR_CLASSES[kind](mod.in_features, mod.out_features, bias=False).load_stored(pieces["weight"], pieces["scale"],
                                                                                     where)
    _set_param(model, f"{name}.weight", dequantize(pieces["weight"], pieces["scale"], torch.bfloat16))

