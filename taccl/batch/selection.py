"""Selection: the fastest program per (collective, node count, size), merged into size windows.

Every program that was lowered and simulated competes at every size of the grid: each synthesized
candidate variant and each baseline variant. The winner per size is the fastest (ties go to the baseline,
the safer default); adjacent sizes with one winner form a window. With the SKU's `merge_tolerance` (say
0.03) a program within 3% of the fastest may keep a size, and the windows are chosen to be as few as that
allows: fewer files for the runtime to load, at a cost the table shows. Windows tile the whole size axis: the
boundary between two grid sizes a < b is their geometric mean, the first window starts at 0 and the last
is unbounded (maxBytes 0), so every call size has exactly one window. A synthesized program competes only at
the sizes the runtimes select it for (`taccl.targets.selected_near`: a call's element count must divide
into its nchunksperloop chunks; five instances of 64 chunks, 320, divide no power of two). A candidate whose
job failed simply does not compete; the report names it next to the windows a baseline took instead.

`select(sku, tasks, store, target=T) -> Selection`, and `write_outputs(selection, outdir)`, which writes one
XML per window (minBytes/maxBytes set, proven by the checker before it is written) into `msccl-algorithms/`,
plus `selection.csv` and `selection.json`. A file also serves in-place calls when the checker proves it with
input and output aliased. The XML directory is built aside and swapped in whole, so MSCCL_ALGO_DIR never
sees a mix of two runs.

Per target (`taccl.targets`): the synthesized programs compete as lowered for it (RCCL: no fused steps),
against the baselines as the runtime's own algorithms run them (fused, whatever the target), and the files
are written as it reads them. Only the executor gets files for the windows a baseline wins (elsewhere the
runtime's own algorithm serves them), and only NCCL's own algorithms may win sizes they cannot be written for
(`NCCL_ALGORITHMS`): every baseline is part of the bar, but one no runtime runs wins nothing. Legacy MSCCL
gets out-of-place programs only, windows that end where its scratch can be allocated and at most 4 files per
GPU count: windows are merged with a growing tolerance until they fit, then the 4 that gain most kept.
"""
from __future__ import annotations

import csv
import io
import math
import re
import shutil
from dataclasses import asdict, dataclass, field
from pathlib import Path

from ..errors import UserError
from ..fileio import atomic_write, write_json
from ..simulator import TIE_TOLERANCE
from ..targets import DEFAULT_TARGET, get_target, lowered_for, selected_near
from ..units import format_size
from .jobs import Task, job_failed, tool_version

XML_DIR = "msccl-algorithms"


@dataclass
class Contender:
    """One competing program and what became of it."""

    label: str
    kind: str  # "synthesized" | "baseline"
    source: str
    proto: str
    instances: int
    status: str  # "ok" | "failed"
    reason: str = ""
    time_us: list = field(default_factory=list)
    algbw_GBps: list = field(default_factory=list)
    key: str = ""
    # per grid size: whether the runtimes select the program there (`taccl.targets.selected_near`); empty: at
    # every size (a baseline stands for the runtime's own algorithm, which has no such condition)
    runs: list = field(default_factory=list)
    # why no runtime would run it (a baseline that is not NCCL's own algorithm and cannot be written as a
    # file the target loads); "": it may win sizes. Either way it is part of the bar the programs are held to
    undeliverable: str = ""

    def time_at(self, i: int) -> float:
        """The program's time at grid size i; infinite where the runtimes would not select it."""
        return self.time_us[i] if not self.runs or self.runs[i] else math.inf


@dataclass
class Window:
    collective: str
    nodes: int
    ranks: int
    index: int
    min_bytes: int
    max_bytes: int  # 0: unbounded (the executor's convention, inclusive otherwise)
    sizes: list  # the grid sizes inside
    winner: str  # label, or "" when no program exists (stock NCCL runs)
    kind: str  # "synthesized" | "baseline" | "none"
    best_baseline: list  # per size: label of the fastest baseline ("" if none)
    speedup: list  # per size: best baseline time / winner time (None without a baseline)
    vs_bound: list = field(default_factory=list)  # per size: winner time / the optimum (see Group.optimum_us)
    file: str = ""  # path relative to OUTDIR, "" when the runtime's own algorithm serves the window
    inplace: bool = False  # the file also serves in-place calls (proven with input and output aliased)
    note: str = ""

    @property
    def speedup_range(self) -> tuple:
        vals = [s for s in self.speedup if s is not None]
        return (min(vals), max(vals)) if vals else (None, None)


@dataclass
class Group:
    collective: str
    nodes: int
    ranks: int
    sizes: list
    lower_bound_us: list
    contenders: list
    windows: list = field(default_factory=list)
    failed_jobs: list = field(default_factory=list)  # (label, reason) of the synthesis jobs that failed (`job_failed`)
    failed_baselines: list = field(default_factory=list)  # and of the baseline jobs
    # what the programs are held against per size: the lower bound, for AllReduce the reduce-scatter plus
    # all-gather optimum (`taccl.bounds.allreduce_optimum`; the provable bound M/B needs in-network reduction)
    optimum_us: list = field(default_factory=list)
    shortfalls: list = field(default_factory=list)  # (size, why): where the best synthesized program misses


@dataclass
class JobSummary:
    label: str
    kind: str
    collective: str
    nodes: int
    status: str
    reason: str
    time_s: float  # synthesis (or baseline build) wall time when it was computed
    cached: bool
    predicted_us: float | None = None
    lower_bound_us: float | None = None


@dataclass
class Selection:
    sku: str
    topology: str
    grid: list
    groups: list
    jobs: list
    tool: str = ""
    files: dict = field(default_factory=dict)  # ranks -> [paths relative to OUTDIR]
    target: str = DEFAULT_TARGET  # the runtime the files are written for (`taccl.targets`)

    def to_json(self) -> dict:
        doc = asdict(self)
        for g, gdoc in zip(self.groups, doc["groups"]):
            for w, wdoc in zip(g.windows, gdoc["windows"]):
                wdoc["speedup_min"], wdoc["speedup_max"] = w.speedup_range
        return {"format": "taccl.selection/1", **doc}


def _lower_bounds(topology, collective: str, sizes, *, optimum: bool = False) -> list:
    """The bound for any protocol (the smallest of the per-protocol bounds); with `optimum`, an AllReduce's
    reduce-scatter plus all-gather optimum."""
    from ..bounds import allreduce_optimum, lower_bound

    try:
        if optimum and collective == "allreduce":
            return [allreduce_optimum(topology, s) for s in sizes]
        return [lower_bound(topology, collective, s) for s in sizes]
    except UserError:
        return [None] * len(sizes)


# The quality target: the best synthesized program is never slower than the best baseline, and it is either
# this much faster or this close to the optimum. Two times within `taccl.simulator.TIE_TOLERANCE` are a
# tie, not a loss.
TARGET_SPEEDUP = 1.1
TARGET_VS_OPTIMUM = 1.1


def target_shortfall(syn: float | None, base: float | None, opt: float | None) -> str | None:
    """Why the best synthesized time `syn` misses the target against the best baseline `base` and the
    optimum `opt` (None: meets it)."""
    if syn is None:
        return "no synthesized program"
    if base is not None and syn > base * (1 + TIE_TOLERANCE):
        return f"best synthesized {syn:.1f} us is slower than the best baseline {base:.1f} us"
    if (base is None or base / syn < TARGET_SPEEDUP) and (opt is None or syn / opt > TARGET_VS_OPTIMUM):
        sp = f"{base / syn:.2f}x the best baseline" if base else "no baseline"
        return f"{sp}, {syn / opt:.2f}x the optimum" if opt else sp
    return None


def _shortfalls(g: Group) -> list:
    ok = [c for c in g.contenders if c.status == "ok"]
    out = []
    for i, size in enumerate(g.sizes):
        syn = min((c.time_at(i) for c in ok if c.kind == "synthesized"), default=None)
        if syn == math.inf:
            out.append((size, "no synthesized program runs at this size: a call of it divides into none's chunks "
                              "(nchunksperloop)"))
            continue
        why = target_shortfall(syn, min((c.time_at(i) for c in ok if c.kind == "baseline"), default=None),
                               g.optimum_us[i] if g.optimum_us else None)
        if why:
            out.append((size, why))
    return out


def select(sku, tasks: list, store, *, cached_keys: set = frozenset(), target: str = DEFAULT_TARGET,
           deployed: dict | None = None) -> Selection:
    """`deployed`: {(collective, nodes): [ProgramJob]} that compete too (`taccl.batch.jobs.deployed`)."""
    from ..topology import Topology

    runtime = get_target(target)
    lowering = lowered_for(runtime)
    groups, jobs = {}, []
    for task in tasks:
        g = groups.get((task.collective, task.nodes))
        if g is None:
            topo = Topology(sku.spec, task.nodes)
            g = groups[(task.collective, task.nodes)] = Group(
                collective=task.collective, nodes=task.nodes, ranks=topo.num_ranks, sizes=list(sku.grid),
                lower_bound_us=_lower_bounds(topo, task.collective, sku.grid), contenders=[],
                optimum_us=_lower_bounds(topo, task.collective, sku.grid, optimum=True))
        jobs.append(_job_summary(task, store, cached_keys))
        if jobs[-1].status != "ok":
            (g.failed_jobs if task.kind == "synthesis" else g.failed_baselines).append((task.label, jobs[-1].reason))
        for prog in task.programs:
            if prog.target == lowering or prog.kind == "baseline":
                g.contenders.append(_contender(prog, store, g))
                if prog.kind == "baseline":
                    g.contenders[-1].undeliverable = _undeliverable(prog, store, runtime, sku.emit_baselines)
    for (coll, nodes), progs in (deployed or {}).items():
        if (coll, nodes) in groups:
            g = groups[(coll, nodes)]
            g.contenders += [_contender(p, store, g) for p in progs]
    for g in groups.values():
        g.windows = _windows(g, sku.merge_tolerance)
        g.shortfalls = _shortfalls(g)
    order = {c: i for i, c in enumerate(sku.collectives)}
    ordered = sorted(groups.values(), key=lambda g: (order[g.collective], g.nodes))
    if runtime.max_files is not None:
        for ranks in {g.ranks for g in ordered}:
            _fit_file_limit([g for g in ordered if g.ranks == ranks], runtime, sku.merge_tolerance)
    return Selection(sku=sku.name, topology=sku.spec.name, grid=list(sku.grid), groups=ordered, jobs=jobs,
                     tool=tool_version(), target=runtime.name)


# The baselines that stand for NCCL's (and RCCL's) own algorithms: a size one of them wins may be left to the
# runtime. The others (direct, one-shot, hierarchical, two-step) are MSCCL programs, which run only as files.
NCCL_ALGORITHMS = frozenset({"ring", "double-binary-tree"})


def _undeliverable(prog, store, runtime, emit_baselines: bool) -> str:
    """Why no runtime would run baseline `prog` ("": one does). Sizes it wins would otherwise be left to
    NCCL's own algorithm, slower than the time the selection showed for them."""
    from ..lowering import DEFAULT_MAX_STEPS
    from ..program import MAX_NODES

    if prog.source in NCCL_ALGORITHMS:
        return ""
    if runtime.name != DEFAULT_TARGET:
        return f"{runtime.name} runs no baseline file, and {prog.source} is not its own algorithm"
    if not emit_baselines:
        return f"baselines are left to NCCL (emit: nccl), and {prog.source} is not NCCL's algorithm"
    record = store.get(prog.key) or {}  # (a record's key holds the tool's version: it has these fields)
    over = []
    if record.get("max_steps", 0) > DEFAULT_MAX_STEPS:
        over.append(f"{record['max_steps']} steps in a thread block > {DEFAULT_MAX_STEPS} (MSCCL_MAX_NUM_STEPS)")
    if record.get("max_nodes", 0) > MAX_NODES:
        over.append(f"{record['max_nodes']} XML nodes a rank > {MAX_NODES} (MAX_NODES)")
    if over:
        return f"as a file it exceeds the executor's limits ({'; '.join(over)}), and NCCL does not run {prog.source}"
    return ""


def _emits(w: Window, runtime) -> bool:
    """Whether window `w` gets a file for `runtime`. A baseline stands for the runtime's own algorithm and
    is written as a program for the executor only: RCCL's and legacy NCCL's own serve its windows there."""
    return w.kind == "synthesized" or (w.kind == "baseline" and runtime.name == DEFAULT_TARGET)


def _fit_file_limit(groups: list, runtime, tolerance: float) -> None:
    """At most `runtime.max_files` files for these groups (one GPU count): merge windows with a growing
    tolerance, then keep the windows that gain most over the best baseline and leave the rest to NCCL."""
    def count():
        return sum(_emits(w, runtime) for g in groups for w in g.windows)

    for tol in (0.03, 0.05, 0.1, 0.2, 0.5):
        if count() <= runtime.max_files:
            return
        if tol > tolerance:
            for g in groups:
                g.windows = _windows(g, tol)
    if count() <= runtime.max_files:
        return

    def gain(w):
        vals = [s for s in w.speedup if s is not None]
        return sum(vals) / len(vals) if vals else 1.0

    ranked = sorted((w for g in groups for w in g.windows if _emits(w, runtime)), key=gain, reverse=True)
    for w in ranked[runtime.max_files:]:
        w.kind, w.winner = "none", ""
        w.note = (f"left to NCCL: {runtime.name} loads at most {runtime.max_files} files, kept for the windows "
                  f"that gain most")


def _job_summary(task: Task, store, cached_keys) -> JobSummary:
    failed = job_failed(task, store.get)
    recs = [store.get(p.key) or {"status": "failed", "reason": "no result"} for p in task.programs]
    bad = [r for r in recs if r["status"] != "ok"]
    if task.kind == "synthesis":
        rec = store.get(task.key) or {"status": "failed", "reason": "no result"}
        if rec["status"] != "ok":
            why = rec.get("reason", "")
        elif failed:
            why = "no program of it could be lowered and simulated: " + "; ".join(sorted({r.get("reason", "")
                                                                                          for r in bad}))
        else:
            why = ""
        return JobSummary(label=task.label, kind="synthesis", collective=task.collective, nodes=task.nodes,
                          status="failed" if failed else "ok", reason=why, time_s=rec.get("time_s", 0.0),
                          cached=task.key in cached_keys, predicted_us=rec.get("predicted_us"),
                          lower_bound_us=rec.get("lower_bound_us"))
    return JobSummary(label=task.label, kind="baseline", collective=task.collective, nodes=task.nodes,
                      status="failed" if failed else "ok",
                      reason="; ".join(sorted({r.get("reason", "") for r in bad})),
                      time_s=round(sum(r.get("time_s", 0.0) for r in recs), 3),
                      cached=all(p.key in cached_keys for p in task.programs))


def _contender(prog, store, g: Group) -> Contender:
    c = Contender(label=prog.label, kind=prog.kind, source=prog.source, proto=prog.proto, instances=prog.instances,
                  status="failed", key=prog.key)
    sim = store.get(prog.sim_key)
    if sim is None:
        c.reason = "no result"
    elif sim["status"] != "ok":
        c.reason = sim.get("reason", "")
    else:
        c.status, c.time_us, c.algbw_GBps = "ok", sim["time_us"], sim["algbw_GBps"]
        record = store.get(prog.key) if c.kind != "baseline" else None
        # (the <algo> element opens the file)
        found = re.search(r'nchunksperloop="(\d+)"', record["xml"][:4096]) if record and "xml" in record else None
        if found:
            c.runs = [selected_near(g.collective, g.ranks, size, int(found.group(1))) for size in g.sizes]
    return c


def _picks(ok: list, n: int, tolerance: float) -> list:
    """The program to run at each of the n grid sizes, as few distinct runs as the tolerance allows.

    A program is good at size i when the runtimes select it there (`Contender.time_at`) and it is within
    `tolerance` of the fastest there; at a size where none is, NCCL's own algorithm runs. Walking up the sizes,
    each new window takes the good program that stays good the longest (then the fastest, then a baseline on
    a tie): the greedy choice that minimises the number of windows. With tolerance 0 it is the fastest per size.
    """
    if not ok:
        return [None] * n
    best = [min(c.time_at(i) for c in ok) for i in range(n)]

    def good(c, i):
        return c.time_at(i) <= best[i] * (1.0 + tolerance) * (1.0 + 1e-12) and c.time_at(i) < math.inf

    def reach(c, i):
        j = i
        while j < n and good(c, j):
            j += 1
        return j

    picks, i = [], 0
    while i < n:
        # `ok` is in preference order (baselines first), and max keeps the first of equals
        pick = max((c for c in ok if good(c, i)), key=lambda c: (reach(c, i), -c.time_at(i)), default=None)
        end = reach(pick, i) if pick else i + 1  # (None: no program the runtimes select at this size)
        picks += [pick] * (end - i)
        i = end
    return picks


def _windows(g: Group, tolerance: float = 0.0) -> list:
    ok = [c for c in g.contenders if c.status == "ok"]
    # baselines first, a previous run's deployed programs last, then by label: ties go to the baseline, a
    # fresh program beats a deployed one it ties with, and the order never depends on the run
    ok.sort(key=lambda c: (c.kind != "baseline", c.source == "deployed", c.label))
    # only what a runtime runs may win sizes; every baseline is part of the bar (`best_base`)
    winners = _picks([c for c in ok if not c.undeliverable], len(g.sizes), tolerance)
    best_base = [min((c for c in ok if c.kind == "baseline"), key=lambda c: c.time_at(i), default=None)
                 for i in range(len(g.sizes))]
    failed = [label for label, _ in g.failed_jobs]
    windows, start = [], 0
    for i in range(1, len(g.sizes) + 1):
        if i < len(g.sizes) and winners[i] is winners[start]:
            continue
        win = winners[start]
        lo = 0 if start == 0 else math.isqrt(g.sizes[start - 1] * g.sizes[start])
        hi = 0 if i == len(g.sizes) else math.isqrt(g.sizes[i - 1] * g.sizes[i]) - 1
        idx = range(start, i)
        note = ""
        if win is None:
            note = "no program: the runtime's own algorithm serves these sizes"
        elif win.kind == "baseline" and failed:
            note = f"baseline: synthesis failed for {', '.join(failed)}"
        faster = sorted({best_base[k].label for k in idx if best_base[k] and best_base[k].undeliverable and
                         (win is None or best_base[k].time_us[k] < win.time_us[k])})
        if faster:
            why = next(c.undeliverable for c in ok if c.label == faster[0])
            note = (note + "; " if note else "") + f"faster, not run: {', '.join(faster)} ({why})"
        windows.append(Window(
            collective=g.collective, nodes=g.nodes, ranks=g.ranks, index=len(windows), min_bytes=lo, max_bytes=hi,
            sizes=[g.sizes[k] for k in idx], winner=_label(win), kind=win.kind if win else "none",
            best_baseline=[_label(best_base[k]) for k in idx],
            speedup=[best_base[k].time_us[k] / win.time_us[k] if best_base[k] and win else None for k in idx],
            vs_bound=[win.time_us[k] / g.optimum_us[k] if win and g.optimum_us and g.optimum_us[k] else None
                      for k in idx],
            note=note))
        start = i
    return windows


def _label(c) -> str:
    return c.label if c is not None else ""


# ------------------------------------------------------------------------------------------------------
# Writing

def _file_name(w: Window) -> str:
    hi = "inf" if w.max_bytes == 0 else format_size(w.max_bytes)
    safe = re.sub(r"[^A-Za-z0-9_.+-]", "-", w.winner)
    return f"{w.collective}-{w.ranks}r-{w.index:02d}-{format_size(w.min_bytes)}-{hi}-{safe}.xml"


_BATCH_FILE = re.compile(r"[a-z]+-[0-9]+r-[0-9]{2,}-[^-/]+-[^-/]+-[A-Za-z0-9_.+-]+\.xml")


def is_batch_file_name(name: str) -> bool:
    """Whether `name` is one `_file_name` gives (a file a batch wrote into msccl-algorithms/)."""
    return _BATCH_FILE.fullmatch(name) is not None


def write_outputs(selection: Selection, outdir, store, *, emit_baselines: bool = True, report=None) -> None:
    from ..lowering import DEFAULT_MAX_STEPS, serve_inplace, write_program
    from ..lowering.emit import check_limits
    from ..program import MAX_NODES
    from ..xmlio import parse_xml

    runtime = get_target(selection.target)
    outdir = Path(outdir)
    staging = outdir / f".{XML_DIR}.tmp"
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    files = {}
    for g in selection.groups:
        by_label = {c.label: c for c in g.contenders}
        for w in g.windows:
            w.file, w.inplace = "", False
            if not _emits(w, runtime) or (w.kind == "baseline" and not emit_baselines):
                continue
            record = store.get(by_label[w.winner].key)
            program = parse_xml(record["xml"]).program
            # NCCL's own ring may be larger, as a program, than an executor of the default build loads
            too_big = w.kind == "baseline" and check_limits(program, max_tbs=program.max_threadblocks,
                                                            max_steps=DEFAULT_MAX_STEPS, max_nodes=MAX_NODES)
            if too_big:
                w.note = (w.note + "; " if w.note else "") + (
                    f"left to NCCL: as a program it exceeds the executor's limits ({'; '.join(too_big)})")
                continue
            program.min_bytes, program.max_bytes = w.min_bytes, w.max_bytes
            program.name = f"{selection.sku} {w.winner}"[:255]
            if runtime.dialect == "executor":
                # serve in-place calls too (DDP's AllReduce, FSDP's AllGather) where the program stays correct
                # with its input and output aliased (msccl-xml.md section 1.8); the checker decides
                w.inplace = serve_inplace(program)
            elif w.max_bytes == 0 and any(gpu.s_chunks for gpu in program.gpus):
                # legacy MSCCL allocates scratch for maxBytes when the communicator is created
                program.max_bytes = w.max_bytes = selection.grid[-1]
                w.note = (w.note + "; " if w.note else "") + (
                    f"window ends at the grid's largest size: {runtime.name} allocates scratch for it up front")
            name = _file_name(w)
            write_program(program, staging / name, target=runtime.name)  # proven with its window
            w.file = f"{XML_DIR}/{name}"
            files.setdefault(g.ranks, []).append(w.file)
    selection.files = {r: sorted(v) for r, v in sorted(files.items())}
    _swap_in(staging, outdir / XML_DIR)
    write_json(outdir / "selection.json", selection.to_json())
    atomic_write(outdir / "selection.csv", selection_csv(selection))


def _swap_in(staging: Path, final: Path) -> None:
    old = final.parent / f".{final.name}.old"
    shutil.rmtree(old, ignore_errors=True)
    if final.exists():
        final.replace(old)
    staging.replace(final)
    shutil.rmtree(old, ignore_errors=True)


CSV_COLUMNS = ["collective", "nodes", "ranks", "window", "min_bytes", "max_bytes", "first_grid_size",
               "last_grid_size", "winner", "kind", "best_baseline", "speedup_min", "speedup_max", "file", "inplace",
               "note"]


def selection_csv(selection: Selection) -> str:
    buf = io.StringIO()
    out = csv.writer(buf, lineterminator="\n")
    out.writerow(CSV_COLUMNS)
    for g in selection.groups:
        for w in g.windows:
            lo, hi = w.speedup_range
            base = sorted({b for b in w.best_baseline if b})
            out.writerow([w.collective, w.nodes, w.ranks, w.index, w.min_bytes, w.max_bytes, w.sizes[0], w.sizes[-1],
                          w.winner or "-", w.kind, " ".join(base) or "-", _num(lo), _num(hi), w.file or "-",
                          "yes" if w.inplace else "no", w.note])
    return buf.getvalue()


def _num(x) -> str:
    return "" if x is None else f"{x:.3f}"
