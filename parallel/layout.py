"""How a run spreads over ranks: the CFG split (the two guidance passes on two groups of ranks) times the Ulysses
degree (one pass's tokens split over ranks, its attention heads split around self-attention).

Pure functions of the world size, the mode, the head count and the model, so every rank computes the same layout
(and the same refusal) on its own, before anything is loaded.
"""
from __future__ import annotations

from dataclasses import dataclass

MODES = ("auto", "off", "cfg", "ulysses")
LAUNCH_HINT = "torchrun --nproc_per_node=2 -m lingbot_world.cli generate ..."


class LayoutError(ValueError):
    """The requested split cannot run with these processes and this model; the message says what can."""


@dataclass(frozen=True)
class Layout:
    world: int
    cfg: int  # 1, or 2: the conditional and the unconditional pass on two groups of ranks
    ulysses: int  # ranks splitting one pass's tokens (1 = no sequence parallelism)

    @property
    def parallel(self) -> bool:
        return self.world > 1

    def cfg_rank(self, rank: int) -> int:
        """0: this rank runs the conditional pass, 1: the unconditional one."""
        return rank // self.ulysses

    def sp_rank(self, rank: int) -> int:
        """This rank's token shard within its pass."""
        return rank % self.ulysses

    def sp_groups(self) -> list[list[int]]:
        """Ranks that split one pass's tokens (one list per CFG pass)."""
        return [[c * self.ulysses + i for i in range(self.ulysses)] for c in range(self.cfg)]

    def cfg_groups(self) -> list[list[int]]:
        """Ranks that hold the same token shard of the two passes (they exchange their velocities)."""
        return [[c * self.ulysses + i for c in range(self.cfg)] for i in range(self.ulysses)]

    def describe(self) -> str:
        if not self.parallel:
            return "one process"
        parts = []
        if self.cfg == 2:
            parts.append("CFG-parallel (conditional and unconditional pass on separate ranks)")
        if self.ulysses > 1:
            parts.append(f"Ulysses sequence parallel over {self.ulysses} ranks per pass")
        return f"{self.world} ranks: " + " x ".join(parts)


def ulysses_degrees(num_heads: int) -> list[int]:
    """Ulysses degrees a model with `num_heads` attention heads can run (every rank gets whole heads)."""
    return [d for d in range(2, num_heads + 1) if num_heads % d == 0]


def _check_ulysses(degree: int, num_heads: int, world: int, what: str) -> None:
    if degree <= 1:
        return
    ok = ulysses_degrees(num_heads)
    counts = ", ".join(map(str, [d for d in ok if d <= 16] or ok[:6]))
    if degree > num_heads:
        raise LayoutError(f"{what}: {degree} ranks per pass but the model has only {num_heads} attention heads to "
                          f"split (each rank needs at least one); use {counts} ranks per pass")
    if num_heads % degree:
        raise LayoutError(f"{what}: the model's {num_heads} attention heads do not split evenly over {degree} ranks; "
                          f"use {counts} ranks per pass")


def plan_layout(mode: str, world: int, num_heads: int, *, model: str = "base", guidance: bool = True) -> Layout:
    """The layout for `world` processes. mode: auto | off | cfg | ulysses; model: base | fast; guidance: whether the
    base model's CFG has an unconditional pass (a guide scale of 1 on both experts has none).

    auto: CFG-parallel when there are two passes and an even number of ranks (the rest of each pair's ranks split
    the tokens: 4 ranks = CFG x Ulysses 2), else Ulysses over every rank. Raises LayoutError naming what works.
    """
    if mode not in MODES:
        raise LayoutError(f"--parallel {mode!r}: choose one of {', '.join(MODES)}")
    if model not in ("base", "fast"):
        raise ValueError(f"model {model!r}: base or fast")
    if world < 1:
        raise ValueError(f"world size {world} must be >= 1")
    if world == 1:
        if mode in ("cfg", "ulysses"):
            raise LayoutError(f"--parallel {mode} needs several processes, one per GPU: launch with {LAUNCH_HINT} "
                              "(this run has one process)")
        return Layout(1, 1, 1)
    if mode == "off":
        raise LayoutError(f"{world} processes were started (torchrun) but --parallel is off, so each would make the "
                          "whole video on its own: use --parallel auto, cfg or ulysses, or start one process")
    two_passes = model == "base" and guidance
    if mode == "cfg":
        if model == "fast":
            raise LayoutError("--parallel cfg: the Fast model has no classifier-free guidance to split; use "
                              "--parallel ulysses (or auto)")
        if world % 2:
            raise LayoutError(f"--parallel cfg puts the two guidance passes on two halves of the ranks, so it needs an "
                              f"even number of processes, not {world}; use --parallel ulysses or an even count")
        _check_ulysses(world // 2, num_heads, world, f"--parallel cfg with {world} processes")
        return Layout(world, 2, world // 2)
    if mode == "ulysses":
        _check_ulysses(world, num_heads, world, f"--parallel ulysses with {world} processes")
        return Layout(world, 1, world)
    # auto: the first layout that fits
    candidates = []
    if two_passes and world % 2 == 0:
        candidates.append(Layout(world, 2, world // 2))
    candidates.append(Layout(world, 1, world))
    for c in candidates:
        try:
            _check_ulysses(c.ulysses, num_heads, world, "")
            return c
        except LayoutError:
            continue
    degrees = ulysses_degrees(num_heads)
    counts = sorted({d for d in degrees if d <= 16} | ({2 * d for d in degrees if 2 * d <= 16} if two_passes else set())
                    | ({2} if two_passes else set()))
    raise LayoutError(f"--parallel auto: {world} processes cannot split a model with {num_heads} attention heads "
                      f"(Ulysses needs a rank count dividing {num_heads}" + (", CFG-parallel an even one" if two_passes
                                                                              else "")
                      + f"); start {', '.join(map(str, counts))} processes")
