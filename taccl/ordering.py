"""Stage 2: ordering. A greedy list schedule that fixes the order of transfers on every resource.

Input: tasks (one chunk over one link, copy or reduce, with the tasks whose arrival it needs). Whenever a
task's data is ready, it competes for its resources (link, switch ports, NICs); the task that can start
earliest goes first, ties broken by TACCL's heuristics (section 5, appendix B.2): longest remaining path
first, then shortest path travelled so far (or the reverse, `variant="travelled"`). Both variants are tried
and the shorter schedule kept. The result is a feasible schedule under strict one-at-a-time resource use.
"""
from __future__ import annotations

import heapq
from dataclasses import dataclass, field


@dataclass
class Task:
    id: int
    chunk: int
    src: int
    dst: int
    op: str  # "copy" | "reduce"
    alpha_us: float
    beta_us: float
    resources: tuple
    link_type: str
    internode: bool
    preds: list = field(default_factory=list)

    @property
    def cost_us(self) -> float:
        return self.alpha_us + self.beta_us


@dataclass
class Schedule:
    start: list  # per task
    finish: list  # per task (arrival at dst)
    order: dict  # resource -> task ids in start order
    makespan_us: float
    variant: str = ""


def _priorities(tasks):
    succs = [[] for _ in tasks]
    for t in tasks:
        for p in t.preds:
            succs[p].append(t.id)
    topo = topological_order({t.id: t.preds for t in tasks})
    travelled = [0.0] * len(tasks)
    for i in topo:
        for s in succs[i]:
            travelled[s] = max(travelled[s], travelled[i] + tasks[i].cost_us)
    remaining = [0.0] * len(tasks)
    for i in reversed(topo):
        remaining[i] = tasks[i].cost_us + max((remaining[s] for s in succs[i]), default=0.0)
    return remaining, travelled, succs


def topological_order(preds: dict) -> list:
    """Kahn's order of a DAG given as {node: iterable of predecessors}; raises on a cycle."""
    succs = {n: [] for n in preds}
    for n, ps in preds.items():
        for p in ps:
            succs[p].append(n)
    indeg = {n: len(ps) for n, ps in preds.items()}
    queue = [n for n, d in indeg.items() if d == 0]
    out = []
    while queue:
        n = queue.pop()
        out.append(n)
        for s in succs[n]:
            indeg[s] -= 1
            if indeg[s] == 0:
                queue.append(s)
    if len(out) != len(preds):
        raise ValueError("dependencies form a cycle")
    return out


def list_schedule(tasks, variant: str = "remaining") -> Schedule:
    remaining, travelled, succs = _priorities(tasks)
    n = len(tasks)
    start, finish = [0.0] * n, [0.0] * n
    data_ready = [0.0] * n
    waiting = [len(t.preds) for t in tasks]
    free = {}
    order = {}

    def key(i):
        if variant == "remaining":
            return (-remaining[i], travelled[i], i)
        return (travelled[i], -remaining[i], i)

    heap = [(0.0, key(t.id), t.id) for t in tasks if not t.preds]
    heapq.heapify(heap)
    while heap:
        est, k, i = heapq.heappop(heap)
        t = tasks[i]
        real = max([data_ready[i]] + [free.get(r, 0.0) for r in t.resources])
        if real > est + 1e-12:
            heapq.heappush(heap, (real, k, i))
            continue
        start[i], finish[i] = real, real + t.cost_us
        for r in t.resources:
            free[r] = finish[i]
            order.setdefault(r, []).append(i)
        for s in succs[i]:
            data_ready[s] = max(data_ready[s], finish[i])
            waiting[s] -= 1
            if waiting[s] == 0:
                heapq.heappush(heap, (data_ready[s], key(s), s))
    return Schedule(start, finish, order, max(finish, default=0.0), variant)


def best_schedule(tasks) -> Schedule:
    """Both tie-breaking variants; the shorter schedule wins (deterministic)."""
    a = list_schedule(tasks, "remaining")
    b = list_schedule(tasks, "travelled")
    return a if a.makespan_us <= b.makespan_us + 1e-9 else b
