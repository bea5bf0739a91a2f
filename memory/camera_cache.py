"""Where the camera FiLM cache lives (wan/dit/film_cache.py): planned from the video, the memory plan and free RAM.

Choices: `off`; `host` (every block's values in pinned host RAM, one block at a time on the GPU); `device` (every
block's values on the compute device: big cards, or a CPU run); `auto`: host for as many blocks as RAM allows
next to what the memory plan keeps there and a reserve, on a CPU run the device (it is host RAM already), and
off where there is no camera or nothing to reuse. `auto` never takes VRAM: the values of 40 blocks at 480p are
26 GB, and the card's memory is the memory plan's.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Callable, Optional

from ..wan.dit.film_cache import FilmCache
from ..wan.dit.model import DiTConfig
from ..wan.sizes import token_count
from .film_stream import HostFilmStore
from .estimates import RAM_RESERVE, VRAM_HEADROOM, available_ram_bytes
from .expert_plan import MemoryPlan

CAMERA_CACHE_CHOICES = ("auto", "off", "host", "device")


class CameraCacheError(ValueError):
    """A requested placement that cannot fit; one line with the numbers and what to do."""


@dataclass
class CameraCachePlan:
    place: str  # "off" | "host" | "device"
    blocks: int  # blocks whose values are cached (the first ones); the others compute theirs every forward
    block_bytes: int  # one block's (1 + scale, shift)
    reason: str

    @property
    def nbytes(self) -> int:
        return self.blocks * self.block_bytes

    def make(self, device) -> Optional[FilmCache]:
        if self.place == "off" or self.blocks == 0:
            return None
        if self.place == "device":
            return FilmCache(device_blocks=range(self.blocks))
        return FilmCache(host_blocks=range(self.blocks), host_store=HostFilmStore(device))

    def to_json(self) -> dict:
        return {**asdict(self), "nbytes": self.nbytes}


def film_block_bytes(video: tuple[int, int, int], cfg: DiTConfig, compute_bytes: int = 2, seq_parallel: int = 1) -> int:
    """(1 + scale, shift) of one block for this rank's tokens: 2 x L x dim in the compute dtype."""
    frames, height, width = video
    local = -(-token_count(frames, height, width) // max(1, int(seq_parallel)))
    return 2 * local * cfg.dim * compute_bytes


def plan_host_bytes(plan: Optional[MemoryPlan]) -> int:
    """Host RAM the memory plan keeps: the released expert (keep_in_ram) and block swap's streamed blocks."""
    if plan is None:
        return 0
    est = plan.estimates
    out = int(est.get("expert_bytes", 0)) if plan.keep_in_ram else 0
    if plan.mode == "block_swap" and plan.blocks_on_gpu is not None:
        num = int(est.get("expert_bytes", 0) - est.get("base_bytes", 0)) // max(1, int(est.get("block_bytes", 1)))
        out += max(0, num - plan.blocks_on_gpu) * int(est.get("block_bytes", 0))
    return out


def plan_device_bytes(plan: Optional[MemoryPlan]) -> int:
    """Device bytes the memory plan uses at its peak (weights on the card, activations, headroom)."""
    if plan is None:
        return 0
    est = plan.estimates
    expert, block, base = (int(est.get(k, 0)) for k in ("expert_bytes", "block_bytes", "base_bytes"))
    if plan.mode == "resident":
        weights = 2 * expert
    elif plan.mode == "block_swap" and plan.blocks_on_gpu is not None:
        weights = base + (plan.blocks_on_gpu + 2) * block
    else:
        weights = expert
    return weights + plan.activation_bytes + int(est.get("headroom", VRAM_HEADROOM))


def _gb(n: float) -> str:
    return f"{n / 1e9:.1f} GB"


def plan_camera_cache(
    choice: str,
    video: tuple[int, int, int],
    cfg: DiTConfig,
    *,
    camera: bool,
    forwards: int,
    ram_free: int,
    memory_plan: Optional[MemoryPlan] = None,
    vram_free: Optional[int] = None,
    compute_bytes: int = 2,
    seq_parallel: int = 1,
) -> CameraCachePlan:
    """The camera cache for a run of `forwards` model calls over one camera (see the module docstring).

    vram_free: the device budget the memory plan was made for (None: the CPU computes). A `host` or `device`
    request that cannot fit raises CameraCacheError before anything is loaded.
    """
    if choice not in CAMERA_CACHE_CHOICES:
        raise CameraCacheError(f"camera cache {choice!r}: choose one of {', '.join(CAMERA_CACHE_CHOICES)}")
    per = film_block_bytes(video, cfg, compute_bytes, seq_parallel)
    n = cfg.num_layers
    total = n * per

    def off(why: str) -> CameraCachePlan:
        return CameraCachePlan("off", 0, per, why)

    if not camera:
        return off("off (no camera: the camera layers do not run)")
    if choice == "off":
        return off("off as requested (each forward computes the camera layers)")
    if forwards < 3 and choice == "auto":
        return off(f"auto: off ({forwards} model calls: nothing to reuse)")
    ram_left = ram_free - RAM_RESERVE - plan_host_bytes(memory_plan)
    device_left = None if vram_free is None else vram_free - plan_device_bytes(memory_plan)
    saving = f"the camera layers run once per expert instead of {forwards} times"

    if choice == "device" or (choice == "auto" and vram_free is None):
        where = "host RAM (CPU run)" if vram_free is None else "VRAM"
        budget = ram_left if vram_free is None else device_left
        if budget < total:
            if choice == "auto":
                return _host_or_off(per, n, ram_left, saving, prefix="auto: ")
            raise CameraCacheError(
                f"--camera-cache device needs {_gb(total)} of {where} for {n} blocks at {video[2]}x{video[1]} "
                f"x {video[0]} frames, {_gb(max(0, budget))} is left next to the model; use --camera-cache host or auto")
        return CameraCachePlan("device", n, per, f"{'auto: ' if choice == 'auto' else ''}{n} blocks' values in "
                                                 f"{where} ({_gb(total)}); {saving}")
    if choice == "host":
        if ram_left < total:
            raise CameraCacheError(
                f"--camera-cache host needs {_gb(total)} of RAM for {n} blocks at {video[2]}x{video[1]} x {video[0]} "
                f"frames, "
                f"{_gb(max(0, ram_left))} is free after the model's share and a {_gb(RAM_RESERVE)} reserve; use "
                "--camera-cache auto (as many blocks as fit) or off")
        return _host_or_off(per, n, ram_left, saving, prefix="")
    return _host_or_off(per, n, ram_left, saving, prefix="auto: ")


def camera_cache_for_run(choice: str, video: tuple[int, int, int], cfg: DiTConfig, memory_plan: Optional[MemoryPlan], *,
                         camera: bool, steps: int, cfg_mode: str, device, compute_bytes: int, seq_parallel: int = 1,
                         log: Callable[[str], None]) -> Optional[FilmCache]:
    """Plan the cache of a sampling run (`steps` steps, two model calls each in sequential CFG, one otherwise) from the
    RAM free now and the memory plan's device budget, log the choice in one line, and make it (None = off)."""
    cache_plan = plan_camera_cache(
        choice, video, cfg, camera=camera, forwards=steps * (2 if cfg_mode == "sequential" else 1),
        ram_free=available_ram_bytes(), memory_plan=memory_plan,
        vram_free=memory_plan.estimates.get("vram_free") if memory_plan is not None else None,
        compute_bytes=compute_bytes, seq_parallel=seq_parallel)
    log(cache_plan.reason)
    return cache_plan.make(device)


def _host_or_off(per: int, n: int, ram_left: int, saving: str, prefix: str) -> CameraCachePlan:
    blocks = max(0, min(n, ram_left // per if per else n))
    if blocks == 0:
        return CameraCachePlan("off", 0, per, f"{prefix}off ({_gb(max(0, ram_left))} of RAM left after the model's "
                                              f"share and the reserve; one block needs {_gb(per)})")
    part = "" if blocks == n else f" (of {n}: the RAM left, {_gb(ram_left)}, holds no more)"
    return CameraCachePlan(
        "host", blocks, per,
        f"{prefix}{blocks} blocks' values in pinned host RAM ({_gb(blocks * per)}){part}, streamed one block ahead "
        f"(one block on the GPU, {_gb(per)}, instead of the camera tokens); {saving}")

