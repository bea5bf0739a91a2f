"""loaders/atomic.py: whole or nothing under the final name, old content kept on failure, crash leftovers cleaned."""
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from lingbot_world.loaders import atomic


def _names(folder):
    return sorted(p.name for p in folder.iterdir())


def test_atomic_write_replaces_and_leaves_no_temp(tmp_path):
    target = tmp_path / "out.bin"
    target.write_bytes(b"old")
    atomic.write_bytes(target, b"new content")
    assert target.read_bytes() == b"new content" and _names(tmp_path) == ["out.bin"]


def test_failure_keeps_the_old_file(tmp_path):
    target = tmp_path / "video.mp4"
    target.write_bytes(b"previous video")
    with pytest.raises(RuntimeError, match="encoder died"):
        with atomic.atomic_write(target) as f:
            f.write(b"half of a vid")
            raise RuntimeError("encoder died")
    assert target.read_bytes() == b"previous video" and _names(tmp_path) == ["video.mp4"]
    with pytest.raises(KeyboardInterrupt):  # Ctrl-C too
        with atomic.atomic_path(target) as tmp:
            tmp.write_bytes(b"partial")
            raise KeyboardInterrupt
    assert target.read_bytes() == b"previous video" and _names(tmp_path) == ["video.mp4"]


def test_writer_that_produces_nothing_is_an_error(tmp_path):
    target = tmp_path / "x.mp4"
    with pytest.raises(FileNotFoundError, match="produced no file"):
        with atomic.atomic_path(target):
            pass
    assert not target.exists()


def test_temp_keeps_the_suffix_and_names_the_writer(tmp_path):
    tmp = atomic.temp_path(tmp_path / "clip.webm")
    assert tmp.parent == tmp_path and tmp.suffix == ".webm" and tmp.name.startswith(".clip.webm.tmp-")
    assert f"-{os.getpid()}-" in tmp.name


def test_stale_temps_of_dead_writers_are_removed(tmp_path):
    target = tmp_path / "out.mp4"
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    dead_pid = int(dead.stdout)
    stale_file = tmp_path / f".out.mp4.tmp-{dead_pid}-0123abcd.mp4"
    stale_dir = tmp_path / f".out.mp4.tmp-{dead_pid}-89abcdef.mp4"
    live = tmp_path / f".out.mp4.tmp-{os.getpid()}-00000000.mp4"  # a writer that still runs (us)
    other = tmp_path / f".other.mp4.tmp-{dead_pid}-11111111.mp4"  # another target's temp: not ours to judge
    stale_file.write_bytes(b"x")
    stale_dir.mkdir()
    (stale_dir / "frame_0000.png").write_bytes(b"x")
    live.write_bytes(b"x")
    other.write_bytes(b"x")
    removed = atomic.remove_stale_temps(target)
    assert sorted(removed) == sorted([stale_file, stale_dir])
    assert live.exists() and other.exists()


def test_atomic_dir_new_replace_and_refuse(tmp_path):
    target = tmp_path / "frames"
    with atomic.atomic_dir(target) as tmp:
        (tmp / "a.png").write_bytes(b"1")
        assert not target.exists()  # nothing under the final name until the block ends
    assert _names(target) == ["a.png"]
    with pytest.raises(FileExistsError):
        with atomic.atomic_dir(target) as tmp:
            (tmp / "b.png").write_bytes(b"2")
    assert _names(target) == ["a.png"] and _names(tmp_path) == ["frames"]
    with atomic.atomic_dir(target, replace=True) as tmp:
        (tmp / "c.png").write_bytes(b"3")
    assert _names(target) == ["c.png"] and _names(tmp_path) == ["frames"]
    with pytest.raises(ValueError):
        with atomic.atomic_dir(target, replace=True) as tmp:
            (tmp / "d.png").write_bytes(b"4")
            raise ValueError("stop")
    assert _names(target) == ["c.png"] and _names(tmp_path) == ["frames"]


@pytest.mark.skipif(os.name == "nt", reason="POSIX signals")
def test_sigkill_mid_write_keeps_the_old_file_and_the_next_write_cleans_up(tmp_path):
    """The issue's case 2: killing the run while the video is written must not leave a truncated file under
    the final name, nor truncate the previous one."""
    target = tmp_path / "out.mp4"
    target.write_bytes(b"the previous, complete video")
    code = textwrap.dedent(f"""
        import sys, time
        from lingbot_world.loaders.atomic import atomic_write
        with atomic_write({str(target)!r}) as f:
            f.write(b"68 of 81 frames")
            f.flush()
            print("writing", flush=True)
            time.sleep(60)
    """)
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "writing"
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert target.read_bytes() == b"the previous, complete video"
    leftovers = [p for p in tmp_path.iterdir() if p != target]
    assert len(leftovers) == 1 and leftovers[0].name.startswith(".out.mp4.tmp-")
    t0 = time.monotonic()
    atomic.write_bytes(target, b"a new video")
    assert _names(tmp_path) == ["out.mp4"] and target.read_bytes() == b"a new video"
    assert time.monotonic() - t0 < 5
