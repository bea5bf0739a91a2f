"""Which start-up steps of a run may run at the same time: the one planner for the text encoder's child, the
image's VAE encode, the DiT's load and the K/V cache's host memory.

VRAM. The child takes its weights plus a margin (text_encoder.encode.estimate_child_vram_bytes) for a few
seconds. The steps that follow it (the image's VAE encode, loading the DiT) are admitted beside it in their order
as long as everything held at once fits in the VRAM this process may use; the first that does not waits for the
child, and so do the steps after it (they build on each other's placement). A step marked `with_previous` (the
Fast model's load, on a thread) also runs at the same time as the step before it (the VAE encode) when both
peaks fit together on the same side of the child: both beside it (with its VRAM counted) or both after it. On a
24 GB card the Fast model's VAE encode and load fit beside the encoder and beside each other; on 16 GB they run
after it, one after the other, as before.

RAM. The K/V cache's host layers (pinned) may be allocated from the memory plan on, while everything above
runs, when they fit in the available RAM next to the child's host memory; else after the child, as before.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Sequence

GB = 1e9
# RAM that stays free beside the pinned host memory allocated early (the loads' staging buffers, the VAE file).
EARLY_RAM_MARGIN = 2 * 1024**3


@dataclass(frozen=True)
class Step:
    name: str
    peak_bytes: int  # VRAM while it runs (weights, activations)
    kept_bytes: int  # VRAM it still holds when it is done
    with_previous: bool = False  # may run at the same time as the step before it (on another thread)


@dataclass(frozen=True)
class OverlapPlan:
    beside: tuple[str, ...]  # the steps that run while the text encoder works
    reason: str
    together: tuple[str, ...] = ()  # steps that run at the same time as the step before them
    host_early: bool = False  # the K/V cache's host memory is allocated from the start, beside everything

    def runs_beside(self, name: str) -> bool:
        return name in self.beside

    def runs_with_previous(self, name: str) -> bool:
        return name in self.together


def plan_overlap(vram_free: Optional[int], child_bytes: int, steps: Sequence[Step], headroom: int = 1 << 30, *,
                 allow: bool = True, host_bytes: int = 0, ram_free: Optional[int] = None,
                 child_ram: int = 0) -> OverlapPlan:
    """Admit `steps` in order beside a child holding `child_bytes` of VRAM (0: no child on this GPU: it is cached,
    on the CPU or done first), pair each `with_previous` step with the one before it where both peaks fit, and
    decide whether `host_bytes` of pinned RAM may be allocated now, beside a child holding `child_ram` of RAM.
    `vram_free` is what this process may use now (None: a CPU run, no device budget). allow=False: nothing
    overlaps (--overlap off)."""
    if not allow:
        return OverlapPlan((), "--overlap off: one step after the other")
    names = [s.name for s in steps]
    fits = (lambda need: True) if vram_free is None else (lambda need: need <= vram_free)
    if child_bytes <= 0:
        beside = tuple(names)
        parts = ["the text encoder needs no VRAM here (cached or on the CPU)"]
    else:
        held = child_bytes + headroom
        admitted = []
        for s in steps:
            if not fits(held + s.peak_bytes):
                break
            held += s.kept_bytes
            admitted.append(s.name)
        beside = tuple(admitted)
        parts = [f"text encoder {child_bytes / GB:.1f} GB of VRAM"]
        if beside:
            parts.append("beside it: " + ", ".join(beside))
        if len(beside) < len(names):
            parts.append("after it: " + ", ".join(names[len(beside):]))
    together = []
    kept = 0  # VRAM held by the steps before the pair
    for i, s in enumerate(steps):
        if i and s.with_previous:
            prev = steps[i - 1]
            same_side = (prev.name in beside) == (s.name in beside)
            child = child_bytes if s.name in beside and child_bytes > 0 else 0
            if same_side and fits(child + headroom + kept + prev.peak_bytes + s.peak_bytes):
                together.append(s.name)
                parts.append(f"{s.name} at the same time as {prev.name}")
            else:
                parts.append(f"{s.name} after {prev.name}")
        if i:
            kept += steps[i - 1].kept_bytes
    host_early = host_bytes > 0 and ram_free is not None and host_bytes + child_ram + EARLY_RAM_MARGIN <= ram_free
    if host_bytes > 0:
        parts.append(f"K/V cache host memory ({host_bytes / GB:.1f} GB) "
                     + ("allocated meanwhile" if host_early else "allocated after the text encoder (RAM)"))
    where = "" if vram_free is None else f" ({vram_free / GB:.1f} GB free)"
    return OverlapPlan(beside, f"{'; '.join(parts)}{where}", tuple(together), host_early)
