"""CUDA graphs for a causal model's blocks once its K/V window has rolled (on by default for models narrower than
the 14B; LINGBOT_CUDA_GRAPHS=1 / 0 decides for every model: speed/options.graphs_enabled).

Why: the host issues some 12,000 kernels per `draft` chunk, one Python call at a time; a captured block replays
its few hundred kernels in one call. Measured on an H100 (BENCHMARKS, "CUDA graphs"): for the 14B the same bits,
0.00-0.03 s of a chunk for 0.9 GB of VRAM, since the GPU rarely waits for the host there; the v2 1.3B's small
kernels wait on the host, and graphs take its 2-step chunk from 0.41 to 0.24 s.

When: a causal forward whose window has rolled (the video is past the cache's capacity, and the chunk's slots end
it). From then on every chunk, every step and the context pass read and write the same cache slots with the same
shapes, so one capture per block serves the rest of the video (the player's steady state, a long windowed render).
Earlier forwards (the window filling up, a video its window covers) change shape every chunk and run eagerly: a
capture costs about one eager forward, which a shape seen for one chunk would not repay.

How:
- The first forward of a new shape runs eagerly (it builds the cuDNN plans, compiled code and cuBLAS handles a
  capture must not build); the next one captures each block on a side stream and replays it; later ones replay.
- The graphs may run per-token phases of their own (`ops`: the compiled ones under `compile="graphs"`), which cost
  no host time once replayed; the first forward of the rolled shape then runs with them uncaptured, and `build`
  compiles them at load so no played chunk waits for the compiler.
- What changes between forwards (block 0's tokens, the time modulation, the camera tokens, the RoPE tables) is
  copied into static tensors the graphs read. Block 0 writes the float32 residual stream, which the later blocks
  update in place, as eager does.
- With a camera FiLM cache on the device (wan/dit/film_cache.py; its store keeps the same tensors chunk after
  chunk), a block has two graphs: one that computes its FiLM and keeps it (a chunk's first call), one that reads
  it (the chunk's later calls), so the camera's GEMMs run once per chunk as in the eager path.
- Each block's graph is keyed by the address of everything it reads outside those statics: its input, weights
  (a block streamed through the block-swap ring sits in one of two buffers), the prepared GEMM weights the memory
  plan keeps (made again they sit elsewhere; dropped, the graph must prepare them itself), its cache layer's K/V
  (a streamed cache layer sits in a ring buffer), text K/V and kept FiLM. A new address set captures another graph
  of that block (up to four are kept: with an odd number of streamed cache layers a layer alternates between the
  ring's two buffers from one forward to the next): a replay reads whatever its addresses hold now, which is right
  only while they are the same tensors.
- A replay launches the kernels the eager run launched, on the same inputs: the output is the same bit for bit.
- The graphs share one memory pool: they replay one after another on one stream, so one block's scratch memory
  is free again before the next block's starts.
- A capture that fails logs one line and turns the graphs off for this model; that block and the rest run eagerly.
"""
from __future__ import annotations

import logging
import math
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Callable, Optional

import torch

log = logging.getLogger(__name__)

VARIANTS_PER_BLOCK = 4


class CudaCapture:
    """Captures a function's kernels into a torch.cuda.CUDAGraph (a side stream, one memory pool for all)."""

    executes = False  # a capture only records the kernels: the caller replays to compute

    def __init__(self, device: torch.device):
        self.device = device
        self.stream = torch.cuda.Stream(device)
        self.pool = torch.cuda.graph_pool_handle()

    def capture(self, fn: Callable[[], torch.Tensor]) -> tuple[Callable[[], None], torch.Tensor]:
        graph = torch.cuda.CUDAGraph()
        current = torch.cuda.current_stream(self.device)
        self.stream.wait_stream(current)  # the pool's memory is handed out in stream order
        with torch.cuda.stream(self.stream):
            # thread_local: the player's and ComfyUI's other threads may use CUDA while this thread captures.
            graph.capture_begin(pool=self.pool, capture_error_mode="thread_local")
            try:
                out = fn()
            except BaseException:
                try:
                    graph.capture_end()
                except Exception:  # the capture is already invalid; the first error is the one to report
                    pass
                raise
            graph.capture_end()
        current.wait_stream(self.stream)
        return graph.replay, out


@dataclass
class _Captured:
    replay: Callable[[], None]
    out: torch.Tensor


class _Statics:
    """The static copies of a forward's per-call inputs that every block's graph reads."""

    def __init__(self, x: torch.Tensor, e0: torch.Tensor, rope: tuple):
        self.x = torch.empty_like(x)
        self.e0 = torch.empty_like(e0)
        self.cam: Optional[torch.Tensor] = None  # made by the first forward with camera tokens
        self.rope = (torch.empty_like(rope[0]), torch.empty_like(rope[1]))

    def load(self, x: torch.Tensor, e0: torch.Tensor, cam: Optional[torch.Tensor], rope: tuple) -> None:
        self.x.copy_(x)
        self.e0.copy_(e0)
        if cam is not None:
            # With a FiLM cache only a chunk's first forward has camera tokens (the later ones read its FiLM);
            # the graphs that compute the FiLM read this tensor, so it is made once and kept.
            if self.cam is None:
                self.cam = torch.empty_like(cam)
            self.cam.copy_(cam)
        self.rope[0].copy_(rope[0])
        self.rope[1].copy_(rope[1])


def _signature(t: Optional[torch.Tensor]) -> Optional[tuple]:
    return None if t is None else (tuple(t.shape), tuple(t.stride()), t.dtype, str(t.device))


def _quant_tensors(module: torch.nn.Module) -> list:
    """bitsandbytes' quantization statistics a 4-bit weight carries outside the module's parameters."""
    state = getattr(getattr(module, "weight", None), "quant_state", None)
    if state is None:
        return []
    out = [state.absmax, getattr(state, "code", None)]
    nested = getattr(state, "state2", None)
    if nested is not None:
        out += [nested.absmax, getattr(nested, "code", None), getattr(state, "offset", None)]
    return out


def block_fingerprint(block: torch.nn.Module) -> tuple:
    """Addresses of every tensor the block's forward reads from the block itself (a model with a LoRA never gets
    here: its terms are not the block's tensors, and `BlockGraphs.begin` runs such a model eagerly)."""
    ptrs = []
    for module in block.modules():
        ptrs.extend(t.data_ptr() for t in module.parameters(recurse=False))
        ptrs.extend(t.data_ptr() for t in module.buffers(recurse=False))
        ptrs.extend(t.data_ptr() for t in _quant_tensors(module) if isinstance(t, torch.Tensor))
        kept = getattr(module, "kept_tensors", None)  # a kept prepared weight is read instead of the NF4 codes
        if kept is not None:
            ptrs.append(tuple(t.data_ptr() for t in kept()))
        mode = getattr(module, "compute_mode", None)
        if mode is not None:
            ptrs.append(mode)
    return (getattr(block, "token_chunk", None), id(getattr(block, "ops", None)), *ptrs)


class BlockGraphs:
    """Replays a causal model's blocks from CUDA graphs once its K/V window is full (see the module docstring).

    Installed on a model by apply_speed (`model.block_runner`); the model's forward calls `begin` once the cache
    has planned the chunk, and runs each block through the returned object (None: run the blocks eagerly).
    capture: the capturing backend (CudaCapture on a GPU; tests give a stand-in that runs on the CPU).
    """

    def __init__(self, device, capture=None, ops=None):
        device = torch.device(device)
        # The per-token phases the rolled forwards run (compiled ones: `compile="graphs"`, a narrow model's `auto`),
        # None: each block's own. Replays launch no Python, so compiled phases cost no host time there, while the
        # forwards before the window rolls (no graphs) keep the blocks' eager phases and their cheap launches.
        self.ops = ops
        if device.type == "cuda" and device.index is None:
            device = torch.device("cuda", torch.cuda.current_device())
        self.device = device
        self._capture = capture
        self.shape_key: Optional[tuple] = None  # the forward shape the graphs serve
        self._warmed: Optional[tuple] = None  # a shape that ran eagerly once
        self.statics: Optional[_Statics] = None
        # block index -> its graphs by fingerprint, oldest first: a streamed cache layer alternates between the two
        # ring buffers when an odd number of layers streams, so a block may need one graph per buffer
        self.graphs: dict[int, dict[tuple, _Captured]] = {}
        self.disabled: Optional[str] = None
        self.captures = 0
        self.replays = 0  # block replays
        self.graphed_forwards = 0

    @property
    def backend(self):
        if self._capture is None:
            self._capture = CudaCapture(self.device)
        return self._capture

    def build(self, model) -> None:
        """Compile the graphs' phases now (at load) rather than at the first rolled chunk, where a first run would
        stop the played video for the compile (about 15 s on an H200 the first time): one causal forward of a
        35-token chunk with a scratch K/V cache, the blocks running `ops`. The token count is symbolic from the
        first compiled call on (speed/compile.py), so these graphs serve every chunk size. Skipped without `ops`
        and for a model whose blocks are streamed by hooks (their weights move around a forward)."""
        if self.ops is None or model.before_block is not None or model.after_block is not None:
            return
        from ..wan.dit.kv_cache import KVCache

        cfg, device = model.cfg, self.device
        h, w = 2 * 5, 2 * 7  # 35 tokens: a count no other dimension of the phases' tensors has
        g = torch.Generator(device="cpu").manual_seed(0)
        x = torch.randn(1, cfg.out_dim, 1, h, w, generator=g).to(device)
        y = torch.randn(1, cfg.in_dim - cfg.out_dim, 1, h, w, generator=g).to(device)
        cam = torch.randn(1, cfg.camera_in // math.prod(cfg.patch_size), 1, h, w, generator=g).to(device)
        ctx = torch.randn(1, 4, cfg.text_dim, generator=g).to(device)
        # a scratch cache that never rolls: this forward's blocks run uncaptured, through the model's own loop
        cache = KVCache.allocate(cfg.num_layers, 35, cfg.num_heads, cfg.head_dim, dtype=model.dtype_for_compute(),
                                 device=device)
        with _phases(model.blocks, self.ops), torch.no_grad():
            model(x, torch.tensor([999], device=device), ctx, y, camera=cam, kv_cache=cache)

    def stats(self) -> dict:
        return {"graphed_forwards": self.graphed_forwards, "captures": self.captures, "replays": self.replays,
                "disabled": self.disabled}

    def reset(self) -> None:
        """Drop every graph and static (their pool memory goes back to the allocator once unreferenced)."""
        self.graphs.clear()
        self.statics = None
        self.shape_key = None

    # ---- one forward --------------------------------------------------------------------------------------------
    def begin(self, model, kv_cache, hs: list, e0s: list, ctxs: list, cam, rope: tuple, film,
              dtype: torch.dtype) -> Optional["GraphedForward"]:
        if self.disabled is not None:
            return None
        key = self._shape_key(model, kv_cache, hs, e0s, ctxs, cam, rope, film, dtype)
        if key is None:
            return None
        if key != self.shape_key:
            if self._warmed != key:  # first sight of this shape: run eagerly, so every kernel is built
                self._warmed = key
                return None if self.ops is None else UncapturedForward(self.ops, dtype, hs[0], e0s[0], cam, rope)
            self.reset()
            self.shape_key = key
            self.statics = _Statics(hs[0], e0s[0], rope)
        self.statics.load(hs[0], e0s[0], cam, rope)
        self.graphed_forwards += 1
        return GraphedForward(self, kv_cache, dtype)

    def _shape_key(self, model, kv_cache, hs, e0s, ctxs, cam, rope, film, dtype) -> Optional[tuple]:
        """The forward's shape when its blocks may replay graphs, else None."""
        if (kv_cache is None or len(hs) != 1 or getattr(film, "host_blocks", None)
                or getattr(model, "seq_parallel", None) is not None
                or torch.is_grad_enabled() or hs[0].device != self.device or ctxs[0] is not None
                or not kv_cache.text_ready):
            return None
        plan = kv_cache.plan
        if (plan is None or not kv_cache.evict or plan.write_end != kv_cache.capacity
                or plan.start + plan.tokens <= kv_cache.capacity):
            return None  # the window has not rolled yet: the next chunk has other slots
        if any(getattr(m, "lora", None) is not None for m in model.blocks.modules()):
            return None
        return (id(model), plan.write_start, plan.write_end, plan.attend_start, plan.tokens, dtype,
                # with a FiLM cache a forward has camera tokens or not (the chunk's first call or a later one):
                # the same shape, each block's graph for the FiLM it computes or reads (GraphedForward.run)
                torch.is_inference_mode_enabled(), _signature(hs[0]), _signature(e0s[0]),
                "film" if film is not None else _signature(cam),
                _signature(rope[0]), _signature(rope[1]))

    def disable(self, reason: str) -> None:
        self.disabled = reason
        self.reset()
        log.warning("CUDA graphs off for this model (the blocks run eagerly, same results): %s", reason)


class GraphedForward:
    """One forward's walk through the blocks: replay each block's graph, capturing it first when needed."""

    def __init__(self, graphs: BlockGraphs, kv_cache, dtype: torch.dtype):
        self.graphs, self.kv_cache, self.dtype = graphs, kv_cache, dtype
        self.statics = graphs.statics  # kept for this forward even if a failed capture drops the graphs'
        self.x = self.statics.x

    def run(self, i: int, block: torch.nn.Module, kv, film=None) -> list:
        """film: the block's layer of the camera FiLM cache (None: it computes its FiLM from the camera tokens).
        Its graph computes and keeps the FiLM (a chunk's first call) or reads it (the later ones): two graphs."""
        g = self.graphs
        if g.disabled is None:
            wrote = film is not None and not film.ready
            fp = self._fingerprint(i, block, film)
            entry = g.graphs.get(i, {}).get(fp)
            if entry is not None:
                entry.replay()
                g.replays += 1
                if film is not None:
                    film.replayed(wrote)
            else:
                entry = self._capture(i, block, kv, film, fp)
            if entry is not None:
                self.x = entry.out
                return [self.x]
        self.x = self._eager(block, kv, film, self.x)
        return [self.x]

    def _eager(self, block, kv, film, x: torch.Tensor) -> torch.Tensor:
        s = self.statics
        return _run_block(block, self.graphs.ops, x, s.e0, s.cam, s.rope, self.dtype, kv, film)

    def _fingerprint(self, i: int, block, film) -> tuple:
        c = self.kv_cache
        text = c.text_kv[i]
        kept = () if film is None else (film.ready, *film.addresses())
        return (self.x.data_ptr(), c.k[i].data_ptr(), c.v[i].data_ptr(), text[0].data_ptr(), text[1].data_ptr(),
                kept, *block_fingerprint(block))

    def _capture(self, i: int, block, kv, film, fp: tuple) -> Optional[_Captured]:
        g = self.graphs
        backend = g.backend
        x = self.x  # the graph reads this address on every replay: block 0's static input, then the residual
        try:
            replay, out = backend.capture(lambda: self._eager(block, kv, film, x))
        except Exception as e:  # noqa: BLE001 - any capture failure falls back to the same maths, eagerly
            g.disable(f"capturing block {i} failed: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}")
            return None
        if i > 0 and out.data_ptr() != self.x.data_ptr():  # the in-place residual is what chains the graphs
            g.disable(f"block {i} did not update the residual stream in place")
            return None
        entry = _Captured(replay, out)
        variants = g.graphs.setdefault(i, {})
        variants[fp] = entry
        while len(variants) > VARIANTS_PER_BLOCK:  # a block that moved for good: its oldest graphs go
            variants.pop(next(iter(variants)))
        g.captures += 1
        if not backend.executes:
            replay()
            g.replays += 1
        return entry


class UncapturedForward:
    """The first forward of a rolled shape when the graphs run their own phases (BlockGraphs.ops): each block runs
    once with them, uncaptured, so their kernels are built (compiled) before a capture records them."""

    def __init__(self, ops, dtype: torch.dtype, x: torch.Tensor, e0: torch.Tensor, cam: Optional[torch.Tensor],
                 rope: tuple):
        self.ops, self.dtype, self.x, self.e0, self.cam, self.rope = ops, dtype, x, e0, cam, rope

    def run(self, i: int, block: torch.nn.Module, kv, film=None) -> list:
        self.x = _run_block(block, self.ops, self.x, self.e0, self.cam, self.rope, self.dtype, kv, film)
        return [self.x]


def _run_block(block, ops, x, e0, cam, rope, dtype, kv, film) -> torch.Tensor:
    """block's forward over one causal chunk with the per-token phases `ops` (None: the block's own) and its layer
    of the camera FiLM cache (None: none)."""
    with _phases([block], ops):
        return block.forward_layered([x], [e0], [None], cam, rope, dtype, inplace=True, kv=kv, film=film)[0]


@contextmanager
def _phases(blocks, ops):
    """The blocks run the per-token phases `ops` (None: their own) inside the `with`, their own again after."""
    own = [b.ops for b in blocks]
    if ops is not None:
        for b in blocks:
            b.ops = ops
    try:
        yield
    finally:
        for b, phases in zip(blocks, own):
            b.ops = phases
