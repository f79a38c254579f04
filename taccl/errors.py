"""The error types the whole toolchain shares.

`UserError` is the one expected failure: bad input from the user (a malformed file, an impossible request).
The CLI prints its message and exits with `exit_code`, never a traceback. Anything else is a bug.
"""
from __future__ import annotations

from contextlib import contextmanager


class TacclError(Exception):
    """Base class of every error the toolchain raises on purpose."""

    exit_code = 1


class UserError(TacclError):
    """Bad input: the message names the file, the place in it and what was expected."""

    exit_code = 2

    def __init__(self, message: str, *, path: str | None = None, where: str | None = None):
        self.path = path
        self.where = where
        self.message = message
        prefix = ""
        if path:
            prefix = f"{path}: "
        if where:
            prefix += f"{where}: "
        super().__init__(prefix + message)


class RuntimeLimitsError(UserError):
    """No lowering fits the runtime's limits (channels, thread blocks, steps per block, XML nodes per rank):
    fewer operations per rank (fewer rings or channels, say) may fit."""


@contextmanager
def about_file(path):
    """A `UserError` raised inside that names no file is raised again naming `path` (the input it is about)."""
    try:
        yield
    except UserError as exc:
        if exc.path:
            raise
        raise UserError(exc.message, path=str(path), where=exc.where) from None


class CheckFailed(TacclError):
    """A program or algorithm was read fine but fails a correctness check (exit code 1)."""

    exit_code = 1


class SolverError(TacclError):
    """A solver backend is unavailable or failed in a way the user must act on."""

    exit_code = 2
