"""Which model-loading steps may run while the text encoder's child process holds VRAM on the same GPU.

The child takes its weights plus a margin (text_encoder.encode.estimate_child_vram_bytes) for a few seconds.
The steps that follow it (the image's VAE encode, loading the DiT) are admitted beside it in their order as
long as everything held at once fits in the VRAM this process may use; the first that does not waits for the
child, and so do the steps after it (they build on each other's placement). On a 24 GB card the Fast model's
VAE encode and load fit beside the encoder; on 16 GB they run after it, as before.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

GB = 1e9


@dataclass(frozen=True)
class Step:
    name: str
    peak_bytes: int  # VRAM while it runs (weights, activations)
    kept_bytes: int  # VRAM it still holds when it is done


@dataclass(frozen=True)
class OverlapPlan:
    beside: tuple[str, ...]  # the steps that run while the text encoder works
    reason: str

    def runs_beside(self, name: str) -> bool:
        return name in self.beside


def plan_text_overlap(vram_free: int, child_bytes: int, steps: Sequence[Step], headroom: int = 1 << 30) -> OverlapPlan:
    """Admit `steps` in order beside a child holding `child_bytes`; `vram_free` is what this process may use now."""
    if child_bytes <= 0:
        return OverlapPlan(tuple(s.name for s in steps), "the text encoder needs no VRAM here (cached or on the CPU)")
    held = child_bytes + headroom
    beside = []
    for s in steps:
        if held + s.peak_bytes > vram_free:
            break
        held += s.kept_bytes
        beside.append(s.name)
    waits = [s.name for s in steps[len(beside):]]
    parts = [f"text encoder {child_bytes / GB:.1f} GB of VRAM"]
    if beside:
        parts.append("beside it: " + ", ".join(beside))
    if waits:
        parts.append("after it: " + ", ".join(waits))
    return OverlapPlan(tuple(beside), f"{'; '.join(parts)} ({vram_free / GB:.1f} GB free)")
