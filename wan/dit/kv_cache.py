"""The causal (Fast) model's self-attention K/V cache and the reference's bookkeeping (spec Fast §5).

One `KVCache` holds, per layer, K and V tensors `[B, capacity, heads, head_dim]` (keys stored already rotated) and
the two counters every layer of the reference keeps (they are always equal across layers, so here they are kept
once): `global_end` (tokens of the video seen so far) and `local_end` (tokens held in the cache). A forward over a
chunk of L tokens starting at token `start`:

  1. end = start + L. If eviction is on, the chunk is new (end > global_end) and L + local_end > capacity:
     E = L + local_end - capacity tokens after the first `sink_tokens` are dropped and the rest shifted left
     (cached keys keep the rotary position they were written with);
  2. local_end += end - global_end (- E); the chunk's K/V are written to [local_end - L, local_end) -- calls at the
     same `start` (the denoising steps and the context pass) overwrite the same slots;
  3. the chunk's queries attend, unmasked, to [max(0, local_end - max_attention), local_end), which includes the
     chunk itself;
  4. global_end = end.

Where the tensors live is not this module's business: they are given to it (`KVCache(k, v, ...)` or `allocate` on
one device), and `memory/kv_placement.py` may re-point a layer's tensors at a device buffer while that layer runs
(`k[i]`, `v[i]` are plain list entries). A forward tells the cache whether its K/V are *final* (the context pass):
the denoising steps' K/V are overwritten before anything else reads them, so a placement that keeps the cache off
the device only needs to write back the final ones. The text cross-attention K/V of each layer are computed once
and kept here too (`text_kv`), when asked.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional, Sequence

import torch

from . import kv_fp8
from .attention import self_attention

TextKV = tuple[torch.Tensor, torch.Tensor]


@dataclass(frozen=True)
class ForwardPlan:
    """Where one forward's chunk goes: evicted tokens, write range and attended range (cache slots)."""

    start: int  # first token of the chunk in the whole video
    tokens: int  # L
    evicted: int  # E (0 when nothing is dropped)
    write_start: int
    write_end: int  # = the new local_end
    attend_start: int
    final: bool  # the K/V written now are the ones later chunks read

    @property
    def past(self) -> tuple[int, int]:
        """Slots of cached tokens the chunk attends to besides its own: [attend_start, write_start)."""
        return self.attend_start, max(self.attend_start, self.write_start)


class KVCacheError(ValueError):
    """A forward does not fit the cache (capacity, order of chunks)."""


class KVCache:
    """Per-layer K/V tensors plus the reference's append / overwrite / evict-after-sink / window bookkeeping.

    k, v: one tensor per layer, `[B, capacity, heads, head_dim]`, all of one shape and dtype (any device).
    sink_tokens: tokens at the start never evicted (the reference's `sink_size * frame_seqlen`).
    evict: drop the oldest tokens after the sink when a new chunk does not fit (the reference's local window,
    `local_attn_size != -1`); without it a chunk that does not fit is an error.
    max_attention: attend to at most this many of the latest tokens (the reference's `max_attention_size`);
    None = everything cached.
    cache_text: keep each layer's text K/V after the first forward (they depend only on the prompt).
    round_kv: applied to each chunk's K and V before they are written (wan/dit/kv_fp8.round_fp8 for an FP8 cache:
    every layer then holds values its FP8 host copy represents exactly); None writes them as they are.
    """

    def __init__(
        self,
        k: Sequence[torch.Tensor],
        v: Sequence[torch.Tensor],
        *,
        sink_tokens: int = 0,
        evict: bool = False,
        max_attention: Optional[int] = None,
        cache_text: bool = True,
        round_kv: Optional[Callable[[torch.Tensor], torch.Tensor]] = None,
    ):
        if len(k) != len(v) or not k:
            raise ValueError(f"need one K and one V tensor per layer, got {len(k)} and {len(v)}")
        shape, dtype = tuple(k[0].shape), k[0].dtype
        for i, (a, b) in enumerate(zip(k, v)):
            if a.dim() != 4 or tuple(a.shape) != shape or tuple(b.shape) != shape or a.dtype != dtype or b.dtype != dtype:
                raise ValueError(f"layer {i}: K {tuple(a.shape)} {a.dtype} / V {tuple(b.shape)} {b.dtype} differ from "
                                 f"layer 0's {shape} {dtype}; every layer needs [B, capacity, heads, head_dim] alike")
        self.k: list[torch.Tensor] = list(k)
        self.v: list[torch.Tensor] = list(v)
        self.batch, self.capacity, self.heads, self.head_dim = shape
        self.dtype = dtype
        if not 0 <= sink_tokens < self.capacity:
            raise ValueError(f"sink_tokens={sink_tokens} must be >= 0 and smaller than the capacity {self.capacity}")
        if max_attention is not None and max_attention < 1:
            raise ValueError(f"max_attention={max_attention} must be >= 1 token (None = attend to the whole cache)")
        self.sink_tokens = int(sink_tokens)
        self.evict = bool(evict)
        self.max_attention = None if max_attention is None else int(max_attention)
        self.cache_text = cache_text
        self.round_kv = round_kv
        self.text_kv: list[Optional[TextKV]] = [None] * len(self.k)
        self.global_end = 0
        self.local_end = 0
        self.plan: Optional[ForwardPlan] = None
        # Called as on_evict(plan) before the tensors are shifted (a placement may have copies in flight).
        self.on_evict: Optional[Callable[[ForwardPlan], None]] = None
        # Layers whose storage applies evictions itself (memory/kv_stream.py keeps host layers as a ring, so an
        # eviction moves no bytes there); their tensors are not shifted here.
        self.self_evicting: set[int] = set()

    @classmethod
    def allocate(cls, num_layers: int, capacity: int, heads: int, head_dim: int, *, batch: int = 1,
                 dtype: torch.dtype = torch.bfloat16, device=None,
                 fill: Optional[Callable[[int, torch.Tensor, torch.Tensor], None]] = None, **kw) -> "KVCache":
        """A cache with every layer's K/V zero-initialised on one device. fill(i, k, v) runs right after layer i
        is allocated (restoring a saved cache layer by layer, so the saved copy can shrink as this one grows)."""
        k, v = [], []
        for i in range(num_layers):
            k.append(torch.zeros(batch, capacity, heads, head_dim, dtype=dtype, device=device))
            v.append(torch.zeros(batch, capacity, heads, head_dim, dtype=dtype, device=device))
            if fill is not None:
                fill(i, k[-1], v[-1])
        return cls(k, v, **kw)

    # ---- sizes ---------------------------------------------------------------------------------------------
    @property
    def num_layers(self) -> int:
        return len(self.k)

    @property
    def layer_bytes(self) -> int:
        """Bytes of one layer's K and V."""
        return 2 * self.batch * self.capacity * self.heads * self.head_dim * self.k[0].element_size()

    @property
    def text_ready(self) -> bool:
        return self.cache_text and all(t is not None for t in self.text_kv)

    # ---- one forward ---------------------------------------------------------------------------------------
    def plan_for(self, start: int, tokens: int, final: bool = True) -> ForwardPlan:
        """The plan of a forward over `tokens` tokens starting at video token `start` (state is not changed)."""
        if start < 0 or tokens < 1:
            raise KVCacheError(f"a chunk needs start >= 0 and at least one token, got start={start}, tokens={tokens}")
        end = start + tokens
        evicted = 0
        if self.evict and end > self.global_end and tokens + self.local_end > self.capacity:
            evicted = tokens + self.local_end - self.capacity
            if self.local_end - evicted < self.sink_tokens:
                raise KVCacheError(
                    f"a chunk of {tokens} tokens does not fit beside the {self.sink_tokens}-token sink in a cache of "
                    f"{self.capacity} tokens; the window must hold the sink plus at least one chunk")
        local_end = self.local_end + end - self.global_end - evicted
        write_start = local_end - tokens
        if write_start < 0 or local_end > self.capacity:
            raise KVCacheError(
                f"chunk at tokens [{start}, {end}) does not fit the cache: slots [{write_start}, {local_end}) of "
                f"{self.capacity} (cache holds {self.local_end} tokens up to video token {self.global_end}); "
                + ("use a bigger window" if self.evict else "size the cache for the whole video or enable a window"))
        attend_start = 0 if self.max_attention is None else max(0, local_end - self.max_attention)
        return ForwardPlan(start, tokens, evicted, write_start, local_end, attend_start, bool(final))

    def begin(self, start: int, tokens: int, final: bool = True) -> ForwardPlan:
        """Start a forward: evict (shifting every layer's tensors) if needed and fix the slots for this chunk."""
        if self.plan is not None:
            raise KVCacheError("begin() called twice without end(): a forward was interrupted; reset() the cache")
        plan = self.plan_for(start, tokens, final)
        if plan.evicted:
            if self.on_evict is not None:
                self.on_evict(plan)
            rolled = self.local_end - plan.evicted - self.sink_tokens
            for i in range(self.num_layers):
                if i not in self.self_evicting:
                    shift_left(self.k[i], self.sink_tokens, plan.evicted, rolled)
                    shift_left(self.v[i], self.sink_tokens, plan.evicted, rolled)
        self.plan = plan
        return plan

    def attend(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """Write this chunk's (rotated) k and v into layer `layer` and attend q to the planned range."""
        p = self.plan
        if p is None:
            raise KVCacheError("attend() outside a forward: call begin() first")
        if k.shape[1] != p.tokens:
            raise KVCacheError(f"layer {layer}: {k.shape[1]} keys for a chunk planned with {p.tokens} tokens")
        if self.round_kv is not None:
            k, v = self.round_kv(k), self.round_kv(v)
        kc, vc = self.k[layer], self.v[layer]
        kc[:, p.write_start:p.write_end] = k
        vc[:, p.write_start:p.write_end] = v
        span = slice(p.attend_start, p.write_end)
        return self_attention(q, kc[:, span].to(q.dtype), vc[:, span].to(q.dtype))

    def text(self, layer: int, compute: Callable[[], TextKV]) -> TextKV:
        """This layer's text K/V: computed on the first call and kept when `cache_text`."""
        kv = self.text_kv[layer]
        if kv is None:
            kv = compute()
            if self.cache_text:
                self.text_kv[layer] = kv
        return kv

    def end(self) -> None:
        """Finish the forward begun last: the counters move to the chunk's end."""
        p = self.plan
        if p is None:
            raise KVCacheError("end() without begin()")
        self.global_end = p.start + p.tokens
        self.local_end = p.write_end
        self.plan = None

    def abort(self) -> None:
        """Forget a forward that did not finish (its slots are overwritten by the next call at the same start)."""
        self.plan = None

    def layer(self, index: int) -> "LayerKV":
        return LayerKV(self, index)

    # ---- lifetime -------------------------------------------------------------------------------------------
    def state(self) -> dict:
        """The bookkeeping as plain values (for saving a run and resuming it later)."""
        return {"global_end": self.global_end, "local_end": self.local_end, "capacity": self.capacity,
                "sink_tokens": self.sink_tokens, "evict": self.evict, "max_attention": self.max_attention}

    def release(self) -> None:
        """Drop every tensor reference (the caller frees the memory)."""
        self.k = [torch.empty(0) for _ in self.k]
        self.v = [torch.empty(0) for _ in self.v]
        self.text_kv = [None] * len(self.text_kv)
        self.plan = None


class LayerKV:
    """What one block sees of the cache: its own layer's self-attention and text K/V."""

    __slots__ = ("cache", "index")

    def __init__(self, cache: KVCache, index: int):
        self.cache, self.index = cache, index

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return self.cache.attend(self.index, q, k, v)

    def text(self, compute: Callable[[], TextKV]) -> TextKV:
        return self.cache.text(self.index, compute)


def shift_left(t: torch.Tensor, dst: int, by: int, count: int) -> None:
    """t[:, dst:dst+count] = t[:, dst+by:dst+by+count] along dim 1, in place without a temporary copy.

    Copied front to back in pieces of at most `by` tokens, so no piece reads slots an earlier piece wrote (the
    reference clones the whole rolled region first; the result is the same, without a second copy of the cache).
    """
    if count <= 0 or by <= 0:
        return
    for j in range(0, count, by):
        n = min(by, count - j)
        t[:, dst + j:dst + j + n] = t[:, dst + by + j:dst + by + j + n]


# ---- how big a cache a video needs --------------------------------------------------------------------------
@dataclass(frozen=True)
class CacheLayout:
    """Capacity and eviction rules of one video's cache, and whether the output is the released pipeline's."""

    capacity: int  # tokens per layer
    sink_tokens: int
    evict: bool
    max_attention: Optional[int]
    reference_exact: bool  # same attention as the release (whole video cached, or its max_attention_size)
    note: Optional[str] = None
    chunk_frames: int = 3  # latent frames a forward writes (what the memory plan sizes its activations for)

    def make(self, num_layers: int, heads: int, head_dim: int, *, batch: int = 1, dtype=torch.bfloat16,
             device=None, cache_text: bool = True, fill=None, round_kv=None) -> KVCache:
        """An all-on-one-device cache with this layout (placements build theirs in memory/kv_placement.py)."""
        return KVCache.allocate(num_layers, self.capacity, heads, head_dim, batch=batch, dtype=dtype, device=device,
                                sink_tokens=self.sink_tokens, evict=self.evict, max_attention=self.max_attention,
                                cache_text=cache_text, fill=fill, round_kv=round_kv)

    def layer_bytes(self, heads: int, head_dim: int, dtype_bytes: int = 2, batch: int = 1) -> int:
        return 2 * batch * self.capacity * heads * head_dim * dtype_bytes

    def fp8_layer_bytes(self, heads: int, head_dim: int, batch: int = 1) -> int:
        """One layer's K and V as FP8 codes plus one exponent byte per token and head (wan/dit/kv_fp8.py)."""
        return kv_fp8.pair_bytes(batch, self.capacity, heads, head_dim)


def cache_layout(latent_frames: int, frame_tokens: int, chunk_frames: int = 3, *,
                 window_frames: Optional[int] = None, sink_frames: int = 0,
                 max_attention: Optional[int] = None,
                 release: tuple[Optional[int], int] = (None, 0)) -> CacheLayout:
    """The cache for a video of `latent_frames` (tokens per latent frame `frame_tokens`).

    Default: the released pipeline's, the whole video (nothing is ever evicted).
    max_attention (tokens; the reference's `--max_attention_size`): each chunk attends to the latest tokens only.
    Then only those need to be kept, so the cache holds max(max_attention, one chunk) tokens and evicts the oldest:
    the attended keys are the same as the release's with that flag (reference-exact), in bounded memory.
    window_frames / sink_frames (latent frames; the reference model's `local_attn_size` / `sink_size`): keep the
    latest `window_frames` frames, of which the first `sink_frames` of the video are never evicted: for videos
    longer than the cache can hold. release: the model's released (window, sink) (v1 Fast: the whole video; v2:
    18 and 6), which decides whether the layout is the release's.
    """
    chunk = chunk_frames * frame_tokens
    whole = latent_frames * frame_tokens
    if latent_frames < chunk_frames or latent_frames % chunk_frames:
        raise ValueError(f"{latent_frames} latent frames are not a whole number of {chunk_frames}-frame chunks")
    if max_attention is not None and (isinstance(max_attention, bool) or not isinstance(max_attention, int)
                                      or max_attention < 1):
        raise ValueError(f"max attention {max_attention!r} must be a positive number of tokens")
    if sink_frames and window_frames is None:
        raise ValueError(f"a sink of {sink_frames} frames only matters with a window: give the window size too")
    if window_frames is None:
        if max_attention is None or max_attention >= whole:
            return CacheLayout(whole, 0, False, None, True, chunk_frames=chunk_frames)
        return CacheLayout(max(max_attention, chunk), 0, True, max_attention, True,
                           f"each chunk attends to the latest {max_attention} tokens "
                           f"({max_attention / frame_tokens:.1f} latent frames); the cache keeps only those",
                           chunk_frames)
    for name, value, low in (("window", window_frames, chunk_frames), ("sink", sink_frames, 0)):
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            raise ValueError(f"{name} of {value!r} latent frames must be an integer >= {low}")
    if window_frames < sink_frames + chunk_frames:
        raise ValueError(f"a window of {window_frames} latent frames cannot hold the {sink_frames}-frame sink plus "
                         f"one {chunk_frames}-frame chunk; use a window of at least {sink_frames + chunk_frames}")
    if window_frames >= latent_frames:
        return CacheLayout(whole, 0, False, max_attention, True,
                           f"the window of {window_frames} latent frames covers the whole video "
                           f"({latent_frames}); nothing is evicted", chunk_frames)
    released = (window_frames, sink_frames) == tuple(release) and max_attention is None
    if released:
        why = "the model's release"
    elif release[0] is None:
        why = "not the released pipeline's output, which caches the whole video"
    else:
        why = f"not the release's window of {release[0]} with a {release[1]}-frame sink"
    return CacheLayout(window_frames * frame_tokens, sink_frames * frame_tokens, True, max_attention, released,
                       f"window of {window_frames} latent frames with a {sink_frames}-frame sink: the oldest frames "
                       f"after the sink are dropped ({why})", chunk_frames)
