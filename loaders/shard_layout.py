"""The sharded float layouts the LingBot-World releases use for a DiT folder (file names only; expert_format.py
reads what is in them).

- v1 (diffusers): `diffusion_pytorch_model-0000k-of-0000N.safetensors` + `diffusion_pytorch_model.safetensors.index.json`
  + config.json, or one `diffusion_pytorch_model.safetensors`;
- v2 (transformers-style names, lingbot-world-v2.md §7.1-7.2): `model-0000k-of-0000N.safetensors` +
  `model.safetensors.index.json`; the 14B in the download's `transformers/` subfolder with a config.json, the 1.3B as a
  flat folder without one. A set of `model-*-of-*` shards without its index is read too, when it is complete.
"""
from __future__ import annotations

import re
from pathlib import Path
from typing import Optional

OFFICIAL_INDEX = "diffusion_pytorch_model.safetensors.index.json"
OFFICIAL_SINGLE = "diffusion_pytorch_model.safetensors"
SHARD_INDEX = "model.safetensors.index.json"
SHARD_INDEXES = (OFFICIAL_INDEX, SHARD_INDEX)
SHARD_NAME = re.compile(r"model-(\d+)-of-(\d+)\.safetensors")
V2_DIT_SUBFOLDER = "transformers"  # v2's `fast_checkpoint` (v2 wan/configs/wan_i2v_A14B.py)


class IncompleteShards(FileNotFoundError):
    """Some of a `model-0000k-of-0000N` set are missing (an unfinished download)."""


def shard_index(folder: Path) -> Optional[Path]:
    """The folder's shard index (the v1 or the v2 name), or None."""
    for name in SHARD_INDEXES:
        if (Path(folder) / name).is_file():
            return Path(folder) / name
    return None


def shard_set(folder: Path) -> tuple[Path, ...]:
    """The `model-0000k-of-0000N.safetensors` shards of `folder` in order, all N of them; () when there are none.

    Raises IncompleteShards when some are missing or the names disagree on N."""
    found = {}
    for p in Path(folder).glob("model-*-of-*.safetensors"):
        m = SHARD_NAME.fullmatch(p.name)
        if m:
            found[p] = (int(m.group(1)), int(m.group(2)))
    if not found:
        return ()
    totals = {n for _, n in found.values()}
    numbers = sorted(k for k, _ in found.values())
    if len(totals) != 1 or numbers != list(range(1, max(totals) + 1)):
        names = ", ".join(sorted(p.name for p in found)[:6])
        raise IncompleteShards(f"{folder}: the shards {names} are not one complete model-0000k-of-0000N set; finish "
                               f"the download (or add its {SHARD_INDEX})")
    return tuple(sorted(found, key=lambda p: found[p][0]))


def is_sharded_folder(folder: Path) -> bool:
    """Does `folder` hold a sharded float DiT in one of these layouts (an index, the diffusers single file, or a
    complete v2 shard set)? What model_folders needs to list a folder as an expert."""
    folder = Path(folder)
    if shard_index(folder) is not None or (folder / OFFICIAL_SINGLE).is_file():
        return True
    try:
        return bool(shard_set(folder))
    except IncompleteShards:
        return False
