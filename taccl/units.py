"""Units used everywhere: time in microseconds, sizes in bytes, bandwidth in GB/s (1 GB/s = 1000 bytes/us).

Human input accepts sizes such as `1M`, `1MB` (10^6), `64KiB` (2^16) and `1G`.
"""
from __future__ import annotations

import re

from .errors import UserError

BYTES_PER_US_PER_GBPS = 1000.0

_SIZE_RE = re.compile(r"^\s*([0-9]*\.?[0-9]+)\s*([kmgtKMGT]?)(i?)([bB]?)\s*$")
_POWERS = {"": 0, "k": 1, "m": 2, "g": 3, "t": 4}


def parse_size(text, *, path: str | None = None, where: str | None = None) -> int:
    """Parse `1M`, `64KiB`, `1GB`, `4096` or an int into a number of bytes."""
    if isinstance(text, bool):
        raise UserError(f"expected a size such as 1M or 64KiB, got {text!r}", path=path, where=where)
    if isinstance(text, int):
        if text < 0:
            raise UserError(f"size must not be negative, got {text}", path=path, where=where)
        return text
    if isinstance(text, float) and text >= 0 and text == int(text):
        return int(text)
    m = _SIZE_RE.match(str(text))
    if not m:
        raise UserError(f"expected a size such as 1M, 64KiB or 1GB, got {text!r}", path=path, where=where)
    number, prefix, binary, _ = m.groups()
    base = 1024 if binary else 1000
    value = float(number) * base ** _POWERS[prefix.lower()]
    if value != int(value):
        raise UserError(f"size {text!r} is not a whole number of bytes", path=path, where=where)
    return int(value)


def parse_size_range(text: str, *, where: str = "--sizes") -> list[int]:
    """Parse `1K:1G` (doubling steps; LO:HI:F multiplies by F) or a comma list `1K,4K,1M` into sizes in bytes."""
    text = str(text)
    if ":" in text:
        parts = text.split(":")
        if len(parts) not in (2, 3):
            raise UserError(f"expected LO:HI or LO:HI:FACTOR, got {text!r}", where=where)
        lo, hi = parse_size(parts[0], where=where), parse_size(parts[1], where=where)
        factor = int(parts[2]) if len(parts) == 3 else 2
        if lo <= 0 or hi < lo or factor < 2:
            raise UserError(f"expected 0 < LO <= HI and FACTOR >= 2, got {text!r}", where=where)
        sizes, s = [], lo
        while s <= hi:
            sizes.append(s)
            s *= factor
        return sizes
    return [parse_size(p, where=where) for p in text.split(",") if p.strip()]


def format_size(nbytes: int) -> str:
    """Shortest exact human form: 1048576 -> '1MiB', 64000000 -> '64MB', 1536 -> '1536B'."""
    forms = [f"{nbytes}B"]
    for unit, base in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10), ("GB", 10**9), ("MB", 10**6), ("KB", 10**3)):
        if nbytes >= base and nbytes % base == 0:
            forms.append(f"{nbytes // base}{unit}")
    return min(forms, key=len)


def transfer_time_us(nbytes: float, alpha_us: float, bw_GBps: float) -> float:
    """Alpha-beta cost of moving `nbytes` over a link."""
    return alpha_us + nbytes / (bw_GBps * BYTES_PER_US_PER_GBPS)
