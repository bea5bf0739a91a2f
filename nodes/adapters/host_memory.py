"""Give host RAM back to the OS when ComfyUI drops the pack's weights ("Free model and node cache", unloads).

glibc keeps the pages of freed allocations below its (dynamic, up to 32 MB) mmap threshold, and NF4 / VAE
weights are exactly such 1-40 MB tensors: without a trim the server's RSS stays at its peak after the models
are gone. Two triggers, both ending in `memory.host_buffer.return_freed_host_memory` (glibc `malloc_trim(0)`):
- an expert unload trims at once (`trim_now`), after the last reference to the weights is dropped;
- objects that die with ComfyUI's node cache (`track`: the expert pair, the VAE) mark a trim as pending, and the
  next full garbage collection (ComfyUI runs one right after freeing its caches) performs it.
"""
from __future__ import annotations

import gc
import weakref

from ...world.machine import return_freed_host_memory

_pending = False


def note_released() -> None:
    """Weights of ours were freed; trim after the next full collection."""
    global _pending
    _pending = True


def trim_now() -> None:
    """Collect cycles now (weights referenced from cycles are freed too) and return the freed pages."""
    global _pending
    gc.collect()
    _pending = False
    return_freed_host_memory()


def track(obj: object) -> None:
    """Trim after `obj` (a holder of host weights) is garbage: ComfyUI dropped it from its node cache."""
    weakref.finalize(obj, note_released)


def _after_collection(phase: str, info: dict) -> None:
    global _pending
    if phase == "stop" and info.get("generation") == 2 and _pending:
        _pending = False
        return_freed_host_memory()


def install() -> None:
    """Run pending trims after full collections (idempotent)."""
    if _after_collection not in gc.callbacks:
        gc.callbacks.append(_after_collection)


def host_tensors(*roots) -> list:
    """The CPU tensors held by `roots` (modules, tensors, and lists / tuples / dicts of them), each storage once: what
    ComfyUI's RAM-pressure node cache should count for an output (`_comfy_cache_tensors`). Newer ComfyUI sizes cached
    outputs by their CPU tensors only, so without this the pack's pinned expert copies would count as nothing."""
    import torch

    out, seen, todo = [], set(), list(roots)
    while todo:
        obj = todo.pop()
        if isinstance(obj, torch.Tensor):
            if obj.device.type == "cpu" and obj.numel():
                key = obj.untyped_storage().data_ptr()
                if key not in seen:
                    seen.add(key)
                    out.append(obj)
        elif isinstance(obj, torch.nn.Module):
            todo += list(obj.parameters()) + list(obj.buffers())
        elif isinstance(obj, dict):
            todo += list(obj.values())
        elif isinstance(obj, (list, tuple)):
            todo += list(obj)
    return out
