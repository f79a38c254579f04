"""Lowering: hand-built algorithms -> Program -> XML -> read back -> checker proves the collective."""
from __future__ import annotations

import json

import pytest

from taccl.algorithm import Algorithm, Transfer, collective_to_json, verify
from taccl.checker import check_program
from taccl.cli import main
from taccl.collectives import make_collective
from taccl.errors import CheckFailed, UserError
from taccl.lowering import lower, write_program
from taccl.program import Buf, StepType
from taccl.xmlio import parse_xml, program_to_xml


def _algo(name, coll, transfers):
    return Algorithm(name=name, collective=collective_to_json(coll), topology={"name": "t", "nodes": 1, "path": None},
                     input_size_bytes=1 << 20, chunk_bytes=1.0, transfers=transfers,
                     time_us=max(t.arrive_us for t in transfers))


def _add(tr, chunks, src, dst, op, t, deps=()):
    tr.append(Transfer(id=len(tr), chunks=tuple(chunks), src=src, dst=dst, op=op, send_us=float(t),
                       arrive_us=float(t) + 1.0, deps=tuple(deps)))
    return tr[-1].id


def ring_algorithm(coll_name, R, k=1):
    """Ring AllGather / ReduceScatter / AllReduce as an Algorithm (rank r owns chunks r*k..r*k+k-1)."""
    coll = make_collective(coll_name, R, k)
    tr, t, last = [], 0, {}
    nxt = lambda r: (r + 1) % R  # noqa: E731
    if coll_name in ("reducescatter", "allreduce"):
        for s in range(R - 1):
            for c in range(R):
                src = (c + 1 + s) % R
                last[c] = _add(tr, [c * k + i for i in range(k)], src, nxt(src), "reduce", t,
                               (last[c],) if c in last else ())
            t += 1
    if coll_name in ("allgather", "allreduce"):
        for s in range(R - 1):
            for c in range(R):
                src = (c + s) % R
                last[c] = _add(tr, [c * k + i for i in range(k)], src, nxt(src), "copy", t,
                               (last[c],) if c in last else ())
            t += 1
    return _algo(f"ring-{coll_name}", coll, tr)


def allreduce_2rank():
    coll = make_collective("allreduce", 2, 1)
    tr = []
    a = _add(tr, [0], 1, 0, "reduce", 0)
    b = _add(tr, [1], 0, 1, "reduce", 0)
    _add(tr, [0], 0, 1, "copy", 1, [a])
    _add(tr, [1], 1, 0, "copy", 1, [b])
    return _algo("ar2", coll, tr)


def allreduce_swap():
    """Two ranks swap their partial sums (each sends before the other's lands) and add what they get."""
    coll = make_collective("allreduce", 2, 1)
    tr = []
    for c in (0, 1):
        _add(tr, [c], 0, 1, "reduce", 0)
        _add(tr, [c], 1, 0, "reduce", 0)
    return _algo("swap", coll, tr)


def allreduce_exchange_late():
    """Two ranks exchange partial sums (`Transfer.exchange`), one sending after the other's has landed: it
    still sends its own sum without the other's."""
    coll = make_collective("allreduce", 2, 1)
    tr = []
    for c in (0, 1):
        a = _add(tr, [c], 0, 1, "reduce", 0)
        b = _add(tr, [c], 1, 0, "reduce", 3)
        tr[a].exchange, tr[b].exchange = (b,), (a,)
    tr.sort(key=lambda x: (x.send_us, x.id))
    return _algo("exchange-late", coll, tr)


def allreduce_group_exchange(R=3):
    """Every rank sends its partial sums to every other and adds the ones it gets (`Transfer.exchange`), the
    last rank sending after the others' sums have landed there: it still sends its own sum alone."""
    coll = make_collective("allreduce", R, 1)
    tr = []
    for c in range(R):
        sent = {u: [_add(tr, [c], u, v, "reduce", 3 if u == R - 1 else 0) for v in range(R) if v != u]
                for u in range(R)}
        for ids in sent.values():
            for i in ids:
                tr[i].exchange = tuple(sent[tr[i].dst])
    tr.sort(key=lambda x: (x.send_us, x.id))
    return _algo("group-exchange", coll, tr)


def alltoall_line(R=3):
    """AllToAll on a line 0-1-...-(R-1): chunks hop through relays, which must use scratch."""
    coll = make_collective("alltoall", R, 1)
    tr = []
    for s in range(R):
        for d in range(R):
            if s == d:
                continue
            step = 1 if d > s else -1
            cur, t, dep = s, 0, ()
            while cur != d:
                i = _add(tr, [s * R + d], cur, cur + step, "copy", t, dep)
                dep, cur, t = (i,), cur + step, t + 1
    tr.sort(key=lambda x: (x.send_us, x.id))
    return _algo("a2a-line", coll, tr)


def _roundtrip(program):
    text = program_to_xml(program)
    back = parse_xml(text).program
    report = check_program(back)
    assert report.ok, report.summary() + "\n" + "\n".join(map(str, report.errors[:5]))
    assert report.proven
    return back


CASES = [
    ("ring-allgather-4", lambda: ring_algorithm("allgather", 4)),
    ("ring-allgather-4x2", lambda: ring_algorithm("allgather", 4, 2)),
    ("ring-reducescatter-4", lambda: ring_algorithm("reducescatter", 4)),
    ("ring-allreduce-5", lambda: ring_algorithm("allreduce", 5)),
    ("allreduce-2", allreduce_2rank),
    ("allreduce-swap-2", allreduce_swap),  # received aside, folded once both were sent
    ("allreduce-exchange-late-2", allreduce_exchange_late),  # the same, declared, whatever the timing
    ("allreduce-group-exchange-3", allreduce_group_exchange),  # every rank with both others, one late
    ("alltoall-relay-3", lambda: alltoall_line(3)),
    ("alltoall-relay-4", lambda: alltoall_line(4)),
]


@pytest.mark.parametrize("name,make", CASES, ids=[c[0] for c in CASES])
@pytest.mark.parametrize("instances,fuse", [(1, True), (1, False), (2, True)])
def test_roundtrip_proven(name, make, instances, fuse):
    algo = make()
    verify(algo, algo.make_collective())
    program = lower(algo, instances=instances, fuse=fuse)
    back = _roundtrip(program)
    assert back.nchunksperloop == instances * algo.make_collective().buffer_chunks
    assert back.nchannels >= instances
    if not fuse:
        assert not {StepType.RECV_COPY_SEND, StepType.RECV_REDUCE_SEND, StepType.RECV_REDUCE_COPY_SEND} & \
            {st.type for _, _, st in back.iter_steps()}


def test_fusion_kinds():
    types = {st.type for _, _, st in lower(ring_algorithm("allreduce", 4)).iter_steps()}
    assert {StepType.RECV_COPY_SEND, StepType.RECV_REDUCE_SEND} <= types
    types = {st.type for _, _, st in lower(allreduce_2rank()).iter_steps()}
    assert StepType.RECV_REDUCE_COPY_SEND in types


def test_relay_uses_scratch_and_allgather_copies_own_chunk():
    p = lower(alltoall_line(3))
    assert p.gpu(1).s_chunks >= 2 and p.gpu(0).s_chunks == 0
    p = lower(ring_algorithm("allgather", 4))
    cpys = [st for g, _, st in p.iter_steps() if st.type is StepType.COPY]
    assert len(cpys) == 4 and all(st.srcbuf is Buf.INPUT and st.dstbuf is Buf.OUTPUT for st in cpys)


def test_merged_transfer_contiguity():
    coll = make_collective("allgather", 2, 2)
    tr = []
    _add(tr, [0, 1], 0, 1, "copy", 0)  # contiguous in input and output: one step, cnt 2
    _add(tr, [3, 2], 1, 0, "copy", 0)  # order does not matter
    p = lower(_algo("ag", coll, tr))
    sends = [st for _, _, st in p.iter_steps() if st.type is StepType.SEND]
    assert sorted(st.cnt for st in sends) == [2, 2]
    coll = make_collective("alltoall", 3, 1)
    tr = []  # rank 0 sends chunks for ranks 1 and 2 to 1 together: input slots 1,2 -> output 0 and scratch
    a = _add(tr, [1, 2], 0, 1, "copy", 0)
    _add(tr, [2], 1, 2, "copy", 1, [a])
    for s in (1, 2):
        for d in range(3):
            if d != s:
                _add(tr, [s * 3 + d], s, d, "copy", 2)
    algo = _algo("a2a", coll, tr)
    p = lower(algo)
    first = [st for _, tb, st in p.iter_steps() if st.type is StepType.SEND and st.cnt == 2]
    assert not first  # destinations are not contiguous (output vs scratch): two steps
    _roundtrip(p)


def test_window_proto_and_limits():
    algo = ring_algorithm("allgather", 4)
    p = lower(algo, proto="LL", min_bytes=1024, max_bytes=1 << 20)
    assert str(p.proto) == "LL" and p.min_bytes == 1024 and p.max_bytes == 1 << 20
    with pytest.raises(UserError, match="size window"):
        lower(algo, min_bytes=10, max_bytes=5)
    with pytest.raises(UserError, match="protocol"):
        lower(algo, proto="Fast")
    with pytest.raises(UserError, match="thread blocks"):
        lower(alltoall_line(4), instances=4, max_tbs=4)


def test_many_steps_spill_to_channels():
    p = lower(ring_algorithm("allgather", 80))  # 79 steps per rank > 64: two channels
    assert p.nchannels >= 2
    assert max(len(tb.steps) for g in p.gpus for tb in g.threadblocks) <= 64
    assert check_program(p).ok
    # the chunks' flows alternate between the two channels, so that both blocks of a connection run side by
    # side (it was 64 steps, then 17)
    for g in p.gpus:
        steps = [sum(1 for st in tb.steps if st.type is not StepType.NOP) for tb in g.threadblocks if tb.send >= 0]
        assert len(steps) == 2 and max(steps) - min(steps) <= 1, (g.id, steps)


def test_a_node_limit_no_step_cap_can_mend_ends_the_search_at_once(monkeypatch):
    import taccl.lowering as lowering

    builds = []
    real = lowering._build
    monkeypatch.setattr(lowering, "_build", lambda *a, **k: builds.append(1) or real(*a, **k))
    ops = lowering.algorithm_ops(ring_algorithm("allgather", 8), make_collective("allgather", 8))
    with pytest.raises(UserError, match="XML nodes > 12"):
        lowering.lower_ops(ops, make_collective("allgather", 8), name="ring",
                           options=lowering.LoweringOptions(max_nodes=12))
    assert len(builds) == 1  # a smaller step cap or less fusion only adds blocks or steps
    p = lowering.lower_ops(ops, make_collective("allgather", 8), name="ring",
                           options=lowering.LoweringOptions(max_nodes=10 ** 4))
    assert p.max_nodes == 1 + 8 + sum(1 + len(tb.steps) for tb in p.gpus[0].threadblocks)


def test_an_exchange_is_what_makes_a_late_reverse_reduction_right(tmp_path):
    algo = allreduce_exchange_late()
    verify(algo, algo.make_collective())
    for t in algo.transfers:  # undeclared, the late send carries the other's contribution back: counted twice
        t.exchange = ()
    with pytest.raises(CheckFailed, match="duplicated from"):
        verify(algo, algo.make_collective())
    # the field survives the file, and a broken one is refused naming the file
    doc = allreduce_exchange_late().to_json()
    assert doc["transfers"][0]["exchange"] == [1] and Algorithm.from_json(doc).transfers[0].exchange == (1,)
    doc["transfers"][0]["exchange"] = []  # transfer 1 names transfer 0, which does not name it back
    with pytest.raises(UserError, match=r"x\.algo\.json: \$\.transfers: transfer 1 \(1->0\) exchanges with "
                                        r"transfer 0, which is not a reduction from rank 0 of a chunk it carries, "
                                        r"exchanging too \(naming this one back"):
        Algorithm.from_json(doc, path="x.algo.json")
    # among three ranks, each sum a rank gets is added once both its own sends left: declared, right
    group = allreduce_group_exchange()
    verify(group, group.make_collective())
    for t in group.transfers:
        t.exchange = ()
    with pytest.raises(CheckFailed, match="duplicated from"):
        verify(group, group.make_collective())


def test_a_reduction_that_skips_a_rank_is_refused_naming_it():
    algo = ring_algorithm("reducescatter", 4)
    verify(algo, algo.make_collective())
    skip = next(t for t in algo.transfers if t.chunks == (0,) and not t.deps)  # the first hop of chunk 0's sum
    skip.op = "copy"  # its receiver's own contribution is overwritten, not added
    with pytest.raises(CheckFailed, match=r"chunk 0 on rank 0 is not the full sum: missing contributions of "
                                          rf"ranks \[{skip.dst}\], duplicated from \[\]"):
        verify(algo, algo.make_collective())


def test_write_program_checks(tmp_path):
    p = lower(ring_algorithm("allgather", 4))
    out = write_program(p, tmp_path / "ok.xml")
    assert out.read_text().startswith("<algo ")
    bad = lower(ring_algorithm("allgather", 4))
    bad.gpus[0].threadblocks[0].steps.pop()
    with pytest.raises(CheckFailed):
        write_program(bad, tmp_path / "bad.xml")
    assert not (tmp_path / "bad.xml").exists()


def test_lower_cli(tmp_path, capsys):
    path = tmp_path / "ring.algo.json"
    path.write_text(json.dumps(ring_algorithm("allreduce", 4).to_json()))
    assert main(["lower", str(path), "--instances", "2", "--proto", "LL128", "--max-bytes", "1M"]) == 0
    out = tmp_path / "ring.xml"
    prog = parse_xml(out.read_text()).program
    assert prog.max_bytes == 1 << 20 and str(prog.proto) == "LL128"
    assert main(["lower", str(path), "-o", str(tmp_path / "l.xml"), "--dialect", "legacy"]) == 0
    (tmp_path / "broken.json").write_text("{}")
    assert main(["lower", str(tmp_path / "broken.json")]) == 2
    assert main(["lower", str(path), "-o", str(tmp_path / "e.xml"), "--fusion", "eager"]) == 0
    capsys.readouterr()
    assert main(["lower", str(path), "--no-fusion", "--fusion", "eager"]) == 2
    assert "--no-fusion and --fusion eager contradict" in capsys.readouterr().err
    assert main(["lower", str(path), "--fusion", "network"]) == 2  # a one-node ring: nothing leaves a node


def test_too_many_thread_blocks_falls_back_to_less_fusion():
    # fused, some rank of this AllReduce needs 11 blocks (each fused receive-reduce-send pins a pair of
    # peers to one block); with a budget of 8 the lowering must pack and try the other fusion modes, not give up
    from pathlib import Path

    from taccl.sketch import load_sketch
    from taccl.synthesize import synthesize

    root = Path(__file__).resolve().parent.parent
    algo = synthesize(load_sketch(root / "sketches" / "ndv2-sk-1.json"), collective="allreduce")
    assert lower(algo, max_tbs=1000).max_threadblocks > 8
    prog = lower(algo, max_tbs=8)
    assert prog.max_threadblocks <= 8 and check_program(prog).ok


def test_every_sm_holds_a_block_and_the_waited_on_blocks_keep_int8_ids(monkeypatch):
    # a rank may have as many blocks as the GPU has SMs (H100: 132), beyond the 128 ids a dependency can name
    # (int8): emit gives the blocks others wait on the small ids. Where more blocks than ids are waited on, the
    # program is built again within the ids. Here the ids are cut to 16: this AllReduce on two instances has
    # 34 blocks a rank, 22 of them waited on, so it must come back within 16 blocks (packed)
    import importlib
    from pathlib import Path

    import taccl.lowering as lowering_module
    from taccl.sketch import load_sketch
    from taccl.synthesize import synthesize

    root = Path(__file__).resolve().parent.parent
    algo = synthesize(load_sketch(root / "sketches" / "ndv2-sk-1.json"), collective="allreduce")
    assert lower(algo, max_tbs=136, instances=8).max_threadblocks == 136  # 17 blocks an instance, 8 instances
    wide = lower(algo, max_tbs=1000, instances=2)
    assert wide.max_threadblocks == 34
    assert max(len({st.depid for tb in g.threadblocks for st in tb.steps if st.depid >= 0}) for g in wide.gpus) > 16
    monkeypatch.setattr(lowering_module, "MAX_DEPID", 15)
    monkeypatch.setattr(importlib.import_module("taccl.lowering.emit"), "MAX_DEPID", 15)
    narrow = lower(algo, max_tbs=1000, instances=2)
    assert narrow.max_threadblocks <= 16 and narrow.nchunksperloop == wide.nchunksperloop  # two instances still
    assert max(st.depid for g in narrow.gpus for tb in g.threadblocks for st in tb.steps) <= 15
    assert check_program(narrow).ok


def test_default_instances_halve_until_the_blocks_fit():
    # the algorithm asks for 4 instances; with room for fewer blocks the default count is halved (each
    # instance repeats every block), while an explicit count that does not fit is refused
    import dataclasses

    algo = dataclasses.replace(ring_algorithm("allgather", 4), instances=4)
    with pytest.raises(UserError, match="thread blocks"):
        lower(algo, instances=4, max_tbs=3)  # packed, an instance still needs a block of its own
    prog = lower(algo, max_tbs=3)
    assert prog.nchannels == lower(algo, instances=2).nchannels == 2 and prog.max_threadblocks <= 3
    assert check_program(prog).ok


def reduce_through_hubs(R=4):
    """ReduceScatter where, for every chunk, two ranks send their partial sums into a hub (rank owner+1),
    which forwards the sum to the owner: a reduce chain with a converging hop."""
    coll = make_collective("reducescatter", R, 1)
    tr = []
    for c in range(R):
        hub = (c + 1) % R
        leaves = [r for r in range(R) if r not in (c, hub)]
        into_hub = [_add(tr, [c], leaf, hub, "reduce", 0) for leaf in leaves]
        _add(tr, [c], hub, c, "reduce", 1, into_hub)
    return _algo("rs-hubs", coll, tr)


def test_last_partial_sum_reduces_as_it_lands_with_short_steps():
    """LL/LL128: the hub receives the first partial aside, folds it in, and reduces the last one as it lands in
    the block that forwards the sum (one receive-reduce-send, the fold right before it); Simple receives every
    partial aside and folds them before a plain send."""
    algo = reduce_through_hubs()
    for proto in ("LL", "LL128", "Simple"):
        program = _roundtrip(lower(algo, proto=proto))
        forwarding = [(tb, i) for g in program.gpus for tb in g.threadblocks for i, st in enumerate(tb.steps)
                      if st.type is StepType.RECV_REDUCE_SEND]
        if proto == "Simple":
            assert not forwarding
            continue
        assert len(forwarding) == 4  # one per chunk, at its hub
        # the fold goes right before it; at rank 1 another step of that block lies between them, which the
        # schedule has arriving before the partial sums, so the fold goes after that step
        assert sum(i > 0 and tb.steps[i - 1].type is StepType.REDUCE for tb, i in forwarding) == 4



def test_the_partial_that_lands_last_is_the_one_reduced_as_it_lands():
    """A partial sum that crosses a slow link is sent first and lands last: it, not the one sent last, is
    reduced as it lands (LL), with the others folded before it in its block; nothing waits on another
    block's fold once it arrives. A move past a transfer on its own connection is refused."""
    from taccl.lowering.buffers import _latest_arrival_last, transfer_order

    coll = make_collective("reducescatter", 4, 1)
    tr = []
    for c in range(4):  # every other rank sends its partial of chunk c to rank c; the one from c+1 is slow
        for k, src in enumerate(r for r in range(4) if r != c):
            tr.append(Transfer(id=len(tr), chunks=(c,), src=src, dst=c, op="reduce", send_us=float(k),
                               arrive_us=10.0 if src == (c + 1) % 4 else k + 1.0))
    algo = _algo("rs-slow", coll, tr)
    moved = [(t.src, t.dst) for t in _latest_arrival_last(transfer_order(tr))]
    for c in range(4):
        assert [s for s, d in moved if d == c][-1] == (c + 1) % 4
    program = _roundtrip(lower(algo, proto="LL"))
    for c, gpu in enumerate(program.gpus):
        [last] = [tb for tb in gpu.threadblocks
                  if any(s.type is StepType.RECV_REDUCE_COPY for s in tb.steps)]
        assert last.recv == (c + 1) % 4 and last.steps[-1].type is StepType.RECV_REDUCE_COPY
    # the same slow partial behind another transfer on its connection stays where it is
    blocker = Transfer(id=len(tr), chunks=(1,), src=1, dst=0, op="copy", send_us=1.5, arrive_us=2.5)
    ids = [t.id for t in _latest_arrival_last(transfer_order(tr + [blocker]))]
    assert ids.index(0) < ids.index(blocker.id) < ids.index(2)  # 0 is rank 0's slow partial, 2 its last sent

def test_fusion_check_walks_a_block_in_its_real_order():
    """A fused receive-send sits in its block at its receive's place in the receive order (order_tb), not at
    its send's position: a plain receive keyed after it waits behind it."""
    from taccl.lowering.fusion import _block_order

    class Step:  # the two fields the walk reads; compared by identity
        def __init__(self, at):
            self.key = self.pos = (at,)

    y0, y1, y2 = Step(1), Step(5), Step(6)  # sends to B
    x1, r2 = Step(2), Step(3)  # receives from A; x1 fuses with y1
    assert _block_order([y0, y1, y2], [x1, r2], {x1: y1}) == [y0, y1, r2, y2]
    # two fused pairs received in one order and sent in the other cannot share a block
    xa, xb, ya, yb = Step(1), Step(2), Step(2), Step(1)
    assert _block_order([ya, yb], [xa, xb], {xa: ya, xb: yb}) is None


def _fused_steps(prog) -> int:
    fused = (StepType.RECV_COPY_SEND, StepType.RECV_REDUCE_SEND, StepType.RECV_REDUCE_COPY_SEND)
    return sum(s.type in fused for g in prog.gpus for tb in g.threadblocks for s in tb.steps)


def _lower_policy(algo, **kw):
    """`taccl.lowering._lower_one` (one fusion policy) with `lower`'s defaults, `kw` over them:
    (program, whether the last partial sums reduce as they land, its instances)."""
    from taccl.lowering import _lower_one

    args = dict(instances=None, proto=None, min_bytes=0, max_bytes=0, max_tbs=108, fuse=True, check=True,
                name=None, keep_schedule=True)
    return _lower_one(algo, **{**args, **kw})


def test_with_a_topology_the_faster_fusion_policy_is_kept():
    # 2x DGX H100 AllToAll through the rails: the schedule check keeps each relay's forwards to the NIC in
    # one block behind a flag wait per chunk; fusing them (each local peer's chunks on their own channel)
    # is faster on the calibrated model, and `lower` with the topology returns that program
    from pathlib import Path

    from taccl.simulator import Simulator
    from taccl.sketch import load_sketch
    from taccl.synthesize import SynthesisOptions, synthesize

    root = Path(__file__).resolve().parent.parent
    algo = synthesize(load_sketch(root / "sketches" / "dgx-h100-hier.json"), collective="alltoall",
                      input_size="64K", options=SynthesisOptions(time_limit_s=20, proto="LL", instances=4))
    topo = algo.load_topology()
    kept, eager = lower(algo, keep_schedule=True), lower(algo, keep_schedule=False)
    assert _fused_steps(eager) > _fused_steps(kept)
    best = lower(algo, topology=topo)
    assert program_to_xml(best) in (program_to_xml(kept), program_to_xml(eager))
    times = {name: Simulator(p, topo).run(algo.input_size_bytes).time_us
             for name, p in (("kept", kept), ("eager", eager), ("best", best))}
    assert times["eager"] < times["kept"] and times["best"] == times["eager"]
    assert check_program(best).ok
    assert program_to_xml(lower(algo)) == program_to_xml(kept)  # no topology: the schedule's fusion


def test_with_a_topology_no_fusion_is_kept_where_it_is_fastest():
    # 2x DGX H100 ReduceScatter over the rails at 256 MiB: a fused receive-reduce-send ties a block to the
    # network receive and to a local send, and that block takes its local sends first while the NIC's
    # partial sums wait (back-pressure on the network); unfused, each connection has its own block
    from pathlib import Path

    from taccl.simulator import Simulator
    from taccl.sketch import load_sketch
    from taccl.synthesize import SynthesisOptions, synthesize

    root = Path(__file__).resolve().parent.parent
    algo = synthesize(load_sketch(root / "sketches" / "dgx-h100-rail.json"), collective="reducescatter",
                      options=SynthesisOptions(time_limit_s=20))
    topo = algo.load_topology()
    best = lower(algo, topology=topo)
    assert _fused_steps(best) == 0 and check_program(best).ok
    assert program_to_xml(best) == program_to_xml(lower(algo, fuse=False))
    time_of = lambda p: Simulator(p, topo).run(algo.input_size_bytes).time_us  # noqa: E731
    assert time_of(best) < min(time_of(lower(algo, keep_schedule=k)) for k in (True, False))


def test_a_tie_at_the_input_size_goes_to_the_least_latency():
    # 2x NDv2 AllToAll through the hierarchy, LL at 1 MB: the three fusion policies take the same time
    # there (bandwidth-bound), and eager fusion is the fastest at 1 KiB
    from pathlib import Path

    from taccl.simulator import TIE_TOLERANCE, Simulator
    from taccl.sketch import load_sketch
    from taccl.synthesize import SynthesisOptions, synthesize

    root = Path(__file__).resolve().parent.parent
    algo = synthesize(load_sketch(root / "sketches" / "ndv2-hier.json"), collective="alltoall", input_size="1M",
                      options=SynthesisOptions(time_limit_s=20, proto="LL", instances=1))
    topo = algo.load_topology()
    programs = [lower(algo, keep_schedule=True), lower(algo, keep_schedule=False), lower(algo, fuse=False)]
    at_size = [Simulator(p, topo).run(algo.input_size_bytes).time_us for p in programs]
    assert max(at_size) <= min(at_size) * (1 + TIE_TOLERANCE)
    at_1k = [Simulator(p, topo).run(1024).time_us for p in programs]
    assert at_1k[1] < min(at_1k[0], at_1k[2])
    # (with `connection_blocks` given, "auto" does not lower its fastest policy again on two blocks a connection)
    assert program_to_xml(lower(algo, topology=topo, connection_blocks=1)) == program_to_xml(programs[1])
    # an AllToAll sends every chunk to one rank: no fan-out, so no fourth policy to lower
    with pytest.raises(UserError, match="nothing for network_fan_out to fuse"):
        _lower_policy(algo, keep_schedule=False, network_fan_out=topo.spec.gpus_per_node)


def test_past_the_transfer_cap_auto_lowers_the_schedules_policy_alone(monkeypatch):
    # the same AllToAll, where `auto` keeps eager fusion: with fewer transfers allowed than it has, only the
    # schedule's fusion is lowered (on a million transfers each policy takes minutes), and the run says so
    import io

    import taccl.lowering as lowering
    from taccl.progress import Reporter

    algo, topo, chosen = _ndv2_alltoall_and_its_chosen_program()
    monkeypatch.setattr(lowering, "AUTO_POLICIES_MAX_TRANSFERS", len(algo.transfers) - 1)
    out = io.StringIO()
    program = lower(algo, topology=topo, report=Reporter(stream=out))
    assert program_to_xml(program) == program_to_xml(lower(algo, keep_schedule=True)) != chosen
    assert "only the schedule's fusion policy" in out.getvalue()


def _ndv2_alltoall_and_its_chosen_program():
    """A 2x NDv2 hierarchical AllToAll (LL, 1 MiB), its topology, and the XML `lower` chooses for it."""
    from pathlib import Path

    from taccl.sketch import load_sketch
    from taccl.synthesize import SynthesisOptions, synthesize

    root = Path(__file__).resolve().parent.parent
    algo = synthesize(load_sketch(root / "sketches" / "ndv2-hier.json"), collective="alltoall", input_size="1M",
                      options=SynthesisOptions(time_limit_s=20, proto="LL", instances=1))
    topo = algo.load_topology()
    return algo, topo, program_to_xml(lower(algo, topology=topo))


def test_a_chosen_candidate_that_fails_its_proof_gives_way_to_the_next(monkeypatch):
    # the fusion policies' programs are lowered unchecked and only the chosen one is proven: should its
    # proof fail (a lowering bug), the next fastest is returned, proven
    from types import SimpleNamespace

    import taccl.lowering as lowering

    algo, topo, chosen = _ndv2_alltoall_and_its_chosen_program()
    proven = []
    real = lowering.verify_program

    def verify(program, **kw):
        if program_to_xml(program) == chosen:
            return SimpleNamespace(ok=False)
        proven.append(program_to_xml(program))
        return real(program, **kw)

    monkeypatch.setattr(lowering, "verify_program", verify)
    other = lower(algo, topology=topo)
    assert program_to_xml(other) != chosen and proven[-1] == program_to_xml(other)
    assert check_program(other).ok


def test_a_candidate_the_simulator_refuses_is_ranked_last_not_an_error(monkeypatch):
    # an unproven candidate may be ill-formed (a lowering bug: a connection with no block on one side); the
    # simulator's refusal must rank it last, as a deadlock, not fail the lowering
    import taccl.simulator as simulator

    algo, topo, chosen = _ndv2_alltoall_and_its_chosen_program()
    real = simulator.Simulator.__init__

    def init(self, program, topology, options=None):
        if program_to_xml(program) == chosen:
            raise UserError("rank 0 tb 0: connection 0->1 on channel 0 has no thread block on the other side")
        real(self, program, topology, options)

    monkeypatch.setattr(simulator.Simulator, "__init__", init)
    other = lower(algo, topology=topo)
    assert program_to_xml(other) != chosen and check_program(other).ok


def test_a_fusion_policy_that_deadlocks_unchecked_is_lowered_again_proven():
    # 2x DGX H100 AllReduce over the rails, Simple at 16 MiB: eager fusion in time order, with each instance's
    # blocks merged down to 32 (one of the programs "auto" ranks on 132 SMs), deadlocks with Simple's
    # two-call FIFOs (the simulator says so too); ranking the unchecked candidates must not fail on it, and
    # that policy is lowered again with each fusion mode proven (it falls back to the safe mode)
    import gzip
    from pathlib import Path

    from taccl.simulator import Simulator

    # the algorithm is stored: routing stops on a stall of solver work measured on the thread's clock, and
    # incumbents of one makespan (268.5 us here) whose eager lowerings do or do not deadlock come out of
    # runs that differ by a few milliseconds (synthesize(sketches/dgx-h100-rail.json, allreduce, 16MiB,
    # stall_s=1, Simple, four instances) gave either, one run after the other)
    stored = Path(__file__).resolve().parent / "data" / "h100-rail-allreduce-16MiB.algo.json.gz"
    algo = Algorithm.from_json(json.loads(gzip.decompress(stored.read_bytes())))
    topo = algo.load_topology()
    eager = _lower_policy(algo, max_tbs=132, check=False, keep_schedule=False, flag_us=topo.spec.sync_us,
                          converges=("aside",), blocks_within_ids=True)[0]
    assert not check_program(eager).ok
    with pytest.raises(CheckFailed, match="deadlocks in simulation"):
        Simulator(eager, topo).run(algo.input_size_bytes)
    best = lower(algo, topology=topo, max_tbs=132)
    assert check_program(best).ok and Simulator(best, topo).run(algo.input_size_bytes).time_us > 0


def test_the_sum_sent_back_over_the_network_fuses_with_its_receive():
    # 2x DGX A100 hierarchical AllReduce, LL at 64 KiB: the rail's sum arrives at its owner over the network
    # and goes back over it and to the seven local peers; forwarding it back in the step that receives it
    # (a fan-out fusion, which only the network policy allows) saves a flag wait on the slowest path
    from pathlib import Path

    from taccl.simulator import Simulator
    from taccl.sketch import load_sketch
    from taccl.synthesize import SynthesisOptions, synthesize

    root = Path(__file__).resolve().parent.parent
    algo = synthesize(load_sketch(root / "sketches" / "dgx-a100-hier.json"), collective="allreduce",
                      input_size="64K", options=SynthesisOptions(time_limit_s=20, proto="LL", instances=4))
    topo = algo.load_topology()
    best = lower(algo, topology=topo)
    assert check_program(best).ok
    gpn = topo.spec.gpus_per_node
    network_forwards = [tb for g in best.gpus for tb in g.threadblocks for st in tb.steps
                        if st.type == StepType.RECV_REDUCE_COPY_SEND.value and tb.send // gpn != g.id // gpn]
    assert network_forwards
    time_of = lambda p: Simulator(p, topo).run(algo.input_size_bytes).time_us  # noqa: E731
    others = [lower(algo, keep_schedule=k) for k in (True, False)] + [lower(algo, fuse=False)]
    assert time_of(best) < 0.95 * min(time_of(p) for p in others)
    kw = dict(keep_schedule=False, flag_us=topo.spec.sync_us)
    assert program_to_xml(best) == program_to_xml(_lower_policy(algo, network_fan_out=gpn, **kw)[0])
    without = _lower_policy(algo, **kw)[0]
    assert not [st for g in without.gpus for tb in g.threadblocks for st in tb.steps
                if st.type == StepType.RECV_REDUCE_COPY_SEND.value and tb.send // gpn != g.id // gpn]


def test_a_network_send_fuses_with_a_fan_out_whose_local_readers_come_first():
    # 2x NDv2 AllReduce through any GPU pair (sk-2), LL on two channels at 64 KiB: the rank reducing a
    # rail's sum gets the other node's partial over the NIC, and the schedule forwards the sum to its local
    # peers before sending it back over the NIC. The network policy still fuses that send with the receive
    # (the local sends wait for it), which saves the flag wait on the slowest path: faster at 8 KiB, where
    # latency is all, though not at the input size, so a SKU lists it as a variant of its own. The routing
    # runs to its optimum (no stall rule), so the program does not depend on the machine's load.
    from pathlib import Path

    from taccl.simulator import Simulator
    from taccl.sketch import load_sketch
    from taccl.synthesize import SynthesisOptions, synthesize

    root = Path(__file__).resolve().parent.parent
    algo = synthesize(load_sketch(root / "sketches" / "ndv2-sk-2.json"), collective="allreduce",
                      input_size="64K", options=SynthesisOptions(time_limit_s=60, stall_s=0, proto="LL", instances=2))
    topo = algo.load_topology()
    gpn = topo.spec.gpus_per_node
    network = lower(algo, topology=topo, fusion="network")
    eager = lower(algo, topology=topo, fusion="eager")
    assert check_program(network).ok
    fused_to_network = lambda p: sum(  # noqa: E731
        1 for g in p.gpus for tb in g.threadblocks for st in tb.steps
        if st.type in (StepType.RECV_REDUCE_COPY_SEND.value, StepType.RECV_COPY_SEND.value)
        and tb.send // gpn != g.id // gpn and tb.recv // gpn != g.id // gpn)
    assert fused_to_network(network) > fused_to_network(eager)
    saved = Simulator(eager, topo).run(8192).time_us - Simulator(network, topo).run(8192).time_us
    assert saved > topo.spec.sync_us / 2
    # the named policies are the ones "auto" chooses among, each also landing its converging reductions the
    # other way (LL: all aside) (the fastest of them is also lowered on two blocks a connection, unless
    # `connection_blocks` is given)
    from taccl.lowering import _fusion_policy

    unfused = lower(algo, topology=topo, fusion="none")
    assert _fused_steps(unfused) == 0 < _fused_steps(eager)
    aside = []
    for name in ("schedule", "eager", "none", "network"):
        try:
            aside.append(_lower_policy(algo, flag_us=topo.spec.sync_us, converges=("aside",),
                                       **_fusion_policy(name, topo))[0])
        except UserError:  # landed aside, no fan-out leaves a node: nothing for the network policy to fuse
            pass
    assert program_to_xml(lower(algo, topology=topo, connection_blocks=1)) in {program_to_xml(p) for p in (
        network, eager, lower(algo, topology=topo, fusion="schedule"), unfused, *aside)}


def test_a_named_fusion_policy_that_cannot_apply_is_refused():
    algo = ring_algorithm("allgather", 4)
    with pytest.raises(UserError, match="unknown fusion policy 'greedy'"):
        lower(algo, fusion="greedy")
    with pytest.raises(UserError, match="needs the algorithm's topology with several nodes"):
        lower(algo, fusion="network")


def test_reductions_land_aside_where_reducing_as_they_land_exceeds_the_runtime_limits():
    # 16x DGX H100 ReduceScatter, LL128: reducing each last partial as it lands pins receives to the blocks
    # that forward the sums; with at most 24 blocks per rank that does not fit, every partial landing aside
    # does (on all 132 SMs both fit since the ordering takes the ring's turns)
    from pathlib import Path

    from taccl.sketch import load_sketch
    from taccl.synthesize import SynthesisOptions, synthesize

    root = Path(__file__).resolve().parent.parent
    algo = synthesize(load_sketch(root / "sketches" / "dgx-h100-hier.json"), nodes=16, collective="reducescatter",
                      input_size="64K", options=SynthesisOptions(time_limit_s=20, proto="LL128", instances=1))
    with pytest.raises(UserError, match="runtime's limits"):
        _lower_policy(algo, max_tbs=24, check=False, converges=("direct-last",))
    program = lower(algo, max_tbs=24)
    assert program.max_threadblocks <= 24 and check_program(program).ok
    assert program_to_xml(program) == program_to_xml(_lower_policy(algo, max_tbs=24, check=False,
                                                                   converges=("aside",))[0])


def test_reductions_land_in_place_where_landing_aside_exceeds_the_xml_node_limit(monkeypatch):
    # 4x DGX H100 ReduceScatter, hierarchical with ring rails (the 1024-GPU sketch at 4 nodes): landing each
    # node's seven partial sums aside costs a local reduction per partial and the fold's flag waits; on 1024
    # ranks that is over the parser's 4096 XML nodes a rank stores. Here the limit is lowered to 150 (aside:
    # 176, in place: 115): the partials then reduce into the copy one after another as they land, proven
    from pathlib import Path

    import taccl.lowering as lowering
    from taccl.sketch import load_sketch
    from taccl.synthesize import synthesize

    root = Path(__file__).resolve().parent.parent
    algo = synthesize(load_sketch(root / "sketches" / "dgx-h100-n128.json"), nodes=4, collective="reducescatter")
    aside = _lower_policy(algo, converges=("aside",))[0]
    assert aside.max_nodes > 150
    limits = lowering.check_limits
    monkeypatch.setattr(lowering, "check_limits", lambda program, **kw: limits(program, **{**kw, "max_nodes": 150}))
    with pytest.raises(UserError, match="XML nodes"):
        _lower_policy(algo, converges=("aside",))
    program = lower(algo, topology=algo.load_topology())
    assert program.max_nodes <= 150 and check_program(program).ok
    steps = [st.type for g in program.gpus for tb in g.threadblocks for st in tb.steps]
    assert StepType.REDUCE not in steps and StepType.RECV_REDUCE_COPY in steps


def test_instructions_that_alone_pass_the_node_limit_are_refused_before_allocating(monkeypatch):
    # every live instruction is a step of its rank: past the limit with those alone, no cap, packing or
    # fusion mode can help, and on 1024 ranks allocating and emitting would cost minutes
    from pathlib import Path

    import taccl.lowering as lowering
    from taccl.lowering import LoweringOptions, lower_ops
    from taccl.lowering.buffers import algorithm_ops
    from taccl.sketch import load_sketch
    from taccl.synthesize import synthesize

    root = Path(__file__).resolve().parent.parent
    algo = synthesize(load_sketch(root / "sketches" / "dgx-h100-n128.json"), nodes=4, collective="reducescatter")
    coll = algo.make_collective()
    ops = algorithm_ops(algo, coll, converge="aside")
    fits = lower_ops(ops, coll, name="rs", options=LoweringOptions(check=False))
    instrs = lowering.generate(ops, coll.num_ranks)
    lowering.fuse(instrs, mode="natural")
    assert 60 < lowering._nodes_floor(instrs, coll.num_ranks, 1) <= fits.max_nodes

    def no_allocation(*a, **kw):
        raise AssertionError("allocated")

    monkeypatch.setattr(lowering, "allocate", no_allocation)
    with pytest.raises(UserError, match=r"runtime's limits: a rank stores at least \d+ XML nodes > 60"):
        lower_ops(ops, coll, name="rs", options=LoweringOptions(max_nodes=60, check=False))


def test_fewer_steps_per_block_spread_connections_over_more_channels():
    # 16x DGX H100 AllGather, ring rails: 16 transfers per node-phase connection fill one block at the
    # default 64 steps; at 8 they are dealt over two channels, the same steps in more blocks, proven
    from pathlib import Path

    from taccl.sketch import load_sketch
    from taccl.synthesize import synthesize

    root = Path(__file__).resolve().parent.parent
    algo = synthesize(load_sketch(root / "sketches" / "dgx-h100-n128.json"), nodes=16, input_size="1M")
    # the sketch's hyperparameter: kept in the algorithm, where the lowering starts by default
    assert algo.block_steps == Algorithm.from_json(algo.to_json()).block_steps == 32
    plain = lower(algo, fusion="schedule")
    assert program_to_xml(plain) == program_to_xml(lower(algo, fusion="schedule", block_steps=32))
    spread = lower(algo, fusion="schedule", block_steps=8)
    assert (plain.nchannels, spread.nchannels) == (1, 2) and spread.nsteps == plain.nsteps
    assert spread.max_threadblocks > plain.max_threadblocks and check_program(spread).ok
    with pytest.raises(UserError, match="--block-steps must be a multiple of 8 from 8 to 64, got 12"):
        lower(algo, fusion="schedule", block_steps=12)


def test_auto_spreads_connections_over_channels_where_that_is_faster():
    # 16x DGX H100 hierarchical AllGather synthesized for four instances at 1 MiB: on one instance at 8 steps
    # a block, a connection's whole chunks run on several channels at once instead of four quarter chunks
    # each (about 65 against 92 us on the calibrated model); `auto` ranks that program and keeps it
    from pathlib import Path

    from taccl.simulator import Simulator
    from taccl.sketch import load_sketch
    from taccl.synthesize import SynthesisOptions, synthesize

    root = Path(__file__).resolve().parent.parent
    algo = synthesize(load_sketch(root / "sketches" / "dgx-h100-hier.json"), collective="allgather", nodes=16,
                      input_size="1MiB", options=SynthesisOptions(time_limit_s=20, instances=4))
    topo = algo.load_topology()
    best = lower(algo, topology=topo)
    spread = lower(algo, topology=topo, fusion="schedule", instances=1, block_steps=8)
    assert program_to_xml(best) == program_to_xml(spread) and check_program(best).ok
    as_synthesized = lower(algo, topology=topo, fusion="schedule")
    assert as_synthesized.nchannels == 4 and best.nchannels > 1 and best.nsteps < as_synthesized.nsteps
    time_of = lambda p: Simulator(p, topo).run(algo.input_size_bytes).time_us  # noqa: E731
    assert time_of(best) < 0.8 * time_of(as_synthesized)


def test_auto_also_lowers_its_fastest_policy_with_each_connection_on_two_blocks():
    # 2x DGX H100 AllReduce flat over the rails, Simple on four instances at 256 MiB: each connection's
    # transfers alternate between two thread blocks (8 channels, not 4), so that no block's bandwidth cap
    # leaves a connection's next transfer waiting: 4% faster at the input size, and faster at 4x it too
    from pathlib import Path

    from taccl.simulator import Simulator
    from taccl.sketch import load_sketch
    from taccl.synthesize import SynthesisOptions, synthesize

    root = Path(__file__).resolve().parent.parent
    algo = synthesize(load_sketch(root / "sketches" / "dgx-h100-rail.json"), collective="allreduce",
                      input_size="256MiB", options=SynthesisOptions(time_limit_s=20, proto="Simple", instances=4))
    topo = algo.load_topology()
    best = lower(algo, topology=topo, max_tbs=132)
    one_block = lower(algo, topology=topo, max_tbs=132, connection_blocks=1)
    assert program_to_xml(best) == program_to_xml(
        lower(algo, topology=topo, max_tbs=132, fusion="schedule", connection_blocks=2))
    assert (one_block.nchannels, best.nchannels) == (4, 8) and check_program(best).ok
    size = algo.input_size_bytes
    two, one = ([Simulator(p, topo).run(s).time_us for s in (size, 4 * size)] for p in (best, one_block))
    assert two[0] < 0.97 * one[0] and two[1] < 0.99 * one[1]
    with pytest.raises(UserError, match="--connection-blocks must be from 1 to 8"):
        lower(algo, topology=topo, connection_blocks=9)


def test_auto_also_ranks_each_program_of_over_128_blocks_merged_within_the_dependency_ids(tmp_path):
    # 2x DGX H100 AllReduce, chunks cut in four on four instances at 16 MiB: on two blocks a connection the
    # program takes 132 blocks a rank (104.1 us); merged down to 32 an instance, as every rank was before
    # it could use all 132 SMs, one peer's sending and receiving blocks share one and it takes 101.4 us.
    # "auto" lowers both and keeps the faster
    import json
    from pathlib import Path

    from taccl.simulator import Simulator
    from taccl.sketch import load_sketch
    from taccl.synthesize import synthesize

    root = Path(__file__).resolve().parent.parent
    doc = json.loads((root / "sketches" / "dgx-h100-hier.json").read_text())
    doc.update(collective="allreduce", input_size="16M",
               hyperparameters={"input_chunkup": 4, "instances": 4, "protocol": "Simple"})
    (tmp_path / "sketch.json").write_text(json.dumps(doc))
    algo = synthesize(load_sketch(tmp_path / "sketch.json"))
    topo = algo.load_topology()
    wide = lower(algo, topology=topo, max_tbs=132, fusion="schedule", connection_blocks=2)
    best = lower(algo, topology=topo, max_tbs=132)
    assert wide.max_threadblocks == 132 and best.max_threadblocks == 128 and check_program(best).ok
    time_of = lambda p: Simulator(p, topo).run(algo.input_size_bytes).time_us  # noqa: E731
    assert time_of(best) < 0.99 * time_of(wide)


def test_auto_also_tries_two_blocks_a_connection_on_its_second_fastest_policy():
    # 1x NDv2 AllToAll, Simple on six instances at 1 MiB: unfused is the fastest policy (41.9 us) and loses on
    # two blocks a connection at 4 MiB; the schedule's fusion (47.1 us) on two blocks takes 35.9 and is kept:
    # 14% faster at the input size than the unfused program, 0.6% slower at 4x it (and, having won on two
    # blocks, is tried on four: 35.3 us, the same at 4x)
    from pathlib import Path

    from taccl.lowering import max_tbs_of
    from taccl.simulator import Simulator
    from taccl.sketch import load_sketch
    from taccl.synthesize import SynthesisOptions, synthesize

    root = Path(__file__).resolve().parent.parent
    algo = synthesize(load_sketch(root / "sketches" / "ndv2-single.json"), collective="alltoall",
                      input_size="1M", options=SynthesisOptions(time_limit_s=20, proto="Simple", instances=6))
    topo = algo.load_topology()
    size, kw = algo.input_size_bytes, dict(topology=topo, max_tbs=max_tbs_of(topo.spec))
    times = lambda p: [Simulator(p, topo).run(n).time_us for n in (size, 4 * size)]  # noqa: E731
    unfused, unfused_two = (times(lower(algo, fusion="none", connection_blocks=k, **kw)) for k in (1, 2))
    fused, fused_two = (lower(algo, fusion="schedule", connection_blocks=k, **kw) for k in (1, 2))
    assert times(fused)[0] > unfused[0] and unfused_two[1] > 1.05 * unfused[1]
    best = lower(algo, **kw)
    assert times(best)[0] <= times(fused_two)[0]
    assert program_to_xml(best) == program_to_xml(lower(algo, fusion="schedule", connection_blocks=4, **kw))
    assert times(best)[0] < 0.9 * unfused[0] and times(best)[1] < 1.01 * unfused[1]


def test_auto_tries_four_blocks_a_connection_where_two_leave_the_schedule_far_behind(monkeypatch):
    # 2x DGX A100 ReduceScatter in two routes (dgx-a100-rs-split.json), LL on one instance at 1 MiB: an LL block
    # moves 9 GB/s of a GPU's 63 GB/s NVSwitch port, so one or two blocks a connection leave the schedule's
    # 20.9 us at 24.1; four take 20.9, and no more at 4x the size. The schedule's fusion spread over channels
    # with every partial sum landed aside takes 20.9 too, and "auto" finds it first
    from pathlib import Path

    import taccl.lowering
    from taccl.lowering import SCHEDULE_KEPT, max_tbs_of
    from taccl.simulator import Simulator
    from taccl.sketch import load_sketch
    from taccl.synthesize import SynthesisOptions, synthesize

    root = Path(__file__).resolve().parent.parent
    algo = synthesize(load_sketch(root / "sketches" / "dgx-a100-rs-split.json"),
                      options=SynthesisOptions(time_limit_s=20))
    topo = algo.load_topology()
    size, kw = algo.input_size_bytes, dict(topology=topo, max_tbs=max_tbs_of(topo.spec))
    times = lambda p: [Simulator(p, topo).run(n).time_us for n in (size, 4 * size)]  # noqa: E731
    two = min(times(lower(algo, fusion=f, connection_blocks=2, **kw)) for f in ("schedule", "none"))
    best = lower(algo, **kw)
    assert two[0] > SCHEDULE_KEPT * algo.time_us
    at, above = times(best)
    assert at < 1.02 * algo.time_us and at < 0.9 * two[0] and above <= two[1]
    monkeypatch.setattr(taccl.lowering, "OTHER_LANDING_POLICIES", 0)  # the landings of the first lowering only
    best = lower(algo, **kw)
    assert times(best)[0] < 1.02 * algo.time_us
    assert program_to_xml(best) == program_to_xml(lower(algo, fusion="schedule", connection_blocks=4, **kw))


def test_auto_tries_four_blocks_a_connection_where_two_were_the_fastest():
    # 2x NDv2 AllGather (the README's demo), Simple on one instance at 1 MiB: every policy on one block a
    # connection takes about the schedule's 165 us; unfused on two blocks 111.5, within the schedule, and on
    # four 104.1: a connection that gained from a second block gains from more
    from pathlib import Path

    from taccl.lowering import max_tbs_of
    from taccl.simulator import Simulator
    from taccl.sketch import load_sketch
    from taccl.synthesize import SynthesisOptions, synthesize

    root = Path(__file__).resolve().parent.parent
    algo = synthesize(load_sketch(root / "sketches" / "ndv2-sk-1.json"), options=SynthesisOptions(time_limit_s=20))
    topo = algo.load_topology()
    size, kw = algo.input_size_bytes, dict(topology=topo, max_tbs=max_tbs_of(topo.spec))
    time_of = lambda p: Simulator(p, topo).run(size).time_us  # noqa: E731
    two = min(time_of(lower(algo, fusion=f, connection_blocks=2, **kw)) for f in ("schedule", "none"))
    assert two < algo.time_us  # the fastest so far is within the schedule: only the two-block win asks for four
    best = lower(algo, **kw)
    assert time_of(best) < 0.97 * two
    assert program_to_xml(best) == program_to_xml(lower(algo, fusion="none", connection_blocks=4, **kw))


def test_a_memo_carries_each_policy_to_the_next_lowering_of_the_algorithm(monkeypatch):
    # what a batch does with one synthesis: "auto" (here on two blocks a connection), then "auto" with one
    # block and the schedule's policy alone. Through a LoweringMemo the later calls build no policy again;
    # each returns the program it returns without the memo, as its own object under its own name
    from pathlib import Path

    import taccl.lowering as lowering
    from taccl.lowering import LoweringMemo
    from taccl.sketch import load_sketch
    from taccl.synthesize import SynthesisOptions, synthesize

    root = Path(__file__).resolve().parent.parent
    algo = synthesize(load_sketch(root / "sketches" / "dgx-h100-rail.json"), collective="allreduce",
                      input_size="256MiB", options=SynthesisOptions(time_limit_s=20, proto="Simple", instances=4))
    topo = algo.load_topology()
    calls = [dict(), dict(connection_blocks=1), dict(fusion="schedule")]
    alone = [program_to_xml(lower(algo, topology=topo, max_tbs=132, name=f"p{i}", **kw)) for i, kw in enumerate(calls)]
    builds = []
    real = lowering._lower_one
    monkeypatch.setattr(lowering, "_lower_one", lambda *a, **k: builds.append(k) or real(*a, **k))
    memo = LoweringMemo()
    programs = []
    for i, kw in enumerate(calls):
        programs.append(lower(algo, topology=topo, max_tbs=132, name=f"p{i}", memo=memo, **kw))
        assert program_to_xml(programs[-1]) == alone[i] and programs[-1].name == f"p{i}"
        if i == 0:
            first = len(builds)
            assert first >= 5  # every policy, and the fastest again on two blocks a connection
    assert len(builds) == first and programs[0].nchannels == 2 * programs[1].nchannels
    assert len({id(p) for p in programs}) == 3
    with pytest.raises(ValueError, match="serves the algorithm it was first used for"):
        lower(Algorithm.from_json(algo.to_json()), topology=topo, memo=memo)


def _folds_before_forward(program) -> int:
    """Local reductions run right before a receive-reduce-send in the same thread block (no flag between)."""
    return sum(1 for g in program.gpus for tb in g.threadblocks for a, b in zip(tb.steps, tb.steps[1:])
               if a.type is StepType.REDUCE and b.type is StepType.RECV_REDUCE_SEND)


def test_a_fold_goes_after_steps_that_arrive_before_it_could_start_elsewhere(monkeypatch):
    # 2x DGX H100 hierarchical ReduceScatter, LL at 64 KiB: the block that sends a node's sum to the network
    # also receives another chunk's partial, placed between the fold and the send by position. Its
    # connection's order puts it after the send (the next test); by position alone, the receive lands before
    # the fold could start in a block of its own (its partial sums' arrival and a flag): knowing the flag
    # latency, the fold still goes into the forwarding block, and the send waits for no other block's flag
    from pathlib import Path

    import taccl.lowering.schedule as schedule
    from taccl.simulator import Simulator
    from taccl.sketch import load_sketch
    from taccl.synthesize import SynthesisOptions, synthesize

    root = Path(__file__).resolve().parent.parent
    algo = synthesize(load_sketch(root / "sketches" / "dgx-h100-hier.json"), collective="reducescatter",
                      input_size="64K", options=SynthesisOptions(time_limit_s=20, proto="LL", instances=4))
    topo = algo.load_topology()

    def lowered(flag_us):
        return _lower_policy(algo, max_tbs=132, flag_us=flag_us)[0]

    time_of = lambda p: Simulator(p, topo).run(algo.input_size_bytes).time_us  # noqa: E731
    by_connection = lowered(0.0)
    assert _folds_before_forward(by_connection) == 16 * 4
    monkeypatch.setattr(schedule, "_after_on_connection", lambda ins, consumer: False)
    unknown, known = lowered(0.0), lowered(topo.spec.sync_us)
    assert _folds_before_forward(known) == 16 * 4 > _folds_before_forward(unknown)
    assert time_of(known) == pytest.approx(time_of(by_connection))
    assert time_of(known) < time_of(unknown) - 1.0


def test_a_later_receive_on_the_forwarding_connection_does_not_keep_the_fold_away(monkeypatch):
    # 2x DGX A100 hierarchical ReduceScatter, LL at 1 MiB: the block that forwards a node's sum to the network
    # (a receive-reduce-send from a local peer) later receives that peer's other partial. Fusion gave the
    # forward its send's position, after that receive's, but the connection's order runs the forward first:
    # the receive is not between the fold and the forward, and the fold goes into the forwarding block
    # (the sum then leaves without waiting on a flag; 1.75 us earlier on the last instance)
    from pathlib import Path

    import taccl.lowering.schedule as schedule
    from taccl.sketch import load_sketch
    from taccl.synthesize import SynthesisOptions, synthesize

    root = Path(__file__).resolve().parent.parent
    algo = synthesize(load_sketch(root / "sketches" / "dgx-a100-hier.json"), collective="reducescatter",
                      input_size="1M", options=SynthesisOptions(time_limit_s=20, proto="LL", instances=4))
    flag_us = algo.load_topology().spec.sync_us

    def folds_before_forward():
        p = _lower_policy(algo, max_tbs=108, flag_us=flag_us)[0]
        assert check_program(p).ok
        return _folds_before_forward(p)

    assert folds_before_forward() == 16 * 4  # every rank, every instance
    monkeypatch.setattr(schedule, "_after_on_connection", lambda ins, consumer: False)
    assert folds_before_forward() == 16 * 4 / 2  # by position alone: the ranks whose receive comes later


def test_a_swapped_sum_is_folded_in_the_block_that_received_it(monkeypatch):
    # 2x DGX H100 hierarchical AllReduce, LL at 64 KiB: the two ranks of a rail swap their nodes' sums over
    # the network, and each sum goes on to seven local peers. Folded in the block that received the other
    # node's sum, the fold waits on no flag; in a block of its own it would wait on one, and the sends again
    from pathlib import Path

    import taccl.lowering.schedule as schedule
    from taccl.simulator import Simulator
    from taccl.sketch import load_sketch
    from taccl.synthesize import SynthesisOptions, synthesize

    root = Path(__file__).resolve().parent.parent
    algo = synthesize(load_sketch(root / "sketches" / "dgx-h100-hier.json"), collective="allreduce",
                      input_size="64K", options=SynthesisOptions(time_limit_s=20, proto="LL", instances=4))
    topo = algo.load_topology()
    gpn = topo.spec.gpus_per_node
    folded_on_arrival = _lower_policy(algo, max_tbs=132, flag_us=topo.spec.sync_us)[0]
    assert check_program(folded_on_arrival).ok
    assert any(a.type is StepType.RECV and b.type is StepType.REDUCE and tb.recv // gpn != g.id // gpn
               for g in folded_on_arrival.gpus for tb in g.threadblocks for a, b in zip(tb.steps, tb.steps[1:]))
    monkeypatch.setattr(schedule, "_receiving_block", lambda *a: None)
    elsewhere = _lower_policy(algo, max_tbs=132, flag_us=topo.spec.sync_us)[0]
    time_of = lambda p: Simulator(p, topo).run(algo.input_size_bytes).time_us  # noqa: E731
    assert time_of(folded_on_arrival) < time_of(elsewhere) - 1.0


def test_merged_thread_blocks_pair_connections_the_schedule_keeps_apart():
    # a rank over its block budget merges send-only with receive-only blocks; a merged block runs its steps
    # in turn, so a send waits for every receive ordered before it. Rank 0 exchanges with 1 early (a send
    # and a receive every 4 us) and with 2 late: sending to 1 while receiving from 2 (and the reverse)
    # costs nothing, pairing each peer's two directions costs a latency per step.
    from taccl.lowering.ops import Instr
    from taccl.lowering.schedule import TB, _merge, _send_delay

    def block(peer, direction, spans):
        tb = TB(0, 0, send=peer if direction == "S" else -1, recv=peer if direction == "R" else -1)
        for k, span in enumerate(spans):
            tb.instrs.append(Instr(k, 0, StepType.SEND if direction == "S" else StepType.RECV,
                                   send_peer=tb.send, recv_peer=tb.recv, key=(span[0], k), span=span))
        tb.nsteps = len(spans)
        return tb

    early = [(4.0 * k, 4.0 * k + 4.0) for k in range(8)]
    late = [(100.0, 104.0), (104.0, 108.0)]
    s1, r1, s2, r2 = block(1, "S", early), block(1, "R", early), block(2, "S", late), block(2, "R", late)
    assert _send_delay(early, early) == pytest.approx(8 * 4.0)
    assert _send_delay(early, late) == 0.0 and _send_delay(late, early) == 0.0
    merged = _merge([s1, r1, s2, r2], max_tbs=2, step_cap=64)
    assert sorted((tb.send, tb.recv) for tb in merged) == [(1, 2), (2, 1)]


def test_packing_a_connection_into_a_block_keeps_the_blocks_other_peer():
    # with `pack`, a new send connection goes into a block that only receives; a fused instruction's hint to
    # pair that send with another receive peer must not replace the block's receive peer (its receives
    # were left in a block receiving from someone else: a 16x DGX H100 ReduceScatter came out so)
    from taccl.lowering.ops import Instr
    from taccl.lowering.schedule import _State

    st = _State(step_cap=64, pack=True)
    st.hints[(0, "S", 2, None)] = 9  # some fused instruction receives from 9 and sends to 2
    recv = Instr(0, 0, StepType.RECV, recv_peer=5, key=(0,))
    send = Instr(1, 0, StepType.SEND, send_peer=2, key=(1,))
    for ins in (recv, send):
        st.log = []
        assert st.place(ins, 0)
    assert recv.tb is send.tb and (send.tb.send, send.tb.recv) == (2, 5)
    assert st.owner[(0, 0, "R", 5)] is recv.tb and (0, 0, "R", 9) not in st.owner


def test_the_block_limit_is_the_topologys_sm_count():
    # solve, lower and baseline lower for the GPUs of the algorithm's topology (an H100 has 132 SMs, a V100
    # 80); without a topology, an A100's 108
    from taccl.lowering import DEFAULT_MAX_TBS, max_tbs_of
    from taccl.topology import load_topology

    assert max_tbs_of(load_topology("dgx-h100", 2).spec) == 132
    assert max_tbs_of(load_topology("ndv2", 1).spec) == 80
    assert max_tbs_of(None) == DEFAULT_MAX_TBS == 108


def test_a_rank_with_more_peers_than_blocks_is_refused_before_any_build(monkeypatch):
    # the inner ranks of a 4-rank line send to both neighbours: a block per peer cannot fit one block, and
    # the lowering says so without building a program (on 1024 ranks a build took minutes)
    import taccl.lowering as lowering

    monkeypatch.setattr(lowering, "_build", lambda *a, **k: pytest.fail("built a program"))
    with pytest.raises(UserError, match=r"rank 1 has 2 peers on one side .*: 2 thread blocks > 1 \(--max-tbs"):
        lower(alltoall_line(4), instances=1, max_tbs=1)


def test_a_lowering_at_the_reference_step_limit_tries_few_caps_and_then_less_fusion(monkeypatch):
    # Baselines are lowered at a reference limit of 1024 steps a block. Caps went down by eight from there:
    # on 16 DGX H100 nodes the hierarchical AllReduce on four instances built and proved a deadlocking
    # fusion at 1024, 1016, ... (minutes), and where every channel filled up it failed instead of trying the
    # next fusion mode. Now caps halve down to the executor's 64, a deadlock halves the cap, and full
    # channels move on to less fusion: here 1024 ... 32 deadlock, 16 fills the channels, "safe" at 1024 fits.
    import taccl.lowering as lowering
    from taccl.baselines import REFERENCE_MAX_NODES, REFERENCE_MAX_STEPS, build
    from taccl.topology import load_topology

    assert lowering._step_caps(1024) == [1024, 512, 256, 128, 64, 56, 48, 40, 32, 24, 16, 8]
    assert lowering._step_caps(64) == [64, 56, 48, 40, 32, 24, 16, 8]
    tried = []
    real = lowering._build

    def counting(ops, coll, name, opts, mode, cap, *rest):
        tried.append((mode, cap))
        return real(ops, coll, name, opts, mode, cap, *rest)

    monkeypatch.setattr(lowering, "_build", counting)
    program = build("hierarchical", load_topology("dgx-h100", 8), "allreduce", instances=4, max_tbs=132,
                    reference=True)
    assert tried == [("natural", c) for c in (1024, 512, 256, 128, 64, 32, 16)] + [("safe", 1024)]
    assert check_program(program, max_steps=REFERENCE_MAX_STEPS, max_nodes=REFERENCE_MAX_NODES).proven


def _counting_proofs(monkeypatch, fail_first: int = 0) -> list:
    """Count the lowering's proofs (`verify_program` calls); the first `fail_first` report a failure."""
    import taccl.lowering as lowering
    from taccl.checker import ERROR, CheckReport, Finding

    calls = []
    real = lowering.verify_program

    def counted(program, **kw):
        calls.append(program.proto)
        if len(calls) <= fail_first:
            return CheckReport(collective="allgather", findings=[Finding(ERROR, "deadlock", "(test)")])
        return real(program, **kw)

    monkeypatch.setattr(lowering, "verify_program", counted)
    return calls


def test_protocols_share_one_lowering_and_proof_when_the_protocol_changes_nothing(monkeypatch):
    import taccl.lowering as lowering

    coll = make_collective("allgather", 8)
    ops = lowering.algorithm_ops(ring_algorithm("allgather", 8), coll)
    alone = {p: program_to_xml(lowering.lower_ops(ops, coll, name="ring", proto=p)) for p in ("Simple", "LL", "LL128")}
    proofs = _counting_proofs(monkeypatch)
    both = lowering.lower_ops_protocols(ops, coll, ["LL", "LL128", "Simple"], name="ring",
                                        options=lowering.LoweringOptions())
    assert proofs == ["Simple"]  # the shallowest FIFOs proven; deeper ones cannot deadlock where it did not
    assert {p: program_to_xml(prog) for p, prog in both.items()} == alone
    assert len({id(prog) for prog in both.values()}) == 3  # each its own Program, free to rename


def test_a_failed_proof_lowers_every_protocol_on_its_own(monkeypatch):
    import taccl.lowering as lowering

    coll = make_collective("allgather", 8)
    ops = lowering.algorithm_ops(ring_algorithm("allgather", 8), coll)
    proofs = _counting_proofs(monkeypatch, fail_first=1)
    out = lowering.lower_ops_protocols(ops, coll, ["Simple", "LL"], name="ring", options=lowering.LoweringOptions())
    # Simple's first attempt "deadlocked": deeper FIFOs might prove it, so LL tries its own attempts
    assert proofs == ["Simple", "Simple", "LL"]
    assert out["Simple"].proto.value == "Simple" and out["LL"].proto.value == "LL"
    with pytest.raises(UserError, match="unknown protocol 'LL64'"):
        lowering.lower_ops_protocols(ops, coll, ["Simple", "LL64"], name="ring", options=lowering.LoweringOptions())


def test_thread_blocks_are_numbered_in_the_schedules_send_order():
    # 2x DGX H100 AllGather routed for 64 KiB sends some chunks through a relay in the other node first; the
    # sender's NIC serves sends that are ready at once in block order. Numbered by channel and peer, the
    # program took the NIC in peer order: 10.01 us against its 8.53 us schedule.
    from pathlib import Path

    from taccl.simulator import Simulator
    from taccl.sketch import load_sketch
    from taccl.synthesize import SynthesisOptions, synthesize

    sketch = load_sketch(Path(__file__).resolve().parent.parent / "sketches" / "dgx-h100-direct.json")
    algo = synthesize(sketch, nodes=2, collective="allgather", input_size=65536,
                      options=SynthesisOptions(time_limit_s=30, threads=1, proto="LL", instances=1))
    topo = algo.load_topology()
    prog = lower(algo, max_tbs=132, topology=topo)
    assert Simulator(prog, topo).run(65536).time_us <= 1.01 * algo.time_us
    # every rank's blocks: those that send come first, in the order of their first scheduled send
    first_send = {}
    for t in algo.transfers:
        first_send[(t.src, t.dst)] = min(first_send.get((t.src, t.dst), t.send_us), t.send_us)
    for g in prog.gpus:
        order = [first_send[(g.id, tb.send)] for tb in g.threadblocks if tb.send >= 0]
        assert order == sorted(order) and all(tb.send >= 0 for tb in g.threadblocks[:len(order)])


def test_a_program_landing_the_other_way_takes_no_other_policys_place_in_the_spread_passes(monkeypatch):
    # 2x NDv2 AllReduce (ndv2-sk-1), Simple on one instance at 1 MiB: the fastest policy's other landing came
    # second, so the second policy landing the first way was no longer tried on two blocks a connection:
    # 185.2 us, where without the other landings "auto" found 181.8
    from pathlib import Path

    import taccl.lowering
    from taccl.lowering import max_tbs_of
    from taccl.simulator import TIE_TOLERANCE, Simulator
    from taccl.sketch import load_sketch
    from taccl.synthesize import SynthesisOptions, synthesize

    root = Path(__file__).resolve().parent.parent
    algo = synthesize(load_sketch(root / "sketches" / "ndv2-sk-1.json"), collective="allreduce",
                      options=SynthesisOptions(time_limit_s=20))
    topo = algo.load_topology()
    kw = dict(topology=topo, max_tbs=max_tbs_of(topo.spec))
    time_of = lambda p: Simulator(p, topo).run(algo.input_size_bytes).time_us  # noqa: E731
    best = time_of(lower(algo, **kw))
    monkeypatch.setattr(taccl.lowering, "OTHER_LANDING_POLICIES", 0)
    assert best <= (1 + TIE_TOLERANCE) * time_of(lower(algo, **kw))
