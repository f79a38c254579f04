"""Prove an MSCCL-IR program correct: runtime rules, deadlock freedom, race freedom, the collective.

`check_program(program) -> CheckReport` runs, in order:

1. **Rules** of ``msccl-xml.md`` section 1 and "Rules a generator must respect": ranks, limits (section 1.10,
   executor defaults unless ``dialect="legacy"``), thread-block ids, peers, channels, connection uniqueness,
   step indices, counts, offsets, dependencies and ``nop`` encoding, FIFO matching with equal ``cnt``,
   i/o chunk counts against the collective. Rule ids and examples: ``docs/checker.md``.
2. **Scheduling** (event-driven, a worklist of blocked thread blocks): every tb runs its steps in order; a
   step waits for its dependency, a receive for its matched send, and a send for room in the connection's
   FIFO (Simple: 2 calls in flight per connection, LL/LL128: 8). Steps are atomic; fused steps need their
   data and their FIFO room together. If some tb never finishes, the wait-for cycle is reported
   (``deadlock``). The same is done with rendezvous (unbuffered) sends, where a fused step receives and
   then sends; a deadlock there is a warning (``deadlock-rendezvous``), the sufficient condition of rule 6.
3. **Symbolic execution** in the scheduled order, at chunk granularity, once per call kind the program
   serves (in-place and/or out-of-place, with the aliasing of section 1.8). A slot holds a multiset of
   (origin rank, origin index) contributions, stored as a fingerprint: each contribution has a fixed
   random 64-bit weight (plus a count field), a multiset is the integer sum of its weights, so a missing,
   extra or doubled contribution changes the value. Output and scratch start uninitialised.
4. **Races**: two steps of one rank touching one slot, at least one writing, in different tbs, must be
   ordered by a happens-before path through program order, dependencies and send->recv matches (FIFO
   capacity is not counted). Each access is compared with the slot's last write and the reads since; a pair
   is first decided by per-rank vector clocks over program order and dependencies, then, if needed, by a
   search through the global graph bounded by the schedule's order.
5. **Postcondition** of the declared collective.

Collective semantics (cf = chunks per rank = nchunksperloop / ngpus; Chunk(r, j) is rank r's input chunk j):

============== ============================ ===============================================================
collective     input (rank r)               output
============== ============================ ===============================================================
allgather      i[k] = Chunk(r, k), k < cf   every rank: out[i*cf + k] = Chunk(i, k)
alltoall       i[j], j < nchunksperloop     rank r: out[i*cf + k] = Chunk(i, r*cf + k)
reducescatter  i[j], j < nchunksperloop     rank r: out[c] = sum over ranks q of Chunk(q, r*cf + c), c < cf
allreduce      i[j], j < nchunksperloop     every rank: out[c] = sum over q of Chunk(q, c)
broadcast      root only: i[j]              every rank: out[c] = Chunk(root, c)
reduce         i[j], j < nchunksperloop     root: out[c] = sum over q of Chunk(q, c)
gather         i[k], k < cf                 root: out[i*cf + k] = Chunk(i, k)
scatter        root only: i[j]              rank r: out[k] = Chunk(root, r*cf + k), k < cf
============== ============================ ===============================================================

The root is ``program.root``, else the ``root`` argument, else 0. In-place aliasing (section 1.8): allgather
and gather ``i[j]`` is ``o[rank*cf + j]``; reducescatter and scatter ``o[j]`` is ``i[rank*cf + j]``; every other
collective has ``o`` and ``i`` at the same address. Other collectives (custom, send, recv, alltoallv) get
rules, deadlock and race checks but no postcondition (an info finding says so).

Everything is reported as `Finding` values (severity, rule, rank, tb, step, line, message); nothing is
printed. ``CheckReport.ok`` is true when there is no error.
"""
from __future__ import annotations

import heapq
from bisect import bisect_right
from collections import defaultdict
from itertools import islice
from dataclasses import dataclass, field

from .errors import CheckFailed
from .program import MAX_NODES, Buf, Program, Proto, StepType, allowed_count, step_type

__all__ = [
    "Finding",
    "CheckReport",
    "check_program",
    "expected_postcondition",
    "POSTCONDITION_COLLECTIVES",
    "RULES",
]

ERROR, WARNING, INFO = "error", "warning", "info"

POSTCONDITION_COLLECTIVES = ("allgather", "alltoall", "reducescatter", "allreduce", "broadcast", "reduce",
                             "gather", "scatter")
_EXECUTOR_COLLS = frozenset({"allreduce", "allgather", "reduce", "broadcast", "alltoall", "reducescatter", "send",
                             "recv", "gather", "scatter", "alltoallv"})
_LEGACY_COLLS = frozenset({"allreduce", "allgather", "reduce", "broadcast", "alltoall", "reducescatter", "custom"})

# rule id -> one-line description (docs/checker.md has examples)
RULES = {
    "algo.ranks": "ngpus >= 1 and one <gpu> for every rank 0..ngpus-1, each once",
    "algo.nchannels": "1 <= nchannels <= 32",
    "algo.nchunksperloop": "nchunksperloop >= 1, divisible by ngpus where the collective needs it",
    "algo.collective": "coll is a collective the target runtime knows",
    "algo.window": "0 <= minBytes <= maxBytes (maxBytes 0 = unbounded)",
    "algo.selectable": "the program serves in-place or out-of-place calls (legacy: exactly one)",
    "target": "what the target runtime refuses or runs otherwise beyond its dialect (taccl.targets; RCCL: fused "
              "steps, more than 64 thread blocks a rank; legacy: an unbounded window with scratch; any: a rooted "
              "program, which every MSCCL runtime would also run for other roots)",
    "algo.proto": "proto is Simple, LL or LL128",
    "gpu.chunks": "i_chunks/o_chunks/s_chunks >= 0 and consistent with the collective (legacy: exactly; "
                  "executor: at most the buffer, a smaller count is a warning)",
    "limit.threadblocks": "thread blocks per rank within the runtime's maximum",
    "limit.coresidency": "thread blocks per rank at most the SM count (all blocks must be co-resident)",
    "limit.nodes": "stored XML nodes per rank <= 4096, children per node <= 1024",
    "limit.steps": "steps per thread block (nops included) within MSCCL_MAX_NUM_STEPS",
    "limit.channel-tbs": "at most 32 sending and 32 receiving thread blocks per channel",
    "limit.depid": "dependency target tb ids <= 127 (stored as int8)",
    "limit.offset": "offsets <= 32767 (stored as int16)",
    "tb.id": "thread-block ids unique and dense 0..n-1",
    "tb.peer": "send/recv are -1 or another rank in [0, ngpus)",
    "tb.chan": "0 <= chan < nchannels",
    "tb.connection": "at most one tb per (rank, channel, send peer) and per (rank, channel, recv peer)",
    "tb.unused-peer": "a tb that names a peer uses it",
    "step.index": "s is 0,1,2,... in document order",
    "step.cnt": "1 <= cnt <= 71 for real steps (0 <= cnt for nop)",
    "step.offset": "the slots a step uses lie inside the declared buffer",
    "step.peer": "send-type steps need a send peer, receive-type steps a recv peer",
    "step.overlap": "a step's source and destination chunks are the same or disjoint (in-place aliases included): "
                    "the GPU moves a step's elements in parallel",
    "dep.pair": "depid and deps are both -1 or both >= 0",
    "dep.target": "a dependency names an existing step of another tb on the same rank",
    "dep.hasdep": "a step some other step depends on has hasdep=1",
    "dep.self": "a step does not depend on its own tb's current or later step",
    "dep.nop": "a nop carries a dependency, publishes nothing, and precedes a real step with a dependency",
    "match.peer": "every used connection has a tb on the other side",
    "match.count": "sends on a connection (A->B, chan) match its receives one to one",
    "match.cnt": "matched send and receive have equal cnt",
    "deadlock": "every tb finishes with bounded FIFOs (Simple 2, LL/LL128 8 calls in flight)",
    "deadlock-rendezvous": "every tb finishes with rendezvous (unbuffered) sends (sufficient condition)",
    "race": "conflicting accesses of one slot from different tbs are ordered by happens-before",
    "race.unknown": "the race search gave up (budget) on a pair of accesses",
    "post.buffer": "the output buffer holds the collective's result",
    "post.mismatch": "final buffers equal the collective's postcondition",
    "post.unknown": "no postcondition is known for this collective",
    "check.skipped": "deep analysis skipped because of earlier errors",
}


@dataclass
class Finding:
    severity: str
    rule: str
    message: str
    rank: int | None = None
    tb: int | None = None
    step: int | None = None
    line: int | None = None

    def location(self) -> str:
        parts = []
        if self.rank is not None:
            parts.append(f"rank {self.rank}")
        if self.tb is not None:
            parts.append(f"tb {self.tb}")
        if self.step is not None:
            parts.append(f"step {self.step}")
        return ", ".join(parts)

    def __str__(self) -> str:
        loc = self.location()
        line = f"line {self.line}: " if self.line is not None else ""
        return f"{line}{self.severity} [{self.rule}]{' ' + loc if loc else ''}: {self.message}"

    def to_dict(self) -> dict:
        return {k: getattr(self, k) for k in ("severity", "rule", "rank", "tb", "step", "line", "message")}


@dataclass
class CheckReport:
    """What `check_program` found. ``ok``: no error. ``proven``: the postcondition held in every mode."""

    collective: str
    findings: list[Finding] = field(default_factory=list)
    modes: list[str] = field(default_factory=list)  # call kinds symbolically executed: inplace, outofplace
    proven: bool = False
    suppressed: dict[str, int] = field(default_factory=dict)  # rule -> findings left out beyond the cap
    stats: dict[str, int] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return not any(f.severity == ERROR for f in self.findings) and not any(self._suppressed_errors.values())

    _suppressed_errors: dict = field(default_factory=dict, repr=False)

    @property
    def errors(self) -> list[Finding]:
        return [f for f in self.findings if f.severity == ERROR]

    @property
    def error_count(self) -> int:
        """Every error found, those beyond the per-rule cap too."""
        return len(self.errors) + sum(self._suppressed_errors.values())

    @property
    def warnings(self) -> list[Finding]:
        return [f for f in self.findings if f.severity == WARNING]

    def rules(self, severity: str | None = None) -> set[str]:
        return {f.rule for f in self.findings if severity is None or f.severity == severity}

    def raise_if_failed(self, path: str | None = None) -> None:
        if not self.ok:
            head = f"{path}: " if path else ""
            first = "\n".join(str(f) for f in self.errors[:10])
            raise CheckFailed(f"{head}program fails {len(self.errors)} check(s):\n{first}")

    def summary(self) -> str:
        ne, nw = self.error_count, len(self.warnings)
        if self.ok:
            what = f"{self.collective} proven ({', '.join(self.modes)})" if self.proven else "rules hold"
            return f"OK: {what}; {nw} warning(s)"
        return f"FAILED: {ne} error(s), {nw} warning(s)"

    def to_dict(self) -> dict:
        return {
            "ok": self.ok,
            "collective": self.collective,
            "proven": self.proven,
            "modes": list(self.modes),
            "findings": [f.to_dict() for f in self.findings],
            "suppressed": dict(self.suppressed),
            "stats": dict(self.stats),
        }


# --------------------------------------------------------------------------------------------------------
# Collective semantics


def _cf(collective: str, ngpus: int, nchunksperloop: int) -> int:
    return nchunksperloop // ngpus if ngpus else 0


def _input_count(coll: str, rank: int, ngpus: int, ncpl: int, root: int) -> int:
    cf = _cf(coll, ngpus, ncpl)
    if coll in ("allgather", "gather"):
        return cf
    if coll in ("broadcast", "scatter"):
        return ncpl if rank == root else 0
    return ncpl


def _post_spec(coll: str, rank: int, ngpus: int, ncpl: int, root: int):
    """Yield (out index, kind, a, b): kind 'chunk' -> Chunk(a, b); kind 'sum' -> sum over ranks of Chunk(., b)."""
    cf = _cf(coll, ngpus, ncpl)
    if coll in ("allgather", "gather"):
        if coll == "gather" and rank != root:
            return
        for i in range(ngpus):
            for k in range(cf):
                yield i * cf + k, "chunk", i, k
    elif coll == "alltoall":
        for i in range(ngpus):
            for k in range(cf):
                yield i * cf + k, "chunk", i, rank * cf + k
    elif coll == "reducescatter":
        for c in range(cf):
            yield c, "sum", None, rank * cf + c
    elif coll == "allreduce" or (coll == "reduce" and rank == root):
        for c in range(ncpl):
            yield c, "sum", None, c
    elif coll == "broadcast":
        for c in range(ncpl):
            yield c, "chunk", root, c
    elif coll == "scatter":
        for k in range(cf):
            yield k, "chunk", root, rank * cf + k


def expected_postcondition(collective: str, ngpus: int, nchunksperloop: int, inplace: bool = False, *,
                           root: int = 0) -> dict[tuple[int, int], tuple[tuple[int, int], ...]]:
    """The collective's final state: ``{(rank, output index): contributions}``.

    ``contributions`` is the sorted tuple of (origin rank, origin input index) whose reduction the slot must
    hold (one element for non-combining collectives). With ``inplace`` the output index is still an index
    of the output buffer; the aliasing of section 1.8 decides where it lives (see the module docstring).

    >>> expected_postcondition("allgather", 2, 2)[(1, 0)]
    ((0, 0),)
    >>> expected_postcondition("reducescatter", 2, 4)[(1, 1)]
    ((0, 3), (1, 3))
    """
    coll = "reducescatter" if collective == "reduce_scatter" else collective
    if coll not in POSTCONDITION_COLLECTIVES:
        raise ValueError(f"no postcondition is known for collective {collective!r}")
    out: dict[tuple[int, int], tuple[tuple[int, int], ...]] = {}
    sums: dict[int, tuple[tuple[int, int], ...]] = {}
    for rank in range(ngpus):
        for idx, kind, a, b in _post_spec(coll, rank, ngpus, nchunksperloop, root):
            if kind == "chunk":
                out[(rank, idx)] = ((a, b),)
            else:
                if b not in sums:
                    sums[b] = tuple((q, b) for q in range(ngpus))
                out[(rank, idx)] = sums[b]
    return out


def _aliases(coll: str, inplace: bool, rank: int, cf: int) -> dict[str, tuple[str, int]]:
    """Buffer letter -> (physical buffer, offset) for one rank and call kind (section 1.8)."""
    if not inplace:
        return {"i": ("i", 0), "o": ("o", 0), "s": ("s", 0)}
    if coll in ("allgather", "gather"):
        return {"i": ("o", rank * cf), "o": ("o", 0), "s": ("s", 0)}
    if coll in ("reducescatter", "scatter"):
        return {"i": ("i", 0), "o": ("i", rank * cf), "s": ("s", 0)}
    return {"i": ("i", 0), "o": ("i", 0), "s": ("s", 0)}


_M64 = (1 << 64) - 1
_COUNT_UNIT = 1 << 80
GARBAGE = -1
# the replay keeps a value and a last writer per buffer slot, about 32 bytes each: 2^27 slots are 4 GiB
MAX_REPLAY_SLOTS = 1 << 27


def _weight(rank: int, index: int) -> int:
    """Fingerprint weight of Chunk(rank, index): count unit plus a splitmix64 hash."""
    z = ((rank << 32) ^ index) + 0x9E3779B97F4A7C15
    z &= _M64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _M64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _M64
    z ^= z >> 31
    return _COUNT_UNIT + z


# --------------------------------------------------------------------------------------------------------
# Checking context


class _Ctx:
    def __init__(self, program: Program, cap: int):
        self.p = program
        self.cap = cap
        self.findings: list[Finding] = []
        self.counts: dict[str, int] = defaultdict(int)
        self.suppressed: dict[str, int] = defaultdict(int)
        self.suppressed_errors: dict[str, int] = defaultdict(int)
        self.fatal = False

    def add(self, severity, rule, message, rank=None, tb=None, step=None, line=None, fatal=False):
        if fatal:
            self.fatal = True
        self.counts[rule] += 1
        if self.counts[rule] > self.cap:
            self.suppressed[rule] += 1
            if severity == ERROR:
                self.suppressed_errors[rule] += 1
            return
        self.findings.append(Finding(severity, rule, message, rank, tb, step, line))


# --------------------------------------------------------------------------------------------------------
# 1. Rules


def _check_rules(ctx: _Ctx, dialect: str, max_steps: int, max_tbs: int, sm_count: int, coll: str,
                 max_nodes: int) -> None:
    p = ctx.p
    add = ctx.add
    try:
        Proto(p.proto)
    except ValueError:
        add(ERROR, "algo.proto", f"proto {p.proto!r} is not Simple, LL or LL128", fatal=True)
    if p.ngpus < 1:
        add(ERROR, "algo.ranks", f"ngpus={p.ngpus} must be at least 1", fatal=True)
        return
    if not 1 <= p.nchannels <= 32:
        add(ERROR, "algo.nchannels", f"nchannels={p.nchannels} must be in 1..32")
    if p.nchunksperloop < 1:
        add(ERROR, "algo.nchunksperloop", f"nchunksperloop={p.nchunksperloop} must be at least 1", fatal=True)
    elif coll in ("allgather", "alltoall", "reducescatter", "gather", "scatter") and p.nchunksperloop % p.ngpus:
        add(ERROR, "algo.nchunksperloop", f"nchunksperloop={p.nchunksperloop} must be a multiple of ngpus="
                                          f"{p.ngpus} for {coll}", fatal=True)
    allowed = _EXECUTOR_COLLS if dialect == "executor" else _LEGACY_COLLS
    if coll not in allowed:
        add(ERROR, "algo.collective", f"collective {p.collective!r} is not known to the {dialect} runtime "
                                      f"(expected one of {', '.join(sorted(allowed))})")
    if p.min_bytes < 0 or p.max_bytes < 0 or (p.max_bytes != 0 and p.min_bytes > p.max_bytes):
        add(ERROR, "algo.window", f"size window [{p.min_bytes}, {p.max_bytes}] is invalid (both >= 0, min <= max, "
                                  f"max 0 = unbounded)")
    if not p.inplace and not p.outofplace:
        add(ERROR, "algo.selectable", "inplace=0 and outofplace=0: no call ever selects this program (the runtime "
                                      "refuses it)")
    elif dialect == "legacy" and p.inplace and p.outofplace:
        add(ERROR, "algo.selectable", "the legacy runtime serves either in-place or out-of-place calls, not both")

    # ranks
    seen: dict[int, object] = {}
    for g in p.gpus:
        if not 0 <= g.id < p.ngpus:
            add(ERROR, "algo.ranks", f"<gpu id={g.id}> is outside 0..{p.ngpus - 1}", rank=g.id, line=g.line, fatal=True)
        elif g.id in seen:
            add(ERROR, "algo.ranks", f"rank {g.id} appears twice", rank=g.id, line=g.line, fatal=True)
        seen[g.id] = g
    # (lazily: a file may claim two billion ranks)
    missing = list(islice((r for r in range(p.ngpus) if r not in seen), 11))
    if missing:
        shown = ", ".join(map(str, missing[:10])) + (" ..." if len(missing) > 10 else "")
        add(ERROR, "algo.ranks", f"no <gpu> for rank(s) {shown}: such a rank launches 0 thread blocks "
                                 f"(emit every rank)", fatal=True)
    if p.ngpus > 1024:
        add(ERROR, "limit.nodes", f"ngpus={p.ngpus}: <algo> may have at most 1024 children")

    slots = sum(max(g.i_chunks, p.nchunksperloop) + max(g.o_chunks, p.nchunksperloop) + max(g.s_chunks, 0)
                for g in p.gpus)
    if slots > MAX_REPLAY_SLOTS:
        add(ERROR, "gpu.chunks", f"the ranks' buffers hold {slots:,} chunks in all (i_chunks, o_chunks, s_chunks, "
                                 f"nchunksperloop): more than the {MAX_REPLAY_SLOTS:,} the proof can replay in memory "
                                 f"(a 1024-rank AllGather has about a million)", fatal=True)
        return
    cf = p.nchunksperloop // p.ngpus if p.ngpus else 0
    m_in = p.ngpus if coll in ("allgather", "gather") else 1
    m_out = p.ngpus if coll in ("reducescatter", "scatter") else 1
    for g in p.gpus:
        r = g.id
        for name, v in (("i_chunks", g.i_chunks), ("o_chunks", g.o_chunks), ("s_chunks", g.s_chunks)):
            if v < 0:
                add(ERROR, "gpu.chunks", f"{name}={v} is negative", rank=r, line=g.line, fatal=True)
        if (coll in POSTCONDITION_COLLECTIVES or coll == "custom") and p.nchunksperloop >= 1:  # else reported
            for name, v, m in (("i_chunks", g.i_chunks, m_in), ("o_chunks", g.o_chunks, m_out)):
                if v == 0 or v * m == p.nchunksperloop:
                    continue
                want = p.nchunksperloop // m
                if dialect == "legacy" or v > want:  # the legacy loader checks; a larger one exceeds the buffer
                    add(ERROR, "gpu.chunks", f"{name}={v}: for {coll} with nchunksperloop={p.nchunksperloop} it "
                                             f"must be {want} (or 0)", rank=r, line=g.line)
                else:  # the executor (and taccl's runtime) does not read it: only a legacy load would fail
                    add(WARNING, "gpu.chunks", f"{name}={v}: for {coll} with nchunksperloop={p.nchunksperloop} the "
                                               f"legacy runtime wants {want} (or 0); the executor ignores it",
                        rank=r, line=g.line)
        ntb = len(g.threadblocks)
        if ntb > max_tbs:
            add(ERROR, "limit.threadblocks", f"{ntb} thread blocks, the {dialect} runtime allows {max_tbs}",
                rank=r, line=g.line)
        elif ntb > sm_count:
            add(WARNING, "limit.coresidency", f"{ntb} thread blocks: more than {sm_count} SMs cannot keep them all "
                                              f"resident, and they spin-wait on each other", rank=r, line=g.line)
        nodes = p.stored_nodes(g)
        if nodes > max_nodes:
            add(ERROR, "limit.nodes", f"rank {r} stores {nodes} XML nodes (algo + gpus + its tbs and steps), "
                                      f"more than MAX_NODES={max_nodes}", rank=r, line=g.line)
        if ntb > 1024:
            add(ERROR, "limit.nodes", f"{ntb} <tb> children, more than 1024", rank=r, line=g.line)
        ids = sorted(tb.id for tb in g.threadblocks)
        if ids != list(range(ntb)):
            dup = sorted({i for i in ids if ids.count(i) > 1}) if len(set(ids)) != len(ids) else []
            if dup:
                add(ERROR, "tb.id", f"thread-block id(s) {dup} appear twice", rank=r, line=g.line, fatal=True)
            else:
                # the ids a rank of ntb blocks lacks (never a range up to the largest id: it may be 10^11)
                gaps = sorted(set(range(ntb)) - set(ids))
                neg = [i for i in ids if i < 0]
                add(ERROR, "tb.id", f"thread-block ids must be 0..{ntb - 1}; "
                                    f"{'negative ids ' + str(neg) if neg else 'missing ' + str(gaps[:10])}",
                    rank=r, line=g.line, fatal=bool(neg))
        senders = defaultdict(list)
        receivers = defaultdict(list)
        per_chan_s = defaultdict(int)
        per_chan_r = defaultdict(int)
        tb_ids = {tb.id: tb for tb in g.threadblocks}
        for tb in g.threadblocks:
            for what, peer in (("send", tb.send), ("recv", tb.recv)):
                if peer != -1 and (not 0 <= peer < p.ngpus or peer == r):
                    why = "is the rank itself" if peer == r else f"is not -1 or a rank in 0..{p.ngpus - 1}"
                    add(ERROR, "tb.peer", f"{what}={peer} {why}", rank=r, tb=tb.id, line=tb.line, fatal=True)
            if not 0 <= tb.chan < p.nchannels:
                add(ERROR, "tb.chan", f"chan={tb.chan} must be in 0..nchannels-1={p.nchannels - 1}", rank=r,
                    tb=tb.id, line=tb.line, fatal=tb.chan < 0)
            if tb.send >= 0:
                senders[(tb.chan, tb.send)].append(tb.id)
                per_chan_s[tb.chan] += 1
            if tb.recv >= 0:
                receivers[(tb.chan, tb.recv)].append(tb.id)
                per_chan_r[tb.chan] += 1
            if len(tb.steps) > max_steps:
                add(ERROR, "limit.steps", f"{len(tb.steps)} steps, more than MSCCL_MAX_NUM_STEPS={max_steps} "
                                          f"({dialect} build)", rank=r, tb=tb.id, line=tb.line)
            _check_steps(ctx, g, tb, tb_ids, coll)
        for (chan, peer), lst in senders.items():
            if len(lst) > 1:
                add(ERROR, "tb.connection", f"thread blocks {lst} all send to rank {peer} on channel {chan}: one "
                                            f"connection (FIFO) per (channel, peer, direction)", rank=r, tb=lst[1],
                    line=tb_ids[lst[1]].line, fatal=True)
        for (chan, peer), lst in receivers.items():
            if len(lst) > 1:
                add(ERROR, "tb.connection", f"thread blocks {lst} all receive from rank {peer} on channel {chan}: "
                                            f"one connection (FIFO) per (channel, peer, direction)", rank=r,
                    tb=lst[1], line=tb_ids[lst[1]].line, fatal=True)
        for chan, n in per_chan_s.items():
            if n > 32:
                add(ERROR, "limit.channel-tbs", f"{n} sending thread blocks on channel {chan} (max 32)", rank=r)
        for chan, n in per_chan_r.items():
            if n > 32:
                add(ERROR, "limit.channel-tbs", f"{n} receiving thread blocks on channel {chan} (max 32)", rank=r)


def _check_overlap(ctx: _Ctx, g, st, t, loc, coll) -> None:
    """Source and destination of one step either the same chunks or disjoint, with the in-place aliases when
    the program serves in-place calls (as the runtime's loader checks): the CUDA backend moves a step's
    elements in parallel, so a shifted overlap would read elements another thread already overwrote."""
    p = ctx.p
    al = _aliases(coll, p.inplace, g.id, _cf(coll, p.ngpus, p.nchunksperloop))
    (sb, so), (db, do) = al[Buf(st.srcbuf).value], al[Buf(st.dstbuf).value]
    src, dst = so + st.srcoff, do + st.dstoff
    if sb == db and src != dst and abs(src - dst) < st.cnt:
        how = " (in-place aliasing)" if st.srcbuf != st.dstbuf else ""
        ctx.add(ERROR, "step.overlap", f"{t} reads {Buf(st.srcbuf)}[{st.srcoff}..{st.srcoff + st.cnt - 1}] and writes "
                                       f"{Buf(st.dstbuf)}[{st.dstoff}..{st.dstoff + st.cnt - 1}]{how}: the ranges "
                                       f"overlap without being the same chunks", **loc)


def _check_steps(ctx: _Ctx, g, tb, tb_ids, coll) -> None:
    add = ctx.add
    r = g.id
    pending_nop = None
    uses_send = uses_recv = False
    n = len(tb.steps)
    for i, st in enumerate(tb.steps):
        loc = dict(rank=r, tb=tb.id, step=i, line=st.line)
        t = step_type(st.type)
        if st.s != i:
            add(ERROR, "step.index", f"s={st.s} but this is step {i} of the tb: the runtimes count steps in "
                                     f"document order, so s must be 0,1,2,...", **loc)
        if t is StepType.NOP:
            if not 0 <= st.cnt <= 71:
                add(ERROR, "step.cnt", f"cnt={st.cnt} must be in 0..71", **loc)
        elif not 1 <= st.cnt <= 71:
            add(ERROR, "step.cnt", f"cnt={st.cnt}: a {t} step moves 1..71 chunks (MSCCL_MAX_COUNT=72, exclusive)",
                **loc, fatal=st.cnt < 1)
        for fname in ("srcoff", "dstoff"):
            v = getattr(st, fname)
            if v > 32767:
                add(ERROR, "limit.offset", f"{fname}={v} exceeds 32767 (stored as int16)", **loc)
            elif v < -1:
                add(ERROR, "step.offset", f"{fname}={v} must be -1 or a chunk index", **loc, fatal=True)
        if t.uses_src or t.uses_dst:
            for used, bname, oname in ((t.uses_src, "srcbuf", "srcoff"), (t.uses_dst, "dstbuf", "dstoff")):
                if not used:
                    continue
                buf = Buf(getattr(st, bname))
                off = getattr(st, oname)
                size = g.chunks(buf)
                if off < 0 or off + max(st.cnt, 1) > size:
                    add(ERROR, "step.offset", f"{t} uses {buf}[{off}..{off + st.cnt - 1}] but {buf} has {size} "
                                              f"chunk(s) on this rank", **loc, fatal=True)
        if t.uses_src and t.uses_dst:
            _check_overlap(ctx, g, st, t, loc, coll)
        if t.is_send_type:
            uses_send = True
            if tb.send < 0:
                add(ERROR, "step.peer", f"{t} sends but the tb has send=-1", **loc, fatal=True)
        if t.is_recv_type:
            uses_recv = True
            if tb.recv < 0:
                add(ERROR, "step.peer", f"{t} receives but the tb has recv=-1", **loc, fatal=True)
        # dependencies
        if (st.depid >= 0) != (st.deps >= 0) or st.depid < -1 or st.deps < -1:
            add(ERROR, "dep.pair", f"depid={st.depid} deps={st.deps}: both -1 or both >= 0", **loc, fatal=True)
        elif st.depid >= 0:
            target = tb_ids.get(st.depid)
            if st.depid > 127:
                add(ERROR, "limit.depid", f"depid={st.depid} exceeds 127 (stored as int8)", **loc)
            if target is None:
                add(ERROR, "dep.target", f"depid={st.depid}: rank {r} has no such thread block", **loc, fatal=True)
            elif target is tb and st.deps >= i:
                add(ERROR, "dep.self", f"waits for step {st.deps} of its own tb, which runs after this one "
                                       f"(deadlock)", **loc, fatal=True)
            elif st.deps >= len(target.steps):
                add(ERROR, "dep.target", f"deps={st.deps}: tb {st.depid} has only {len(target.steps)} step(s)",
                    **loc, fatal=True)
            else:
                tst = target.steps[st.deps]
                if StepType(tst.type) is StepType.NOP:
                    add(ERROR, "dep.target", f"depends on tb {st.depid} step {st.deps}, a nop (nops publish nothing)",
                        **loc, fatal=True)
                elif not tst.hasdep:
                    add(ERROR, "dep.hasdep", f"depends on tb {st.depid} step {st.deps}, which has hasdep=0 and so "
                                             f"never publishes its completion", **loc)
        if t is StepType.NOP:
            if st.depid < 0:
                add(ERROR, "dep.nop", "nop without a dependency: the parser drops it and every later step index "
                                      "of this tb is off by one", **loc)
            if st.hasdep:
                add(ERROR, "dep.nop", "nop with hasdep=1: a nop publishes nothing", **loc)
            pending_nop = i if st.depid >= 0 else pending_nop
        else:
            if pending_nop is not None and st.depid < 0:
                add(ERROR, "dep.nop", f"nop dependencies (step {pending_nop}) followed by a step without one: the "
                                      f"last dependency must be carried by the real step", **loc)
            pending_nop = None
    if pending_nop is not None:
        add(ERROR, "dep.nop", "nop dependencies at the end of the tb, with no real step after them", rank=r,
            tb=tb.id, step=pending_nop, line=tb.steps[pending_nop].line)
    if tb.send >= 0 and not uses_send:
        add(INFO, "tb.unused-peer", f"send={tb.send} but no step sends", rank=r, tb=tb.id, line=tb.line)
    if tb.recv >= 0 and not uses_recv:
        add(INFO, "tb.unused-peer", f"recv={tb.recv} but no step receives", rank=r, tb=tb.id, line=tb.line)


# --------------------------------------------------------------------------------------------------------
# Flattened program: global tb and step numbering, connections


class _Index:
    def __init__(self, p: Program):
        self.p = p
        gpus = sorted(p.gpus, key=lambda g: g.id)
        self.tbs = []  # G -> (gpu, tb)
        self.G_of = {}  # (rank, tb id) -> G
        self.base = []
        self.length = []
        n = 0
        for g in gpus:
            for tb in sorted(g.threadblocks, key=lambda t: t.id):
                G = len(self.tbs)
                self.tbs.append((g, tb))
                self.G_of[(g.id, tb.id)] = G
                self.base.append(n)
                self.length.append(len(tb.steps))
                n += len(tb.steps)
        self.nsteps = n
        self.step_G = [0] * n
        self.step_i = [0] * n
        self.steps = [None] * n
        self.dep = [-1] * n  # global step id of the dependency target
        self.dep_G = [-1] * n
        self.dep_i = [-1] * n
        for G, (g, tb) in enumerate(self.tbs):
            b = self.base[G]
            for i, st in enumerate(tb.steps):
                sid = b + i
                self.step_G[sid] = G
                self.step_i[sid] = i
                self.steps[sid] = st
                if st.depid >= 0:
                    T = self.G_of[(g.id, st.depid)]
                    self.dep[sid] = self.base[T] + st.deps
                    self.dep_G[sid] = T
                    self.dep_i[sid] = st.deps
        # connections
        self.conn_of = {}  # (src rank, dst rank, chan) -> conn id
        self.conn_sender = []  # conn -> G or -1
        self.conn_receiver = []
        self.conn_sends = []  # conn -> [sid]
        self.conn_recvs = []
        self.send_conn = [-1] * n
        self.send_seq = [-1] * n
        self.recv_conn = [-1] * n
        self.recv_seq = [-1] * n
        for G, (g, tb) in enumerate(self.tbs):
            if tb.send >= 0:
                c = self._conn((g.id, tb.send, tb.chan))
                self.conn_sender[c] = G
            if tb.recv >= 0:
                c = self._conn((tb.recv, g.id, tb.chan))
                self.conn_receiver[c] = G
        for G, (g, tb) in enumerate(self.tbs):
            b = self.base[G]
            for i, st in enumerate(tb.steps):
                sid = b + i
                if st.type in _SEND_T and tb.send >= 0:
                    c = self.conn_of[(g.id, tb.send, tb.chan)]
                    self.send_conn[sid] = c
                    self.send_seq[sid] = len(self.conn_sends[c])
                    self.conn_sends[c].append(sid)
                if st.type in _RECV_T and tb.recv >= 0:
                    c = self.conn_of[(tb.recv, g.id, tb.chan)]
                    self.recv_conn[sid] = c
                    self.recv_seq[sid] = len(self.conn_recvs[c])
                    self.conn_recvs[c].append(sid)
        self.nconn = len(self.conn_sender)
        self.conn_key = [None] * self.nconn
        for key, c in self.conn_of.items():
            self.conn_key[c] = key

    def _conn(self, key) -> int:
        c = self.conn_of.get(key)
        if c is None:
            c = len(self.conn_sender)
            self.conn_of[key] = c
            self.conn_sender.append(-1)
            self.conn_receiver.append(-1)
            self.conn_sends.append([])
            self.conn_recvs.append([])
        return c

    def where(self, sid: int) -> dict:
        g, tb = self.tbs[self.step_G[sid]]
        i = self.step_i[sid]
        return dict(rank=g.id, tb=tb.id, step=i, line=tb.steps[i].line)

    def name(self, sid: int) -> str:
        g, tb = self.tbs[self.step_G[sid]]
        i = self.step_i[sid]
        return f"rank {g.id} tb {tb.id} step {i} ({tb.steps[i].type})"

    def tb_name(self, G: int) -> str:
        g, tb = self.tbs[G]
        return f"rank {g.id} tb {tb.id}"


_SEND_T = frozenset(t for t in StepType if t.is_send_type)
_RECV_T = frozenset(t for t in StepType if t.is_recv_type)


def _check_matching(ctx: _Ctx, ix: _Index) -> None:
    add = ctx.add
    for (a, b, chan), c in sorted(ix.conn_of.items()):
        sends, recvs = ix.conn_sends[c], ix.conn_recvs[c]
        S, R = ix.conn_sender[c], ix.conn_receiver[c]
        if S < 0 and recvs:
            add(ERROR, "match.peer", f"receives from rank {a} on channel {chan}, but rank {a} has no tb sending to "
                                     f"rank {b} on channel {chan}", **ix.where(recvs[0]), fatal=True)
            continue
        if R < 0 and sends:
            add(ERROR, "match.peer", f"sends to rank {b} on channel {chan}, but rank {b} has no tb receiving from "
                                     f"rank {a} on channel {chan}", **ix.where(sends[0]), fatal=True)
            continue
        if len(sends) != len(recvs):
            k = min(len(sends), len(recvs))
            if len(sends) > len(recvs):
                add(ERROR, "match.count", f"connection rank {a} -> rank {b} channel {chan}: {len(sends)} send(s) "
                                          f"but {len(recvs)} receive(s) on {ix.tb_name(R)}; this send (#{k}) has no "
                                          f"matching receive", **ix.where(sends[k]), fatal=True)
            else:
                add(ERROR, "match.count", f"connection rank {a} -> rank {b} channel {chan}: {len(recvs)} receive(s) "
                                          f"but {len(sends)} send(s) on {ix.tb_name(S)}; this receive (#{k}) has no "
                                          f"matching send", **ix.where(recvs[k]), fatal=True)
        for k, (s, r) in enumerate(zip(sends, recvs)):
            cs, cr = ix.steps[s].cnt, ix.steps[r].cnt
            if cs != cr:
                add(ERROR, "match.cnt", f"receive #{k} on connection rank {a} -> rank {b} channel {chan} has cnt={cr} "
                                        f"but its matching send {ix.name(s)} has cnt={cs}", **ix.where(r),
                    fatal=True)


# --------------------------------------------------------------------------------------------------------
# 2. Scheduling with bounded FIFOs


def _schedule(ix: _Index, depth: int, tiles: int, calls: list | None = None):
    """Run all tbs; return (order of tile-0 step ids, blocked reasons per G or None when all finished).

    `calls` (per step id, default 1 each): the primitive calls a step makes, each taking one FIFO slot (a step
    of ``cnt`` chunks makes ceil(cnt / maxAllowedCount) of them, `_split_calls`); a fused step needs its
    data and its FIFO room call by call."""
    nG = len(ix.tbs)
    L = ix.length
    base = ix.base
    dep_G, dep_i = ix.dep_G, ix.dep_i
    recv_conn, recv_seq, send_conn, send_seq = ix.recv_conn, ix.recv_seq, ix.send_conn, ix.send_seq
    nmsg = [len(s) for s in ix.conn_sends]
    if calls is not None:  # FIFO positions counted in calls, not steps
        send_seq, recv_seq = list(send_seq), list(recv_seq)
        for c in range(ix.nconn):
            for seqs, sids in ((send_seq, ix.conn_sends[c]), (recv_seq, ix.conn_recvs[c])):
                pos = 0
                for sid in sids:
                    seqs[sid] = pos
                    pos += calls[sid]
            nmsg[c] = sum(calls[sid] for sid in ix.conn_sends[c])
    pc = [0] * nG
    it = [0] * nG
    sub = [0] * nG  # calls of the current step already made (with `calls`)
    sent = [0] * ix.nconn
    recvd = [0] * ix.nconn
    recv_waiter = [-1] * ix.nconn
    send_waiter = [-1] * ix.nconn
    dep_wait: list[list] = [[] for _ in range(nG)]
    blocked: list = [None] * nG
    order: list[int] = []
    work = list(range(nG - 1, -1, -1))
    push = work.append
    while work:
        G = work.pop()
        LG = L[G]
        if LG == 0:
            continue
        b = base[G]
        i = pc[G]
        itr = it[G]
        k = sub[G]
        while itr < tiles:
            sid = b + i
            T = dep_G[sid]
            if T >= 0 and k == 0:
                need = itr * L[T] + dep_i[sid] + 1
                if it[T] * L[T] + pc[T] < need:
                    heapq.heappush(dep_wait[T], (need, G))
                    blocked[G] = ("dep", T, sid)
                    break
            rc = recv_conn[sid]
            if rc >= 0 and sent[rc] <= itr * nmsg[rc] + recv_seq[sid] + k:
                recv_waiter[rc] = G
                blocked[G] = ("recv", rc, sid)
                break
            sc = send_conn[sid]
            if sc >= 0 and itr * nmsg[sc] + send_seq[sid] + k >= recvd[sc] + depth:
                send_waiter[sc] = G
                blocked[G] = ("send", sc, sid)
                break
            blocked[G] = None
            if rc >= 0:
                recvd[rc] += 1
                w = send_waiter[rc]
                if w >= 0:
                    send_waiter[rc] = -1
                    push(w)
            if sc >= 0:
                sent[sc] += 1
                w = recv_waiter[sc]
                if w >= 0:
                    recv_waiter[sc] = -1
                    push(w)
            if calls is not None:
                k += 1
                if k < calls[sid]:
                    sub[G] = k
                    continue
                k = sub[G] = 0
            if itr == 0:
                order.append(sid)
            i += 1
            if i == LG:
                i = 0
                itr += 1
                it[G] = itr
            pc[G] = i
            h = dep_wait[G]
            if h:
                prog = itr * LG + i
                while h and h[0][0] <= prog:
                    push(heapq.heappop(h)[1])
    stuck = [G for G in range(nG) if L[G] and it[G] < tiles]
    if not stuck:
        return order, None
    return order, {G: blocked[G] for G in stuck}


def _split_calls(ix: _Index, program: Program) -> list:
    """[(M, lowest size, calls per step id)] for each way the runtime splits steps into primitive calls at the
    sizes the program's window takes, beyond one call a step: at a call of B bytes a chunk is
    c = ceil(B / nchunksperloop) bytes, and a step of cnt chunks is moved M = max(1, tile // c) (at most 71)
    chunks a call, so it makes ceil(cnt / M) calls (msccl-xml.md 1.8). Where chunks outgrow half a tile, every
    chunk is a call of its own: a step of two chunks then takes two FIFO slots, which a ring of fused steps
    does not have (Simple holds two calls)."""
    moving = [sid for sid in range(ix.nsteps) if ix.send_conn[sid] >= 0 or ix.recv_conn[sid] >= 0]
    largest = max((ix.steps[sid].cnt for sid in moving), default=1)
    if largest <= 1:
        return []
    n = max(1, program.nchunksperloop)
    tile = Proto(program.proto).tile_bytes
    most = allowed_count(program, max(program.min_bytes, n))  # at the window's smallest size
    fewest = 1 if not program.max_bytes else allowed_count(program, program.max_bytes)
    out, seen = [], set()
    for M in range(min(most, largest - 1), fewest - 1, -1):  # from the smallest sizes up
        calls = [1] * ix.nsteps
        for sid in moving:
            calls[sid] = -(-ix.steps[sid].cnt // M)
        shape = tuple(calls[sid] for sid in moving)
        if shape not in seen:
            seen.add(shape)
            # the smallest call whose chunk is over tile / (M + 1) bytes
            out.append((M, max(program.min_bytes, n * (tile // (M + 1)) + 1), calls))
    return out


def _waits_on(ix: _Index, reason) -> int:
    kind, x, _sid = reason
    if kind == "dep":
        return x
    if kind == "recv":
        return ix.conn_sender[x]
    return ix.conn_receiver[x]


def _describe_wait(ix: _Index, reason, depth=None) -> str:
    kind, x, sid = reason
    if kind == "dep":
        st = ix.steps[sid]
        return f"waits for tb {st.depid} step {st.deps} (dependency)"
    (a, b, chan) = ix.conn_key[x]
    if kind == "recv":
        return f"waits for data from rank {a} on channel {chan} ({ix.tb_name(ix.conn_sender[x])})"
    fifo = f" ({depth} calls in flight, FIFO full)" if depth else ""
    return f"waits to send to rank {b} on channel {chan}{fifo} ({ix.tb_name(ix.conn_receiver[x])} must receive)"


def _report_deadlock(ctx: _Ctx, ix: _Index, blocked: dict, rule: str, severity: str, what: str, depth=None,
                     max_cycles: int = 20):
    """One finding per wait-for cycle (at most `max_cycles`; the rest are counted), plus one for the
    thread blocks that wait on a cycle without being part of one."""
    nxt = {G: _waits_on(ix, r) for G, r in blocked.items()}
    seen_cycles = set()
    color: dict[int, int] = {}
    cycles = []
    for start in blocked:
        path = []
        G = start
        while G in nxt and G not in color:
            color[G] = start
            path.append(G)
            G = nxt[G]
        if G in nxt and color.get(G) == start:
            cyc = path[path.index(G):]
            key = frozenset(cyc)
            if key not in seen_cycles:
                seen_cycles.add(key)
                cycles.append(cyc)
    in_cycle = set()
    for cyc in cycles:
        in_cycle.update(cyc)
    if len(cycles) > max_cycles:
        ctx.add(severity, rule, f"{what}: {len(cycles)} distinct wait-for cycles; the first {max_cycles} follow",
                **ix.where(blocked[cycles[0][0]][2]))
    for cyc in cycles[:max_cycles]:
        parts = []
        for G in cyc:
            reason = blocked[G]
            sid = reason[2]
            parts.append(f"{ix.name(sid)} {_describe_wait(ix, reason, depth)}")
        first = blocked[cyc[0]][2]
        if all(blocked[G][0] == "dep" for G in cyc):  # dependencies alone: it hangs whatever the FIFOs hold
            head = f"dependency cycle of {len(cyc)} thread block(s)"
        else:
            head = f"{what}: cycle of {len(cyc)} waiting thread block(s)"
        ctx.add(severity, rule, f"{head}: " + "; ".join(parts), **ix.where(first))
    rest = [G for G in blocked if G not in in_cycle]
    if rest and severity == ERROR:
        G = rest[0]
        ctx.add(severity, rule, f"{len(blocked)} thread block(s) never finish; e.g. {ix.name(blocked[G][2])} "
                                f"{_describe_wait(ix, blocked[G], depth)}", **ix.where(blocked[G][2]))


# --------------------------------------------------------------------------------------------------------
# 2b. Rendezvous (unbuffered) sends


def _rendezvous(ix: _Index):
    """Like `_schedule` with unbuffered sends: a send completes only together with its receive. Fused steps
    receive first, then send. Returns blocked reasons per stuck G, or None."""
    nG = len(ix.tbs)
    L, base = ix.length, ix.base
    dep_G, dep_i = ix.dep_G, ix.dep_i
    recv_conn, send_conn = ix.recv_conn, ix.send_conn
    pc = [0] * nG
    phase = [0] * nG  # 0: before dependency check, 1: receive pending, 2: send pending
    snd_wait = [-1] * ix.nconn
    rcv_wait = [-1] * ix.nconn
    dep_wait: list[list] = [[] for _ in range(nG)]
    blocked: list = [None] * nG
    work = list(range(nG - 1, -1, -1))

    def complete(G):
        pc[G] += 1
        phase[G] = 0
        blocked[G] = None
        h = dep_wait[G]
        while h and h[0][0] <= pc[G]:
            work.append(heapq.heappop(h)[1])

    while work:
        G = work.pop()
        b = base[G]
        while pc[G] < L[G]:
            sid = b + pc[G]
            ph = phase[G]
            if ph == 0:
                T = dep_G[sid]
                if T >= 0 and pc[T] < dep_i[sid] + 1:
                    heapq.heappush(dep_wait[T], (dep_i[sid] + 1, G))
                    blocked[G] = ("dep", T, sid)
                    break
                if recv_conn[sid] >= 0:
                    phase[G] = 1
                elif send_conn[sid] >= 0:
                    phase[G] = 2
                else:
                    complete(G)
                continue
            if ph == 1:
                c = recv_conn[sid]
                s = snd_wait[c]
                if s < 0:
                    rcv_wait[c] = G
                    blocked[G] = ("recv", c, sid)
                    break
                snd_wait[c] = -1
                complete(s)
                work.append(s)
                if send_conn[sid] >= 0:
                    phase[G] = 2
                else:
                    complete(G)
                continue
            c = send_conn[sid]
            r = rcv_wait[c]
            if r < 0:
                snd_wait[c] = G
                blocked[G] = ("send", c, sid)
                break
            rcv_wait[c] = -1
            rsid = base[r] + pc[r]
            if send_conn[rsid] >= 0:
                phase[r] = 2
                blocked[r] = None
            else:
                complete(r)
            work.append(r)
            complete(G)
    stuck = [G for G in range(nG) if pc[G] < L[G]]
    if not stuck:
        return None
    return {G: blocked[G] for G in stuck}


# --------------------------------------------------------------------------------------------------------
# 3-5. Symbolic execution, races, postcondition


class _HappensBefore:
    """Happens-before between steps of one rank: per-rank vector clocks over program order and dependencies,
    then a bounded search through the global graph (program order, dependencies, send -> recv)."""

    def __init__(self, ix: _Index, order: list[int], budget: int = 2_000_000, per_query: int = 50_000):
        self.ix = ix
        n = ix.nsteps
        self.time = [0] * n
        for t, sid in enumerate(order):
            self.time[sid] = t
        # local vector clocks, stored only at steps with a dependency
        self.dep_pos: list[list[int]] = [[] for _ in ix.tbs]
        self.dep_vc: list[list[dict]] = [[] for _ in ix.tbs]
        dep = ix.dep
        for sid in order:
            T = ix.dep_G[sid]
            if T < 0:
                continue
            G, i = ix.step_G[sid], ix.step_i[sid]
            vc = dict(self._vc_upto(G, i - 1)) if i > 0 else {}
            tv = self._vc_upto(T, ix.step_i[dep[sid]])
            for k, v in tv.items():
                if vc.get(k, -1) < v:
                    vc[k] = v
            vc.pop(G, None)
            self.dep_pos[G].append(i)
            self.dep_vc[G].append(vc)
        self.dependents: dict[int, list[int]] = defaultdict(list)
        for sid in range(n):
            if dep[sid] >= 0:
                self.dependents[dep[sid]].append(sid)
        self.match = {}
        for c in range(ix.nconn):
            for s, r in zip(ix.conn_sends[c], ix.conn_recvs[c]):
                self.match[s] = r
        self.budget = budget
        self.per_query = per_query
        self.memo: dict[tuple[int, int], bool | None] = {}

    def _vc_upto(self, G: int, i: int) -> dict:
        """Knowledge of tb G after its step i: {other G: last step index known}, plus {G: i}."""
        pos = self.dep_pos[G]
        k = bisect_right(pos, i) - 1
        base = self.dep_vc[G][k] if k >= 0 else {}
        out = dict(base)
        out[G] = i
        return out

    def _local(self, x: int, y: int) -> bool:
        ix = self.ix
        a, i = ix.step_G[x], ix.step_i[x]
        b, j = ix.step_G[y], ix.step_i[y]
        if a == b:
            return i <= j
        pos = self.dep_pos[b]
        k = bisect_right(pos, j) - 1
        if k < 0:
            return False
        return self.dep_vc[b][k].get(a, -1) >= i

    def ordered(self, x: int, y: int):
        """True if x happens before y (x ran first in the schedule), False if not, None if unknown."""
        if self._local(x, y):
            return True
        key = (x, y)
        if key in self.memo:
            return self.memo[key]
        ix = self.ix
        rank = ix.tbs[ix.step_G[y]][0].id
        ty = self.time[y]
        time = self.time
        L, base, step_G, step_i = ix.length, ix.base, ix.step_G, ix.step_i
        seen = {x}
        frontier = [x]
        result = False
        visited = 0
        while frontier and not result:
            nxt = []
            for z in frontier:
                visited += 1
                G = step_G[z]
                succ = []
                if step_i[z] + 1 < L[G]:
                    succ.append(z + 1)
                succ.extend(self.dependents.get(z, ()))
                m = self.match.get(z)
                if m is not None:
                    succ.append(m)
                for w in succ:
                    if w in seen or time[w] > ty:
                        continue
                    seen.add(w)
                    if ix.tbs[step_G[w]][0].id == rank and self._local(w, y):
                        result = True
                        break
                    nxt.append(w)
                if result:
                    break
            frontier = nxt
            if visited > self.per_query or visited > self.budget:
                result = None
                break
        self.budget -= visited
        self.memo[key] = result
        return result


def _replay(ctx: _Ctx, ix: _Index, order: list[int], hb: _HappensBefore, coll: str, inplace: bool, root: int,
            check_post: bool) -> bool:
    """Symbolic execution for one call kind; returns True when the postcondition holds."""
    p = ix.p
    ngpus, ncpl = p.ngpus, p.nchunksperloop
    cf = ncpl // ngpus
    mode = "in-place" if inplace else "out-of-place"
    # physical buffers
    phys: dict[int, dict[str, list]] = {}
    alias: dict[int, dict[str, tuple[str, int]]] = {}
    for g in p.gpus:
        al = _aliases(coll, inplace, g.id, cf)
        alias[g.id] = al
        sizes = {"i": max(g.i_chunks, ncpl), "o": max(g.o_chunks, ncpl), "s": g.s_chunks}
        need = dict(sizes)
        for letter, (pb, off) in al.items():
            need[pb] = max(need[pb], off + sizes[letter])
        phys[g.id] = {b: [GARBAGE] * need[b] for b in "ios"}
        for j in range(_input_count(coll, g.id, ngpus, ncpl, root) if coll in POSTCONDITION_COLLECTIVES
                       else g.i_chunks):
            pb, off = al["i"]
            phys[g.id][pb][off + j] = _weight(g.id, j)
    pushed: dict[int, list[int]] = {}
    match_send = {}
    for c in range(ix.nconn):
        for s, r in zip(ix.conn_sends[c], ix.conn_recvs[c]):
            match_send[r] = s
    last_write = {r: {b: [-1] * len(arr) for b, arr in bufs.items()} for r, bufs in phys.items()}
    readers = {r: {b: {} for b in bufs} for r, bufs in phys.items()}
    step_G = ix.step_G
    decided: set[int] = set()  # earlier steps already compared with the current step

    def race(x, y, kind, rank, pb, idx):
        if x in decided:
            return
        decided.add(x)
        verdict = hb.ordered(x, y)
        if verdict:
            return
        if verdict is None:
            ctx.add(WARNING, "race.unknown", f"{mode}: could not decide (search budget) whether {ix.name(x)} happens "
                                             f"before {ix.name(y)}; both touch {pb}[{idx}] ({kind})", **ix.where(y))
            return
        ctx.add(ERROR, "race", f"{mode}: {kind} race on {pb}[{idx}] (physical slot) of rank {rank}: {ix.name(x)} and "
                               f"{ix.name(y)} run in different thread blocks with no happens-before path; "
                               f"add a dependency", **ix.where(y))

    def access_read(sid, rank, pb, off, cnt):
        lw = last_write[rank][pb]
        rd = readers[rank][pb]
        G = step_G[sid]
        for idx in range(off, off + cnt):
            w = lw[idx]
            if w >= 0 and w != sid and step_G[w] != G:
                race(w, sid, "read-after-write", rank, pb, idx)
            lst = rd.get(idx)
            if lst is None:
                rd[idx] = [sid]
            elif lst[-1] != sid:
                lst.append(sid)

    def access_write(sid, rank, pb, off, cnt):
        lw = last_write[rank][pb]
        rd = readers[rank][pb]
        G = step_G[sid]
        for idx in range(off, off + cnt):
            w = lw[idx]
            if w >= 0 and w != sid and step_G[w] != G:
                race(w, sid, "write-after-write", rank, pb, idx)
            lst = rd.pop(idx, None)
            if lst:
                for x in lst:
                    if x != sid and step_G[x] != G:
                        race(x, sid, "write-after-read", rank, pb, idx)
            lw[idx] = sid

    def add(a, b):
        return GARBAGE if a == GARBAGE or b == GARBAGE else a + b

    for sid in order:
        st = ix.steps[sid]
        t = st.type
        if t is StepType.NOP:
            continue
        decided.clear()
        g, tb = ix.tbs[step_G[sid]]
        rank = g.id
        bufs = phys[rank]
        al = alias[rank]
        cnt = st.cnt
        src = dst = None
        if t.uses_src:
            pb, off = al[str(st.srcbuf)]
            off += st.srcoff
            arr = bufs[pb]
            src = arr[off:off + cnt]
            access_read(sid, rank, pb, off, cnt)
        if t.uses_dst:
            dpb, doff = al[str(st.dstbuf)]
            doff += st.dstoff
        incoming = pushed.pop(match_send[sid]) if t in _RECV_T else None
        if t is StepType.SEND:
            out = src
        elif t is StepType.RECV or t is StepType.RECV_COPY_SEND:
            out = incoming
        elif t is StepType.COPY:
            out = src
        elif t is StepType.REDUCE:
            cur = bufs[dpb][doff:doff + cnt]
            access_read(sid, rank, dpb, doff, cnt)
            out = [add(a, b) for a, b in zip(cur, src)]
        else:  # rrs, rrc, rrcs
            out = [add(a, b) for a, b in zip(incoming, src)]
        if t is StepType.COPY and src is not None and (dpb, doff) == (pb, off):
            pass  # a copy onto itself (the own chunk of an in-place AllGather): memory is unchanged, no write
        elif t.uses_dst:
            access_write(sid, rank, dpb, doff, cnt)
            bufs[dpb][doff:doff + cnt] = out
        if t in _SEND_T:
            pushed[sid] = out
    if not check_post:
        return False
    # postcondition
    bad = 0
    sums: dict[int, int] = {}
    leaf_of = None
    for g in sorted(p.gpus, key=lambda g: g.id):
        al = alias[g.id]
        pb, off = al["o"]
        arr = phys[g.id][pb]
        for idx, kind, a, b in _post_spec(coll, g.id, ngpus, ncpl, root):
            if kind == "chunk":
                want = _weight(a, b)
                wdesc = f"Chunk({a}, {b})"
            else:
                if b not in sums:
                    sums[b] = sum(_weight(q, b) for q in range(ngpus))
                want = sums[b]
                wdesc = f"the reduction of Chunk(q, {b}) over all {ngpus} ranks"
            if off + idx >= len(arr):
                ctx.add(ERROR, "post.buffer", f"{mode}: output chunk {idx} lies outside the buffer", rank=g.id)
                bad += 1
                continue
            have = arr[off + idx]
            if have == want:
                continue
            bad += 1
            if have == GARBAGE:
                hdesc = "uninitialised data (never written, or reduced with uninitialised data)"
            else:
                n = have // _COUNT_UNIT
                if n == 1:
                    if leaf_of is None:
                        leaf_of = {}
                        for q in range(ngpus):
                            for j in range(max(ncpl, max((gg.i_chunks for gg in p.gpus), default=0))):
                                leaf_of[_weight(q, j)] = (q, j)
                    o = leaf_of.get(have)
                    hdesc = f"Chunk({o[0]}, {o[1]})" if o else "one unknown contribution"
                else:
                    hdesc = f"a reduction of {n} contributions"
                    if kind == "sum" and n == ngpus:
                        hdesc += " (the wrong ones)"
            where = "o" if (pb, off) == ("o", 0) else f"o (alias of {pb}[{off}+])"
            ctx.add(ERROR, "post.mismatch", f"{mode} {coll}: {where}[{idx}] holds {hdesc}, expected {wdesc}",
                    rank=g.id)
    return bad == 0


# --------------------------------------------------------------------------------------------------------
# Entry point


def check_program(program: Program, *, dialect: str = "executor", max_steps: int | None = None,
                  max_threadblocks: int | None = None, max_nodes: int = MAX_NODES, sm_count: int = 132,
                  root: int | None = None, tiles: int = 1, rendezvous: bool = True,
                  max_findings_per_rule: int = 20, target=None, rules_only: bool = False) -> CheckReport:
    """Check every rule, deadlock and race freedom, and the declared collective's postcondition.

    Parameters
    ----------
    program : the program (from `taccl.xmlio` or built in Python).
    dialect : ``executor`` (limits of a default executor build: 64 steps per tb, 1024 tbs per rank) or
        ``legacy`` (256 steps, 216 tbs).
    max_steps, max_threadblocks : override the dialect's limits (a custom ``MSCCL_MAX_NUM_STEPS`` build).
    max_nodes : the parser's limit on the XML nodes one rank stores (``MAX_NODES``; a custom build).
    sm_count : thread blocks per rank above this get a co-residency warning (132: H100).
    root : root rank of broadcast/reduce/gather/scatter when the program does not name one (default 0).
    tiles : tile iterations to replay in the deadlock search (the runtime replays the program per tile).
    rendezvous : also search for deadlocks with unbuffered sends (warnings only).
    max_findings_per_rule : findings kept per rule; the rest are counted in ``report.suppressed``.
    target : a `taccl.targets.Target` (or its name): also what that runtime refuses beyond its dialect.
    rules_only : check the rules (limits, indices, the target's) and stop: no matching, deadlock search or
        proof (what a reader that does not prove the program, the simulator, still reports).
    """
    if dialect not in ("executor", "legacy"):
        raise ValueError(f"unknown dialect {dialect!r}")
    coll = "reducescatter" if program.collective == "reduce_scatter" else program.collective
    if max_steps is None:
        max_steps = 64 if dialect == "executor" else 256
    if max_threadblocks is None:
        max_threadblocks = 1024 if dialect == "executor" else 216
    root = program.root if program.root is not None else (root if root is not None else 0)
    ctx = _Ctx(program, max_findings_per_rule)
    report = CheckReport(collective=coll)
    if coll in ("broadcast", "reduce", "gather", "scatter") and not 0 <= root < max(program.ngpus, 1):
        ctx.add(ERROR, "algo.ranks", f"root {root} is not a rank", fatal=True)
    _check_rules(ctx, dialect, max_steps, max_threadblocks, sm_count, coll, max_nodes)
    if target is not None:
        from .targets import get_target, rooted_problem, target_problems

        target = get_target(target) if isinstance(target, str) else target
        for rank, message in target_problems(program, target):
            ctx.add(ERROR, "target", message, rank=rank)
        why = rooted_problem(program, target)
        if why:
            ctx.add(ERROR, "target", why)
    report.stats = {"ranks": len(program.gpus), "threadblocks": sum(len(g.threadblocks) for g in program.gpus),
                    "steps": program.nsteps}
    if rules_only:
        return _finish(ctx, report)
    ix = None
    if not ctx.fatal:
        ix = _Index(program)
        _check_matching(ctx, ix)
    if ctx.fatal or ix is None:
        ctx.add(INFO, "check.skipped", "deadlock, race and postcondition checks skipped: fix the errors above first")
        return _finish(ctx, report)
    depth = Proto(program.proto).fifo_depth
    order, blocked = _schedule(ix, depth, max(1, tiles))
    if blocked:
        _report_deadlock(ctx, ix, blocked, "deadlock", ERROR,
                         f"deadlock with {Proto(program.proto)} FIFOs ({depth} calls in flight per connection)",
                         depth)
        ctx.add(INFO, "check.skipped", "race and postcondition checks skipped: the program deadlocks")
        return _finish(ctx, report)
    for M, from_bytes, calls in _split_calls(ix, program):
        _, split_blocked = _schedule(ix, depth, max(1, tiles), calls)
        if split_blocked:
            _report_deadlock(ctx, ix, split_blocked, "deadlock", ERROR,
                             f"deadlock with {Proto(program.proto)} FIFOs ({depth} calls in flight per connection) "
                             f"at calls of {from_bytes} bytes and more, which the window takes: there a chunk is "
                             f"over 1/{M + 1} of a tile and the runtime moves a step's cnt chunks {M} a call "
                             f"(maxAllowedCount), in ceil(cnt / {M}) FIFO slots", depth)
            ctx.add(INFO, "check.skipped", "race and postcondition checks skipped: the program deadlocks")
            return _finish(ctx, report)
    if rendezvous:
        rblocked = _rendezvous(ix)
        if rblocked:
            _report_deadlock(ctx, ix, rblocked, "deadlock-rendezvous", WARNING,
                             "would deadlock with rendezvous (unbuffered) sends; it relies on FIFO buffering",
                             max_cycles=1)
    hb = _HappensBefore(ix, order)
    check_post = coll in POSTCONDITION_COLLECTIVES
    if not check_post:
        ctx.add(INFO, "post.unknown", f"no postcondition is known for collective {coll!r}: rules, deadlocks and "
                                      f"races checked only")
    modes = []
    if program.inplace:
        modes.append(True)
    if program.outofplace or not modes:
        modes.append(False)
    proven = check_post
    for inplace in modes:
        held = _replay(ctx, ix, order, hb, coll, inplace, root, check_post)
        report.modes.append("inplace" if inplace else "outofplace")
        proven = proven and held
    report.proven = proven and not any(f.severity == ERROR for f in ctx.findings)
    return _finish(ctx, report)


def _finish(ctx: _Ctx, report: CheckReport) -> CheckReport:
    report.findings = ctx.findings
    report.suppressed = dict(ctx.suppressed)
    report._suppressed_errors = dict(ctx.suppressed_errors)
    if report.findings and not report.ok:
        report.proven = False
    return report
