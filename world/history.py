"""A World session's history: its parts, and their tensors moved to disk once they are old.

A played video keeps, for every chunk, its latent (to save the video, to decode from, to continue) and the input of
its K/V-writing call (to rebuild the cache after a rewind): about 3 MB per chunk at 480x832, 11 GB for an hour of
play. Only the newest parts are used at every chunk, so the older ones are written to a scratch folder and read back
through a file mapping (`torch.from_file`): the same bytes, paged in by the OS only when a save, a continuation or a
rewind reads them, and dropped again under memory pressure. RAM stays flat however long the video; the disk grows.

The folder: $LINGBOT_HISTORY_DIR, else $XDG_CACHE_HOME/lingbot-world/history (never /tmp: often RAM itself), one
folder per session, removed when the session closes or is collected; folders of processes that are gone are removed
when the next session starts. When the disk refuses, the history simply stays in RAM (one warning).
"""
from __future__ import annotations

import logging
import os
import shutil
import tempfile
import weakref
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Optional

import torch

from ..wan.control.actions import KeyTimeline
from ..wan.sampling.fast_parts import CameraSource
from ..wan.sampling.fast_state import FastState

log = logging.getLogger(__name__)

KEEP_PARTS_IN_RAM = 8  # the newest parts stay in RAM: a rewind of a few chunks reads no file


@dataclass
class Part:
    """One part of the video and how it was asked for (enough to plan it again identically)."""

    state: FastState  # the video after this part, without latents (the session's `state` puts them back)
    source: CameraSource
    frames: Optional[int]  # the frames asked for (None: as long as the keys / camera)
    plan_keys: Optional[KeyTimeline]  # the keys the part used, padded (None for a camera or no input)
    resumed: bool = False  # the saved video a continuation started from (its parts are not known here)
    folded: list = field(default_factory=list)  # (x, t) of each chunk's K/V-writing call with a folded context pass
    latents: tuple = ()  # the latents this part added (a resumed video: all of its saved ones)
    on_disk: bool = False  # its tensors are file-backed (SpillFolder)


def history_root() -> Path:
    """Where sessions keep their old parts: $LINGBOT_HISTORY_DIR, else ~/.cache/lingbot-world/history."""
    if os.environ.get("LINGBOT_HISTORY_DIR"):
        return Path(os.environ["LINGBOT_HISTORY_DIR"]).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "lingbot-world" / "history"


def _process_alive(pid: int) -> bool:
    if os.name == "nt":  # no cheap check there: leave other processes' folders alone
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # someone else's process
        return True
    return True


def _remove_orphans(root: Path) -> None:
    """Folders of sessions whose process is gone (a crash, a kill -9)."""
    try:
        entries = list(root.iterdir())
    except OSError:
        return
    for d in entries:
        pid = d.name.split("-")[0]
        if d.is_dir() and pid.isdigit() and int(pid) != os.getpid() and not _process_alive(int(pid)):
            shutil.rmtree(d, ignore_errors=True)


class SpillFolder:
    """Tensors written to a scratch folder and read back file-backed (made on the first spill)."""

    def __init__(self, root: Optional[Path] = None):
        self.root = root
        self.folder: Optional[Path] = None
        self.bytes_on_disk = 0
        self.failed = False  # the disk refused once: everything stays in RAM from then on
        self._count = 0
        self._finalizer = None

    def spill(self, t: torch.Tensor) -> torch.Tensor:
        """`t` (CPU) as a file-backed tensor of the same bytes; `t` itself when it cannot be written."""
        if self.failed or t.device.type != "cpu" or t.numel() == 0:
            return t
        try:
            folder = self._ensure_folder()
            path = folder / f"{self._count}.bin"
            self._count += 1
            data = t.detach().contiguous()
            with open(path, "wb") as fh:  # raw bytes of our own tensor: nothing is ever parsed from this file
                fh.write(memoryview(data.view(torch.uint8).reshape(-1).numpy()))
            mapped = torch.from_file(str(path), shared=False, size=data.numel(), dtype=data.dtype)
        except (OSError, RuntimeError) as e:
            self.failed = True
            log.warning("the video's history stays in RAM (%s could not be written: %s); set LINGBOT_HISTORY_DIR "
                        "to a folder with free space to keep RAM flat in long videos",
                        self.folder or self.root or history_root(), e)
            return t
        self.bytes_on_disk += data.numel() * data.element_size()
        return mapped.view(data.shape)

    def _ensure_folder(self) -> Path:
        if self.folder is None:
            root = self.root or history_root()
            root.mkdir(parents=True, exist_ok=True)
            _remove_orphans(root)
            self.folder = Path(tempfile.mkdtemp(prefix=f"{os.getpid()}-", dir=root))
            self._finalizer = weakref.finalize(self, shutil.rmtree, str(self.folder), True)
        return self.folder

    def clear(self) -> None:
        """Remove the folder (a new video, or the end). Tensors still mapped keep their pages where the OS allows
        (Linux); elsewhere what cannot be removed yet is left to the next session's orphan sweep."""
        if self._finalizer is not None:
            self._finalizer()
        self.folder, self._finalizer, self.bytes_on_disk = None, None, 0


class PartHistory:
    """The session's parts and its `state` (a mixin of WorldSession, world/session.py): the state after the last
    part, with every part's latents; the tensors of parts older than the newest KEEP_PARTS_IN_RAM moved to disk."""

    keep_parts_in_ram = KEEP_PARTS_IN_RAM

    def _init_history(self, root: Optional[Path] = None) -> None:
        self.parts: list[Part] = []
        self._spill = SpillFolder(root)
        self._state_memo = None  # (the last Part, its whole FastState)

    def _new_history(self, parts: Optional[list] = None) -> None:
        """A new video (parts: where it starts)."""
        self.parts = list(parts or [])
        self._spill.clear()
        self._state_memo = None

    def _add_part(self, state: FastState, source: CameraSource, frames: Optional[int], keys, *, folded=(),
                  resumed: bool = False, added: int = 1) -> Part:
        """Record a part: `state` with every latent so far, of which the last `added` are this part's."""
        latents = tuple(state.latents)
        part = Part(replace(state, latents=()), source, frames, keys, resumed=resumed, folded=list(folded),
                    latents=latents[len(latents) - added:] if added else ())
        self.parts.append(part)
        self._state_memo = (part, state)
        self._spill_old_parts()
        return part

    @property
    def state(self) -> Optional[FastState]:
        """The video after its last part (None before the first)."""
        if not self.parts:
            return None
        last = self.parts[-1]
        if self._state_memo is None or self._state_memo[0] is not last:
            self._state_memo = (last, replace(last.state, latents=tuple(t for p in self.parts for t in p.latents)))
        return self._state_memo[1]

    def history_bytes(self) -> tuple[int, int]:
        """(bytes of the parts' tensors in RAM, bytes written to the history folder)."""
        ram = sum(_nbytes(t) for p in self.parts if not p.on_disk for t in _tensors(p))
        return ram, self._spill.bytes_on_disk

    def _spill_old_parts(self) -> None:
        keep = max(int(self.keep_parts_in_ram), 1)
        changed = False
        for p in self.parts[:-keep]:
            if p.on_disk or self._spill.failed:
                continue
            p.latents = tuple(self._spill.spill(t) for t in p.latents)
            p.folded = [(self._spill.spill(x), t) for x, t in p.folded]
            p.on_disk = not self._spill.failed
            changed = True
        if changed:  # the memo's tuple still points at the RAM copies
            self._state_memo = None

    def _close_history(self) -> None:
        self._state_memo = None
        self._spill.clear()


def _tensors(p: Part):
    yield from p.latents
    for x, _ in p.folded:
        yield x


def _nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()
