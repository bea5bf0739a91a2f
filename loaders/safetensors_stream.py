"""Read and write safetensors files one tensor at a time, with host memory bounded by a small staging buffer.

Why not `safetensors.safe_open`: it maps the file, and every page touched through a mapping stays in the
process RSS for as long as the mapping lives (a 9.6 GB expert shows as 9.6 GB of resident memory), with slow
4 KB page faults on top. Here the header (8-byte little-endian length + JSON, see the safetensors format
description) is parsed directly and each tensor's bytes are read with plain file reads:

- CPU target: straight into a fresh tensor, which *is* the loaded weight;
- CUDA target: into two reusable pinned staging buffers, alternately, each chunk copied to the device with
  `non_blocking=True` on a side stream, so reading chunk k+1 from disk overlaps the H2D copy of chunk k.

The writer appends tensor data as it arrives and writes the header last, so a converter never holds a model.
"""
from __future__ import annotations

import json
import math
import os
import shutil
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable, Iterator, Mapping, Optional, Union

import torch

from .atomic import commit, naming_full_disk, remove_stale_temps, temp_path

PathLike = Union[str, os.PathLike]

# dtype names of the safetensors format.
SAFETENSORS_DTYPES: dict[str, torch.dtype] = {
    "F64": torch.float64,
    "F32": torch.float32,
    "F16": torch.float16,
    "BF16": torch.bfloat16,
    "I64": torch.int64,
    "I32": torch.int32,
    "I16": torch.int16,
    "I8": torch.int8,
    "U64": torch.uint64,
    "U32": torch.uint32,
    "U16": torch.uint16,
    "U8": torch.uint8,
    "BOOL": torch.bool,
    "F8_E4M3": torch.float8_e4m3fn,
    "F8_E5M2": torch.float8_e5m2,
}
DTYPE_NAMES: dict[torch.dtype, str] = {v: k for k, v in SAFETENSORS_DTYPES.items()}

MAX_HEADER_BYTES = 100 * 1024 * 1024  # the format's own limit
DEFAULT_CHUNK_BYTES = 64 * 1024 * 1024


class SafetensorsFormatError(ValueError):
    """The file is not a valid safetensors file (bad header, truncated data, unknown dtype...)."""


@dataclass(frozen=True)
class TensorEntry:
    name: str
    dtype: torch.dtype
    shape: tuple[int, ...]
    begin: int  # absolute file offsets
    end: int

    @property
    def nbytes(self) -> int:
        return self.end - self.begin


@dataclass(frozen=True)
class SafetensorsHeader:
    path: Path
    entries: dict[str, TensorEntry]  # in file order
    metadata: dict[str, str]
    data_start: int
    file_size: int

    def shapes(self) -> dict[str, tuple[int, ...]]:
        return {k: e.shape for k, e in self.entries.items()}


def _fail(path: Path, msg: str, key: Optional[str] = None) -> SafetensorsFormatError:
    where = f"{path}" + (f", key {key!r}" if key else "")
    return SafetensorsFormatError(f"{where}: {msg}")


def read_header(path: PathLike) -> SafetensorsHeader:
    """Parse and validate a safetensors header without touching the tensor data."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"safetensors file not found: {path}")
    size = path.stat().st_size
    redo = "the file is truncated or corrupted; download or convert it again"
    if size < 8:
        raise _fail(path, f"only {size} bytes, too small to be a safetensors file; {redo}")
    with open(path, "rb") as f:
        (hlen,) = struct.unpack("<Q", f.read(8))
        if hlen > MAX_HEADER_BYTES or 8 + hlen > size:
            raise _fail(path, f"header length {hlen} does not fit in the file ({size} bytes); {redo}")
        raw = f.read(hlen)
    try:
        header = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise _fail(path, f"header is not valid JSON ({e}); {redo}") from None
    if not isinstance(header, dict):
        raise _fail(path, f"header is a JSON {type(header).__name__}, not an object; {redo}")

    meta = header.pop("__metadata__", None) or {}
    if not isinstance(meta, dict) or not all(isinstance(v, str) for v in meta.values()):
        raise _fail(path, "__metadata__ must map strings to strings")
    data_start = 8 + hlen
    data_size = size - data_start
    entries = []
    for name, info in header.items():
        if not isinstance(info, dict) or not {"dtype", "shape", "data_offsets"} <= info.keys():
            raise _fail(path, "entry needs dtype, shape and data_offsets", name)
        dtype = SAFETENSORS_DTYPES.get(info["dtype"])
        if dtype is None:
            raise _fail(path, f"unknown dtype {info['dtype']!r} (known: {', '.join(SAFETENSORS_DTYPES)})", name)
        shape, offs = info["shape"], info["data_offsets"]
        if not (isinstance(shape, list) and all(isinstance(s, int) and s >= 0 for s in shape)):
            raise _fail(path, f"bad shape {shape!r}", name)
        if not (isinstance(offs, list) and len(offs) == 2 and all(isinstance(o, int) for o in offs)):
            raise _fail(path, f"bad data_offsets {offs!r}", name)
        b, e = offs
        if not 0 <= b <= e:
            raise _fail(path, f"bad data_offsets {offs!r}; {redo}", name)
        if e > data_size:
            raise _fail(
                path, f"data ends at byte {data_start + e} but the file has only {size} bytes: {redo}", name
            )
        need = math.prod(shape) * dtype.itemsize
        if need != e - b:
            raise _fail(path, f"shape {tuple(shape)} of {info['dtype']} needs {need} bytes, the file gives {e - b}", name)
        entries.append(TensorEntry(name, dtype, tuple(shape), data_start + b, data_start + e))
    entries.sort(key=lambda t: t.begin)
    for prev, cur in zip(entries, entries[1:]):
        if cur.begin < prev.end:
            raise _fail(path, f"data overlaps tensor {prev.name!r}; {redo}", cur.name)
    return SafetensorsHeader(path, {t.name: t for t in entries}, dict(meta), data_start, size)


def _read_exact(f, view: memoryview, offset: int, path: Path, name: str) -> None:
    f.seek(offset)
    got = 0
    while got < len(view):
        n = f.readinto(view[got:])
        if not n:
            raise _fail(path, f"file ended while reading this tensor (byte {offset + got}); the file is truncated", name)
        got += n


def _host_bytes(t: torch.Tensor) -> memoryview:
    """A writable byte view of a contiguous CPU tensor (any dtype, bf16 included)."""
    return memoryview(t.reshape(-1).view(torch.uint8).numpy())


class _CudaStaging:
    """Two pinned buffers used alternately: disk -> pinned (CPU) overlaps pinned -> device (copy engine)."""

    def __init__(self, device: torch.device, chunk_bytes: int):
        self.device = device
        self.chunk = chunk_bytes
        self.stream = torch.cuda.Stream(device)
        self.bufs = [torch.empty(chunk_bytes, dtype=torch.uint8, pin_memory=True) for _ in range(2)]
        self.views = [_host_bytes(b) for b in self.bufs]
        self.done = [torch.cuda.Event() for _ in range(2)]  # an unrecorded event counts as complete
        self.slot = 0

    def read(self, f, entry: TensorEntry, path: Path) -> torch.Tensor:
        if not entry.nbytes:
            return torch.empty(entry.shape, dtype=entry.dtype, device=self.device)
        main = torch.cuda.current_stream(self.device)
        dst = torch.empty(entry.nbytes, dtype=torch.uint8, device=self.device)
        # dst may reuse memory that kernels queued on the main stream still read: copy only after them.
        self.stream.wait_stream(main)
        pos = 0
        while pos < entry.nbytes:
            n = min(self.chunk, entry.nbytes - pos)
            s = self.slot
            self.done[s].synchronize()  # this buffer's previous H2D copy has finished
            _read_exact(f, self.views[s][:n], entry.begin + pos, path, entry.name)
            with torch.cuda.stream(self.stream):
                dst[pos : pos + n].copy_(self.bufs[s][:n], non_blocking=True)
                self.done[s].record(self.stream)
            self.slot = 1 - s
            pos += n
        main.wait_stream(self.stream)  # consumers on the main stream see the finished tensor
        return dst.view(entry.dtype).view(entry.shape)

    def close(self) -> None:
        for e in self.done:
            e.synchronize()
        self.bufs = self.views = []


def iter_tensors(
    source: Union[PathLike, SafetensorsHeader],
    device: Union[str, torch.device] = "cpu",
    names: Optional[Iterable[str]] = None,
    host: Optional[Callable[[str], bool]] = None,
    chunk_bytes: int = DEFAULT_CHUNK_BYTES,
) -> Iterator[tuple[str, torch.Tensor]]:
    """Yield (name, tensor) in file order, each read once straight to `device`.

    names: subset to read (default all). host(name) -> True keeps that tensor on the CPU (small metadata
    tensors that are parsed on the host anyway). Host RAM in use at any time: one CPU tensor, or on CUDA the two
    pinned `chunk_bytes` staging buffers.
    """
    header = source if isinstance(source, SafetensorsHeader) else read_header(source)
    path = header.path
    device = torch.device(device)
    wanted = None if names is None else set(names)
    if wanted is not None and not wanted <= header.entries.keys():
        missing = sorted(wanted - header.entries.keys())
        raise KeyError(f"{path}: no tensors named {missing[:5]}")
    entries = [e for e in header.entries.values() if wanted is None or e.name in wanted]
    staging = None
    with open(path, "rb", buffering=0) as f:
        if hasattr(os, "posix_fadvise"):
            os.posix_fadvise(f.fileno(), 0, 0, os.POSIX_FADV_SEQUENTIAL)
        try:
            for e in entries:
                on_host = device.type == "cpu" or (host is not None and host(e.name))
                if on_host or device.type != "cuda":
                    t = torch.empty(e.shape, dtype=e.dtype)
                    if e.nbytes:
                        _read_exact(f, _host_bytes(t), e.begin, path, e.name)
                    if not on_host:
                        t = t.to(device)
                else:
                    if staging is None:
                        staging = _CudaStaging(device, max(1, min(chunk_bytes, max(x.nbytes for x in entries))))
                    t = staging.read(f, e, path)
                yield e.name, t
                del t
        finally:
            if staging is not None:
                staging.close()


def load_file(path: PathLike, device: Union[str, torch.device] = "cpu") -> dict[str, torch.Tensor]:
    """Whole file as a dict (small files, tests)."""
    return dict(iter_tensors(path, device))


# ---- writing -------------------------------------------------------------------------------------------
class SafetensorsWriter:
    """Append tensors to a safetensors file one by one; the header is written on `close()`.

    Data goes after a reserved header area; if the final header does not fit there, the data is moved once
    (rare: only when `header_reserve` was too small). The file appears under its name only when complete
    (a temp sibling, flushed and renamed: loaders/atomic.py).
    """

    def __init__(self, path: PathLike, metadata: Optional[Mapping[str, str]] = None, header_reserve: int = 1 << 16):
        self.path = Path(path)
        remove_stale_temps(self.path)
        self.tmp = temp_path(self.path)
        self.metadata = dict(metadata or {})
        self.reserve = -(-max(header_reserve, 64) // 8) * 8
        self.entries: dict[str, dict] = {}
        self.pos = 0
        with naming_full_disk(self.path):
            self._f = open(self.tmp, "wb")
            self._f.seek(8 + self.reserve)

    def add(self, name: str, tensor: torch.Tensor) -> None:
        if name in self.entries or name == "__metadata__":
            raise ValueError(f"{self.path}: tensor name {name!r} written twice or reserved")
        if tensor.dtype not in DTYPE_NAMES:
            raise ValueError(f"{self.path}: {name!r} has dtype {tensor.dtype}, which safetensors cannot store")
        t = tensor.detach().to("cpu").contiguous()
        n = t.numel() * t.element_size()
        if n:
            with naming_full_disk(self.path):
                self._f.write(_host_bytes(t))
        self.entries[name] = {"dtype": DTYPE_NAMES[t.dtype], "shape": list(t.shape), "data_offsets": [self.pos, self.pos + n]}
        self.pos += n

    def _header_bytes(self) -> bytes:
        head = dict(self.entries)
        if self.metadata:
            head = {"__metadata__": self.metadata, **head}
        return json.dumps(head, separators=(",", ":")).encode("utf-8")

    def close(self) -> Path:
        with naming_full_disk(self.path):
            return self._close()

    def _close(self) -> Path:
        header = self._header_bytes()
        if len(header) <= self.reserve:
            self._f.seek(0)
            self._f.write(struct.pack("<Q", self.reserve) + header + b" " * (self.reserve - len(header)))
            self._f.close()
        else:
            self._f.close()
            padded = header + b" " * (-(8 + len(header)) % 8)
            moved = temp_path(self.path)
            try:
                with open(self.tmp, "rb") as src, open(moved, "wb") as dst:
                    dst.write(struct.pack("<Q", len(padded)) + padded)
                    src.seek(8 + self.reserve)
                    shutil.copyfileobj(src, dst, 16 << 20)
                os.replace(moved, self.tmp)
            finally:
                moved.unlink(missing_ok=True)
        return commit(self.tmp, self.path)

    def abort(self) -> None:
        if not self._f.closed:
            try:
                self._f.close()  # flushes what is buffered: on a full disk that fails again, and the temp goes anyway
            except OSError:
                pass
        self.tmp.unlink(missing_ok=True)

    def __enter__(self) -> "SafetensorsWriter":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            self.close()
        else:
            self.abort()
