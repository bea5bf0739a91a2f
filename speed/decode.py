"""The VAE decode of a Fast chunk as a speed lever (issue 26): on a side stream beside the next chunk's DiT, and/or
in half precision.

    decoder = ChunkDecoder(streaming.decode, device, overlap=True, dtype="fp16")
    pending = decoder.submit(x0)      # returns at once; with overlap the kernels run on the side stream
    ...                               # the next chunk's DiT is queued meanwhile
    frames = pending.result()         # waits for this chunk's frames only

overlap: the decode's kernels are queued on a stream of their own after the chunk's x0 is ready, so the GPU runs
them beside the next chunk's forwards instead of in a pause between chunks. The frames are the same bits (the same
kernels on the same inputs); they are ready later (a chunk's frames by about the middle of the next chunk).
dtype: "float32" (the release's decode), or the decoder's convolutions under autocast to "fp16" or "bf16" (float32
frames out): about twice as fast on tensor cores, approximate. fp16 keeps 10 bits of mantissa (TF32's, which the
float32 convolutions already round their inputs to on CUDA), bf16 7, so fp16's frames are about 8x closer to the
float32 decode's (measured in BENCHMARKS); the Wan2.1 decoder stays within fp16's range (ComfyUI lists fp16 among
its working dtypes; a community runtime decodes the v2 1.3B's chunks in fp16 at 43.6 dB PSNR against float32).
Neither changes the DiT's latents.
"""
from __future__ import annotations

import contextlib
from typing import Callable, Optional

import torch


# The decode precisions a speed plan can ask for, and the autocast dtype each runs under (None: float32 as it is).
DECODE_DTYPES = {"float32": None, "fp16": torch.float16, "bf16": torch.bfloat16}


def decode_precision(device, dtype: str = "float32"):
    """The context a decode runs in: autocast to fp16 / bf16 for the half-precision levers, else nothing (float32).
    Every decode of a run (streamed per chunk, afterwards, or the whole video of a continuation) uses it, so they
    give the same frames."""
    if dtype not in DECODE_DTYPES:
        raise ValueError(f"decode dtype {dtype!r}: choose one of {', '.join(DECODE_DTYPES)}")
    autocast = DECODE_DTYPES[dtype]
    if autocast is None:
        return contextlib.nullcontext()
    return torch.autocast(torch.device(device).type, dtype=autocast)


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
    """Runs `decode(x0) -> frames` per chunk, in order, on a side stream (overlap, CUDA only) and/or in half
    precision (dtype: a DECODE_DTYPES name)."""

    def __init__(self, decode: Callable[[torch.Tensor], torch.Tensor], device, *, overlap: bool = False,
                 dtype: str = "float32"):
        self.decode = decode
        self.device = torch.device(device)
        decode_precision(self.device, dtype)  # a name it does not know fails here, not at the first chunk
        self.dtype = dtype
        self.stream = torch.cuda.Stream(self.device) if overlap and self.device.type == "cuda" else None

    @property
    def overlapped(self) -> bool:
        return self.stream is not None

    def _precision(self):
        return decode_precision(self.device, self.dtype)

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
