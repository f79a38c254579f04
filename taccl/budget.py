"""Memory budget: a synthesis that cannot fit in memory is refused before any solver runs, and a baseline
before it is built (`check_baseline_memory`: its steps are counted without tracing them).

A synthesis holds a few objects per transfer at once (the ordering's tasks, the algorithm, the lowering's
instructions and steps, the proofs' state), so its peak grows with the transfers. A collective needs at
least one transfer for each rank that must receive a chunk it lacks, and a combining one also one for each
contribution that must be summed (`min_transfers`). Peaks measured with `taccl solve` (XML included) run
from 2.7 KiB per such transfer (128x DGX H100 AllReduce: 2.1 M, 5.5 GiB, its node phases sent several
pieces a step) and 3.7 KiB (AllGather: 1.05 M, 3.9 GB) to 15 KiB (64x DGX H100 AllToAll: 0.26 M needed,
0.49 M routed through relays, 3.9 GB). `estimate_bytes` takes less than the lowest, so that a refused
problem would not have fit; one it lets through may still need six times its estimate.
"""
from __future__ import annotations

import os

from .collectives import Collective, canonical_name
from .errors import UserError

__all__ = ["min_transfers", "shape_min_transfers", "estimate_bytes", "machine_memory_bytes", "check_memory",
           "check_shape_memory", "check_baseline_memory"]

BASE_BYTES = 150 << 20  # the interpreter, numpy, HiGHS and the topology: a 2-GPU solve peaks near this
BYTES_PER_TRANSFER = 5 << 9  # 2.5 KiB
# A baseline's program per step: 64x DGX H100 ring AllGather, 2.10 M steps, peaked at 6.84 GB built, written
# as XML, read back and simulated (3.3 KB a step, the interpreter included)
BYTES_PER_BASELINE_STEP = 3 << 10
# A built collective per (chunk, rank) pair of its conditions: make_collective('allgather', 8, 20000), 1.28 M
# postcondition pairs, peaked 411 MB above the interpreter
BYTES_PER_COLLECTIVE_PAIR = 300


def min_transfers(coll: Collective) -> int:
    """The fewest transfers any algorithm for `coll` makes: per chunk, the ranks that must receive it and do
    not hold it; for a combining chunk, the contributions to sum into one rank (sources less one) and then
    the ranks that want the sum, less that one."""
    sources, wanted = {}, {}
    for c, r in coll.precondition:
        sources.setdefault(c, set()).add(r)
    for c, r in coll.postcondition:
        wanted.setdefault(c, set()).add(r)
    total = 0
    for c, dst in wanted.items():
        src = sources.get(c, set())
        if coll.combining:
            total += max(len(src | dst) - 1, 0) + max(len(dst) - 1, 0)
        else:
            total += len(dst - src)
    return total


def estimate_bytes(coll: Collective) -> int:
    """A low estimate of a synthesis' peak memory (see the module docstring)."""
    return _bytes_for(min_transfers(coll))


def _bytes_for(transfers: int) -> int:
    return BASE_BYTES + BYTES_PER_TRANSFER * transfers


def machine_memory_bytes() -> int | None:
    """This machine's physical memory, or None where the platform does not say."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, ValueError, OSError):
        return None


def shape_min_transfers(name: str, ranks: int, chunkup: int, form: str = "") -> int:
    """`min_transfers` of the built-in collective `name` from its shape alone, before it is built (a built
    collective holds every (chunk, rank) pair: gigabytes at 24,000 ranks); 0 for the rooted ones, whose
    size grows only with the ranks."""
    R, k = ranks, chunkup
    per_chunk_pairs = R * k * (R - 1)  # AllGather: R*k chunks, each to R - 1 ranks; the others alike
    return {"allgather": per_chunk_pairs, "alltoall": per_chunk_pairs, "reducescatter": per_chunk_pairs,
            "allreduce": per_chunk_pairs if form == "one-shot" else 2 * per_chunk_pairs}.get(canonical_name(name), 0)


def check_memory(coll: Collective, limit_bytes: int | None, *, path=None, source: str = "--max-memory") -> None:
    """Raise `UserError` when synthesizing `coll` needs more than `limit_bytes` (None: this machine's memory;
    `source` says where a given limit comes from)."""
    _check_transfers(min_transfers(coll), f"{coll.name} on {coll.num_ranks} ranks in {coll.num_chunks} chunks",
                     limit_bytes, path, source)


def check_shape_memory(name: str, ranks: int, chunkup: int, limit_bytes: int | None, *, form: str = "", path=None,
                       source: str = "--max-memory") -> None:
    """`check_memory` for the built-in collective `name` before it is built (see `shape_min_transfers`)."""
    _check_transfers(shape_min_transfers(name, ranks, chunkup, form),
                     f"{canonical_name(name)} on {ranks} ranks at chunk-up {chunkup}", limit_bytes, path, source)


def _check_transfers(transfers: int, what: str, limit_bytes: int | None, path, source: str) -> None:
    limit = limit_bytes
    if limit is None:
        limit, source = machine_memory_bytes(), "this machine's memory"
    if limit is None:
        return
    need = _bytes_for(transfers)
    if need > limit:
        raise UserError(f"{what} makes at least {transfers:,} transfers: synthesizing, lowering and proving it "
                        f"needs at least about {gib(need)} of memory, more than the {gib(limit)} of {source}. "
                        f"Use fewer nodes or a smaller input_chunkup, or a larger --max-memory on a machine "
                        f"that has it", path=path)


def check_baseline_memory(name: str, topology, collective_name: str, instances: int, limit_bytes: int | None, *,
                          chunkup: int = 1, source: str = "--max-memory") -> None:
    """Raise `UserError` when building, proving and simulating a baseline needs more than `limit_bytes` (None:
    this machine's memory): a 1024-rank ring makes millions of steps, every one a Python object until the
    simulator has run, and its collective holds R x R x chunkup (chunk, rank) pairs (a chunk-up of 10^20 was
    killed for memory)."""
    from .baselines import operations

    limit = limit_bytes
    if limit is None:
        limit, source = machine_memory_bytes(), "this machine's memory"
    if limit is None:
        return
    if instances > 1:  # every operation cut into single chunks, each on every instance
        steps = operations(name, topology, collective_name, chunks=True) * instances * chunkup
    else:
        steps = operations(name, topology, collective_name)
    pairs = shape_min_transfers(collective_name, topology.num_ranks, chunkup)
    # (without the interpreter's base: a low estimate)
    need = BYTES_PER_BASELINE_STEP * steps + BYTES_PER_COLLECTIVE_PAIR * pairs
    if need > limit:
        raise UserError(f"baseline {name!r} for {collective_name} on {topology.num_ranks} ranks"
                        f"{f' in {instances} instances' if instances > 1 else ''}"
                        f"{f' at chunk-up {chunkup}' if chunkup > 1 else ''} makes about {steps:,} steps over "
                        f"{pairs:,} (chunk, rank) pairs: building, proving and simulating it needs about {gib(need)} "
                        f"of memory, more than the {gib(limit)} of {source}. Use fewer nodes, instances or chunks, "
                        f"or leave this baseline out")


def gib(nbytes: int) -> str:
    if nbytes >= 1 << 30:
        return f"{nbytes / (1 << 30):.1f} GiB"
    if nbytes >= 1 << 20:
        return f"{nbytes / (1 << 20):.0f} MiB"
    return f"{nbytes / (1 << 10):.0f} KiB" if nbytes >= 1 << 10 else f"{nbytes} B"
