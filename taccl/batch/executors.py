"""Where batch tasks run: local worker processes (default) or a Ray cluster.

Both run `jobs.execute` on each task, at most `workers` at a time, stop a task that exceeds the job
timeout, and leave a record for every key of every task: the result, or a failure naming the reason
(solver error, timeout, crashed worker). One task failing never stops the others.

- local: one forked process per task, which writes each result to the store the moment it exists (so a
  killed batch keeps everything finished, even inside a task). Children die with the batch (Linux
  PR_SET_PDEATHSIG) instead of computing on as orphans.
- ray: `ray.init(address)` (a running cluster; `RAY_ADDRESS` is honoured) or a local Ray instance with
  `workers` CPUs; each task returns its records to the driver, which stores them. taccl must be installed
  on every node of the cluster.
"""
from __future__ import annotations

import ctypes
import multiprocessing
import os
import signal
import time
from multiprocessing.connection import wait

from ..errors import UserError
from .cache import Store
from .jobs import Task, execute, failure

EXECUTORS = ("local", "ray")


def run_task(task: Task, emit) -> None:
    """`execute`, plus a failure record for every key left without one if something escapes it."""
    emitted = set()

    def put(record):
        emit(record)
        emitted.add(record["key"])

    try:
        execute(task, put)
    except Exception as exc:  # an error outside one result (the topology vanished, say)
        for key in task.keys():
            if key not in emitted and key not in task.done:
                put(failure(key, "task", f"{type(exc).__name__}: {exc}"))


def complete(task: Task, store: Store, reason: str, **extra) -> int:
    """Record `reason` for every key of `task` that has no result yet; return how many."""
    n = 0
    for key in task.keys():
        if key not in task.done and not store.has(key):
            store.put(failure(key, "task", reason, label=task.label, **extra))
            n += 1
    return n


# ------------------------------------------------------------------------------------------------------
def _die_with_parent() -> None:
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass  # not Linux: orphans finish their task and store it, which is harmless


def _child(task: Task, root: str) -> None:
    _die_with_parent()
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle
    store = Store(root)
    run_task(task, store.put)


def run_local(tasks: list, store: Store, *, workers: int, timeout_s: float, progress) -> None:
    ctx = multiprocessing.get_context("fork" if "fork" in multiprocessing.get_all_start_methods() else "spawn")
    pending = list(reversed(tasks))
    running = {}  # sentinel -> (process, task, start)
    try:
        while pending or running:
            while pending and len(running) < workers:
                task = pending.pop()
                proc = ctx.Process(target=_child, args=(task, str(store.root)), daemon=True)
                proc.start()
                running[proc.sentinel] = (proc, task, time.monotonic())
                progress.started(task)
            ready = wait(list(running), timeout=1.0)
            now = time.monotonic()
            for sentinel in list(running):
                proc, task, start = running[sentinel]
                if sentinel in ready:
                    proc.join()
                    reason, extra = f"worker died ({_describe_exit(proc.exitcode)})", {}
                elif now - start > timeout_s:
                    _stop(proc)
                    reason, extra = f"timed out after {timeout_s:g} s (job_timeout_s)", {"timeout_s": timeout_s}
                else:
                    continue
                del running[sentinel]
                failed = complete(task, store, reason, **extra)
                progress.finished(task, now - start, failed=failed > 0 or _any_failed(task, store))
            progress.tick()
    finally:
        for proc, _, _ in running.values():
            _stop(proc)


def _describe_exit(code) -> str:
    if code is not None and code < 0:
        try:
            return f"signal {signal.Signals(-code).name}"
        except ValueError:
            return f"signal {-code}"
    return f"exit code {code}"


def _stop(proc) -> None:
    proc.terminate()
    proc.join(5)
    if proc.is_alive():
        proc.kill()
        proc.join()


def _any_failed(task: Task, store: Store) -> bool:
    for key in task.keys():
        record = store.get(key)
        if record is not None and record.get("status") != "ok":
            return True
    return False


# ------------------------------------------------------------------------------------------------------
def _collect(task: Task) -> list:
    records = []
    run_task(task, records.append)
    return records


def run_ray(tasks: list, store: Store, *, workers: int, timeout_s: float, progress, address: str | None = None) -> None:
    try:
        import ray
    except ImportError:
        raise UserError("--executor ray needs Ray: pip install 'taccl[ray]' (or pip install ray)") from None
    import logging

    address = address or os.environ.get("RAY_ADDRESS")
    started_here = not ray.is_initialized()
    if started_here:
        kw = {"address": address} if address else {"num_cpus": workers}
        ray.init(include_dashboard=False, log_to_driver=False, logging_level=logging.WARNING, **kw)
    remote = ray.remote(num_cpus=1, max_retries=0)(_collect)
    pending = list(reversed(tasks))
    running = {}  # ref -> (task, start)
    try:
        while pending or running:
            while pending and len(running) < workers:
                task = pending.pop()
                running[remote.remote(task)] = (task, time.monotonic())
                progress.started(task)
            ready, _ = ray.wait(list(running), num_returns=1, timeout=1.0)
            now = time.monotonic()
            for ref in list(running):
                task, start = running[ref]
                extra = {}
                if ref in ready:
                    try:
                        for record in ray.get(ref):
                            store.put(record)
                        reason = "no result returned"
                    except Exception as exc:  # the Ray worker crashed or was lost
                        reason = f"Ray task failed: {type(exc).__name__}: {str(exc).splitlines()[0]}"
                elif now - start > timeout_s:
                    ray.cancel(ref, force=True)
                    reason, extra = f"timed out after {timeout_s:g} s (job_timeout_s)", {"timeout_s": timeout_s}
                else:
                    continue
                del running[ref]
                failed = complete(task, store, reason, **extra)
                progress.finished(task, now - start, failed=failed > 0 or _any_failed(task, store))
            progress.tick()
    finally:
        for ref in running:
            ray.cancel(ref, force=True)
        if started_here:
            ray.shutdown()
