"""Units used everywhere: time in microseconds, sizes in bytes, bandwidth in GB/s (1 GB/s = 1000 bytes/us).

Sizes follow nccl-tests (`-b 1K -e 1G`): K, M, G and T are powers of 1024, with or without a B or iB after
them, so `1M`, `1MB` and `1MiB` are all 1048576 bytes (nccl-tests reads only the unit's first letter). A
decimal size is written in bytes (`1000000`). Printed sizes use KiB / MiB / GiB, or bytes.
"""
from __future__ import annotations

import re
from fractions import Fraction

from .errors import UserError

BYTES_PER_US_PER_GBPS = 1000.0

_SIZE_RE = re.compile(r"^\s*([0-9]*\.?[0-9]+)\s*([kmgtKMGT]?)(i?)([bB]?)\s*$")
_POWERS = {"": 0, "k": 1, "m": 2, "g": 3, "t": 4}
# for every --help that reads a size
SIZE_HELP = "K, M, G are powers of 1024 as in nccl-tests: 1M = 1MiB = 1048576 bytes"


def parse_size(text, *, path: str | None = None, where: str | None = None) -> int:
    """Parse `1M`, `64KiB`, `1GB`, `4096` or an int into a number of bytes (K, M, G, T: powers of 1024)."""
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
    number, prefix, binary, unit = m.groups()
    if binary and not prefix:
        raise UserError(f"expected a size such as 1M, 64KiB or 1GB, got {text!r}", path=path, where=where)
    value = Fraction(number) * 1024 ** _POWERS[prefix.lower()]  # exact: a float rounds 23-digit sizes
    if value.denominator != 1:
        raise UserError(f"size {text!r} is not a whole number of bytes", path=path, where=where)
    return int(value)


def parse_size_range(text: str, *, where: str = "--sizes") -> list[int]:
    """Parse `1K:1G` (doubling steps; LO:HI:F multiplies by F) or a comma list `1K,4K,1M` into sizes in bytes,
    each at least one byte."""
    text = str(text)
    if ":" in text:
        parts = text.split(":")
        if len(parts) not in (2, 3):
            raise UserError(f"expected LO:HI or LO:HI:FACTOR, got {text!r}", where=where)
        lo, hi = parse_size(parts[0], where=where), parse_size(parts[1], where=where)
        try:
            factor = int(parts[2]) if len(parts) == 3 else 2
        except ValueError:
            factor = 0
        if lo <= 0 or hi < lo or factor < 2:
            raise UserError(f"expected 0 < LO <= HI and a whole FACTOR >= 2, got {text!r}", where=where)
        sizes, s = [], lo
        while s <= hi:
            sizes.append(s)
            s *= factor
        return sizes
    items = text.split(",")
    if len(items) > 1 and not all(p.strip() for p in items):
        raise UserError(f"an empty item in the list {text!r}; expected sizes separated by single commas",
                        where=where)
    sizes = [parse_size(p, where=where) for p in items if p.strip()]
    if not sizes or min(sizes) <= 0:
        raise UserError(f"expected sizes of at least one byte, such as 1K:1G or 1K,4K,1M, got {text!r}", where=where)
    return sizes


def format_size(nbytes: int) -> str:
    """Shortest exact form that no reader takes for another size: 1048576 -> '1MiB', 1536 -> '1536B',
    64000000 -> '62500KiB'."""
    forms = [f"{nbytes}B"]
    for unit, base in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if nbytes >= base and nbytes % base == 0:
            forms.append(f"{nbytes // base}{unit}")
    return min(forms, key=len)


def transfer_time_us(nbytes: float, alpha_us: float, bw_GBps: float) -> float:
    """Alpha-beta cost of moving `nbytes` over a link."""
    return alpha_us + nbytes / (bw_GBps * BYTES_PER_US_PER_GBPS)
