"""Lower bounds on the time of a collective on a topology (alpha-beta model), shown next to every time.

`lower_bounds(topology, collective_name, size_bytes) -> dict` returns, in microseconds:

``ingress_us``
    per-GPU ingress bound: the bytes some GPU must receive divided by the sum of the bandwidths of its
    distinct ingress resources (direct links, switch in-ports, its NIC when there are several nodes), each
    carrying data only after its alpha (by time t a resource has moved at most bw (t - alpha) bytes: the
    smallest alpha plus the bytes over the summed bandwidth where all alphas are equal, more where the
    NIC's latency is longer than the NVSwitch's). Where GPUs share a NIC (DGX-2: a pair; NDv2: all eight)
    the same holds for the group: the bytes its GPUs must receive together, over the distinct resources
    of the group, so the shared NIC counts once and not once per GPU.
``egress_us``
    the same for the bytes some GPU (group) must send.
``cut_us``
    the cut bound across node boundaries (several nodes only): the bytes that must enter (leave) a node,
    divided by the summed bandwidth of its NICs, plus the NIC alpha. This is the multi-node special case of
    the ForestColl cut bound (``shared/docs/reference-numbers.md`` section 2) with S = one whole node.
``latency_us``
    the alpha diameter: the smallest sum of alphas along a path between the farthest pair of ranks that
    must communicate (between two GPUs of a node, also out through the network and back). Reductions
    (ReduceScatter, AllReduce, Reduce) also pay for merging: a thread block receives from one peer, so
    without reading another block's data a sum grows by one input (the sending rank's own) per hop, and such
    a read comes no earlier than ``runtime.sync_us`` (the flag) or two hops
    (a round trip the proof may order it by) after the data was written. With R ranks and a smallest alpha
    a, one rank's sum takes at least min((R-1) a, a + s), s = min(sync_us, 2a). Across nodes, where m inputs
    come from other nodes and the NIC's alpha is n, let G(k) = min((k-1) a, a + s) (0 for k < 2) be the least
    time before a sending block holds k inputs of other ranks. The block that first makes a byte's sum
    receives from one peer P. Either all m cross in P's connection, whose sender gathered them first: n +
    G(m); or some are read from another block after they landed (+ s), and since a gathered or relayed
    message took a hop before crossing, only inputs sent raw straight to the summing rank are read sooner.
    With k inputs through P, each of the M summed bytes then has m - k raw copies to carry through the NICs
    before the flag: at least n + max(G(k), s + (m - k) M / (every node's NIC bandwidth summed)), the least
    over k. (2x DGX H100, LL at 64 KiB: n + a + s = 4.96 us, where raw inputs and the flag alone gave 4.20.)
``flow_us``
    AllToAll: the fluid optimum of its traffic, a multicommodity flow. Every rank's blocks must reach their
    destinations along paths of links, switch ports and NICs, and a path of two links loads both; where GPUs
    are not all joined directly (the DGX-1/NDv2 hybrid cube-mesh) the per-GPU bounds miss that relayed
    blocks load several links. One node (all nodes alike) is modelled with the others merged into one
    vertex of unlimited inner capacity, so traffic between other nodes costs this node nothing: the
    smallest time in which the node's links can carry every flow (a linear program, solved by HiGHS once
    per topology and protocol), plus the smallest alpha.
``fanout_us``
    several nodes, AllGather and AllToAll: each rank has a block of M/R bytes for each of the m ranks on
    other nodes. Blocks sent on its own NIC (with the other GPUs attached to that NIC) cross it one by one;
    any other way takes one more hop (a relay in the destination node, or to another NIC). With the NIC's
    alpha n and bandwidth B, and a the smallest intra-node alpha: min(n + sharers x m x M/R / B, n + a), where
    n + a is also at most the path to another GPU's NIC plus that NIC's alpha (a faster NIC next door).
    AllGather's relays copy one block to many ranks, but a thread block has one send peer: the block that
    took a copy in from the network can pass it on to one rank, any other block of that GPU reads it after
    a flag (sync) or two hops. So where fewer than half of a destination node's g ranks get a block over a
    NIC, one of them waits n + a + min(a, sync); where at least half do, the node's NICs carry
    (nodes - 1) ceil(g/2) copies of every local block. The relay term n + a becomes
    min(max(n + a, n + g (nodes - 1) ceil(g/2) M/R / sum of the node's NIC bandwidths), n + a + min(a, sync)).

``call_us``
    the runtime's fixed cost of one call (the topology's ``runtime.call_us``), paid by every algorithm.

`lower_bound(...)` is ``call_us`` plus the largest of the others. Costs are those of one runtime protocol
(`LinkType.cost`): ``proto=None`` (the default) gives the bound over every protocol, the smallest of the
per-protocol bounds, since a program runs in one protocol. `size_bytes` follows MSCCL's convention (the largest buffer:
the gathered output for AllGather, the input for ReduceScatter, the per-rank buffer for AllReduce and
AllToAll). The volumes each rank must move, with M = size_bytes and R ranks (every value is generic, so a
rank that needs information it does not hold must receive at least that many bytes of it):

=============  ======================  ======================
collective     receive (per rank)      send (per rank)
=============  ======================  ======================
allgather      (R-1)/R M               M/R
reducescatter  M/R                     (R-1)/R M
allreduce      M                       M
alltoall       (R-1)/R M               (R-1)/R M
broadcast      M (non-root)            M (root)
reduce         M (root)                M (non-root)
gather         (R-1)/R M (root)        M/R (non-root)
scatter        M/R (non-root)          (R-1)/R M (root)
=============  ======================  ======================

AllReduce's bound is M/B, not the 2(R-1)/R M/B that the ring achieves: with separate ingress and egress
bandwidth nothing forces a rank to move both its reduce-scatter and its all-gather traffic through one
direction, so only the provable bound is reported.

Examples
--------
>>> from taccl.topology import load_topology
>>> b = lower_bounds(load_topology("dgx2", 2), "allgather", 32_000_000)
>>> sorted(b)
['call_us', 'cut_us', 'egress_us', 'fanout_us', 'flow_us', 'ingress_us', 'latency_us', 'proto']
>>> b = lower_bounds(load_topology("dgx2", 2), "allgather", 32_000_000, proto="Simple")
>>> round(b["cut_us"], 1)   # 16 MB must enter each node through 8 NICs of 12.5 GB/s, after 14 us
174.0
"""

from __future__ import annotations

import heapq
from functools import lru_cache

from .collectives import NAMES, canonical_name
from .errors import UserError

__all__ = ["lower_bounds", "lower_bound", "allreduce_optimum", "rank_volumes", "node_volumes", "custom_lower_bounds",
           "custom_lower_bound"]

INF = float("inf")


def _canon(name: str) -> str:
    n = canonical_name(name)
    if n not in NAMES:
        raise UserError(f"no lower bound is known for collective {name!r}; known: {', '.join(NAMES)}")
    return n


def rank_volumes(collective: str, num_ranks: int, size_bytes: float, rank: int, root: int = 0) -> tuple:
    """(bytes rank must receive, bytes it must send) for one rank."""
    c, R, M = _canon(collective), num_ranks, float(size_bytes)
    is_root = rank == root
    table = {
        "allgather": ((R - 1) / R * M, M / R),
        "reducescatter": (M / R, (R - 1) / R * M),
        "allreduce": (M, M),
        "alltoall": ((R - 1) / R * M, (R - 1) / R * M),
        "broadcast": (0.0, M) if is_root else (M, 0.0),
        "reduce": (M, 0.0) if is_root else (0.0, M),
        "gather": ((R - 1) / R * M, 0.0) if is_root else (0.0, M / R),
        "scatter": (0.0, (R - 1) / R * M) if is_root else (M / R, 0.0),
    }
    return table[c] if R > 1 else (0.0, 0.0)


def node_volumes(collective: str, num_ranks: int, gpus: int, size_bytes: float, has_root: bool) -> tuple:
    """(bytes that must enter, bytes that must leave) a node holding `gpus` of the `num_ranks` ranks."""
    c, N, g, M = _canon(collective), num_ranks, gpus, float(size_bytes)
    table = {
        "allgather": ((N - g) / N * M, g / N * M),
        "reducescatter": (g / N * M, (N - g) / N * M),
        "allreduce": (M, M),
        "alltoall": (g * (N - g) / N * M, g * (N - g) / N * M),
        "broadcast": (0.0, M) if has_root else (M, 0.0),
        "reduce": (M, 0.0) if has_root else (0.0, M),
        "gather": ((N - g) / N * M, 0.0) if has_root else (0.0, g / N * M),
        "scatter": (0.0, (N - g) / N * M) if has_root else (g / N * M, 0.0),
    }
    return table[c] if N > g else (0.0, 0.0)


def _local_resources(spec, multi_node: bool, proto: str):
    """Per local GPU: (ingress, egress) resources, each a dict resource -> (bandwidth, alpha)."""
    n = spec.gpus_per_node
    ins = [dict() for _ in range(n)]  # resource -> (bw, alpha)
    outs = [dict() for _ in range(n)]
    for s, d, tname in spec.links:
        c = spec.link_types[tname].cost(proto)
        outs[s][("link", s, d)] = (c.bw_GBps, c.alpha_us)
        ins[d][("link", s, d)] = (c.bw_GBps, c.alpha_us)
    for si, (_, gpus, tname) in enumerate(spec.switches):
        c = spec.link_types[tname].cost(proto)
        if len(gpus) < 2:
            continue
        for g in gpus:
            outs[g][("swout", si, g)] = (c.bw_GBps, c.alpha_us)
            ins[g][("swin", si, g)] = (c.bw_GBps, c.alpha_us)
    if multi_node:
        for ni, (_, gpus, tname) in enumerate(spec.nics):
            c = spec.link_types[tname].cost(proto)
            for g in gpus:
                outs[g][("nic", ni)] = (c.bw_GBps, c.alpha_us)
                ins[g][("nic", ni)] = (c.bw_GBps, c.alpha_us)
    return ins, outs


def _port_bound(volume: float, resources: dict) -> float:
    """The least time to move `volume` bytes through distinct `resources` (resource -> (GB/s, alpha)).

    A transfer's data holds a resource after the sender's share of alpha and arrives with the rest of alpha
    still in flight, so by time t a resource of bandwidth B and latency alpha has carried at most
    B * (t - alpha) bytes: the answer is the t at which these sum to `volume` (a resource whose alpha is
    larger carries nothing). With one latency for all it is alpha + volume / (sum of B); where they differ
    (DGX H100 in Simple: the NVSwitch port's 4.1 us, the NIC's 14), more than the smallest alpha plus the
    volume over all the bandwidth."""
    if volume <= 0:
        return 0.0
    usable = sorted((a, b) for b, a in resources.values() if b > 0)
    bw = alpha_bw = 0.0  # sum of B, sum of B * alpha over the resources that carry data by then
    for k, (alpha, b) in enumerate(usable):
        bw += b * 1000.0
        alpha_bw += b * 1000.0 * alpha
        t = (volume + alpha_bw) / bw
        if k + 1 == len(usable) or t <= usable[k + 1][0]:
            return t
    return INF


def _nic_groups(spec) -> list:
    """Sets of local GPUs that share NICs (connected through common NICs), those of more than one GPU."""
    groups = []
    for _, gpus, _ in spec.nics:
        merged = set(gpus)
        for other in [g for g in groups if g & merged]:
            merged |= other
            groups.remove(other)
        groups.append(merged)
    return [sorted(g) for g in groups if len(g) > 1]


def _intra_alpha_apsp(topology, proto: str) -> list:
    """All-pairs smallest alpha sums between the GPUs of one node (local indices): over its links and, with
    several nodes, out through the network and back, two NIC hops that can beat a slow path inside the node
    (two sockets joined by 8 us links, NICs of 2 us)."""
    inside = _inside_alpha_apsp(topology, proto)
    if topology.nodes < 2:
        return inside
    out_cross = _cross_alphas(inside, _nic_alphas(topology, proto))
    back = min(out_cross, default=INF)  # from another node to any GPU: its NIC lands on the GPU itself
    return [[min(d, out_cross[a] + back) if a != b else d for b, d in enumerate(row)] for a, row in enumerate(inside)]


def _inside_alpha_apsp(topology, proto: str) -> list:
    """All-pairs smallest alpha sums over one node's own links (local indices)."""
    spec = topology.spec
    n = spec.gpus_per_node
    adj = [[] for _ in range(n)]
    for (s, d), (kind, tname, _) in topology._intra_local.items():
        adj[s].append((d, spec.link_types[tname].cost(proto).alpha_us))
    dist = []
    for src in range(n):
        dd = [INF] * n
        dd[src] = 0.0
        heap = [(0.0, src)]
        while heap:
            t, u = heapq.heappop(heap)
            if t > dd[u]:
                continue
            for v, a in adj[u]:
                if t + a < dd[v]:
                    dd[v] = t + a
                    heapq.heappush(heap, (t + a, v))
        dist.append(dd)
    return dist


def _smallest_intra_alpha(intra: list) -> float:
    return min((intra[a][b] for a in range(len(intra)) for b in range(len(intra)) if a != b), default=INF)


def _nic_alphas(topology, proto: str) -> list:
    """Per local GPU, the alpha of its NIC (infinite on one node, or without one)."""
    nic_alpha = [INF] * topology.gpus_per_node
    if topology.nodes > 1:
        for _, gpus, tname in topology.spec.nics:
            for g in gpus:
                nic_alpha[g] = topology.spec.link_types[tname].cost(proto).alpha_us
    return nic_alpha


def _nic_costs(spec, proto: str) -> list:
    """The cost of each of a node's NICs under `proto`."""
    return [spec.link_types[t].cost(proto) for _, _, t in spec.nics]


def _rank_distance(topology, intra: list, out_cross: list):
    """The smallest alpha sum from one rank to another: inside a node the all-pairs one (`intra`) or, with
    several nodes out through the network and back (`_intra_alpha_apsp`); to another node `out_cross` of the
    local source (`_cross_alphas`)."""
    def dist(a_rank, b_rank):
        a, b = topology.local(a_rank), topology.local(b_rank)
        if topology.node_of(a_rank) == topology.node_of(b_rank):
            return intra[a][b]
        return out_cross[a]

    return dist


def _cross_alphas(intra: list, nic_alpha: list) -> list:
    """Per local GPU, the smallest alpha sum to another node: every GPU has a NIC, so the best path is (intra
    to some x) + x's NIC alpha (+ 0 inside the destination node when landing on the destination itself)."""
    n = len(nic_alpha)
    return [min((intra[a][x] + nic_alpha[x] for x in range(n)), default=INF) for a in range(n)]


def _latency_bound(topology, collective: str, root: int, proto: str, intra: list, size_bytes: float) -> float:
    n = topology.gpus_per_node
    nodes = topology.nodes
    nic_alpha = _nic_alphas(topology, proto)
    out_cross = _cross_alphas(intra, nic_alpha)
    dist = _rank_distance(topology, intra, out_cross)

    c = _canon(collective)
    R = topology.num_ranks
    if c in ("broadcast", "scatter"):
        return max(dist(root, d) for d in range(R) if d != root)
    if c == "gather":
        return max(dist(s, root) for s in range(R) if s != root)
    if c == "reduce":
        return max([dist(s, root) for s in range(R) if s != root]
                   + [_merge_latency(topology, intra, nic_alpha, size_bytes, proto)])
    # every pair communicates; by node symmetry, sources in node 0 suffice
    worst = 0.0
    for a in range(n):
        for b in range(n):
            if a != b:
                worst = max(worst, intra[a][b])
        if nodes > 1:
            worst = max(worst, out_cross[a])
    if c in ("reducescatter", "allreduce"):
        worst = max(worst, _merge_latency(topology, intra, nic_alpha, size_bytes, proto))
    return worst


def _merge_latency(topology, intra: list, nic_alpha: list, size_bytes: float, proto: str) -> float:
    """The least time before one rank can hold the sum of every rank's input (the module doc's argument)."""
    spec = topology.spec
    R = topology.num_ranks
    hop = min([_smallest_intra_alpha(intra)] + nic_alpha)
    if R < 3 or hop == INF:
        return 0.0
    read_other_block = min(spec.sync_us, 2 * hop)
    merge = min((R - 1) * hop, hop + read_other_block)
    if topology.nodes > 1:
        m = R - topology.gpus_per_node  # the inputs from other nodes
        n = min(nic_alpha)

        def gathered(k):  # G(k): the least time before a sending block holds k inputs (its rank's, k-1 more)
            return 0.0 if k < 2 else min((k - 1) * hop, hop + read_other_block)

        # all m through the summing block's one receive connection, or k of them and m - k read after they
        # crossed raw (the module doc)
        costs = _nic_costs(spec, proto)
        nic_bw = topology.nodes * sum(c.bw_GBps for c in costs) * 1000.0  # bytes/us into every node's NICs
        raw_reads = min((max(gathered(k), read_other_block + (m - k) * size_bytes / nic_bw) for k in range(m)),
                        default=INF) if nic_bw > 0 else INF
        merge = max(merge, n + min(gathered(m), raw_reads))
    return merge


def lower_bounds(topology, collective_name: str, size_bytes: float, *, root: int = 0, proto: str | None = None) -> dict:
    """Lower bounds (microseconds) on any algorithm for the collective at this size; see the module doc.

    With ``proto`` the bound of programs in that protocol; without, the smallest per-protocol bound over the
    protocols the topology allows (`TopologySpec.protocols`; its protocol under ``"proto"``).
    """
    if proto is None:
        per = [lower_bounds(topology, collective_name, size_bytes, root=root, proto=p)
               for p in topology.spec.protocols]
        return min(per, key=_total)
    c = _canon(collective_name)
    p = str(getattr(proto, "value", proto))
    R = topology.num_ranks
    multi = topology.nodes > 1
    ins, outs = _local_resources(topology.spec, multi, p)
    rooted = c in ("broadcast", "reduce", "gather", "scatter")
    g = topology.gpus_per_node
    # Rank sets whose summed volume must pass their distinct resources: every GPU alone and, with several
    # nodes, every group sharing a NIC; in node 0 (every node alike) unless a root makes nodes differ.
    groups = [[x] for x in range(g)] + (_nic_groups(topology.spec) if multi else [])
    ingress = egress = 0.0
    for node in range(topology.nodes) if rooted else [0]:
        for group in groups:
            volumes = [rank_volumes(c, R, size_bytes, node * g + x, root) for x in group]
            vin, vout = sum(v for v, _ in volumes), sum(v for _, v in volumes)
            ingress = max(ingress, _port_bound(vin, {k: v for x in group for k, v in ins[x].items()}))
            egress = max(egress, _port_bound(vout, {k: v for x in group for k, v in outs[x].items()}))
    cut = 0.0
    if multi:
        spec = topology.spec
        costs = _nic_costs(spec, p)
        nic_bw = sum(x.bw_GBps for x in costs)
        nic_alpha = min((x.alpha_us for x in costs), default=INF)
        g = topology.gpus_per_node
        root_node = topology.node_of(root)
        for node in ({0, root_node} if c in ("broadcast", "reduce", "gather", "scatter") else {0}) | (
                {1 if root_node == 0 else 0} if c in ("broadcast", "reduce", "gather", "scatter") else set()):
            vin, vout = node_volumes(c, R, g, size_bytes, node == root_node)
            for v in (vin, vout):
                if v > 0:
                    cut = max(cut, INF if nic_bw <= 0 else nic_alpha + v / (nic_bw * 1000.0))
    intra = _intra_alpha_apsp(topology, p)
    latency = _latency_bound(topology, c, root, p, intra, size_bytes) if R > 1 else 0.0
    fanout = _fanout_bound(topology, c, size_bytes, p, intra) if multi and c in ("allgather", "alltoall") else 0.0
    flow = _alltoall_flow_bound(topology, size_bytes, p) if c == "alltoall" and R > 1 else 0.0
    return {"ingress_us": ingress, "egress_us": egress, "cut_us": cut, "flow_us": flow, "latency_us": latency,
            "fanout_us": fanout, "call_us": topology.spec.call_us.get(p, 0.0) if R > 1 else 0.0, "proto": p}


def custom_lower_bounds(topology, coll, chunk_bytes: float, proto: str) -> dict:
    """`lower_bounds` of a user-defined collective (`taccl.collectives.load_custom_collective`: chunks are
    copied, never reduced), from its pre- and postcondition: a rank receives at least the chunks its
    postcondition has and its precondition lacks (ingress); a chunk that one rank alone holds and another
    needs leaves that rank at least once (egress); and a needed chunk travels at least the alpha distance from
    its nearest holder (latency). Per GPU, without the NIC-sharing groups and cut of the built-in ones."""
    p = str(getattr(proto, "value", proto))
    multi = topology.nodes > 1
    ins, outs = _local_resources(topology.spec, multi, p)
    intra = _intra_alpha_apsp(topology, p)
    dist = _rank_distance(topology, intra, _cross_alphas(intra, _nic_alphas(topology, p)))
    holders, wanted = {}, {}
    for c, r in coll.precondition:
        holders.setdefault(c, set()).add(r)
    for c, r in coll.postcondition:
        wanted.setdefault(c, set()).add(r)
    receive, send, latency = {}, {}, 0.0
    for c, dsts in wanted.items():
        have = holders.get(c, set())
        missing = dsts - have
        for d in missing:
            receive[d] = receive.get(d, 0) + 1
            latency = max(latency, min((dist(h, d) for h in have), default=INF))
        if missing and len(have) == 1:
            (h,) = have
            send[h] = send.get(h, 0) + 1
    ingress = max((_port_bound(k * chunk_bytes, ins[topology.local(r)]) for r, k in receive.items()), default=0.0)
    egress = max((_port_bound(k * chunk_bytes, outs[topology.local(r)]) for r, k in send.items()), default=0.0)
    return {"ingress_us": ingress, "egress_us": egress, "cut_us": 0.0, "flow_us": 0.0, "latency_us": latency,
            "fanout_us": 0.0, "call_us": topology.spec.call_us.get(p, 0.0) if receive else 0.0, "proto": p}


def custom_lower_bound(topology, coll, chunk_bytes: float, proto: str) -> float:
    """The call cost plus the largest of `custom_lower_bounds`."""
    return _total(custom_lower_bounds(topology, coll, chunk_bytes, proto))


def _fanout_bound(topology, collective: str, size_bytes: float, proto: str, intra: list) -> float:
    """The time before a rank's blocks reach every rank of the other nodes (the module doc's argument)."""
    spec = topology.spec
    hop = _smallest_intra_alpha(intra)
    g = topology.gpus_per_node
    m = topology.num_ranks - g
    block = size_bytes / topology.num_ranks
    own = [[] for _ in range(g)]  # the NICs a GPU sends on without another hop
    for _, gpus, tname in spec.nics:
        c = spec.link_types[tname].cost(proto)
        for x in gpus:
            own[x].append((c, len(gpus)))
    relayed = 0.0  # AllGather: the copies relayed inside a destination node (the module doc's argument)
    if collective == "allgather" and spec.nics:
        costs = _nic_costs(spec, proto)
        n = min(c.alpha_us for c in costs)
        copies = g * (topology.nodes - 1) * ((g + 1) // 2) * block  # half of every node's ranks, every block
        relayed = min(max(n + hop, n + copies / (sum(c.bw_GBps for c in costs) * 1000.0)),
                      n + hop + min(hop, spec.sync_us))
    nic_alpha = [min((c.alpha_us for c, _ in nics), default=INF) for nics in own]
    worst = 0.0
    for x, nics in enumerate(own):
        if not nics:
            continue  # its data crosses after an intra-node hop: the latency bound covers it
        alpha = nic_alpha[x]
        # one NIC: every GPU on it sends its m blocks through it; several: at least their summed bandwidth
        load = nics[0][1] * m * block if len(nics) == 1 else m * block
        direct = alpha + load / (sum(c.bw_GBps for c, _ in nics) * 1000.0)
        # any other way takes one more hop: a relay in the destination node, or first to another GPU's NIC
        # (which may be faster than its own)
        other = min([alpha + hop] + [intra[x][y] + nic_alpha[y] for y in range(g) if y != x])
        worst = max(worst, min(direct, max(other, relayed)))
    return worst


def _alltoall_flow_bound(topology, size_bytes: float, proto: str) -> float:
    """The smallest alpha plus the AllToAll's fluid optimum on one node's graph (the module doc)."""
    spec = topology.spec
    costs = {t: lt.cost(proto) for t, lt in spec.link_types.items()}
    switched = [(tuple(sorted(g)), t) for _, g, t in spec.switches if len(g) > 1]
    networked = [(tuple(g), t) for _, g, t in spec.nics] if topology.nodes > 1 else []
    links = tuple((s, d, costs[t].bw_GBps) for s, d, t in spec.links)
    switches = tuple((g, costs[t].bw_GBps) for g, t in switched)
    nics = tuple((g, costs[t].bw_GBps) for g, t in networked)
    used = [t for _, _, t in spec.links] + [t for _, t in switched + networked]
    alpha = min((costs[t].alpha_us for t in used), default=0.0)
    per_byte = _alltoall_flow_us_per_byte(spec.gpus_per_node, topology.nodes, links, switches, nics)
    return alpha + per_byte * size_bytes


@lru_cache(maxsize=64)
def _alltoall_flow_us_per_byte(gpus: int, nodes: int, links: tuple, switches: tuple, nics: tuple) -> float:
    """Microseconds per byte of AllToAll input (M) that one node's links need at the least: a linear program
    over flows aggregated by source (one commodity per local GPU, one for the merged other nodes), each edge's
    total flow at most its bandwidth times T, minimising T. Infinity where some block has no path."""
    from .solver import Model, SolveOptions, solve

    R = gpus * nodes
    block = 1e-3 / R  # one byte of M, in the units where bytes / (GB/s) give microseconds
    # vertices: GPUs 0..gpus-1, then each switch, each NIC's out and in side, and "the other nodes"
    vertex = gpus
    edges = [(s, d, bw) for s, d, bw in links]
    for members, bw in switches:
        for g in members:  # a GPU's port on the switch, each direction
            edges += [(g, vertex, bw), (vertex, g, bw)]
        vertex += 1
    others = vertex + 2 * len(nics)
    for members, bw in nics:
        out_side, in_side = vertex, vertex + 1
        edges += [(g, out_side, INF) for g in members] + [(in_side, g, INF) for g in members]
        edges += [(out_side, others, bw), (others, in_side, bw)]
        vertex += 2
    sources = list(range(gpus)) + ([others] if nics else [])
    incident = {}  # vertex -> [(edge, +1 leaving / -1 entering)]
    for e, (a, b, _) in enumerate(edges):
        incident.setdefault(a, []).append((e, 1.0))
        incident.setdefault(b, []).append((e, -1.0))
    m = Model("alltoall-flow")
    T = m.add_var(obj=1.0)
    flow = [m.add_vars(len(edges)) for _ in sources]  # flow[k][e]: source k's bytes on edge e
    for k, src in enumerate(sources):
        if src == others:  # the other nodes send each local GPU R - gpus blocks
            demand = {g: (R - gpus) * block for g in range(gpus)}
        else:  # a local GPU sends a block to each local peer and R - gpus blocks off the node
            demand = {g: block for g in range(gpus) if g != src}
            if nics:
                demand[others] = (R - gpus) * block
        for v in set(incident) | set(demand) | {src}:  # a GPU without links makes the program infeasible
            ends = incident.get(v, [])
            net = sum(demand.values()) if v == src else -demand.get(v, 0.0)
            m.add_constr([flow[k][e] for e, _ in ends], [sign for _, sign in ends], net, net)
    for e, (_, _, bw) in enumerate(edges):
        if bw < INF:
            m.add_constr([f[e] for f in flow] + [T], [1.0] * len(flow) + [-bw], hi=0.0)
    res = solve(m, "highs", SolveOptions(time_limit_s=60.0))
    if res.status == "infeasible":
        return INF
    return res.objective if res.status == "optimal" else 0.0  # not solved in time: claim nothing


def _total(b: dict) -> float:
    return b["call_us"] + max(_bandwidth(b), b["latency_us"], b["fanout_us"])


def lower_bound(topology, collective_name: str, size_bytes: float, *, root: int = 0, proto: str | None = None) -> float:
    """The call cost plus the largest of `lower_bounds` (the best protocol's when ``proto`` is None)."""
    return _total(lower_bounds(topology, collective_name, size_bytes, root=root, proto=proto))


def allreduce_optimum(topology, size_bytes: float, *, proto: str | None = None) -> float:
    """The reduce-scatter plus all-gather optimum of an AllReduce: the ReduceScatter bound's bandwidth terms
    plus the AllGather bound's at the same size, one call cost, and never less than the AllReduce's own
    latency bound. Every AllReduce without in-network reduction moves both volumes through some GPU's ports
    when ingress and egress bandwidths are equal (`lower_bound` proves only M/B); where latency rules (small
    sizes) the yardstick is the provable bound, which one-pass programs reach, not two latencies."""
    protos = topology.spec.protocols if proto is None else (proto,)
    best = INF
    for p in protos:
        rs = lower_bounds(topology, "reducescatter", size_bytes, proto=p)
        ag = lower_bounds(topology, "allgather", size_bytes, proto=p)
        ar = lower_bounds(topology, "allreduce", size_bytes, proto=p)
        best = min(best, ar["call_us"] + max(ar["latency_us"], _bandwidth(rs) + _bandwidth(ag)))
    return best


def _bandwidth(b: dict) -> float:
    return max(b["ingress_us"], b["egress_us"], b["cut_us"], b["flow_us"])
