"""Model choices the loaders get from the graph: downloaded when missing, converted once when read as a stored copy.

A loader's choice that names a model's release layout (`lingbot-world-base-cam/high_noise_model`,
`lingbot-world-base-cam/lingbot_world_fast`, `lingbot-world-v2-1.3b-causal-fast`, the release's umT5 and VAE
files) is listed before it exists, like the demo entries. When it is missing, the queue-time check says what it is,
where it comes from and its licence, and asks for the node's `download` switch; with the switch on, the node fetches
only that part of the model's hub repository (world/hub.py, through huggingface_hub) into the first lingbot_world
folder, with the progress on ComfyUI's bar and the node. A release's float DiT read with nf4 / fp8 / int8 weights is
read through its stored copy, made beside it on the first load (world/stored_copy.py); the node says which folder
it read. No ComfyUI import at module level.
"""
from __future__ import annotations

import logging
from pathlib import Path
from typing import Optional

from ...world import hub, stored_copy
from . import comfy_paths, demo_models

log = logging.getLogger(__name__)

DOWNLOAD = ("BOOLEAN", {"default": False, "label_on": "download if missing", "label_off": "no download",
                        "tooltip": (
    "Download the chosen model when it is not installed: only its files, from its Hugging Face repository "
    "(huggingface_hub: your token, cache and HF_ENDPOINT mirror) into ComfyUI/models/lingbot_world, with the "
    "progress on this node; a stopped download resumes. The queue-time message says the size's source and the "
    "model's licence first (the v2 models are CC BY-NC-SA 4.0: non-commercial).")})


def is_offer(name: str) -> bool:
    """A release name the loaders list before it is installed (picked as a default only when nothing else is)."""
    return hub.part_for(name) is not None


def _root() -> Optional[Path]:
    roots = comfy_paths.lingbot_roots()
    return Path(roots[0]) if roots else None


def source_for(name: str, resolve) -> Optional[Path]:
    """The installed release folder a stored copy's name is made from (`x_bnb_nf4` -> `x`), or None."""
    base, weights = hub.strip_stored_suffix(name.rstrip("/"))
    if weights is None:
        return None
    try:
        return resolve(base)
    except FileNotFoundError:
        return None


def missing_message(widget: str, name: str, download: bool) -> Optional[str]:
    """The queue-time line for a missing choice a download provides (None when no download does, or when the
    switch is on: the node fetches it)."""
    part = hub.part_for(name)
    if part is None or download:
        return None
    root = _root()
    where = f"{root / part.folder}" if root is not None else f"ComfyUI/models/lingbot_world/{part.folder}"
    files = _files_words(part)
    return (f"{widget}: {name} is not installed. It is the {part.what()}: {files}, from {part.source()} into {where}. "
            f"Turn on this node's download switch and press Run to fetch only those files (a stopped download "
            f"resumes); {part.entry.licence.line()}.")


def _files_words(part: hub.HubPart) -> str:
    words = []
    for p in part.patterns:
        if p.endswith("/"):
            words.append(f"the folder {p}")
        elif p == hub.ROOT_DIT[1] or p == hub.ROOT_DIT[2]:
            continue
        elif p == "config.json":
            words.append("config.json and the *.safetensors shards with their index")
        else:
            words.append(p)
    return ", ".join(words)


def fetch(name: str, what: str) -> Path:
    """Download the part of a model's repository that provides `name` into the first lingbot_world folder; the
    path of `name` afterwards (for a stored copy's name: the release folder it is made from)."""
    part = hub.part_for(name)
    root = _root()
    if part is None or root is None:
        raise comfy_paths.ModelFileNotFound(f"{what} '{name}' is not installed and no download provides it")
    hub.fetch(part, root, progress=_bar_progress(f"downloading the {part.what()}"), say=_say)
    base = hub.strip_stored_suffix(name)[0]
    return root / base


def _bar_progress(shown: Optional[str] = None):
    """A (done, total) callback driving a ComfyUI progress bar of one long step (each update is also ComfyUI's cancel
    point); with `shown`, every 5 % is also written on the node as "<shown>: done of total"."""
    import comfy.utils

    from .progress import show_on_node

    bar = comfy.utils.ProgressBar(1000)
    last = [-1]

    def progress(done: int, total: int) -> None:
        value = int(1000 * done / total) if total else 1000
        if value != last[0]:
            last[0] = value
            bar.update_absolute(value, 1000)
            if shown is not None and value % 50 == 0:
                show_on_node(f"{shown}: {hub.gb(done)} of {hub.gb(total)}")

    return progress


def _say(line: str) -> None:
    """A line for the log and the node."""
    from .progress import show_on_node

    log.info("LingBot-World: %s", line)
    show_on_node(line)


def convert_once(path: Path, weights: str, device=None) -> stored_copy.Chosen:
    """The folder a load with `weights` reads for `path`: its stored copy (made now the first time) or itself."""
    if weights not in stored_copy.SUFFIX or not stored_copy.needs_copy(path, weights):
        return stored_copy.Chosen(Path(path), "as chosen")
    found = stored_copy.find(path, weights)
    if found is not None:
        return stored_copy.Chosen(found, "copy")
    progress = _bar_progress()
    make_room(device)
    chosen = stored_copy.ensure(path, weights, device=device, progress=progress, say=_say)
    progress(1, 1)  # the writers count the files' bytes (headers too): the bar ends at its end
    return chosen


CONVERT_VRAM = 2 << 30  # the converter streams one tensor at a time: a few of the 14B's largest, in float32


def make_room(device) -> None:
    """Ask ComfyUI's model management for the converter's working memory on `device` first, as core's loaders do:
    `free_memory(bytes, device)` unloads other models (0.3.x and current cores, dynamic VRAM included, take these
    two arguments); the CPU needs nothing."""
    import torch

    if device is None or torch.device(device).type == "cpu":
        return
    import comfy.model_management as mm

    mm.free_memory(CONVERT_VRAM, torch.device(device))


def resolve(name: str, what: str, resolve_fn, download: bool) -> Path:
    """`name` through `resolve_fn` (a comfy_paths resolver); when missing: the release folder a stored copy's name
    is made from, else the download when the switch is on, else the resolver's own error."""
    try:
        return resolve_fn(name)
    except FileNotFoundError:
        if demo_models.is_demo_entry(name):
            raise
        source = source_for(name, resolve_fn)
        if source is not None:
            return source
        if download and hub.part_for(name) is not None:
            return fetch(name, what)
        message = missing_message(what, name, False)
        if message is not None:
            raise comfy_paths.ModelFileNotFound(message) from None
        raise


class Read:
    """The folder (or file) a loader reads for its choice, and the words the node shows for it."""

    def __init__(self, path: Path, said: str):
        self.path, self.said = Path(path), said


def read_folder(name: str, widget: str, weights: str, download: bool, device=None) -> Read:
    """An expert / causal-model choice -> what to load: downloaded when missing (switch on), a stored copy's name
    read from its release folder, a release's float folder read through its copy (made now the first time)."""
    def find(n: str) -> Path:
        return comfy_paths.resolve_expert(n, widget)

    path = resolve(name, widget, find, download)
    chosen = convert_once(path, weights, device)
    return Read(chosen.path, chosen.line(path, weights))


# ---- LingBot Play's tiny decoder ---------------------------------------------------------------------------------
DOWNLOAD_TINY_VAE = ("BOOLEAN", {"default": False, "label_on": "download if missing", "label_off": "no download",
                                 "tooltip": (
    "Download the chosen tiny decoder when it is not in ComfyUI/models/vae_approx: one file from its Hugging Face "
    "repository (huggingface_hub: your token, cache and HF_ENDPOINT mirror), a stopped download resumes. The "
    "queue-time message says where it comes from and its licence first.")})


def tiny_vae_choices() -> list[str]:
    """LingBot Play's tiny_vae list: none, the installed ones, then those a download provides."""
    found = comfy_paths.list_tiny_vaes()
    return found + [name for name in hub.TINY_DECODERS if name not in found]


def tiny_vae_missing(name: str, download: bool) -> Optional[str]:
    """The queue-time line for a tiny decoder that is offered but not installed (None: installed, not offered, or
    the switch is on)."""
    f = hub.TINY_DECODERS.get(name)
    if f is None or download:
        return None
    try:
        comfy_paths.resolve_tiny_vae(name)
        return None
    except FileNotFoundError:
        return _tiny_vae_line(f)


def _tiny_vae_line(f: hub.HubFile) -> str:
    return (f"tiny_vae: {f.name} is not installed. It is the {f.what}, from {f.source()} into ComfyUI/models/"
            f"vae_approx/. Turn on this node's download switch and press Run to fetch it, or put the file there "
            f"yourself and refresh the page (press R); {f.licence}.")


def resolve_tiny_vae(name: str, download: bool) -> Path:
    """The tiny decoder's file; a missing one a download provides is fetched when the switch is on."""
    try:
        return comfy_paths.resolve_tiny_vae(name)
    except FileNotFoundError:
        f = hub.TINY_DECODERS.get(name)
        if f is None:
            raise
        if not download:
            raise comfy_paths.ModelFileNotFound(_tiny_vae_line(f)) from None
    return hub.fetch_file(f, comfy_paths.tiny_vae_folder(), progress=_bar_progress(f"downloading the {f.what}"),
                          say=_say)
