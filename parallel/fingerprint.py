"""A cheap identity of checkpoint files, compared across ranks before anything loads.

Hashing 9.6 GB per expert on every rank would take longer than loading it, so a file is identified by its size and
a sha256 of its first and last MiB (a safetensors file starts with its header: names, shapes, dtypes and offsets
of every tensor), plus the model config the pack read from it. Two different checkpoints (another release,
another quantization, a truncated copy) differ there; a rank that sees other files than rank 0 is named.
"""
from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Iterable, Mapping, Optional

EDGE = 1 << 20  # bytes hashed at each end of a file


def file_digest(path: Path, edge: int = EDGE) -> str:
    size = path.stat().st_size
    h = hashlib.sha256(str(size).encode())
    with open(path, "rb") as f:
        h.update(f.read(edge))
        if size > 2 * edge:
            f.seek(size - edge)
            h.update(f.read(edge))
        elif size > edge:
            h.update(f.read())
    return h.hexdigest()[:16]


def model_fingerprint(path, config_json: Optional[Mapping] = None, files: Optional[Iterable] = None) -> dict:
    """{"name": folder or file name, "digest": ...} of one model (its weight files and config)."""
    path = Path(path)
    paths = sorted(Path(p) for p in files) if files is not None else (
        [path] if path.is_file() else sorted(p for p in path.iterdir() if p.is_file()))
    h = hashlib.sha256(repr(sorted((config_json or {}).items())).encode())
    for p in paths:
        h.update(p.name.encode())
        h.update(file_digest(p).encode())
    return {"name": path.name, "digest": h.hexdigest()[:16]}


def expert_fingerprint(path) -> dict:
    """The fingerprint of an expert folder/file as the loaders see it (format, weight files, config)."""
    from ..loaders.expert_format import detect_format

    fmt = detect_format(path)
    fp = model_fingerprint(fmt.path, {"kind": fmt.kind, **fmt.config.to_json()}, fmt.files)
    fp["name"] = str(Path(path).expanduser())
    return fp


def mismatch(fingerprints: list[dict], what: str) -> Optional[str]:
    """One line naming the ranks whose `what` differs from rank 0's, or None when every rank agrees."""
    ref = fingerprints[0]
    bad = [r for r, fp in enumerate(fingerprints) if fp["digest"] != ref["digest"]]
    if not bad:
        return None
    seen = ", ".join(f"rank {r}: {fingerprints[r]['name']} ({fingerprints[r]['digest']})" for r in bad[:4])
    return (f"the ranks load different {what}: rank 0 has {ref['name']} ({ref['digest']}), {seen}; every process "
            "must read the same files (same folder, or identical copies on every machine)")



def tensor_digest(t, sample_above: int = 256 << 20) -> str:
    """Shape, dtype and a sha256 of a tensor's bytes (for tensors over `sample_above` bytes, of an evenly strided
    subsample of its elements plus its first and last MiB), computed on the CPU: equal exactly when the bytes are."""
    import torch

    flat = t.detach().reshape(-1)
    h = hashlib.sha256(f"{tuple(t.shape)} {t.dtype}".encode())
    nbytes = flat.numel() * flat.element_size()
    if nbytes > sample_above:
        edge = max(1, EDGE // flat.element_size())
        step = max(1, flat.numel() // (sample_above // flat.element_size()))
        flat = torch.cat([flat[:edge], flat[::step], flat[-edge:]])
    raw = flat.cpu().contiguous().view(torch.uint8) if flat.numel() else flat.cpu().view(torch.uint8)
    h.update(raw.numpy().tobytes())
    return h.hexdigest()[:16]
