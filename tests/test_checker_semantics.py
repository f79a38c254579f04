"""Checker: deadlocks, races, postconditions of every collective, the shared real XML files, the CLI."""
import json
from pathlib import Path

import pytest

from taccl.checker import check_program, expected_postcondition
from taccl.cli import main
from taccl.program import Buf, Gpu, Program, Proto, Step, StepType, Threadblock
from taccl.xmlio import read_xml, write_program

DATA = Path("/work/shared/data/msccl-xml")
if not DATA.exists():
    DATA = Path(__file__).resolve().parents[2] / "shared" / "data" / "msccl-xml"
SHARED = sorted(DATA.glob("*.xml"))
EXPECTED = {"a2a2ll.xml": "alltoall", "ag_hier_4_LL.xml": "allgather", "ar_ll128.xml": "allreduce",
            "r48ll.xml": "allreduce"}

S, R, RCS, RRC, RRS, RRCS, CPY, RE = (StepType.SEND, StepType.RECV, StepType.RECV_COPY_SEND,
                                      StepType.RECV_REDUCE_COPY, StepType.RECV_REDUCE_SEND,
                                      StepType.RECV_REDUCE_COPY_SEND, StepType.COPY, StepType.REDUCE)
I, O, SC = Buf.INPUT, Buf.OUTPUT, Buf.SCRATCH


def st(s, t, sb=I, so=-1, db=O, do=-1, cnt=1, depid=-1, deps=-1, hasdep=False):
    return Step(s=s, type=t, srcbuf=sb, srcoff=so, dstbuf=db, dstoff=do, cnt=cnt, depid=depid, deps=deps,
                hasdep=hasdep)


def prog(coll, n, ncpl, gpus, proto=Proto.SIMPLE, inplace=False, root=None):
    return Program(name="t", collective=coll, proto=proto, nchannels=1, nchunksperloop=ncpl, ngpus=n,
                   inplace=inplace, outofplace=not inplace, gpus=gpus, root=root)


def renumber(steps):
    for i, s in enumerate(steps):
        s.s = i
    return steps


def direct_alltoall(n=3, cf=1, inplace=False):
    """Per peer one tb (send and receive), plus a local tb copying the own block."""
    gpus = []
    for r in range(n):
        tbs = []
        for q in range(n):
            if q == r:
                continue
            tbs.append(Threadblock(id=len(tbs), send=q, recv=q, chan=0, steps=[
                st(0, S, I, q * cf, O, r * cf, cnt=cf), st(1, R, I, -1, O, q * cf, cnt=cf)]))
        tbs.append(Threadblock(id=len(tbs), steps=[st(0, CPY, I, r * cf, O, r * cf, cnt=cf)]))
        gpus.append(Gpu(id=r, i_chunks=n * cf, o_chunks=n * cf, threadblocks=tbs))
    return prog("alltoall", n, n * cf, gpus, inplace=inplace)


def reduce_chain(coll, n, root=0):
    """allreduce / reducescatter / reduce with direct sends and an rrc chain ordered by dependencies.

    Every rank r owns output chunks; for allreduce every rank receives every other rank's full input and
    reduces it in; for reducescatter rank r receives chunk r from everyone; for reduce only the root receives.
    """
    cf = 1
    ncpl = n
    gpus = []
    for r in range(n):
        tbs = []
        # receiver tbs chained by dependencies: first copy own contribution, then one rrc per peer
        if coll == "allreduce":
            mine = list(range(ncpl))
        elif coll == "reducescatter":
            mine = [r * cf]
        else:
            mine = list(range(ncpl)) if r == root else []
        out_off = (lambda c: c) if coll != "reducescatter" else (lambda c: c - r * cf)
        if mine:
            tbs.append(Threadblock(id=0, steps=[st(0, CPY, I, mine[0], O, out_off(mine[0]), cnt=len(mine),
                                                   hasdep=True)]))
        last = (0, 0)  # (tb, step) of the latest write of the owned chunks
        for q in range(n):
            if q == r:
                continue
            steps = []
            senders = {"allreduce": list(range(ncpl)), "reducescatter": [q * cf],
                       "reduce": list(range(ncpl)) if q == root else []}[coll]
            if senders:  # send first, so that no rank waits on a peer that waits on it
                steps.append(st(0, S, I, senders[0], O, 0, cnt=len(senders)))
            if mine:
                steps.append(st(0, RRC, O, out_off(mine[0]), O, out_off(mine[0]), cnt=len(mine), depid=last[0],
                                deps=last[1], hasdep=True))
                last = (len(tbs), len(steps) - 1)
            tbs.append(Threadblock(id=len(tbs), send=q if senders else -1, recv=q if mine else -1,
                                   steps=renumber(steps)))
        o = ncpl if coll != "reducescatter" else cf
        gpus.append(Gpu(id=r, i_chunks=ncpl, o_chunks=o, threadblocks=tbs))
    p = prog(coll, n, ncpl, gpus, root=root if coll == "reduce" else None)
    # each send of the whole buffer goes in one call only while a chunk is at most 1/ncpl of a tile; past that
    # the runtime moves one chunk a call and the two-call FIFOs fill before any rank receives (a deadlock)
    p.max_bytes = Proto.SIMPLE.tile_bytes
    return p


def star(coll, n, root):
    """broadcast / scatter from the root, gather to the root, with direct sends."""
    gpus = []
    for r in range(n):
        tbs = []
        if coll == "gather":
            if r == root:
                tbs.append(Threadblock(id=0, steps=[st(0, CPY, I, 0, O, r)]))
                for q in range(n):
                    if q != root:
                        tbs.append(Threadblock(id=len(tbs), recv=q, steps=[st(0, R, I, -1, O, q)]))
            else:
                tbs.append(Threadblock(id=0, send=root, steps=[st(0, S, I, 0, O, 0)]))
            gpus.append(Gpu(id=r, i_chunks=1, o_chunks=n if r == root else 0, threadblocks=tbs))
            continue
        if r == root:
            off = (lambda q: q) if coll == "scatter" else (lambda q: 0)
            cnt = 1 if coll == "scatter" else n
            tbs.append(Threadblock(id=0, steps=[st(0, CPY, I, off(r), O, 0, cnt=cnt)]))
            for q in range(n):
                if q != root:
                    tbs.append(Threadblock(id=len(tbs), send=q, steps=[st(0, S, I, off(q), O, 0, cnt=cnt)]))
            gpus.append(Gpu(id=r, i_chunks=n, o_chunks=cnt, threadblocks=tbs))
        else:
            cnt = 1 if coll == "scatter" else n
            tbs.append(Threadblock(id=0, recv=root, steps=[st(0, R, I, -1, O, 0, cnt=cnt)]))
            gpus.append(Gpu(id=r, i_chunks=n if coll == "broadcast" else 0, o_chunks=cnt, threadblocks=tbs))
    return prog(coll, n, n, gpus, root=root)


def errors(rep):
    return [str(f) for f in rep.errors]


# --------------------------------------------------------------------------------------------------------
# postconditions


def test_expected_postcondition_tables():
    ag = expected_postcondition("allgather", 3, 6)
    assert ag[(2, 3)] == ((1, 1),) and len(ag) == 18
    a2a = expected_postcondition("alltoall", 3, 6)
    assert a2a[(1, 4)] == ((2, 2),)  # rank 1 out[2*2+0] = Chunk(2, 1*2+0)
    rs = expected_postcondition("reducescatter", 2, 4)
    assert rs[(1, 0)] == ((0, 2), (1, 2)) and len(rs) == 4
    ar = expected_postcondition("allreduce", 2, 2)
    assert ar[(0, 1)] == ((0, 1), (1, 1))
    assert expected_postcondition("broadcast", 3, 2, root=2)[(0, 1)] == ((2, 1),)
    assert set(expected_postcondition("reduce", 3, 2, root=1)) == {(1, 0), (1, 1)}
    assert expected_postcondition("scatter", 2, 4, root=1)[(0, 1)] == ((1, 1),)
    assert expected_postcondition("gather", 2, 2, root=0)[(0, 1)] == ((1, 0),)
    with pytest.raises(ValueError):
        expected_postcondition("custom", 2, 2)


@pytest.mark.parametrize("cf", [1, 2])
def test_alltoall_proven(cf):
    rep = check_program(direct_alltoall(3, cf))
    assert rep.ok and rep.proven, errors(rep)


@pytest.mark.parametrize("coll", ["allreduce", "reducescatter", "reduce"])
def test_reductions_proven(coll):
    rep = check_program(reduce_chain(coll, 4, root=2))
    assert rep.ok and rep.proven, errors(rep)


@pytest.mark.parametrize("coll", ["broadcast", "scatter", "gather"])
def test_rooted_collectives_proven(coll):
    rep = check_program(star(coll, 4, root=1))
    assert rep.ok and rep.proven, errors(rep)
    wrong_root = star(coll, 4, root=1)
    wrong_root.root = None
    rep = check_program(wrong_root, root=0)
    assert not rep.ok


def test_wrong_chunk_is_found():
    p = direct_alltoall(3)
    p.gpus[1].threadblocks[0].steps[0].srcoff = 2  # rank 1 sends its block for rank 2 to rank 0
    rep = check_program(p)
    f = [f for f in rep.errors if f.rule == "post.mismatch"][0]
    assert f.rank == 0 and "o[1] holds Chunk(1, 2), expected Chunk(1, 0)" in f.message
    assert not rep.proven


def test_steps_split_into_calls_at_large_sizes_deadlock_where_the_fifo_is_too_short():
    """A step of cnt chunks is one primitive call while cnt chunks fit in a tile, and cnt calls (one a chunk)
    once a chunk is over half a tile (maxAllowedCount, msccl-xml.md 1.8): a window that reaches those sizes
    must be deadlock-free with every chunk a FIFO slot (the runtime hung where one call a step was checked)."""
    bounded = reduce_chain("allreduce", 4)
    assert check_program(bounded).proven
    unbounded = reduce_chain("allreduce", 4)
    unbounded.max_bytes = 0
    rep = check_program(unbounded)
    (msg,) = {f.message.split(": cycle")[0] for f in rep.errors if f.rule == "deadlock"}
    # 4 chunks a step: two a call (two FIFO slots a step) while a chunk is at most half a tile, and one a call
    # (four slots, deadlock) from 4 x 1 MiB + 1 bytes
    assert msg == ("deadlock with Simple FIFOs (2 calls in flight per connection) at calls of 4194305 bytes and "
                   "more, which the window takes: there a chunk is over 1/2 of a tile and the runtime moves a "
                   "step's cnt chunks 1 a call (maxAllowedCount), in ceil(cnt / 1) FIFO slots"), msg
    unbounded.max_bytes = 4 << 20
    assert check_program(unbounded).proven


def test_double_counting_is_found():
    p = reduce_chain("allreduce", 3)
    # rank 0 adds its finished sums to themselves once more (every contribution counted twice)
    tbs = p.gpus[0].threadblocks
    tbs[2].steps.append(st(len(tbs[2].steps), RE, O, 0, O, 0, cnt=3, depid=2, deps=0))
    rep = check_program(p)
    msgs = [f.message for f in rep.errors if f.rule == "post.mismatch"]
    assert msgs and "a reduction of 6 contributions" in msgs[0]


def test_uninitialised_output_is_found():
    p = direct_alltoall(3)
    p.gpus[2].threadblocks.pop()  # no local copy of the own block
    rep = check_program(p)
    assert any("uninitialised" in f.message and f.rank == 2 for f in rep.errors)


def test_inplace_aliasing_allgather():
    n = 3
    gpus = []
    for r in range(n):
        # in place: input chunk 0 is output chunk r, so no copy is needed
        steps = [st(0, S, I, 0, O, r), st(1, RCS, I, -1, O, (r - 1) % n), st(2, R, I, -1, O, (r - 2) % n)]
        gpus.append(Gpu(id=r, i_chunks=1, o_chunks=n, threadblocks=[Threadblock(id=0, send=(r + 1) % n,
                                                                                 recv=(r - 1) % n, steps=steps)]))
    p = prog("allgather", n, n, gpus, inplace=True)
    rep = check_program(p)
    assert rep.ok and rep.proven and rep.modes == ["inplace"], errors(rep)
    p.outofplace = True  # the same program is wrong out of place: o[r] is never written
    rep = check_program(p)
    assert rep.modes == ["inplace", "outofplace"] and not rep.ok
    assert all("out-of-place" in f.message for f in rep.errors)


def test_self_copy_in_place_is_not_a_write():
    # the out-of-place AllGather copies its own chunk i[0] -> o[r] in one tb while another tb sends it; in place
    # that copy lands on itself (memory unchanged), which must not count as a race with the send
    n = 3

    def gpu(r, copy_dst):
        ring = Threadblock(id=0, send=(r + 1) % n, recv=(r - 1) % n, steps=[
            st(0, S, I, 0, O, r), st(1, RCS, I, -1, O, (r - 1) % n), st(2, R, I, -1, O, (r - 2) % n)])
        local = Threadblock(id=1, steps=[st(0, CPY, I, 0, O, copy_dst)])
        return Gpu(id=r, i_chunks=1, o_chunks=n, threadblocks=[ring, local])

    p = prog("allgather", n, n, [gpu(r, r) for r in range(n)])
    p.inplace = True
    rep = check_program(p)
    assert rep.ok and rep.modes == ["inplace", "outofplace"], errors(rep)
    # a copy to another slot is a real write: it races with the ring's receive there
    bad = prog("allgather", n, n, [gpu(r, (r + 1) % n) for r in range(n)])
    assert "race" in check_program(bad).rules("error")


def test_custom_collective_gets_no_postcondition():
    p = direct_alltoall(3)
    p.collective = "custom"
    rep = check_program(p, dialect="legacy")
    assert rep.ok and not rep.proven and "post.unknown" in rep.rules("info")


# --------------------------------------------------------------------------------------------------------
# deadlocks


def two_ranks(steps0, steps1, proto=Proto.SIMPLE, ncpl=4):
    gpus = [Gpu(id=r, i_chunks=ncpl, o_chunks=ncpl, threadblocks=[Threadblock(id=0, send=1 - r, recv=1 - r,
                                                                              steps=renumber(s))])
            for r, s in ((0, steps0), (1, steps1))]
    return Program(name="d", collective="custom", proto=proto, nchannels=1, nchunksperloop=ncpl, ngpus=2,
                   gpus=gpus)


def test_both_ranks_receiving_first_deadlock():
    p = two_ranks([st(0, R, I, -1, O, 0), st(0, S, I, 0, O, 0)], [st(0, R, I, -1, O, 0), st(0, S, I, 0, O, 0)])
    rep = check_program(p, dialect="legacy")
    dl = [f for f in rep.errors if f.rule == "deadlock"]
    assert dl and (dl[0].rank, dl[0].tb, dl[0].step) == (0, 0, 0)
    assert "rank 0 tb 0 step 0 (r) waits for data from rank 1" in dl[0].message
    assert "rank 1 tb 0 step 0 (r) waits for data from rank 0" in dl[0].message


@pytest.mark.parametrize("proto,deadlocks", [(Proto.SIMPLE, True), (Proto.LL, False), (Proto.LL128, False)])
def test_fifo_depth_per_protocol(proto, deadlocks):
    sends = [st(0, S, I, k, O, k) for k in range(3)]
    recvs = [st(0, R, I, -1, O, k) for k in range(3)]
    p = two_ranks(sends + recvs, [st(0, S, I, k, O, k) for k in range(3)] + [st(0, R, I, -1, O, k) for k in range(3)],
                  proto=proto)
    rep = check_program(p, dialect="legacy")
    assert ("deadlock" in rep.rules("error")) == deadlocks
    if deadlocks:
        assert "2 calls in flight, FIFO full" in rep.errors[0].message
    else:
        assert "deadlock-rendezvous" in rep.rules("warning")


def test_dependency_cycle_deadlock():
    p = direct_alltoall(3)
    tbs = p.gpus[0].threadblocks
    tbs[0].steps[0].depid, tbs[0].steps[0].deps = 1, 1
    tbs[1].steps[0].depid, tbs[1].steps[0].deps = 0, 1
    tbs[0].steps[1].hasdep = tbs[1].steps[1].hasdep = True
    rep = check_program(p)
    dl = [f for f in rep.errors if f.rule == "deadlock"]
    assert dl and "(dependency)" in dl[0].message and dl[0].rank == 0


def test_tiles_are_replayed():
    p = direct_alltoall(3)
    assert check_program(p, tiles=3).ok


# --------------------------------------------------------------------------------------------------------
# races


def race_program(with_dep):
    """Rank 0 receives chunk 1 on tb 0 and copies it on tb 1 (a local tb)."""
    p = direct_alltoall(2)
    g = p.gpus[0]
    g.s_chunks = 1
    g.threadblocks[0].steps[1].hasdep = True
    dep = dict(depid=0, deps=1) if with_dep else {}
    g.threadblocks.append(Threadblock(id=2, steps=[st(0, CPY, O, 1, SC, 0, **dep)]))
    return p


def test_race_found_with_rank_tb_step():
    rep = check_program(race_program(False))
    races = [f for f in rep.errors if f.rule == "race"]
    assert races and (races[0].rank, races[0].tb, races[0].step) == (0, 0, 1)
    assert "rank 0 tb 2 step 0 (cpy)" in races[0].message and "rank 0 tb 0 step 1 (r)" in races[0].message
    assert "o[1]" in races[0].message and "no happens-before path" in races[0].message


def test_dependency_removes_race():
    rep = check_program(race_program(True))
    assert rep.ok and rep.proven, errors(rep)


def test_order_through_another_rank_is_not_a_race():
    """tb 0 of rank 0 sends i[1]; rank 1 sends it back; tb 1 of rank 0 overwrites i[1]: ordered by messages."""
    g0 = Gpu(id=0, i_chunks=2, o_chunks=2, threadblocks=[
        Threadblock(id=0, send=1, steps=[st(0, S, I, 1, O, 0)]),
        Threadblock(id=1, recv=1, steps=[st(0, R, I, -1, I, 1)])])
    g1 = Gpu(id=1, i_chunks=2, o_chunks=2, s_chunks=1, threadblocks=[
        Threadblock(id=0, send=0, recv=0, steps=[st(0, R, I, -1, SC, 0), st(1, S, SC, 0, O, 0)])])
    p = Program(name="x", collective="custom", proto=Proto.SIMPLE, nchannels=1, nchunksperloop=2, ngpus=2,
                gpus=[g0, g1])
    rep = check_program(p, dialect="legacy")
    assert rep.ok, errors(rep)
    # without the round trip the write is unordered
    g1.threadblocks[0].steps[1].srcbuf = I
    g1.threadblocks[0].steps[0:1] = []
    g1.threadblocks[0].recv = -1
    g0.threadblocks[0].send = -1
    g0.threadblocks[0].steps[0].type = CPY
    g0.threadblocks[0].steps[0].dstbuf, g0.threadblocks[0].steps[0].dstoff = O, 0
    renumber(g1.threadblocks[0].steps)
    rep = check_program(p, dialect="legacy")
    assert "race" in rep.rules("error"), [str(f) for f in rep.findings]


# --------------------------------------------------------------------------------------------------------
# shared real files and the CLI


@pytest.mark.parametrize("path", SHARED, ids=[p.name for p in SHARED])
def test_shared_files_pass_and_are_recognised(path):
    res = read_xml(path)
    rep = check_program(res.program, dialect=res.dialect, tiles=2)
    assert rep.ok and rep.proven, errors(rep)
    assert rep.collective == EXPECTED[path.name]
    assert not rep.warnings


def test_cli_exit_codes(tmp_path, capsys):
    assert main(["check", *map(str, SHARED)]) == 0
    out = capsys.readouterr().out
    assert out.count("proven") == len(SHARED)
    bad = race_program(False)
    write_program(bad, tmp_path / "race.xml")
    assert main(["check", str(tmp_path / "race.xml")]) == 1
    assert "[race] rank 0" in capsys.readouterr().out
    (tmp_path / "broken.xml").write_text("<algo\tname='x'>")
    assert main(["check", str(tmp_path / "broken.xml")]) == 2
    assert "line 1" in capsys.readouterr().err
    assert main(["check", "--json", str(tmp_path / "race.xml"), str(tmp_path / "broken.xml")]) == 2
    docs = json.loads(capsys.readouterr().out)
    assert docs[0]["ok"] is False and docs[0]["findings"] and "unreadable" in docs[1]
