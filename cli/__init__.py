"""Command-line entry point: `lingbot-world <command>` / `python -m lingbot_world <command>`."""
import argparse
import sys


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="lingbot-world", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    from . import commands

    commands.register(sub)
    args = parser.parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except (ValueError, FileNotFoundError, FileExistsError) as e:
        # Bad input: the library's message names the file/key/shape and the fix; no traceback needed.
        print(f"lingbot-world {args.command}: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
