"""Baseline algorithms, written in the DSL (`taccl.dsl`) and lowered by the same passes as synthesized ones.

``build(name, topology, collective_name, *, chunkup=1, instances=1, proto="Simple") -> Program``

=====================  ======================================  ==============================================
name                   collectives                             what
=====================  ======================================  ==============================================
ring                   allgather, reducescatter, allreduce     NCCL-style rings through a Hamiltonian cycle
                                                               of each node's links; on several nodes one
                                                               ring per NIC, each entering and leaving a
                                                               node through its own NICs, on its own
                                                               channel (as NCCL's rings use every NIC);
                                                               on one node of direct NVLinks (DGX-1, NDv2)
                                                               as many rings as its links carry, each on
                                                               other links (NCCL builds four there);
                                                               32 rings at most, NCCL's channels
double-binary-tree     allreduce                               NCCL-style: a chain inside each node, two
                                                               binary trees over the nodes (mirrored), each
                                                               tree reducing then broadcasting its share of
                                                               the data; on several nodes one pair per NIC
                                                               (chains opened at the NIC's GPU), each tree
                                                               on its own channel, 32 trees at most
direct                 alltoall, allgather, reducescatter,     every rank sends straight to every other (the
                       allreduce                               MSCCL "allpairs" programs): ReduceScatter into
                                                               the owner's scratch and one local reduction,
                                                               AllReduce that then gathered from the owners
one-shot               allreduce                               every rank sends its whole input to every
                                                               other's scratch and reduces the R-1 copies
                                                               locally (MSCCL's "ap-1pass" program): one
                                                               step for R-1 times the data, the fastest
                                                               AllReduce for the smallest messages
hierarchical           allreduce                               intra-node ring reduce-scatter, inter-node ring
                                                               allreduce per shard, intra-node ring allgather
two-step               alltoall (several nodes)                intra-node exchange into a per-destination-node
                                                               staging area, then one aggregated send per
                                                               remote GPU over the NIC
=====================  ======================================  ==============================================

Every remote copy must follow a link of the topology (`Topology.link`); a baseline that needs a missing
link raises `UserError` (``direct`` on an NDv2 node, whose GPUs are not all joined, for example).
`applicable(name, topology, collective)` tells without raising.
"""
from __future__ import annotations

from .collectives import canonical_name
from .dsl import DSLProgram
from .errors import UserError
from .lowering import DEFAULT_MAX_STEPS, MAX_CHANNELS, RuntimeLimitsError
from .program import MAX_NODES, Program
from .progress import SILENT
from .targets import get_target

__all__ = ["BASELINES", "build", "build_protocols", "build_dsl", "build_on_channels", "applicable", "ring_order", "node_cycle"]

BASELINES = {
    "ring": ("allgather", "reducescatter", "allreduce"),
    "double-binary-tree": ("allreduce",),
    "direct": ("alltoall", "allgather", "reducescatter", "allreduce"),
    "one-shot": ("allreduce",),
    "hierarchical": ("allreduce",),
    "two-step": ("alltoall",),
}


# ------------------------------------------------------------------------------------------------------
# Orders


def node_cycle(topology) -> list:
    """A Hamiltonian cycle over one node's local GPUs along its links (fastest links tried first)."""
    g = topology.gpus_per_node
    if g == 1:
        return [0]
    spec = topology.spec
    adj = {u: [] for u in range(g)}
    for (s, d), (_, tname, _) in topology._intra_local.items():
        adj[s].append((-spec.link_types[tname].bw_GBps, d))
    for u in adj:
        adj[u] = [d for _, d in sorted(adj[u])]

    def onward(u, seen):  # Warnsdorff: fewest onward choices first
        return sorted((v for v in adj[u] if v not in seen), key=lambda v: sum(1 for w in adj[v] if w not in seen))

    path = _hamiltonian_cycle(g, onward, lambda u: 0 in adj[u], 200_000)
    if path is None:
        raise UserError(f"topology {topology.name!r}: found no ring through the GPUs of a node along its links")
    return path


def _hamiltonian_cycle(g: int, onward, closes, budget: int):
    """A Hamiltonian cycle over GPUs 0..g-1 from GPU 0, depth first: `onward(u, seen)` orders the GPUs to try
    after u, `closes(u)` says whether u links back to GPU 0; None when there is none or `budget` steps ran out."""
    path, seen, left = [0], {0}, [budget]

    def dfs():
        left[0] -= 1
        if left[0] < 0:
            return False
        if len(path) == g:
            return closes(path[-1])
        for v in onward(path[-1], seen):
            path.append(v)
            seen.add(v)
            if dfs():
                return True
            path.pop()
            seen.discard(v)
        return False

    return list(path) if dfs() else None


def ring_order(topology) -> list:
    """Global ranks in ring order: each node's cycle opened into a path, nodes chained through NICs."""
    return ring_orders(topology)[0]


def ring_orders(topology) -> list:
    """NCCL-style rings: one per NIC on several nodes; on one node wired by direct NVLinks, as many as fit on
    its links (`mesh_rings`); else one (`ring` keeps one per channel at most, as NCCL does: a 72-NIC GB200
    NVL72 rack gets 32 rings on 32 channels, not 72).

    Ring j opens each node's cycle at a different place, so it enters a node through one GPU's NIC and
    leaves through another's; the rings' entry GPUs use distinct NICs, and so do their exit GPUs, so
    together they drive every NIC in both directions.
    """
    if _one_mesh_node(topology):
        return mesh_rings(topology)
    cyc = node_cycle(topology)
    N = topology.nodes
    return [[topology.rank(n, l) for n in range(N) for l in cyc[j:] + cyc[:j]] for j in rail_starts(topology, cyc)]


def mesh_rings(topology) -> list:
    """Rings over one node's direct NVLinks as NCCL's ring search finds them (it builds four on a DGX-1,
    each on other links, so that together they use every GPU's links, not one): `node_cycle` first, then
    further Hamiltonian cycles while every directed link they use has an NVLink left (a link of twice the
    slowest link's bandwidth carries two rings); a power of two of them, 32 at most."""
    first = node_cycle(topology)
    g = topology.gpus_per_node
    if g <= 2:
        return [first]
    spec = topology.spec
    slowest = min(spec.link_types[t].bw_GBps for _, (_, t, _) in topology._intra_local.items())
    left = {pair: max(1, round(spec.link_types[t].bw_GBps / slowest)) for pair, (_, t, _) in
            topology._intra_local.items()}
    rings = []
    cycle = first
    while cycle is not None and len(rings) < MAX_CHANNELS:
        rings.append(cycle)
        for a, b in zip(cycle, cycle[1:] + cycle[:1]):
            left[(a, b)] -= 1
        cycle = _cycle_on(g, left)
    # a power of two of them: a program's chunks a loop (rings x ranks) must divide the power-of-two sizes the
    # runtimes are called with, or they never select it (five rings on a DGX-1 keep four, as NCCL has)
    return rings[:1 << (len(rings).bit_length() - 1)]


def _cycle_on(g: int, left: dict):
    """A Hamiltonian cycle from GPU 0 along directed links with an NVLink left (`left`), or None: the links with
    the most left first, then the GPU with the fewest onward choices (a bounded search)."""
    def free(u, v):
        return left.get((u, v), 0) > 0

    def onward(u, seen):
        return sorted((v for v in range(g) if v not in seen and free(u, v)),
                      key=lambda v: (-left[(u, v)], sum(1 for w in range(g) if w not in seen and free(v, w)), v))

    return _hamiltonian_cycle(g, onward, lambda u: free(u, 0), 20_000)


def ring_count(topology) -> int:
    """len(ring_orders(topology)), without building the rings (on 10^12 nodes their ranks fill no memory)."""
    if _one_mesh_node(topology):
        return len(mesh_rings(topology))
    return len(rail_starts(topology, node_cycle(topology)))


def _one_mesh_node(topology) -> bool:
    """One node whose GPUs are wired by direct links, no switch: where rings are `mesh_rings`."""
    return topology.nodes == 1 and not topology.spec.switches


def rail_starts(topology, cyc: list) -> list:
    """Where to open a node's cycle `cyc` into a path, one place per NIC on several nodes (else [0]): the
    paths' first GPUs use distinct NICs, and so do their last GPUs."""
    g, N = topology.gpus_per_node, topology.nodes
    nics = len(topology.spec.nics)
    if N == 1 or nics <= 1:
        return [0]
    step = max(1, g // nics)
    starts, used_in, used_out = [], set(), set()
    for j in range(0, g, step):
        nin, nout = topology.nic_of(cyc[j]), topology.nic_of(cyc[j - 1])
        if nin in used_in or nout in used_out:
            continue
        used_in.add(nin)
        used_out.add(nout)
        starts.append(j)
    return starts


# ------------------------------------------------------------------------------------------------------
# Algorithms
# Rings work on pieces: rank r's share of the buffer is slots r*K .. r*K+K-1; a ring moves the `w` slots
# starting at r*K + off of every rank (K = rings * chunk-up, off = ring * chunk-up, w = chunk-up).


def _ring_allgather(prog, order, K, off, w, ch, *, buf_src="input"):
    R = len(order)
    pos = {r: p for p, r in enumerate(order)}
    refs = {}
    for r in order:
        refs[r] = prog.chunk(r, buf_src, off if buf_src == "input" else r * K + off, w)
    for step in range(1, R):
        for r in order:
            nxt = order[(pos[r] + step) % R]
            refs[r] = refs[r].copy(nxt, "output", r * K + off, ch=ch)
    if buf_src == "input":
        for r in order:
            prog.chunk(r, "input", off, w).copy(r, "output", r * K + off)


def _ring_reduce_scatter(prog, order, K, off, w, ch, *, into_output_all: bool):
    """Owner o's pieces travel o+1, o+2, ..., o, each rank adding its input; partial sums go to scratch
    (ReduceScatter) or to the output slot (AllReduce, overwritten later by the allgather)."""
    R = len(order)
    pos = {r: p for p, r in enumerate(order)}
    acc = {o: prog.chunk(order[(pos[o] + 1) % R], "input", o * K + off, w) for o in order}
    for step in range(1, R):
        for o in order:
            b = order[(pos[o] + 1 + step) % R]
            if into_output_all:
                into = ("output", o * K + off)
            else:
                into = ("output", off) if b == o else ("partial", o * K + off)
            acc[o] = prog.chunk(b, "input", o * K + off, w).reduce(acc[o], into=into, ch=ch)


def _channel_sets(flows: int, channels: int) -> list:
    """Channels for each of `flows` independent flows (rings, trees): flow f runs on f, f + flows, ...: its
    own connections, and room to spill over when one thread block's steps are full; with fewer `channels`
    than flows (instances take the rest), flows share them round robin."""
    if flows <= 1:
        return [None] * flows
    if flows > channels:
        return [(f % channels,) for f in range(flows)]
    return [tuple(range(f, channels, flows)) for f in range(flows)]


def ring(topology, coll: str, chunkup: int = 1, channels: int = MAX_CHANNELS,
         flows: int | None = None) -> DSLProgram:
    """Rings (`ring_orders`) over `channels`: at most `flows` of them (default 32, NCCL's channel limit: NCCL
    runs a ring per channel)."""
    orders = ring_orders(topology)[:max(1, flows or MAX_CHANNELS)]
    R, w = len(orders[0]), chunkup
    K = w * len(orders)
    prog = DSLProgram(coll, R, K, name=f"ring-{coll}")
    chans = _channel_sets(len(orders), channels)  # a ring of R ranks needs R - 1 steps per block
    for j, order in enumerate(orders):
        ch = chans[j]
        if coll == "allgather":
            _ring_allgather(prog, order, K, j * w, w, ch)
        elif coll == "reducescatter":
            _ring_reduce_scatter(prog, order, K, j * w, w, ch, into_output_all=False)
        elif coll == "allreduce":
            _ring_reduce_scatter(prog, order, K, j * w, w, ch, into_output_all=True)
    if coll == "allreduce":
        for j, order in enumerate(orders):
            _ring_allgather(prog, order, K, j * w, w, chans[j], buf_src="output")
    return prog


def direct(topology, coll: str, chunkup: int = 1) -> DSLProgram:
    R = topology.num_ranks
    k = chunkup
    prog = DSLProgram(coll, R, chunkup, name=f"direct-{coll}")
    if coll in ("reducescatter", "allreduce"):
        _direct_reduce(prog, R, k, into_output_all=coll == "allreduce")
        return prog
    for off in range(1, R):
        for s in range(R):
            d = (s + off) % R
            if coll == "alltoall":
                prog.chunk(s, "input", d * k, k).copy(d, "output", s * k)
            else:
                prog.chunk(s, "input", 0, k).copy(d, "output", s * k)
    for s in range(R):
        prog.chunk(s, "input", s * k if coll == "alltoall" else 0, k).copy(s, "output", s * k)
    return prog


def _direct_reduce(prog, R, k, *, into_output_all: bool):
    """Every rank sends owner d's block into d's scratch; d reduces the R-1 blocks and its own in one
    local pass (consecutive `re` steps the runtime fuses); AllReduce then sends the sum to everyone."""
    for off in range(1, R):
        for s in range(R):
            d = (s + off) % R
            prog.chunk(s, "input", d * k, k).copy(d, "gathered", s * k)
    for d in range(R):
        home = ("output", d * k) if into_output_all else ("output", 0)
        acc = prog.chunk(d, "input", d * k, k).copy(d, *home)
        for off in range(1, R):
            acc = acc.reduce(prog.chunk(d, "gathered", ((d + off) % R) * k, k))
    if into_output_all:
        for off in range(1, R):
            for s in range(R):
                prog.chunk(s, "output", s * k, k).copy((s + off) % R, "output", s * k)


def one_shot(topology, coll: str, chunkup: int = 1) -> DSLProgram:
    R = topology.num_ranks
    n = R * chunkup  # an AllReduce buffer: R chunks of chunkup pieces
    prog = DSLProgram(coll, R, chunkup, name=f"one-shot-{coll}")
    for off in range(1, R):
        for s in range(R):
            prog.chunk(s, "input", 0, n).copy((s + off) % R, "gathered", s * n)
    for d in range(R):
        acc = prog.chunk(d, "input", 0, n).copy(d, "output", 0)
        for off in range(1, R):
            acc = acc.reduce(prog.chunk(d, "gathered", ((d + off) % R) * n, n))
    return prog


def _trees(n: int):
    """Two binary trees over n items (heap layout and its mirror): parent lists (root has parent -1)."""
    t1 = [-1] + [(i - 1) // 2 for i in range(1, n)]
    m = list(range(n - 1, -1, -1))  # mirror: item i sits at heap position n-1-i
    t2 = [-1] * n
    for pos in range(1, n):
        t2[m[pos]] = m[(pos - 1) // 2]
    return t1, t2


def double_binary_tree(topology, coll: str, chunkup: int = 1, channels: int = MAX_CHANNELS,
                       flows: int | None = None) -> DSLProgram:
    """NCCL's trees: per NIC rail (one on a single node; at most `flows` trees, default 32 as NCCL's
    channels) a pair of mirrored binary trees over the nodes, each node a chain opened at that rail's GPU
    (the first tree's chain enters through the rail's NIC, the second's, reversed, through the NIC of the
    chain's last GPU), every tree on its own channels and reducing then broadcasting its share of the
    chunks, pipelined chunk by chunk."""
    R = topology.num_ranks
    prog = DSLProgram(coll, R, chunkup, name="double-binary-tree-allreduce")
    cyc = node_cycle(topology)
    nodes = topology.nodes
    node_trees = _trees(nodes)
    trees = []
    for j in rail_starts(topology, cyc)[:max(1, (flows or MAX_CHANNELS) // 2)]:
        opened = cyc[j:] + cyc[:j]
        for parents, chain in zip(node_trees, (opened, opened[::-1])):
            # rank tree: inside a node a chain (chain[0] is the node's head), heads joined by the node tree
            parent = {}
            for n in range(nodes):
                ranks = [topology.rank(n, l) for l in chain]
                for a, b in zip(ranks, ranks[1:]):
                    parent[b] = a
                parent[ranks[0]] = topology.rank(parents[n], chain[0]) if parents[n] >= 0 else -1
            trees.append(parent)
    T, C = len(trees), prog.coll.num_chunks
    events = []
    for t, parent in enumerate(trees):
        chunks = range(C * t // T, C * (t + 1) // T)
        children = {r: [] for r in range(R)}
        root = None
        for r, p in parent.items():
            if p < 0:
                root = r
            else:
                children[p].append(r)
        height, depth, post = {}, {root: 0}, []

        def visit(u):
            for v in children[u]:
                depth[v] = depth[u] + 1
                visit(v)
            height[u] = 1 + max((height[v] for v in children[u]), default=-1)
            post.append(u)

        visit(root)
        H = height[root]
        # pipelined schedule: chunk i is reduced at node u at step i + height(u), then sent down at
        # step i + H + 1 + depth(u)
        for i, c in enumerate(chunks):
            for u in post:
                events.append((i + height[u], 0, t, c, u, children[u]))
                events.append((i + H + 1 + depth[u], 1, t, c, u, children[u]))
    chans = _channel_sets(T, channels)  # the two trees of a rail join the same GPUs in opposite directions
    result = {}
    for _, phase, t, c, u, kids in sorted(events, key=lambda e: e[:5]):  # all trees' operations in step order
        if phase == 0:  # reduce the children's partial sums into u
            acc = prog.chunk(u, "input", c)
            for v in kids:
                acc = acc.reduce(result[(c, v)], into=("output", c), ch=chans[t])
            result[(c, u)] = acc
        else:  # broadcast the full sum from u to its children
            for v in kids:
                prog.chunk(u, "output", c).copy(v, "output", c, ch=chans[t])
    return prog


def hierarchical(topology, coll: str, chunkup: int = 1) -> DSLProgram:
    G, N = topology.gpus_per_node, topology.nodes
    R = G * N
    k = chunkup
    prog = DSLProgram(coll, R, chunkup, name="hierarchical-allreduce")
    cyc = node_cycle(topology)
    shard = N * k  # chunks per shard; local GPU cyc[j] owns shard j of its node
    # 1. intra-node ring reduce-scatter of shards into the output
    for n in range(N):
        ranks = [topology.rank(n, l) for l in cyc]
        acc = {j: prog.chunk(ranks[(j + 1) % G], "input", j * shard, shard) for j in range(G)}
        if G == 1:  # one GPU a node: its input is its node's sum (the network ring alone is left)
            acc[0].copy(ranks[0], "output", 0)
        for step in range(1, G):
            for j in range(G):
                b = ranks[(j + 1 + step) % G]
                acc[j] = prog.chunk(b, "input", j * shard, shard).reduce(acc[j], into=("output", j * shard))
    # 2. inter-node ring allreduce of each shard among the GPUs with the same local position
    if N > 1:
        for j in range(G):
            ring_ranks = [topology.rank(n, cyc[j]) for n in range(N)]
            base = j * shard
            acc = {m: prog.chunk(ring_ranks[(m + 1) % N], "output", base + m * k, k) for m in range(N)}
            for step in range(1, N):
                for m in range(N):
                    b = ring_ranks[(m + 1 + step) % N]
                    acc[m] = prog.chunk(b, "output", base + m * k, k).reduce(acc[m])
            refs = {m: prog.chunk(ring_ranks[m], "output", base + m * k, k) for m in range(N)}
            for step in range(1, N):
                for m in range(N):
                    refs[m] = refs[m].copy(ring_ranks[(m + step) % N], "output", base + m * k)
    # 3. intra-node ring allgather of the shards
    for n in range(N):
        ranks = [topology.rank(n, l) for l in cyc]
        refs = {j: prog.chunk(ranks[j], "output", j * shard, shard) for j in range(G)}
        for step in range(1, G):
            for j in range(G):
                refs[j] = refs[j].copy(ranks[(j + step) % G], "output", j * shard)
    return prog


def two_step(topology, coll: str, chunkup: int = 1) -> DSLProgram:
    G, N = topology.gpus_per_node, topology.nodes
    R = G * N
    k = chunkup
    if N < 2:
        raise UserError("two-step AllToAll needs at least 2 nodes; use 'direct' inside one node")
    prog = DSLProgram(coll, R, chunkup, name="two-step-alltoall")
    # 1. intra-node: (n,g) -> (n,h) the chunks for every (m,h), m != n, staged at agg[(m*G + g)*k]
    for off in range(G):
        for n in range(N):
            for g in range(G):
                h = (g + off) % G
                s, relay = topology.rank(n, g), topology.rank(n, h)
                for m in range(N):
                    d = topology.rank(m, h)
                    src = prog.chunk(s, "input", d * k, k)
                    if m == n:
                        src.copy(d, "output", s * k)
                    else:
                        src.copy(relay, "agg", (m * G + g) * k)
    # 2. inter-node: one aggregated send per remote GPU
    for off in range(1, N):
        for n in range(N):
            m = (n + off) % N
            for h in range(G):
                relay, d = topology.rank(n, h), topology.rank(m, h)
                prog.chunk(relay, "agg", m * G * k, G * k).copy(d, "output", n * G * k)
    return prog


_BUILDERS = {"ring": ring, "double-binary-tree": double_binary_tree, "direct": direct,
             "one-shot": one_shot, "hierarchical": hierarchical, "two-step": two_step}


_CHANNELLED = (ring, double_binary_tree)  # the builders that spread their rings or trees over channels


def _known(name: str, collective_name: str) -> str:
    """The collective's canonical name, once the baseline is known to implement it."""
    if name not in BASELINES:
        raise UserError(f"unknown baseline {name!r}; known: {', '.join(BASELINES)}")
    coll = canonical_name(collective_name)
    if coll not in BASELINES[name]:
        raise UserError(f"baseline {name!r} implements {', '.join(BASELINES[name])}, not {coll!r}")
    return coll


def build_dsl(name: str, topology, collective_name: str, *, chunkup: int = 1,
              channels: int = MAX_CHANNELS, flows: int | None = None) -> DSLProgram:
    """The traced DSL program of a baseline (not yet lowered), its rings or trees spread over `channels`, at
    most `flows` of them (default: a ring or tree per channel, as NCCL)."""
    coll = _known(name, collective_name)
    if chunkup < 1:
        raise UserError(f"chunk-up must be at least 1, got {chunkup}")
    builder = _BUILDERS[name]
    if builder in _CHANNELLED:
        prog = builder(topology, coll, chunkup, channels=channels, flows=flows)
    else:
        prog = builder(topology, coll, chunkup)
    for kind, src, dst, _, _ in prog._ops:
        if src.rank != dst.rank and topology.link(src.rank, dst.rank) is None:
            raise UserError(f"baseline {name!r} needs a link {src.rank}->{dst.rank}, which topology "
                            f"{topology.name!r} lacks")
    return prog


# NCCL's own rings and trees loop over their steps: no per-block step limit. A baseline that stands for
# NCCL's algorithm (a reference to beat, `build(..., reference=True)`) is lowered for a runtime built with
# 16x the executor's MSCCL_MAX_NUM_STEPS (64) and MAX_NODES (4096), so that, say, a 128-rank ring keeps
# NCCL's 32 channels; such a program runs on a runtime built that large, or stands for NCCL itself.
REFERENCE_MAX_STEPS = 16 * DEFAULT_MAX_STEPS
REFERENCE_MAX_NODES = 16 * MAX_NODES


def build(name: str, topology, collective_name: str, *, chunkup: int = 1, instances: int = 1,
          proto: str = "Simple", max_tbs: int = 108, reference: bool = False, max_memory_bytes: int | None = None,
          max_memory_source: str = "--max-memory", target: str = "msccl-executor", report=SILENT) -> Program:
    """A baseline as a proven Program (see the module docstring) for the runtime `target` (`taccl.targets`);
    ``reference`` lifts the executor's limits of 64 steps per thread block and 4096 XML nodes per rank (see
    `REFERENCE_MAX_STEPS`). One that would need more memory than ``max_memory_bytes`` (None: this machine's)
    is refused before it is traced."""
    program = build_protocols(name, topology, collective_name, [proto], chunkup=chunkup, instances=instances,
                              max_tbs=max_tbs, reference=reference, max_memory_bytes=max_memory_bytes,
                              max_memory_source=max_memory_source, target=target, report=report)[proto]
    if isinstance(program, UserError):
        raise program
    return program


def build_protocols(name: str, topology, collective_name: str, protocols, *, chunkup: int = 1,
                    instances: int = 1, max_tbs: int = 108, reference: bool = False,
                    max_memory_bytes: int | None = None, max_memory_source: str = "--max-memory",
                    target: str = "msccl-executor", report=SILENT) -> dict:
    """`build` for each of `protocols`: {protocol: Program, or the UserError its lowering raised}, traced
    once and lowered once where the protocol changes nothing (`DSLProgram.lower_protocols`).

    A ring or tree is spread over NCCL's 32 channels (split among the instances). NCCL loops over its steps;
    a program stores every one, and a block holds at most 64 steps. So where NCCL's 32 rings exceed the
    runtime's limits (a 144-rank ring of 143 steps fills one channel twice over), a runnable baseline (not
    ``reference``) takes the most rings or trees that fit, halving them (each then spills over more of the
    channels), and says so through `report`."""
    from .budget import check_baseline_memory

    for proto in protocols:
        topology.spec.check_protocol(proto)
    check_baseline_memory(name, topology, collective_name, instances, max_memory_bytes, chunkup=chunkup,
                          source=max_memory_source)
    channels = max(1, MAX_CHANNELS // max(1, instances))  # each instance repeats the program on its own
    limits = dict(max_steps=REFERENCE_MAX_STEPS, max_nodes=REFERENCE_MAX_NODES) if reference else {}
    runtime = get_target(target)
    if runtime.max_tbs is not None:
        max_tbs = min(max_tbs, runtime.max_tbs)
    flows = MAX_CHANNELS
    while True:
        prog = build_dsl(name, topology, collective_name, chunkup=chunkup, channels=channels, flows=flows)
        out = prog.lower_protocols(protocols, instances=instances, max_tbs=max_tbs, fuse=runtime.fused_steps,
                                   fused_receives=runtime.fused_steps, **limits)
        over = all(isinstance(v, RuntimeLimitsError) for v in out.values())
        if reference or not over or flows == 1 or _BUILDERS[name] not in _CHANNELLED:
            if flows < MAX_CHANNELS and not over:
                kind = "rings" if name == "ring" else "trees"
                report(f"baseline {name!r}: {MAX_CHANNELS} {kind} (NCCL's most) exceed {runtime.name}'s limits "
                       f"on {topology.num_ranks} ranks; built with {flows} {kind} at most, the most that fit")
            return out
        flows //= 2


def _flows(name: str, topology) -> int:
    """How many rings or trees the ring or tree baseline has (a channel each, as NCCL runs them)."""
    if name == "ring":
        return min(ring_count(topology), MAX_CHANNELS)
    if name == "double-binary-tree":
        return 2 * min(len(rail_starts(topology, node_cycle(topology))), MAX_CHANNELS // 2)
    raise UserError(f"baseline {name!r} has no rings or trees to put one per channel")


def nccl_channel_instances(name: str, topology) -> int | None:
    """On one node, the instances that put a ring or tree baseline on all of NCCL's 32 channels, which NCCL
    runs there at large sizes: fewer leave its one ring on a few thread blocks, which cannot fill an NVSwitch
    port (a 64 MiB AllGather on one DGX H100: 720 us on 4 instances, 185 on 32; NCCL measured 192). None for
    the baselines without rings or trees, and on several nodes, where NCCL's channels follow the NICs (a ring
    per NIC) and the network, not the blocks, bounds them."""
    if _BUILDERS.get(name) not in _CHANNELLED or topology.nodes > 1:
        return None
    return max(1, MAX_CHANNELS // _flows(name, topology))


def build_on_channels(name: str, topology, collective_name: str, channels: int, *, proto: str = "Simple",
                      max_tbs: int = 108) -> Program:
    """A ring or tree baseline on `channels` channels in all, as NCCL counts them (a ring or a tree per
    channel): as many instances as its rings or trees fit, each instance's on its share of the channels
    (with fewer channels than rings or trees, they share them)."""
    flows = _flows(name, topology)
    instances = max(1, channels // flows)
    prog = build_dsl(name, topology, collective_name, channels=max(1, channels // instances))
    return prog.lower(instances=instances, proto=proto, max_tbs=max_tbs)


def operations(name: str, topology, collective_name: str, *, chunks: bool = False) -> int:
    """How many operations `build_dsl` traces for this baseline, counted without tracing them (a 1024-rank
    ring traces millions); with `chunks`, their chunks summed. A program on one instance has about as many
    steps as operations; on several, every operation is cut into single chunks first, each on every instance."""
    coll = _known(name, collective_name)
    G, N = topology.gpus_per_node, topology.nodes
    R = G * N
    pairs = R * (R - 1)
    if name == "one-shot":
        return (2 * pairs + R) * (R if chunks else 1)  # every operation moves the whole buffer
    if name == "hierarchical":  # the node phases move a shard (one chunk per node) at a time
        return (2 * N * G * (G - 1) * (N if chunks else 1) + (2 * G * N * (N - 1) if N > 1 else 0)
                + (N * (N if chunks else 1) if G == 1 else 0))  # one GPU a node: each copies its input home
    if name == "two-step":  # the network phase moves a node's G chunks at once
        return R * R + (N - 1) * N * G * (G if chunks else 1)
    if name == "ring":
        per_ring = {"allgather": pairs + R, "reducescatter": pairs, "allreduce": 2 * pairs}[coll]
        return min(ring_count(topology), MAX_CHANNELS) * per_ring
    if name == "direct":
        # sends to every peer; ReduceScatter adds the owner's copy home and R - 1 reductions, AllReduce
        # then sends the sum to every peer
        return {"alltoall": pairs + R, "allgather": pairs + R, "reducescatter": 2 * pairs + R,
                "allreduce": 3 * pairs + R}[coll]
    # double-binary-tree (AllReduce, whose R chunks are counted, not built: R may be huge): every chunk is
    # reduced up one tree and broadcast down it, R - 1 operations each way
    return 2 * (R - 1) * R


def applicable(name: str, topology, collective_name: str) -> bool:
    """Whether `build` can make this baseline here (right collective, links present)."""
    try:
        build_dsl(name, topology, collective_name)
    except UserError:
        return False
    return True
