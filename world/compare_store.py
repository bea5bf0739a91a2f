"""The reference preset's chunks, kept on disk while the other presets run (`lingbot-world compare`).

Only one model is in memory at a time, so the first preset's frames and K/V cache at every chunk boundary are
written here as it runs, one safetensors file per chunk (the frames, then each layer's K and V, streamed one
tensor at a time), and read back the same way while each later preset reaches that boundary: host memory holds a
chunk's frames and one layer of each cache at a time, whatever the model. The folder is private to the run and
removed when it ends (`close`); a folder left by a run that was killed is removed by the next one in that place.
"""
from __future__ import annotations

import os
import re
import shutil
from pathlib import Path
from typing import Iterable, Iterator

import numpy as np
import torch

from ..loaders.atomic import pid_alive
from ..loaders.safetensors_stream import SafetensorsWriter, iter_tensors, read_header
from .quality import CacheSpan

FOLDER_PREFIX = ".lingbot-compare-reference-"
_FOLDER = re.compile(re.escape(FOLDER_PREFIX) + r"(?P<pid>\d+)$")


class ReferenceStore:
    """`write(chunk, frames, span, layers)` as the reference runs; `frames(chunk)`, `span(chunk)` and
    `layers(chunk)` (an iterator of (K, V)) while the others run; `close()` removes everything."""

    def __init__(self, parent: Path):
        parent = Path(parent)
        remove_stale(parent)
        self.folder = parent / f"{FOLDER_PREFIX}{os.getpid()}"
        shutil.rmtree(self.folder, ignore_errors=True)
        self.folder.mkdir(parents=True)
        self.written = 0  # bytes on disk so far

    def _path(self, chunk: int) -> Path:
        return self.folder / f"chunk_{chunk:04d}.safetensors"

    def write(self, chunk: int, frames: np.ndarray, span: CacheSpan,
              layers: Iterable[tuple[torch.Tensor, torch.Tensor]]) -> Path:
        writer = SafetensorsWriter(self._path(chunk), metadata={
            "global_end": str(span.global_end), "local_end": str(span.local_end),
            "sink_tokens": str(span.sink_tokens)})
        try:
            writer.add("frames", torch.from_numpy(np.ascontiguousarray(frames)))
            for i, (k, v) in enumerate(layers):
                writer.add(f"k.{i:04d}", k)
                writer.add(f"v.{i:04d}", v)
            path = writer.close()
        except BaseException:
            writer.abort()
            raise
        self.written += path.stat().st_size
        return path

    def frames(self, chunk: int) -> np.ndarray:
        ((_, t),) = iter_tensors(self._path(chunk), "cpu", names=["frames"])
        return t.numpy()

    def span(self, chunk: int) -> CacheSpan:
        meta = read_header(self._path(chunk)).metadata
        return CacheSpan(int(meta["global_end"]), int(meta["local_end"]), int(meta["sink_tokens"]))

    def layers(self, chunk: int) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """Each layer's (K, V), read one tensor at a time in file order."""
        header = read_header(self._path(chunk))
        names = sorted(n for n in header.entries if n[:2] in ("k.", "v."))
        k = None
        for name, t in iter_tensors(header, "cpu", names=names):
            if name.startswith("k."):
                k = t
            else:
                yield k, t
                k = None

    def close(self) -> None:
        shutil.rmtree(self.folder, ignore_errors=True)


def remove_stale(parent: Path) -> list[Path]:
    """Remove reference folders in `parent` whose run no longer runs (a kill); returns them."""
    removed = []
    try:
        entries = list(Path(parent).iterdir())
    except OSError:
        return removed
    for p in entries:
        m = _FOLDER.match(p.name)
        if m and p.is_dir() and int(m.group("pid")) != os.getpid() and not pid_alive(int(m.group("pid"))):
            shutil.rmtree(p, ignore_errors=True)
            removed.append(p)
    return removed


def reference_bytes(settings, num_layers: int, dim: int, chunks: int, itemsize: int) -> int:
    """About the bytes the store takes for `chunks` chunks of a video of `settings` (a FastSettings: its size,
    chunk, window): each boundary's filled cache (2 x layers x tokens held x dim; num_layers 0: no cache kept) and
    the chunk's frames."""
    total = 0
    frame_bytes = settings.height * settings.width * 3
    recipe = settings.recipe
    for c in range(chunks):
        latent = settings.chunk_frames * (c + 1)
        held = latent if settings.window is None else min(latent, settings.window)
        total += 2 * num_layers * held * settings.frame_tokens * dim * itemsize
        total += frame_bytes * (recipe.chunk_video_frames if c else recipe.first_part_frames(1))
    return total
