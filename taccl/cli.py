"""The `taccl` command: a thin shell over the Python API.

Each subcommand lives in `taccl/commands/<name>.py` and exposes `register(subparsers)`, which adds its parser
and sets `func(args) -> int`. `main` is the single error boundary: a `TacclError` prints its message and
exits with its code (2 for bad input, 1 for a failed check); Ctrl-C exits 130; anything else is a bug and
keeps its traceback.
"""
from __future__ import annotations

import argparse
import importlib
import importlib.util
import os
import sys

from . import __version__
from .errors import TacclError

# Dispatch table, in the order `taccl --help` lists them. A command whose module is not present is skipped.
COMMANDS = ["solve", "lower", "check", "simulate", "baseline", "run", "profile", "batch", "swap", "topology"]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="taccl", description=__doc__.splitlines()[0])
    parser.add_argument("--version", action="version", version=f"taccl {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMANDS:
        module_name = f"taccl.commands.{name}"
        if importlib.util.find_spec(module_name) is None:
            continue
        importlib.import_module(module_name).register(sub)
    return parser


def main(argv=None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        return int(args.func(args) or 0)
    except TacclError as exc:
        print(f"taccl {args.command}: error: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print(f"taccl {args.command}: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # the reader went away (`taccl check --json F | head -c 1`): stop quietly, as cat does
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # so the exit's flush finds no pipe
        return 141
    except OSError as exc:
        if not _writing_stdout_failed(exc):
            raise
        # the output cannot be written (a full disk, a closed or read-only descriptor): say so, once
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        print(f"taccl {args.command}: error: cannot write the output: {exc.strerror}", file=sys.stderr)
        return 2


def _writing_stdout_failed(exc: OSError) -> bool:
    """Whether `exc` came from writing standard output (no file name: an error on a file taccl opened names
    it and is reported where it happened)."""
    import errno

    return exc.filename is None and exc.errno in (errno.ENOSPC, errno.EIO, errno.EBADF, errno.EDQUOT, errno.EFBIG)


if __name__ == "__main__":
    sys.exit(main())
