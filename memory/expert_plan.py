"""The experts' memory plan (`plan_memory`): the memory mode, whether the released expert stays in pinned RAM, the
blocks kept on the GPU and the CFG mode, with the reason in one line.

A pure function of sizes and free memory (memory/estimates.py), so the decision can be tested with made-up numbers;
the providers that carry a plan out, and `make_provider` that asks for one, are memory/placement.py's.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Optional

from ..wan.dit.blocks import DEFAULT_TOKEN_CHUNK
from ..wan.dit.model import DiTConfig
from .estimates import (ACTIVATION_SAFETY, RAM_RESERVE, GiB, _fits_line, _gb, estimate_activation_bytes, expert_sizes,
                        vram_headroom)

MODES = ("auto", "resident", "swap", "swap_pinned", "block_swap")
CFG_MODES = ("auto", "batch", "layered", "sequential")
# The CFG modes `auto` chooses from, in order of preference (speed): batch (one forward of batch 2), layered (the two
# passes one after the other inside each block: one extra fp32 residual stream), sequential (two forwards).
CFG_PREFERENCE = ("batch", "layered", "sequential")


@dataclass
class MemoryPlan:
    mode: str  # "resident" | "swap" | "block_swap"
    keep_in_ram: bool
    blocks_on_gpu: Optional[int]
    cfg_batch: bool
    reason: str
    token_chunk: Optional[int] = DEFAULT_TOKEN_CHUNK
    fits: bool = True
    estimates: dict = field(default_factory=dict)
    cfg_layered: bool = False  # with cfg_batch False: layered CFG instead of sequential

    @property
    def cfg_mode(self) -> str:
        """What to put in SamplingSettings.cfg_mode: batch, layered or sequential."""
        return "batch" if self.cfg_batch else "layered" if self.cfg_layered else "sequential"

    @property
    def activation_bytes(self) -> int:
        """The planned activations of its CFG mode (0 for a plan made without a video)."""
        return int(self.estimates.get(f"activation_bytes_{'batched' if self.cfg_batch else self.cfg_mode}", 0))

    def to_json(self) -> dict:
        d = asdict(self)
        d["cfg_mode"] = self.cfg_mode
        return d


def plan_memory(
    video: tuple[int, int, int],
    cfg: DiTConfig,
    vram_free: Optional[int],
    ram_free: int,
    *,
    weights: str = "nf4",
    mode: str = "auto",
    keep_in_ram: Optional[bool] = None,
    blocks_on_gpu: Optional[int] = None,
    cfg_mode: str = "auto",
    camera: bool = True,
    compute_bytes: int = 2,
    token_chunk: Optional[int] = DEFAULT_TOKEN_CHUNK,
    seq_parallel: int = 1,
) -> MemoryPlan:
    """Decide the memory mode (when `mode="auto"`), keep_in_ram, blocks on the GPU and the CFG mode.

    CFG (cfg_mode="auto"): batch if it fits, else layered if it fits, else sequential; with block swap, batch only
    where it keeps as many blocks on the card as sequential, else the one of layered / sequential that streams
    fewer blocks per step. A given cfg_mode is kept.

    video: (frames, height, width) in pixels. vram_free / ram_free: bytes usable now (see free_vram_bytes,
    available_ram_bytes); vram_free=None means the CPU computes (no device budget: everything fits, and the
    plan says so instead of quoting a made-up VRAM figure). A mode that is given is kept; its missing settings
    are filled in the same way.
    Pure function of its arguments, so the decision can be tested with made-up numbers.
    """
    if mode not in MODES:
        raise ValueError(f"memory mode {mode!r}: choose one of {MODES}")
    if cfg_mode not in CFG_MODES:
        raise ValueError(f"cfg mode {cfg_mode!r}: choose one of {CFG_MODES}")
    if mode == "swap_pinned":
        mode, keep_in_ram = "swap", True
    frames, height, width = video
    sizes = expert_sizes(cfg, weights, compute_bytes)
    headroom = 0 if vram_free is None else vram_headroom(seq_parallel)  # CUDA workspaces, NCCL; none on the CPU
    acts = {
        guidance: int(
            estimate_activation_bytes(frames, height, width, cfg, guidance == "batch", camera=camera,
                                      compute_bytes=compute_bytes, token_chunk=token_chunk, seq_parallel=seq_parallel,
                                      layered=guidance == "layered") * ACTIVATION_SAFETY
        )
        for guidance in CFG_PREFERENCE
    }
    cfg_options = CFG_PREFERENCE if cfg_mode == "auto" else (cfg_mode,)
    size_txt = f"{width}x{height}, {frames} frames" + (f", 1/{seq_parallel} of the tokens" if seq_parallel > 1 else "")
    estimates = {
        "expert_bytes": sizes.total,
        "block_bytes": sizes.block,
        "base_bytes": sizes.base,
        "activation_bytes_sequential": acts["sequential"],
        "activation_bytes_layered": acts["layered"],
        "activation_bytes_batched": acts["batch"],
        "vram_free": None if vram_free is None else int(vram_free),
        "ram_free": int(ram_free),
        "headroom": headroom,
    }

    def act_label(guidance: str) -> str:
        return f"activations ({size_txt}, {'batched' if guidance == 'batch' else guidance} CFG)"

    def fits(weights_bytes: int, guidance: str) -> bool:
        return vram_free is None or weights_bytes + acts[guidance] + headroom <= vram_free

    def pick_cfg(weights_bytes: int) -> tuple[str, bool]:
        for guidance in cfg_options:
            if fits(weights_bytes, guidance):
                return guidance, True
        return cfg_options[-1], False

    def plan(mode_: str, keep: bool, blocks: Optional[int], guidance: str, reason: str, ok: bool) -> MemoryPlan:
        return MemoryPlan(mode_, keep, blocks, guidance == "batch", reason, token_chunk, ok, estimates,
                          cfg_layered=guidance == "layered")

    def ram_for_pinned() -> bool:
        return ram_free >= 2 * sizes.total + RAM_RESERVE

    def with_ram_note(keep: bool, auto_keep: bool) -> str:
        if not auto_keep:
            return "keep_in_ram as requested" if keep else "released expert dropped as requested"
        if keep:
            return f"{_gb(ram_free)} RAM free >= 2 x {_gb(sizes.total)} + {_gb(RAM_RESERVE)}: released expert kept in pinned RAM"
        return f"{_gb(ram_free)} RAM free < 2 x {_gb(sizes.total)} + {_gb(RAM_RESERVE)}: released expert dropped, reloaded from disk"

    def block_count(guidance: str) -> int:
        if vram_free is None:
            return sizes.num_blocks
        spare = vram_free - headroom - acts[guidance] - sizes.base - 2 * sizes.block
        return max(0, min(sizes.num_blocks, spare // sizes.block if sizes.block else sizes.num_blocks))

    def uploads_per_step(guidance: str) -> int:
        # Blocks streamed to the card per denoising step: sequential runs two forwards, so it streams them twice.
        resident = blocks_on_gpu if blocks_on_gpu is not None else block_count(guidance)
        return (sizes.num_blocks - min(resident, sizes.num_blocks)) * (2 if guidance == "sequential" else 1)

    chosen = mode
    if mode == "auto":
        if fits(2 * sizes.total, cfg_options[-1]):
            chosen = "resident"
        elif fits(sizes.total, cfg_options[-1]):
            chosen = "swap"
        else:
            chosen = "block_swap"
    prefix = "auto: " if mode == "auto" else "requested: "

    if chosen == "resident":
        guidance, ok = pick_cfg(2 * sizes.total)
        why = _fits_line([("both experts", 2 * sizes.total), (act_label(guidance), acts[guidance]),
                          ("headroom", headroom)], vram_free, "free VRAM")
        return plan("resident", False, None, guidance, f"{prefix}resident ({why})", ok)

    if chosen == "swap":
        guidance, ok = pick_cfg(sizes.total)
        auto_keep = keep_in_ram is None
        keep = ram_for_pinned() if auto_keep else bool(keep_in_ram)
        why = _fits_line([("one expert", sizes.total), (act_label(guidance), acts[guidance]),
                          ("headroom", headroom)], vram_free, "free VRAM")
        if mode == "auto":
            why += f"; both experts would need {_gb(2 * sizes.total + acts['sequential'] + headroom)}"
        name = "swap, keep_in_ram" if keep else "swap"
        return plan("swap", keep, None, guidance, f"{prefix}{name} ({why}; {with_ram_note(keep, auto_keep)})", ok)

    # block swap: as many blocks on the device as fit next to the activations, two ring buffers and the base.
    # CFG (auto): batch only where it keeps as many blocks on the card as sequential would; otherwise layered or
    # sequential, whichever streams fewer blocks per step (layered streams each off-card block once per step,
    # sequential twice); ties go to the faster mode.
    guidance = cfg_options[0]
    cfg_note = ""
    if len(cfg_options) > 1:
        if block_count("batch") < block_count("sequential"):
            layered, sequential = uploads_per_step("layered"), uploads_per_step("sequential")
            guidance = "layered" if layered <= sequential else "sequential"
            cfg_note = (f"{guidance} CFG: batched would push blocks off the card; block uploads per step: layered "
                        f"{layered}, sequential {sequential}")
    n = blocks_on_gpu if blocks_on_gpu is not None else block_count(guidance)
    n = max(0, min(int(n), sizes.num_blocks))
    on_device = sizes.base + n * sizes.block + (2 * sizes.block if n < sizes.num_blocks else 0)
    ok = fits(on_device, guidance)
    if not ok and len(cfg_options) > 1:  # nothing to gain from a CFG mode that does not fit: the next one that does
        for other in cfg_options[cfg_options.index(guidance) + 1:]:
            if fits(on_device, other):
                guidance, ok, cfg_note = other, True, f"{other} CFG: the others do not fit next to {n} blocks"
                break
        else:
            guidance = cfg_options[-1]
    ring = " + 2 ring buffers" if n < sizes.num_blocks else ""
    why = _fits_line([(f"base + {n}/{sizes.num_blocks} blocks{ring}", on_device),
                      (act_label(guidance), acts[guidance]), ("headroom", headroom)], vram_free, "free VRAM")
    host_need = (sizes.num_blocks - n) * sizes.block
    auto_keep = keep_in_ram is None
    keep = (ram_free >= 2 * sizes.total + RAM_RESERVE) if auto_keep else bool(keep_in_ram)
    notes = [f"{sizes.num_blocks - n} blocks ({_gb(host_need)}) stream from pinned RAM"]
    if cfg_note:
        notes.append(cfg_note)
    if mode == "auto":
        notes.insert(0, f"one expert needs {_gb(sizes.total + acts['sequential'] + headroom)}")
    if not ok:
        notes.append("WARNING: even this may not fit; reduce frames or size, or close other GPU programs")
    if ram_free < host_need + GiB:
        notes.append(f"WARNING: {_gb(ram_free)} RAM free; the streamed blocks need about {_gb(host_need + GiB)}: close "
                     "other programs, or reduce frames or size so more blocks stay on the GPU")
    name = f"block_swap {n}" + (", keep_in_ram" if keep else "")
    return plan("block_swap", keep, n, guidance, f"{prefix}{name} ({why}; {'; '.join(notes)})", ok)
