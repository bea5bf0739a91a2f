"""Atomic writes: a file or folder appears under its final name complete, or not at all.

Every writer of the pack that leaves something a user or a later run relies on goes through here (videos,
PNG-frame folders, the demo checkpoint, prompt-embedding cache entries, saved camera trajectories, streamed
safetensors). The new content is written to a temp sibling in the same folder (same file system, so the
final `os.replace` is atomic), flushed to disk, then renamed over the target. A crash or a kill at any
moment leaves the old target untouched plus, at worst, a temp sibling; temp names carry the writer's pid,
so the next write to that target removes temps whose writer is gone (`remove_stale_temps`).

Temp names: `.<name>.tmp-<pid>-<token><suffix>`; the target's suffix is kept because some writers pick the
format from it (ffmpeg, np.save).

A full disk (or quota, or the file size limit) met while writing is reported as `DiskFullError`, one line naming the
target and what to do, not as a bare `[Errno 28]` naming the temp file or nothing.

The promise, kept here for every writer: an interrupted or failed run never truncates or replaces an existing
output. A partial result that is worth keeping (the chunks of an interrupted Fast run) is committed under a NEW
name that nothing holds yet (`commit_new`, `<stem>_partial<suffix>`), which the caller prints.
"""
from __future__ import annotations

import contextlib
import errno
import os
import re
import secrets
import shutil
from pathlib import Path
from typing import Iterator, Optional, Union

PathLike = Union[str, os.PathLike]
_TEMP = re.compile(r"^\.(?P<name>.+)\.tmp-(?P<pid>\d+)-[0-9a-f]{8}(?P<suffix>.*)$")
NO_SPACE = {errno.ENOSPC, errno.EFBIG} | ({errno.EDQUOT} if hasattr(errno, "EDQUOT") else set())


class DiskFullError(OSError):
    """Writing `target` ran out of room (disk, quota or file size limit); the earlier file, if any, is untouched."""

    def __str__(self) -> str:  # the sentence alone, without OSError's "[Errno 28]"
        return self.strerror or super().__str__()


def out_of_room(e: BaseException, target: PathLike) -> Optional[DiskFullError]:
    """The DiskFullError for `e` met while writing `target`, or None when `e` is another error."""
    if not isinstance(e, OSError) or e.errno not in NO_SPACE or isinstance(e, DiskFullError):
        return None
    target = Path(target)
    kept = f"an earlier {target.name}, if any, is untouched"
    if e.errno == errno.EFBIG:
        return DiskFullError(e.errno, f"{target} grew past this system's file size limit (ulimit -f) and was not "
                                      f"written; raise the limit or write a smaller file ({kept})")
    why = "no space left on the disk" if e.errno == errno.ENOSPC else "the disk quota is used up"
    try:
        free = shutil.disk_usage(next(p for p in (target.parent, *target.parents) if p.is_dir())).free
        why += f" ({free / 2**20:.0f} MB free there)"
    except (OSError, StopIteration):
        pass
    return DiskFullError(e.errno, f"{why} while writing {target}; free some space or write it to another disk "
                                  f"({kept})")


@contextlib.contextmanager
def naming_full_disk(target: PathLike) -> Iterator[None]:
    """Re-raises a full disk met inside the block as DiskFullError naming `target`."""
    try:
        yield
    except OSError as e:
        full = out_of_room(e, target)
        if full is None:
            raise
        raise full from e


def temp_path(target: PathLike) -> Path:
    """A fresh temp sibling of `target` (not created), named so that `remove_stale_temps` can find it."""
    target = Path(target)
    return target.with_name(f".{target.name}.tmp-{os.getpid()}-{secrets.token_hex(4)}{target.suffix}")


def pid_alive(pid: int) -> bool:
    """Is process `pid` running (on this machine)? Used to tell a crashed writer's leftovers from live work."""
    if pid == os.getpid():
        return True
    try:
        import psutil

        return psutil.pid_exists(pid)
    except ImportError:  # psutil is a dependency; this is only a fallback (POSIX: signal 0 probes)
        if os.name == "nt":
            return True  # os.kill would terminate it: never guess on Windows
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True


def remove_path(path: Path) -> None:
    """Delete a file or a folder tree if it exists (temps, failed outputs)."""
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        with contextlib.suppress(FileNotFoundError):
            path.unlink()


def remove_stale_temps(target: PathLike) -> list[Path]:
    """Delete temp siblings of `target` left by writers that no longer run (a crash, SIGKILL). Returns them."""
    target = Path(target)
    removed = []
    try:
        siblings = list(target.parent.iterdir())
    except OSError:
        return removed
    for p in siblings:
        m = _TEMP.match(p.name)
        if m and m.group("name") == target.name and not pid_alive(int(m.group("pid"))):
            remove_path(p)
            removed.append(p)
    return removed


def fsync_path(path: PathLike) -> None:
    """Flush a file (or a folder's entries) to disk; a no-op where the OS cannot open folders (Windows)."""
    flags = os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) if Path(path).is_dir() else os.O_RDONLY
    try:
        fd = os.open(path, flags)
    except OSError:
        if os.name == "nt":
            return
        raise
    try:
        os.fsync(fd)
    except OSError:
        if os.name != "nt":
            raise
    finally:
        os.close(fd)


def _fsync_tree(folder: Path) -> None:
    for root, dirs, files in os.walk(folder):
        for f in files:
            fsync_path(Path(root) / f)
        fsync_path(root)


def commit(tmp: PathLike, target: PathLike) -> Path:
    """Flush `tmp` (a file) to disk and rename it over `target`; the parent folder's entry is flushed too."""
    tmp, target = Path(tmp), Path(target)
    fsync_path(tmp)
    os.replace(tmp, target)
    fsync_path(target.parent)
    return target


PARTIAL_TAG = "_partial"


def unused_name(target: PathLike, tag: str = PARTIAL_TAG) -> Path:
    """`<stem><tag><suffix>`, or `<stem><tag>2<suffix>`, ... : the first such sibling of `target` that does not
    exist (a partial result never takes the place of a complete one)."""
    target = Path(target)
    for n in range(1, 10_000):
        candidate = target.with_name(f"{target.stem}{tag}{n if n > 1 else ''}{target.suffix}")
        if not (candidate.exists() or candidate.is_symlink()):
            return candidate
    raise FileExistsError(f"{target}: every name {target.stem}{tag}N{target.suffix} is taken; remove some")


def commit_new(tmp: PathLike, target: PathLike, tag: str = PARTIAL_TAG) -> Path:
    """Flush `tmp` (a file or a folder) and give it a name beside `target` that nothing holds (`unused_name`);
    never replaces anything. Returns the name it got."""
    tmp = Path(tmp)
    if tmp.is_dir():
        _fsync_tree(tmp)
    else:
        fsync_path(tmp)
    for _ in range(100):
        name = unused_name(target, tag)
        if tmp.is_dir():
            if name.exists():  # taken since unused_name looked: os.rename would replace an empty folder
                continue
            os.rename(tmp, name)
        else:
            try:
                os.link(tmp, name)  # fails if the name was taken meanwhile: never replaces a file
            except FileExistsError:
                continue
            except OSError:  # a file system without hard links
                if name.exists():
                    continue
                os.rename(tmp, name)
            else:
                os.unlink(tmp)
        fsync_path(name.parent)
        return name
    raise FileExistsError(f"{target}: could not find a free name for the partial result")


@contextlib.contextmanager
def atomic_path(target: PathLike) -> Iterator[Path]:
    """`with atomic_path(out) as tmp: write(tmp)` -> `out` is replaced by the complete file when the block
    ends normally; on any exception (KeyboardInterrupt included) the temp file is removed and `out` keeps
    its old content. The caller writes to `tmp` by path (it does not exist yet)."""
    target = Path(target)
    remove_stale_temps(target)
    tmp = temp_path(target)
    try:
        with naming_full_disk(target):
            yield tmp
            if not tmp.is_file():
                raise FileNotFoundError(f"{target}: the writer produced no file")
            commit(tmp, target)
    except BaseException:
        remove_path(tmp)
        raise


@contextlib.contextmanager
def atomic_write(target: PathLike, mode: str = "wb", **open_kw) -> Iterator:
    """`with atomic_write(out, "w") as f: f.write(...)`: atomic_path with the temp file opened for you."""
    with atomic_path(target) as tmp:
        with open(tmp, mode, **open_kw) as f:
            yield f
            f.flush()


def write_bytes(target: PathLike, data: bytes) -> Path:
    with atomic_write(target, "wb") as f:
        f.write(data)
    return Path(target)


def write_text(target: PathLike, text: str, encoding: str = "utf-8") -> Path:
    with atomic_write(target, "w", encoding=encoding) as f:
        f.write(text)
    return Path(target)


@contextlib.contextmanager
def atomic_dir(target: PathLike, replace: bool = False) -> Iterator[Path]:
    """`with atomic_dir(out) as tmp: fill(tmp)` -> the folder `tmp` (created empty) becomes `out`.

    replace=False: `out` must not exist when the block ends (FileExistsError; the new folder is discarded).
    replace=True: an existing `out` is swapped out first and deleted after the new folder is in place, so
    the name is never empty for longer than two renames. On an exception the temp folder is removed.
    """
    target = Path(target)
    remove_stale_temps(target)
    tmp = temp_path(target)
    with naming_full_disk(target):
        tmp.mkdir()
    try:
        with naming_full_disk(target):
            yield tmp
        _fsync_tree(tmp)
        old = None
        if target.exists() or target.is_symlink():
            if not replace:
                raise FileExistsError(f"{target} already exists")
            old = temp_path(target)
            os.replace(target, old)
        try:
            os.replace(tmp, target)
        except BaseException:
            if old is not None:
                os.replace(old, target)  # put the old folder back
            raise
        fsync_path(target.parent)
        if old is not None:
            remove_path(old)
    except BaseException:
        remove_path(tmp)
        raise
