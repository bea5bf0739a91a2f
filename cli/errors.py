"""Exit codes of the command line, and the one line each kind of failure is reported with.

The library raises exceptions with messages that name the file/flag/value and the fix (ValueError
subclasses for bad input); only here are they turned into exit codes, so no command catches on its own:
  0 success · 1 runtime failure · 2 bad input (a flag, a file, a model folder) ·
  130 interrupted (Ctrl-C, SIGINT) · 143 terminated (SIGTERM; 129 for SIGHUP).
On 130/143/129 every child process has been stopped and every temp file removed before the exit.
"""
from __future__ import annotations

import contextlib
import signal
import threading
from typing import Iterator, Optional

EXIT_OK = 0
EXIT_FAILURE = 1
EXIT_USAGE = 2
EXIT_INTERRUPTED = 130  # 128 + SIGINT, what shells report for Ctrl-C
_SIGNAL_BASE = 128

# Bad input: the user can fix it by changing a flag or a file. PermissionError / FileNotFoundError are OSErrors,
# so they are matched before the generic runtime kinds below.
USAGE_ERRORS = (ValueError, FileNotFoundError, FileExistsError, NotADirectoryError, IsADirectoryError,
                PermissionError)
RUNTIME_ERRORS = (RuntimeError, OSError, MemoryError, TimeoutError)


class UsageError(ValueError):
    """A command-line value that cannot work; the message names the flag, the value and what to use instead."""


class Terminated(BaseException):
    """Raised in the main thread by SIGTERM/SIGHUP so that every `finally` (children, temp files) runs.

    A BaseException, like KeyboardInterrupt, so library code that catches Exception does not swallow it.
    """

    def __init__(self, signum: int):
        self.signum = signum
        try:
            name = signal.Signals(signum).name
        except ValueError:
            name = f"signal {signum}"
        super().__init__(f"terminated ({name})")


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def classify(exc: BaseException) -> Optional[tuple[int, str]]:
    """(exit code, one-line message) for an exception the CLI reports without a traceback; None for a bug."""
    if isinstance(exc, KeyboardInterrupt):
        return EXIT_INTERRUPTED, "interrupted"
    if isinstance(exc, Terminated):
        return _SIGNAL_BASE + exc.signum, str(exc)
    oom = _oom_message(exc)
    if oom:
        return EXIT_FAILURE, oom
    if isinstance(exc, USAGE_ERRORS):
        return EXIT_USAGE, _first_line(exc)
    if isinstance(exc, RUNTIME_ERRORS):
        return EXIT_FAILURE, _first_line(exc)
    return None


def exit_code_for(exc: BaseException) -> int:
    kind = classify(exc)
    return kind[0] if kind else EXIT_FAILURE


def _oom_message(exc: BaseException) -> Optional[str]:
    if isinstance(exc, MemoryError):
        return ("out of RAM" + (f" ({_first_line(exc)})" if str(exc) else "") +
                "; use a smaller --size or fewer --frames, or close other programs")
    try:
        import torch
    except ImportError:  # pragma: no cover - torch is a dependency
        return None
    if isinstance(exc, torch.cuda.OutOfMemoryError):
        return ("out of GPU memory; try --memory-mode swap or block_swap, --vae-tiled, a smaller --size or "
                f"fewer --frames ({_first_line(exc)})")
    return None


_TERMINATING_SIGNALS = tuple(getattr(signal, n) for n in ("SIGTERM", "SIGHUP") if hasattr(signal, n))


@contextlib.contextmanager
def signals_raise() -> Iterator[None]:
    """While the block runs, SIGTERM and SIGHUP raise `Terminated` in the main thread (once: a second signal
    during the cleanup is ignored, so the cleanup finishes). Previous handlers are restored afterwards.
    Outside the main thread (embedded use) nothing is installed."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    fired = []

    def handler(signum, frame):
        if fired:
            return
        fired.append(signum)
        raise Terminated(signum)

    previous = {}
    for s in _TERMINATING_SIGNALS:
        previous[s] = signal.getsignal(s)
        signal.signal(s, handler)
    try:
        yield
    finally:
        for s, h in previous.items():
            signal.signal(s, h if h is not None else signal.SIG_DFL)
