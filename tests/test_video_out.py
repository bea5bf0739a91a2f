"""cli/video_out.py: every container written whole and verified, a failing encoder never reported as success."""
import os
import stat
import sys

import numpy as np
import pytest
import torch
from PIL import Image

from lingbot_world.cli import main
from lingbot_world.loaders.atomic import DiskFullError
from lingbot_world.cli.video_out import (OutputPathError, VideoWriteError, find_ffmpeg, plan_output, to_uint8_frames,
                                         write_video)

needs_ffmpeg = pytest.mark.skipif(find_ffmpeg() is None, reason="imageio-ffmpeg not installed")


def _video(frames=9, h=32, w=48, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.rand(3, frames, h, w, generator=g) * 2 - 1


def _names(folder):
    return sorted(p.name for p in folder.iterdir())


@needs_ffmpeg
@pytest.mark.parametrize("ext", [".mp4", ".webm", ".gif"])
def test_containers_hold_every_frame(tmp_path, ext):
    imageio = pytest.importorskip("imageio.v2")
    target = plan_output(tmp_path / f"clip{ext}")
    assert write_video(_video(), target, fps=16) == tmp_path / f"clip{ext}"
    frames = imageio.mimread(tmp_path / f"clip{ext}")
    assert len(frames) == 9 and frames[0].shape[:2] == (32, 48)
    assert _names(tmp_path) == [f"clip{ext}"]


def test_png_folder_is_replaced_as_a_whole(tmp_path):
    video = _video()
    target = plan_output(tmp_path / "frames")
    write_video(video, target)
    assert _names(tmp_path / "frames") == [f"frame_{i:04d}.png" for i in range(9)]
    got = np.stack([np.asarray(Image.open(tmp_path / "frames" / f"frame_{i:04d}.png")) for i in range(9)])
    assert np.array_equal(got, to_uint8_frames(video))
    write_video(_video(frames=5), plan_output(tmp_path / "frames"))  # an earlier run's frames: replaced whole
    assert len(_names(tmp_path / "frames")) == 5 and _names(tmp_path) == ["frames"]


def _fake_ffmpeg(tmp_path, body: str):
    script = tmp_path / "fake_ffmpeg"
    script.write_text(f"#!{sys.executable}\nimport os, subprocess, sys\n{body}\n")
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    return str(script)


@pytest.mark.skipif(os.name == "nt", reason="a script as the ffmpeg executable")
@pytest.mark.parametrize("said, error, line", [
    ("av_interleaved_write_frame(): Invalid argument", VideoWriteError,
     r"exit code 1\): av_interleaved_write_frame\(\): Invalid argument"),
    # a full disk is said as such, naming the video (not ffmpeg's temp file) and what to do
    ("av_interleaved_write_frame(): No space left on device", DiskFullError,
     r"^no space left on the disk \(\d+ MB free there\) while writing \S+out\.mp4; free some space"),
])
def test_encoder_failure_keeps_the_previous_video(tmp_path, said, error, line):
    ffmpeg = _fake_ffmpeg(tmp_path, "sys.stdin.buffer.read()\nopen(sys.argv[-1], 'wb').write(b'half')\n"
                                    f"print({said!r}, file=sys.stderr)\n"
                                    "sys.exit(1)")
    out = tmp_path / "out.mp4"
    out.write_bytes(b"previous video")
    with pytest.raises(error, match=line):
        write_video(_video(), plan_output(out, ffmpeg))
    assert out.read_bytes() == b"previous video" and _names(tmp_path) == ["fake_ffmpeg", "out.mp4"]


@needs_ffmpeg
@pytest.mark.skipif(os.name == "nt", reason="a script as the ffmpeg executable")
def test_short_video_is_not_saved(tmp_path):
    """An encoder that exits 0 but stops early (the issue's 68-of-81-frames file) is caught by counting."""
    ffmpeg = _fake_ffmpeg(tmp_path, f"args = sys.argv[1:]\n"
                                    f"if 'rawvideo' in args: args[-1:-1] = ['-frames:v', '3']\n"
                                    f"sys.exit(subprocess.call([{find_ffmpeg()!r}] + args))")
    with pytest.raises(VideoWriteError, match="wrote 3 of 9 frames"):
        write_video(_video(), plan_output(tmp_path / "out.mp4", ffmpeg))
    assert _names(tmp_path) == ["fake_ffmpeg"]


@needs_ffmpeg
@pytest.mark.skipif(os.name == "nt", reason="a script as the ffmpeg executable")
def test_frames_are_counted_without_the_progress_line(tmp_path):
    """ffmpeg 7.0 (imageio-ffmpeg 0.7.0) prints no `frame=` in its progress line for a stream copy; the count must
    not depend on that line, or every video is refused as short."""
    ffmpeg = _fake_ffmpeg(tmp_path, f"import re\nr = subprocess.run([{find_ffmpeg()!r}] + sys.argv[1:], stderr=subprocess.PIPE)\n"
                                    "err = re.sub(rb'frame=\\s*\\d+', b'', r.stderr)\n"
                                    "sys.stderr.buffer.write(err)\n"
                                    "sys.exit(r.returncode)")
    assert write_video(_video(), plan_output(tmp_path / "out.mp4", ffmpeg)) == tmp_path / "out.mp4"
    assert _names(tmp_path) == ["fake_ffmpeg", "out.mp4"]


def test_without_ffmpeg_falls_back_to_png_frames_up_front(tmp_path, caplog):
    target = plan_output(tmp_path / "clip.mp4", ffmpeg=None)
    assert target.path == tmp_path / "clip" and target.container is None
    assert "imageio-ffmpeg is not installed" in caplog.text


def test_plan_rejects_before_work(tmp_path):
    (tmp_path / "dir.gif").mkdir()
    with pytest.raises(OutputPathError, match="is an existing folder"):
        plan_output(tmp_path / "dir.gif", "ffmpeg")
    with pytest.raises(OutputPathError, match="unknown extension"):
        plan_output(tmp_path / "a.mov", "ffmpeg")
    with pytest.raises(OutputPathError, match="does not exist"):
        plan_output(tmp_path / "missing" / "a.mp4", "ffmpeg")
    (tmp_path / "f").write_text("")
    with pytest.raises(OutputPathError, match="is not a folder"):
        plan_output(tmp_path / "f" / "a.mp4", "ffmpeg")


@pytest.mark.skipif(os.name == "nt", reason="a script as the ffmpeg executable")
def test_cli_reports_a_failed_write_as_a_failure(demo_ckpt, demo_text_cache, tmp_path, capsys, monkeypatch):
    """Issue case 1 end to end: the run finishes, the encoder fails -> exit 1, no 'wrote', old file intact."""
    monkeypatch.setenv("IMAGEIO_FFMPEG_EXE", _fake_ffmpeg(
        tmp_path, "sys.stdin.buffer.read()\nprint('Permission denied', file=sys.stderr)\nsys.exit(1)"))
    out = tmp_path / "out.mp4"
    out.write_bytes(b"previous video")
    rc = main(["generate", "--demo", "--demo-dir", str(demo_ckpt), "--quiet", "--steps", "2", "--frames", "5",
               "--cache-dir", str(demo_text_cache), "--out", str(out)])
    captured = capsys.readouterr()
    assert rc == 1 and "wrote" not in captured.out
    last = captured.err.strip().splitlines()[-1]
    assert last.startswith("lingbot-world generate: ffmpeg failed writing") and last.endswith("Permission denied")
    assert "Traceback" not in captured.err
    assert out.read_bytes() == b"previous video" and _names(tmp_path) == ["fake_ffmpeg", "out.mp4"]


@pytest.mark.skipif(os.name == "nt", reason="POSIX signals")
def test_interrupt_while_encoding_stops_ffmpeg_and_keeps_the_previous_video(tmp_path):
    """Issue case 2: Ctrl-C while ffmpeg writes. The old video stays, no temp file, no ffmpeg left running."""
    import signal
    import subprocess
    import time

    import psutil

    pid_file = tmp_path / "ffmpeg.pid"
    ffmpeg = _fake_ffmpeg(tmp_path, f"open({str(pid_file)!r}, 'w').write(str(os.getpid()))\n"
                                    "sys.stdin.buffer.read()\nopen(sys.argv[-1], 'wb').write(b'68 of 81 frames')\n"
                                    "import time; time.sleep(60)")
    out = tmp_path / "out.mp4"
    out.write_bytes(b"previous video")
    code = ("import torch\nfrom lingbot_world.cli.video_out import plan_output, write_video\n"
            f"write_video(torch.zeros(3, 9, 32, 48), plan_output({str(out)!r}, {ffmpeg!r}))")
    proc = subprocess.Popen([sys.executable, "-c", code], stderr=subprocess.DEVNULL,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        t0 = time.monotonic()
        while not (pid_file.exists() and pid_file.read_text() and list(tmp_path.glob(".out.mp4.tmp-*"))):
            assert proc.poll() is None and time.monotonic() - t0 < 60
            time.sleep(0.05)
        proc.send_signal(signal.SIGINT)
        assert proc.wait(30) != 0
    finally:
        if proc.poll() is None:
            proc.kill()
    encoder = int(pid_file.read_text())
    assert not psutil.pid_exists(encoder) or psutil.Process(encoder).status() == psutil.STATUS_ZOMBIE
    assert out.read_bytes() == b"previous video"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["fake_ffmpeg", "ffmpeg.pid", "out.mp4"]


def test_frames_are_encoded_in_the_background_and_errors_surface_at_close(tmp_path, monkeypatch):
    """append() returns once the frames are in host memory (the next chunk samples while they are encoded);
    a failed background write is raised by close() and nothing is saved."""
    import threading
    import time

    from lingbot_world.cli import video_out

    release = threading.Event()
    real_save = video_out._save_png

    def slow_save(frame, path):
        release.wait(10)
        real_save(frame, path)

    monkeypatch.setattr(video_out, "_save_png", slow_save)
    writer = video_out.VideoWriter(plan_output(tmp_path / "frames"))
    t = time.perf_counter()
    writer.append(_video(frames=4))
    assert time.perf_counter() - t < 1.0 and writer.frames == 4
    release.set()
    assert writer.close() == tmp_path / "frames" and len(_names(tmp_path / "frames")) == 4

    def broken_save(frame, path):
        raise OSError("disk full")

    monkeypatch.setattr(video_out, "_save_png", broken_save)
    writer = video_out.VideoWriter(plan_output(tmp_path / "other"))
    writer.append(_video(frames=3))
    with pytest.raises(VideoWriteError, match=r"cannot write the PNG frames of .*other \(disk full\)"):
        writer.close()
    assert not (tmp_path / "other").exists() and _names(tmp_path) == ["frames"]


@pytest.mark.skipif(os.name == "nt", reason="a script as the ffmpeg executable")
def test_a_failed_close_is_reported_again_not_run_twice(tmp_path):
    """A full disk at the end of a Fast run: close() fails, and the caller's cleanup asks again (keep_partial /
    close). The reason comes back (a DiskFullError, then a VideoWriteError quoting it), never an AttributeError
    from a second close."""
    from lingbot_world.cli.video_out import VideoWriter

    ffmpeg = _fake_ffmpeg(tmp_path, "sys.stdin.buffer.read()\n"
                                    "print('av_interleaved_write_frame(): No space left on device', file=sys.stderr)\n"
                                    "sys.exit(1)")
    out = tmp_path / "out.mp4"
    out.write_bytes(b"previous video")
    writer = VideoWriter(plan_output(out, ffmpeg))
    writer.append(_video(frames=5))
    with pytest.raises(DiskFullError, match="no space left on the disk"):
        writer.close()
    assert not writer.open and writer.keep_partial() is None
    with pytest.raises(VideoWriteError, match="failed close.*no space left on the disk"):
        writer.close()
    assert out.read_bytes() == b"previous video" and _names(tmp_path) == ["fake_ffmpeg", "out.mp4"]


@pytest.mark.parametrize("name", ["clip.mp4", "frames"])
def test_a_partial_video_goes_to_a_new_name(tmp_path, name):
    """The frames of an interrupted run never replace the target (maybe a complete earlier video): they go to
    <stem>_partial<suffix>, then _partial2, ..."""
    from lingbot_world.cli.video_out import VideoWriter

    if name.endswith(".mp4") and find_ffmpeg() is None:
        pytest.skip("imageio-ffmpeg not installed")
    out = tmp_path / name
    if out.suffix:
        out.write_bytes(b"complete earlier video")
    else:
        write_video(_video(frames=9), plan_output(out))
    kept = []
    for frames in (5, 3):
        writer = VideoWriter(plan_output(out))
        writer.append(_video(frames=frames))
        kept.append(writer.keep_partial())
        assert not writer.open
    stem, suffix = out.stem, out.suffix
    assert kept == [tmp_path / f"{stem}_partial{suffix}", tmp_path / f"{stem}_partial2{suffix}"]
    if out.suffix:
        imageio = pytest.importorskip("imageio.v2")
        assert out.read_bytes() == b"complete earlier video"
        assert [len(imageio.mimread(p)) for p in kept] == [5, 3]
    else:
        assert len(_names(out)) == 9 and [len(_names(p)) for p in kept] == [5, 3]
    assert sorted(_names(tmp_path)) == sorted([name] + [p.name for p in kept])  # no temp left


def test_nothing_to_keep_leaves_nothing(tmp_path):
    from lingbot_world.cli.video_out import VideoWriter

    writer = VideoWriter(plan_output(tmp_path / "frames"))
    assert writer.keep_partial() is None and _names(tmp_path) == []


@needs_ffmpeg
@pytest.mark.skipif(os.name == "nt", reason="POSIX process groups")
def test_ffmpeg_is_shielded_from_ctrl_c_to_the_process_group(tmp_path):
    """Ctrl-C at a terminal signals the whole process group. ffmpeg runs in a session of its own, so it keeps
    encoding while this process turns the interrupt into a kept partial video (before, ffmpeg died with the
    group and the run ended in 'ffmpeg failed writing')."""
    import signal
    import subprocess

    import psutil

    out = tmp_path / "out.mp4"
    out.write_bytes(b"complete earlier video")
    code = ("import sys, time, torch\n"
            "from lingbot_world.cli.video_out import VideoWriter, plan_output\n"
            f"w = VideoWriter(plan_output({str(out)!r}))\n"
            "w.append(torch.zeros(3, 7, 32, 48))\n"
            # the pid inside the try: the parent signals once it has read it, and the interrupt may land at once
            "try:\n    print(w._proc.pid, flush=True)\n    time.sleep(60)\n"
            "except KeyboardInterrupt:\n    print(w.keep_partial(), flush=True)\n    sys.exit(130)\n")
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, start_new_session=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        encoder = int(proc.stdout.readline())
        os.killpg(proc.pid, signal.SIGINT)
        assert proc.wait(60) == 130
        kept = proc.stdout.readline().strip()
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    imageio = pytest.importorskip("imageio.v2")
    assert kept == str(tmp_path / "out_partial.mp4") and len(imageio.mimread(kept)) == 7
    assert out.read_bytes() == b"complete earlier video"
    assert not psutil.pid_exists(encoder) or psutil.Process(encoder).status() == psutil.STATUS_ZOMBIE
    assert _names(tmp_path) == ["out.mp4", "out_partial.mp4"]
