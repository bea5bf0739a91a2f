"""The states of a Fast video in ComfyUI: what LingBot Fast Sampler / Fast Continue output and take.

A state holds the video's K/V cache in host RAM (the GPU holds none of it between nodes): 26.8 GB at 480x832 for
81 frames, 0.33 GB per latent frame more. ComfyUI keeps every node's outputs in its cache until the graph changes
or "Free model and node cache" is pressed, so the states of one chain share one cache instead of holding a copy
each:
- without a window / max_attention the cache only grows: a Continue moves the saved cache into its run (never two
  copies), appends its chunks and parks it again; earlier states of the chain are prefixes of it. Continuing an
  earlier state again (the usual "change the keys of the last step and queue again") cuts the cache back to that
  state; the later states of the old branch are then refused with a clear message if used (two branches from one
  state cannot both keep their chunks in one cache; run them one after the other).
- with a window or max_attention old tokens are dropped as the video goes on, so a state cannot be cut back: each
  Continue copies its input's (bounded) cache and leaves it intact; every state then holds its own window.
The cache is freed when ComfyUI drops the outputs that hold it. The Sampler keeps its state only when a node takes
its state output (read from the queued prompt); otherwise its cache is freed at once.

A Continue puts the parked cache back into its run with `ParkedCacheRestore` (moved or copied, as above) and takes
the I2V conditioning of later frames from `continuation_condition` (the state's, else built once per video).
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Any, Optional

from ...world.hosted import FastState, ParkedKV
from ...world.machine import gb
from .fast_host import condition_track

_ids = itertools.count(1)


class StaleStateError(RuntimeError):
    """A state whose cache was overwritten by another continuation (or lost)."""


class KVStore:
    """The parked cache of a chain of states, and which states it still holds (`lineage`, in order)."""

    def __init__(self, parked: ParkedKV, state_id: int, evicting: bool):
        self.parked: Optional[ParkedKV] = parked
        self.lineage: list[int] = [state_id]
        self.evicting = evicting
        self.lost: Optional[str] = None

    @property
    def nbytes(self) -> int:
        return self.parked.nbytes if self.parked is not None else 0

    def check(self, handle: "FastStateHandle") -> None:
        if self.lost:
            raise StaleStateError(f"LingBot Fast Continue: the video's saved cache was lost ({self.lost}); run LingBot "
                                  "Fast Sampler again")
        if handle.id not in self.lineage or self.parked is None:
            raise StaleStateError(
                "LingBot Fast Continue: this state's cache was overwritten by another continuation of an earlier "
                "state of the same video (the steps of one video share one cache to keep RAM bounded; two branches "
                "from one state cannot both be kept). Queue this branch again: its earlier steps run again")

    def take(self, handle: "FastStateHandle") -> ParkedKV:
        """The parked cache as `handle`'s state had it. Without eviction the cache moves into the run (the store is
        empty until `put`), cut back to that state; with eviction it is copied and stays."""
        self.check(handle)
        st = handle.state
        if self.evicting:
            if (self.parked.global_end, self.parked.local_end) != (st.kv_global_end, st.kv_local_end):
                raise StaleStateError("LingBot Fast Continue: the saved cache does not match this state")
            return self.parked
        source = self.parked.truncated(st.kv_global_end, st.kv_local_end)
        del self.lineage[self.lineage.index(handle.id) + 1:]
        self.parked = None
        return source

    def put(self, parked: ParkedKV, state_id: Optional[int]) -> None:
        self.parked = parked
        if state_id is not None:
            self.lineage.append(state_id)


class ParkedCacheRestore:
    """A parked cache put back into the new placement: moved (the chain's one cache) or copied (a window)."""

    def __init__(self, parked, move: bool):
        self.parked, self.move = parked, move

    def fill(self, i, k, v) -> None:
        self.parked.fill(i, k, v, move=self.move)

    def restore_counters(self, cache) -> None:
        self.parked.restore_counters(cache)


@dataclass(eq=False)
class FastStateHandle:
    """LINGBOT_FAST_STATE: a Fast video after some chunks (`state`), the model and I2V input it was made with, and
    the store of its cache. `state` is None when the node did not keep it (nothing took its state output, or LingBot
    Play had played nothing); `why` then says so for Continue's refusal (empty: the Sampler's reason)."""

    state: Optional[FastState]
    model: Any  # FastModel
    i2v: Any  # I2VCondition (the first frame and the VAE: the conditioning of later frames)
    store: Optional[KVStore] = None
    id: int = field(default_factory=lambda: next(_ids))
    why: str = ""

    @classmethod
    def first(cls, state: FastState, parked: ParkedKV, model, i2v) -> "FastStateHandle":
        h = cls(state, model, i2v)
        h.store = KVStore(parked, h.id, state.settings.evicting)
        return h

    @classmethod
    def empty(cls, model, i2v, why: str = "") -> "FastStateHandle":
        return cls(None, model, i2v, why=why)

    def _comfy_cache_tensors(self) -> list:
        """What current ComfyUI's RAM-pressure node cache should count for this output: the parked K/V cache (the
        chain's one copy) and the state's latents, conditioning and prompt embedding, each storage once."""
        from .host_memory import host_tensors

        if self.state is None:
            return []
        st = self.state
        parked = self.store.parked if self.store is not None else None
        return host_tensors(list(st.latents), st.context, None if st.condition is None else st.condition.y,
                            [] if parked is None else [t for t in (*parked.k, *parked.v) if t is not None])

    def __repr__(self) -> str:  # ComfyUI may log outputs; never print tensors
        if self.state is None:
            return "FastStateHandle(empty)"
        return f"FastStateHandle({self.state.frames} frames, {self.state.chunks} chunks)"


def continuation_condition(handle: FastStateHandle):
    """The I2V conditioning of later frames: the state's, else built once per video and kept."""
    st = handle.state
    if st.condition is None:
        try:
            st.condition = condition_track(handle.i2v)
        except ValueError as e:
            raise ValueError(f"LingBot Fast Continue: {e}") from None
    return st.condition


def state_output_used(prompt: Optional[dict], unique_id: Optional[str], output: int = 1) -> bool:
    """Whether any node of the queued prompt takes output `output` of node `unique_id` (True when unknown)."""
    if not isinstance(prompt, dict) or unique_id is None:
        return True
    me = str(unique_id)
    for node in prompt.values():
        for value in (node.get("inputs") or {}).values() if isinstance(node, dict) else ():
            if isinstance(value, (list, tuple)) and len(value) == 2 and str(value[0]) == me and value[1] == output:
                return True
    return False



def state_line(parked_bytes: int, shared: bool) -> str:
    """The node text's last line when a node keeps its state (the RAM it holds until ComfyUI drops it)."""
    whose = "the chain's K/V cache (shared by its states)" if shared else "its own K/V cache"
    return f"state kept for LingBot Fast Continue: {whose}, {gb(parked_bytes)} in RAM"
