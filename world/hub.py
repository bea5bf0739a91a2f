"""A model's files fetched from its hub repository (the registry's `files.hub_repo`) through huggingface_hub: its
cache, tokens and mirrors (`HF_ENDPOINT`) are the user's, and an interrupted download resumes where it stopped.

A name as the loaders list it, relative to a models folder (`lingbot-world-base-cam/high_noise_model`,
`lingbot-world-base-cam/lingbot_world_fast_bnb_nf4`, `lingbot-world-v2-1.3b-causal-fast`,
`lingbot-world-base-cam/models_t5_umt5-xxl-enc-bf16.pth`), is matched to the model whose download holds it (the
folder `ModelEntry.hub_dir` the repository's root goes into) and to the part of that repository it needs: one
expert, the DiT, the umT5 encoder with its tokenizer, or the VAE. Only those files are fetched. A stored copy's name
(`_bnb_nf4`, `_fp8`, `_int8`) fetches the release's folder it is made from (world/stored_copy.py makes the copy).
"""
from __future__ import annotations

import inspect
import logging
import shutil
import threading
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Callable, Optional

from .models import ModelEntry, entries

log = logging.getLogger(__name__)

STORED_SUFFIXES = ("_bnb_nf4", "_fp8", "_int8")
T5_FILE = "models_t5_umt5-xxl-enc-bf16.pth"
TOKENIZER_DIR = "google/umt5-xxl"
VAE_FILE = "Wan2.1_VAE.pth"
ROOT_DIT = ("config.json", "*.safetensors", "*.safetensors.index.json")  # a DiT at the repository's root
DISK_MARGIN = 1 << 30  # left free after a download
REVISION = "main"
_lock = threading.Lock()

Progress = Callable[[int, int], None]  # (bytes done, bytes in all)


@dataclass(frozen=True)
class HubPart:
    """The files of one part of a model's repository that a loader's choice needs."""

    entry: ModelEntry
    part: str  # "dit", "high", "low", "text_encoder", "vae"
    patterns: tuple[str, ...]  # "dir/" = everything under dir; else a file name at the root (fnmatch)

    @property
    def repo(self) -> str:
        return self.entry.files.hub_repo

    @property
    def folder(self) -> str:
        return self.entry.hub_dir

    def what(self) -> str:
        words = {"dit": "DiT", "high": "high-noise expert", "low": "low-noise expert",
                 "text_encoder": "umT5 text encoder and tokenizer", "vae": "Wan 2.1 VAE"}[self.part]
        return f"{self.entry.title}'s {words}"

    def source(self) -> str:
        return f"huggingface.co/{self.repo}"

    def wants(self, path: str) -> bool:
        from fnmatch import fnmatch

        for p in self.patterns:
            if p.endswith("/"):
                if path.startswith(p):
                    return True
            elif "/" not in path and fnmatch(path, p):
                return True
        return False


def strip_stored_suffix(name: str) -> tuple[str, Optional[str]]:
    """`x_bnb_nf4` -> ("x", "nf4"), `x_fp8` -> ("x", "fp8"); other names unchanged with None."""
    for suffix, weights in zip(STORED_SUFFIXES, ("nf4", "fp8", "int8")):
        if name.endswith(suffix):
            return name[: -len(suffix)], weights
    return name, None


def part_for(name: str) -> Optional[HubPart]:
    """The part of a model's hub repository that provides the loader choice `name`, or None when no download
    does (a name of the user's own, a demo entry, ComfyUI's repackaged files)."""
    parts = PurePosixPath(str(name).replace("\\", "/")).parts
    if not parts:
        return None
    last, _ = strip_stored_suffix(parts[-1])
    base = "/".join((*parts[:-1], last))
    for entry in sorted(entries(), key=lambda e: -len(e.hub_dir)):  # the deepest folder first (v1 Fast's)
        top = entry.hub_dir
        if base == top:
            rest = ""
        elif base.startswith(top + "/"):
            rest = base[len(top) + 1:]
        else:
            continue
        part = _part(entry, rest)
        if part is not None:
            return part
    return None


def _part(entry: ModelEntry, rest: str) -> Optional[HubPart]:
    files = entry.files
    if rest in (T5_FILE, TOKENIZER_DIR, "google") and files.shared_files:
        return HubPart(entry, "text_encoder", (T5_FILE, TOKENIZER_DIR + "/"))
    if rest == VAE_FILE and files.shared_files:
        return HubPart(entry, "vae", (VAE_FILE,))
    for which, dirs in files.experts:
        if rest and rest in dirs:
            official = strip_stored_suffix(rest)[0]
            return HubPart(entry, which, (official + "/",))
    if not entry.causal:
        return None
    dit_at_root = entry.hub_dir.rsplit("/", 1)[-1] in files.official  # v1 Fast: the repository is the DiT folder
    if rest == "" and (dit_at_root or "" in files.official):
        return HubPart(entry, "dit", ROOT_DIT if dit_at_root else ROOT_DIT + tuple(f"{d}/" for d in files.official if d))
    if rest and rest in files.official:
        return HubPart(entry, "dit", (f"{rest}/",))
    return None


@dataclass
class DownloadPlan:
    part: HubPart
    target: Path  # the folder the repository's files go into
    files: list[tuple[str, int]]  # every file the part needs: (path in the repository, bytes)
    missing: list[tuple[str, int]]  # those not complete on disk yet
    revision: str
    endpoint: Optional[str] = None

    @property
    def bytes_missing(self) -> int:
        return sum(size for _, size in self.missing)


def plan(part: HubPart, models_root: Path, endpoint: Optional[str] = None) -> DownloadPlan:
    """What the part needs from the repository and what is still missing under `models_root` (asks the hub;
    endpoint None: huggingface_hub's, i.e. HF_ENDPOINT or huggingface.co)."""
    from huggingface_hub import HfApi

    info = HfApi(endpoint=endpoint).model_info(part.repo, revision=REVISION, files_metadata=True)
    files = [(s.rfilename, int(s.size or 0)) for s in (info.siblings or []) if part.wants(s.rfilename)]
    if not files:
        raise FileNotFoundError(f"{part.source()} holds none of the files of the {part.what()} "
                                f"({', '.join(part.patterns)}): has the repository changed?")
    target = Path(models_root) / part.folder
    missing = [(f, n) for f, n in files if not _complete(target / f, n)]
    return DownloadPlan(part, target, files, missing, info.sha or REVISION, endpoint)


def _complete(path: Path, size: int) -> bool:
    return path.is_file() and (size == 0 or path.stat().st_size == size)


def gb(n: int) -> str:
    return f"{n / 1e9:.1f} GB" if n >= 1e8 else f"{n / 1e6:.1f} MB"


def check_disk(folder: Path, need: int, what: str) -> None:
    """One line when `need` bytes (plus a margin) do not fit on the disk of `folder`."""
    probe = Path(folder)
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    free = shutil.disk_usage(probe).free
    if need + DISK_MARGIN > free:
        raise OSError(f"not enough disk space for {what}: it needs {gb(need)} in {folder} (and {gb(DISK_MARGIN)} to "
                      f"spare), {gb(free)} is free; free some space or put the models folder on a larger disk")


def fetch(part: HubPart, models_root: Path, progress: Optional[Progress] = None,
          say: Callable[[str], None] = log.info, endpoint: Optional[str] = None) -> DownloadPlan:
    """Download the part's missing files into `models_root`/<its folder>, resuming partial files; returns the
    plan (its target folder). The licence is said before anything is fetched."""
    with _lock:
        p = plan(part, models_root, endpoint)
        total = sum(n for _, n in p.files)
        if not p.missing:
            return p
        check_disk(p.target, p.bytes_missing, f"the {part.what()}")
        say(f"downloading the {part.what()} ({gb(p.bytes_missing)} of {gb(total)}, {len(p.missing)} files) from "
            f"{part.source()} into {p.target}; {part.entry.licence.line()}")
        done = total - p.bytes_missing
        if progress is not None:
            progress(done, total)
        for name, size in p.missing:
            done = _download(p, name, done, total, progress) + size
        say(f"downloaded the {part.what()} into {p.target}")
        return p


def _download(p: DownloadPlan, name: str, done: int, total: int, progress: Optional[Progress]) -> int:
    """One file, resumed where a partial download stopped; returns `done` before this file."""
    from huggingface_hub import hf_hub_download

    bar = None if progress is None else (lambda n: progress(min(done + n, total), total))
    hf_hub_download(p.part.repo, name, revision=p.revision, local_dir=str(p.target), endpoint=p.endpoint,
                    **_bar_kwargs(bar))
    if progress is not None:
        progress(min(done + dict(p.files)[name], total), total)
    return done


def _bar_kwargs(on_bytes: Optional[Callable[[int], None]]) -> dict:
    """hf_hub_download's keyword for a byte bar reporting to `on_bytes` (none when there is nothing to report to or
    the installed huggingface_hub takes no tqdm_class)."""
    from huggingface_hub import hf_hub_download

    if on_bytes is None or "tqdm_class" not in inspect.signature(hf_hub_download).parameters:
        return {}
    return {"tqdm_class": _bar_class(on_bytes)}


def _bar_class(on_bytes: Callable[[int], None]):
    """A tqdm for huggingface_hub's byte bar that reports the bytes of the file so far (resumed ones included)."""
    from huggingface_hub.utils import tqdm as hf_tqdm

    class Bar(hf_tqdm):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self._seen = int(kwargs.get("initial") or 0)
            on_bytes(self._seen)

        def update(self, n=1):
            self._seen += int(n or 0)
            on_bytes(self._seen)
            return super().update(n)

    return Bar


@dataclass(frozen=True)
class HubFile:
    """One file a node fetches into a ComfyUI folder of its kind: a tiny decoder into vae_approx."""

    repo: str
    name: str
    what: str
    licence: str

    def source(self) -> str:
        return f"huggingface.co/{self.repo}"


# The tiny decoders LingBot Play offers before they are installed; lightx2v keeps both on the hub (TAEHV's own
# weights are published on GitHub only).
TINY_DECODERS = {f.name: f for f in (
    HubFile("lightx2v/Autoencoders", "taew2_1.safetensors", "TAEHV tiny decoder for Wan 2.1 (23 MB)",
            "licence: MIT (TAEHV, Ollin Boer Bohan), in lightx2v's Apache-2.0 collection"),
    HubFile("lightx2v/Autoencoders", "lighttaew2_1.safetensors", "lightx2v tiny decoder for Wan 2.1",
            "licence: Apache-2.0 (lightx2v)"),
)}


def fetch_file(f: HubFile, folder: Path, progress: Optional[Progress] = None,
               say: Callable[[str], None] = log.info, endpoint: Optional[str] = None) -> Path:
    """Download one file into `folder` unless it is there whole (a partial one resumes); returns its path. The
    licence is said before the file is fetched."""
    from huggingface_hub import HfApi, hf_hub_download

    with _lock:
        info = HfApi(endpoint=endpoint).model_info(f.repo, revision=REVISION, files_metadata=True)
        size = next((int(s.size or 0) for s in (info.siblings or []) if s.rfilename == f.name), None)
        if size is None:
            raise FileNotFoundError(f"{f.source()} holds no {f.name}: has the repository changed?")
        target = Path(folder) / f.name
        if _complete(target, size):
            return target
        check_disk(Path(folder), size, f"the {f.what}")
        say(f"downloading the {f.what} ({gb(size)}) from {f.source()} into {folder}; {f.licence}")
        bar = None if progress is None else (lambda n: progress(min(n, size), size))
        hf_hub_download(f.repo, f.name, revision=info.sha or REVISION, local_dir=str(folder), endpoint=endpoint,
                        **_bar_kwargs(bar))
        if progress is not None:
            progress(size, size)
        say(f"downloaded the {f.what} into {folder}")
        return target


def release_names(kind: str) -> list[str]:
    """The release parts of every registry model, named as a model folder lists them (`<hub dir>/<part>`), by the
    kind of file a loader picks: "experts", "fast", "text_encoder", "vae". The nodes offer them before they exist."""
    out = []
    for e in entries():
        top = e.hub_dir
        if kind == "experts":
            out += [f"{top}/{dirs[-1]}" for _, dirs in e.files.experts]
        elif kind == "fast" and e.causal:
            official = e.files.official_dir
            out.append(top if top.rsplit("/", 1)[-1] == official or not official or "" in e.files.official
                       else f"{top}/{official}")
        elif kind == "text_encoder" and e.files.shared_files and e.files.experts:
            out.append(f"{top}/{T5_FILE}")
        elif kind == "vae" and e.files.shared_files and e.files.experts:
            out.append(f"{top}/{VAE_FILE}")
    return list(dict.fromkeys(out))
