"""Stage 3: contiguity and exact scheduling (TACCL section 5, appendix B.3).

With routes and per-resource orders fixed, decide which consecutive transfers on one link travel together
in one send (paying one alpha instead of several, at the price of the first chunk arriving later), and
compute exact times under the ordering stage's resource model (`taccl.ordering`: a task holds its
connection for the sender's share of alpha plus its data, and one lane of each shared resource for its
data; the data arrives the rest of alpha later).

MILP, per task i: start s_i, data end e_i, arrival a_i; per merge candidate (consecutive tasks j, k on the
same link, adjacent in the buffers, consecutive on every connection and lane they hold) a binary y:
  s_i >= a_p for every data predecessor p;   e_i >= s_i + o_i + beta_i;   a_i >= e_i + f_i;   T >= a_i
  (o_i: the sender's share of alpha_i, f_i = alpha_i - o_i: the latency in flight)
  consecutive (j, k) on a connection, not a candidate:  s_k >= e_j
  consecutive (j, k) on a lane:                         s_k + o_k >= e_j
  (the FIFO credits, a send waiting for the arrival of the one `fifo_depth` places earlier on its
  connection, are enforced in the exact times only: merging can only relax them)
  candidate (j, k):  s_k >= e_j - M y;  s_k = s_j when y = 1;  e_k >= e_j + beta_k - M (1 - y);
                     a_j >= a_k - M (1 - y)   (the whole group arrives together)
Every variable is boxed in [0, UB] with UB the ordering stage's makespan, so M = UB is valid and tight.
The greedy schedule (no merges) is the MIP start. Final times are recomputed exactly from the chosen
merges and orders (longest path over the task graph), so solver tolerances never reach the output.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from . import solver as milp
from .ordering import Schedule, Task, topological_order
from .progress import SILENT
from .symmetry import DisjointSets


@dataclass
class Group:
    tasks: list  # task ids sent together, in order
    start_us: float = 0.0  # takes its connection
    finish_us: float = 0.0  # its data has arrived
    sent_us: float = 0.0  # its data has left (connection and lanes free again)


@dataclass
class Contiguity:
    groups: list
    makespan_us: float
    stats: dict = field(default_factory=dict)


def merge_candidates(tasks, sched: Schedule, adjacent) -> list:
    """Consecutive (j, k) on one link that may be merged: `adjacent(j_task, k_task)` decides the buffers."""
    nxt = {}
    for res, ids in sched.order.items():
        for a, b in zip(ids, ids[1:]):
            nxt.setdefault(a, {})[res] = b
    out = []
    for j, t in enumerate(tasks):
        succ = nxt.get(j, {})
        ks = {succ.get(r) for r in sched.keys[j]}
        if len(ks) != 1:
            continue
        (k,) = ks
        if k is None:
            continue
        u = tasks[k]
        if (u.src, u.dst) == (t.src, t.dst) and u.op == t.op and adjacent(t, u):
            out.append((j, k))
    return out


def exact_times(tasks, sched: Schedule, merged: set, fifo_depth: int = 0) -> Contiguity:
    """Groups from the merged pairs, and their ASAP times given the fixed orders."""
    sets = DisjointSets()
    for j, k in merged:
        sets.union(j, k)
    members = {}
    for i in sorted(range(len(tasks)), key=lambda i: (sched.start[i], i)):
        members.setdefault(sets.find(i) if i in sets.parent else i, []).append(i)
    groups = {h: Group(ids) for h, ids in members.items()}
    gof = {i: h for h, ids in members.items() for i in ids}
    # Group-level DAG: data predecessors (start after their arrival), connection order (start after their
    # data left), lane order (data after their data left: start the sender's overhead earlier).
    data_preds = {h: set() for h in groups}
    preds = {h: set() for h in groups}
    lane_preds = {h: set() for h in groups}
    for i, t in enumerate(tasks):
        for p in t.preds:
            if gof[p] != gof[i]:
                data_preds[gof[i]].add(gof[p])
    fifo_preds = {h: set() for h in groups}
    for key, ids in sched.order.items():
        seq = []
        for i in ids:
            if not seq or seq[-1] != gof[i]:
                seq.append(gof[i])
        for a, b in zip(seq, seq[1:]):
            (preds if key[0] == "conn" else lane_preds)[b].add(a)
        if key[0] == "conn" and fifo_depth:  # FIFO credits: `fifo_depth` sends in flight on a connection
            for a, b in zip(seq, seq[fifo_depth:]):
                fifo_preds[b].add(a)
    order = topological_order({h: data_preds[h] | preds[h] | lane_preds[h] | fifo_preds[h] for h in groups})
    for h in order:
        g = groups[h]
        first = tasks[g.tasks[0]]
        sync = max(tasks[i].sync_us for i in g.tasks)
        g.start_us = max([groups[p].finish_us + sync for p in data_preds[h]] + [groups[p].sent_us for p in preds[h]] +
                         [groups[p].sent_us - first.overhead_us for p in lane_preds[h]] +
                         [groups[p].finish_us + first.flight_us for p in fifo_preds[h]] + [0.0])
        g.sent_us = g.start_us + first.overhead_us + sum(tasks[i].beta_us for i in g.tasks)
        g.finish_us = g.sent_us + first.flight_us
    ordered = sorted(groups.values(), key=lambda g: (g.start_us, g.tasks[0]))
    return Contiguity(ordered, max((g.finish_us for g in ordered), default=0.0))


def schedule_times(tasks, sched: Schedule) -> Contiguity:
    """`exact_times` without merges, read off the greedy schedule: a list schedule starts each task as soon
    as its orders allow, so the two agree (to 1e-13 us on every sketch tried) and this skips building the
    graph of a million groups (70 s on a 1024-GPU AllReduce)."""
    groups = [Group([i], sched.start[i], sched.finish[i], sched.start[i] + t.overhead_us + t.beta_us)
              for i, t in enumerate(tasks)]
    groups.sort(key=lambda g: (g.start_us, g.tasks[0]))
    return Contiguity(groups, max((g.finish_us for g in groups), default=0.0))


MAX_MILP_TASKS = 100_000  # above this the MILP (3 columns per task) is not worth building


def coalesce(tasks, sched: Schedule, adjacent, position, max_chunks: int) -> set:
    """Greedy merges, where one step per transfer would not fit the runtime (the MILP's merges pay for
    themselves in time; these are made for the step count). On each connection, a window is a run of tasks in
    its order that do the same thing (op), hold the same lanes and could all have started with the first
    (each predecessor arrived, plus its sync, by then): in any order, so a window's tasks are sorted by their
    place in the source buffer (`position`) and each run of consecutive chunks in both buffers (`adjacent`),
    up to `max_chunks`, becomes one send. A send takes the place of its earliest task in every order it holds
    (`sched.order` is rewritten): its tasks start no later, and every order edge between sends is one
    between their earliest tasks or goes forward in time, so the orders stay acyclic. Returns the merged
    pairs (j, k) (`exact_times` joins them into groups)."""
    merged = set()
    members = {}  # a send's earliest task -> its other tasks

    def joins(i, first):
        t = tasks[i]
        return (t.op == tasks[first].op and not t.exchange and sched.keys[i] == sched.keys[first]
                and all(sched.finish[p] + t.sync_us <= sched.start[first] + 1e-9 for p in t.preds))

    for key, ids in sched.order.items():
        if key[0] != "conn":
            continue
        a = 0
        while a < len(ids):
            b = a + 1
            if not tasks[ids[a]].exchange:
                while b < len(ids) and joins(ids[b], ids[a]):
                    b += 1
            window = sorted(ids[a:b], key=lambda i: position(tasks[i]))
            run = [window[0]]
            for i in window[1:] + [None]:
                if i is not None and len(run) < max_chunks and adjacent(tasks[run[-1]], tasks[i]):
                    run.append(i)
                    continue
                if len(run) > 1:
                    merged.update(zip(run, run[1:]))
                    earliest = min(run, key=lambda j: (sched.start[j], j))
                    members[earliest] = [j for j in run if j != earliest]
                run = [i]
            a = b
    if merged:
        later = {i for ms in members.values() for i in ms}
        for key, ids in sched.order.items():
            out = []
            for i in ids:
                if i not in later:
                    out.append(i)
                    out.extend(members.get(i, ()))
            sched.order[key] = out
    return merged


def _without_milp(status: str, makespan_us: float, **extra) -> dict:
    """The stage's statistics where no MILP was solved."""
    return {"stage": "contiguity", "variables": 0, "constraints": 0, "binaries": 0, "time_s": 0.0,
            "status": status, "gap": 0.0, "objective": makespan_us, **extra}


def contiguity(tasks, sched: Schedule, adjacent, *, solver="highs", options=None, report=SILENT,
               fifo_depth: int = 0, coalesce_with=None) -> Contiguity:
    """The groups and their exact times: merges chosen by `coalesce` where the caller gives its (adjacent,
    position, max_chunks) as `coalesce_with` (one step per transfer would not fit the runtime), else by the
    MILP up to `MAX_MILP_TASKS` tasks, else none."""
    skip = None
    merged = coalesce(tasks, sched, *coalesce_with) if coalesce_with else set()
    if merged:
        out = exact_times(tasks, sched, merged, fifo_depth)
        out.stats = _without_milp("greedy", out.makespan_us, merged_pairs=len(merged))
        report(f"contiguity: {len(tasks)} transfers merged greedily into {len(out.groups)} sends ({len(merged)} "
               f"merges); schedule {out.makespan_us:.2f} us (greedy {sched.makespan_us:.2f})")
        return out
    if len(tasks) > MAX_MILP_TASKS:
        skip = f"skipped ({len(tasks)} transfers > {MAX_MILP_TASKS}; greedy times kept, no merges)"
    else:
        cands = merge_candidates(tasks, sched, adjacent)
        if not cands:
            skip = "skipped (no merge candidates)"
    if skip:
        base = schedule_times(tasks, sched)
        base.stats = _without_milp(skip, base.makespan_us)
        report(f"contiguity: {skip}; schedule {base.makespan_us:.2f} us")
        return base
    base = exact_times(tasks, sched, set(), fifo_depth)
    ub = base.makespan_us
    model = milp.Model("contiguity")
    n = len(tasks)
    T = model.add_var(0.0, ub, obj=1.0)
    s = model.add_vars(n, 0.0, ub)
    e = model.add_vars(n, 0.0, ub)
    a = model.add_vars(n, 0.0, ub)
    y = {}
    for j, k in cands:
        y[(j, k)] = model.add_var(0, 1, binary=True)
    for i, t in enumerate(tasks):
        for p in t.preds:
            model.add_constr([s[i], a[p]], [1.0, -1.0], t.sync_us)
        model.add_constr([e[i], s[i]], [1.0, -1.0], t.overhead_us + t.beta_us)
        model.add_constr([a[i], e[i]], [1.0, -1.0], t.flight_us)
        model.add_constr([T, a[i]], [1.0, -1.0], 0.0)
    M = ub
    pairs, lane_pairs = set(), set()
    for key, ids in sched.order.items():
        (pairs if key[0] == "conn" else lane_pairs).update(zip(ids, ids[1:]))
    for j, k in sorted(pairs):
        if (j, k) in y:
            v = y[(j, k)]
            model.add_constr([s[k], e[j], v], [1.0, -1.0, M], 0.0)
            model.add_constr([s[k], s[j], v], [1.0, -1.0, M], hi=M)
            model.add_constr([s[j], s[k], v], [1.0, -1.0, M], hi=M)
            model.add_constr([e[k], e[j], v], [1.0, -1.0, -M], tasks[k].beta_us - M)
            model.add_constr([a[j], a[k], v], [1.0, -1.0, -M], -M)
        else:
            model.add_constr([s[k], e[j]], [1.0, -1.0], 0.0)
    for j, k in sorted(lane_pairs - pairs):  # a merged pair shares its connection: covered above
        model.add_constr([s[k], e[j]], [1.0, -1.0], -tasks[k].overhead_us)
    start = [0.0] * model.num_vars
    start[T] = ub
    for i in range(n):
        start[s[i]], start[a[i]] = sched.start[i], sched.finish[i]
        start[e[i]] = sched.finish[i] - tasks[i].flight_us
    model.set_start(start)
    stats = dict(model.stats(), stage="contiguity", merge_candidates=len(cands))
    report(f"contiguity: MILP with {stats['variables']} variables ({stats['binaries']} binary), {stats['constraints']} constraints")
    res = milp.solve(model, solver, options or milp.SolveOptions())
    stats.update(status=res.status, time_s=round(res.time_s, 3), gap=res.gap, objective=res.objective,
                 bound=res.bound, solver=res.solver)
    if not res.has_solution:
        stats["fallback"] = "no merges (solver found no solution within its limit)"
        base.stats = stats
        return base
    merged = {jk for jk, v in y.items() if res.values[v] > 0.5}
    out = exact_times(tasks, sched, merged, fifo_depth)
    if out.makespan_us > base.makespan_us + 1e-9:
        merged, out = set(), base
    stats["merged_pairs"] = len(merged)
    out.stats = stats
    report(f"contiguity: {res.status}, {len(merged)} merge(s), schedule {out.makespan_us:.2f} us, {res.time_s:.2f} s")
    return out
