"""The ordering heuristic's list schedule against its definition: at every step, among the tasks whose
predecessors have arrived, the one that can start first (to the picosecond) goes, ties broken by priority.
The heuristic only keeps queues and parked resources on its heap; the reference below re-evaluates every
ready task at every step."""
import random

import pytest

from taccl.ordering import Task, _priorities, list_schedule


def reference_schedule(tasks, variant, lanes, fifo_depth, turns):
    remaining, travelled, succs = _priorities(tasks)
    lane_free = {r: [0.0] * lanes.get(r, 1) for t in tasks for r in t.resources}
    conn_free, arrived, data_ready = {}, {}, [0.0] * len(tasks)
    waiting = [len(t.preds) for t in tasks]
    ready = {t.id for t in tasks if not t.preds}
    start, finish = [0.0] * len(tasks), [0.0] * len(tasks)

    def priority(i):
        if variant == "remaining":
            return (-remaining[i], travelled[i], turns[i], i)
        return (travelled[i], -remaining[i], turns[i], i)

    def data_start(t):
        free = conn_free.get(t.conn, 0.0)
        done = arrived.get(t.conn, [])
        if fifo_depth and len(done) >= fifo_depth:
            free = max(free, done[-fifo_depth] + t.flight_us)
        return max([max(data_ready[t.id], free) + t.overhead_us] + [min(lane_free[r]) for r in t.resources])

    while ready:
        i = min(ready, key=lambda j: (round(data_start(tasks[j]) - tasks[j].overhead_us, 6), priority(j)))
        ready.remove(i)
        t = tasks[i]
        data = data_start(t)
        sent = data + t.beta_us
        start[i], finish[i] = data - t.overhead_us, sent + t.flight_us
        conn_free[t.conn] = sent
        arrived.setdefault(t.conn, []).append(finish[i])
        for r in t.resources:
            fl = lane_free[r]
            fl[max((x for x in range(len(fl)) if fl[x] <= data + 1e-12), key=lambda x: (fl[x], -x))] = sent
        for s in succs[i]:
            data_ready[s] = max(data_ready[s], finish[i] + tasks[s].sync_us)
            waiting[s] -= 1
            if waiting[s] == 0:
                ready.add(s)
    return start, finish


def random_tasks(rng, n):
    """Tasks between 5 ranks over links that share switch ports and NICs, two costs per link (copies and
    reductions), dependencies on earlier tasks; costs on a coarse grid so that starts often tie."""
    tasks = []
    for i in range(n):
        src, dst = rng.sample(range(5), 2)
        reduce = rng.random() < 0.3
        resources = (("out", src % 3), ("in", dst)) if rng.random() < 0.7 else (("nic", src // 2),)
        preds = rng.sample(range(i), min(i, rng.choice([0, 0, 1, 2]))) if i else []
        tasks.append(Task(i, i, src, dst, "reduce" if reduce else "copy", alpha_us=rng.choice([0.5, 1.0]),
                          beta_us=rng.choice([1.0, 2.0, 0.1 + 0.2]), resources=resources, link_type="l",
                          internode=False, preds=preds, busy_us=0.25 if reduce else None,
                          sync_us=rng.choice([0.0, 0.0, 0.7])))
    return tasks


def exchange_tasks(rng, ranks=8, chunks=3):
    """An AllToAll's shape: every rank sends `chunks` chunks to every other over its out-port and the
    receiver's in-port, equal in cost and mostly in priority; half of them forward a chunk the sender
    received, so queues fill while others wait for a port, and starts tie across ports."""
    tasks = []
    for c in range(chunks):
        for src in range(ranks):
            for dst in rng.sample([d for d in range(ranks) if d != src], ranks - 1):
                into = [t.id for t in tasks if t.dst == src]
                preds = [rng.choice(into)] if into and rng.random() < 0.5 else []
                tasks.append(Task(len(tasks), c, src, dst, "copy", alpha_us=1.0, beta_us=2.0,
                                  resources=(("out", src), ("in", dst)), link_type="l", internode=False, preds=preds))
    return tasks


@pytest.mark.parametrize("seed", range(12))
def test_list_schedule_follows_its_definition(seed):
    rng = random.Random(seed)
    tasks = random_tasks(rng, 160) if seed % 2 else exchange_tasks(rng)
    lanes = {r: rng.choice([1, 2, 3]) for t in tasks for r in t.resources}
    turns = [rng.randrange(3) for _ in tasks]
    for variant in ("remaining", "travelled"):
        for fifo_depth in (0, 2):
            got = list_schedule(tasks, variant, lanes, fifo_depth, turns)
            want_start, want_finish = reference_schedule(tasks, variant, lanes, fifo_depth, turns)
            assert got.start == want_start and got.finish == want_finish, (variant, fifo_depth)
            assert got.makespan_us == max(want_finish)


def test_past_the_size_cap_one_variant_is_scheduled(monkeypatch):
    # four list schedules of a million tasks take minutes: above the cap only "remaining" runs, with the turns
    import taccl.ordering as ordering

    tasks = exchange_tasks(random.Random(3))
    turns = [t.dst for t in tasks]
    calls = []
    original = ordering.list_schedule

    def counted(tasks, variant, *a, **kw):
        calls.append(variant)
        return original(tasks, variant, *a, **kw)

    monkeypatch.setattr(ordering, "list_schedule", counted)
    assert ordering.best_schedule(tasks, turns=turns) is not None and len(calls) == 4
    calls.clear()
    monkeypatch.setattr(ordering, "ALL_VARIANTS_MAX_TASKS", len(tasks) - 1)
    assert ordering.best_schedule(tasks, turns=turns).variant == "remaining+turns" and calls == ["remaining"]
