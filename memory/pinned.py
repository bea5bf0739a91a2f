"""Move a model's weights between the compute device and (pinned) host memory, one flat buffer per part.

bitsandbytes keeps part of every NF4 weight outside the parameter: its `QuantState` holds `absmax`, `code`,
`offset` and a nested state with its own `absmax`/`code`, and `Params4bit.to()` / `QuantState.to()` move
those with blocking copies from pageable memory. So moving an NF4 model with `model.to()` is slow and cannot
overlap with compute. Here every tensor of a part (a DiT block, or everything outside the blocks) is found
by walking the modules' parameters, buffers and QuantState tensors (`TensorSlot`), packed into ONE flat byte
buffer (`WeightPart`), and the module's tensors are re-pointed at views of whichever copy is current. A part
then moves with a single non-blocking copy. The host copies are `HostBuffer`s (host_buffer.py: exact-size
page-locked memory, and giving freed host memory back to the OS).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Iterator, Optional, Sequence, Union

import torch
import torch.nn as nn

from .host_buffer import HostBuffer
from .resident_weights import drop_resident_weights


ALIGN = 256  # byte alignment of every tensor inside a flat buffer (what CUDA kernels expect of weights)
Device = Union[str, torch.device]


# ---- where a tensor lives in a module ---------------------------------------------------------------------
class TensorSlot:
    """One place that holds a tensor: a parameter, a buffer, or an attribute of a bnb QuantState."""

    __slots__ = ("owner", "name", "kind", "label")

    def __init__(self, owner: object, name: str, kind: str, label: str):
        self.owner, self.name, self.kind, self.label = owner, name, kind, label

    def get(self) -> torch.Tensor:
        if self.kind == "param":
            return self.owner._parameters[self.name].data
        if self.kind == "buffer":
            return self.owner._buffers[self.name]
        return getattr(self.owner, self.name)

    def set(self, value: torch.Tensor) -> None:
        if self.kind == "param":
            # Swap the storage, keep the Parameter object: Params4bit keeps its quant_state and flags.
            self.owner._parameters[self.name].data = value
        elif self.kind == "buffer":
            self.owner._buffers[self.name] = value
        else:
            setattr(self.owner, self.name, value)

    def __repr__(self) -> str:
        return f"TensorSlot({self.label})"


def _quant_state_slots(qs: object, label: str) -> list[TensorSlot]:
    """Tensors of a bitsandbytes QuantState (and its nested state for double quantization)."""
    out = []
    for attr in ("absmax", "code", "offset"):
        if isinstance(getattr(qs, attr, None), torch.Tensor):
            out.append(TensorSlot(qs, attr, "attr", f"{label}.quant_state.{attr}"))
    state2 = getattr(qs, "state2", None)
    if state2 is not None:
        for attr in ("absmax", "code"):
            if isinstance(getattr(state2, attr, None), torch.Tensor):
                out.append(TensorSlot(state2, attr, "attr", f"{label}.quant_state.state2.{attr}"))
    return out


def tensor_slots(module: nn.Module, exclude: Sequence[str] = ()) -> list[TensorSlot]:
    """Every tensor of `module` (parameters, buffers, QuantState tensors), skipping submodules under `exclude`.

    `exclude` holds submodule names relative to `module` ("blocks" skips `blocks.0...`).
    """
    slots: list[TensorSlot] = []
    seen_states: set[int] = set()
    prefixes = tuple(p + "." for p in exclude)
    for mname, mod in module.named_modules():
        if mname in exclude or mname.startswith(prefixes):
            continue
        for pname, p in mod._parameters.items():
            if p is None:
                continue
            label = f"{mname}.{pname}" if mname else pname
            slots.append(TensorSlot(mod, pname, "param", label))
            qs = getattr(p, "quant_state", None)
            if qs is not None and id(qs) not in seen_states:
                seen_states.add(id(qs))
                slots += _quant_state_slots(qs, label)
        for bname, b in mod._buffers.items():
            if b is not None:
                slots.append(TensorSlot(mod, bname, "buffer", f"{mname}.{bname}" if mname else bname))
    return slots


# ---- a part of a model moving as one buffer --------------------------------------------------------------
@dataclass(frozen=True)
class _Entry:
    offset: int
    nbytes: int
    dtype: torch.dtype
    shape: tuple


def _align(n: int) -> int:
    return -(-n // ALIGN) * ALIGN


def _copy_stream(device: torch.device):
    return torch.cuda.current_stream(device) if device.type == "cuda" else None


class WeightPart:
    """A fixed set of a module's tensors that moves between host and device as one flat buffer.

    The part always points the module at one current copy: `on_device()` / `to_device()` or `to_host()`.
    The host copy is made once (`keep_host`) and reused: inference never changes the weights.
    """

    def __init__(self, name: str, slots: list[TensorSlot]):
        self.name = name
        self.slots = slots
        entries, pos = [], 0
        for s in slots:
            t = s.get()
            n = t.numel() * t.element_size()
            entries.append(_Entry(pos, n, t.dtype, tuple(t.shape)))
            pos += _align(n)
        self.entries = entries
        self.nbytes = pos
        self.host: Optional[HostBuffer] = None
        self.device_buffer: Optional[torch.Tensor] = None  # flat buffer the module points at, when on a device

    @classmethod
    def of(cls, module: nn.Module, name: str, exclude: Sequence[str] = ()) -> "WeightPart":
        return cls(name, tensor_slots(module, exclude))

    # layout ----------------------------------------------------------------------------------------------
    def signature(self) -> tuple:
        """(dtype, shape) of every tensor in order: parts with equal signatures can share a flat buffer."""
        return tuple((e.dtype, e.shape) for e in self.entries)

    def views(self, flat: torch.Tensor) -> list[torch.Tensor]:
        return [flat[e.offset : e.offset + e.nbytes].view(e.dtype).view(e.shape) for e in self.entries]

    def point_at(self, flat: torch.Tensor) -> None:
        for slot, view in zip(self.slots, self.views(flat)):
            slot.set(view)

    def current_device(self) -> torch.device:
        return self.slots[0].get().device if self.slots else torch.device("cpu")

    def _gather_into(self, flat: torch.Tensor, non_blocking: bool) -> None:
        for slot, view in zip(self.slots, self.views(flat)):
            view.copy_(slot.get(), non_blocking=non_blocking)

    # host copy -------------------------------------------------------------------------------------------
    @property
    def has_host_copy(self) -> bool:
        return self.host is not None

    def keep_host(self, pin: bool) -> HostBuffer:
        """Make the (pinned) host copy from the current tensors if there is none yet; returns it."""
        if self.host is None:
            buf = HostBuffer(self.nbytes, pin)
            src = self.current_device()
            self._gather_into(buf.tensor, non_blocking=buf.pinned and src.type == "cuda")
            if src.type == "cuda":
                torch.cuda.current_stream(src).synchronize()  # the copy must land before anyone reads it
            self.host = buf
        return self.host

    def to_host(self, pin: bool = True) -> None:
        """Point the module at the host copy (made now if missing) and drop the device buffer."""
        self.keep_host(pin)
        self.point_at(self.host.tensor)
        self.device_buffer = None

    def drop_host(self) -> None:
        if self.host is not None:
            self.host.close()
            self.host = None

    # device copy -----------------------------------------------------------------------------------------
    def fill(self, flat: torch.Tensor, stream=None) -> None:
        """Copy the part into a flat device buffer (async from pinned memory, on `stream` if given)."""
        if self.host is not None:
            src = self.host.tensor[: self.nbytes]
            if stream is not None:
                with torch.cuda.stream(stream):
                    flat[: self.nbytes].copy_(src, non_blocking=self.host.pinned)
            else:
                flat[: self.nbytes].copy_(src, non_blocking=self.host.pinned and flat.is_cuda)
        else:
            self._gather_into(flat, non_blocking=flat.is_cuda)

    def to_device(self, device: Device) -> torch.Tensor:
        """Give the part its own flat buffer on `device`, copy into it and point the module at it."""
        device = torch.device(device)
        flat = torch.empty(max(self.nbytes, 1), dtype=torch.uint8, device=device)
        self.fill(flat)
        self.point_at(flat)
        self.device_buffer = flat
        return flat


# ---- whole models ----------------------------------------------------------------------------------------
def dit_parts(model: nn.Module) -> list[WeightPart]:
    """A DiT split into movable parts: "base" (everything outside the blocks) then "block.<i>" in order."""
    parts = [WeightPart.of(model, "base", exclude=("blocks",))]
    for i, blk in enumerate(model.blocks):
        parts.append(WeightPart.of(blk, f"block.{i}"))
    return parts


def parts_nbytes(parts: Iterable[WeightPart]) -> int:
    return sum(p.nbytes for p in parts)


def clear_device_caches(model: nn.Module) -> None:
    """Drop per-device caches a model keeps outside its tensors (the DiT's RoPE tables, its kept GEMM weights)."""
    rope = getattr(model, "rope", None)
    if rope is not None and hasattr(rope, "head_dim"):
        model.rope = type(rope)(rope.head_dim)
    drop_resident_weights(model)


def synchronize(device: Device) -> None:
    device = torch.device(device)
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def free_device_memory(device: Device) -> None:
    """Return cached blocks to the driver so the freed weights really leave the card."""
    import gc

    gc.collect()
    if torch.device(device).type == "cuda":
        torch.cuda.empty_cache()


def offload_to_host(model: nn.Module, parts: Optional[list[WeightPart]] = None, pin: bool = True) -> list[WeightPart]:
    """Move a model's weights to (pinned) host memory, keeping the host copies for a fast `restore_to_device`."""
    parts = parts if parts is not None else dit_parts(model)
    for p in parts:
        p.to_host(pin)
    clear_device_caches(model)
    return parts


def restore_to_device(parts: list[WeightPart], device: Device) -> None:
    """Copy every part back from its host copy to `device` (one async copy per part from pinned memory)."""
    for p in parts:
        p.to_device(device)
    synchronize(device)


def park_on_host(model: nn.Module, pin: bool = True) -> nn.Module:
    """Park a loaded DiT in (pinned) host RAM; the parts are remembered on the model for `unpark`.

    The first park copies the weights out (one flat buffer per block); later parks only drop the device copy.
    """
    parts = getattr(model, "_weight_parts", None) or dit_parts(model)
    offload_to_host(model, parts, pin)
    model._weight_parts = parts
    return model


def unpark(model: nn.Module, device: Device) -> nn.Module:
    """Bring a parked model back to `device` (asynchronous copies from pinned memory, then one sync)."""
    parts = getattr(model, "_weight_parts", None)
    if parts is None:
        raise ValueError("this model was not parked with park_on_host(); load it again or move it with .to()")
    restore_to_device(parts, device)
    return model


def iter_model_tensors(parts: Iterable[WeightPart]) -> Iterator[torch.Tensor]:
    for p in parts:
        for s in p.slots:
            yield s.get()
