"""Pass: channel and thread-block allocation (MSCCLang section 5.2; TACCL section 6.2).

Constraints (msccl-xml.md 1.5 and "Rules a generator must respect"):

- a thread block has at most one send peer and one receive peer, and one channel;
- on a rank and channel, one thread block per send peer and one per receive peer (one tb per connection);
- at most 32 sending and 32 receiving thread blocks per channel, at most ``max_channels`` channels;
- at most ``step_cap`` steps per thread block (the runtime allows 64, nops included);
- all thread blocks of a rank are co-resident, so at most ``max_tbs`` of them.

A *flow* is a chain of transfers joined by fused instructions (an ``rcs`` receives on one connection and
sends on another, so both must be on its channel); a plain transfer is a flow of one. Flows are placed in
key order on the lowest channel where every instruction fits; a fused flow that fits nowhere is unfused
(the receive and the send become separate instructions again) and its pieces placed one by one. Each
connection gets its own thread block, except where a fused instruction forces a (receive peer, send peer)
pair; when a rank then has more than ``max_tbs`` thread blocks, send-only and receive-only blocks of one
channel are merged.

Deadlock freedom: every thread block runs its instructions in key order, a matched send and receive share
a key, a fused instruction's two keys have no other key between them, and every dependency has a smaller
key than its dependent. Take the smallest key whose event has not completed: everything before it in any
thread block has completed, so both of its ends are at the head of their blocks with their dependencies
met, and it completes, even with unbuffered (rendezvous) sends. So any grouping of instructions into
thread blocks that respects the constraints above is deadlock-free, merging included.
"""
from __future__ import annotations

import heapq
from bisect import bisect_right

from ..errors import RuntimeLimitsError, UserError
from ..program import StepType
from .ops import Instr

__all__ = ["TB", "allocate", "order_tb", "OrderFailed", "ChannelsFull"]

MAX_TBS_PER_CHANNEL = 32


class TB:
    __slots__ = ("rank", "ch", "send", "recv", "instrs", "nsteps", "index")

    def __init__(self, rank, ch, send=-1, recv=-1):
        self.rank, self.ch, self.send, self.recv = rank, ch, send, recv
        self.instrs = []
        self.nsteps = 0
        self.index = -1

    def __repr__(self):
        return f"TB(r{self.rank}, ch{self.ch}, send={self.send}, recv={self.recv}, {self.nsteps} steps)"


class _State:
    def __init__(self, step_cap, pack=False):
        self.pack = pack  # put a new connection into an existing tb that lacks that direction
        self.by_rc = {}  # (rank, ch) -> tbs
        self.owner = {}  # (rank, ch, "S"|"R", peer) -> TB
        self.nsend = {}  # (rank, ch) -> sending tbs
        self.nrecv = {}
        self.tbs = []
        self.step_cap = step_cap
        self.log = None
        self.hints = {}  # (rank, "S", send peer, pinned channel) -> recv peer of a fused instruction, and vice versa
        self.spans = {}  # with ``pack``: (rank, "S"|"R", peer) -> the schedule's spans of that connection's transfers

    # --- tentative changes with an undo log
    def _set_owner(self, k, tb):
        self.log.append(("owner", k, self.owner.get(k)))
        self.owner[k] = tb

    def _inc(self, table, k):
        self.log.append(("inc", table, k))
        table[k] = table.get(k, 0) + 1

    def _new_tb(self, rank, ch):
        tb = TB(rank, ch)
        self.tbs.append(tb)
        self.by_rc.setdefault((rank, ch), []).append(tb)
        self.log.append(("tb", tb))
        return tb

    def _set_peer(self, tb, attr, peer):
        self.log.append(("peer", tb, attr, getattr(tb, attr)))
        setattr(tb, attr, peer)

    def _step(self, tb, ins):
        self.log.append(("step", tb, ins))
        tb.nsteps += 1
        tb.instrs.append(ins)
        ins.tb, ins.ch = tb, tb.ch

    def undo(self):
        for entry in reversed(self.log):
            kind = entry[0]
            if kind == "owner":
                _, k, old = entry
                if old is None:
                    del self.owner[k]
                else:
                    self.owner[k] = old
            elif kind == "inc":
                entry[1][entry[2]] -= 1
            elif kind == "tb":
                tb = self.tbs.pop()
                self.by_rc[(tb.rank, tb.ch)].pop()
            elif kind == "peer":
                setattr(entry[1], entry[2], entry[3])
            elif kind == "step":
                tb, ins = entry[1], entry[2]
                tb.nsteps -= 1
                tb.instrs.pop()
                ins.tb = ins.ch = None
        self.log = None

    def _packable(self, r, ch, attr, peer):
        """With ``pack``: an existing tb of (rank, channel) whose `attr` peer is still free; of those, the
        one where the schedule has this connection and the block's other one delay each other least
        (`_send_delay`), the first on ties."""
        if not self.pack:
            return None
        mine = self.spans.get((r, "S" if attr == "send" else "R", peer), ())
        best, best_delay = None, None
        for tb in self.by_rc.get((r, ch), ()):
            if getattr(tb, attr) >= 0 or tb.nsteps >= self.step_cap:
                continue
            if attr == "send":
                delay = _send_delay(mine, self.spans.get((r, "R", tb.recv), ())) if tb.recv >= 0 else 0.0
            else:
                delay = _send_delay(self.spans.get((r, "S", tb.send), ()), mine) if tb.send >= 0 else 0.0
            if best is None or delay < best_delay:
                best, best_delay = tb, delay
                if delay == 0.0:
                    break
        return best

    def _pair_hint(self, tb, r, ch, direction, peer, want):
        """A new one-connection tb takes the partner connection that a fused instruction will need."""
        other = self.hints.get((r, direction, peer, want))
        if other is None or (tb.recv if direction == "S" else tb.send) >= 0:
            return  # no hint, or a packed block whose other direction is taken already
        if direction == "S":
            if (r, ch, "R", other) in self.owner or self.nrecv.get((r, ch), 0) >= MAX_TBS_PER_CHANNEL:
                return
            self._set_peer(tb, "recv", other)
            self._set_owner((r, ch, "R", other), tb)
            self._inc(self.nrecv, (r, ch))
        else:
            if (r, ch, "S", other) in self.owner or self.nsend.get((r, ch), 0) >= MAX_TBS_PER_CHANNEL:
                return
            self._set_peer(tb, "send", other)
            self._set_owner((r, ch, "S", other), tb)
            self._inc(self.nsend, (r, ch))

    def place(self, ins: Instr, ch: int) -> bool:
        r, sp, rp = ins.rank, ins.send_peer, ins.recv_peer
        so = self.owner.get((r, ch, "S", sp)) if sp >= 0 else None
        ro = self.owner.get((r, ch, "R", rp)) if rp >= 0 else None
        if sp >= 0 and rp >= 0:
            if so is not None and ro is not None:
                if so is not ro:
                    return False
                tb = so
            elif so is not None:
                if so.recv >= 0 or self.nrecv.get((r, ch), 0) >= MAX_TBS_PER_CHANNEL:
                    return False
                tb = so
                self._set_peer(tb, "recv", rp)
                self._set_owner((r, ch, "R", rp), tb)
                self._inc(self.nrecv, (r, ch))
            elif ro is not None:
                if ro.send >= 0 or self.nsend.get((r, ch), 0) >= MAX_TBS_PER_CHANNEL:
                    return False
                tb = ro
                self._set_peer(tb, "send", sp)
                self._set_owner((r, ch, "S", sp), tb)
                self._inc(self.nsend, (r, ch))
            else:
                if (self.nsend.get((r, ch), 0) >= MAX_TBS_PER_CHANNEL
                        or self.nrecv.get((r, ch), 0) >= MAX_TBS_PER_CHANNEL):
                    return False
                tb = self._new_tb(r, ch)
                self._set_peer(tb, "send", sp)
                self._set_peer(tb, "recv", rp)
                self._set_owner((r, ch, "S", sp), tb)
                self._set_owner((r, ch, "R", rp), tb)
                self._inc(self.nsend, (r, ch))
                self._inc(self.nrecv, (r, ch))
        elif sp >= 0:
            tb = so
            if tb is None:
                if self.nsend.get((r, ch), 0) >= MAX_TBS_PER_CHANNEL:
                    return False
                tb = self._packable(r, ch, "send", sp) or self._new_tb(r, ch)
                self._set_peer(tb, "send", sp)
                self._set_owner((r, ch, "S", sp), tb)
                self._inc(self.nsend, (r, ch))
                self._pair_hint(tb, r, ch, "S", sp, ins.want_ch)
        else:
            tb = ro
            if tb is None:
                if self.nrecv.get((r, ch), 0) >= MAX_TBS_PER_CHANNEL:
                    return False
                tb = self._packable(r, ch, "recv", rp) or self._new_tb(r, ch)
                self._set_peer(tb, "recv", rp)
                self._set_owner((r, ch, "R", rp), tb)
                self._inc(self.nrecv, (r, ch))
                self._pair_hint(tb, r, ch, "R", rp, ins.want_ch)
        if tb.nsteps + 1 > self.step_cap:
            return False
        self._step(tb, ins)
        return True


class _Spread:
    """A connection with more transfers than one thread block holds needs k = ceil(n / step_cap) blocks,
    one per channel. Filling them in turn would leave all but one idle at any time (the first 64 steps of a
    16-node AllReduce's node connections are its ReduceScatter, the next 64 its AllGather: each phase ran
    on half the blocks, at half their bandwidth). So a flow goes first to the one of its first k channels
    where its connections have the fewest transfers so far: consecutive transfers of a connection
    alternate between its blocks and run side by side (and a fused flow, one chunk's whole ring, too).
    `min_blocks` (`LoweringOptions.connection_blocks`) raises k for connections of several transfers."""

    def __init__(self, live, step_cap, min_blocks=1):
        self.count, self.placed = {}, {}  # (rank, send peer) -> its transfers; (.., channel) -> placed so far
        for ins in live:
            if ins.send_peer >= 0:
                key = (ins.rank, ins.send_peer)
                self.count[key] = self.count.get(key, 0) + 1
        self.step_cap = step_cap
        self.min_blocks = min_blocks

    @staticmethod
    def _conns(flow):
        return [(i.rank, i.send_peer) for i in flow if i.send_peer >= 0]

    def order(self, flow, chans):
        """`chans` (sorted) in the order to try them for `flow`."""
        conns = self._conns(flow)
        k = max(max(-(-n // self.step_cap), min(self.min_blocks, n)) for n in (self.count[c] for c in conns))
        if k <= 1 or len(chans) <= 1:
            return chans
        load = {ch: max(self.placed.get(c + (ch,), 0) for c in conns) for ch in chans[:k]}
        return sorted(chans[:k], key=lambda ch: (load[ch], ch)) + chans[k:]

    def place(self, flow, ch):
        for c in self._conns(flow):
            self.placed[c + (ch,)] = self.placed.get(c + (ch,), 0) + 1


def _connection_spans(live) -> dict:
    """(rank, "S"|"R", peer) -> the (send, arrival) spans of that connection's transfers in the schedule;
    connections without spans (the DSL's) get none."""
    spans = {}
    for ins in live:
        if ins.span is None:
            continue
        if ins.send_peer >= 0:
            spans.setdefault((ins.rank, "S", ins.send_peer), []).append(ins.span)
        if ins.recv_peer >= 0:
            spans.setdefault((ins.rank, "R", ins.recv_peer), []).append(ins.span)
    return spans


def _send_delay(sends, recvs) -> float:
    """What sharing one thread block costs the sends, by the schedule: the block runs its steps in send-time
    order, so a send waits for every receive ordered before it to arrive (receives wait little behind a
    send: it only queues its data). `sends` and `recvs` are (send, arrival) spans."""
    if not sends or not recvs:
        return 0.0
    recvs = sorted(recvs)
    starts = [a for a, _ in recvs]
    latest, arrived = [], 0.0
    for _, b in recvs:
        arrived = max(arrived, b)
        latest.append(arrived)  # the last arrival among the receives up to here
    total = 0.0
    for t, _ in sends:
        k = bisect_right(starts, t) - 1  # a receive sent at the same time may be ordered first
        if k >= 0 and latest[k] > t:
            total += latest[k] - t
    return total


def _flows(live):
    parent = {}

    def find(i):
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    for ins in live:
        parent[ins.id] = ins.id
    for ins in live:
        if ins.to is not None:
            a, b = find(ins.id), find(ins.to.id)
            if a != b:
                parent[a] = b
    groups = {}
    for ins in live:
        if ins.send_peer >= 0 or ins.recv_peer >= 0:
            groups.setdefault(find(ins.id), []).append(ins)
    flows = [sorted(g, key=lambda i: i.pos) for g in groups.values()]
    flows.sort(key=lambda g: g[0].pos)
    return flows


def _unfuse(x: Instr, instrs: list) -> tuple:
    """Split a fused instruction back into its receive and a separate send; returns the two."""
    z = x.to
    base = {StepType.RECV_COPY_SEND: StepType.RECV, StepType.RECV_REDUCE_COPY_SEND: StepType.RECV_REDUCE_COPY,
            StepType.RECV_REDUCE_SEND: StepType.RECV_REDUCE_COPY}[x.type]
    y = Instr(len(instrs), x.rank, StepType.SEND, srcbuf=x.dstbuf, srcoff=x.dstoff, cnt=x.cnt,
              send_peer=x.send_peer, key=z.key, origin=x.origin, want_ch=x.want_ch)
    instrs.append(y)
    x.type = base
    x.pos = x.key
    x.send_peer = -1
    x.to = None
    y.to, z.frm = z, y
    y.deps = {x}
    x.dependents.append(y)
    for d in list(x.dependents):
        if d is not y and y.pos < d.pos:
            d.deps.add(y)
            y.dependents.append(d)
    return x, y


def allocate(instrs: list, num_ranks: int, *, max_channels: int, step_cap: int, max_tbs: int,
             pack: bool = False, flag_us: float = 0.0, connection_blocks: int = 1) -> list:
    """Assign channels and thread blocks; returns the TBs (instructions in order, ``index`` unset).
    ``pack`` puts each new connection into an existing tb of its channel that lacks that direction
    (fewer thread blocks, less concurrency); the caller uses it when a rank has too many. ``flag_us``: the
    runtime's latency of a dependency between thread blocks (`_forwarding_block`; 0 when unknown)."""
    live = [i for i in instrs if not i.dead]
    st = _State(step_cap, pack)
    if pack:
        st.spans = _connection_spans(live)
    for ins in sorted(live, key=lambda i: i.pos):
        if ins.send_peer >= 0 and ins.recv_peer >= 0:  # per pinned channel: pinned flows differ by channel
            st.hints.setdefault((ins.rank, "S", ins.send_peer, ins.want_ch), ins.recv_peer)
            st.hints.setdefault((ins.rank, "R", ins.recv_peer, ins.want_ch), ins.send_peer)
    pending = _flows(live)
    spread = _Spread(live, step_cap, connection_blocks)
    pending.reverse()  # a stack: pop the smallest key first
    while pending:
        flow = pending.pop()
        wants = [i.want_ch for i in flow if i.want_ch is not None]  # each a set of allowed channels
        allowed = set(range(max_channels))
        for w in wants:
            allowed &= w
        if not allowed:
            if len(flow) > 2 and len(set(wants)) > 1:
                pending.extend(reversed(_split(flow, instrs)))
                continue
            raise UserError(f"{flow[0].origin or 'a transfer'}: channel(s) {sorted(set().union(*wants))} requested, "
                            f"but channels 0..{max_channels - 1} are available")
        chans = spread.order(flow, sorted(allowed))
        placed = False
        for ch in chans:
            st.log = []
            if all(st.place(ins, ch) for ins in flow):
                st.log = None
                spread.place(flow, ch)
                placed = True
                break
            st.undo()
        if placed:
            continue
        if len(flow) > 2:
            pending.extend(reversed(_split(flow, instrs)))
            continue
        s = flow[0]
        raise ChannelsFull(f"cannot place the transfer {s.rank}->{flow[-1].rank} ({s.origin}): every channel "
                        f"0..{max_channels - 1} is full ({step_cap} steps per thread block, "
                        f"{MAX_TBS_PER_CHANNEL} sending/receiving thread blocks per channel); use fewer chunks "
                        f"or fewer instances")
    # local instructions. A reduction (several steps: same rank and event) whose result one send forwards,
    # or one receive-reduce completes, goes into that step's thread block, just before it, when nothing of
    # that block falls between them: the step then follows the fold without a flag wait (a hop of a reduce
    # chain pays one, not two).
    # Another reduction goes to a thread block of its own rank that does only local work, so it neither
    # waits behind nor delays a connection's steps; either way its steps stay together so the runtime can
    # fuse them into one pass. Other copies (AllGather's own chunk, at the end) go to the block with the
    # fewest steps.
    by_rank = {}
    for tb in st.tbs:
        by_rank.setdefault(tb.rank, []).append(tb)
    local = sorted((i for i in live if i.send_peer < 0 and i.recv_peer < 0), key=lambda i: i.pos)
    groups = {}
    for ins in local:
        groups.setdefault((ins.rank, ins.pos[0]), []).append(ins)
    workers = {}  # rank -> its local-only thread blocks
    for (rank, _), group in sorted(groups.items(), key=lambda kv: kv[1][0].pos):
        reduction = any(i.type is StepType.REDUCE for i in group)
        tb = (_forwarding_block(group, step_cap, flag_us) or _receiving_block(group, step_cap, flag_us)
              if reduction else None)
        if tb is None:
            pool = workers.setdefault(rank, []) if reduction else by_rank.setdefault(rank, [])
            cands = [b for b in pool if b.nsteps + len(group) <= step_cap]
            if cands:
                tb = min(cands, key=lambda b: b.nsteps)
            else:
                tb = TB(rank, 0)
                st.tbs.append(tb)
                pool.append(tb)
        for ins in group:
            tb.instrs.append(ins)
            tb.nsteps += 1
            ins.tb, ins.ch = tb, tb.ch
    tbs = _merge(st.tbs, max_tbs, step_cap)
    for tb in tbs:
        tb.instrs = order_tb(tb.instrs)
    return tbs


_REDUCING_RECEIVES = (StepType.RECV_REDUCE_COPY, StepType.RECV_REDUCE_SEND, StepType.RECV_REDUCE_COPY_SEND)


def _forwarding_block(group: list, step_cap: int, flag_us: float = 0.0):
    """The thread block of the one send, or receive-reduce (the last partial sum, reduced into the fold as
    it lands), that consumes this local reduction, if the fold can go right before it there: no other step
    of that block between the two (or only steps the schedule has landing before the fold could start in a
    block of its own, its operands' arrival plus `flag_us`; the fold's positions then move after them), room
    for the steps; else None."""
    members = {id(i) for i in group}
    consumers = [d for i in group for d in i.dependents if id(d) not in members and not d.dead]
    if not consumers or any(d.tb is None or (d.send_peer < 0 and d.type not in _REDUCING_RECEIVES)
                            for d in consumers):
        return None  # a local step (not placed yet) or a plain receive also waits for the sum
    tbs = {id(d.tb) for d in consumers}
    if len(tbs) != 1:
        return None
    tb = consumers[0].tb
    if tb.nsteps + len(group) > step_cap:
        return None
    first, last = min(i.pos for i in group), min(d.pos for d in consumers)
    # a step its connection's order puts after the consumer is not between, whatever its position (fusion
    # moves a receive-send's position to its send's: the block's next receive from the same peer can have
    # a smaller one)
    between = [i for i in tb.instrs if first < i.pos < last
               and not any(_after_on_connection(i, d) for d in consumers)]
    if between:
        # steps of that block fall between: the fold can still go right after them where the schedule has
        # them arrived before it could start in a block of its own (its partial sums' arrival and a flag):
        # it starts no later, and the consumer waits on no flag
        operands = [d.span[1] for i in group for d in i.deps if id(d) not in members and d.span is not None]
        if not operands:
            return None
        if not _land_before(between, max(operands) + flag_us):
            return None
        after = max(i.pos for i in between)
        for k, ins in enumerate(sorted(group, key=lambda i: i.pos)):
            ins.pos = after + (1 << 30, k)  # no step of the block lies between `after` and this
    return tb


def _after_on_connection(ins, consumer) -> bool:
    """Whether `order_tb` must put `ins` after `consumer` in their block: both receive (or both send) on
    the same connection, `ins` with the later event key (a send's is its matched receive's)."""
    if ins.recv_peer >= 0 and ins.recv_peer == consumer.recv_peer and ins.key > consumer.key:
        return True
    return (ins.send_peer >= 0 and ins.send_peer == consumer.send_peer and ins.to is not None
            and consumer.to is not None and ins.to.key > consumer.to.key)


def _receiving_block(group: list, step_cap: int, flag_us: float):
    """The thread block that received every partial sum this local reduction folds, if the fold can go there
    right after them: every step of that block between the last of them and the fold lands before the fold
    could start in a block of its own (the partials' arrival plus `flag_us`), room for the steps; else None.
    The fold then waits on no flag, only its consumers do (a pair's swapped sum going to the local peers)."""
    members = {id(i) for i in group}
    # the receives of the partials (the fold's sources; its other operand was usually there long before)
    receives = [d for i in group for d in i.deps if id(d) not in members and d.recv_peer >= 0
                and d.dstbuf == i.srcbuf and d.dstoff <= i.srcoff < d.dstoff + d.cnt]
    if not receives or any(d.tb is None or d.span is None for d in receives):
        return None
    tb = receives[0].tb
    if any(d.tb is not tb for d in receives) or tb.nsteps + len(group) > step_cap:
        return None
    last, first = max(d.pos for d in receives), min(i.pos for i in group)
    if not _land_before([i for i in tb.instrs if last < i.pos < first], max(d.span[1] for d in receives) + flag_us):
        return None
    return tb


def _land_before(steps: list, could_start: float) -> bool:
    """Whether the schedule has every one of these steps landed by `could_start`: when a fold could start in
    a block of its own (its operands' arrival and a flag), so putting it after them in theirs costs nothing."""
    return all(i.span is not None and i.span[1] <= could_start for i in steps)


class ChannelsFull(RuntimeLimitsError):
    """A transfer fits on no channel under this step cap (a smaller cap only fills them sooner)."""


class OrderFailed(Exception):
    """A thread block has no order that keeps its connections in event order and its dependencies."""


def order_tb(instrs: list) -> list:
    """Order one thread block: receives by their event key, sends by theirs, same-tb dependencies first;
    among the ready ones the smallest position. Raises `OrderFailed` on a cycle."""
    if len(instrs) <= 1:
        return list(instrs)
    mine = {id(i) for i in instrs}
    succ = {id(i): [] for i in instrs}
    indeg = {id(i): 0 for i in instrs}

    def edge(a, b):
        succ[id(a)].append(b)
        indeg[id(b)] += 1

    recvs = sorted((i for i in instrs if i.recv_peer >= 0), key=lambda i: i.key)
    sends = sorted((i for i in instrs if i.send_peer >= 0), key=lambda i: i.to.key)
    for chain in (recvs, sends):
        for a, b in zip(chain, chain[1:]):
            edge(a, b)
    for i in instrs:
        for d in i.deps:
            if id(d) in mine:
                edge(d, i)
    heap = [(i.pos, i.id, i) for i in instrs if indeg[id(i)] == 0]
    heapq.heapify(heap)
    out = []
    while heap:
        _, _, i = heapq.heappop(heap)
        out.append(i)
        for j in succ[id(i)]:
            indeg[id(j)] -= 1
            if indeg[id(j)] == 0:
                heapq.heappush(heap, (j.pos, j.id, j))
    if len(out) != len(instrs):
        raise OrderFailed()
    return out


def _split(flow, instrs):
    """Unfuse every fused instruction of a flow; returns the resulting single-transfer flows."""
    sends = []
    for x in list(flow):
        if x.send_peer >= 0 and x.recv_peer >= 0:
            sends.append(_unfuse(x, instrs)[1])
        elif x.send_peer >= 0:
            sends.append(x)
    out = [sorted([s, s.to], key=lambda i: i.pos) for s in sends]
    out.sort(key=lambda g: g[0].pos)
    return out


def _merge(tbs, max_tbs, step_cap):
    """Where a rank has more than `max_tbs` blocks, merge send-only with receive-only blocks of one channel,
    the pairs the schedule has delaying each other least first (`_send_delay`: a merged block runs its
    steps in turn, so its sends wait for the receives ordered before them), in block order on ties."""
    by_rank = {}
    for tb in tbs:
        by_rank.setdefault(tb.rank, []).append(tb)
    out = []
    for rank in sorted(by_rank):
        group = by_rank[rank]
        if len(group) > max_tbs:
            sends = [t for t in group if t.send >= 0 and t.recv < 0]
            recvs = [t for t in group if t.recv >= 0 and t.send < 0]
            spans = {id(t): [i.span for i in t.instrs if i.span is not None] for t in sends + recvs}
            pairs = sorted((_send_delay(spans[id(s)], spans[id(r)]), a, b)
                           for a, s in enumerate(sends) for b, r in enumerate(recvs)
                           if r.ch == s.ch and s.nsteps + r.nsteps <= step_cap)
            used = set()
            excess = len(group) - max_tbs
            for _, a, b in pairs:
                if excess <= 0:
                    break
                s, r = sends[a], recvs[b]
                if id(s) in used or id(r) in used:
                    continue
                s.recv = r.recv
                s.instrs.extend(r.instrs)
                s.nsteps += r.nsteps
                for ins in r.instrs:
                    ins.tb = s
                used.add(id(s))
                used.add(id(r))
                excess -= 1
            merged_away = {id(r) for r in recvs if id(r) in used}
            group = [t for t in group if id(t) not in merged_away]
        out.extend(group)
    return out
