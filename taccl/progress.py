"""All progress and status output goes through here, so `--quiet` and `--json` are honoured in one place."""
from __future__ import annotations

import resource
import sys
import time


class Reporter:
    """Prints progress lines to stderr unless quiet; keeps the start time for elapsed-time stamps."""

    def __init__(self, *, quiet: bool = False, stream=None):
        self.quiet = quiet
        self.stream = stream if stream is not None else sys.stderr
        self.start = time.monotonic()

    def elapsed(self) -> float:
        return time.monotonic() - self.start

    def __call__(self, message: str) -> None:
        if not self.quiet:
            print(f"[{self.elapsed():7.1f}s] {message}", file=self.stream, flush=True)


def peak_memory_mb() -> float:
    """This process's peak resident memory so far, in MiB (Linux reports KiB, macOS bytes)."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / (1 << 20) if sys.platform == "darwin" else peak / 1024


SILENT = Reporter(quiet=True)
