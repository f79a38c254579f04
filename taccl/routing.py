"""Stage 1: routing. Which links each chunk takes, with bandwidth relaxed (TACCL section 5, appendix B.1).

Formulation, per chunk c with sources P(c) and destinations D(c):
  x[c,l] in {0,1}   chunk c crosses link l = (u, v)
  t[c,v] >= 0       time c is available at v (0 on sources)
  in(c,v) = sum of x[c,l] over links into v:  = 1 on destinations, <= 1 elsewhere
  x[c,(u,v)] <= in(c,u)                       a rank forwards only what it received
  t[c,v] >= t[c,u] + cost(l) + sync fan[c,u] - M (1 - x[c,l]) with the tightest valid M: t is boxed in
                                              [LB, UB], where LB is the shortest-path time and UB the
                                              heuristic incumbent's makespan
  fan[c,u] in {0,1}, (outdeg(u) - 1) fan[c,u] >= sum of x[c,l] out of u - 1
                                              a relay u forwarding c to two ranks or more waits for another
                                              thread block's flag (`sync_us`) on each forward
  time >= t[c,d] for d in D(c)
  time >= sum over (c,l) on connection (u,v) of cost(l) x[c,l] + tail   (one thread block per connection)
  time >= sum over (c,l) using shared resource r of beta(l) x[c,l] / lanes(r) + tail(r)
                                              (relaxed bandwidth per switch port, NIC, direct link; the tail
                                              is the latency the last chunk still flies, see resource_tails)
  objective: time + gamma * (switch links used, uc-min > 0 / uc-max < 0) + epsilon * (transfers)
Then, with time capped at the optimum found, a short second solve minimises the sum of arrival times: among
routings of equal relaxed time, the one whose chunks arrive earliest leaves the ordering stage the least
idle time (an early-arriving routing schedules up to 20% shorter on 2x DGX-2).

Variables exist for one representative per symmetry orbit of (chunk, link) pairs (see symmetry.py), and
only for links on paths at most `max_extra_hops` longer than minimal. A greedy load-aware shortest-path
routing is the MIP start and the fallback when the solver finds nothing within its time limit.
"""
from __future__ import annotations

import heapq
from collections import defaultdict, deque
from dataclasses import dataclass, field, replace

from . import solver as milp
from .errors import UserError
from .problem import Problem
from .progress import SILENT
from .symmetry import Orbits

GAMMA_FRACTION = 1e-2  # uc-min / uc-max weight, relative to the cheapest link cost
EPSILON_FRACTION = 1e-4  # per-transfer tie-breaker, relative to the cheapest link cost
# The routing's makespan is a relaxation anyway: proving the tie-breaking terms optimal is not worth minutes.
ROUTING_REL_GAP = 1e-2
# The arrival-time solve's budget: this fraction of the stage's time limit, at most ARRIVAL_TIME_MAX_S, counted
# in the solver's own work (a loaded machine would otherwise stop it earlier, with another routing: a batch's
# programs depended on how many jobs ran beside them); the wall clock caps it at what the first solve left of
# the stage's limit
ARRIVAL_TIME_FRACTION = 0.1
ARRIVAL_TIME_MAX_S = 5.0


@dataclass
class Routing:
    parent: list  # parent[c] = {rank: link index that delivers chunk c to rank}
    relaxed_time_us: float
    method: str  # "milp" or "heuristic"
    stats: dict = field(default_factory=dict)


@dataclass
class _ChunkSpace:
    """A representative chunk's candidate links and the bounds of its arrival times."""

    sources: frozenset
    dests: frozenset
    links: list  # candidate link indices
    earliest: dict  # rank -> shortest-path arrival time


def _hops(prob, sources, allowed, reverse=False):
    dist = {s: 0 for s in sources}
    q = deque(sources)
    adj = prob.in_links if reverse else prob.out_links
    while q:
        u = q.popleft()
        for li in adj[u]:
            if li not in allowed:
                continue
            l = prob.links[li]
            v = l.src if reverse else l.dst
            if v not in dist:
                dist[v] = dist[u] + 1
                q.append(v)
    return dist


def _dijkstra(prob, sources, links, weight):
    """Shortest paths over `links` (a set of indices); returns (dist, parent link)."""
    dist, par = {s: 0.0 for s in sources}, {}
    heap = [(0.0, s) for s in sorted(sources)]
    allowed = links
    while heap:
        d, u = heapq.heappop(heap)
        if d > dist.get(u, float("inf")):
            continue
        for li in prob.out_links[u]:
            if li not in allowed:
                continue
            v = prob.links[li].dst
            nd = d + weight(li)
            if nd < dist.get(v, float("inf")) - 1e-12:
                dist[v], par[v] = nd, li
                heapq.heappush(heap, (nd, v))
    return dist, par


def chunk_space(prob: Problem, c: int, max_extra_hops: int) -> _ChunkSpace:
    coll = prob.collective
    sources = frozenset(coll.sources(c))
    dests = frozenset(r for (cc, r) in coll.postcondition if cc == c) - sources
    allowed = {li for li, l in enumerate(prob.links) if l.dst not in sources and prob.link_allowed(c, l)}
    fwd = _hops(prob, sources, allowed)
    for d in sorted(dests):
        if d not in fwd:
            why = " under the sketch's relay map" if prob.relay_senders else ""
            src = ", ".join(map(str, sorted(sources)))
            raise UserError(f"chunk {c} (from rank {src}) cannot reach rank {d} over the links the sketch allows{why}",
                            path=prob.sketch.path, where="$.internode_sketch")
    if len(dests) == 1:
        # A unicast: keep links on paths at most max_extra_hops longer than the shortest one.
        (d,) = dests
        back = _hops(prob, [d], allowed, reverse=True)
        limit = fwd[d] + max_extra_hops
        cand = [li for li in sorted(allowed)
                if prob.links[li].src in fwd and prob.links[li].dst in back
                and fwd[prob.links[li].src] + 1 + back[prob.links[li].dst] <= limit]
    else:
        # A multicast tree: a link may reach a rank at most max_extra_hops later than its hop distance.
        cand = [li for li in sorted(allowed)
                if prob.links[li].src in fwd and fwd[prob.links[li].src] + 1 <= fwd[prob.links[li].dst] + max_extra_hops]
    cset = set(cand)
    earliest, _ = _dijkstra(prob, sources, cset, lambda li: prob.links[li].cost_us)
    return _ChunkSpace(sources, dests, cand, earliest)


def heuristic_routing(prob: Problem, orbits: Orbits, spaces: dict) -> list:
    """Greedy, load-aware shortest-path trees, chosen per representative and copied to its orbit."""
    load = defaultdict(float)
    parent = [None] * prob.collective.num_chunks
    members = defaultdict(list)
    for c in range(prob.collective.num_chunks):
        members[orbits.rep[c]].append(c)
    mean_cost = sum(l.cost_us for l in prob.links) / max(1, len(prob.links))
    for r in orbits.reps:
        sp = spaces[r]
        cset = set(sp.links)
        scale = 1.0 / (mean_cost * max(1, len(sp.dests)) * 4)

        def weight(li):
            l = prob.links[li]
            return l.cost_us * (1.0 + scale * max(load[res] for res in l.resources))

        _, par = _dijkstra(prob, sp.sources, cset, weight)
        tree = {}
        for d in sp.dests:  # union of the paths to every destination
            v = d
            while v not in sp.sources and v not in tree:
                tree[v] = par[v]
                v = prob.links[par[v]].src
        for c in members[r]:
            g = orbits.from_rep[c]
            parent[c] = {g[v]: orbits.image_link(g, li) for v, li in tree.items()}
            for li in parent[c].values():
                for res in prob.links[li].resources:
                    load[res] += prob.links[li].cost_us
    return parent


def resource_loads(prob: Problem, link) -> list:
    """(resource, relaxed busy time) pairs one chunk over `link` adds: its connection for the sender's share
    of alpha plus beta, each shared resource for beta over its lanes (the ordering stage's model)."""
    out = [(("conn", link.src, link.dst), link.sender_us)]
    for res in link.resources:
        out.append((res, link.beta_us / prob.lanes.get(res, 1)))
    return out


def resource_tails(prob: Problem) -> dict:
    """Resource -> the least time a routing spends around its busy time: a chunk reaches the resource no
    sooner than its sender's share of alpha (a connection's own load already counts it) and the last one
    leaves it with the rest of alpha still in flight. Without it the relaxation lets the eight 4 KiB LL
    transfers into one DGX A100 NIC (2.62 us of data, 2.7 us in flight) finish in 2.95 us instead of 5.32."""
    tails = {}
    for l in prob.links:
        lead = l.sender_us - l.beta_us  # the sender's share of alpha
        flight = l.alpha_us - lead
        for res, _ in resource_loads(prob, l):
            own = flight if res[0] == "conn" else lead + flight
            tails[res] = min(tails.get(res, own), own)
    return tails


def fanout_sync_us(prob: Problem) -> float:
    """What a relay's forward waits for when the relay sends the chunk on to two ranks or more: another
    thread block's flag (one forward alone is fused into the receiving block; see `synthesize._set_sync`)."""
    return prob.topology.spec.sync_us or 0.0


def relaxed_time(prob: Problem, parent: list) -> float:
    """Makespan of a routing with bandwidth relaxed, as the MILP costs it: max(longest chunk path, each relay
    that forwards a chunk to two ranks or more adding `fanout_sync_us` to its forwards; busiest resource plus
    its tail)."""
    load = defaultdict(float)
    worst = 0.0
    sync = fanout_sync_us(prob)
    for c, par in enumerate(parent):
        arrive = {}
        fanout = defaultdict(int)
        for li in par.values():
            fanout[prob.links[li].src] += 1

        def at(v):
            if v not in par:
                return 0.0
            if v not in arrive:
                l = prob.links[par[v]]
                arrive[v] = at(l.src) + l.cost_us + (sync if l.src in par and fanout[l.src] >= 2 else 0.0)
            return arrive[v]

        for v, li in par.items():
            worst = max(worst, at(v))
            for res, busy in resource_loads(prob, prob.links[li]):
                load[res] += busy
    tails = resource_tails(prob)
    return max([worst] + [busy + tails[res] for res, busy in load.items()])


def route(prob: Problem, *, solver: str = "highs", options: milp.SolveOptions | None = None,
          max_extra_hops: int = 1, report=SILENT) -> Routing:
    options = options or milp.SolveOptions()
    orbits = Orbits(prob)
    spaces = {r: chunk_space(prob, r, max_extra_hops) for r in orbits.reps}
    start = heuristic_routing(prob, orbits, spaces)
    ub = relaxed_time(prob, start)
    report(f"routing: heuristic incumbent {ub:.2f} us; {len(orbits.reps)} chunk orbit(s) of {prob.collective.num_chunks} chunks")
    model, xvar, tvar, tcol = _build_model(prob, orbits, spaces, ub, start)
    stats = dict(model.stats(), stage="routing", chunk_orbits=len(orbits.reps), group_order=len(prob.group))
    report(f"routing: MILP with {stats['variables']} variables ({stats['binaries']} binary), {stats['constraints']} constraints")
    res = milp.solve(model, solver, replace(options, mip_rel_gap=max(options.mip_rel_gap, ROUTING_REL_GAP)))
    stats.update(status=res.status, time_s=round(res.time_s, 3), gap=res.gap, objective=res.objective,
                 bound=res.bound, solver=res.solver)
    if res.has_solution and tvar:
        res = _earliest_arrivals(model, tvar, tcol, res, solver, options, stats)
        report(f"routing: earliest arrivals at that makespan: {stats['arrival_status']}")
    if not res.has_solution:
        report(f"routing: solver stopped with {res.status} and no solution; using the heuristic routing")
        stats["fallback"] = "heuristic routing (solver found no solution within its limit)"
        return Routing(start, ub, "heuristic", stats)
    parent = _extract(prob, orbits, spaces, xvar, res.values)
    t = relaxed_time(prob, parent)
    # The solver's objective adds the tie-breakers (a small cost per link used, the switch policy's per switch
    # link) to the time, so its bound bounds that sum, not the time alone
    bound = stats["bound"] if stats["bound"] is not None else float("nan")
    report(f"routing: {stats['status']}, relaxed time {t:.2f} us; objective {stats['objective']:.2f} with the "
           f"tie-breakers (bound {bound:.2f}), {stats['time_s']:.2f} s")
    if t > ub + 1e-9:  # cannot happen with a correct solve; keep the better one regardless
        return Routing(start, ub, "heuristic", stats)
    return Routing(parent, t, "milp", stats)


def _earliest_arrivals(model, tvar, tcol, first, solver, options, stats):
    """Second solve: makespan capped at the first solve's, minimise the sum of arrival times."""
    cap = first.values[tcol] * (1 + 1e-6)
    model.set_bounds(tcol, 0.0, cap)
    model.set_obj(tcol, 0.0)
    for col in tvar.values():
        model.set_obj(col, 1.0 / len(tvar))
    model.set_start(first.values)
    work = min(ARRIVAL_TIME_MAX_S, ARRIVAL_TIME_FRACTION * options.time_limit_s)
    wall = max(work, options.time_limit_s - first.time_s)
    res = milp.solve(model, solver, replace(options, time_limit_s=wall, work_limit_s=work,
                                            mip_rel_gap=max(options.mip_rel_gap, 1e-2)))
    stats["arrival_status"] = res.status
    stats["time_s"] = round(stats["time_s"] + res.time_s, 3)
    return res if res.has_solution else first


def bandwidth_rows(prob, orbits, spaces, xvar) -> list:
    """The relaxed bandwidth rows, each (((variable, busy time), ...) sorted, the resource's tail), one per
    distinct row, in the order of their resources' repr. A symmetric resource has the same row once every
    variable is its orbit's, so when the group maps resources to resources (each generator's image of a link
    uses the images of its resources) only one resource per orbit is summed, the least by repr, over the links
    through it and every chunk: on 128 DGX H100 nodes 10 resources instead of every chunk's 7168 candidate
    links.
    Otherwise every chunk's every candidate link is summed."""
    loads = [resource_loads(prob, l) for l in prob.links]
    reps = orbits.resource_orbit_reps(loads)
    rows = defaultdict(lambda: defaultdict(float))
    if reps is None:
        for c in range(prob.collective.num_chunks):
            r, g = orbits.rep[c], orbits.from_rep[c]
            for li in spaces[r].links:
                x = xvar[orbits.canon_link(r, li)]
                for res, busy in loads[orbits.image_link(g, li)]:
                    rows[res][x] += busy
    else:
        through = defaultdict(list)  # representative resource -> (link, busy time) of the links using it
        for li, pairs in enumerate(loads):
            for res, busy in pairs:
                if res in reps:
                    through[res].append((li, busy))
        candidates = {r: set(spaces[r].links) for r in orbits.reps}
        for res in reps:
            row = rows[res]
            for li, busy in through[res]:
                for c in range(prob.collective.num_chunks):
                    r = orbits.rep[c]
                    if orbits.image_link(orbits.to_rep[c], li) in candidates[r]:
                        row[xvar[orbits.canon_link(c, li)]] += busy
    tails = resource_tails(prob)
    out, seen = [], set()
    for res in sorted(rows, key=repr):
        row = (tuple(sorted(rows[res].items())), tails[res])
        if row[0] and row not in seen:  # the same constraint for a symmetric resource
            seen.add(row)
            out.append(row)
    return out


def _build_model(prob, orbits, spaces, ub, start):
    model = milp.Model("routing")
    min_cost = min(l.cost_us for l in prob.links)
    eps = EPSILON_FRACTION * min_cost
    longest = max((max((sp.earliest[d] for d in sp.dests), default=0.0) for sp in spaces.values()), default=0.0)
    time_lb = min(longest, ub)
    time = model.add_var(time_lb, ub, obj=1.0, name="time")
    xvar, tvar, fanvar = {}, {}, {}
    sync = fanout_sync_us(prob)
    rows_in = defaultdict(list)
    for r in orbits.reps:
        sp = spaces[r]
        for li in sp.links:
            key = orbits.canon_link(r, li)
            if key not in xvar:
                xvar[key] = model.add_var(0, 1, binary=True, obj=eps)
        for v, lb in sp.earliest.items():
            if v in sp.sources:
                continue
            key = orbits.canon_rank(r, v)
            if key not in tvar:
                tvar[key] = model.add_var(lb, max(ub, lb))
        for li in sp.links:
            rows_in[(r, prob.links[li].dst)].append(xvar[orbits.canon_link(r, li)])
        for v in sp.earliest:
            if v in sp.sources:
                continue
            cols = rows_in[(r, v)]
            model.add_constr(cols, [1.0] * len(cols), 1.0 if v in sp.dests else 0.0, 1.0)
        # fans[u]: binary, 1 when relay u forwards the chunk to two ranks or more (each forward then waits for
        # another thread block's flag): (outlinks - 1) * fan >= sum of x over u's out-links - 1
        fans = {}
        if sync > 0:
            outs = defaultdict(lambda: defaultdict(float))  # relay -> its out-links' variables, counted
            for li in sp.links:
                if prob.links[li].src not in sp.sources:
                    outs[prob.links[li].src][xvar[orbits.canon_link(r, li)]] += 1.0
            for u, xs in outs.items():
                n = sum(xs.values())
                if n >= 2:
                    key = orbits.canon_rank(r, u)
                    if key not in fanvar:
                        fanvar[key] = model.add_var(0, 1, binary=True)
                        cols = sorted(xs)
                        model.add_constr([fanvar[key]] + cols, [n - 1.0] + [-xs[x] for x in cols], -1.0)
                    fans[u] = fanvar[key]
        for li in sp.links:
            l = prob.links[li]
            x = xvar[orbits.canon_link(r, li)]
            tv = tvar[orbits.canon_rank(r, l.dst)]
            lb_v = sp.earliest[l.dst]
            if l.src in sp.sources:
                big_m = l.cost_us - lb_v
                if big_m > 1e-12:  # t_v >= cost * x
                    model.add_constr([tv, x], [1.0, -big_m], l.cost_us - big_m)
            else:
                cols = rows_in[(r, l.src)]
                model.add_constr([x] + cols, [1.0] + [-1.0] * len(cols), hi=0.0)
                tu = tvar[orbits.canon_rank(r, l.src)]
                fan = fans.get(l.src)
                if fan is None:
                    big_m = max(ub, lb_v) + l.cost_us - lb_v
                    model.add_constr([tv, tu, x], [1.0, -1.0, -big_m], l.cost_us - big_m)
                else:  # t_v >= t_u + cost + sync * (u forwards to two ranks or more) when x
                    big_m = max(ub, lb_v) + l.cost_us + sync - lb_v
                    model.add_constr([tv, tu, x, fan], [1.0, -1.0, -big_m, -sync], l.cost_us - big_m)
        for d in sp.dests:
            model.add_constr([time, tvar[orbits.canon_rank(r, d)]], [1.0, -1.0], 0.0)
        # Every node holding a destination but no source is entered at least once (a valid cut that
        # tightens the LP relaxation of the NIC bandwidth rows).
        topo = prob.topology
        src_nodes = {topo.node_of(s) for s in sp.sources}
        for node in sorted({topo.node_of(d) for d in sp.dests} - src_nodes):
            cols = sorted({xvar[orbits.canon_link(r, li)] for li in sp.links
                           if prob.links[li].internode and topo.node_of(prob.links[li].dst) == node})
            model.add_constr(cols, [1.0] * len(cols), 1.0)
    # Relaxed bandwidth: every chunk's use of every resource, mapped to its orbit's variable.
    # A resource's tail counts only once a chunk uses it; capped at the makespan's lower bound, the row
    # holds for an unused resource too (no indicator variable needed).
    for row, tail in bandwidth_rows(prob, orbits, spaces, xvar):
        model.add_constr([time] + [x for x, _ in row], [1.0] + [-w for _, w in row], min(tail, time_lb))
    # Switch-hyperedge policy: count the links of each switch that carry any chunk.
    if any(p in ("uc-min", "uc-max") for p in prob.switch_policies):
        gamma = GAMMA_FRACTION * min_cost
        for li in orbits.link_orbit_reps():
            l = prob.links[li]
            if l.switch is None or prob.switch_policies[l.switch] not in ("uc-min", "uc-max"):
                continue
            users = defaultdict(float)
            for c in range(prob.collective.num_chunks):
                r = orbits.rep[c]
                key = orbits.canon_link(c, li)
                if key in xvar:
                    users[xvar[key]] += 1.0
            if not users:
                continue
            if prob.switch_policies[l.switch] == "uc-min":
                u = model.add_var(0, 1, binary=True, obj=gamma)
                n = sum(users.values())
                model.add_constr([u] + list(users), [n] + [-w for w in users.values()], 0.0)  # n u >= sum x
            else:
                u = model.add_var(0, 1, binary=True, obj=-gamma)
                model.add_constr([u] + list(users), [1.0] + [-w for w in users.values()], hi=0.0)  # u <= sum x
    _set_start(model, prob, orbits, spaces, xvar, tvar, time, start, ub)
    return model, xvar, tvar, time


def _set_start(model, prob, orbits, spaces, xvar, tvar, time, start, ub):
    if not orbits.trivial_stab:
        return  # a start mapped through a non-trivial stabiliser may be inconsistent; let the solver search
    values = [0.0] * model.num_vars
    values[time] = ub
    for r in orbits.reps:
        par = start[r]
        arrive = {}

        def at(v):
            if v not in par:
                return 0.0
            if v not in arrive:
                arrive[v] = at(prob.links[par[v]].src) + prob.links[par[v]].cost_us
            return arrive[v]

        for v, li in par.items():
            values[xvar[orbits.canon_link(r, li)]] = 1.0
        for v in spaces[r].earliest:
            if v in spaces[r].sources:
                continue
            values[tvar[orbits.canon_rank(r, v)]] = at(v) if v in par else spaces[r].earliest[v]
    model.set_start(values)


def _extract(prob, orbits, spaces, xvar, values) -> list:
    parent = [None] * prob.collective.num_chunks
    rep_par = {}
    for r in orbits.reps:
        sp = spaces[r]
        par = {}
        for li in sp.links:
            if values[xvar[orbits.canon_link(r, li)]] > 0.5:
                par[prob.links[li].dst] = li
        # Drop transfers that lead to no destination (the solver may leave harmless extras).
        needed = set()
        for d in sp.dests:
            v = d
            while v in par and v not in needed:
                needed.add(v)
                v = prob.links[par[v]].src
        rep_par[r] = {v: li for v, li in par.items() if v in needed}
    for c in range(prob.collective.num_chunks):
        r, g = orbits.rep[c], orbits.from_rep[c]
        parent[c] = {g[v]: orbits.image_link(g, li) for v, li in rep_par[r].items()}
    return parent
