"""Signals and child processes, with real processes: `python -m lingbot_world generate --demo` is started,
signalled at a known stage, and afterwards no process and no temp folder may be left, with the documented
exit code and one line. The text-encoder child is held at its start with LINGBOT_T5_WORKER_TEST_DELAY."""
import os
import signal
import subprocess
import sys
import threading
import time

import psutil
import pytest

from lingbot_world.cli import main
from lingbot_world.text_encoder import child_process as text_encoder_child
from lingbot_world.text_encoder.worker import TEST_DELAY_ENV

pytestmark = pytest.mark.skipif(os.name == "nt", reason="POSIX signals")


def _terminal_signals():
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _cmdline(p) -> list:
    try:
        return p.cmdline()
    except psutil.Error:  # exited meanwhile
        return []


def _gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE  # exited; only its exit status remains
    except psutil.NoSuchProcess:
        return True


def _wait(cond, timeout: float, what: str):
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        value = cond()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


class Run:
    """One CLI run in its own session (process group), with stderr collected line by line."""

    def __init__(self, demo_ckpt, tmp_path, *extra, t5_delay=None, cache=None):
        self.tmp = tmp_path / "tmp"
        self.tmp.mkdir()
        env = {**os.environ, "TMPDIR": str(self.tmp), "PYTHONUNBUFFERED": "1"}
        env.pop(TEST_DELAY_ENV, None)
        if t5_delay is not None:
            env[TEST_DELAY_ENV] = str(t5_delay)
        self.out = tmp_path / "out.mp4"
        argv = [sys.executable, "-m", "lingbot_world", "generate", "--demo", "--demo-dir", str(demo_ckpt),
                "--cache-dir", str(cache or tmp_path / "cache"), "--out", str(self.out), "--steps", "2", "--frames", "5", *extra]
        # a session of its own (a process group to signal like a terminal does), with Ctrl-C as in a terminal:
        # background jobs (CI runners, `cmd &`) start with SIGINT ignored, which Python then keeps ignoring
        self.proc = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                     start_new_session=True, preexec_fn=_terminal_signals)
        self.lines: list[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self):
        for line in self.proc.stderr:
            self.lines.append(line.rstrip("\n"))

    def t5_child(self, timeout=60) -> int:
        """pid of the text-encoder child once it runs (it has read and deleted its job file)."""
        def find():
            try:
                kids = psutil.Process(self.proc.pid).children()
            except psutil.NoSuchProcess:
                return None
            workers = [k for k in kids if any("worker.py" in a for a in _cmdline(k))]
            dirs = list(self.tmp.glob("lingbot-t5-*"))
            started = dirs and not (dirs[0] / "job.json").exists()  # the child has read its job
            return workers[0].pid if workers and started else None

        return _wait(find, timeout, "the text-encoder child")

    def finish(self, timeout=60) -> int:
        try:
            rc = self.proc.wait(timeout)
        finally:
            if self.proc.poll() is None:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        self._reader.join(5)
        return rc

    @property
    def err(self) -> str:
        return "\n".join(self.lines)


def _clean(run: Run, child: int):
    assert _wait(lambda: _gone(child), 10, "the child to exit")
    assert list(run.tmp.glob("lingbot-t5-*")) == [], "the text encoder's temp folder was left behind"
    assert "Traceback" not in run.err, run.err
    assert not run.out.exists()


def test_ctrl_c_during_text_encoding(demo_ckpt, tmp_path):
    """Ctrl-C in a terminal signals the whole process group: exit 130, 'interrupted', child and temp gone."""
    run = Run(demo_ckpt, tmp_path, "--no-text-cache", t5_delay=60)
    child = run.t5_child()
    os.killpg(run.proc.pid, signal.SIGINT)
    assert run.finish() == 130
    assert run.lines[-1] == "lingbot-world generate: interrupted"
    _clean(run, child)


def test_sigterm_during_text_encoding(demo_ckpt, tmp_path):
    """docker stop / systemd / timeout send SIGTERM to the main process: exit 143, child and temp folder gone."""
    run = Run(demo_ckpt, tmp_path, "--no-text-cache", t5_delay=60)
    child = run.t5_child()
    run.proc.send_signal(signal.SIGTERM)
    assert run.finish() == 143
    assert run.lines[-1] == "lingbot-world generate: terminated (SIGTERM)"
    _clean(run, child)


def test_sigterm_to_the_group_during_text_encoding(demo_ckpt, tmp_path):
    """A service manager stops the whole group: the child runs in a session of its own, so only the parent gets the
    signal; it stops the child itself and reports 143 (not 'the text encoder process died from signal SIGTERM')."""
    run = Run(demo_ckpt, tmp_path, "--no-text-cache", t5_delay=60)
    child = run.t5_child()
    assert os.getpgid(child) != os.getpgid(run.proc.pid)
    os.killpg(run.proc.pid, signal.SIGTERM)
    assert run.finish() == 143
    assert run.lines[-1] == "lingbot-world generate: terminated (SIGTERM)"
    _clean(run, child)


def test_sigkill_of_the_parent_takes_the_child_along(demo_ckpt, tmp_path):
    """SIGKILL cannot be handled by the parent: the child must notice and exit by itself within seconds (with
    real weights it would otherwise hold ~11 GB of RAM); the next encode removes the orphaned work folder."""
    run = Run(demo_ckpt, tmp_path, "--no-text-cache", t5_delay=60)
    child = run.t5_child()
    run.proc.send_signal(signal.SIGKILL)
    assert run.finish() == -signal.SIGKILL
    t0 = time.monotonic()
    _wait(lambda: _gone(child), 5, "the orphaned child to exit")
    assert time.monotonic() - t0 < 5
    left = list(run.tmp.glob("lingbot-t5-*"))
    assert len(left) == 1 and not (left[0] / "job.json").exists()  # the prompt was deleted when the child read it
    assert text_encoder_child.remove_stale_workdirs(run.tmp) == left and list(run.tmp.glob("lingbot-t5-*")) == []


def test_ctrl_c_during_sampling_leaves_no_output(demo_ckpt, demo_text_cache, tmp_path):
    run = Run(demo_ckpt, tmp_path, "--steps", "2000", cache=demo_text_cache)
    _wait(lambda: any(ln.startswith("step 3/2000") for ln in run.lines), 120, "sampling to run")
    os.killpg(run.proc.pid, signal.SIGINT)
    assert run.finish() == 130
    assert run.lines[-1] == "lingbot-world generate: interrupted"
    assert "Traceback" not in run.err and not run.out.exists() and list(tmp_path.glob(".out.mp4*")) == []
    # the progress line in a log (not a terminal): one line per step, no carriage returns
    steps = [ln for ln in run.lines if ln.startswith("step ")]
    assert len(steps) >= 3 and not any("\r" in ln for ln in run.lines)
    assert all(ln.split()[1] == f"{i + 1}/2000" for i, ln in enumerate(s for s in steps if "[" in s))


# ---- the text encoder failing, in-process (main() and its exit code) ------------------------------------------------
def _run_main(demo_ckpt, tmp_path, *extra):
    return main(["generate", "--demo", "--demo-dir", str(demo_ckpt), "--quiet", "--no-text-cache",
                 "--cache-dir", str(tmp_path / "cache"), "--out", str(tmp_path / "out.mp4"), *extra])


def test_killed_text_encoder_is_one_line(demo_ckpt, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv(TEST_DELAY_ENV, "60")

    def kill_child():
        pid = _wait(lambda: (text_encoder_child.live_text_encoder_pids() or [None])[0], 60, "the child")
        os.kill(pid, signal.SIGKILL)  # what the kernel's OOM killer does

    killer = threading.Thread(target=kill_child, daemon=True)
    killer.start()
    rc = _run_main(demo_ckpt, tmp_path)
    killer.join(5)
    err = capsys.readouterr().err
    assert rc == 1 and "Traceback" not in err
    assert err.strip().splitlines()[-1].startswith("lingbot-world generate: the text encoder process was killed")
    assert not (tmp_path / "out.mp4").exists()


def test_timed_out_text_encoder_is_one_line(demo_ckpt, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv(TEST_DELAY_ENV, "60")
    t0 = time.monotonic()
    rc = _run_main(demo_ckpt, tmp_path, "--t5-timeout", "1")
    err = capsys.readouterr().err
    assert rc == 1 and time.monotonic() - t0 < 30 and "Traceback" not in err
    assert err.strip().splitlines()[-1].startswith(
        "lingbot-world generate: the text encoder process did not finish within 1 s")
    assert text_encoder_child.live_text_encoder_pids() == []
