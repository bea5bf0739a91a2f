"""What the memory planners reckon with: an expert's device bytes, a forward's activation peak, the free VRAM and
RAM, the margins a plan keeps beside them, and the one-line sum a plan's reason quotes.

Both planners size things here (the experts', memory/expert_plan.py, and the Fast model's, memory/fast_planner.py),
so they count the same bytes and keep the same margins. Arithmetic on a config and a video size, apart from the two
readings of free memory.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional, Sequence, Union

import torch

from ..quant.lowp_format import FORMATS
from ..quant.nf4_format import nf4_linear_names, packed_shapes
from ..wan.dit.blocks import DEFAULT_TOKEN_CHUNK
from ..wan.dit.model import DiTConfig, WanDiT
from ..wan.sizes import token_count

WEIGHTS = ("nf4", "bf16", *FORMATS)

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


# ---- margins and words -------------------------------------------------------------------------------
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
