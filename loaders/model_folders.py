"""Find LingBot-World files inside model folders (ComfyUI's `models/...` roots or any other folder list).

ComfyUI's `folder_paths` only lists files, but an expert is usually a *folder* (the community NF4 layout
`<name>_bnb_nf4/{config.json, model.safetensors}` or the official diffusers shards). These helpers walk a
list of roots and return names relative to their root (posix separators), which is what a node's combo
shows and what a saved workflow stores. They know nothing about ComfyUI: `nodes/` passes the roots in.

Everything here runs on every UI refresh, so it is cheap: directory listings, `stat`, and for loose
`.safetensors` files one header read that is cached by (path, size, mtime).
"""
from __future__ import annotations

import json
import logging
import os
import re
import struct
from pathlib import Path
from typing import Iterable, Optional, Sequence, Union

from .action_files import ACT_FILE, IJKL_FILE, WASD_FILE
from .camera_files import INTRINSICS_FILE, POSES_FILE
from .checkpoint_dir import T5_FILES, VAE_FILES
from .shard_layout import is_sharded_folder

log = logging.getLogger(__name__)

PathLike = Union[str, os.PathLike]
MAX_DEPTH = 4  # <root>/<repo>/<expert>/ is depth 2; leave room for an extra level of grouping
SKIP_DIRS = {".git", ".cache", "__pycache__", ".huggingface"}
TOKENIZER_FILES = ("tokenizer.json", "spiece.model")
CAMERA_MARKER_KEY = "patch_embedding_wancamctrl."  # only LingBot-World DiTs have the camera patch embedding
_MAX_HEADER = 100 * 1024 * 1024

_header_cache: dict[tuple[str, int, int], bool] = {}


def is_expert_dir(path: PathLike) -> bool:
    """True for a folder that holds one DiT expert in a layout `detect_format` reads."""
    p = Path(path)
    if (p / "config.json").is_file() and ((p / "model.safetensors").is_file() or (p / "model.pt").is_file()):
        return True
    return is_sharded_folder(p)  # a release's float shards: v1's diffusers naming or v2's model-* (no config: 1.3B)


def _walk(root: Path, max_depth: int) -> Iterable[tuple[Path, list[str], list[str]]]:
    """os.walk with a depth limit, hidden/cache folders skipped, symlinked folders followed."""
    if not root.is_dir():
        return
    base_depth = len(root.parts)
    for dirpath, dirnames, filenames in os.walk(root, followlinks=True):
        here = Path(dirpath)
        depth = len(here.parts) - base_depth
        dirnames[:] = sorted(d for d in dirnames if d not in SKIP_DIRS and not d.startswith("."))
        if depth >= max_depth:
            dirnames[:] = []
        yield here, dirnames, filenames


def _rel(path: Path, root: Path) -> str:
    return path.relative_to(root).as_posix()


def scan_expert_dirs(roots: Sequence[PathLike], max_depth: int = MAX_DEPTH) -> list[str]:
    """Relative names of expert folders under any of `roots` (first root wins on duplicates), sorted."""
    found: dict[str, None] = {}
    for root in map(Path, roots):
        for here, dirnames, _ in _walk(root, max_depth):
            if here != root and is_expert_dir(here):
                found.setdefault(_rel(here, root))
                dirnames[:] = []  # an expert folder holds no further experts
    return sorted(found)


def is_lingbot_safetensors(path: PathLike) -> bool:
    """Does this .safetensors file hold a LingBot-World DiT (it has the camera patch embedding)?

    Reads only the header; the answer is cached by (path, size, mtime), so a model folder full of other
    checkpoints costs one small read per file, once.
    """
    p = Path(path)
    try:
        st = p.stat()
    except OSError:
        return False
    key = (str(p), st.st_size, st.st_mtime_ns)
    if key in _header_cache:
        return _header_cache[key]
    answer = False
    try:
        with open(p, "rb") as f:
            raw = f.read(8)
            if len(raw) == 8:
                (n,) = struct.unpack("<Q", raw)
                if 0 < n <= min(_MAX_HEADER, st.st_size - 8):
                    header = json.loads(f.read(n).decode("utf-8"))
                    answer = isinstance(header, dict) and any(CAMERA_MARKER_KEY in k for k in header)
    except (OSError, UnicodeDecodeError, ValueError) as e:
        log.debug("not a readable safetensors file %s: %s", p, e)
    _header_cache[key] = answer
    return answer


def _walk_outside_experts(roots: Sequence[PathLike], max_depth: int):
    """(root, folder, file names) for every folder under `roots`, not descending into expert folders."""
    for root in map(Path, roots):
        for here, dirnames, filenames in _walk(root, max_depth):
            if here != root and is_expert_dir(here):
                dirnames[:] = []
                continue
            yield root, here, filenames


def scan_expert_files(roots: Sequence[PathLike], max_depth: int = MAX_DEPTH) -> list[str]:
    """Relative names of loose single-file LingBot experts (`*.safetensors` outside expert folders)."""
    found: dict[str, None] = {}
    for root, here, filenames in _walk_outside_experts(roots, max_depth):
        for name in sorted(filenames):
            if name.endswith((".safetensors", ".sft")) and is_lingbot_safetensors(here / name):
                found.setdefault(_rel(here / name, root))
    return sorted(found)


def scan_named_files(roots: Sequence[PathLike], names: Sequence[str], max_depth: int = MAX_DEPTH) -> list[str]:
    """Relative paths of files called one of `names` (e.g. the release's T5/VAE files) under `roots`."""
    wanted = set(names)
    found: dict[str, None] = {}
    for root, here, filenames in _walk_outside_experts(roots, max_depth):
        for name in sorted(filenames):
            if name in wanted:
                found.setdefault(_rel(here / name, root))
    return sorted(found)


def scan_t5_files(roots: Sequence[PathLike]) -> list[str]:
    return scan_named_files(roots, T5_FILES)


def scan_vae_files(roots: Sequence[PathLike]) -> list[str]:
    return scan_named_files(roots, VAE_FILES)


def scan_tokenizer_dirs(roots: Sequence[PathLike], max_depth: int = MAX_DEPTH) -> list[str]:
    """Relative names of folders holding tokenizer.json or spiece.model (google/umt5-xxl/, tokenizer/)."""
    found: dict[str, None] = {}
    for root, here, filenames in _walk_outside_experts(roots, max_depth):
        if here != root and any(n in filenames for n in TOKENIZER_FILES):
            found.setdefault(_rel(here, root))
    return sorted(found)


def scan_trajectory_dirs(roots: Sequence[PathLike], max_depth: int = 3) -> list[str]:
    """Relative names of camera trajectory folders (poses.npy + intrinsics.npy, the release's action_path
    layout) under `roots`, e.g. ComfyUI's input folder; a root that is itself one is not listed."""
    found: dict[str, None] = {}
    for root in map(Path, roots):
        for here, _, filenames in _walk(root, max_depth):
            if here != root and POSES_FILE in filenames and INTRINSICS_FILE in filenames:
                found.setdefault(_rel(here, root))
    return sorted(found)


def scan_key_dirs(roots: Sequence[PathLike], max_depth: int = 3) -> list[str]:
    """Relative names of key-file folders under `roots` (e.g. ComfyUI's input folder), like the release's examples:
    wasd_action.npy and/or ijkl_action.npy (keys for act-to-camera), or action.npy + poses.npy + intrinsics.npy (the
    Act model's input); a root that is itself one is not listed."""
    found: dict[str, None] = {}
    for root in map(Path, roots):
        for here, _, filenames in _walk(root, max_depth):
            names = set(filenames)
            keys = WASD_FILE in names or IJKL_FILE in names
            act = {ACT_FILE, POSES_FILE, INTRINSICS_FILE} <= names
            if here != root and (keys or act):
                found.setdefault(_rel(here, root))
    return sorted(found)


def resolve_in_roots(roots: Sequence[PathLike], name: str, want_dir: Optional[bool] = None) -> Optional[Path]:
    """The first `<root>/<name>` that exists (a folder if want_dir, a file if not, either if None).

    Names come from workflows, so anything that climbs out of its root (`..`, absolute paths) is refused.
    """
    rel = Path(name)
    if not name or rel.is_absolute() or ".." in rel.parts:
        return None
    for root in map(Path, roots):
        p = root / rel
        ok = p.is_dir() if want_dir else p.is_file() if want_dir is False else p.exists()
        if ok:
            return p
    return None


def pick_default(names: Sequence[str], *hints: str, avoid: Sequence[str] = ()) -> Optional[str]:
    """The first name containing every hint (case-insensitive), for combo defaults such as 'high_noise'. Names with
    one of the `avoid` words as a whole word of their path (e.g. 'act' in lingbot-world-base-act/high_noise_model)
    are picked only when no other name fits."""
    fits = [n for n in names if all(h in n.lower() for h in hints)]
    avoided = set(avoid)
    preferred = [n for n in fits if not avoided & set(re.split(r"[^a-z0-9]+", n.lower()))]
    return (preferred or fits or [None])[0]
