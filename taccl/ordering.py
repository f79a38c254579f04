"""Stage 2: ordering. A greedy list schedule that fixes the order of transfers on every resource.

Input: tasks (one chunk over one link, copy or reduce, with the tasks whose arrival it needs). Whenever a
task's data is ready, it competes for its resources; the task that can start earliest (to the picosecond)
goes first, ties broken by TACCL's heuristics (section 5, appendix B.2): longest remaining path first, then
shortest path travelled so far (or the reverse, `variant="travelled"`). Both variants are tried and the
shorter schedule kept.

Resource model (the simulator's, `taccl.simulator`): a task holds its link's *connection* (src, dst), one
thread block in the lowered program, for the sender's share of its latency alpha, then for its data
(beta), which also holds one *lane* of every shared resource of the link (switch ports, NICs, direct
links); the data arrives the rest of alpha later (`Task.flight_us`). A shared resource has
``lanes[res]`` lanes (1 unless one thread block cannot fill it). The order of tasks is fixed per
connection and per lane (`Schedule.order`, keyed by ("conn", src, dst) and by (resource, lane)). A
connection's FIFO holds ``fifo_depth`` sends (the runtime's: Simple 2, LL/LL128 8): a send waits until the
one that many places earlier has arrived and its credit has come back (its in-flight latency).
`Schedule.start` is when a task takes its connection, `Schedule.finish` when its data has arrived.
"""
from __future__ import annotations

import heapq
from dataclasses import dataclass, field

from .progress import SILENT


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
    busy_us: float | None = None  # the sender's share of alpha (None: all of it)
    sync_us: float = 0.0  # after its predecessors' arrivals: the runtime's cross-thread-block dependency
    exchange: tuple = ()  # the reductions from its destination it swaps partial sums with (`Transfer.exchange`)

    @property
    def cost_us(self) -> float:
        return self.alpha_us + self.beta_us

    @property
    def overhead_us(self) -> float:
        """The part of alpha the sending connection is busy for, before the data."""
        return self.alpha_us if self.busy_us is None else self.busy_us

    @property
    def flight_us(self) -> float:
        """The part of alpha after the data left: the data arrives that much later."""
        return self.alpha_us - self.overhead_us


    @property
    def conn(self) -> tuple:
        return ("conn", self.src, self.dst)


@dataclass
class Schedule:
    start: list  # per task
    finish: list  # per task (arrival at dst)
    order: dict  # ("conn", src, dst) or (resource, lane) -> task ids in start order
    makespan_us: float
    variant: str = ""
    keys: list = field(default_factory=list)  # per task: the order keys it holds (its connection first)


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


def _ps(time_us: float) -> float:
    """Start times compare to the picosecond: two tasks whose starts differ by rounding compete by priority."""
    return round(time_us, 6)


def list_schedule(tasks, variant: str = "remaining", lanes: dict | None = None, fifo_depth: int = 0,
                  turns: list | None = None, tick=None) -> Schedule:
    """`turns` (per task, optional): a tie-break between the priorities and the task id (`rotation_turns`).
    `tick` (optional) is called with the number of tasks scheduled so far, every 1024 of them.

    The heap holds queues, not tasks. Tasks with the same connection, overheads and resources form a
    *queue*: they wait on the same times (the connection, its FIFO credits, the resources' lanes) and
    differ only in when their data is ready and in priority, so only the queue's head (the task that can
    start first, the best by priority among those that tie) competes. A queue that waits for a resource's
    lane *parks* on it, and the resource stands on the heap for all its parked queues at a lower bound of
    their starts (its earliest lane less the largest overhead among them). A heap of tasks re-pushed every
    ready task each time a resource it needs was taken: about 80 times per task on a 32-node AllToAll."""
    lanes = lanes or {}
    turns = turns or [0] * len(tasks)
    remaining, travelled, succs = _priorities(tasks)
    n = len(tasks)
    start, finish = [0.0] * n, [0.0] * n
    keys = [()] * n
    data_ready = [0.0] * n
    waiting = [len(t.preds) for t in tasks]
    conn_free = {}
    arrived = {}  # connection -> arrivals of its tasks so far (for the FIFO credits)
    lane_free = {}  # resource -> free time per lane
    order = {}

    def key(i):
        if variant == "remaining":
            return (-remaining[i], travelled[i], turns[i], i)
        return (travelled[i], -remaining[i], turns[i], i)

    for t in tasks:
        for r in t.resources:
            if r not in lane_free:
                lane_free[r] = [0.0] * lanes.get(r, 1)
    resource_names = list(lane_free)
    resource_lanes = [lane_free[r] for r in resource_names]
    resource_index = {r: x for x, r in enumerate(resource_names)}
    queue_of = {}
    queue = [queue_of.setdefault((t.conn, t.overhead_us, t.flight_us, t.resources), len(queue_of)) for t in tasks]
    q_conn, q_overhead, q_flight, q_resources = [], [], [], []
    for conn, overhead_us, flight_us, resources in queue_of:
        q_conn.append(conn)
        q_overhead.append(overhead_us)
        q_flight.append(flight_us)
        q_resources.append([resource_index[r] for r in resources])
    pending = [[] for _ in q_conn]  # per queue: (data ready, key, task) of tasks that would wait for data
    eligible = [[] for _ in q_conn]  # per queue: (key, task) of tasks that could start as soon as the queue
    version = [0] * len(q_conn)  # an entry of a queue's older version (on the heap or parked) is stale
    parked = [[] for _ in resource_names]  # per resource: (-overhead, key, queue, version)
    r_version = [0] * len(resource_names)
    heap = []  # (start or its lower bound, key, 0, queue, version) or (..., 1, resource, version)

    def head(q):
        """(start, data start, task, resource or -1) of queue q's next task: its sends begin after the
        connection is free and a FIFO credit came back, its data when a lane of every resource is free
        too; the resource is the one whose lane it waits for, if any."""
        c, o = q_conn[q], q_overhead[q]
        free = conn_free.get(c, 0.0)
        done = arrived.get(c)
        if fifo_depth and done and len(done) >= fifo_depth:
            # the FIFO holds `fifo_depth` sends: wait until one was received and its credit came back
            free = max(free, done[len(done) - fifo_depth] + q_flight[q])
        gate, bind = free + o, -1
        for r in q_resources[q]:
            earliest = min(resource_lanes[r])
            if earliest > gate:
                gate, bind = earliest, r
        wait, ready = pending[q], eligible[q]
        while wait and wait[0][0] + o <= gate:
            _, k, i = heapq.heappop(wait)
            heapq.heappush(ready, (k, i))
        if ready:
            return gate - o, gate, ready[0][1], bind
        data = wait[0][0] + o
        return data - o, data, wait[0][2], -1

    def first_parked(r):
        """The first live entry parked on resource r (dropping stale ones), or None."""
        waiters = parked[r]
        while waiters and waiters[0][3] != version[waiters[0][2]]:
            heapq.heappop(waiters)
        return waiters[0] if waiters else None

    def announce(r):
        """Put resource r on the heap (again) for the queues parked on it."""
        r_version[r] += 1
        first = first_parked(r)
        if first is not None:
            neg_overhead, k, _, _ = first
            heapq.heappush(heap, (_ps(min(resource_lanes[r]) + neg_overhead), k, 1, r, r_version[r]))

    def wait(q, real, i, bind):
        """Queue q, whose head is task i starting at `real`, waits on the heap, or parked on resource
        `bind` if that start is its earliest free lane."""
        if bind < 0 or pending[q]:
            # a queue with tasks still waiting for data may find a better head as the lane frees later:
            # its place among the parked would be wrong
            heapq.heappush(heap, (_ps(real), key(i), 0, q, version[q]))
            return
        entry = (-q_overhead[q], key(i), q, version[q])
        heapq.heappush(parked[bind], entry)
        if parked[bind][0] is entry:
            announce(bind)

    def push(q):
        version[q] += 1
        if pending[q] or eligible[q]:
            real, _, i, bind = head(q)
            wait(q, real, i, bind)

    for t in tasks:
        if not t.preds:
            pending[queue[t.id]].append((0.0, key(t.id), t.id))
    for q in range(len(q_conn)):
        heapq.heapify(pending[q])
        push(q)
    scheduled = 0
    while heap:
        est, k, on_resource, ident, v = heapq.heappop(heap)
        if on_resource:
            r = ident
            first = first_parked(r) if v == r_version[r] else None
            if first is None:
                continue
            q = first[2]
        else:
            q = ident
            if v != version[q]:
                continue
        real, data, i, bind = head(q)
        if _ps(real) > est or key(i) != k:  # a resource's key may be its parked queues' earlier best
            if not on_resource:
                wait(q, real, i, bind)
            elif bind != r:
                heapq.heappop(parked[r])
                wait(q, real, i, bind)
                announce(r)
            else:
                announce(r)  # q still waits on this resource, now at a later time
            continue
        if eligible[q] and eligible[q][0][1] == i:
            heapq.heappop(eligible[q])
        else:
            heapq.heappop(pending[q])
        if on_resource:
            heapq.heappop(parked[r])
        t = tasks[i]
        scheduled += 1
        if tick is not None and not scheduled & 1023:
            tick(scheduled)
        c = q_conn[q]
        sent = data + t.beta_us
        start[i], finish[i] = real, sent + q_flight[q]
        conn_free[c] = sent
        arrived.setdefault(c, []).append(finish[i])
        held = [c]
        for name in t.resources:
            fl = lane_free[name]
            # best fit: the lane freed last before the data starts (lanes freed earlier stay for others),
            # the first of equals
            best, latest, limit = 0, -1.0, data + 1e-12
            for x, free in enumerate(fl):
                if latest < free <= limit:
                    best, latest = x, free
            fl[best] = sent
            held.append((name, best))
        keys[i] = tuple(held)
        for h in held:
            order.setdefault(h, []).append(i)
        woken = {q}
        for s in succs[i]:
            data_ready[s] = max(data_ready[s], finish[i] + tasks[s].sync_us)
            waiting[s] -= 1
            if waiting[s] == 0:
                heapq.heappush(pending[queue[s]], (data_ready[s], key(s), s))
                woken.add(queue[s])
        for w in woken:
            push(w)
        if on_resource:
            announce(r)
    return Schedule(start, finish, order, max(finish, default=0.0), variant, keys)


def rotation_turns(tasks, gpus_per_node: int, nodes: int, targets: list | None = None) -> list:
    """Per task, how far forward (nodes first, then GPUs of a node) its chunk's target lies from its source,
    then its destination: among tasks equal by priority, the nearest first. Every rank then takes the same
    turn of the ring (rank r's reductions for node n+1 before those for n+2, its sends to r+1 before r+2),
    as the topology's rotations map one rank's choices onto another's. `targets`: per chunk, the rank it
    moves towards (`taccl.phases.chunk_targets`; None: the task's destination). By task id alone, every
    rank took the lowest-numbered target first: on 16 DGX H100 every node reduced and sent node 0's share
    first and node 15's last, and node 15 finished a 1 GB AllReduce 2.1 ms after node 0."""
    g = gpus_per_node

    def ahead(a, b):
        return ((b // g - a // g) % nodes, (b % g - a % g) % g)

    out = []
    for t in tasks:
        target = targets[t.chunk] if targets is not None and targets[t.chunk] is not None else t.dst
        out.append(ahead(t.src, target) + ahead(t.src, t.dst))
    return out


# above this many tasks one variant is scheduled, not four (a 1024-GPU AllReduce: 2.1 M tasks, 75-90 s each)
ALL_VARIANTS_MAX_TASKS = 500_000


def best_schedule(tasks, lanes: dict | None = None, fifo_depth: int = 0, turns: list | None = None,
                  report=SILENT) -> Schedule:
    """Both priority variants, each also with `turns` as the tie-break when given; the shortest schedule
    wins, the earlier on ties (deterministic). Neither tie-break wins everywhere: the turns take 9% off a
    16-node DGX H100 AllReduce's schedule and add 9% to a 2-node one's. Above `ALL_VARIANTS_MAX_TASKS`
    only "remaining" runs, with the turns when given (on 128 DGX H100 it was the best of the four for
    ReduceScatter and AllReduce, and tied for AllGather). Progress goes to `report`."""
    best = None
    runs = [(tie, variant) for tie in ((None, turns) if turns is not None else (None,))
            for variant in ("remaining", "travelled")]
    if len(tasks) > ALL_VARIANTS_MAX_TASKS:
        runs = runs[-2:-1]  # "remaining", with the turns where there are some
    progress = report.progress("ordering", len(runs) * len(tasks), "transfers placed (all variants)")
    for k, (tie, variant) in enumerate(runs):
        offset = k * len(tasks)
        s = list_schedule(tasks, variant, lanes, fifo_depth, tie, tick=lambda n: progress.update(offset + n))
        if tie is not None:
            s.variant += "+turns"
        if best is None or s.makespan_us < best.makespan_us - 1e-9:
            best = s
    return best
