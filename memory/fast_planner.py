"""Where the Fast model and its K/V cache go (`plan_fast_memory`): a FastMemoryPlan decided from free VRAM / RAM, the
video size and the cache layout (window, max attention).

The cache of the released pipeline holds the whole video: 40 layers x K and V x 32,760 tokens x 5120 x 2 B =
26.8 GB at 480x832x81 in bf16. Placements:
- cache "gpu":  every layer on the device (the reference's layout; needs model + cache + activations);
- cache "host": the first N layers on the device, the rest in pinned host RAM, each streamed to the device one
                layer ahead of the compute through two one-layer device buffers (memory/kv_stream.py). N is as
                many as fit; host RAM holds exactly the other layers (nothing else is copied);
- the model itself is resident, or block-swapped (memory/block_swap.py) on cards too small for it.
Each layer's text K/V (0.4 GB for all layers) are kept when they fit, else recomputed every call (same values).
The camera FiLM of a chunk (wan/dit/film_cache.py: each block's (1 + scale, shift), 96 MB per block at 480x832) is
the same in all of the chunk's model calls; the blocks it fits for keep it on the device for the chunk, so 4 of
their 10 GEMMs on the video tokens run once per chunk instead of once per call (the same bits). It takes only the
room the model and the cache layers leave. A cache layer given up for it would buy about 8 blocks' FiLM, 1-3 % of
a 24 GB card's chunk, and pin 0.5-0.8 GB more RAM (measured on an H100, bench/results/fast_*film*_h100.json),
and RAM is what a 32 GB machine runs short of first. The blocks the device has no room for keep theirs in pinned
RAM (memory/film_stream.py) when RAM has room beside the pinned cache and RAM_RESERVE: written once per chunk,
streamed back ahead of the blocks in its later calls, through two blocks' device buffers. Last, where the card still
has room for the GEMM weights every call multiplies, as their GEMMs take them (memory/resident_weights.py: 2 bytes
per weight in bf16, 1 and a scale per row in FP8 / INT8), they are kept there instead of prepared from NF4 at every
call: the v2 1.3B's 2.5 GB in bf16 on a 24 GB card; never the 14B's 24 GB on 24 GB. Coming after the FiLM, they
are kept only where every block's FiLM is (its 4 camera layers then run once per chunk, and are not kept).

The plan counts with the expert planner's estimates and margins (memory/estimates.py) and says why in one line; it
refuses with the numbers when the cache cannot fit even in host RAM, before anything is allocated. A pure function
of its arguments (tested with made-up numbers); memory/kv_placement.py carries a plan out. Nothing here imports
ComfyUI.
"""
from __future__ import annotations

from typing import Optional

from ..wan.dit.blocks import DEFAULT_TOKEN_CHUNK
from ..wan.dit.kv_cache import CacheLayout
from ..wan.dit.model import DiTConfig
from ..wan.sizes import VAE_TEMPORAL_STRIDE, latent_size
from .camera_cache import film_block_bytes
from .estimates import (ACTIVATION_SAFETY, RAM_RESERVE, WEIGHTS, _fits_line, _gb, estimate_activation_bytes,
                        expert_sizes, vram_headroom)
from .fast_plan import FastMemoryError, FastMemoryPlan
from .resident_weights import resident_weight_bytes

CACHE_PLACEMENTS = ("auto", "gpu", "host")
# Host RAM that must stay free beside the pinned cache (page-locked memory cannot be swapped out).
RAM_MARGIN = 2 * 1024**3
# Device memory left unused when streamed parts (cache layers, or model blocks with larger weights) would fill the
# card: a streamed layer or block costs only PCIe traffic that overlaps the compute, so the last ones are not worth
# the desktop's or ComfyUI's previews' memory. 3 GiB keeps a 24 GB card at <= 22.5 GB in nvidia-smi with NF4 and
# with FP8 weights (measured on an H100 capped at 24 GiB: 2.5 GiB left FP8 weights' block swap at 23.0 GB, the
# allocator's rounding and the CUDA context on top of the plan).
CACHE_VRAM_SPARE = int(3 * 1024**3)
SPARE_REFERENCE_DIM = 5120  # the 14B's width, which the 3 GiB were measured for


def cache_vram_spare(cfg) -> int:
    """The spare for a model of `cfg`: 3 GiB for the 14B models, less for a narrower one in proportion to its width
    (the allocator's rounding and the fragments it leaves scale with the tensors' width: the 1.3B's 1536 keep
    0.9 GiB, which lets its whole window sit on an 8 GB card at 304x528)."""
    return int(CACHE_VRAM_SPARE * min(1.0, cfg.dim / SPARE_REFERENCE_DIM))
# The CUDA graphs' memory pool (speed/block_graphs.py, opted in) keeps one block's scratch memory beside the
# allocator's: measured +0.92 GB reserved at 480x832 on an H100 against an activation estimate of 0.84 GB.
GRAPH_POOL_FACTOR = 1.25
# Device buffers the camera FiLM kept in pinned RAM streams through. Two: a block's copy starts a whole block before
# its values are read, so it hides under the compute beside the K/V stream. With one, a played `draft` chunk's DiT
# switched between 1.14 and 1.40 s from one stretch of chunks to the next (1.22 s with the device's blocks alone);
# with two, on another H100, it stayed at 1.13-1.32 s (24 GB cap, bench/results/play_draft_film_host*_h100.json).
FILM_HOST_SLOTS = 2
# Device memory the allocator reserves beyond the plan when the FiLM streams from RAM: a played video reserved
# 0.41 (`draft`) to 0.55 GB (`auto`) more than with the device's blocks alone for the same planned bytes (H100,
# 24 GB cap; likely the values written to RAM, freed only once their copy is done, and the calls' other order of
# allocations). The plan sets it aside from the cache layers' and the device blocks' room; so planned, a played
# `auto` video reserved 21.29 GB instead of 22.06 GB and nvidia-smi read 22.2 GB, flat over 136 chunks
# (bench/results/play_auto_long_final_h100.json).
FILM_HOST_SLACK = int(0.55e9)


def chunk_frames_pixels(chunk_latent_frames: int = 3) -> int:
    """Video frames whose latent is one chunk (9 for 3 latent frames): what the activation estimate is sized for."""
    return VAE_TEMPORAL_STRIDE * (chunk_latent_frames - 1) + 1


def plan_fast_memory(
    height: int,
    width: int,
    cfg: DiTConfig,
    layout: CacheLayout,
    vram_free: Optional[int],
    ram_free: int,
    *,
    weights: str = "nf4",
    cache: str = "auto",
    cache_layers_on_gpu: Optional[int] = None,
    blocks_on_gpu: Optional[int] = None,
    camera: bool = True,
    compute_bytes: int = 2,
    token_chunk: Optional[int] = DEFAULT_TOKEN_CHUNK,
    extra_vram: int = 0,
    seq_parallel: int = 1,
    graphs: bool = False,
    camera_film: bool = True,
    film_host: bool = True,
    kv_fp8: bool = False,
    kv_codes_on_gpu: Optional[bool] = None,
    compute: str = "bf16",
    resident_weights: bool = True,
) -> FastMemoryPlan:
    """Where the model, the K/V cache and the text K/V go (a pure function of its arguments; tested with made-up
    numbers). cache "auto" keeps the whole cache on the device when it fits, else streams it from host RAM with as
    many layers on the device as fit. extra_vram: other device memory the run needs (a VAE for previews).
    vram_free=None means the CPU computes: the model and the whole cache live in host RAM (no device budget; the
    plan says so, like the experts' planner). seq_parallel N (parallel/ulysses.py): this rank caches H/N heads and
    computes 1/N of each chunk's tokens. graphs: the blocks replay CUDA graphs once a window rolls (their pool is
    counted when the layout has a rolling window). camera_film=False: no camera FiLM cache (A/B benchmarks).
    film_host=False: only the blocks whose FiLM fits on the device keep it (A/B benchmarks; and with graphs, which
    replay over the device's values); else the others keep theirs in pinned RAM when it has room beside
    everything else pinned and RAM_RESERVE. kv_fp8 (the `fast` and `draft` presets' lever): the cache holds
    FP8-rounded K/V; its layers in RAM take half the bytes (codes and one exponent per token and head) and stream
    through one more device buffer of that size, where they are decoded. When RAM is short (the layers left for
    pinned RAM would leave less than RAM_RESERVE beside them), the layers the card keeps are FP8 codes too: half
    the bytes, so about twice as many stay and about half as much RAM is pinned, as many in bf16 as the room then
    still holds. Each is decoded before its block, which costs GPU time: on H100s a rolled
    `draft --chunk-steps 2 --tiny-vae` chunk took 0.4-6.0 % longer with them (3.9 % in the mean of five pairs; RSS
    9.4 against 12.5 GB; bench/results/fast_*_kv_codes_*h100.json), so a machine with RAM to spare keeps bf16.
    kv_codes_on_gpu: None decides so; True keeps codes whenever the cache streams, False never (benchmarks' A/B).
    compute: the NF4 linears' GEMM mode (the speed plan's "bf16", "fp8", "int8" or "fp16acc"): when the card has room
    for every block's prepared GEMM weights in it after everything else and the spare, they are kept
    (memory/resident_weights.py; all or none, never with block swap or on the CPU); resident_weights=False: never
    (benchmarks' A/B).
    Raises FastMemoryError when the streamed layers do not fit in host RAM either (saying so when an FP8 cache
    would fit).
    """
    args = dict(locals())  # the arguments only: the same plan with an FP8 cache, for the error's way out
    if cache not in CACHE_PLACEMENTS:
        raise ValueError(f"cache placement {cache!r}: choose one of {CACHE_PLACEMENTS}")
    if weights not in WEIGHTS:
        raise ValueError(f"weights {weights!r}: choose one of {WEIGHTS}")
    latent_size(height, width)
    n_layers = cfg.num_layers
    sizes = expert_sizes(cfg, weights, compute_bytes)
    chunk_pixels = chunk_frames_pixels(layout.chunk_frames)
    acts = int(estimate_activation_bytes(chunk_pixels, height, width, cfg, False, camera=camera,
                                         compute_bytes=compute_bytes, token_chunk=token_chunk,
                                         seq_parallel=seq_parallel) * ACTIVATION_SAFETY)
    heads = cfg.num_heads // max(1, int(seq_parallel))
    headroom = vram_headroom(seq_parallel)
    cache_heads = heads if heads != cfg.num_heads else None
    layer = layout.layer_bytes(heads, cfg.head_dim, compute_bytes)
    host_layer = layout.fp8_layer_bytes(heads, cfg.head_dim) if kv_fp8 else layer  # one streamed layer in RAM
    text = n_layers * 2 * cfg.text_len * cfg.dim * compute_bytes
    resident = resident_weight_bytes(cfg, compute, compute_bytes) if weights == "nf4" and resident_weights else 0
    whole_cache = n_layers * layer
    cpu = vram_free is None
    film_on = camera and camera_film
    film_host = film_host and not graphs  # the graphs replay over FiLM kept on the device only
    # one block's FiLM for this rank's tokens of a chunk
    film = film_block_bytes((chunk_pixels, height, width), cfg, compute_bytes, seq_parallel) if film_on else 0
    est = {"film_block_bytes": film, "num_layers": n_layers, "model_bytes": sizes.total, "block_bytes": sizes.block,
           "cache_layer_bytes": layer, "cache_bytes": whole_cache, "text_kv_bytes": text, "activation_bytes": acts,
           "extra_vram": int(extra_vram), "vram_free": None if cpu else int(vram_free), "ram_free": int(ram_free),
           "headroom": 0 if cpu else headroom, "cache_tokens": layout.capacity, "host_layer_bytes": host_layer,
           "resident_weight_bytes": resident}
    size_txt = f"{width}x{height}, chunks of {chunk_pixels} frames"
    acts_label = f"activations ({size_txt})"
    prefix = "auto: " if cache == "auto" else "requested: "
    extra = [("preview VAE", int(extra_vram))] if extra_vram else []
    pool = int(acts * GRAPH_POOL_FACTOR) if graphs and layout.evict else 0
    if pool:
        extra.append(("CUDA graphs", pool))
        est["graph_pool_bytes"] = pool

    if cpu:  # host RAM holds everything: one layout whatever was asked (nothing to stream to)
        parts = [("model", sizes.total), ("K/V cache", whole_cache), ("text K/V", text), (acts_label, acts)] + extra
        need = sum(n for _, n in parts)
        ok = need <= ram_free - RAM_MARGIN
        films = _film_blocks(ram_free - RAM_MARGIN - need, film, n_layers) if ok else 0
        note = "" if ok else f"; WARNING: only {_gb(ram_free)} RAM available: use fewer frames, a smaller size or a window"
        return FastMemoryPlan("gpu", n_layers, True, None, layout,
                              f"the model and the K/V cache in RAM: {_fits_line(parts, None, '')}{note}"
                              f"{_film_note(films, film, n_layers, where='in RAM')}", ok, token_chunk, est, cache_heads,
                              films,
                              kv_fp8=kv_fp8)

    vram = int(vram_free) - int(extra_vram) - pool

    gpu_parts = [("model", sizes.total), ("K/V cache", whole_cache), ("text K/V", text), (acts_label, acts),
                 ("headroom", headroom)] + extra
    gpu_need = sum(n for _, n in gpu_parts)
    # auto keeps the spare here too: a cache that would fill the card's last spare streams a few layers
    spare_vram = cache_vram_spare(cfg)
    if cache == "gpu" or (cache == "auto" and gpu_need + spare_vram <= vram_free):
        ok = gpu_need <= vram_free
        note = "" if ok else "; WARNING: it may not fit: use cache 'auto' or 'host', a window, or fewer frames"
        films, hosted, slots = _film_places(vram_free - gpu_need - spare_vram if ok else 0, film, n_layers,
                                            ram_free - RAM_RESERVE if film_host else 0)
        staging = _film_buffer_bytes(slots, film)
        # the GEMM weights take what everything else leaves
        keep = ok and 0 < resident <= vram_free - gpu_need - spare_vram - films * film - staging
        kept = [(_resident_label(compute, compute_bytes), resident)] if keep else []
        why = _fits_line(gpu_parts + kept, vram_free, "free VRAM")
        on_device = gpu_need - sum(n for _, n in extra) + films * film + staging + (resident if keep else 0)
        est.update(film_host_bytes=hosted * film, film_buffer_slots=slots, film_buffer_bytes=staging,
                   device_bytes=on_device)  # the plan's own: the decoder and the graphs' pool are `extra`
        return FastMemoryPlan("gpu", n_layers, True, None, layout, f"{prefix}K/V cache on the GPU ({why}){note}"
                              f"{_film_note(films, film, n_layers, hosted)}{_resident_note(keep, resident)}", ok,
                              token_chunk, est, cache_heads, films, hosted, kv_fp8, resident_weights=keep)

    # Host: the model (or its resident blocks), two one-layer buffers and as many cache layers as fit. What can
    # stream (model blocks, cache layers, the text K/V by recomputing) fills the card up to `room` only.
    room = vram - spare_vram
    ring = 2 * layer + (host_layer if kv_fp8 else 0)  # + the FP8 codes' staging buffer
    model_bytes, blocks = sizes.total, blocks_on_gpu
    if blocks is None and sizes.total + ring + acts + headroom > room:
        spare = room - headroom - acts - ring - sizes.base - 2 * sizes.block
        blocks = max(0, min(sizes.num_blocks, spare // sizes.block if sizes.block else 0))
    if blocks is not None and blocks >= sizes.num_blocks:
        blocks = None
    if blocks is not None:
        model_bytes = sizes.base + (blocks + 2) * sizes.block
    fixed = model_bytes + ring + acts + headroom
    cache_text = fixed + text <= room
    spare = room - fixed - (text if cache_text else 0)
    host_weights = (sizes.num_blocks - blocks) * sizes.block if blocks is not None else 0

    def ram_left(layers_on_gpu: int) -> int:  # the RAM beside everything pinned and the reserve
        return ram_free - RAM_RESERVE - (n_layers - layers_on_gpu) * host_layer - host_weights

    def film_ram(layers_on_gpu: int) -> int:
        return ram_left(layers_on_gpu) if film_host else 0

    code = host_layer  # an FP8 layer kept on the device as codes

    def layers(room_left: int, as_codes: bool) -> tuple[int, int]:
        """(cache layers on the device, how many of them as FP8 codes) in `room_left`."""
        if cache_layers_on_gpu is not None:
            return max(0, min(int(cache_layers_on_gpu), n_layers)), 0
        if not layer:
            return n_layers, 0
        if not as_codes:
            return max(0, min(n_layers, room_left // layer)), 0
        if room_left < n_layers * code:  # not every layer fits as codes: as many as fit, all as codes
            n_codes = max(0, room_left // code)
            return n_codes, n_codes
        in_bf16 = min(n_layers, (room_left - n_layers * code) // (layer - code))
        return n_layers, n_layers - in_bf16

    def layer_bytes(on: tuple[int, int]) -> int:
        return (on[0] - on[1]) * layer + on[1] * code

    def place_layers(as_codes: bool) -> tuple[int, int]:
        # The buffers the host-kept FiLM streams through and their slack come before the cache layers: 0.74 GB at
        # 480x832 keeps every block's FiLM where a cache layer (0.67 GB) only saves link traffic. Device FiLM
        # blocks take what the layers leave.
        on = layers(spare, as_codes)
        if film and film_ram(on[0]) > FILM_HOST_SLOTS * film \
                and _film_blocks(spare - layer_bytes(on), film, n_layers) < n_layers:
            on = layers(spare - _film_buffer_bytes(FILM_HOST_SLOTS, film), as_codes)
        return on

    on = place_layers(False)
    ram_short = ram_left(on[0]) < 0
    codes_wanted = ram_short if kv_codes_on_gpu is None else kv_codes_on_gpu
    if kv_fp8 and codes_wanted and cache_layers_on_gpu is None and on[0] < n_layers:
        on = place_layers(True)  # RAM is short: the card keeps its layers as codes, about twice as many
    n, n_codes = on
    host_cache = (n_layers - n) * host_layer
    host_need = host_cache + host_weights
    films, hosted, slots = _film_places(spare - layer_bytes(on), film, n_layers, film_ram(n))
    staging = _film_buffer_bytes(slots, film)
    on_device = fixed + layer_bytes(on) + (text if cache_text else 0) + films * film + staging
    ok = on_device <= vram
    keep = ok and blocks is None and 0 < resident <= room - on_device  # what the cache layers and the FiLM leave
    on_device += resident if keep else 0
    est.update(host_bytes=host_need, cache_layers_on_gpu=n, device_bytes=on_device, film_host_bytes=hosted * film,
               film_buffer_bytes=staging, film_buffer_slots=slots, code_layers_on_gpu=n_codes)
    model_label = "model" if blocks is None else f"model base + {blocks}/{sizes.num_blocks} blocks + 2 ring buffers"
    in_codes = f" ({n_codes} as FP8 codes)" if n_codes else ""
    parts = [(model_label, model_bytes), (f"{n}/{n_layers} cache layers{in_codes}", layer_bytes(on)),
             ("2 layer buffers" + (" + FP8 staging" if kv_fp8 else ""), ring)]
    if cache_text:
        parts.append(("text K/V", text))
    if films:
        parts.append((f"camera FiLM of {films}/{n_layers} blocks", films * film))
    if hosted:
        parts.append((f"{slots} camera FiLM buffer{'s' if slots > 1 else ''} and its stream's slack", staging))
    if keep:
        parts.append((_resident_label(compute, compute_bytes), resident))
    parts += [(acts_label, acts), ("headroom", headroom)] + extra
    why = _fits_line(parts, vram_free, "free VRAM")
    if host_need > ram_free - RAM_MARGIN:
        raise FastMemoryError(
            f"the K/V cache does not fit: {n_layers - n} of {n_layers} layers ({_gb(host_cache)}"
            + (f", plus {_gb(host_weights)} of streamed model blocks" if host_weights else "")
            + f") would live in pinned host RAM but only {_gb(ram_free)} is available (keeping {_gb(RAM_MARGIN)} free); "
            f"the whole video's cache is {_gb(n_layers * host_layer)} ({layout.capacity} tokens x {n_layers} layers). "
            + ("" if kv_fp8 else _fp8_way_out(args))
            + "Use fewer frames or a smaller size, --max-attention / a window (bounded cache), or close other programs.")
    notes = [f"{n_layers - n} layers ({_gb(host_cache)}{' in FP8' if kv_fp8 else ''}) stream from pinned RAM one "
             "layer ahead"]
    if n_codes:
        notes.append(("RAM is short: " if ram_short else "") + f"the GPU keeps {n_codes} layers as FP8 codes (half "
                     "the bytes; decoded before each block)")
    if cache == "auto":
        notes.insert(0, f"the whole cache on the GPU would need {_gb(gpu_need)}")
    if not cache_text:
        notes.append("text K/V recomputed every call (no room to keep them)")
    if blocks is not None:
        notes.append(f"model block swap: {sizes.num_blocks - blocks} blocks ({_gb(host_weights)}) stream from RAM")
    if not ok:
        notes.append("WARNING: even this may not fit; reduce the size or close other GPU programs")
    if host_need > ram_free - RAM_RESERVE:
        notes.append(f"WARNING: only {_gb(ram_free - host_need)} RAM left beside the pinned cache")
    reason = f"{prefix}K/V cache in pinned RAM, {n}/{n_layers} layers on the GPU ({why}; {'; '.join(notes)})"
    return FastMemoryPlan("host", n, cache_text, blocks, layout,
                          reason + _film_note(films, film, n_layers, hosted) + _resident_note(keep, resident), ok,
                          token_chunk, est, cache_heads, films, hosted, kv_fp8, n_codes, resident_weights=keep)


_PREPARED_AS = {"bf16": "bf16", "fp16acc": "fp16", "fp8": "FP8", "int8": "INT8"}  # what a compute mode keeps


def _resident_label(compute: str, compute_bytes: int) -> str:
    kept = _PREPARED_AS.get(compute, compute) if compute_bytes == 2 else "float32"  # no low precision in float32
    return f"GEMM weights kept in {kept}"


def _resident_note(keep: bool, resident: int) -> str:
    """The GEMM weights the plan does not keep (kept ones are a part of the sum); empty for weights stored as they
    compute (FP8 / INT8 / bf16)."""
    if keep or not resident:
        return ""
    return (f"; the blocks' GEMM weights are prepared from NF4 at every call (kept, they would take {_gb(resident)}: "
            "no room)")


def _fp8_way_out(args: dict) -> str:
    """A bf16 cache that does not fit in RAM: the sentence saying the `fast` preset's FP8 cache (half the bytes per
    layer, the same window) would, with the pinned RAM its own plan needs; empty when it would not fit either."""
    try:
        twin = plan_fast_memory(**{**args, "kv_fp8": True})
    except FastMemoryError:
        return ""
    return (f"The speed preset 'fast' (or 'draft') keeps the cache in FP8 (approximate): it fits, with "
            f"{_gb(twin.estimates['host_bytes'])} of pinned RAM. ")


def _film_blocks(room: int, per_block: int, n_layers: int) -> int:
    return max(0, min(n_layers, room // per_block)) if per_block > 0 else 0


def _film_places(room: int, per_block: int, n_layers: int, ram_room: int,
                 slots: int = FILM_HOST_SLOTS, slack: int = FILM_HOST_SLACK) -> tuple[int, int, int]:
    """(blocks whose camera FiLM stays on the device, the next blocks whose FiLM is kept in pinned RAM, the device
    buffers these stream through): the device takes what fits in `room`; when that is not every block, `slack`
    is set aside and up to `slots` blocks' room becomes the buffers, for as many blocks as `ram_room` holds (more
    than the buffers, or they would buy nothing)."""
    fit = _film_blocks(room, per_block, n_layers)
    if fit >= n_layers:
        return fit, 0, 0
    usable = _film_blocks(room - slack, per_block, n_layers)
    slots = min(slots, usable)
    if slots < 1:
        return fit, 0, 0
    hosted = _film_blocks(ram_room, per_block, n_layers - (usable - slots))
    return (usable - slots, hosted, slots) if hosted > slots else (fit, 0, 0)


def _film_buffer_bytes(slots: int, per_block: int) -> int:
    """Device bytes of the buffers the host-kept FiLM streams through, and the allocator's slack beside them (none
    without buffers: `_film_places` gives buffers only with blocks in RAM)."""
    return slots * per_block + (FILM_HOST_SLACK if slots else 0)


def _film_note(films: int, per_block: int, n_layers: int, hosted: int = 0, where: str = "on the GPU") -> str:
    """Where the plan keeps the camera FiLM: `where` is the device's memory ("in RAM" on a CPU run)."""
    if not per_block:
        return ""
    if not films and not hosted:
        return "; the camera FiLM is computed at every call (no room to keep it)"
    kept = [f"{films}/{n_layers} blocks {where} ({_gb(films * per_block)})"] if films else []
    if hosted:
        kept.append(f"{hosted} blocks in pinned RAM ({_gb(hosted * per_block)}, streamed back ahead of each block)")
    return f"; the camera FiLM of {' and '.join(kept)} is kept for each chunk's later calls"
