"""Batch synthesis for a cluster SKU: every algorithm its jobs need, verified, selected by message size.

    sku = load_sku("sketches/skus/ndv2.yaml")     # taccl.batch.sku: every problem in the file at once
    tasks = plan(sku)                            # taccl.batch.jobs: syntheses and baselines, keyed by inputs
    run the tasks not in the cache               # taccl.batch.executors: local processes or Ray
    selection = select(sku, tasks, store)        # taccl.batch.selection: winner per size, merged windows
    write_outputs(...); write_report(...)        # XML per window, selection.csv/json, report.md + plots

`run_batch(sku_path, outdir, ...) -> BatchResult` does all of it; `taccl batch` is its command line.

Output directory:

    OUTDIR/cache/                 one JSON record per result key (synthesis, program, simulation)
    OUTDIR/msccl-algorithms/      one proven XML per winning window: MSCCL_ALGO_DIR, or list in MSCCL_XML_FILES
    OUTDIR/selection.csv, .json   the selection table (and, in JSON, every contender's time per size)
    OUTDIR/report.md, plots/      algbw against size per collective, speedups, synthesis cost

A SKU with `targets:` other than its topology's runtime alone (the executor; RCCL on AMD GPUs) gets all but
the cache once per target, in OUTDIR/<target>/ (`taccl.targets`: each runtime's own lowering, dialect,
windows and limits).
"""
from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path

from ..budget import machine_memory_bytes
from ..errors import UserError
from ..progress import SILENT
from ..targets import default_target
from .cache import OutdirLock, Store
from .executors import EXECUTORS, run_local, run_ray
from .jobs import Task, WithRecords, deployed, job_failed, plan
from .selection import XML_DIR, Selection, is_batch_file_name, select, write_outputs
from .sku import Sku, load_sku

__all__ = ["run_batch", "dry_run", "BatchResult", "load_sku", "plan", "select", "EXECUTORS"]


@dataclass
class BatchResult:
    sku: Sku
    selection: Selection  # the first target's
    outdir: Path  # where the first target's files are
    computed: int  # tasks run this time
    cached: int  # tasks entirely answered by the cache
    failed: int  # tasks with at least one failed result
    wall_s: float
    targets: dict = None  # target name -> (Selection, its output directory), in the SKU's order


class Progress:
    """Jobs done / running / failed, elapsed time and an estimate of what is left, as lines on stderr."""

    def __init__(self, total: int, workers: int, report, *, every_s: float = 15.0):
        self.total, self.workers, self.report, self.every_s = total, workers, report, every_s
        self.done = self.failed = 0
        self.durations = []
        self.running = {}  # task key -> start
        self.start = self.last = time.monotonic()

    def started(self, task: Task) -> None:
        self.running[task.key] = time.monotonic()
        self.report(f"start {task.label} ({task.kind}, {task.collective}, {task.nodes} node(s))")

    def finished(self, task: Task, seconds: float, *, failed: bool) -> None:
        self.running.pop(task.key, None)
        self.done += 1
        self.failed += failed
        self.durations.append(seconds)
        self.report(f"{'FAILED' if failed else 'done'} {task.label} in {seconds:.1f} s; {self.line()}")

    def tick(self) -> None:
        if time.monotonic() - self.last >= self.every_s:
            self.report(self.line())

    def line(self) -> str:
        self.last = now = time.monotonic()
        left = self.total - self.done
        eta = ""
        if self.durations and left:
            # a running job has taken at least its elapsed time: counting it keeps a stuck estimate honest
            samples = self.durations + [now - t for t in self.running.values()]
            per = sum(samples) / len(samples)
            eta = f", ~{_hms(per * left / max(1, min(self.workers, left)))} left"
        return (f"jobs {self.done}/{self.total} done, {len(self.running)} running, {self.failed} failed; "
                f"elapsed {_hms(now - self.start)}{eta}")


def _hms(s: float) -> str:
    s = int(round(s))
    return f"{s // 3600}h{s % 3600 // 60:02d}m" if s >= 3600 else f"{s // 60}m{s % 60:02d}s"


def _reusable(record, sku: Sku, retry_failed: bool) -> bool:
    if record is None:
        return False
    if record.get("status") == "ok":
        return True
    if retry_failed:
        return False
    # a timeout is retried when the limit has grown since; any other failure is a result like any other
    return record.get("timeout_s") is None or record["timeout_s"] >= sku.job_timeout_s


def _prepare(tasks: list, store: Store, sku: Sku, retry_failed: bool) -> tuple:
    """Mark each task's cached results; return (tasks with work left, keys answered by the cache)."""
    todo, cached = [], set()
    for task in tasks:
        records = {k: store.get(k) for k in task.keys()}
        task.done = {k for k, r in records.items() if _reusable(r, sku, retry_failed)}
        cached |= task.done
        if len(task.done) == len(records):
            continue
        # hand the worker the cached inputs of what it must compute, so it never reads the store
        if task.kind == "synthesis" and task.key in task.done:
            task.cached[task.key] = records[task.key]
        for p in task.programs:
            if p.key in task.done and p.sim_key not in task.done:
                task.cached[p.key] = records[p.key]
        todo.append(task)
    return todo, cached


def _outdir(sku: Sku, outdir) -> Path:
    from ..fileio import check_output_dir

    return check_output_dir(outdir or f"batch-{sku.name}")


def _target_dirs(sku: Sku, outdir: Path) -> dict:
    """target name -> the directory its outputs go to: the topology's own runtime alone writes into OUTDIR
    itself, several targets a directory each."""
    if sku.targets == (default_target(sku.spec),):
        return {sku.targets[0]: outdir}
    return {t: outdir / t for t in sku.targets}


def _refuse_foreign_files(dirs) -> None:
    """The batch replaces each msccl-algorithms/ whole: refuse, before any work, one that holds what a batch
    does not write (a user's own program would be deleted with it)."""
    for d in dirs:
        algos = d / XML_DIR
        if not algos.is_dir():
            continue
        foreign = sorted(p.name for p in algos.iterdir() if not (p.is_file() and is_batch_file_name(p.name)))
        if foreign:
            more = f" (and {len(foreign) - 1} more)" if len(foreign) > 1 else ""
            raise UserError(f"holds {foreign[0]!r}{more}, which no batch writes: the batch replaces this directory "
                            f"whole and would delete it; move it out (a batch's files are named "
                            f"<collective>-<ranks>r-<window>-<min>-<max>-<winner>.xml)", path=str(algos))


def _report_stale_target_dirs(sku: Sku, outdir: Path, dirs: dict, report) -> None:
    """Outputs an earlier run wrote for a target this SKU no longer lists (or in the other layout) stay as
    they were, not deleted (a job may read them): say so, so that nobody takes them for this run's."""
    from ..targets import TARGETS

    current = set(dirs.values())
    for d in [outdir] + [outdir / t for t in TARGETS]:
        if d not in current and (d / "selection.json").is_file():
            report(f"note: {d / XML_DIR} is left from an earlier run (targets it no longer lists) and was not "
                   f"updated; delete it when no job reads it")


def dry_run(sku_path, outdir=None, *, retry_failed: bool = False) -> list:
    """[(task, "cached" | "cached failure" | "partly cached" | "to run")] without running or writing anything
    ("cached failure": a job the cache holds as failed, `jobs.job_failed`; --retry-failed runs it again)."""
    sku = load_sku(sku_path)
    outdir = _outdir(sku, outdir)
    _refuse_foreign_files(_target_dirs(sku, outdir).values())
    store = Store(outdir / "cache")
    tasks = plan(sku)
    todo, _ = _prepare(tasks, store, sku, retry_failed)
    pending = {id(t) for t in todo}

    def state(t) -> str:
        if not t.done:
            return "to run"
        if id(t) in pending:
            return "partly cached"
        return "cached failure" if job_failed(t, store.get) else "cached"

    return [(t, state(t)) for t in tasks]


def run_batch(sku_path, outdir=None, *, workers: int | None = None, executor: str = "local",
              ray_address: str | None = None, retry_failed: bool = False, report=SILENT,
              plots: bool = True, prune: bool = False) -> BatchResult:
    t0 = time.monotonic()
    sku = load_sku(sku_path)
    if executor not in EXECUTORS:
        raise UserError(f"unknown executor {executor!r}; expected one of {', '.join(EXECUTORS)}", where="--executor")
    if workers is not None and workers < 1:
        raise UserError(f"must be at least 1, got {workers}", where="--workers")
    workers = workers or max(1, (os.cpu_count() or 1) // max(1, sku.threads))
    outdir = _outdir(sku, outdir)
    dirs = _target_dirs(sku, outdir)
    _refuse_foreign_files(dirs.values())
    tasks = plan(sku)
    with OutdirLock(outdir):
        store = Store(outdir / "cache")
        store.remove_temporaries()
        todo, cached_keys = _prepare(tasks, store, sku, retry_failed)
        report(f"{sku.name}: {len(tasks)} jobs ({sum(t.kind == 'synthesis' for t in tasks)} syntheses), "
               f"{len(tasks) - len(todo)} answered by the cache, {len(todo)} to run on {workers} {executor} worker(s)")
        progress = Progress(len(todo), workers, report)
        if executor == "local":
            # the local workers share this machine's memory: each synthesis is refused past its share
            # (`taccl.budget`); Ray's workers may be other machines, each checks against its own
            memory = machine_memory_bytes()
            for task in todo:
                task.max_memory_bytes = memory // workers if memory else None
                task.max_memory_source = f"this machine's memory shared by {workers} worker(s) (--workers)"
        if todo:
            run = run_ray if executor == "ray" else run_local
            kw = {"address": ray_address} if executor == "ray" else {}
            run(todo, store, workers=workers, timeout_s=sku.job_timeout_s, progress=progress, **kw)
        from .report import write_report

        targets = {}
        for target, target_dir in dirs.items():
            report(f"{target}: selecting the fastest program per size and writing the XML programs")
            # what a previous run deployed competes again, so a rerun never makes a window slower
            incumbents, records = deployed(sku, target_dir, tasks, store, target)
            view = WithRecords(store, records)
            selection = select(sku, tasks, view, cached_keys=cached_keys, target=target, deployed=incumbents)
            write_outputs(selection, target_dir, view, emit_baselines=sku.emit_baselines)
            write_report(selection, target_dir, sku, plots=plots, wall_s=time.monotonic() - t0)
            targets[target] = (selection, target_dir)
        selection, target_dir = next(iter(targets.values()))
        _report_stale_target_dirs(sku, outdir, dirs, report)
        if prune:
            n = store.prune({k for t in tasks for k in t.keys()})
            report(f"pruned {n} cache record(s) this SKU no longer uses")
    failed = sum(1 for j in selection.jobs if j.status != "ok")
    return BatchResult(sku=sku, selection=selection, outdir=target_dir, computed=len(todo),
                       cached=len(tasks) - len(todo), failed=failed, wall_s=time.monotonic() - t0, targets=targets)
