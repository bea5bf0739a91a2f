"""The K/V cache of a World session: placed by the door's placement for the video so far, grown through host memory
when a video without a window outgrows it, parked into host memory to be continued later, or copied there to be
continued elsewhere while the session goes on."""
from __future__ import annotations

import logging
from dataclasses import replace

from ..memory.kv_park import ParkedKV, copy_out, filled_bytes, park
from .errors import WorldError
from .plan import grow_latent_frames, play_layout, session_layout

log = logging.getLogger(__name__)


class SessionCache:
    """`cache` (a KVCache, None when none is placed) on `placement` (plan, make_cache, placement, release_cache)."""

    def __init__(self, placement):
        self.placement = placement
        self.cache = None

    def ensure(self, settings, latent_frames: int, *, restore=None, ahead: bool = False) -> None:
        """A cache that holds a video of `latent_frames`. The first one is laid out for the video (a played one:
        about 81 frames ahead), its saved K/V put back with restore.fill / restore.restore_counters; later, a
        cache without eviction that is too small grows by about 81 frames, moved through host memory."""
        if self.cache is None:
            plan = self.placement.plan
            need = play_layout(settings, latent_frames) if ahead else session_layout(settings, latent_frames)
            if plan.layout != need:  # planned for another size, or grown since
                self.placement.plan = replace(plan, layout=need)
            self.cache = self.placement.make_cache(fill=None if restore is None else restore.fill)
            if restore is not None:
                restore.restore_counters(self.cache)
            return
        layout = self.placement.plan.layout
        if layout.evict or latent_frames * settings.frame_tokens <= layout.capacity:
            return
        grow = grow_latent_frames(settings)
        grown = session_layout(settings, latent_frames + grow - latent_frames % grow)
        log.info("K/V cache: growing from %d to %d tokens per layer", layout.capacity, grown.capacity)
        parked = park(self.placement.placement)
        self.release()
        self.placement.plan = replace(self.placement.plan, layout=grown)
        self.cache = self.placement.make_cache(fill=parked.fill)
        parked.restore_counters(self.cache)
        parked.release()

    def release(self) -> None:
        if self.cache is not None:
            self.placement.release_cache()
            self.cache = None

    def park(self) -> ParkedKV:
        """The filled slots in host memory (the device's share freed)."""
        if self.cache is None:
            raise WorldError("no cache to park")
        parked = park(self.placement.placement)
        self.release()
        return parked

    def copy(self) -> ParkedKV:
        """A copy of the filled slots in host memory; the cache stays as it is."""
        if self.cache is None:
            raise WorldError("no cache to copy")
        return copy_out(self.placement.placement)

    def filled_bytes(self) -> int:
        """Host RAM a park or a copy takes."""
        return 0 if self.cache is None else filled_bytes(self.cache)
