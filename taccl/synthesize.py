"""The synthesizer: sketch + topology + collective -> timed Algorithm, in three stages (TACCL section 5).

    problem = build_problem(...)          what the sketch allows, symmetry group
    routing = route(problem)              stage 1: routing MILP (bandwidth relaxed)
    tasks   = transfer tasks from routes  (combining collectives: inverse AllGather trees, TACCL section 5.3)
    sched   = best_schedule(tasks)        stage 2: greedy ordering heuristic
    groups  = contiguity(tasks, sched)    stage 3: contiguity and exact scheduling MILP
    verify(algorithm)                     transfer-level proof of the postcondition

Combining collectives are synthesized directly: ReduceScatter reverses the AllGather trees (every rank
sends its partial sum of a chunk towards the chunk's owner once it has received its subtree's partials) and
is ordered and scheduled again; AllReduce is that ReduceScatter followed, chunk by chunk, by the AllGather
along the same trees (a chunk's AllGather starts as soon as its own reduction is complete, not after the
whole ReduceScatter). Reduce is the inverse of Broadcast.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

from . import solver as milp
from .algorithm import Algorithm, Transfer, collective_to_json, verify
from .bounds import custom_lower_bound, custom_lower_bounds, lower_bound, lower_bounds
from .budget import check_memory, check_shape_memory
from .collectives import NAMES, Collective, canonical_name, check_known, load_custom_collective, make_collective
from .contiguity import contiguity
from .errors import UserError
from .ordering import Task, best_schedule, rotation_turns
from .phases import chunk_targets, plan_phases, relocate
from .problem import Problem, build_problem
from .program import MAX_NODES, Proto
from .progress import SILENT
from .routing import route
from .sketch import DEFAULT_INPUT_SIZE, Sketch, load_sketch
from .topology import Topology, check_node_connected, load_spec
from .units import parse_size

DEFAULT_TIME_LIMIT_S = 120.0
# Stop a MILP stage whose best solution has not improved for this long. Past the first seconds, the routing
# MILP's improvements are a percent or two of a relaxed makespan that ordering and lowering then move by
# tens of percent, and the contiguity MILP's start is usually its final answer: a minute spent proving
# little (2x DGX-2 AllGather: 65 s, 31.8 against the start's 32.2 us; 2x NDv2 AllToAll contiguity: 60 s for
# no change past 1e-9).
DEFAULT_STALL_S = 3.0


@dataclass
class SynthesisOptions:
    # The MILP solver and its settings (limits per stage). None: the sketch's "solver" setting, else the
    # default; a value here (the command line's) wins over the sketch.
    solver: str | None = None  # default highs
    time_limit_s: float | None = None  # default DEFAULT_TIME_LIMIT_S
    stall_s: float | None = None  # stop once the best solution stalls this long (0: never); default DEFAULT_STALL_S
    threads: int | None = None  # default 1
    seed: int = 0
    max_extra_hops: int | None = None  # None: the sketch's, else 1 (0 for problems with many chunks)
    merge_links: str | None = None  # None: the sketch's ("internode" by default)
    proto: str | None = None  # runtime protocol to cost links for and lower with (None: the sketch's, Simple)
    instances: int | None = None  # thread blocks per connection when lowered (None: the sketch's, 1)
    max_memory_bytes: int | None = None  # refuse problems estimated larger (None: this machine's memory)
    max_memory_source: str = "--max-memory"  # where that limit comes from, for the refusal


def sketch_topology_spec(sketch: Sketch, topology=None):
    """The TopologySpec a sketch is solved on: `topology` (--topology) if given, else the sketch's."""
    topo_name = topology or sketch.topology
    if not topo_name:
        raise UserError("the sketch names no topology: add \"topology\" to it or pass --topology", path=sketch.path, where="$")
    return load_spec(topo_name, source=sketch.path, where="$.topology" if not topology else "--topology")


def resolve(sketch: Sketch, *, topology=None, nodes=None, collective=None, input_size=None,
            max_memory_bytes: int | None = None, max_memory_source: str = "--max-memory"):
    """Apply command-line overrides to a sketch; return (Topology, Collective, input_size_bytes). A built-in
    collective too large to synthesize within `max_memory_bytes` (None: this machine's memory) is refused
    before it is built."""
    spec = sketch_topology_spec(sketch, topology)
    n = nodes or sketch.nodes or 1
    topo = Topology(spec, n)
    check_node_connected(spec)
    name = collective or sketch.collective or "allgather"
    custom = custom_collective_file(sketch, collective)
    if custom:
        coll = load_custom_collective(custom, topo.num_ranks)
    else:
        if collective:
            check_known(name, where="--collective")
        else:
            check_known(name, path=sketch.path, where="$.collective")
        check_shape_memory(name, topo.num_ranks, sketch.chunkup, max_memory_bytes, form=sketch.allreduce_form,
                           path=sketch.path, source=max_memory_source)
        coll = sketch_collective(sketch, name, topo)
    if coll.combining:
        _check_reversible(spec)
    if input_size is not None:
        size = parse_size(input_size, where="--size")
    else:
        size = sketch.input_size_bytes or parse_size(DEFAULT_INPUT_SIZE)
    where = dict(where="--size") if input_size is not None else dict(path=sketch.path, where="$.input_size")
    if size <= 0:
        raise UserError("input size must be positive", **where)
    chunks = coll.buffer_chunks
    if size < chunks:  # (a size that is no multiple of the chunks is costed as it is, as nccl-tests rounds it)
        raise UserError(f"{size} bytes are less than a byte for each of the {chunks} chunks of this {coll.name} on "
                        f"{topo.num_ranks} ranks: expected at least {chunks} bytes", **where)
    return topo, coll, size


def _check_reversible(spec) -> None:
    """Reductions are synthesized as reversed AllGather (Broadcast) trees, which send back along every link
    they use: a one-way link stops them (found late, after the routing MILP, and blamed on no file)."""
    both = {(s, d) for s, d, _ in spec.links}
    for s, d, _ in spec.links:
        if (d, s) not in both:
            raise UserError(f"link {s}->{d} is one-way (\"bidirectional\": false): reductions are synthesized as "
                            f"reversed trees, which need every link both ways (`taccl baseline ring` builds them on "
                            f"one-way rings)", path=spec.path, where="$.links")


def custom_collective_file(sketch: Sketch, collective: str | None = None) -> str | None:
    """The file of the user-defined collective to synthesize: `collective` (--collective) when it names a
    JSON file, else, when no `collective` overrides it, the sketch's own; None for a built-in collective."""
    if collective:
        return collective if collective.endswith(".json") else None
    if sketch.collective_file:
        return sketch.collective_file
    return sketch.collective if sketch.collective and sketch.collective.endswith(".json") else None


def sketch_collective(sketch: Sketch, name: str, topo) -> Collective:
    """The built-in collective `name` on `topo`'s ranks with the sketch's chunk-up, root and (for AllReduce)
    form. A phased AllReduce over several nodes lays its buffer out in blocks by local index (see
    `make_collective`'s `local_blocks`): a node phase then moves contiguous blocks."""
    allreduce = canonical_name(name) == "allreduce"
    form = sketch.allreduce_form if allreduce else ""
    blocks = (topo.gpus_per_node if allreduce and form in ("", "reduce-broadcast") and sketch.phases
              and topo.nodes > 1 and topo.gpus_per_node > 1 else 0)
    if not 0 <= sketch.collective_root < topo.num_ranks:
        raise UserError(f"root {sketch.collective_root} is not a rank of the {topo.num_ranks} ranks "
                        f"({topo.nodes} node(s) of {topo.gpus_per_node} GPUs)", path=sketch.path,
                        where="$.collective.root")
    return make_collective(name, topo.num_ranks, sketch.chunkup, root=sketch.collective_root, form=form,
                           local_blocks=blocks)


def _link_info(prob: Problem, src: int, dst: int):
    """(alpha, beta, resources, type, internode, sender's share of alpha) of the path src->dst: the sketch's
    link, else the physical one."""
    li = prob.link_index.get((src, dst))
    if li is not None:
        l = prob.links[li]
        return l.alpha_us, l.beta_us, l.resources, l.type, l.internode, l.sender_us - l.beta_us
    if prob.topology.link(src, dst) is None:
        raise UserError(f"the reverse of link {dst}->{src} does not exist in topology {prob.topology.name!r}, "
                        f"so its reduction cannot be routed back")
    alpha, beta, res, lanes, phys, busy = prob.path_cost(src, dst)
    for r in res:
        if lanes > 1:
            prob.lanes.setdefault(r, lanes)
    return alpha, beta, res, phys.type.name, phys.kind == "net", busy


def _resources(prob: Problem, src: int, dst: int):
    """(alpha, sender's share of it, [(shared resource, lanes)]) of the path src->dst, for `algorithm.verify`."""
    alpha, _, res, _, _, busy = _link_info(prob, src, dst)
    return alpha, busy, [(r, prob.lanes.get(r, 1)) for r in res]


def build_tasks(prob: Problem, coll: Collective, parent: list) -> list:
    """Transfer tasks with data dependencies, from per-chunk routes of the (dual) collective."""
    tasks = []

    def add(c, src, dst, op, preds):
        alpha, beta, res, ltype, inter, busy = _link_info(prob, src, dst)
        tasks.append(Task(len(tasks), c, src, dst, op, alpha, beta, res, ltype, inter, list(preds), busy))
        return tasks[-1].id

    for c, par in enumerate(parent):
        children = {}
        for v, li in par.items():
            children.setdefault(prob.links[li].src, []).append(v)
        if not coll.combining:
            into = {}

            def forward(u):
                for v in sorted(children.get(u, [])):
                    into[v] = add(c, u, v, "copy", [into[u]] if u in into else [])
                    forward(v)

            for s in coll.sources(c):
                forward(s)
            continue
        if coll.form == "exchange":
            # an AllReduce inside a phase's groups (`taccl.phases`): every member sends its partial sum to
            # every other and adds the ones it gets, instead of a reduction to one and the sum sent back;
            # each sum it gets is added once its own sends left (they carry its partial sum alone)
            # (the routed tree's members: those it reaches first, then its root, as pairs always were)
            members = sorted(par) + sorted({prob.links[li].src for li in par.values()} - set(par))
            missing = next(((u, v) for u in members for v in members if u != v and (u, v) not in prob.link_index
                            and prob.topology.link(u, v) is None), None)
            if missing:
                raise UserError(f"an exchange sends between every two members of a group, but topology "
                                f"{prob.topology.name!r} has no link {missing[0]}->{missing[1]}",
                                path=prob.sketch.path, where="$.phases")
            sent = {u: [add(c, u, v, "reduce", []) for v in members if v != u] for u in members}
            for u in members:
                for i in sent[u]:
                    tasks[i].exchange = tuple(sent[tasks[i].dst])
            continue
        # Reduction towards the tree's root: v sends its partial to its parent after its children did.
        roots = [s for s in prob.collective.sources(c)]
        up = {}

        def reduce_up(v):
            preds = []
            for w in sorted(children.get(v, [])):
                reduce_up(w)
                preds.append(up[w])
            if v in par:
                up[v] = add(c, v, prob.links[par[v]].src, "reduce", preds)
            return preds

        for root in roots:
            at_root = reduce_up(root)
            if coll.name == "allreduce" and coll.form != "one-shot":  # the sum back to every rank
                into = {}

                def forward(u):
                    for v in sorted(children.get(u, [])):
                        into[v] = add(c, u, v, "copy", [into[u]] if u in into else at_root)
                        forward(v)

                forward(root)
    return tasks


def _node_excess(tasks, topo) -> float:
    """The busiest rank's transfers, one XML step each, plus the algo and gpu elements, over the executor's
    MAX_NODES (a forward fused with its receive is one step, so this can overcount; the lowering decides)."""
    steps = [0] * topo.num_ranks
    for t in tasks:
        steps[t.src] += 1
        steps[t.dst] += 1
    return (1 + topo.num_ranks + max(steps, default=0)) / MAX_NODES


def _group_chunks(excess: float) -> int:
    """Chunks per greedy send for a rank `excess` times over the node limit: the smallest power of two of at
    least twice that (room for the flag waits' nops), 2 to 64. Larger sends than needed cost pipelining
    between phases and bandwidth: a connection with fewer steps is lowered onto fewer thread blocks (16x DGX
    H100 AllReduce with the limit lowered, 256 MiB: 1723 us unmerged, 2304 at 4 chunks, 3307 at 64)."""
    g = 2
    while g < 2 * excess and g < 64:
        g *= 2
    return g


def _buffer_index(coll: Collective):
    """(chunk, rank, at the source?) -> the chunk's index in that rank's input or output buffer, or None."""

    def index(c, rank, at_source):
        if (c, rank) in coll.input_index and at_source:
            return coll.input_index[(c, rank)]
        if (c, rank) in coll.output_index:
            return coll.output_index[(c, rank)]
        return None  # relayed through scratch, which the lowering lays out in send order

    return index


def _adjacency(coll: Collective, merge_links: str):
    """Whether two tasks may be sent as one: the link policy, and contiguous chunks in both buffers."""
    index = _buffer_index(coll)

    def adjacent(t, u):
        if merge_links == "none" or (merge_links == "internode" and not t.internode):
            return False
        for rank, at_source in ((t.src, True), (t.dst, False)):
            a, b = index(t.chunk, rank, at_source), index(u.chunk, rank, at_source)
            if a is not None and b is not None and b != a + 1:
                return False
            if (a is None) != (b is None):
                return False
        return True

    return adjacent


def synthesize(sketch: Sketch, *, topology=None, nodes=None, collective=None, input_size=None,
               options: SynthesisOptions | None = None, report=SILENT, name: str | None = None) -> Algorithm:
    options = options or SynthesisOptions()
    topo, coll, size = resolve(sketch, topology=topology, nodes=nodes, collective=collective, input_size=input_size,
                               max_memory_bytes=options.max_memory_bytes, max_memory_source=options.max_memory_source)
    check_memory(coll, options.max_memory_bytes, path=sketch.path, source=options.max_memory_source)
    run = _Run(sketch, options)
    stages = build_problems(sketch, topo, coll, size, proto=options.proto, instances=options.instances)
    tasks = []
    writers = {}  # (chunk, rank) -> the transfers whose arrivals make up that rank's copy of the chunk
    for k, (prob, task_coll, plan) in enumerate(stages):
        if plan is None:
            tasks = run.route_tasks(prob, task_coll, report)[1]
            continue
        report(f"phase {k + 1}/{len(stages)}: {plan.name}")
        try:
            _, phase_tasks = run.route_tasks(prob, task_coll, report, phase=plan.name)
        except UserError as exc:
            raise relocate(exc, plan.doc, plan.where) from None
        tasks += _chain(phase_tasks, len(tasks), writers)
    prob = stages[0][0] if len(stages) == 1 else _merged([p for p, _, _ in stages])
    folds = _set_sync(tasks, topo.spec, prob.chunk_bytes / prob.instances)
    t0 = time.monotonic()
    depth = Proto(prob.proto).fifo_depth
    turns = rotation_turns(tasks, topo.spec.gpus_per_node, topo.nodes, chunk_targets(coll))
    sched = best_schedule(tasks, prob.lanes, depth, turns, report=report)
    run.stages.append({"stage": "ordering", "tasks": len(tasks), "time_s": round(time.monotonic() - t0, 3),
                       "status": "heuristic", "variant": sched.variant, "objective": sched.makespan_us})
    report(f"ordering: {len(tasks)} transfers, greedy schedule {sched.makespan_us:.2f} us ({sched.variant} first)")
    merge = options.merge_links or sketch.merge_links
    # where one transfer a step could not fit the executor, merge greedily (not by the MILP), on every link the
    # sketch does not forbid (its "internode" default is there to keep the MILP small)
    # (with several instances the lowering cuts every send back into single chunks: nothing to gain)
    coalesce = None
    excess = _node_excess(tasks, topo)
    if excess > 1 and prob.instances == 1:
        index = _buffer_index(coll)
        coalesce = (_adjacency(coll, "all" if merge != "none" else merge),
                    lambda t: (index(t.chunk, t.src, True) or 0, t.chunk), _group_chunks(excess))
    cont = contiguity(tasks, sched, _adjacency(coll, merge), solver=run.solver, options=run.milp_opts, report=report,
                      fifo_depth=depth, coalesce_with=coalesce)
    run.stages.append(cont.stats)
    algo = _to_algorithm(sketch, topo, coll, size, prob, tasks, cont, name, sched)
    _fold_tails(algo, folds)
    algo.stages = run.routing_stages() + run.stages
    algo.notes += run.notes
    _finish(algo, topo, coll, size, prob)
    verify(algo, coll, lambda s, d: _resources(prob, s, d))
    # the schedule runs each connection on one thread block where the lowering spreads it over several:
    # an estimate, often well above the written program's simulated time (which `taccl solve` reports next)
    ratio = algo.time_us / algo.lower_bound_us if algo.lower_bound_us else float("nan")
    report(f"done: schedule {algo.time_us:.2f} us (the synthesizer's estimate), lower bound "
           f"{algo.lower_bound_us:.2f} us ({ratio:.2f}x)")
    return algo


def build_problems(sketch: Sketch, topo, coll: Collective, size, *, proto=None, instances=None) -> list:
    """The sub-problems a synthesis solves, before any solving: [(Problem, collective its transfers do, phase
    plan or None)], one per phase, or one for a flat sketch. A sketch or phase that does not fit raises
    `UserError` naming its place."""
    if not sketch.phases:
        route_coll = coll.dual() if coll.combining else coll
        return [(build_problem(topo, route_coll, sketch, size, proto=proto, instances=instances, task=coll), coll,
                 None)]
    out = []
    for plan in plan_phases(sketch, topo, coll):
        try:
            prob = build_problem(topo, plan.route_coll, plan.sketch, size, proto=proto, instances=instances,
                                 scope=plan.groups, task=plan.task_coll)
        except UserError as exc:
            raise relocate(exc, plan.doc, plan.where) from None
        out.append((prob, plan.task_coll, plan))
    return out


class _Run:
    """Solver settings and the statistics of one synthesis (one routing per phase)."""

    def __init__(self, sketch: Sketch, options: SynthesisOptions):
        self.sketch, self.options = sketch, options
        self.solver = options.solver or sketch.solver or "highs"
        stall = next(s for s in (options.stall_s, sketch.stall_s, DEFAULT_STALL_S) if s is not None)
        self.milp_opts = milp.SolveOptions(time_limit_s=options.time_limit_s or sketch.time_limit_s or DEFAULT_TIME_LIMIT_S,
                                           threads=options.threads or sketch.threads or 1, seed=options.seed,
                                           stall_s=stall or None)
        self.routings, self.stages, self.notes = [], [], []

    def route_tasks(self, prob: Problem, task_coll: Collective, report, phase: str | None = None):
        """Stage 1 on `prob`, then the transfer tasks of `task_coll` along its routes."""
        report(f"problem: {prob.describe()}")
        hops = self.options.max_extra_hops
        if hops is None:
            hops = prob.sketch.max_extra_hops
        if hops is None:
            hops = 1 if prob.collective.num_chunks * len(prob.links) // max(1, len(prob.group)) <= 200_000 else 0
        routing = route(prob, solver=self.solver, options=self.milp_opts, max_extra_hops=hops, report=report)
        if phase is not None:
            routing.stats["phase"] = phase
        self.routings.append(routing.stats)
        if routing.method == "heuristic":
            self.notes.append(routing.stats.get("fallback", "heuristic routing") +
                              (f" in phase {phase}" if phase else ""))
        return routing, build_tasks(prob, task_coll, routing.parent)

    def routing_stages(self) -> list:
        """One routing stage; with phases, their sums (sizes, time) and the worst status, each phase kept."""
        if len(self.routings) == 1:
            return self.routings
        worst = {"optimal": 0, "feasible": 1}
        out = {"stage": "routing", "phases": self.routings}
        for k in ("variables", "constraints", "binaries", "time_s"):
            out[k] = round(sum(r.get(k, 0) for r in self.routings), 3)
        out["status"] = max((r.get("status", "") for r in self.routings), key=lambda st: worst.get(st, 2))
        out["gap"] = max((r.get("gap") or 0.0 for r in self.routings), default=0.0)
        out["objective"] = sum(r.get("objective") or 0.0 for r in self.routings)
        return [out]


def _set_sync(tasks: list, spec, chunk_bytes: float) -> dict:
    """What a task waits for after its predecessors arrived, in the lowered program: nothing when it
    forwards what one transfer brought and is that transfer's only reader (one fused step,
    `taccl.lowering.fusion`), else another thread block's flag (``sync_us``); after several reductions into
    its chunk, also the local pass that folds them in (`taccl.lowering.buffers` receives them aside: one
    run of reductions over k partials moves the chunk, `chunk_bytes` per instance, (k + 2) / 2 times at
    one block's local bandwidth).
    Returns {(chunk, rank): delay} for such folds that no task reads (a reduction's last stop): they end
    the collective."""
    readers = {}
    for t in tasks:
        for p in t.preds:
            readers[p] = readers.get(p, 0) + 1
    local_bw = spec.local_bw_GBps or 400.0

    def fold_us(k):
        return (k + 2) / 2 * chunk_bytes / (local_bw * 1000.0)

    converging = {}  # (chunk, rank) -> reductions into it
    for t in tasks:
        if t.op == "reduce":
            converging.setdefault((t.chunk, t.dst), []).append(t.id)
    for t in tasks:
        if not t.preds:
            continue
        if not (len(t.preds) == 1 and readers[t.preds[0]] == 1):
            t.sync_us = spec.sync_us
        into = converging.get((t.chunk, t.src), ())
        k = sum(1 for p in t.preds if p in into)
        if k >= 2:
            t.sync_us = spec.sync_us + fold_us(k)
    read = {(t.chunk, t.src) for t in tasks}
    return {key: spec.sync_us + fold_us(len(ids)) for key, ids in converging.items()
            if len(ids) >= 2 and key not in read}


def _chain(tasks: list, offset: int, writers: dict) -> list:
    """A phase's tasks renumbered after the earlier phases', each waiting for the arrivals that made up its
    source's copy of its chunk in earlier phases (chunk-level pipelining between phases); `writers` is
    updated with this phase's arrivals. A swapped partial sum is added only once the rank's own sends of the
    exchange left (`Transfer.exchange`), so a later reader of the sum waits for those too."""
    before = dict(writers)
    for t in tasks:
        t.id += offset
        t.preds = [p + offset for p in t.preds] + before.get((t.chunk, t.src), [])
        t.exchange = tuple(p + offset for p in t.exchange)
    touched = {}
    for t in sorted(tasks, key=lambda t: t.id):
        key = (t.chunk, t.dst)
        if t.op == "copy":  # the copy replaces what the rank held
            touched[key] = [t.id]
        else:  # a reduction adds to it
            touched[key] = touched.get(key, before.get(key, [])) + [t.id] + list(t.exchange)
    writers.update(touched)
    return tasks


def _merged(problems: list) -> Problem:
    """One Problem standing for the phases' (links, lanes) in schedule and verification."""
    first = problems[0]
    links, seen, lanes = [], set(), {}
    for p in problems:
        lanes.update(p.lanes)
        for l in p.links:
            if (l.src, l.dst) not in seen:
                seen.add((l.src, l.dst))
                links.append(l)
    merged = Problem(first.topology, first.collective, first.sketch, first.chunk_bytes, links, {}, [], [], [],
                     proto=first.proto, instances=first.instances, lanes=lanes)
    return merged


def _fold_tails(algo: Algorithm, folds: dict) -> None:
    """The collective ends no earlier than the local folds of its last reductions (see `_set_sync`)."""
    last = {}
    for t in algo.transfers:
        if t.op == "reduce":
            for c in t.chunks:
                last[(c, t.dst)] = max(last.get((c, t.dst), 0.0), t.arrive_us)
    for key, delay in folds.items():
        if key in last:
            algo.time_us = max(algo.time_us, last[key] + delay)


def _finish(algo: Algorithm, topo, coll, size, prob: Problem) -> None:
    """Protocol, instances, the runtime's call cost (every call pays it: part of the predicted time) and the
    lower bound of programs in that protocol."""
    algo.protocol, algo.instances, algo.block_steps = prob.proto, prob.instances, prob.sketch.block_steps
    algo.call_us = topo.spec.call_us.get(prob.proto, 0.0)
    algo.time_us += algo.call_us
    if canonical_name(coll.name) in NAMES:
        algo.lower_bounds = lower_bounds(topo, coll.name, size, root=coll.root or 0, proto=prob.proto)
        algo.lower_bound_us = lower_bound(topo, coll.name, size, root=coll.root or 0, proto=prob.proto)
    else:  # a user-defined collective: bounded from its pre- and postcondition
        algo.lower_bounds = custom_lower_bounds(topo, coll, prob.chunk_bytes, prob.proto)
        algo.lower_bound_us = custom_lower_bound(topo, coll, prob.chunk_bytes, prob.proto)


def _to_algorithm(sketch, topo, coll, size, prob, tasks, cont, name, sched) -> Algorithm:
    gid = {}
    for g_index, g in enumerate(cont.groups):
        for i in g.tasks:
            gid[i] = g_index
    after = _resource_order(prob, tasks, sched, gid, cont.groups)
    transfers = []
    for g_index, g in enumerate(cont.groups):
        first = tasks[g.tasks[0]]
        deps = sorted({gid[p] for i in g.tasks for p in tasks[i].preds} - {g_index})
        exchange = sorted({gid[p] for i in g.tasks for p in tasks[i].exchange})
        transfers.append(Transfer(id=g_index, chunks=tuple(tasks[i].chunk for i in g.tasks), src=first.src, dst=first.dst,
                                  op=first.op, send_us=g.start_us, arrive_us=g.finish_us, deps=tuple(deps),
                                  link=first.link_type, after=tuple(sorted(after.get(g_index, ()))),
                                  exchange=tuple(exchange)))
    return Algorithm(name=name or sketch.name, collective=collective_to_json(coll),
                     topology={"name": topo.name, "nodes": topo.nodes, "path": topo.spec.path},
                     input_size_bytes=size, chunk_bytes=prob.chunk_bytes, transfers=transfers,
                     time_us=cont.makespan_us, sketch=sketch.path)


# a resource-order dependency costs the runtime's flag latency on its channel: with one instance nothing covers
# it, so it is worth it after transfers this many times longer (see `_order_is_cheap`)
ORDER_MIN_RATIO = 8


def _order_is_cheap(beta_us: float, sync_us: float, instances: int) -> bool:
    """Whether sequencing a send behind one of ``beta_us`` (the whole chunk: the lowering cuts it into
    ``instances`` copies, one per channel) costs next to nothing. Each channel's chain waits a flag latency
    after each of its sends; the other channels' copies keep the resource busy meanwhile, and cover the wait
    once they take as long as it (traced at 16x DGX H100 AllGather, 64 MiB, four instances: 10.5 us sends
    left unordered went out in whatever order the blocks reached the NIC, 255 us against 200 ordered)."""
    if beta_us >= ORDER_MIN_RATIO * sync_us:
        return True
    return instances > 1 and beta_us * (instances - 1) / instances >= sync_us


def _resource_order(prob: Problem, tasks, sched, gid: dict, groups: list) -> dict:
    """group -> the groups of the same source just before it on a shared resource of one lane (a NIC): the
    runtime would share such a resource among thread blocks however it likes, so the lowering sequences them
    as scheduled (`Transfer.after`), where the earlier transfer is long enough that the dependency's flag
    latency does not matter (`_order_is_cheap`)."""
    out = {}
    sync = prob.topology.spec.sync_us
    for key, ids in sched.order.items():
        if key[0] == "conn" or prob.lanes.get(key[0], 1) > 1:
            continue
        seq = []
        for i in ids:
            if not seq or seq[-1] != gid[i]:
                seq.append(gid[i])
        for a, b in zip(seq, seq[1:]):
            ta, tb = tasks[groups[a].tasks[0]], tasks[groups[b].tasks[0]]
            # only where the sender has no share of the latency (a network send): waiting for the previous
            # send to finish then costs nothing the schedule did not already wait for
            cheap = _order_is_cheap(sum(tasks[i].beta_us for i in groups[a].tasks), sync, prob.instances)
            if ta.src == tb.src and ta.dst != tb.dst and tb.overhead_us == 0 and cheap:
                out.setdefault(b, set()).add(a)
    return out


def synthesize_file(path, **kw) -> Algorithm:
    return synthesize(load_sketch(path), **kw)


def default_name(sketch: Sketch, collective: str | None) -> str:
    base = Path(sketch.path).name.removesuffix(".json") if sketch.path else sketch.name
    base = sketch.name if sketch.name and sketch.name != "sketch" else base
    if collective and collective.endswith(".json"):  # a custom collective's file: its name, not its path
        collective = Path(collective).name.removesuffix(".json")
    return f"{base}-{collective}" if collective and collective != sketch.collective else base
