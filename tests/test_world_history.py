"""A World session's history on disk (world/history.py): old parts' latents and folded inputs move to a scratch folder
and are read back file-backed, so a long played video keeps RAM flat; every frame, rewind, save and continuation stays
bit-identical to a session that keeps everything in RAM; the folder goes with the session."""
from __future__ import annotations

import logging
import os

import numpy as np
import pytest
import torch

from lingbot_world.world import TextSettings, WorldFiles, WorldSettings, open_session
from lingbot_world.world.history import SpillFolder, _remove_orphans

IMAGE = "assets/examples/00/image.jpg"
PROMPT = "a lake with a lone tree"
KEYS = ["w-8", "wj-6,none-6", None, "a-12", "i-3,l-9", "d-12", "s-12"]


@pytest.fixture(scope="module")
def files(demo_ckpt):
    return WorldFiles.demo(demo_ckpt)


def _open(files, tmp_path, keep: int, **kw):
    settings = WorldSettings(size="64*112", text=TextSettings(device="cpu", cache_dir=tmp_path.parent / "text"),
                             window=6, sink=3, **kw)
    s = open_session(files, settings, device="cpu")
    s.keep_parts_in_ram = keep
    s.start(IMAGE, PROMPT)
    return s


def _play(session, keys) -> np.ndarray:
    return np.concatenate([b.frames for k in keys for b in session.step(k)])


def _written(session) -> list:
    folder = session._spill.folder
    return [] if folder is None else sorted(p.name for p in folder.iterdir())


def test_old_parts_move_to_disk_and_ram_stays_flat(files, tmp_path, monkeypatch):
    monkeypatch.setenv("LINGBOT_HISTORY_DIR", str(tmp_path / "history"))
    with _open(files, tmp_path, keep=2) as s:
        ram = []
        for k in KEYS:
            _play(s, [k])
            ram.append(s.history_bytes()[0])
        per_chunk = s.parts[-1].latents[0].numel() * 4
        assert ram[2:] == [ram[2]] * (len(KEYS) - 2)  # from the third chunk on: the newest two parts, no more
        assert ram[2] == 2 * per_chunk
        assert s.history_bytes()[1] == (len(KEYS) - 2) * per_chunk
        assert len(_written(s)) == len(KEYS) - 2
        assert all(p.on_disk for p in s.parts[:-2]) and not any(p.on_disk for p in s.parts[-2:])
        folder = s._spill.folder
        assert folder.parent == tmp_path / "history" and folder.name.startswith(f"{os.getpid()}-")
    assert not folder.exists()  # closed: the folder is gone


def test_a_spilled_history_plays_rewinds_and_saves_like_one_kept_in_ram(files, tmp_path, monkeypatch):
    """Rewinds after an eviction rebuild the cache from spilled latents; the saved video decodes them again."""
    monkeypatch.setenv("LINGBOT_HISTORY_DIR", str(tmp_path / "history"))
    written = []

    def write_video(frames, path, fps):
        written.append(np.concatenate(list(frames)))
        return path

    results = []
    for keep in (1, 100):
        with _open(files, tmp_path, keep=keep) as s:
            played = _play(s, KEYS)
            assert s.cache.global_end > s.cache.local_end  # the window evicted: rewinds rebuild the cache
            s.rewind(3)
            again = _play(s, KEYS[3:])
            s.rewind(5)
            s.save(tmp_path / f"keep{keep}" / "v", write_video=write_video)
            results.append((played, again, s.state.latent(), bool(_written(s))))
    (p1, a1, z1, spilled), (p2, a2, z2, kept) = results
    assert spilled and not kept
    assert np.array_equal(p1, p2) and np.array_equal(a1, a2) and torch.equal(z1, z2)
    assert np.array_equal(a1, p1[a1.shape[0] * -1:])
    assert np.array_equal(written[0], written[1]) and np.array_equal(written[0], p1[:written[0].shape[0]])


def test_a_new_video_clears_the_folder(files, tmp_path, monkeypatch):
    monkeypatch.setenv("LINGBOT_HISTORY_DIR", str(tmp_path / "history"))
    with _open(files, tmp_path, keep=1) as s:
        _play(s, KEYS[:3])
        first = s._spill.folder
        assert first is not None and len(list(first.iterdir())) == 2
        s.start(IMAGE, PROMPT)
        assert not first.exists() and s.history_bytes() == (0, 0)
        _play(s, KEYS[:2])
        assert len(_written(s)) == 1


def test_the_bytes_come_back_exactly_and_file_backed(tmp_path):
    spill = SpillFolder(tmp_path)
    for t in (torch.randn(2, 3, 5), torch.randn(4, 7).to(torch.bfloat16), torch.arange(12).view(3, 4)):
        back = spill.spill(t)
        assert back.dtype == t.dtype and back.shape == t.shape and torch.equal(back, t)
        assert back.untyped_storage().data_ptr() != t.untyped_storage().data_ptr()
    files = sorted(spill.folder.iterdir())
    assert [f.stat().st_size for f in files] == [2 * 3 * 5 * 4, 4 * 7 * 2, 12 * 8]
    assert spill.bytes_on_disk == sum(f.stat().st_size for f in files)
    spill.clear()
    assert not any(tmp_path.iterdir())


def test_a_folder_that_cannot_be_written_keeps_the_history_in_ram_with_one_warning(tmp_path, caplog):
    blocker = tmp_path / "a_file"
    blocker.write_text("not a folder")
    spill = SpillFolder(blocker / "history")
    t = torch.randn(3, 3)
    with caplog.at_level(logging.WARNING, logger="lingbot_world.world.history"):
        assert spill.spill(t) is t and spill.spill(t) is t
    warnings = [r.getMessage() for r in caplog.records]
    assert len(warnings) == 1 and "LINGBOT_HISTORY_DIR" in warnings[0] and "stays in RAM" in warnings[0]


@pytest.mark.skipif(os.name == "nt", reason="a dead process is told by os.kill(pid, 0) on POSIX only")
def test_folders_of_processes_that_are_gone_are_removed(tmp_path):
    import subprocess
    import sys

    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    dead = tmp_path / f"{gone.stdout.strip()}-abc"
    mine = tmp_path / f"{os.getpid()}-def"
    other = tmp_path / "not-a-session"
    for d in (dead, mine, other):
        d.mkdir()
    _remove_orphans(tmp_path)
    assert not dead.exists() and mine.exists() and other.exists()
