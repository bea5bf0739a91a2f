"""Memory modes: where the two experts live while the sampler runs (the `ExpertProvider`s of wan/sampling/sampler.py).

- resident:    both experts on the device for the whole run (loaded on first use, no reload at the switch).
- swap:        one expert on the device at a time. The released one is dropped (streamed from disk again next
               time; host RAM stays small) or, with keep_in_ram, kept in pinned host RAM for a fast switch.
- block_swap:  one expert at a time, and only its first N blocks (plus embeddings and head) on the device; the
               other blocks stream from pinned host RAM one block ahead of the compute (memory/block_swap.py).
- auto:        picks one of these from free VRAM / RAM, the expert sizes and an activation estimate for the video
               size (`plan_memory`), also the CFG mode (batch, layered or sequential), and logs the choice and why
               in one line.

`make_provider(...)` builds any of them. Nothing here imports ComfyUI.
"""
from __future__ import annotations

import gc
import logging
import math
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable, Optional, Sequence, Union

import torch
import torch.nn as nn

from ..wan.dit.blocks import DEFAULT_TOKEN_CHUNK
from ..wan.dit.model import DiTConfig, WanDiT
from ..wan.sizes import token_count
from .block_swap import BlockSwapper, _empty_part, streamed_block_keys
from ..quant.lowp_format import FORMATS
from ..quant.nf4_format import default_compute_dtype, nf4_linear_names, packed_shapes
from .pinned import WeightPart, clear_device_caches, dit_parts, free_device_memory, synchronize

_log = logging.getLogger(__name__)

MODES = ("auto", "resident", "swap", "swap_pinned", "block_swap")
WEIGHTS = ("nf4", "bf16", *FORMATS)
CFG_MODES = ("auto", "batch", "layered", "sequential")
# The CFG modes `auto` chooses from, in order of preference (speed): batch (one forward of batch 2), layered (the two
# passes one after the other inside each block: one extra fp32 residual stream), sequential (two forwards).
CFG_PREFERENCE = ("batch", "layered", "sequential")
EXPERT_NAMES = ("high", "low")

GiB = 1024**3
# Device memory kept free beyond weights + activations: CUDA/cuBLAS workspaces, the largest dequantized NF4
# weight (time_projection, 315 MB in bf16), allocator fragmentation.
VRAM_HEADROOM = int(1.0 * GiB)
# Device memory a Ulysses rank loses outside torch's allocator to NCCL (communicators, the all-to-alls' buffers) and
# the process group, unseen by the free-memory reading a plan starts from: measured 1.2-1.8 GB per rank on 2 x H100
# (nvidia-smi minus torch's reserved memory, beyond one process's 0.85 GB). With 2 GiB planned, the rank that also
# decodes still reached 22.7 GB in nvidia-smi on a 24 GB cap; 2.5 GiB keeps it at <= 22.5 GB.
SEQ_PARALLEL_VRAM = int(2.5 * GiB)
# Host RAM left to everything else (OS, T5 on the CPU, ComfyUI) before the released expert may be pinned.
RAM_RESERVE = int(8 * GiB)
# Safety factor on the analytic activation estimate (see estimate_activation_bytes; checked by the benchmark).
ACTIVATION_SAFETY = 1.10

Log = Callable[[str], None]
Loader = Callable[..., nn.Module]
PathLike = Union[str, Path]


# ---- sizes ----------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class ExpertSizes:
    """Bytes of one expert on the device: total, everything outside the blocks, and one block."""

    total: int
    base: int
    block: int
    num_blocks: int


def _nf4_linear_bytes(out_f: int, in_f: int) -> int:
    shapes = packed_shapes(out_f, in_f)
    # codes and absmax are uint8; quant_map, nested absmax/map and the offset are float32
    return math.prod(shapes[""]) + math.prod(shapes["absmax"]) + 4 * (
        math.prod(shapes["quant_map"]) + math.prod(shapes["nested_absmax"]) + math.prod(shapes["nested_quant_map"]) + 1
    )


def expert_sizes(cfg: DiTConfig, weights: str = "nf4", compute_bytes: int = 2) -> ExpertSizes:
    """Device bytes of one expert from its config (NF4 packed weights + statistics, or FP8 / INT8 weights at 1 byte
    each + a float32 scale per output channel; other tensors in the compute dtype; bf16 mode: everything 2 bytes)."""
    if weights not in WEIGHTS:
        raise ValueError(f"weights {weights!r}: choose one of {WEIGHTS}")
    meta = WanDiT(cfg, device="meta")
    linears = set(nf4_linear_names(cfg.num_layers)) if weights != "bf16" else set()
    linear_bytes = FORMATS[weights].linear_bytes if weights in FORMATS else _nf4_linear_bytes
    base = block = 0
    for key, p in meta.named_parameters():
        if key.endswith(".weight") and key[:-7] in linears:
            n = linear_bytes(*p.shape)
        else:
            n = p.numel() * (2 if weights == "bf16" else compute_bytes)
        if key.startswith("blocks.0."):
            block += n
        elif not key.startswith("blocks."):
            base += n
    return ExpertSizes(base + block * cfg.num_layers, base, block, cfg.num_layers)


def estimate_activation_bytes(
    frames: int,
    height: int,
    width: int,
    cfg: DiTConfig,
    cfg_batch: bool,
    *,
    camera: bool = True,
    compute_bytes: int = 2,
    token_chunk: Optional[int] = DEFAULT_TOKEN_CHUNK,
    seq_parallel: int = 1,
    layered: bool = False,
) -> int:
    """Peak device bytes of one DiT forward beyond the weights, from the shapes of wan/dit/blocks.py (batch 1 or 2).

    Per token (L = F_lat*lat_h*lat_w/4, d = dim, f = ffn_dim, c = compute dtype bytes, B = 1 or 2 with batched CFG):
      whole forward:   residual x fp32 (4d B), camera tokens (c d, batch 1), the Plücker input (4 cells x 384 fp32),
                       RoPE tables, latents and the sampler's state;
    then the largest of the block's phases:
      attention:       q, k, v and the attention output in the compute dtype (4 c d B per token);
      building q/k/v:  3 c d B per token plus one chunk's input, projections and fp32 norm/RoPE rows (8d + 2cd);
      per-token work:  one chunk of fp32 rows (norm, modulation, gated residual: 12d) and the FFN hidden before
                       and after GELU (2 c f) — cross-attention, camera FiLM, FFN and head run chunk by chunk.
    token_chunk=None means the whole sequence at once. Checked on an H100 at 464x832x81 (bench/bench_pipeline.py):
    2.62 GB measured / 2.66 GB estimated with 8192-token chunks, 4.88 / 4.86 GB unchunked, 4.93 / 4.80 GB batched;
    ACTIVATION_SAFETY and VRAM_HEADROOM cover the rest.
    seq_parallel N (parallel/ulysses.py): the rank holds n = L/N tokens; the per-token work scales with n, the
    attention phase holds q/k/v of its tokens, their all-to-all copies (all tokens, H/N heads: as many bytes), the
    output and the all-to-all buffer (7 c d B per local token); the inputs (latents, control tensor) stay whole.
    layered (layered CFG, cfg_batch False): sequential + the second sample's fp32 residual stream (4 d per local
    token: 0.65 GB at 464x832x81) + its text context; every phase's temporaries are one sample's, as sequential.
    """
    if layered and cfg_batch:
        raise ValueError("layered CFG runs batch-1 phases: pass cfg_batch=False with layered=True")
    tokens = token_count(frames, height, width)
    local = -(-tokens // max(1, int(seq_parallel)))
    b = 2 if cfg_batch else 1
    d, f, c = cfg.dim, cfg.ffn_dim, compute_bytes
    cells = 4  # latent cells per token (2x2 patch)
    streams = 2 if (cfg_batch or layered) else 1
    per_local = streams * 4 * d  # the fp32 residual stream(s) of this rank's tokens
    whole = 4 * cfg.head_dim + cells * 4 * (16 * 8 + 20)  # RoPE tables, latents, the sampler's state
    if camera:
        per_local += c * d  # camera tokens
        whole += cfg.control_in * 4  # control tensor fp32: 4 cells x 384 (camera) or 448 (act)
    chunk = local if not token_chunk else min(token_chunk, local)
    attention = b * 4 * c * d * tokens if local == tokens else b * 7 * c * d * local
    build_qkv = b * 3 * c * d * local + b * chunk * (8 * d + 2 * c * d)
    per_token_work = b * chunk * (12 * d + 2 * c * f)
    # one-off: text context through text_embedding, [B, 512, d] a few times
    text = streams * cfg.text_len * (cfg.text_dim * 4 + 4 * d * c)
    return int(local * per_local + tokens * whole + max(attention, build_qkv, per_token_work) + text)


def free_vram_bytes(device: Union[str, torch.device] = "cuda") -> int:
    """Device bytes this process can still use: free memory plus its own cached blocks, capped by
    `torch.cuda.set_per_process_memory_fraction` when one is set."""
    device = torch.device(device)
    if device.type != "cuda":
        return 0
    if device.index is None:  # the memory-fraction getter wants an index
        device = torch.device("cuda", torch.cuda.current_device())
    free, total = torch.cuda.mem_get_info(device)
    allocated = torch.cuda.memory_allocated(device)
    avail = free + torch.cuda.memory_reserved(device) - allocated
    getter = getattr(torch.cuda, "get_per_process_memory_fraction", None)
    if getter is not None:
        frac = getter(device)
        if frac < 1.0:
            avail = min(avail, int(frac * total) - allocated)
    return max(0, int(avail))


def available_ram_bytes() -> int:
    """Host RAM available to new allocations (MemAvailable)."""
    try:
        import psutil

        return int(psutil.virtual_memory().available)
    except ImportError:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    raise RuntimeError("cannot read the available host RAM (no psutil, no /proc/meminfo)")


# ---- the plan -------------------------------------------------------------------------------------------
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


def _gb(n: float) -> str:
    return f"{n / 1e9:.1f} GB"


def _fits_line(parts: Sequence[tuple[str, int]], budget: Optional[int], what: str) -> str:
    total = sum(n for _, n in parts)
    terms = " + ".join(f"{label} {_gb(n)}" for label, n in parts if n)  # a zero term (no headroom on the CPU) says nothing
    if budget is None:  # the CPU computes: no device budget to compare with
        return f"{terms} = {_gb(total)} in host RAM (CPU run, no VRAM)"
    sign = "<=" if total <= budget else ">"
    return f"{terms} = {_gb(total)} {sign} {_gb(budget)} {what}"


def vram_headroom(seq_parallel: int = 1) -> int:
    """Device bytes a plan keeps free beyond weights, caches and activations (a Ulysses rank: NCCL's too)."""
    return VRAM_HEADROOM + (SEQ_PARALLEL_VRAM if int(seq_parallel) > 1 else 0)


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


# ---- providers ------------------------------------------------------------------------------------------
def _default_loader(path, device, mode, compute_dtype, host=None):
    from ..loaders.expert_loader import load_expert

    return load_expert(path, device=device, mode=mode, compute_dtype=compute_dtype, host=host)


def _as_log(log) -> Log:
    if log is None:
        return _log.info
    if isinstance(log, logging.Logger):
        return log.info
    return log


class PlacementProvider:
    """Shared parts of the providers: paths, loading with timing, events for benchmarks, close()."""

    mode = "?"

    def __init__(
        self,
        paths: dict[str, PathLike],
        device: Union[str, torch.device] = "cuda",
        weights: str = "nf4",
        compute_dtype: Optional[torch.dtype] = None,
        log: Optional[Union[Log, logging.Logger]] = None,
        loader: Optional[Loader] = None,
        plan: Optional[MemoryPlan] = None,
        prepare: Optional[Callable[[nn.Module], object]] = None,
    ):
        missing = [n for n in EXPERT_NAMES if n not in paths]
        if missing:
            raise ValueError(f"no path for the {', '.join(missing)}-noise expert")
        if weights not in WEIGHTS:
            raise ValueError(f"weights {weights!r}: choose one of {WEIGHTS}")
        self.paths = {n: paths[n] for n in EXPERT_NAMES}
        self.device = torch.device(device)
        if self.device.type == "cuda" and self.device.index is None and torch.cuda.is_available():
            self.device = torch.device("cuda", torch.cuda.current_device())
        self.weights = weights
        self.compute_dtype = compute_dtype or (torch.bfloat16 if weights == "bf16" else default_compute_dtype(self.device))
        self.log = _as_log(log)
        self.loader = loader or _default_loader
        self.plan = plan
        self.prepare = prepare  # called on every expert placed on the device (speed options)
        self.events: list[dict] = []  # one per acquire/release: op, name, source, seconds

    def _load(self, name: str, device: torch.device, **kw) -> nn.Module:
        t0 = time.perf_counter()
        model = self.loader(self.paths[name], device=device, mode=self.weights, compute_dtype=self.compute_dtype, **kw)
        synchronize(device)
        dt = time.perf_counter() - t0
        info = getattr(model, "load_info", None)
        self.log(f"{name}-noise expert loaded from disk {load_words(device, dt, info)}")
        return model

    def _prepare(self, model: nn.Module) -> nn.Module:
        if self.plan is not None and self.plan.token_chunk is not None and hasattr(model, "set_token_chunk"):
            model.set_token_chunk(self.plan.token_chunk)
        if self.prepare is not None:
            self.prepare(model)
        return model

    def _event(self, op: str, name: str, source: str, t0: float) -> None:
        synchronize(self.device)
        rec = {"op": op, "name": name, "source": source, "seconds": time.perf_counter() - t0}
        if self.device.type == "cuda":
            rec["allocated_after"] = torch.cuda.memory_allocated(self.device)
        self.events.append(rec)

    def close(self) -> None:
        """Free every expert (device and host copies)."""

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class ResidentProvider(PlacementProvider):
    """Both experts stay on the device once loaded."""

    mode = "resident"

    def __init__(self, *args, **kw):
        super().__init__(*args, **kw)
        self.models: dict[str, nn.Module] = {}

    def acquire(self, name: str) -> nn.Module:
        t0 = time.perf_counter()
        source = "resident"
        if name not in self.models:
            self.models[name] = self._prepare(self._load(name, self.device))
            source = "disk"
        self._event("acquire", name, source, t0)
        return self.models[name]

    def release(self, name: str) -> None:
        self.events.append({"op": "release", "name": name, "source": "kept", "seconds": 0.0})

    def close(self) -> None:
        self.models.clear()
        free_device_memory(self.device)


class SwapProvider(PlacementProvider):
    """One expert on the device at a time; the released one is dropped or kept in pinned host RAM."""

    mode = "swap"

    def __init__(self, *args, keep_in_ram: bool = False, **kw):
        super().__init__(*args, **kw)
        self.keep_in_ram = keep_in_ram
        self.active: Optional[str] = None
        self.model: Optional[nn.Module] = None
        self.kept: dict[str, tuple[nn.Module, list[WeightPart]]] = {}  # name -> model with host copies

    def acquire(self, name: str) -> nn.Module:
        if self.active == name:
            return self.model
        if self.active is not None:
            self.release(self.active)  # the one-at-a-time promise holds even if a caller forgets to release
        t0 = time.perf_counter()
        if name in self.kept:
            model, parts = self.kept[name]
            for p in parts:
                p.to_device(self.device)
            source = "ram"
            synchronize(self.device)
            self.log(f"{name}-noise expert restored from pinned RAM in {time.perf_counter() - t0:.2f} s")
        else:
            model = self._load(name, self.device)
            source = "disk"
        self.model, self.active = self._prepare(model), name
        self._event("acquire", name, source, t0)
        return model

    def release(self, name: str) -> None:
        if self.active != name:
            return
        t0 = time.perf_counter()
        model, self.model, self.active = self.model, None, None
        if self.keep_in_ram:
            parts = self.kept[name][1] if name in self.kept else dit_parts(model)
            for p in parts:
                p.to_host(pin=True)
            clear_device_caches(model)
            self.kept[name] = (model, parts)
            source = "to_ram"
        else:
            _drop_model(model)
            source = "dropped"
        del model
        free_device_memory(self.device)
        self._event("release", name, source, t0)

    def close(self) -> None:
        if self.active is not None:
            model, self.model, self.active = self.model, None, None
            _drop_model(model)
            del model
        for model, parts in self.kept.values():
            for p in parts:
                _empty_part(p)
        self.kept.clear()
        free_device_memory(self.device)


class BlockSwapProvider(PlacementProvider):
    """One expert at a time with only `blocks_on_gpu` blocks resident; the rest stream from pinned RAM."""

    mode = "block_swap"

    def __init__(self, *args, blocks_on_gpu: int = 0, keep_in_ram: bool = False, **kw):
        super().__init__(*args, **kw)
        if not isinstance(blocks_on_gpu, int) or isinstance(blocks_on_gpu, bool) or blocks_on_gpu < 0:
            raise ValueError(f"blocks_on_gpu must be an integer >= 0, got {blocks_on_gpu!r}")
        self.blocks_on_gpu = blocks_on_gpu
        self.keep_in_ram = keep_in_ram
        self.active: Optional[str] = None
        self.model: Optional[nn.Module] = None
        self.swapper: Optional[BlockSwapper] = None
        self.kept: dict[str, tuple[nn.Module, list[WeightPart]]] = {}
        self.last_stats: dict = {}

    def acquire(self, name: str) -> nn.Module:
        if self.active == name:
            return self.model
        if self.active is not None:
            self.release(self.active)
        t0 = time.perf_counter()
        if name in self.kept:
            model, parts = self.kept.pop(name)
            source = "ram"
        else:
            # Base and blocks 0..N-1 straight to the device, the streamed blocks to host memory (then pinned).
            model, parts = self._load(name, self.device, host=streamed_block_keys(self.blocks_on_gpu)), None
            source = "disk"
        self.swapper = BlockSwapper(model, self.device, self.blocks_on_gpu, parts=parts, pin=True).install()
        self.model, self.active = self._prepare(model), name
        self.log(
            f"{name}-noise expert placed for block swap: {self.swapper.resident}/{self.swapper.num_blocks} blocks on "
            f"{self.device}, the rest streamed from pinned RAM ({time.perf_counter() - t0:.1f} s)"
        )
        self._event("acquire", name, source, t0)
        return model

    def release(self, name: str) -> None:
        if self.active != name:
            return
        t0 = time.perf_counter()
        self.last_stats = self.swapper.stats()
        parts = self.swapper.remove(keep_host=self.keep_in_ram)
        model, self.model, self.active, self.swapper = self.model, None, None, None
        if self.keep_in_ram:
            self.kept[name] = (model, parts)
        del model, parts
        free_device_memory(self.device)
        self._event("release", name, "to_ram" if self.keep_in_ram else "dropped", t0)

    def close(self) -> None:
        if self.active is not None:
            self.swapper.remove(keep_host=False)
            self.model, self.active, self.swapper = None, None, None
        for model, parts in self.kept.values():
            for p in parts:
                _empty_part(p)
        self.kept.clear()
        free_device_memory(self.device)


def _drop_model(model: nn.Module) -> None:
    """Cut the model's tensors loose now (callers may still hold the module object)."""
    for p in dit_parts(model):
        _empty_part(p)
    clear_device_caches(model)
    gc.collect()


# ---- the factory ----------------------------------------------------------------------------------------
def read_expert_config(path: PathLike) -> DiTConfig:
    from ..loaders.expert_format import detect_format

    return detect_format(path).config


def make_provider(
    mode: str,
    high_path: PathLike,
    low_path: PathLike,
    device: Union[str, torch.device] = "cuda",
    weights: str = "nf4",
    keep_in_ram: Optional[bool] = None,
    blocks_on_gpu: Optional[int] = None,
    *,
    video: Optional[tuple[int, int, int]] = None,
    cfg_mode: str = "auto",
    camera: bool = True,
    compute_dtype: Optional[torch.dtype] = None,
    token_chunk: Optional[int] = DEFAULT_TOKEN_CHUNK,
    vram_free: Optional[int] = None,
    ram_free: Optional[int] = None,
    log: Optional[Union[Log, logging.Logger]] = None,
    loader: Optional[Loader] = None,
    prepare: Optional[Callable[[nn.Module], object]] = None,
    seq_parallel: int = 1,
) -> PlacementProvider:
    """Build the ExpertProvider for a memory mode ("auto", "resident", "swap", "swap_pinned", "block_swap").

    video: (frames, height, width) of the generation; needed by "auto" and by "block_swap" without
    blocks_on_gpu, and used to decide the CFG mode, batch / layered / sequential (`provider.plan.cfg_mode`, to pass to
    SamplingSettings when the user chose "auto"). keep_in_ram: None = decide from free RAM (swap, block_swap).
    prepare: called with every expert placed on the device (e.g. `speed.options.apply_speed`).
    vram_free / ram_free: override the measured free memory (tests, simulated cards).
    seq_parallel: ranks splitting each forward's tokens (parallel/ulysses.py); activations are planned for this
    rank's share.
    The chosen plan is on `provider.plan` and is logged in one line.
    """
    if mode not in MODES:
        raise ValueError(f"memory mode {mode!r}: choose one of {', '.join(MODES)}")
    device = torch.device(device)
    needs_video = mode == "auto" or (mode == "block_swap" and blocks_on_gpu is None)
    if needs_video and video is None:
        raise ValueError(f"memory mode {mode!r} needs video=(frames, height, width) to size the activations")
    cfg = read_expert_config(high_path)
    plan = None
    if video is not None:
        if vram_free is None and device.type == "cuda":
            vram_free = free_vram_bytes(device)  # on the CPU it stays None: no device budget
        if ram_free is None:
            ram_free = available_ram_bytes()
        cdt = compute_dtype or (torch.bfloat16 if weights == "bf16" else default_compute_dtype(device))
        plan = plan_memory(
            video, cfg, vram_free, ram_free, weights=weights, mode=mode, keep_in_ram=keep_in_ram,
            blocks_on_gpu=blocks_on_gpu, cfg_mode=cfg_mode, camera=camera,
            compute_bytes=torch.empty(0, dtype=cdt).element_size(), token_chunk=token_chunk,
            seq_parallel=seq_parallel,
        )
    else:
        name = "swap" if mode == "swap_pinned" else mode
        keep = True if mode == "swap_pinned" else bool(keep_in_ram)
        plan = MemoryPlan(name, keep, blocks_on_gpu, cfg_mode == "batch", f"requested: {name}", token_chunk,
                          cfg_layered=cfg_mode == "layered")
    _as_log(log)(f"memory plan: {plan.reason}")

    common = dict(paths={"high": high_path, "low": low_path}, device=device, weights=weights,
                  compute_dtype=compute_dtype, log=log, loader=loader, plan=plan, prepare=prepare)
    if plan.mode == "resident":
        return ResidentProvider(**common)
    if plan.mode == "swap":
        return SwapProvider(**common, keep_in_ram=plan.keep_in_ram)
    return BlockSwapProvider(**common, blocks_on_gpu=int(plan.blocks_on_gpu or 0), keep_in_ram=plan.keep_in_ram)


def load_words(device: torch.device, seconds: float, info=None) -> str:
    """"into RAM in 0.1 s (2.3 MB, 21 MB/s)" / "to cuda:0 in 4.1 s (9.61 GB, 2.35 GB/s)": where a load put the
    weights, in units that say something for a tiny model too."""
    where = "into RAM" if torch.device(device).type == "cpu" else f"to {device}"
    if info is None or not info.bytes_read:
        return f"{where} in {seconds:.1f} s"
    size, rate = info.bytes_read, info.bytes_read / info.seconds if info.seconds > 0 else None
    return f"{where} in {seconds:.1f} s ({_amount(size)}" + (f", {_amount(rate)}/s)" if rate else ")")


def _amount(n: float) -> str:
    return f"{n / 1e9:.2f} GB" if n >= 1e9 else f"{n / 1e6:.1f} MB"
