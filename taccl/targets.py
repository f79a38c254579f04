"""The runtimes an XML program is written for, and what each refuses or reads otherwise.

=================  ==========  ==================================================================================
target             dialect     limits and meanings beyond the dialect's (`../shared/docs/msccl-xml.md`)
=================  ==========  ==================================================================================
msccl-executor     executor    the reference: what `taccl.checker` checks by default
rccl               executor    ROCm's NCCL, which ships the MSCCL executor: since ROCm 6.1 a program with a fused
                               step (rcs, rrs, rrcs, rrc) returns an error at its first call, and a rank may
                               have at most 64 thread blocks; it scans a directory in readdir order, so
                               windows that overlap select differently from machine to machine
msccl-legacy       legacy      the first MSCCL (`MSCCL_XML_FILES`): one call kind per file, ``maxBytes``
                               exclusive (``0`` an empty window), scratch allocated at communicator creation for
                               ``maxBytes`` (an unbounded window with scratch fails it), at most 4 files
=================  ==========  ==================================================================================

No runtime reads ``root``: a Broadcast or Reduce program written for root 0 also runs the calls of every
other root there, with a wrong result; taccl's own runtime matches the root. So a rooted program on more
than one rank is refused where a runtime would select it (`rooted_problem`: `taccl check --target`,
`taccl batch`), and `taccl solve / lower / baseline` say so when they write one.

A program lowered for RCCL sends and receives with plain steps: a received partial sum lands in scratch and a
local reduction (``re``) adds it, where the executor's programs fuse the two (``rrc``), and a relay receives
then sends. `taccl solve / lower / baseline --target rccl` lower so, and `taccl check --target rccl` refuses
what RCCL would.

Without --target, a command that knows the topology writes for the runtime of its GPUs (the topology's
``vendor``, `VENDOR_TARGETS`): RCCL on AMD GPUs, where the MSCCL executor and legacy MSCCL do not run, and the
MSCCL executor on NVIDIA ones.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from .errors import UserError
from .program import Program, StepType

__all__ = ["Target", "TARGETS", "DEFAULT_TARGET", "VENDOR_TARGETS", "default_target", "ROOTED", "LEGACY_MAX_FILES",
           "get_target", "target_problems",
           "rooted_problem", "add_target_argument", "target_of_args", "prepare_for_target", "load_order",
           "directory_problems", "lowered_for", "check_dialect", "check_custom_target", "RANK_MULTIPLIED",
           "selects_size", "selected_near", "SELECTION_ELEMENT_BYTES"]


@dataclass(frozen=True)
class Target:
    name: str
    dialect: str  # the XML dialect written and read (`taccl.xmlio.DIALECTS`)
    fused_steps: bool = True  # whether the runtime runs rcs, rrs, rrcs and rrc
    max_tbs: int | None = None  # thread blocks a rank may have (None: the dialect's)
    sorted_scan: bool = True  # a directory is loaded in name order (else in readdir order: no order to rely on)
    max_files: int | None = None  # files one communicator loads
    # environment the runtime needs beyond the files' variable: (setting, why), printed with the files
    env: tuple = ()


# the step types that receive and then reduce, copy or send in one step
FUSED_STEPS = frozenset({StepType.RECV_COPY_SEND, StepType.RECV_REDUCE_SEND, StepType.RECV_REDUCE_COPY_SEND,
                         StepType.RECV_REDUCE_COPY})
ROOTED = frozenset({"broadcast", "reduce", "gather", "scatter"})
LEGACY_MAX_FILES = 4  # microsoft/msccl loads at most 4 files of MSCCL_XML_FILES
# legacy MSCCL allocates maxBytes x s_chunks / nchunksperloop bytes of scratch when the communicator is created:
# past this no GPU has the memory (the largest have 192-288 GB), so creation fails
LEGACY_SCRATCH_LIMIT = 256 << 30

TARGETS = {t.name: t for t in (
    Target("msccl-executor", "executor"),
    Target("rccl", "executor", fused_steps=False, max_tbs=64, sorted_scan=False,  # MSCCL_MAX_NUM_THREAD_BLOCKS
           # RCCL selects MSCCL programs only on machines its topology code enables them for (one MI300X node)
           # unless forced (src/misc/msccl/msccl_lifecycle.cc, mscclSchedulerSelectAlgo)
           env=(("RCCL_MSCCL_FORCE_ENABLE=1", "without it RCCL selects MSCCL programs only where it enables "
                 "them itself (one MI300X node)"),)),
    Target("msccl-legacy", "legacy", max_files=LEGACY_MAX_FILES),
)}
DEFAULT_TARGET = "msccl-executor"
# the runtime a topology's programs are for when no --target names one: on AMD GPUs only RCCL (which ships the
# MSCCL executor) runs MSCCL programs, and it refuses fused steps
VENDOR_TARGETS = {"nvidia": DEFAULT_TARGET, "amd": "rccl"}


# the calls whose larger buffer holds a count for every rank (N = count x nranks, msccl-xml.md 1.8)
RANK_MULTIPLIED = frozenset({"allgather", "reducescatter", "alltoall"})
# the element size `taccl batch` judges a program's sizes in: float32 (nccl-tests' default); a type of 2 or 1
# bytes has more elements in the same bytes, so a program selected for float32 is also selected for it
SELECTION_ELEMENT_BYTES = 4


def selects_size(collective: str, nranks: int, size_bytes: int, nchunksperloop: int,
                 elem_bytes: int = SELECTION_ELEMENT_BYTES) -> bool:
    """Whether the runtimes select a program of `nchunksperloop` chunks for a call whose larger buffer holds
    `size_bytes` of `elem_bytes`-byte elements: only where that element count is a multiple of nchunksperloop
    (both runtimes, msccl-xml.md 1.8; otherwise NCCL's own algorithm runs), and of the ranks where the buffer
    holds one count per rank (taccl's runtime needs both). A program of 320 chunks (five instances of 64)
    never runs at a power-of-two size."""
    if size_bytes <= 0 or size_bytes % elem_bytes:
        return False
    mult = nranks if collective in RANK_MULTIPLIED else 1
    return (size_bytes // elem_bytes) % math.lcm(nchunksperloop, mult) == 0


def selected_near(collective: str, nranks: int, size_bytes: int, nchunksperloop: int) -> bool:
    """Whether the runtimes select the program for calls of about `size_bytes` (a grid size of `taccl batch`,
    a power of two): `selects_size` in float32 for a call of that size, its element count taken as a multiple
    of the rank count's odd part where the buffer holds one count per rank (a 24-rank AllGather's calls hold
    a multiple of 24 counts, never a power of two)."""
    mult = nranks if collective in RANK_MULTIPLIED else 1
    odd = mult // (mult & -mult)
    return selects_size(collective, nranks, size_bytes * odd, nchunksperloop)


def get_target(name: str, *, where: str = "--target") -> Target:
    try:
        return TARGETS[name]
    except KeyError:
        raise UserError(f"unknown target {name!r}; known: {', '.join(TARGETS)}", where=where) from None


def target_problems(program: Program, target: Target) -> list:
    """What `target` refuses in `program` beyond its dialect's rules: [(rank, message)], empty when none.
    (Rank None: the whole program.)"""
    out = []
    for g in program.gpus:
        if target.max_tbs is not None and len(g.threadblocks) > target.max_tbs:
            out.append((g.id, f"{len(g.threadblocks)} thread blocks, {target.name} allows {target.max_tbs} a rank"))
        if not target.fused_steps:
            fused = sorted({str(st.type) for tb in g.threadblocks for st in tb.steps
                            if StepType(st.type) in FUSED_STEPS})
            if fused:
                out.append((g.id, f"fused step(s) {', '.join(fused)}, which {target.name} refuses at the first "
                                  f"call (lower with --target {target.name})"))
    if target.dialect == "legacy":
        scratch = max((g.s_chunks for g in program.gpus), default=0)
        if scratch and program.nchunksperloop:
            if program.max_bytes == 0:
                out.append((None, f"an unbounded window with {scratch} scratch chunk(s): {target.name} allocates "
                                  f"scratch for maxBytes when the communicator is created, which then fails "
                                  f"(give the window an upper bound)"))
            else:
                need = program.max_bytes * scratch // program.nchunksperloop
                if need > LEGACY_SCRATCH_LIMIT:
                    out.append((None, f"maxBytes={program.max_bytes + 1} with {scratch} scratch chunk(s) of "
                                      f"{program.nchunksperloop}: {target.name} allocates {need / 2**30:.0f} GiB of "
                                      f"scratch when the communicator is created, which fails"))
    return out


def rooted_problem(program: Program, target: Target) -> str | None:
    """Why `target` would run this rooted program for calls of other roots, or None."""
    if program.collective not in ROOTED or program.ngpus < 2:
        return None
    root = program.root if program.root is not None else 0
    return (f"a {program.collective} program for root {root}: {target.name} does not read root and would run it "
            f"for calls of every root, with a wrong result for all but root {root}; only taccl's runtime "
            f"matches the root")


def check_custom_target(target: Target, *, where: str = "--target") -> None:
    """A user-defined collective is written as coll="custom", which legacy MSCCL alone runs
    (`ncclCustomCollective`): refuse any other target before any work."""
    if target.dialect != "legacy":
        raise UserError(f"a user-defined collective runs only on legacy MSCCL (coll=\"custom\", through "
                        f"ncclCustomCollective), not on {target.name}: pass --target msccl-legacy", where=where)


def lowered_for(target: Target) -> str:
    """The target whose lowering `target` runs: RCCL's (no fused steps) or the executor's, which legacy MSCCL
    runs too (only the file's dialect and window differ)."""
    return target.name if not target.fused_steps else DEFAULT_TARGET


def add_target_argument(parser) -> None:
    """--target, and --dialect kept as its older spelling (legacy = msccl-legacy)."""
    parser.add_argument("--target", choices=list(TARGETS), default=None,
                        help="the runtime the program is for (default: the topology's, msccl-executor on NVIDIA "
                             "GPUs, rccl on AMD ones): its dialect, limits and "
                             "meanings (rccl: no fused steps, at most 64 thread blocks a rank; msccl-legacy: one "
                             "call kind per file, a bounded window when there is scratch)")
    parser.add_argument("--dialect", choices=("executor", "legacy"), default=None,
                        help="XML dialect: executor = --target msccl-executor, legacy = --target msccl-legacy")


def check_dialect(target: str | None, dialect: str | None) -> None:
    """--target and --dialect, when both are given, must name the same dialect."""
    if target and dialect and get_target(target).dialect != dialect:
        raise UserError(f"target {target} uses the {get_target(target).dialect} dialect, not {dialect}",
                        where="--dialect")


def default_target(spec=None) -> str:
    """The target of a topology's programs when none is named (`VENDOR_TARGETS`; None: no topology known)."""
    return VENDOR_TARGETS[spec.vendor] if spec is not None else DEFAULT_TARGET


def target_of_args(args, spec=None) -> Target:
    """--target, else --dialect legacy, else the default of the topology `spec` (`default_target`)."""
    check_dialect(args.target, args.dialect)
    if args.target:
        return get_target(args.target)
    if args.dialect == "legacy":
        return get_target("msccl-legacy")
    return get_target(default_target(spec))


def prepare_for_target(program: Program, target: Target, *, report=print) -> None:
    """Declare what `target` can run of a proven `program`, in place: in-place calls where the checker proves
    them (executor dialect; a legacy file serves one call kind), and for the legacy runtime an upper bound on
    an unbounded window when there is scratch (its default, 128 MiB exclusive). Says what it changed, notes a
    program no power-of-two size selects (`selected_near`), and warns about a rooted program."""
    from .lowering import serve_inplace
    from .xmlio import LEGACY_DEFAULT_MAX_BYTES

    if target.dialect == "executor":
        serve_inplace(program)  # declared for in-place calls (DDP's AllReduce) only where proven so
    elif program.max_bytes == 0 and any(g.s_chunks for g in program.gpus):
        program.max_bytes = LEGACY_DEFAULT_MAX_BYTES - 1  # inclusive here; written as the default, exclusive
        report(f"note: {target.name} allocates scratch for the window's upper bound when the communicator is "
               f"created: the window ends below {LEGACY_DEFAULT_MAX_BYTES >> 20} MiB, the runtime's default "
               f"(`taccl lower --max-bytes` sets another)")
    n = program.nchunksperloop
    if not selected_near(program.collective, program.ngpus, 1 << 40, n):
        report(f"note: the runtimes select this program only for calls whose element count (of the larger "
               f"buffer) is a multiple of its nchunksperloop, {n}, which no power-of-two size is: instances and a "
               f"chunk-up of powers of two avoid it")
    why = rooted_problem(program, target)
    if why:
        report(f"warning: {why}")


def load_order(directory, target: Target) -> list:
    """The files of `directory` as `target` loads them: for the executor and RCCL (MSCCL_ALGO_DIR) every
    regular file and link, whatever its name, in name order (RCCL's readdir order has no order to rely on);
    for legacy MSCCL (which reads the list in MSCCL_XML_FILES) the *.xml files in name order, the list
    `taccl batch` prints."""
    from pathlib import Path

    entries = sorted(p for p in Path(directory).iterdir() if p.is_file() or p.is_symlink())
    if target.dialect == "legacy":
        entries = [p for p in entries if p.suffix == ".xml"]
    return entries


def directory_problems(loaded: list, target: Target) -> list:
    """What goes wrong when `target` loads these files together: [(severity, path, message)].

    `loaded` is [(path, Program or None when the file cannot be read)] in load order (`load_order`). The
    executor stops at the first file it cannot read, which leaves every algorithm of the directory
    unusable; legacy MSCCL loads 4 files at most; two programs whose windows overlap for one collective,
    rank count and call kind leave the overlap to the first in load order (RCCL: to whichever readdir
    returns first)."""
    out = []
    bad = [str(p) for p, prog in loaded if prog is None]
    if bad and target.dialect == "executor":
        first = bad[0]
        out.append(("error", first, f"{target.name} stops loading the directory at this file: every algorithm "
                                    f"of the directory is unusable (remove or fix it)"))
    if target.max_files is not None and len(loaded) > target.max_files:
        rest = ", ".join(str(p) for p, _ in loaded[target.max_files:])
        out.append(("error", str(loaded[target.max_files][0]),
                    f"{target.name} loads at most {target.max_files} files: {rest} would be ignored"))
    progs = [(p, prog) for p, prog in loaded if prog is not None]
    for i, (pa, a) in enumerate(progs):
        for pb, b in progs[i + 1:]:
            overlap = _window_overlap(a, b)
            if overlap is None:
                continue
            lo, hi = overlap
            span = f"{lo} to {'any size' if hi is None else f'{hi} bytes'}"
            if target.sorted_scan:
                out.append(("warning", str(pb), f"its window overlaps {pa}'s ({a.collective}, {a.ngpus} ranks) from "
                                                f"{span}: {pa} is selected there, this file never"))
            else:
                out.append(("error", str(pb), f"its window overlaps {pa}'s ({a.collective}, {a.ngpus} ranks) from "
                                              f"{span}: {target.name} scans the directory in readdir order, so "
                                              f"which one runs there differs between machines"))
    return out


def _window_overlap(a: Program, b: Program):
    """(lowest, highest or None = unbounded) bytes both programs' windows take for a call kind they share,
    or None. Windows here are inclusive with 0 = unbounded (the model's convention, whatever the dialect)."""
    if (a.collective, a.ngpus) != (b.collective, b.ngpus):
        return None
    if not ((a.inplace and b.inplace) or (a.outofplace and b.outofplace)):
        return None
    lo = max(a.min_bytes, b.min_bytes)
    highs = [p.max_bytes for p in (a, b) if p.max_bytes]
    hi = min(highs) if highs else None
    if hi is not None and hi < lo:
        return None
    return lo, hi
