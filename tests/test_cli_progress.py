"""The progress line: redrawn in place on a terminal, one line per step in a log; log lines never glue onto it."""
import io
import logging
from types import SimpleNamespace

from lingbot_world.cli import progress
from lingbot_world.cli.progress import ProgressLine, cli_logging


class FakeTerminal(io.StringIO):
    def isatty(self):
        return True


def _step(i, total=3):
    return SimpleNamespace(index=i, total=total, expert="high", timestep=999 - i)


def test_log_file_gets_one_line_per_step():
    log = io.StringIO()
    bar = ProgressLine(3, stream=log)
    for i in range(3):
        bar.update(_step(i))
    bar.close()
    lines = log.getvalue().split("\n")
    assert "\r" not in log.getvalue() and lines[-1] == ""
    assert [ln.split()[:2] for ln in lines[:-1]] == [["step", "1/3"], ["step", "2/3"], ["step", "3/3"]]


def test_terminal_redraws_and_log_lines_start_on_their_own_line(monkeypatch):
    term = FakeTerminal()
    monkeypatch.setattr("sys.stderr", term)
    with cli_logging(quiet=False):
        bar = ProgressLine(3)
        bar.update(_step(0))
        logging.getLogger("lingbot_world.test").info("low-noise expert loaded")
        bar.update(_step(1))
        bar.close()
        text = term.getvalue()
    assert text.startswith("\r[") and "\x1b[K" in text
    before, after = text.split("low-noise expert loaded")
    assert before.endswith("\n") and after.startswith("\n\r[")  # the half-drawn line was ended first
    assert text.endswith("\n") and progress._active is None


def test_errors_end_a_half_drawn_line(monkeypatch, capsys):
    term = FakeTerminal()
    bar = ProgressLine(3, stream=term)
    bar.update(_step(0))
    progress.break_progress_line()
    assert term.getvalue().endswith("\n")
    bar.close()
    assert term.getvalue().count("\n") == 1
