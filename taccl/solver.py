"""The solver layer: MILPs written once, solved by HiGHS (default), Gurobi or CBC.

A synthesizer stage builds a `Model` (columns and rows are integers in creation order, stored in flat
arrays so that building stays cheap next to solving), then calls `solve(model, solver, options)` and
gets a `Result` whose `status` is one of a small shared vocabulary:

==============  ==========================================================================
optimal         proven optimal within ``SolveOptions.mip_rel_gap``
feasible        stopped by a limit with an incumbent (``values``, ``objective``, ``gap``)
no_solution     stopped by a limit before any solution was found
infeasible      proven infeasible
unbounded       proven unbounded
error           the backend failed; ``message`` says how
==============  ==========================================================================

The backends follow cvxpy's registry pattern: each is a `MilpBackend` subclass that declares what it
needs and can do, maps its native statuses onto the vocabulary above, imports its module only inside
its methods, and reports availability without importing (`available_solvers`). The registry order is
the order of preference.

Examples
--------
>>> m = Model("tiny")
>>> x = m.add_var(0, 4, obj=-1.0)
>>> y = m.add_var(0, 4, obj=-2.0, integer=True)
>>> _ = m.add_constr([x, y], [1.0, 1.0], hi=5.0)
>>> r = solve(m)
>>> r.status, round(r.objective, 6), r.values.round(6).tolist()
('optimal', -9.0, [1.0, 4.0])
"""
from __future__ import annotations

import importlib.util
import math
import os
import re
import shutil
import signal
import sys
import tempfile
import threading
import time
import warnings
from array import array
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Callable, ClassVar, Optional, Sequence

import numpy as np

from taccl.errors import SolverError, UserError

__all__ = [
    "INF",
    "STATUSES",
    "SOLVERS",
    "MAX_THREADS",
    "Model",
    "SolveOptions",
    "Result",
    "MilpBackend",
    "solve",
    "available_solvers",
    "solver_version",
    "highs_version",
]

INF = float("inf")

#: An incumbent better than the best one by less than this fraction does not reset `SolveOptions.stall_s`
#: (solvers report numerically equal solutions as improvements).
STALL_REL_IMPROVEMENT = 1e-4

#: The shared status vocabulary of `Result.status`.
STATUSES = ("optimal", "feasible", "no_solution", "infeasible", "unbounded", "error")

_CONTINUOUS, _INTEGER, _BINARY = 0, 1, 2


# --------------------------------------------------------------------------------------------------
# The model
# --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Arrays:
    """A model frozen into numpy arrays: what every backend reads (matrix in CSC or CSR, duplicates summed)."""

    col_lower: np.ndarray
    col_upper: np.ndarray
    col_cost: np.ndarray
    kind: np.ndarray  # int8: 0 continuous, 1 integer, 2 binary
    row_lower: np.ndarray
    row_upper: np.ndarray
    start: np.ndarray  # int32, length (num_cols + 1) for CSC, (num_rows + 1) for CSR
    index: np.ndarray  # int32
    value: np.ndarray  # float64

    @property
    def is_mip(self) -> bool:
        return bool(np.any(self.kind != _CONTINUOUS))


class Model:
    """A MILP in a solver-neutral, array-based form. Columns and rows are integers in creation order.

    The objective is always minimised. Constraints are ranged rows ``lo <= sum(coefs[i] * x[cols[i]]) <= hi``
    (use ``-INF``/``INF`` for a missing side); a column listed twice in one row has its coefficients summed.
    Everything is appended to flat arrays; nothing is handed to a solver until `solve`.
    """

    def __init__(self, name: str):
        self.name = name
        self._lb = array("d")
        self._ub = array("d")
        self._obj = array("d")
        self._kind = array("b")
        self._col_names: dict[int, str] = {}
        self._row_lo = array("d")
        self._row_hi = array("d")
        self._row_start = array("q", [0])
        self._idx = array("q")
        self._val = array("d")
        self._row_names: dict[int, str] = {}
        self._num_binaries = 0
        self._start: Optional[np.ndarray] = None
        self._matrix_cache: dict[str, tuple] = {}

    # -- columns -----------------------------------------------------------------------------------

    def add_var(
        self,
        lb: float = 0.0,
        ub: float = INF,
        *,
        obj: float = 0.0,
        binary: bool = False,
        integer: bool = False,
        name: Optional[str] = None,
    ) -> int:
        """Add one column and return its index. A binary column has its bounds clipped to [0, 1]."""
        lb, ub, obj = float(lb), float(ub), float(obj)
        if math.isnan(lb) or math.isnan(ub) or math.isnan(obj):
            raise ValueError(f"add_var: NaN in lb={lb}, ub={ub} or obj={obj}")
        col = len(self._lb)
        if binary:
            lb, ub = max(lb, 0.0), min(ub, 1.0)
            self._num_binaries += 1
        self._lb.append(lb)
        self._ub.append(ub)
        self._obj.append(obj)
        self._kind.append(_BINARY if binary else (_INTEGER if integer else _CONTINUOUS))
        if name is not None:
            self._col_names[col] = name
        return col

    def add_vars(
        self,
        count: int,
        lb: float = 0.0,
        ub: float = INF,
        *,
        obj: float = 0.0,
        binary: bool = False,
    ) -> range:
        """Add `count` unnamed columns sharing bounds, cost and type; return their index range."""
        count = int(count)
        if count < 0:
            raise ValueError(f"add_vars: count must be >= 0, got {count}")
        lb, ub, obj = float(lb), float(ub), float(obj)
        if math.isnan(lb) or math.isnan(ub) or math.isnan(obj):
            raise ValueError(f"add_vars: NaN in lb={lb}, ub={ub} or obj={obj}")
        if binary:
            lb, ub = max(lb, 0.0), min(ub, 1.0)
            self._num_binaries += count
        first = len(self._lb)
        self._lb.extend(array("d", [lb]) * count)
        self._ub.extend(array("d", [ub]) * count)
        self._obj.extend(array("d", [obj]) * count)
        self._kind.extend(array("b", [_BINARY if binary else _CONTINUOUS]) * count)
        return range(first, first + count)

    def set_obj(self, col: int, coef: float) -> None:
        """Set the objective coefficient of one column (the objective is always minimised)."""
        self._obj[col] = float(coef)

    def set_bounds(self, col: int, lb: float, ub: float) -> None:
        """Change one column's bounds (for a re-solve of the same model)."""
        self._lb[col] = float(lb)
        self._ub[col] = float(ub)

    def set_start(self, values: Sequence[float]) -> None:
        """Give a MIP start: one value per column, NaN where unknown (a partial start).

        Backends that cannot use a start ignore it; a start that turns out infeasible is ignored too.
        """
        arr = np.array(values, dtype=np.float64).ravel()
        if arr.shape[0] != len(self._lb):
            raise ValueError(f"set_start: got {arr.shape[0]} values, the model has {len(self._lb)} columns")
        self._start = arr

    # -- rows --------------------------------------------------------------------------------------

    def add_constr(self, cols, coefs, lo: float = -INF, hi: float = INF, name: Optional[str] = None) -> int:
        """Add the row ``lo <= sum(coefs[i] * x[cols[i]]) <= hi`` and return its index.

        `cols` and `coefs` are equal-length sequences (lists, ranges, numpy arrays); `coefs` may also be
        one number used for every column. Duplicate columns are summed when the model is solved.
        """
        n = len(cols)
        if isinstance(coefs, (int, float)):
            coefs = array("d", [float(coefs)]) * n
        elif len(coefs) != n:
            raise ValueError(f"add_constr: {n} columns but {len(coefs)} coefficients")
        row = len(self._row_lo)
        if isinstance(cols, np.ndarray):
            self._idx.frombytes(np.ascontiguousarray(cols, dtype=np.int64).tobytes())
        else:
            self._idx.extend(cols)
        if isinstance(coefs, np.ndarray):
            self._val.frombytes(np.ascontiguousarray(coefs, dtype=np.float64).tobytes())
        else:
            self._val.extend(coefs)
        self._row_start.append(len(self._idx))
        self._row_lo.append(float(lo))
        self._row_hi.append(float(hi))
        if name is not None:
            self._row_names[row] = name
        return row

    # -- sizes -------------------------------------------------------------------------------------

    @property
    def num_vars(self) -> int:
        return len(self._lb)

    @property
    def num_constrs(self) -> int:
        return len(self._row_lo)

    @property
    def num_binaries(self) -> int:
        return self._num_binaries

    @property
    def num_nonzeros(self) -> int:
        """Coefficients as added (before duplicates are summed)."""
        return len(self._idx)

    @property
    def num_integers(self) -> int:
        """Integer columns, binaries included."""
        return int(np.count_nonzero(np.frombuffer(self._kind, dtype=np.int8))) if len(self._kind) else 0

    def stats(self) -> dict:
        return {
            "variables": self.num_vars,
            "constraints": self.num_constrs,
            "binaries": self.num_binaries,
            "nonzeros": self.num_nonzeros,
        }

    def col_name(self, col: int) -> str:
        return self._col_names.get(col, f"x{col}")

    def row_name(self, row: int) -> str:
        return self._row_names.get(row, f"r{row}")

    def __repr__(self) -> str:
        s = self.stats()
        return (f"Model({self.name!r}: {s['variables']} variables ({s['binaries']} binary), "
                f"{s['constraints']} constraints, {s['nonzeros']} nonzeros)")

    # -- compilation to arrays ---------------------------------------------------------------------

    def _arrays(self, layout: str = "csc") -> _Arrays:
        """Freeze the model into numpy arrays, matrix in `layout` ("csc" or "csr"), duplicates summed.

        The matrix is cached until the model grows; bounds and costs are read afresh each time.
        """
        n, m = self.num_vars, self.num_constrs
        col_lower = np.frombuffer(self._lb, dtype=np.float64).copy() if n else np.zeros(0)
        col_upper = np.frombuffer(self._ub, dtype=np.float64).copy() if n else np.zeros(0)
        col_cost = np.frombuffer(self._obj, dtype=np.float64).copy() if n else np.zeros(0)
        kind = np.frombuffer(self._kind, dtype=np.int8).copy() if n else np.zeros(0, dtype=np.int8)
        row_lower = np.frombuffer(self._row_lo, dtype=np.float64).copy() if m else np.zeros(0)
        row_upper = np.frombuffer(self._row_hi, dtype=np.float64).copy() if m else np.zeros(0)
        if np.isnan(row_lower).any() or np.isnan(row_upper).any():
            bad = int(np.flatnonzero(np.isnan(row_lower) | np.isnan(row_upper))[0])
            raise ValueError(f"row {bad} ({self.row_name(bad)}) has a NaN bound")
        key = (layout, n, m, len(self._idx))
        cached = self._matrix_cache.get(layout)
        if cached is None or cached[0] != key:
            self._matrix_cache[layout] = (key, self._compress(layout))
        start, index, value = self._matrix_cache[layout][1]
        return _Arrays(col_lower, col_upper, col_cost, kind, row_lower, row_upper, start, index, value)

    def _compress(self, layout: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        n, m, nnz = self.num_vars, self.num_constrs, len(self._idx)
        major_len = n if layout == "csc" else m
        if nnz == 0:
            return np.zeros(major_len + 1, dtype=np.int32), np.zeros(0, dtype=np.int32), np.zeros(0)
        cols = np.frombuffer(self._idx, dtype=np.int64)
        vals = np.frombuffer(self._val, dtype=np.float64)
        row_start = np.frombuffer(self._row_start, dtype=np.int64)
        rows = np.repeat(np.arange(m, dtype=np.int64), np.diff(row_start))
        lo, hi = int(cols.min()), int(cols.max())
        if lo < 0 or hi >= n:
            pos = int(np.flatnonzero((cols < 0) | (cols >= n))[0])
            r = int(rows[pos])
            raise ValueError(f"row {r} ({self.row_name(r)}) refers to column {int(cols[pos])}; "
                             f"the model has {n} columns")
        if not np.isfinite(vals).all():
            pos = int(np.flatnonzero(~np.isfinite(vals))[0])
            r = int(rows[pos])
            raise ValueError(f"row {r} ({self.row_name(r)}) has a non-finite coefficient {vals[pos]}")
        if layout == "csc":
            major, minor, minor_len = cols, rows, m
        else:
            major, minor, minor_len = rows, cols, n
        keys = major * max(minor_len, 1) + minor
        order = np.argsort(keys, kind="stable")
        keys = keys[order]
        vals = vals[order]
        # Sum duplicates (same row and column), then drop exact zeros.
        first = np.ones(keys.shape[0], dtype=bool)
        first[1:] = keys[1:] != keys[:-1]
        if not first.all():
            starts = np.flatnonzero(first)
            vals = np.add.reduceat(vals, starts)
            keys = keys[starts]
        keep = vals != 0.0
        if not keep.all():
            keys, vals = keys[keep], vals[keep]
        major = keys // max(minor_len, 1)
        minor = keys - major * max(minor_len, 1)
        start = np.zeros(major_len + 1, dtype=np.int64)
        np.cumsum(np.bincount(major, minlength=major_len), out=start[1:])
        if start[-1] > np.iinfo(np.int32).max:
            raise ValueError(f"{start[-1]} nonzeros: more than a 32-bit solver index can address")
        return start.astype(np.int32), minor.astype(np.int32), np.ascontiguousarray(vals)

    def write(self, path: str) -> None:
        """Write the model as MPS or LP (by the file's extension) through HiGHS, to solve it elsewhere."""
        h = _HighsBackend._load(self, SolveOptions())
        status = h.writeModel(str(path))
        import highspy

        if status == highspy.HighsStatus.kError:
            raise SolverError(f"HiGHS could not write the model to {path}")


# --------------------------------------------------------------------------------------------------
# Options and results
# --------------------------------------------------------------------------------------------------

# the most solver threads a sketch, a SKU or --threads may ask for (the schemas say it too): HiGHS starts
# them all, and 100000 hang the process
MAX_THREADS = 1024


@dataclass
class SolveOptions:
    """How to solve. Every field is passed to the backend explicitly, so results are reproducible."""

    time_limit_s: float = 60.0
    threads: int = 1
    seed: int = 0
    mip_rel_gap: float = 1e-4
    verbose: bool = False
    #: Called with ``{"time_s", "incumbent", "bound", "gap"}`` when the incumbent or the bound moves,
    #: where the backend offers callbacks (HiGHS, Gurobi). Values may be None when not known yet.
    on_progress: Optional[Callable[[dict], None]] = None
    #: Stop a MIP once its best solution has not improved (by more than `STALL_REL_IMPROVEMENT`) for this
    #: many seconds of the solver's own work (see `_Progress`); the solve then ends "feasible" with that
    #: solution. None: run to the time limit or gap. HiGHS and Gurobi only (CBC offers no callback to stop it).
    stall_s: Optional[float] = None
    #: Stop a MIP after this many seconds of the solver's own work (the stall's clock) with its best solution
    #: ("feasible"): the budget of a solve of the synthesizer's own (routing's arrival-time solve), which a
    #: loaded machine must not cut short, or the program written would depend on the load. `time_limit_s`
    #: still applies. HiGHS and Gurobi; CBC, which offers no callback, takes it as a wall-clock limit.
    work_limit_s: Optional[float] = None


@dataclass
class Result:
    """The answer of `solve`; `status` is one of `STATUSES`."""

    status: str
    values: Optional[np.ndarray]
    objective: Optional[float]
    bound: Optional[float]
    gap: Optional[float]
    time_s: float
    solver: str
    message: str = ""

    @property
    def has_solution(self) -> bool:
        return self.values is not None


def _finite(x) -> Optional[float]:
    if x is None:
        return None
    x = float(x)
    return x if math.isfinite(x) else None


def _rel_gap(objective: Optional[float], bound: Optional[float]) -> Optional[float]:
    """|objective - bound| / max(|objective|, 1e-10), the definition Gurobi and HiGHS share."""
    if objective is None or bound is None:
        return None
    return abs(objective - bound) / max(abs(objective), 1e-10)


def _make_result(status: str, solver: str, t0: float, *, values=None, objective=None, bound=None,
                 is_mip: bool = True, message: str = "") -> Result:
    """Assemble a Result with the shared conventions: no values without a solution, gap 0 when optimal."""
    if status not in ("optimal", "feasible"):
        values, objective = None, None
        if status != "no_solution":
            bound = None
    objective, bound = _finite(objective), _finite(bound)
    if status == "optimal":
        if not is_mip or bound is None:
            bound = objective
        gap: Optional[float] = 0.0
    else:
        gap = _rel_gap(objective, bound)
    return Result(status, values, objective, bound, gap, time.perf_counter() - t0, solver, message)


def _stop_message(options: SolveOptions, progress: "_Progress") -> str:
    """Why `progress` stopped a solve that ended with a solution ("" when it did not stop it)."""
    if progress.stalled:
        return f"stopped: the best solution did not improve for {options.stall_s:g} s of solver work (stall limit)"
    if progress.out_of_work:
        return f"stopped after {options.work_limit_s:g} s of solver work (work limit)"
    return ""


def _time_left(options: SolveOptions, t0: float) -> float:
    """The solver's share of `options.time_limit_s` once model building (since `t0`) is paid for.

    The limit covers the whole `solve` call; a solver always gets at least a tenth of it.
    """
    limit = float(options.time_limit_s)
    return max(0.1 * limit, limit - (time.perf_counter() - t0))


class _Progress:
    """Watches a backend's progress: relays it to `SolveOptions.on_progress` when something changed, and
    says when the solve should stop (the user's callback raised, the incumbent stalled for `stall_s`, or the
    solver worked `work_limit_s`).

    The stall is counted on a clock of the solver's work, not the wall clock, so that a loaded machine (a
    batch's other workers) does not stop a solve earlier and write another program: Gurobi's deterministic
    work units where the backend passes them (about a second each), else the CPU time of the thread the
    callbacks run on, which is the thread driving the search (HiGHS calls back on the thread that called
    `run`, whatever its `threads`). The time limit stays wall-clock: it is the user's budget.

    An exception raised by the user's callback is kept, the solve is asked to stop, and the exception is
    raised again once the backend has returned.
    """

    def __init__(self, options: SolveOptions):
        self.fn, self.stall_s, self.work_limit_s = options.on_progress, options.stall_s, options.work_limit_s
        self.thread_s0 = time.thread_time()  # the thread clock at the start (Gurobi's work units start at 0)
        self.last: Optional[tuple] = None
        self.error: Optional[BaseException] = None
        self.best: Optional[float] = None  # the best incumbent, and the work clock when it last improved
        self.best_work_s = 0.0
        self.stalled = False
        self.out_of_work = False
        self.interrupted = False  # Ctrl-C during the solve (see `ctrl_c_stops`)

    @property
    def wanted(self) -> bool:
        """Whether the backend needs to report progress at all."""
        return self.fn is not None or self.stall_s is not None or self.work_limit_s is not None

    @property
    def should_stop(self) -> bool:
        return self.error is not None or self.stalled or self.out_of_work or self.interrupted

    @contextmanager
    def ctrl_c_stops(self):
        """While a backend runs in native code, Python raises no KeyboardInterrupt until it returns (a MILP
        at its time limit: minutes). Inside this, Ctrl-C only sets `interrupted`, which the backend's
        interrupt callback reads to stop at its next check; `reraise` then raises the KeyboardInterrupt."""
        if threading.current_thread() is not threading.main_thread() or \
                signal.getsignal(signal.SIGINT) is not signal.default_int_handler:
            yield  # only the main thread may take signals, and a caller's own handler stays in charge
            return

        def note(signum, frame):
            self.interrupted = True

        previous = signal.signal(signal.SIGINT, note)
        try:
            yield
        finally:
            signal.signal(signal.SIGINT, previous)

    def __call__(self, time_s, incumbent, bound, work_s: Optional[float] = None) -> None:
        """Progress at `time_s` (wall clock, reported) and `work_s` (the stall's clock since the start;
        default: this thread's CPU time)."""
        incumbent, bound = _finite(incumbent), _finite(bound)
        work_s = time.thread_time() - self.thread_s0 if work_s is None else float(work_s)
        if self.work_limit_s is not None and work_s >= self.work_limit_s:
            self.out_of_work = True
        if incumbent is not None and (self.best is None or
                                      incumbent < self.best - STALL_REL_IMPROVEMENT * max(abs(self.best), 1e-10)):
            self.best, self.best_work_s = incumbent, work_s
        if self.stall_s is not None and self.best is not None and work_s - self.best_work_s >= self.stall_s:
            self.stalled = True
        if self.fn is None or self.error is not None:
            return
        state = (incumbent, bound)
        if state == self.last:
            return
        self.last = state
        try:
            self.fn({"time_s": float(time_s), "incumbent": incumbent, "bound": bound,
                     "gap": _rel_gap(incumbent, bound)})
        except BaseException as exc:  # re-raised after the solve
            self.error = exc

    def reraise(self) -> None:
        if self.interrupted:
            raise KeyboardInterrupt
        if self.error is not None:
            raise self.error


# --------------------------------------------------------------------------------------------------
# Backends
# --------------------------------------------------------------------------------------------------


class MilpBackend:
    """One solver. Subclasses declare capabilities and implement `solve`; native modules load lazily."""

    NAME: ClassVar[str]
    REQUIRED_MODULES: ClassVar[tuple[str, ...]]
    INSTALL_HINT: ClassVar[str]
    MIP_CAPABLE: ClassVar[bool] = True
    USES_START: ClassVar[bool] = True
    HAS_PROGRESS: ClassVar[bool] = False

    @classmethod
    def unavailable_reason(cls) -> Optional[str]:
        """None when usable, else why not (checked without importing the module)."""
        for mod in cls.REQUIRED_MODULES:
            if importlib.util.find_spec(mod) is None:
                return f"Python module '{mod}' is not installed; {cls.INSTALL_HINT}"
        return None

    @classmethod
    def version(cls) -> Optional[str]:
        raise NotImplementedError

    def solve(self, model: Model, options: SolveOptions) -> Result:
        raise NotImplementedError


# -- HiGHS ------------------------------------------------------------------------------------------

_highs_scheduler_lock = threading.Lock()
_highs_scheduler_threads: Optional[int] = None


class _HighsBackend(MilpBackend):
    """HiGHS through highspy: the whole model is passed at once as a column-wise HighsLp."""

    NAME = "highs"
    REQUIRED_MODULES = ("highspy",)
    INSTALL_HINT = "install it with `pip install highspy` (it is a dependency of taccl)"
    HAS_PROGRESS = True

    @staticmethod
    def _new():
        """A `highspy.Highs` that has printed nothing: its constructor writes HiGHS's banner to the process's
        stdout (C level, before any option can turn output off), which would corrupt `--json` output."""
        import highspy

        sys.stdout.flush()
        saved = os.dup(1)
        try:
            with open(os.devnull, "wb") as null:
                os.dup2(null.fileno(), 1)
            h = highspy.Highs()
            h.setOptionValue("output_flag", False)
        finally:
            os.dup2(saved, 1)
            os.close(saved)
        return h

    @classmethod
    def version(cls) -> Optional[str]:
        import highspy

        h = cls._new()
        try:
            return f"{h.versionMajor()}.{h.versionMinor()}.{h.versionPatch()}"
        except AttributeError:  # pragma: no cover - very old highspy
            return str(getattr(highspy, "__version__", "unknown"))

    @staticmethod
    def _load(model: Model, options: SolveOptions, cost: Optional[np.ndarray] = None):
        import highspy

        a = model._arrays("csc")
        h = _HighsBackend._new()
        for key, value in (
            ("output_flag", bool(options.verbose)),
            ("threads", int(options.threads)),
            ("random_seed", int(options.seed)),
            ("time_limit", float(options.time_limit_s)),
            ("mip_rel_gap", float(options.mip_rel_gap)),
        ):
            h.setOptionValue(key, value)
        lp = highspy.HighsLp()
        lp.model_name_ = model.name
        lp.num_col_ = model.num_vars
        lp.num_row_ = model.num_constrs
        lp.col_cost_ = a.col_cost if cost is None else cost
        lp.col_lower_ = a.col_lower
        lp.col_upper_ = a.col_upper
        lp.row_lower_ = a.row_lower
        lp.row_upper_ = a.row_upper
        lp.a_matrix_.format_ = highspy.MatrixFormat.kColwise
        lp.a_matrix_.num_col_ = model.num_vars
        lp.a_matrix_.num_row_ = model.num_constrs
        lp.a_matrix_.start_ = a.start
        lp.a_matrix_.index_ = a.index
        lp.a_matrix_.value_ = a.value
        if a.is_mip:
            cont, integ = highspy.HighsVarType.kContinuous, highspy.HighsVarType.kInteger
            lp.integrality_ = [integ if k else cont for k in (a.kind != _CONTINUOUS).tolist()]
        status = h.passModel(lp)
        if status == highspy.HighsStatus.kError:
            raise SolverError(f"HiGHS rejected model '{model.name}' ({model!r})")
        return h

    @staticmethod
    def _use_threads(threads: int) -> None:
        # HiGHS keeps one global task scheduler per process, sized by the first run; resize it when the
        # requested thread count changes so that `threads` is honoured.
        global _highs_scheduler_threads
        import highspy

        with _highs_scheduler_lock:
            if _highs_scheduler_threads is not None and _highs_scheduler_threads != threads:
                reset = getattr(highspy.Highs, "resetGlobalScheduler", None)
                if reset is not None:
                    reset(True)
            _highs_scheduler_threads = threads

    def solve(self, model: Model, options: SolveOptions) -> Result:
        import highspy

        t0 = time.perf_counter()
        a = model._arrays("csc")
        is_mip = a.is_mip
        h = self._load(model, options)
        h.setOptionValue("time_limit", _time_left(options, t0))
        if is_mip and model._start is not None:
            self._set_start(h, model._start)
        progress = _Progress(options)
        self._subscribe(h, progress)
        self._use_threads(int(options.threads))
        with progress.ctrl_c_stops():
            run_status = h.run()
        progress.reraise()
        ms = h.getModelStatus()
        info = h.getInfo()
        M = highspy.HighsModelStatus
        has_sol = int(info.primal_solution_status) == 2  # kSolutionStatusFeasible
        objective = info.objective_function_value if has_sol else None
        bound = info.mip_dual_bound if is_mip else None
        values = np.array(h.getSolution().col_value, dtype=np.float64) if has_sol else None
        if ms == M.kOptimal:
            status = "optimal"
        elif ms == M.kModelEmpty:
            status, values = "optimal", np.zeros(0)
            objective = 0.0
        elif ms == M.kInfeasible:
            status = "infeasible"
        elif ms == M.kUnbounded:
            status = "unbounded"
        elif ms == M.kUnboundedOrInfeasible:
            status = self._infeasible_or_unbounded(model, options, t0)
        elif ms in (M.kTimeLimit, M.kIterationLimit, M.kSolutionLimit, M.kInterrupt, M.kObjectiveBound,
                    M.kObjectiveTarget, M.kMemoryLimit, M.kUnknown, getattr(M, "kHighsInterrupt", M.kInterrupt)):
            status = "feasible" if has_sol else "no_solution"
        else:
            return _make_result("error", self.NAME, t0,
                                message=f"HiGHS: {h.modelStatusToString(ms)} (run status {run_status})")
        message = "" if status == "optimal" else f"HiGHS: {h.modelStatusToString(ms)}"
        stopped = _stop_message(options, progress)
        if status == "feasible" and stopped:
            message = stopped
        if ms == M.kUnboundedOrInfeasible:
            message += f" (a zero-objective solve decided: {status})"
        return _make_result(status, self.NAME, t0, values=values, objective=objective, bound=bound,
                            is_mip=is_mip, message=message)

    def _infeasible_or_unbounded(self, model: Model, options: SolveOptions, t0: float) -> str:
        """Presolve said "infeasible or unbounded": decide by solving with a zero objective."""
        import highspy

        left = max(1.0, options.time_limit_s - (time.perf_counter() - t0))
        opts = SolveOptions(time_limit_s=left, threads=options.threads, seed=options.seed,
                            mip_rel_gap=options.mip_rel_gap, verbose=options.verbose)
        h = self._load(model, opts, cost=np.zeros(model.num_vars))
        h.run()
        ms = h.getModelStatus()
        if ms == highspy.HighsModelStatus.kInfeasible:
            return "infeasible"
        if ms == highspy.HighsModelStatus.kOptimal:
            return "unbounded"
        return "error"

    @staticmethod
    def _set_start(h, start: np.ndarray) -> None:
        known = np.flatnonzero(~np.isnan(start))
        if known.size == 0:
            return
        try:
            h.setSolution(int(known.size), known.astype(np.int32), start[known].astype(np.float64))
        except TypeError:  # older highspy: full solution only
            import highspy

            sol = highspy.HighsSolution()
            sol.col_value = np.nan_to_num(start, nan=0.0).tolist()
            h.setSolution(sol)

    @staticmethod
    def _subscribe(h, progress: _Progress) -> None:
        """Hook the MIP progress callbacks (when progress is wanted) and the interrupt checks of the MIP, simplex
        and interior-point solvers (so that Ctrl-C stops any of them) where this highspy has them; silently
        do nothing otherwise."""
        def stop_when_asked(e) -> None:
            if progress.should_stop:
                e.interrupt()

        def fire(e) -> None:
            d = e.data_out
            progress(d.running_time, d.mip_primal_bound, d.mip_dual_bound)

        def fire_and_stop(e) -> None:
            fire(e)
            stop_when_asked(e)

        improving = getattr(h, "cbMipImprovingSolution", None)
        logging = getattr(h, "cbMipLogging", None)
        track = progress.wanted and improving is not None and logging is not None
        try:
            for name in ("cbSimplexInterrupt", "cbIpmInterrupt", "cbMipInterrupt"):
                callback = getattr(h, name, None)
                if callback is not None:
                    callback.subscribe(fire_and_stop if track and name == "cbMipInterrupt" else stop_when_asked)
            if track:
                improving.subscribe(fire)
                logging.subscribe(fire)
        except Exception:  # callbacks unsupported by this build
            return


def highs_version() -> str:
    """The HiGHS version, for reports (e.g. "1.15.1")."""
    return _HighsBackend.version() or "unknown"


# -- Gurobi -----------------------------------------------------------------------------------------

_GUROBI_SIZE_LIMIT_MSG = (
    "Gurobi refused the model (error 10010: model too large for size-limited license): the free licence "
    "that comes with the pip package `gurobipy` caps models at 2000 variables and 2000 constraints. "
    "This model has {vars} variables and {constrs} constraints. Install a full Gurobi licence "
    "(academic licences are free: https://www.gurobi.com/academia/) or use another solver "
    "(--solver highs or --solver cbc)."
)


class _GurobiBackend(MilpBackend):
    """Gurobi through gurobipy's matrix API (optional; needs a licence for models above 2000 rows/columns)."""

    NAME = "gurobi"
    REQUIRED_MODULES = ("gurobipy",)
    INSTALL_HINT = ("install it with `pip install gurobipy` (or `pip install taccl[gurobi]`); the pip package "
                    "carries a size-limited licence (2000 variables/constraints), larger models need a full "
                    "licence from https://www.gurobi.com")
    HAS_PROGRESS = True

    @classmethod
    def version(cls) -> Optional[str]:
        import gurobipy

        return ".".join(str(v) for v in gurobipy.gurobi.version())

    def solve(self, model: Model, options: SolveOptions) -> Result:
        import gurobipy as gp

        t0 = time.perf_counter()
        env = None
        m = None
        try:
            env = gp.Env(empty=True)
            env.setParam("OutputFlag", 1 if options.verbose else 0)
            env.start()
            m = gp.Model(model.name, env=env)
            a = self._build(gp, m, model)
            m.Params.TimeLimit = _time_left(options, t0)
            m.Params.Threads = int(options.threads)
            m.Params.Seed = int(options.seed)
            m.Params.MIPGap = float(options.mip_rel_gap)
            progress = _Progress(options)
            if progress.wanted:
                m.optimize(self._callback(gp, progress))
                progress.reraise()
            else:
                m.optimize()
            return self._result(gp, m, model, a.is_mip, options, t0, stopped=_stop_message(options, progress))
        except gp.GurobiError as exc:
            errno = getattr(exc, "errno", None)
            if errno == 10010 or "size-limited" in str(exc):
                raise SolverError(_GUROBI_SIZE_LIMIT_MSG.format(vars=model.num_vars,
                                                                constrs=model.num_constrs)) from None
            if errno in (10009, 10032) or "licen" in str(exc).lower():
                raise SolverError(f"Gurobi licence problem (error {errno}): {exc}. "
                                  "See https://www.gurobi.com/documentation/ for licence setup, "
                                  "or use --solver highs.") from None
            return _make_result("error", self.NAME, t0, message=f"Gurobi error {errno}: {exc}")
        finally:
            if m is not None:
                m.dispose()
            if env is not None:
                env.dispose()

    @staticmethod
    def _build(gp, m, model: Model) -> _Arrays:
        a = model._arrays("csr")
        vtype = np.array(["C", "I", "B"])[a.kind.astype(np.int64)] if model.num_vars else np.zeros(0, dtype="<U1")
        x = m.addMVar(model.num_vars, lb=a.col_lower, ub=a.col_upper, obj=a.col_cost, vtype=vtype)
        m.ModelSense = 1
        # Ranged rows become two rows; free rows are dropped.
        lo, hi = a.row_lower, a.row_upper
        eq = lo == hi
        has_lo = np.isfinite(lo) & ~eq
        has_hi = np.isfinite(hi) & ~eq
        blocks = [(eq, "=", lo), (has_lo, ">", lo), (has_hi, "<", hi)]
        try:
            import scipy.sparse as sp
        except ImportError:  # pragma: no cover - scipy ships with most scientific stacks
            sp = None
        if sp is not None:
            mat = sp.csr_matrix((a.value, a.index, a.start), shape=(model.num_constrs, model.num_vars))
            for mask, sense, rhs in blocks:
                rows = np.flatnonzero(mask)
                if rows.size:
                    m.addMConstr(mat[rows], x, sense, rhs[rows])
        else:  # pragma: no cover
            xs = x.tolist()
            senses = {"=": gp.GRB.EQUAL, ">": gp.GRB.GREATER_EQUAL, "<": gp.GRB.LESS_EQUAL}
            for mask, sense, rhs in blocks:
                for r in np.flatnonzero(mask):
                    s, e = a.start[r], a.start[r + 1]
                    expr = gp.LinExpr(a.value[s:e].tolist(), [xs[j] for j in a.index[s:e]])
                    m.addLConstr(expr, senses[sense], float(rhs[r]))
        m.update()
        if a.is_mip and model._start is not None:
            start = np.where(np.isnan(model._start), gp.GRB.UNDEFINED, model._start)
            x.Start = start
        return a

    @staticmethod
    def _callback(gp, progress: _Progress):
        GRB = gp.GRB

        def value(x):  # Gurobi says "none yet" with +-GRB.INFINITY (1e100), a finite float
            return x if abs(x) < GRB.INFINITY else INF

        has_work = hasattr(GRB.Callback, "WORK")  # deterministic work units, where this gurobipy has them

        def cb(m, where):
            if where in (GRB.Callback.MIP, GRB.Callback.MIPSOL):
                best, bound = ((GRB.Callback.MIP_OBJBST, GRB.Callback.MIP_OBJBND) if where == GRB.Callback.MIP
                               else (GRB.Callback.MIPSOL_OBJBST, GRB.Callback.MIPSOL_OBJBND))
                progress(m.cbGet(GRB.Callback.RUNTIME), value(m.cbGet(best)), value(m.cbGet(bound)),
                         m.cbGet(GRB.Callback.WORK) if has_work else None)
            if progress.should_stop:
                m.terminate()

        return cb

    _STATUS_NAMES = ("LOADED", "OPTIMAL", "INFEASIBLE", "INF_OR_UNBD", "UNBOUNDED", "CUTOFF", "ITERATION_LIMIT",
                     "NODE_LIMIT", "TIME_LIMIT", "SOLUTION_LIMIT", "INTERRUPTED", "NUMERIC", "SUBOPTIMAL",
                     "INPROGRESS", "USER_OBJ_LIMIT", "WORK_LIMIT", "MEM_LIMIT")

    def _result(self, gp, m, model: Model, is_mip: bool, options: SolveOptions, t0: float,
                stopped: str = "") -> Result:
        GRB = gp.GRB
        st = m.Status
        names = {getattr(GRB, n): n for n in self._STATUS_NAMES if hasattr(GRB, n)}
        if st == GRB.INF_OR_UNBD:
            m.Params.DualReductions = 0
            m.Params.TimeLimit = max(1.0, options.time_limit_s - (time.perf_counter() - t0))
            m.optimize()
            st = m.Status
        has_sol = m.SolCount > 0
        values = np.array(m.getAttr("X", m.getVars()), dtype=np.float64) if has_sol else None
        objective = m.ObjVal if has_sol else None
        bound = None
        if is_mip:
            try:
                bound = m.ObjBound
            except gp.GurobiError:
                bound = None
        limits = (GRB.TIME_LIMIT, GRB.ITERATION_LIMIT, GRB.NODE_LIMIT, GRB.SOLUTION_LIMIT, GRB.INTERRUPTED,
                  GRB.SUBOPTIMAL, GRB.USER_OBJ_LIMIT, GRB.CUTOFF, getattr(GRB, "WORK_LIMIT", -1),
                  getattr(GRB, "MEM_LIMIT", -1))
        if st == GRB.OPTIMAL:
            status = "optimal"
        elif st == GRB.INFEASIBLE:
            status = "infeasible"
        elif st == GRB.UNBOUNDED:
            status = "unbounded"
        elif st in limits:
            status = "feasible" if has_sol else "no_solution"
        elif st == GRB.NUMERIC and has_sol:
            status = "feasible"
        else:
            return _make_result("error", self.NAME, t0, message=f"Gurobi: status {names.get(st, st)}")
        message = "" if status == "optimal" else f"Gurobi: {names.get(st, st)}"
        if stopped and status == "feasible":
            message = stopped  # the stall or the work limit (`_Progress`)
        return _make_result(status, self.NAME, t0, values=values, objective=objective, bound=bound,
                            is_mip=is_mip, message=message)


# -- CBC through PuLP --------------------------------------------------------------------------------


class _CbcBackend(MilpBackend):
    """CBC, the binary bundled with PuLP, driven through PuLP's model and CBC command interface.

    PuLP reports no dual bound, so the bound of a stopped MIP is read from CBC's log. CBC takes a
    random seed of 0 to mean "time of day", so seed s is passed as s + 1; more than one thread is passed
    as 100 + n, CBC's repeatable parallel mode.
    """

    NAME = "cbc"
    REQUIRED_MODULES = ("pulp",)
    INSTALL_HINT = "install it with `pip install pulp` (it bundles a CBC binary; it is a dependency of taccl)"

    @classmethod
    def unavailable_reason(cls) -> Optional[str]:
        reason = super().unavailable_reason()
        if reason is not None:
            return reason
        import pulp

        if not cls._command(pulp)(msg=False).available():
            return ("PuLP is installed but finds no CBC binary it can run; install one with "
                    "`pip install pulp[cbc]` or `apt-get install coinor-cbc`, or use --solver highs")
        return None

    @staticmethod
    def _command(pulp):
        """PuLP's command class for CBC: the bundled binary where PuLP still ships it, else COIN_CMD.

        PuLP 3.3 marks PULP_CBC_CMD deprecated (it goes in PuLP 4); we still prefer its bundled binary
        while it exists, so the deprecation warning is silenced at construction.
        """
        bundled = getattr(pulp, "PULP_CBC_CMD", None)
        if bundled is None:
            return pulp.COIN_CMD

        def make(**kwargs):
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", DeprecationWarning)
                return bundled(**kwargs)

        return make

    @classmethod
    def version(cls) -> Optional[str]:
        import pulp

        return f"PuLP {pulp.__version__}, bundled CBC"

    def solve(self, model: Model, options: SolveOptions) -> Result:
        import pulp

        t0 = time.perf_counter()
        a = model._arrays("csr")
        is_mip = a.is_mip
        n = model.num_vars
        prob = pulp.LpProblem("taccl", pulp.LpMinimize)
        # PuLP >= 3.3 attaches variables to the problem (add_variable); older PuLP builds them free-standing.
        new_api = hasattr(prob, "add_variable")
        xs = []
        for j in range(n):
            lb, ub = a.col_lower[j], a.col_upper[j]
            kwargs = dict(lowBound=None if lb == -INF else float(lb), upBound=None if ub == INF else float(ub),
                          cat=pulp.LpContinuous if a.kind[j] == _CONTINUOUS else pulp.LpInteger)
            xs.append(prob.add_variable(f"x{j}", **kwargs) if new_api else pulp.LpVariable(f"x{j}", **kwargs))
        if not new_api:
            prob.addVariables(xs)
        nz = np.flatnonzero(a.col_cost)
        prob.setObjective(pulp.LpAffineExpression([(xs[j], float(a.col_cost[j])) for j in nz]))
        for r in range(model.num_constrs):
            lo, hi = float(a.row_lower[r]), float(a.row_upper[r])
            s, e = int(a.start[r]), int(a.start[r + 1])
            if s == e:  # an empty row: 0 must lie in [lo, hi]
                if lo > 1e-9 or hi < -1e-9:
                    return _make_result("infeasible", self.NAME, t0, message=f"empty row {r} excludes 0")
                continue
            expr = pulp.LpAffineExpression(list(zip((xs[j] for j in a.index[s:e].tolist()),
                                                    a.value[s:e].tolist())))
            if lo == hi:
                prob.addConstraint(pulp.LpConstraint(expr, pulp.LpConstraintEQ, f"e{r}", lo))
            else:
                if lo != -INF:
                    prob.addConstraint(pulp.LpConstraint(expr, pulp.LpConstraintGE, f"l{r}", lo))
                if hi != INF:
                    prob.addConstraint(pulp.LpConstraint(expr, pulp.LpConstraintLE, f"u{r}", hi))
        warm = is_mip and model._start is not None
        if warm:
            for j in np.flatnonzero(~np.isnan(model._start)):
                # within the column's bounds: PuLP refuses a start a rounding below its lower bound
                xs[j].setInitialValue(float(np.clip(model._start[j], a.col_lower[j], a.col_upper[j])))
        try:
            limit = _time_left(options, t0)
            if options.work_limit_s is not None:  # no callback to count the solver's work: the wall clock
                limit = min(limit, float(options.work_limit_s))
            log = self._run(pulp, prob, options, warm, limit)
            if prob.sol_status != pulp.LpSolutionOptimal and "infeasible or unbounded" in log:
                return self._infeasible_or_unbounded(pulp, prob, xs, a, options, t0)
        except pulp.PulpSolverError as exc:
            return _make_result("error", self.NAME, t0, message=f"CBC: {exc}")
        return self._result(pulp, prob, xs, a, is_mip, log, t0)

    def _infeasible_or_unbounded(self, pulp, prob, xs, a: _Arrays, options: SolveOptions, t0: float) -> Result:
        """CBC's preprocessing said "infeasible or unbounded": decide with a zero objective.

        CBC 2.10 also says this of some bounded, feasible models, so a feasible point means "unbounded"
        only when the costs allow it; otherwise that point is returned as an incumbent without a bound.
        """
        prob.setObjective(pulp.LpAffineExpression())
        try:
            self._run(pulp, prob, options, False, _time_left(options, t0))
        except pulp.PulpSolverError as exc:
            return _make_result("no_solution", self.NAME, t0, message="CBC: preprocessing says infeasible or "
                                f"unbounded and the zero-objective check failed ({exc})")
        zero = prob.sol_status
        note = "CBC: preprocessing says infeasible or unbounded; a zero-objective solve "
        if zero == pulp.LpSolutionInfeasible:
            return _make_result("infeasible", self.NAME, t0, message=note + "proved it infeasible")
        if zero not in (pulp.LpSolutionOptimal, pulp.LpSolutionIntegerFeasible):
            return _make_result("no_solution", self.NAME, t0, message=note + "found no point either")
        c = a.col_cost
        can_improve = ((c < 0) & (a.col_upper == INF)) | ((c > 0) & (a.col_lower == -INF))
        if can_improve.any():
            return _make_result("unbounded", self.NAME, t0, message=note + "found a feasible point")
        values = self._values(xs, a)
        return _make_result("feasible", self.NAME, t0, values=values, objective=float(c @ values),
                            message=note + "found a feasible point of a bounded model (a CBC misjudgement)")

    @staticmethod
    def _values(xs, a: _Arrays) -> np.ndarray:
        """Column values; a column CBC left out (in no row, no cost) is put at 0 clipped to its bounds."""
        vals = [v.varValue for v in xs]
        values = np.array([0.0 if v is None else v for v in vals], dtype=np.float64)
        missing = [j for j, v in enumerate(vals) if v is None]
        if missing:
            values[missing] = np.clip(0.0, a.col_lower[missing], a.col_upper[missing])
        return values

    def _run(self, pulp, prob, options: SolveOptions, warm: bool, time_limit_s: float) -> str:
        """Run CBC on `prob` once; return its log (echoed when verbose)."""
        tmpdir = tempfile.mkdtemp(prefix="taccl-cbc-")
        log_path = os.path.join(tmpdir, "cbc.log")
        opts = [f"randomCbcSeed {int(options.seed) + 1}"]
        if int(options.threads) > 1:
            opts.append(f"threads {100 + int(options.threads)}")
        cmd = self._command(pulp)(
            msg=False, timeLimit=float(time_limit_s), gapRel=float(options.mip_rel_gap),
            warmStart=warm, logPath=log_path, options=opts,
        )
        if hasattr(cmd, "tmpDir"):
            cmd.tmpDir = tmpdir
        log = ""
        try:
            prob.solve(cmd)
        finally:
            try:
                with open(log_path, encoding="utf-8", errors="replace") as f:
                    log = f.read()
            except OSError:
                pass
            shutil.rmtree(tmpdir, ignore_errors=True)
            if options.verbose and log:
                print(log)
        return log

    def _result(self, pulp, prob, xs, a: _Arrays, is_mip: bool, log: str, t0: float) -> Result:
        sol = prob.sol_status
        stopped = re.search(r"Result - Stopped on (\w+)", log)
        if sol == pulp.LpSolutionOptimal:
            status = "optimal"
        elif sol == pulp.LpSolutionIntegerFeasible:
            status = "feasible"
        elif sol == pulp.LpSolutionNoSolutionFound:
            status = "no_solution"
        elif sol == pulp.LpSolutionInfeasible:
            status = "no_solution" if stopped else "infeasible"
        elif sol == pulp.LpSolutionUnbounded:
            status = "unbounded"
        else:
            return _make_result("error", self.NAME, t0, message=f"CBC: {pulp.LpStatus.get(prob.status)}")
        values = None
        objective = None
        if status in ("optimal", "feasible"):
            values = self._values(xs, a)
            objective = float(a.col_cost @ values)
        bound = None
        m = re.search(r"Lower bound:\s+(\S+)", log)
        if m:
            try:
                bound = float(m.group(1))
            except ValueError:
                bound = None
        if status == "optimal" and not is_mip:
            bound = objective
        message = "" if status == "optimal" else f"CBC: {stopped.group(0) if stopped else pulp.LpStatus.get(prob.status)}"
        return _make_result(status, self.NAME, t0, values=values, objective=objective, bound=bound,
                            is_mip=is_mip, message=message)


# --------------------------------------------------------------------------------------------------
# Registry and entry points
# --------------------------------------------------------------------------------------------------

#: Backends in order of preference.
_BACKENDS: dict[str, type[MilpBackend]] = {
    b.NAME: b for b in (_HighsBackend, _GurobiBackend, _CbcBackend)
}

SOLVERS = tuple(_BACKENDS)


def _backend(solver: str) -> type[MilpBackend]:
    key = str(solver).strip().lower()
    if key not in _BACKENDS:
        raise UserError(f"unknown solver '{solver}'; expected one of: {', '.join(SOLVERS)}")
    return _BACKENDS[key]


def available_solvers() -> dict[str, Optional[str]]:
    """Map each solver name to None when usable, else the reason it is not (with an install hint)."""
    return {name: b.unavailable_reason() for name, b in _BACKENDS.items()}


def solver_version(solver: str) -> Optional[str]:
    """The version of a backend, or None when it is not installed."""
    b = _backend(solver)
    if b.unavailable_reason() is not None:
        return None
    return b.version()


def solve(model: Model, solver: str = "highs", options: Optional[SolveOptions] = None) -> Result:
    """Solve `model` (minimise) with the named backend.

    Raises `UserError` for an unknown solver name or nonsensical options, `SolverError` when the backend
    is missing or refuses the model for a reason the user must fix (licence limits). Anything the solver
    itself reports (infeasible, stopped at a limit, numerical failure) comes back as `Result.status`.
    """
    backend = _backend(solver)
    options = options or SolveOptions()
    if not (options.time_limit_s > 0):
        raise UserError(f"solver time limit must be positive, got {options.time_limit_s}")
    if int(options.threads) < 1:
        raise UserError(f"solver threads must be at least 1, got {options.threads}")
    if not (options.mip_rel_gap >= 0):
        raise UserError(f"mip_rel_gap must be >= 0, got {options.mip_rel_gap}")
    if options.stall_s is not None and not (options.stall_s > 0):
        raise UserError(f"solver stall limit must be positive, got {options.stall_s}")
    if options.work_limit_s is not None and not (options.work_limit_s > 0):
        raise UserError(f"solver work limit must be positive, got {options.work_limit_s}")
    reason = backend.unavailable_reason()
    if reason is not None:
        raise SolverError(f"solver '{backend.NAME}' is not available: {reason}")
    return backend().solve(model, options)
