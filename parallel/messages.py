"""Small messages between ranks over the gloo control group, without pickle: text as UTF-8 bytes, tensors as raw
bytes with a JSON header (shape, dtype). Used before and around the run (errors, fingerprints, the text embeddings
and the conditioning rank 0 made), never in the sampling loop.

Every helper is a collective: all ranks of the group call it in the same order. A failure of the transport (a rank
died, a timeout) becomes `ParallelError` with one line that says so.
"""
from __future__ import annotations

import json
import weakref
from typing import Optional, Sequence

import torch
import torch.distributed as dist

DTYPES = {str(d).removeprefix("torch."): d for d in (
    torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int64, torch.int32, torch.int16, torch.int8,
    torch.uint8, torch.bool)}


class ParallelError(RuntimeError):
    """A collective with the other ranks failed: one of them stopped, crashed or did not answer in time."""


def collective_failure(what: str, exc: BaseException) -> ParallelError:
    """One line for a failed collective: what was being exchanged, the likely reason, the transport's own words."""
    first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
    lost = any(s in first for s in ("Connection reset", "Connection closed", "Broken pipe", "closed by peer"))
    why = ("another rank stopped or crashed (its own error is above)" if lost else
           "another rank failed, stopped or did not answer within --parallel-timeout (see its error)")
    return ParallelError(f"{what} with the other ranks failed: {why} [{first[:120]}]")


class GroupRef:
    """A weak reference to a process group, for the objects that run collectives on it (the model's sequence split,
    the CFG pair). Only the parallel session holds its groups strongly: when it closes, a group's last reference
    goes and its gloo threads are joined then, instead of during the interpreter's exit, where a thread still
    releasing a finished collective's tensors needs the GIL and aborts the process. `None` is the default group."""

    def __init__(self, group=None):
        self._ref = None if group is None else weakref.ref(group)

    def __call__(self):
        if self._ref is None:
            return None
        group = self._ref()
        if group is None:
            raise ParallelError("the process group was closed: this model's parallel split can no longer run")
        return group


def _call(what: str, fn, group=None):
    try:
        return fn()
    except (RuntimeError, ValueError) as e:  # dist's errors are RuntimeError subclasses (DistBackendError, ...)
        raise collective_failure(what, e) from e


def all_gather_bytes(data: bytes, group=None, what: str = "exchanging messages") -> list[bytes]:
    """Every rank's `data`, in rank order of the group."""
    world = dist.get_world_size(group)
    n = torch.tensor([len(data)], dtype=torch.int64)
    sizes = [torch.zeros(1, dtype=torch.int64) for _ in range(world)]
    _call(what, lambda: dist.all_gather(sizes, n, group=group))
    longest = max(1, max(int(s) for s in sizes))
    buf = torch.zeros(longest, dtype=torch.uint8)
    if data:
        buf[:len(data)] = torch.frombuffer(bytearray(data), dtype=torch.uint8)
    out = [torch.zeros(longest, dtype=torch.uint8) for _ in range(world)]
    _call(what, lambda: dist.all_gather(out, buf, group=group))
    return [o[:int(s)].numpy().tobytes() for o, s in zip(out, sizes)]


def all_gather_json(obj, group=None, what: str = "exchanging messages") -> list:
    return [json.loads(b.decode("utf-8")) for b in all_gather_bytes(json.dumps(obj).encode("utf-8"), group, what)]


def broadcast_json(obj, src: int = 0, group=None, what: str = "receiving a message"):
    """`obj` of rank `src` (a global rank) on every rank; the others pass anything (ignored)."""
    mine = dist.get_rank() == src
    data = json.dumps(obj).encode("utf-8") if mine else b""
    n = torch.tensor([len(data)], dtype=torch.int64)
    _call(what, lambda: dist.broadcast(n, src, group=group))
    buf = torch.zeros(int(n), dtype=torch.uint8)
    if mine and data:
        buf[:] = torch.frombuffer(bytearray(data), dtype=torch.uint8)
    _call(what, lambda: dist.broadcast(buf, src, group=group))
    return json.loads(buf.numpy().tobytes().decode("utf-8"))


def broadcast_tensors(tensors: Optional[Sequence[torch.Tensor]], src: int = 0, group=None,
                      what: str = "receiving tensors") -> list[torch.Tensor]:
    """Rank `src`'s tensors (any dtype, on any device) as CPU tensors on every rank; the others pass None."""
    mine = dist.get_rank() == src
    header = [{"shape": list(t.shape), "dtype": str(t.dtype).removeprefix("torch.")} for t in tensors] if mine else None
    header = broadcast_json(header, src, group, what)
    out = []
    for i, h in enumerate(header):
        dtype = DTYPES[h["dtype"]]
        if mine:
            t = tensors[i].detach().to("cpu").contiguous()
        else:
            t = torch.empty(h["shape"], dtype=dtype)
        raw = t.reshape(-1).view(torch.uint8) if t.numel() else torch.zeros(0, dtype=torch.uint8)
        if raw.numel():
            _call(what, lambda: dist.broadcast(raw, src, group=group))
        out.append(t)
    return out
