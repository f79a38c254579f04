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

    def progress(self, what: str, total: int, unit: str, every_s: float = 10.0) -> "Progress":
        """A long stage's progress meter (see `Progress`), printing through this reporter."""
        return Progress(self, what, total, unit, every_s)


class Progress:
    """How far a long stage is: `update(done)` prints "what: done/total unit (n%), about T left" at most once
    every `every_s` seconds (0: at every call), the estimate from the pace so far, so that a stage of minutes
    shows that it moves and when it should end. Cheap enough to call per item (a clock read)."""

    def __init__(self, report: Reporter, what: str, total: int, unit: str, every_s: float = 10.0):
        self.report, self.what, self.total, self.unit, self.every_s = report, what, total, unit, every_s
        self.start = time.monotonic()
        self.next = self.start + every_s

    def update(self, done: int) -> None:
        now = time.monotonic()
        if now < self.next or self.report.quiet or not 0 < done < self.total:
            return
        self.next = now + self.every_s
        left = (now - self.start) * (self.total - done) / done
        self.report(f"{self.what}: {done}/{self.total} {self.unit} ({done / self.total:.0%}), "
                    f"about {_duration(left)} left")


def _duration(seconds: float) -> str:
    return f"{seconds:.0f} s" if seconds < 120 else f"{seconds / 60:.0f} min"


def peak_memory_mb() -> float:
    """This process's peak resident memory so far, in MiB (Linux reports KiB, macOS bytes)."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / (1 << 20) if sys.platform == "darwin" else peak / 1024


SILENT = Reporter(quiet=True)


def warn(message: str) -> None:
    """A note or warning the user must see whatever --quiet says (stderr, one line, prefixed taccl:)."""
    print(f"taccl: {message}", file=sys.stderr, flush=True)
