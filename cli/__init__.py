"""Command-line entry point: `lingbot-world <command>` / `python -m lingbot_world <command>`."""
from __future__ import annotations

import argparse
import sys
import traceback

from .errors import EXIT_FAILURE, EXIT_INTERRUPTED, EXIT_USAGE, classify, signals_raise

EPILOG = ("exit codes: 0 done, 1 runtime failure, 2 bad input (flag, file or model folder), 130 interrupted "
          "(Ctrl-C), 143 terminated (SIGTERM); child processes and temp files are cleaned up in every case")


class DefaultsHelpFormatter(argparse.HelpFormatter):
    """Appends "(default: X)" to every option whose default is a value (None/False defaults are explained in
    the help text itself, e.g. "default: cuda when available")."""

    def _get_help_string(self, action):
        text = action.help or ""
        if (not action.option_strings or "%(default)" in text or action.default in (None, False)
                or action.default is argparse.SUPPRESS):
            return text
        return f"{text} (default: %(default)s)"


class Parser(argparse.ArgumentParser):
    def __init__(self, *args, **kw):
        kw.setdefault("formatter_class", DefaultsHelpFormatter)
        kw.setdefault("epilog", EPILOG)
        super().__init__(*args, **kw)


def build_parser() -> Parser:
    parser = Parser(prog="lingbot-world", description=__doc__)
    parser.add_argument("--debug", action="store_true",
                        help="print the full traceback of a failure instead of its one-line message")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=Parser, metavar="COMMAND")
    from . import commands

    commands.register(sub)
    return parser


def _report(prog: str, code: int, message: str) -> None:
    from .progress import break_progress_line

    break_progress_line()
    label = "error: " if code == EXIT_USAGE else ""
    print(f"{prog}: {label}{message}", file=sys.stderr, flush=True)


ALLOC_CONF = "PYTORCH_CUDA_ALLOC_CONF"


def cuda_allocator_defaults() -> None:
    """expandable_segments:True for torch's CUDA allocator unless the user configured it. Chunk after chunk the
    Fast model, the VAE and the K/V buffers allocate different sizes; expandable segments keep the reserved memory
    near what is in use instead of growing with fragmentation, and the benchmarks' memory figures are measured
    with them. torch reads the setting when CUDA first allocates, so this runs before anything touches the GPU.
    Linux only (torch does not support them on Windows)."""
    import os

    if sys.platform.startswith("linux") and not os.environ.get(ALLOC_CONF):
        os.environ[ALLOC_CONF] = "expandable_segments:True"


def main(argv=None) -> int:
    """Run one command; returns the exit code (also for argparse's own errors and --help)."""
    cuda_allocator_defaults()
    try:
        parser = build_parser()  # imports torch: Ctrl-C may land here too
        args = parser.parse_args(argv)
    except SystemExit as e:  # --help (0) and argparse's usage errors (2), already printed
        return e.code if isinstance(e.code, int) else (0 if e.code is None else EXIT_USAGE)
    except KeyboardInterrupt:
        _report("lingbot-world", EXIT_INTERRUPTED, "interrupted")
        return EXIT_INTERRUPTED
    prog = f"lingbot-world {args.command}" + _rank_suffix()
    with signals_raise():
        try:
            return int(args.func(args) or 0)
        except SystemExit as e:
            if isinstance(e.code, int) or e.code is None:
                return e.code or 0
            _report(prog, EXIT_USAGE, str(e.code))
            return EXIT_USAGE
        except BaseException as e:  # noqa: BLE001 - every outcome becomes an exit code and one line
            return _fail(prog, e, args.debug)


def _rank_suffix() -> str:
    """" [rank N]" in the messages of a process torchrun started (its errors interleave with the other ranks')."""
    import os

    rank, world = os.environ.get("RANK"), os.environ.get("WORLD_SIZE", "1")
    return f" [rank {rank}]" if rank is not None and world not in ("", "1") else ""


def _fail(prog: str, exc: BaseException, debug: bool) -> int:
    from .progress import break_progress_line

    kind = classify(exc)
    if kind is None or debug:
        break_progress_line()
        traceback.print_exception(type(exc), exc, exc.__traceback__)
    if kind is None:
        print(f"{prog}: internal error ({type(exc).__name__}); please report it with the traceback above",
              file=sys.stderr)
        return EXIT_FAILURE
    code, message = kind
    _report(prog, code, message)
    return code

if __name__ == "__main__":
    sys.exit(main())
