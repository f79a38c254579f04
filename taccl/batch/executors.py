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
from .jobs import Task, execute, failure, job_failed

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


def complete(task: Task, store: Store, reason: str, **extra) -> bool:
    """Record `reason` for every key of `task` that has no result yet; return whether the job failed
    (`jobs.job_failed`: no program of it can compete)."""
    for key in task.keys():
        if key not in task.done and store.get(key) is None:
            store.put(failure(key, "task", reason, label=task.label, **extra))
    return job_failed(task, store.get)


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


TIMEOUT_REASON = "timed out after {:g} s (job_timeout_s)"


def _drive(pool, tasks: list, store: Store, *, workers: int, timeout_s: float, progress) -> None:
    """The scheduling loop both executors share: at most `workers` tasks in flight, each stopped at its timeout.

    `pool` starts a task (`submit(task) -> handle`), waits (`wait(handles, seconds) -> ready handles`),
    collects a finished one (`collect(handle) -> reason for any result it lacks`) and stops one (`stop`).
    """
    pending = list(reversed(tasks))
    running = {}  # handle -> (task, start)
    try:
        while pending or running:
            while pending and len(running) < workers:
                task = pending.pop()
                running[pool.submit(task)] = (task, time.monotonic())
                progress.started(task)
            # wake for the progress tick once a second, or sooner when a task reaches its timeout then
            first_deadline = min(start for _, start in running.values()) + timeout_s
            ready = pool.wait(list(running), min(1.0, max(0.0, first_deadline - time.monotonic())))
            now = time.monotonic()
            for handle in list(running):
                task, start = running[handle]
                if handle in ready:
                    reason, extra = pool.collect(handle), {}
                elif now - start >= timeout_s:
                    pool.stop(handle)
                    reason, extra = TIMEOUT_REASON.format(timeout_s), {"timeout_s": timeout_s}
                else:
                    continue
                del running[handle]
                progress.finished(task, now - start, failed=complete(task, store, reason, **extra))
            progress.tick()
    finally:
        for handle in running:
            pool.stop(handle)


class _Processes:
    def __init__(self, store: Store):
        self.root = str(store.root)
        self.ctx = multiprocessing.get_context("fork" if "fork" in multiprocessing.get_all_start_methods() else "spawn")
        self.procs = {}  # sentinel -> process

    def submit(self, task: Task):
        proc = self.ctx.Process(target=_child, args=(task, self.root), daemon=True)
        proc.start()
        self.procs[proc.sentinel] = proc
        return proc.sentinel

    def wait(self, handles: list, seconds: float) -> list:
        return wait(handles, timeout=seconds)

    def collect(self, handle) -> str:
        proc = self.procs.pop(handle)
        proc.join()
        return f"worker died ({_describe_exit(proc.exitcode)})"  # the child stored its results itself

    def stop(self, handle) -> None:
        proc = self.procs.pop(handle, None)
        if proc is not None:
            _stop(proc)


def run_local(tasks: list, store: Store, *, workers: int, timeout_s: float, progress) -> None:
    _drive(_Processes(store), tasks, store, workers=workers, timeout_s=timeout_s, progress=progress)


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


# ------------------------------------------------------------------------------------------------------
def _collect(task: Task) -> list:
    records = []
    run_task(task, records.append)
    return records


class _RayTasks:
    def __init__(self, ray, store: Store):
        self.ray, self.store = ray, store
        self.remote = ray.remote(num_cpus=1, max_retries=0)(_collect)

    def submit(self, task: Task):
        return self.remote.remote(task)

    def wait(self, handles: list, seconds: float) -> list:
        return self.ray.wait(handles, num_returns=1, timeout=seconds)[0]

    def collect(self, handle) -> str:
        try:
            for record in self.ray.get(handle):
                self.store.put(record)
        except Exception as exc:  # the Ray worker crashed or its node was lost
            return f"Ray task failed: {type(exc).__name__}: {str(exc).splitlines()[0]}"
        return "no result returned"

    def stop(self, handle) -> None:
        self.ray.cancel(handle, force=True)


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
    try:
        _drive(_RayTasks(ray, store), tasks, store, workers=workers, timeout_s=timeout_s, progress=progress)
    finally:
        if started_here:
            ray.shutdown()
