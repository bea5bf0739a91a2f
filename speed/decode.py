"""The VAE decode of a Fast chunk as a speed lever (issue 26): on a side stream beside the next chunk's DiT, and/or
in bf16.

    decoder = ChunkDecoder(streaming.decode, device, overlap=True, bf16=False)
    pending = decoder.submit(x0)      # returns at once; with overlap the kernels run on the side stream
    ...                               # the next chunk's DiT is queued meanwhile
    frames = pending.result()         # waits for this chunk's frames only

overlap: the decode's kernels are queued on a stream of their own after the chunk's x0 is ready, so the GPU runs
them beside the next chunk's forwards instead of in a pause between chunks. The frames are the same bits (the same
kernels on the same inputs); they are ready later (a chunk's frames by about the middle of the next chunk).
bf16: the decoder's convolutions under autocast to bf16 (float32 frames out); faster, approximate (measured
difference in BENCHMARKS). Neither changes the DiT's latents.
"""
from __future__ import annotations

import contextlib
from typing import Callable, Optional

import torch


def decode_precision(device, bf16: bool):
    """The context a decode runs in: autocast to bf16 for the bf16 lever, else nothing (float32). Every decode of a
    run (streamed per chunk, afterwards, or the whole video of a continuation) uses it, so they give the same frames."""
    if not bf16:
        return contextlib.nullcontext()
    return torch.autocast(torch.device(device).type, dtype=torch.bfloat16)


class PendingFrames:
    """A chunk's frames, maybe still being decoded on the side stream."""

    def __init__(self, frames: torch.Tensor, done: Optional[torch.cuda.Event]):
        self._frames, self._done = frames, done

    def ready(self) -> bool:
        return self._done is None or self._done.query()

    def result(self) -> torch.Tensor:
        """The frames, once their decode finished (waits for that alone, not for later work)."""
        if self._done is not None:
            self._done.synchronize()
            self._done = None
        return self._frames


class ChunkDecoder:
    """Runs `decode(x0) -> frames` per chunk, in order, on a side stream (overlap, CUDA only) and/or in bf16."""

    def __init__(self, decode: Callable[[torch.Tensor], torch.Tensor], device, *, overlap: bool = False,
                 bf16: bool = False):
        self.decode = decode
        self.device = torch.device(device)
        self.bf16 = bf16
        self.stream = torch.cuda.Stream(self.device) if overlap and self.device.type == "cuda" else None

    @property
    def overlapped(self) -> bool:
        return self.stream is not None

    def _precision(self):
        return decode_precision(self.device, self.bf16)

    def submit(self, x0: torch.Tensor) -> PendingFrames:
        if self.stream is None:
            with self._precision():
                return PendingFrames(self.decode(x0), None)
        ready = torch.cuda.Event()
        ready.record(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(self.stream):
            self.stream.wait_event(ready)  # x0 is written by the main stream's last kernels
            x0.record_stream(self.stream)  # not reused by the main stream before this decode read it
            with self._precision():
                frames = self.decode(x0)
            done = torch.cuda.Event()
            done.record(self.stream)
        return PendingFrames(frames, done)
