"""Going back in a World session: to a chunk boundary (the cache's counters set back, or the cache rebuilt by
replaying the kept parts' context passes), and back to the last whole part after an interrupted one (a mixin of
WorldSession, world/session.py)."""
from __future__ import annotations

from typing import Optional

import torch

from ..wan.dit.model import pad_context
from ..wan.sampling.fast_sampler import FastRun, context_pass
from ..wan.sampling.fast_parts import plan_first_part, plan_next_part
from ..wan.sampling.fast_state import FastState
from .errors import WorldError


class Rewinding:
    """rewind(parts) and what an interrupted part leaves; uses the session's parts, cache and model."""

    def rewind(self, parts: int) -> None:
        """Back to the boundary after `parts` parts (chunks, for a played video); 0 = the start image."""
        self._check_open()
        if isinstance(parts, bool) or not isinstance(parts, int) or not 0 <= parts <= len(self.parts):
            raise WorldError(f"rewind to {parts!r}: choose a chunk boundary from 0 to {len(self.parts)}")
        if parts == len(self.parts):
            return
        with self.model_lock:
            self._rewind(parts)

    def _rewind(self, parts: int) -> None:
        if parts == 0:
            self._new_history()
            self._reset_cache()
            self._reset_decoder()
            return
        target = self.parts[parts - 1].state
        cache = self.cache
        evicted_since = cache is not None and (cache.global_end - cache.local_end
                                               != target.kv_global_end - target.kv_local_end)
        self.parts = self.parts[:parts]
        self._unfinished = False
        if cache is not None and not evicted_since and cache.local_end >= target.kv_local_end:
            cache.global_end, cache.local_end, cache.plan = target.kv_global_end, target.kv_local_end, None
        else:
            self._rebuild_cache()
        self._reset_decoder()

    def _rebuild_cache(self) -> None:
        """The cache of the kept parts, made again by replaying their context passes in order."""
        self._release_cache()
        model = self._ensure_model()
        kept = list(self.parts)
        if kept[0].resumed:
            raise WorldError("the cache of a continued saved video cannot be rebuilt once it has evicted tokens; "
                             "continue from the state file again to go back")
        self.parts = []
        self._ensure_cache(kept[-1].state.latent_frames)
        text_len = self._text_len(model)
        start = 0
        before: Optional[FastState] = None
        with torch.inference_mode():
            for p in kept:
                part = (plan_first_part(p.source, p.frames, self.settings) if before is None
                        else plan_next_part(before, p.source, p.frames))
                y = self.condition.frames(start, part.latent_frames)
                ctx = pad_context([p.state.context], text_len).to(self.device)
                latent = p.latents[-1]
                for c in range(part.chunks):
                    sl = slice(c * self.chunk_frames, (c + 1) * self.chunk_frames)
                    cam = None if part.camera is None else part.camera[:, :, sl].to(self.device)
                    # the call that wrote the chunk's K/V: the context pass on its latent at t = 0, or (a folded
                    # context pass) its last denoising step
                    x, t = p.folded[c] if p.folded else (latent[:, :, sl], 0)
                    context_pass(model, x.to(self.device), ctx, y[:, :, sl].to(self.device), cam, self.cache,
                                 start + c * self.chunk_frames, timestep=t)
                start += part.latent_frames
                before = p.state
        if (self.cache.global_end, self.cache.local_end) != (before.kv_global_end, before.kv_local_end):
            raise RuntimeError("the rebuilt cache does not end where the video does")
        self.parts = kept

    def _after_interrupt(self, run: Optional[FastRun]) -> None:
        """A part stopped mid-way: the video stays at its last complete part (the cache goes back there)."""
        self._reset_decoder()
        if self.cache is None:
            return
        keep = self.parts[-1].state if self.parts else None
        ge, le = (keep.kv_global_end, keep.kv_local_end) if keep is not None else (0, 0)
        c = self.cache
        if c.global_end - c.local_end == ge - le and c.local_end >= le:
            c.global_end, c.local_end, c.plan = ge, le, None
        elif keep is None:
            self._release_cache()
        else:
            self._rebuild_cache()
