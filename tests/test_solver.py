"""One conformance suite for every MILP backend: tiny problems with known optima.

Each test is parametrised over `taccl.solver.SOLVERS` and skipped where a backend is not installed.
"""
from __future__ import annotations

import itertools
import random

import numpy as np
import pytest

from taccl import solver as S
from taccl.errors import SolverError, UserError
from taccl.solver import INF, Model, SolveOptions, solve

_AVAILABLE = S.available_solvers()


def _backends(only_progress: bool = False):
    params = []
    for name in S.SOLVERS:
        reason = _AVAILABLE[name]
        marks = [pytest.mark.skip(reason=reason)] if reason else []
        if only_progress and not S._BACKENDS[name].HAS_PROGRESS:
            marks = [pytest.mark.skip(reason=f"{name} offers no progress callbacks")]
        params.append(pytest.param(name, marks=marks, id=name))
    return params


BACKENDS = _backends()
OPTS = SolveOptions(time_limit_s=20.0)


def _check_feasible(model: Model, x: np.ndarray, tol: float = 1e-6) -> None:
    """Bounds, integrality and every row hold at `x` (the invariant every solution must meet)."""
    a = model._arrays("csr")
    assert x.shape == (model.num_vars,)
    assert np.all(x >= a.col_lower - tol) and np.all(x <= a.col_upper + tol)
    ints = a.kind != 0
    assert np.all(np.abs(x[ints] - np.round(x[ints])) <= tol)
    for r in range(model.num_constrs):
        s, e = a.start[r], a.start[r + 1]
        act = float(a.value[s:e] @ x[a.index[s:e]])
        assert a.row_lower[r] - tol <= act <= a.row_upper[r] + tol, f"row {r}: {act}"


# -- canonical problems -------------------------------------------------------------------------------


def lp_0():
    """min -3x - 2y  s.t.  x + y <= 4, x + 3y <= 6, 0 <= x <= 3, y free: optimum -11 at (3, 1)."""
    m = Model("lp_0")
    x = m.add_var(0, 3, obj=-3.0, name="x")
    y = m.add_var(-INF, INF, name="y")
    m.set_obj(y, -2.0)
    m.add_constr([x, y], [1.0, 1.0], hi=4.0)
    m.add_constr([x, y, y], [1.0, 1.0, 2.0], hi=6.0)  # duplicate column: 1y + 2y = 3y
    m.add_constr([y], [1.0], lo=-10.0)
    return m, -11.0, [3.0, 1.0]


KNAP_VALUES = [10, 13, 7, 8, 9, 4, 11]
KNAP_WEIGHTS = [5, 6, 3, 4, 4, 2, 6]
KNAP_CAP = 14


def _knapsack_optimum() -> float:
    best = 0
    for pick in itertools.product((0, 1), repeat=len(KNAP_VALUES)):
        if sum(w * p for w, p in zip(KNAP_WEIGHTS, pick)) <= KNAP_CAP:
            best = max(best, sum(v * p for v, p in zip(KNAP_VALUES, pick)))
    return -float(best)


def mi_knapsack():
    m = Model("knapsack")
    xs = m.add_vars(len(KNAP_VALUES), binary=True)
    for j, v in zip(xs, KNAP_VALUES):
        m.set_obj(j, -v)
    m.add_constr(list(xs), KNAP_WEIGHTS, hi=KNAP_CAP, name="capacity")
    return m, _knapsack_optimum()


def mi_infeasible():
    m = Model("infeasible")
    a = m.add_var(binary=True)
    b = m.add_var(binary=True)
    c = m.add_var(0, 1)
    m.add_constr([a, b, c], [1, 1, 1], lo=3.5)
    return m


def lp_unbounded():
    m = Model("lp_unbounded")
    x = m.add_var(0, INF, obj=-1.0)
    y = m.add_var(-INF, INF)
    m.add_constr([x, y], [1.0, -1.0], lo=0.0)
    return m


def mi_unbounded():
    m = Model("mi_unbounded")
    x = m.add_var(0, INF, obj=-1.0, integer=True)
    y = m.add_var(0, INF, obj=0.5)
    m.add_constr([x, y], [1.0, -1.0], hi=2.0)
    return m


def market_split(n_rows=4, n_cols=30, seed=1, planted=False):
    """Cornuéjols-Dawande market split: hard for branch and bound.

    Optimisation form (planted=False): min total slack of ``A x + s+ - s- = b``; x = 0 is feasible.
    Feasibility form (planted=True): ``A x = b`` with b = A x* for a hidden x*; objective 0.
    """
    rng = random.Random(seed)
    A = [[rng.randrange(100) for _ in range(n_cols)] for _ in range(n_rows)]
    x_star = [rng.randrange(2) for _ in range(n_cols)]
    m = Model("market_split")
    xs = m.add_vars(n_cols, binary=True)
    for i, row in enumerate(A):
        b = sum(a * x for a, x in zip(row, x_star)) if planted else sum(row) // 2
        if planted:
            m.add_constr(list(xs), row, lo=b, hi=b)
        else:
            sp = m.add_var(0, INF, obj=1.0)
            sm = m.add_var(0, INF, obj=1.0)
            m.add_constr(list(xs) + [sp, sm], row + [1, -1], lo=b, hi=b)
    return m, x_star


# -- the suite ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("backend", BACKENDS)
def test_lp(backend):
    m, opt, x = lp_0()
    r = solve(m, backend, OPTS)
    assert r.status == "optimal", r.message
    assert r.solver == backend and r.has_solution
    assert r.objective == pytest.approx(opt, abs=1e-6)
    assert r.values == pytest.approx(x, abs=1e-6)
    assert r.gap == 0.0
    _check_feasible(m, r.values)


@pytest.mark.parametrize("backend", BACKENDS)
def test_knapsack(backend):
    m, opt = mi_knapsack()
    r = solve(m, backend, OPTS)
    assert r.status == "optimal", r.message
    assert r.objective == pytest.approx(opt, abs=1e-6)
    assert float(np.dot(-np.array(KNAP_VALUES), r.values)) == pytest.approx(opt, abs=1e-6)
    assert r.gap == 0.0
    assert r.bound is not None and r.bound <= r.objective + 1e-6
    _check_feasible(m, r.values)


@pytest.mark.parametrize("backend", BACKENDS)
def test_infeasible(backend):
    r = solve(mi_infeasible(), backend, OPTS)
    assert r.status == "infeasible", r.message
    assert not r.has_solution and r.objective is None and r.gap is None


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("problem", [lp_unbounded, mi_unbounded], ids=["lp", "mip"])
def test_unbounded(backend, problem):
    r = solve(problem(), backend, OPTS)
    assert r.status == "unbounded", r.message
    assert not r.has_solution


@pytest.mark.parametrize("backend", BACKENDS)
def test_time_limit_returns_incumbent_and_gap(backend):
    m, _ = market_split()
    limit = 0.5
    r = solve(m, backend, SolveOptions(time_limit_s=limit))
    assert r.status in ("feasible", "no_solution"), (r.status, r.message)
    assert r.time_s < limit + 10.0
    if r.status == "feasible":
        assert r.has_solution and r.objective is not None
        assert r.gap is not None and r.gap > 0
        assert r.bound is not None and r.bound <= r.objective
        _check_feasible(m, r.values)
    else:
        assert not r.has_solution


@pytest.mark.parametrize("backend", BACKENDS)
def test_mip_start_is_used(backend):
    # Hidden equality-constrained 0/1 solution: hard to find, instantly optimal when given as a start.
    m, x_star = market_split(n_rows=5, n_cols=40, seed=7, planted=True)
    z = m.add_var(0, INF, obj=1.0)  # continuous, left unknown (NaN) in the start
    m.add_constr([z], [1.0], lo=3.0)
    m.set_start(list(map(float, x_star)) + [float("nan")])
    r = solve(m, backend, SolveOptions(time_limit_s=10.0))
    assert r.status == "optimal", (r.status, r.message)
    assert r.objective == pytest.approx(3.0, abs=1e-6)
    _check_feasible(m, r.values)


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_start_a_rounding_outside_its_bounds_is_accepted(backend):
    # a start computed in floating point can fall a rounding below a bound computed another way (CBC through
    # PuLP refused it: "initial value 8.7954556 is smaller than lowBound 8.795455605899933")
    m = Model("start")
    lb = 8.795455605899933
    x = m.add_var(lb, 20.0, obj=1.0)
    y = m.add_var(0, 1, obj=1.0, integer=True)
    m.add_constr([x, y], [1.0, 1.0], lo=9.0)
    m.set_start([lb - 1e-9, 1.0])
    r = solve(m, backend, SolveOptions(time_limit_s=10.0))
    assert r.status == "optimal", (r.status, r.message)
    assert r.objective == pytest.approx(9.0, abs=1e-6)


@pytest.mark.parametrize("backend", BACKENDS)
def test_deterministic(backend):
    m, _ = market_split(n_rows=3, n_cols=14, seed=3)
    opts = SolveOptions(time_limit_s=20.0, seed=5)
    r1, r2 = solve(m, backend, opts), solve(m, backend, opts)
    assert r1.status == r2.status == "optimal"
    assert r1.objective == r2.objective
    assert np.array_equal(r1.values, r2.values)


@pytest.mark.parametrize("backend", BACKENDS)
def test_empty_and_trivial_models(backend):
    r = solve(Model("empty"), backend, OPTS)
    assert r.status == "optimal" and r.values.shape == (0,) and r.objective == 0.0
    m = Model("bounds_only")
    m.add_var(1.0, 2.0, obj=1.0)
    m.add_var(-3.0, 5.0, obj=-1.0, integer=True)
    r = solve(m, backend, OPTS)
    assert r.status == "optimal", r.message
    assert r.values == pytest.approx([1.0, 5.0])


@pytest.mark.parametrize("backend", _backends(only_progress=True))
def test_progress_callback(backend):
    m, _ = market_split(n_rows=3, n_cols=20, seed=2)
    seen = []
    r = solve(m, backend, SolveOptions(time_limit_s=2.0, on_progress=seen.append))
    assert r.has_solution
    assert seen, "no progress reported"
    for p in seen:
        assert set(p) == {"time_s", "incumbent", "bound", "gap"}
        assert p["time_s"] >= 0


@pytest.mark.parametrize("backend", _backends(only_progress=True))
@pytest.mark.parametrize("limit,says", [({"stall_s": 0.5}, "stall limit"), ({"work_limit_s": 0.5}, "work limit")])
def test_stall_and_work_limits_stop_a_mip_that_would_run_its_whole_minute(backend, limit, says):
    # Market split: solutions come early, the zero bound is never closed; without either limit the
    # solve would run its whole minute.
    m, _ = market_split(n_rows=4, n_cols=30, seed=1)
    r = solve(m, backend, SolveOptions(time_limit_s=60.0, **limit))
    assert r.status == "feasible" and r.time_s < 20.0, (r.status, r.time_s, r.message)
    assert says in r.message
    assert r.gap is not None and r.gap > 0
    _check_feasible(m, r.values)


def test_work_limit_counts_solver_work_from_the_start_of_the_solve(monkeypatch):
    # a solve of the synthesizer's own (routing's arrival times) must do the same work on a loaded machine
    clock = iter([7.0, 7.5, 8.0, 9.0])
    monkeypatch.setattr(S.time, "thread_time", lambda: next(clock))
    progress = S._Progress(SolveOptions(work_limit_s=1.0))
    assert progress.wanted
    progress(30.0, 5.0, 0.0)  # 30 s of wall time, 0.5 s of work since the start
    assert not progress.out_of_work
    progress(31.0, 5.0, 0.0)
    assert progress.out_of_work and progress.should_stop
    gurobi_like = S._Progress(SolveOptions(work_limit_s=1.0))  # (its thread clock read at the start: unused)
    gurobi_like(30.0, 5.0, 0.0, work_s=0.9)  # work units passed by the backend count from 0
    assert not gurobi_like.out_of_work


def test_stall_limit_must_be_positive():
    with pytest.raises(UserError, match="stall limit"):
        solve(lp_0()[0], "highs", SolveOptions(stall_s=0.0))
    with pytest.raises(UserError, match="work limit"):
        solve(lp_0()[0], "highs", SolveOptions(work_limit_s=-1.0))


def test_progress_callback_error_propagates():
    if _AVAILABLE["highs"]:
        pytest.skip(_AVAILABLE["highs"])
    m, _ = market_split(n_rows=3, n_cols=20, seed=2)

    def boom(_):
        raise RuntimeError("from the callback")

    with pytest.raises(RuntimeError, match="from the callback"):
        solve(m, "highs", SolveOptions(time_limit_s=5.0, on_progress=boom))


# -- the API around the backends ----------------------------------------------------------------------


def test_unknown_solver_is_a_user_error():
    with pytest.raises(UserError) as e:
        solve(Model("m"), "cplex")
    for name in S.SOLVERS:
        assert name in str(e.value)


def test_missing_backend_is_a_solver_error_with_hint(monkeypatch):
    monkeypatch.setattr(S._GurobiBackend, "REQUIRED_MODULES", ("taccl_no_such_module_xyz",))
    assert "pip install gurobipy" in S.available_solvers()["gurobi"]
    with pytest.raises(SolverError, match="pip install gurobipy"):
        solve(Model("m"), "gurobi")


def test_bad_options_are_user_errors():
    with pytest.raises(UserError):
        solve(Model("m"), "highs", SolveOptions(time_limit_s=0))
    with pytest.raises(UserError):
        solve(Model("m"), "highs", SolveOptions(threads=0))


def test_model_bookkeeping():
    m = Model("m")
    a = m.add_var(binary=True, name="a")
    r = m.add_vars(3, 0, 5)
    b = m.add_vars(2, binary=True)
    assert (a, list(r), list(b)) == (0, [1, 2, 3], [4, 5])
    m.add_constr([0, 1, 1], [1, 2, 3], lo=1, name="row")
    m.add_constr(np.array([2, 3]), np.array([1.0, 1.0]), hi=4)
    m.add_constr(range(4), 1.0, hi=9)
    assert m.stats() == {"variables": 6, "constraints": 3, "binaries": 3, "nonzeros": 9}
    assert (m.num_vars, m.num_constrs, m.num_binaries, m.num_nonzeros) == (6, 3, 3, 9)
    assert m.col_name(0) == "a" and m.row_name(0) == "row" and m.row_name(2) == "r2"
    a_csr = m._arrays("csr")
    assert a_csr.start.tolist() == [0, 2, 4, 8]  # row 0: duplicate column 1 summed
    assert a_csr.value[:2].tolist() == [1.0, 5.0]
    a_csc = m._arrays("csc")
    assert a_csc.start[-1] == 8
    with pytest.raises(ValueError):
        m.add_constr([0, 1], [1.0])
    m.add_constr([99], [1.0])
    with pytest.raises(ValueError, match="column 99"):
        m._arrays()
    with pytest.raises(ValueError):
        m.set_start([0.0])


def test_versions():
    assert S.highs_version().count(".") == 2
    assert S.solver_version("highs") == S.highs_version()


def test_stall_counts_solver_work_not_wall_time():
    # A loaded machine stretches the wall clock, not the solver's work: the stall must not fire early there,
    # or the same synthesis writes another program under load.
    progress = S._Progress(SolveOptions(stall_s=1.0))
    progress(0.0, 5.0, 0.0, work_s=10.0)
    progress(50.0, 5.0, 0.0, work_s=10.9)  # 50 s of wall time, 0.9 s of work
    assert not progress.stalled
    progress(51.0, 4.0, 0.0, work_s=11.5)  # an improvement restarts the count
    progress(52.0, 4.0 - 1e-9, 0.0, work_s=12.4)  # not by more than STALL_REL_IMPROVEMENT: no restart
    assert not progress.stalled
    progress(52.5, 4.0, 0.0, work_s=12.5)
    assert progress.stalled and progress.should_stop


def test_stall_clock_defaults_to_the_thread_cpu_time(monkeypatch):
    clock = iter([2.0, 3.0, 3.5, 4.2])  # (the first read is the start)
    monkeypatch.setattr(S.time, "thread_time", lambda: next(clock))
    progress = S._Progress(SolveOptions(stall_s=1.0))
    progress(0.0, 2.0, 1.0)
    progress(100.0, 2.0, 1.0)
    assert not progress.stalled
    progress(100.1, 2.0, 1.0)
    assert progress.stalled
