"""Convert once: a release's float DiT folder gets its NF4 / FP8 / INT8 copy beside it the first time it is loaded
with those weights, and every later load reads the copy.

The copy of `<folder>` is `<folder>_bnb_nf4` (`_fp8`, `_int8`), the names `convert-expert`, `convert-fp8` and
`convert-int8` give it, so a copy made on the command line is found too. It is written through world/convert.py
(tagged with the model and its licence) into a hidden folder that is renamed when complete: a run stopped halfway
leaves no half copy, and the next load starts it again. The disk space is checked first.
"""
from __future__ import annotations

import logging
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional

from .hub import STORED_SUFFIXES, check_disk, gb

log = logging.getLogger(__name__)

SUFFIX = dict(zip(("nf4", "fp8", "int8"), STORED_SUFFIXES))
BYTES_PER_WEIGHT = {"nf4": 0.6, "fp8": 1.05, "int8": 1.05}  # 4 bits + block scales; 8 bits + row scales


@dataclass(frozen=True)
class Chosen:
    """The folder a load reads and how it came to be."""

    path: Path
    how: str  # "as chosen", "copy" (read the stored copy), "made" (made the copy now)

    def line(self, source: Path, weights: str) -> str:
        if self.how == "made":
            return f"made the {weights.upper()} copy {self.path.name} of {source.name} (first load); later loads read it"
        if self.how == "copy":
            return f"read the {weights.upper()} copy {self.path.name} beside {source.name}"
        return f"read {self.path.name} as it is"


def copy_path(source: Path, weights: str) -> Path:
    return Path(source).parent / (Path(source).name + SUFFIX[weights])


def _complete(folder: Path) -> bool:
    return (folder / "config.json").is_file() and any(folder.glob("*.safetensors"))


def needs_copy(source: Path, weights: str) -> bool:
    """Is `source` a release's float DiT folder that `weights` reads through a stored copy?"""
    from ..loaders.expert_format import detect_format

    if weights not in SUFFIX or not Path(source).is_dir():
        return False
    return detect_format(source).weights == "float"


def find(source: Path, weights: str) -> Optional[Path]:
    """The complete stored copy of `source` in `weights`, if there is one."""
    if weights not in SUFFIX:
        return None
    copy = copy_path(source, weights)
    return copy if _complete(copy) else None


def estimate_bytes(source: Path, weights: str) -> int:
    """About how large the copy will be, from the source's tensor sizes in its headers."""
    from ..loaders.expert_format import detect_format

    fmt = detect_format(source)
    numel = 0
    for header in fmt.headers.values():
        for e in header.entries.values():
            n = 1
            for d in e.shape:
                n *= int(d)
            numel += n
    if numel == 0:  # no headers read: the files' size at 2 bytes a weight
        numel = fmt.file_bytes // 2
    return int(numel * BYTES_PER_WEIGHT[weights])


def ensure(source: Path, weights: str, *, model: Optional[str] = None, device=None,
           progress: Optional[Callable[[int, int], None]] = None, say: Callable[[str], None] = log.info) -> Chosen:
    """The folder to load for `source` with `weights`: the source itself when it needs no copy, else its stored copy,
    made now when there is none (disk checked first)."""
    source = Path(source)
    if not needs_copy(source, weights):
        return Chosen(source, "as chosen")
    found = find(source, weights)
    if found is not None:
        return Chosen(found, "copy")
    out = copy_path(source, weights)
    need = estimate_bytes(source, weights)
    check_disk(out.parent, need, f"the {weights.upper()} copy of {source}")
    say(f"making the {weights.upper()} copy of {source} once ({gb(need)}, into {out}); later loads read it")
    tmp = out.with_name(f".{out.name}.tmp{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    from .convert import convert

    try:
        convert(source, tmp, weights, model=model, device=device, progress=progress)
        if not out.exists():
            os.replace(tmp, out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return Chosen(out, "made")
