"""Ctrl-C and SIGTERM to the whole process group during a Fast run, with real processes: `python -m lingbot_world
generate --demo --model fast` in a session of its own is signalled like a terminal (SIGINT to the group) or a
service manager (SIGTERM to the group) signals it, while ffmpeg encodes the streamed chunks. Afterwards: exit 130 /
143 with one last line, the frames made so far in a NEW file whose name the run printed, the earlier complete video
untouched, no temp file and no ffmpeg left running."""
import os
import signal
import subprocess
import sys
import threading
import time

import psutil
import pytest

from lingbot_world.cli.video_out import find_ffmpeg

pytestmark = [pytest.mark.skipif(os.name == "nt", reason="POSIX process groups"),
              pytest.mark.skipif(find_ffmpeg() is None, reason="imageio-ffmpeg not installed")]


def _terminal_signals():
    signal.signal(signal.SIGINT, signal.SIG_DFL)  # background jobs start with SIGINT ignored; a terminal's do not


# The CLI's main(), held after its second chunk has gone to ffmpeg: the signal then always arrives mid-run, with the
# encoder working, however fast or slow this machine is (no race with the run's end).
HELD_RUN = """
import sys, time
from lingbot_world.cli import main, video_out

append = video_out.VideoWriter.append

def held(self, frames):
    append(self, frames)
    if self.frames >= 21:  # 9 + 12 frames: two chunks
        print("held after 2 chunks", file=sys.stderr, flush=True)
        time.sleep(600)

video_out.VideoWriter.append = held
sys.exit(main(sys.argv[1:]))
"""


class FastRun:
    def __init__(self, demo_ckpt, cache, out):
        argv = [sys.executable, "-c", HELD_RUN, "generate", "--demo", "--model", "fast", "--demo-dir",
                str(demo_ckpt), "--cache-dir", str(cache), "--out", str(out), "--frames", "45"]
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        self.proc = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                     start_new_session=True, preexec_fn=_terminal_signals)
        self.err: list[str] = []
        self.out: list[str] = []
        self._readers = [threading.Thread(target=self._read, args=(s, lines), daemon=True)
                         for s, lines in ((self.proc.stderr, self.err), (self.proc.stdout, self.out))]
        for r in self._readers:
            r.start()

    @staticmethod
    def _read(stream, lines):
        for line in stream:
            lines.append(line.rstrip("\n"))

    def wait_until_held(self, timeout: float = 300) -> None:
        t0 = time.monotonic()
        while "held after 2 chunks" not in list(self.err):
            assert self.proc.poll() is None, "\n".join(self.err[-20:])
            assert time.monotonic() - t0 < timeout, "the run did not reach its chunks in time"
            time.sleep(0.05)

    def encoders(self) -> list[int]:
        """ffmpeg processes this run started (they run in a session of their own, so by their parent)."""
        try:
            return [p.pid for p in psutil.Process(self.proc.pid).children(recursive=True) if "ffmpeg" in p.name()]
        except psutil.NoSuchProcess:
            return []

    def finish(self, timeout: float = 120) -> int:
        try:
            return self.proc.wait(timeout)
        finally:
            if self.proc.poll() is None:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
            for r in self._readers:
                r.join(5)


def _gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


@pytest.mark.parametrize("sig, code, last", [(signal.SIGINT, 130, "lingbot-world generate: interrupted"),
                                             (signal.SIGTERM, 143, "lingbot-world generate: terminated (SIGTERM)")])
def test_a_signal_to_the_group_keeps_the_frames_under_a_new_name(demo_ckpt, demo_text_cache, tmp_path, sig, code,
                                                                  last):
    imageio = pytest.importorskip("imageio.v2")
    out = tmp_path / "out.mp4"
    out.write_bytes(b"complete earlier video")
    run = FastRun(demo_ckpt, demo_text_cache, out)
    run.wait_until_held()
    encoders = run.encoders()
    assert encoders, "ffmpeg should be encoding the streamed chunks"
    os.killpg(run.proc.pid, sig)  # the whole group, as a terminal or a service manager does
    assert run.finish() == code, "\n".join(run.err[-20:])
    assert run.err[-1] == last and not any("Traceback" in ln for ln in run.err), "\n".join(run.err[-20:])
    partial = tmp_path / "out_partial.mp4"
    kept = [ln for ln in run.out if ln.startswith("stopped after")]
    assert len(kept) == 1 and f"frames decoded so far are in {partial} ({out} was not touched)" in kept[0], run.out
    assert kept[0].startswith("stopped after 2 of 4 chunks: the 21 frames")
    assert len(imageio.mimread(partial)) == 21  # a complete, shorter video
    assert out.read_bytes() == b"complete earlier video"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.mp4", "out_partial.mp4"]  # no temp file
    assert all(_gone(pid) for pid in encoders)
