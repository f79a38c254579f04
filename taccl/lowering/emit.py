"""Passes after scheduling: scratch compaction, dependency insertion, instances, and the Program itself.

Dependency insertion (MSCCLang 5.2, msccl-xml.md 1.9). For each instruction, its same-rank dependencies in
other thread blocks are reduced to the latest step per block, and dropped when already implied: a per-rank
vector clock (what each thread block is known to have completed) is carried along program order and
through every wait. What is left becomes one dependency on the step, preceded by one ``nop`` per extra
dependency. Every waited-on step gets ``hasdep=1``; ``s`` counts steps, nops included.

Instances (``--instances N``, msccl-tools' interleaved replication): every thread block is cloned N times;
instance i uses channel ``ch + i * nch`` and slot ``x * N + i`` for logical slot x of every buffer, so each
chunk is split N ways and ``nchunksperloop``, the buffer sizes, the channel count and the thread-block
count are multiplied by N. The interleaved layout keeps AllGather's and AllToAll's input/output relation
intact; it makes logically contiguous slots non-contiguous, so with N > 1 the earlier passes emit only
``cnt = 1`` steps.

Thread-block numbering. A rank's thread blocks are numbered in the schedule's send order: by the scheduled
start of their first send (blocks that only receive or copy last), in every instance. Block ids carry no
meaning for the runtimes, but where several blocks' sends are ready at once and share a resource (a NIC, a
switch port) the lower id goes first: the GPU's block dispatcher issues blocks in ascending index, and the
simulator breaks such ties the same way. Numbered by channel and peer instead, a 2x DGX H100 AllGather at
64 KiB whose schedule sends a relayed chunk first ran its NIC in peer order: 10.01 us against its 8.53 us
schedule (8.53 since; on four instances 9.26 against 8.50, 8.98 since). Numbering each block's instance
copies next to each other too gave the four-instance program 8.49 us, but sent a DGX H100 node's sequenced
NIC sends (instances that wait for one another's flags) and the one-node all-pairs baselines' switch ports
in a worse order.
"""
from __future__ import annotations

import heapq

from ..program import MAX_NODES, Buf, Gpu, Program, Proto, Step, StepType, Threadblock, nop_step

from .schedule import OrderFailed

__all__ = ["compact_scratch", "emit", "check_limits"]

MAX_OFFSET = 32767
MAX_DEPID = 127


def compact_scratch(tbs, num_ranks: int) -> list:
    """Renumber each rank's used scratch slots densely (order kept); returns scratch chunks per rank."""
    used = [set() for _ in range(num_ranks)]
    instrs = [ins for tb in tbs for ins in tb.instrs]
    for ins in instrs:
        for b, o in ins.reads_slots + ins.writes_slots:
            if b is Buf.SCRATCH:
                used[ins.rank].add(o)
    maps = [{o: i for i, o in enumerate(sorted(u))} for u in used]
    for ins in instrs:
        m = maps[ins.rank]
        t = ins.type
        if ins.srcbuf is Buf.SCRATCH and t.uses_src:
            ins.srcoff = m[ins.srcoff]
        if ins.dstbuf is Buf.SCRATCH and t.uses_dst:
            ins.dstoff = m[ins.dstoff]
    return [len(u) for u in used]


def _rank_order(rank_tbs) -> list:
    """All instructions of a rank in an order that respects every tb's order and every dependency."""
    nxt = {}
    indeg = {}
    for tb in rank_tbs:
        for a, b in zip(tb.instrs, tb.instrs[1:]):
            nxt.setdefault(a.id, []).append(b)
        for ins in tb.instrs:
            indeg[ins.id] = indeg.get(ins.id, 0) + (1 if ins is not tb.instrs[0] else 0)
    for tb in rank_tbs:
        for ins in tb.instrs:
            for d in ins.deps:
                nxt.setdefault(d.id, []).append(ins)
                indeg[ins.id] += 1
    heap = [(ins.pos, ins.id, ins) for tb in rank_tbs for ins in tb.instrs if indeg[ins.id] == 0]
    heapq.heapify(heap)
    out = []
    while heap:
        _, _, ins = heapq.heappop(heap)
        out.append(ins)
        for j in nxt.get(ins.id, ()):
            indeg[j.id] -= 1
            if indeg[j.id] == 0:
                heapq.heappush(heap, (j.pos, j.id, j))
    if len(out) != len(indeg):
        raise OrderFailed()
    return out


def _plan_waits(rank_tbs):
    """Per instruction id: the (tb index, position) pairs it must wait for, minimal per the vector clocks."""
    pos = {}
    for tb in rank_tbs:
        for p, ins in enumerate(tb.instrs):
            pos[ins.id] = (tb.index, p)
    order = _rank_order(rank_tbs)
    clock_after = {}  # instr id -> {tb index: last position known complete}
    last_in_tb = {}
    waits = {}
    for ins in order:
        j, p = pos[ins.id]
        prev = last_in_tb.get(j)
        vc = dict(clock_after[prev]) if prev is not None else {}
        need = {}
        for d in ins.deps:
            dj, dp = pos[d.id]
            if dj == j:
                continue
            if need.get(dj, (-1,))[0] < dp:
                need[dj] = (dp, d)
        mine = []
        for dj, (dp, d) in sorted(need.items(), key=lambda kv: kv[1][1].pos, reverse=True):
            if vc.get(dj, -1) >= dp:
                continue
            mine.append((dj, dp))
            for tj, tp in clock_after[d.id].items():
                if vc.get(tj, -1) < tp:
                    vc[tj] = tp
        vc[j] = p
        clock_after[ins.id] = vc
        last_in_tb[j] = ins.id
        mine.sort()
        waits[ins.id] = mine
    return waits


def _hoist_reduction_waits(tb) -> None:
    """A run of local reductions into one slot is fused by the runtime into one pass over all its sources,
    but only when no reduction after the first waits on anything (msccl-xml.md 1.9): the whole run waits
    before its first (nops, then the reductions)."""
    run = []
    for ins in tb.instrs + [None]:
        same = (ins is not None and ins.type is StepType.REDUCE and run and ins.dstbuf is run[0].dstbuf
                and ins.dstoff == run[0].dstoff and ins.cnt == run[0].cnt and ins.srcbuf is run[0].srcbuf)
        if same:
            run.append(ins)
            continue
        members = set(run)
        for later in run[1:]:
            run[0].deps |= later.deps - members
        run = [ins] if ins is not None and ins.type is StepType.REDUCE else []


def _step(s, ins, depid, deps) -> Step:
    t = ins.type
    srcbuf, srcoff = (ins.srcbuf, ins.srcoff) if t.uses_src else (Buf.INPUT, -1)
    dstbuf, dstoff = (ins.dstbuf, ins.dstoff) if t.uses_dst else (Buf.OUTPUT, -1)
    return Step(s=s, type=t, srcbuf=srcbuf, srcoff=srcoff, dstbuf=dstbuf, dstoff=dstoff, cnt=ins.cnt,
                depid=depid, deps=deps, hasdep=False)


def emit(tbs, coll, *, name: str, instances: int, proto: str, min_bytes: int, max_bytes: int,
         scratch: list) -> Program:
    """Build the Program (see the module docstring)."""
    R = coll.num_ranks
    N = instances
    nch = max((tb.ch for tb in tbs), default=0) + 1
    by_rank = [[] for _ in range(R)]
    for tb in tbs:
        by_rank[tb.rank].append(tb)
    gpus = []
    for r in range(R):
        rank_tbs = sorted(by_rank[r], key=lambda t: (_first_send_us(t), t.ch, t.send, t.recv,
                                                    t.instrs[0].pos if t.instrs else ()))
        for j, tb in enumerate(rank_tbs):
            tb.index = j
            _hoist_reduction_waits(tb)
        waits = _plan_waits(rank_tbs)
        # final step index of every instruction (nops inserted before it)
        final = {}
        for tb in rank_tbs:
            s = 0
            for ins in tb.instrs:
                s += max(0, len(waits[ins.id]) - 1)
                final[ins.id] = s
                s += 1
        logical = []  # per tb: list of Step (logical slots), and the set of steps others wait on
        targets = set()
        for tb in rank_tbs:
            steps = []
            for ins in tb.instrs:
                w = waits[ins.id]
                for dj, dp in w[:-1]:
                    steps.append(nop_step(len(steps), dj, final[rank_tbs[dj].instrs[dp].id]))
                if w:
                    dj, dp = w[-1]
                    steps.append(_step(len(steps), ins, dj, final[rank_tbs[dj].instrs[dp].id]))
                else:
                    steps.append(_step(len(steps), ins, -1, -1))
                for dj, dp in w:
                    targets.add((dj, final[rank_tbs[dj].instrs[dp].id]))
            logical.append(steps)
        for dj, ds in targets:
            logical[dj][ds].hasdep = True
        L = len(rank_tbs)
        out_tbs = []
        for i in range(N):
            for j, tb in enumerate(rank_tbs):
                steps = []
                for st in logical[j]:
                    c = Step(s=st.s, type=st.type, srcbuf=st.srcbuf, srcoff=st.srcoff, dstbuf=st.dstbuf,
                             dstoff=st.dstoff, cnt=st.cnt, depid=st.depid, deps=st.deps, hasdep=st.hasdep)
                    if N > 1:
                        if c.srcoff >= 0:
                            c.srcoff = c.srcoff * N + i
                        if c.dstoff >= 0:
                            c.dstoff = c.dstoff * N + i
                        if c.depid >= 0:
                            c.depid = i * L + c.depid
                    steps.append(c)
                sends = any(st.type.is_send_type for st in steps)
                recvs = any(st.type.is_recv_type for st in steps)
                out_tbs.append(Threadblock(id=i * L + j, send=tb.send if sends else -1,
                                           recv=tb.recv if recvs else -1, chan=tb.ch + i * nch, steps=steps))
        _renumber_targets(out_tbs)
        gpus.append(Gpu(id=r, i_chunks=N * coll.input_chunks, o_chunks=N * coll.output_chunks,
                        s_chunks=N * scratch[r], threadblocks=out_tbs))
    rooted = coll.name in ("broadcast", "reduce", "gather", "scatter")
    return Program(name=name, collective=coll.xml_name, proto=Proto(proto), nchannels=nch * N,
                   nchunksperloop=N * max(coll.input_chunks, coll.output_chunks), ngpus=R, inplace=False,
                   outofplace=True, min_bytes=int(min_bytes), max_bytes=int(max_bytes), gpus=gpus,
                   root=coll.root if rooted else None)


def _first_send_us(tb) -> float:
    """When the schedule starts the block's first send (infinity: no send, or no schedule, as from the DSL)."""
    return min((ins.span[0] for ins in tb.instrs if ins.type.is_send_type and ins.span is not None),
               default=float("inf"))


def _renumber_targets(tbs) -> None:
    """Dependency targets must have ids <= 127 (int8): give them the smallest ids when needed."""
    targets = {st.depid for tb in tbs for st in tb.steps if st.depid >= 0}
    if not targets or max(targets) <= MAX_DEPID:
        return
    order = sorted(tbs, key=lambda tb: (tb.id not in targets, tb.id))
    new_id = {tb.id: k for k, tb in enumerate(order)}
    for tb in tbs:
        for st in tb.steps:
            if st.depid >= 0:
                st.depid = new_id[st.depid]
    for tb in tbs:
        tb.id = new_id[tb.id]
    tbs.sort(key=lambda tb: tb.id)


def check_limits(program: Program, *, max_tbs: int, max_steps: int, max_nodes: int = MAX_NODES) -> list:
    """Runtime limits a lowered program must respect; returns the violated ones as messages."""
    problems = []
    if program.nchannels > 32:
        problems.append(f"{program.nchannels} channels > 32 (MAXCHANNELS)")
    for g in program.gpus:
        if len(g.threadblocks) > max_tbs:
            problems.append(f"rank {g.id} needs {len(g.threadblocks)} thread blocks > {max_tbs} (--max-tbs, the "
                            f"SMs that must hold every block at once)")
            break
    worst = max(((len(tb.steps), g.id, tb.id) for g in program.gpus for tb in g.threadblocks), default=(0, 0, 0))
    if worst[0] > max_steps:
        problems.append(f"rank {worst[1]} tb {worst[2]} has {worst[0]} steps > {max_steps} (MSCCL_MAX_NUM_STEPS)")
    if program.max_nodes > max_nodes:
        problems.append(f"a rank stores {program.max_nodes} XML nodes > {max_nodes} (the parser's MAX_NODES)")
    big = max((max(st.srcoff, st.dstoff) for g in program.gpus for tb in g.threadblocks for st in tb.steps),
              default=0)
    if big > MAX_OFFSET:
        problems.append(f"chunk offset {big} > {MAX_OFFSET} (offsets are stored as int16)")
    for g in program.gpus:
        for tb in g.threadblocks:
            for st in tb.steps:
                if st.depid > MAX_DEPID:
                    problems.append(f"rank {g.id}: dependency on tb {st.depid} > {MAX_DEPID} (stored as int8)")
                    return problems
    return problems

