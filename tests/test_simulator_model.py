"""Simulator: hand-computed times, contention, FIFO, tiling, shared XMLs, errors, CLI."""
from __future__ import annotations

import glob
import json
import os

import pytest

from taccl.baselines import build
from taccl.cli import main
from taccl.errors import UserError
from taccl.program import Buf, Gpu, Program, Proto, Step, StepType, Threadblock
from taccl.simulator import SimOptions, Simulator, busbw_factor, simulate, sweep
from taccl.topology import Topology, load_topology, spec_from_dict
from taccl.xmlio import read_program

SHARED = os.path.join(os.path.dirname(__file__), "..", "..", "shared", "data", "msccl-xml")
NOTILE = SimOptions(tiling=False, local_bw_GBps=1e12)


def topo(links, n=2, alpha=1.0, bw=1.0, switch=False, oneway=False):
    doc = {"name": "t", "gpus_per_node": n, "link_types": {"l": {"alpha_us": alpha, "bw_GBps": bw}}}
    if switch:
        doc["switches"] = [{"name": "sw", "gpus": list(range(n)), "type": "l"}]
    else:
        doc["links"] = [{"src": a, "dst": b, "type": "l", "bidirectional": not oneway} for a, b in links]
    return Topology(spec_from_dict(doc), 1)


def step(s, t, src=(Buf.INPUT, -1), dst=(Buf.OUTPUT, -1), cnt=1, dep=(-1, -1), hasdep=False):
    return Step(s=s, type=t, srcbuf=src[0], srcoff=src[1], dstbuf=dst[0], dstoff=dst[1], cnt=cnt, depid=dep[0],
                deps=dep[1], hasdep=hasdep)


def program(gpus, nchunks=1, coll="custom", proto=Proto.SIMPLE):
    return Program(name="t", collective=coll, proto=proto, nchannels=1, nchunksperloop=nchunks,
                   ngpus=len(gpus), gpus=gpus)


def one_send(cnt=1, nchunks=1):
    return program([
        Gpu(0, nchunks, nchunks, 0, [Threadblock(0, send=1, steps=[step(0, StepType.SEND, src=(Buf.INPUT, 0), cnt=cnt)])]),
        Gpu(1, nchunks, nchunks, 0, [Threadblock(0, recv=0, steps=[step(0, StepType.RECV, dst=(Buf.OUTPUT, 0), cnt=cnt)])]),
    ], nchunks)


def test_single_send_is_alpha_plus_beta():
    t = topo([(0, 1)], alpha=2.0, bw=1.0)  # 1 GB/s = 1000 bytes/us
    r = simulate(one_send(), t, 4000, options=NOTILE)
    assert r.time_us == pytest.approx(2.0 + 4.0)
    assert r.algbw_GBps == pytest.approx(4000 / 6.0 / 1000)
    r = simulate(one_send(cnt=2, nchunks=2), t, 4000, options=NOTILE)  # two chunks of 2000 bytes in one send
    assert r.time_us == pytest.approx(2.0 + 4.0)


def test_protocol_bandwidth_factor():
    t = topo([(0, 1)], alpha=0.0, bw=1.0)
    p = one_send()
    p.proto = Proto.LL
    assert simulate(p, t, 1000, options=NOTILE).time_us == pytest.approx(2.0)


def test_switch_port_contention_and_parallel_links():
    # rank 0 sends to 1 and 2 from two thread blocks; through one switch out-port their data serialises
    # (their latencies overlap: each send's alpha of 1 us runs before its data, 1 us each)
    def prog():
        return program([
            Gpu(0, 1, 1, 0, [Threadblock(0, send=1, steps=[step(0, StepType.SEND, src=(Buf.INPUT, 0))]),
                             Threadblock(1, send=2, steps=[step(0, StepType.SEND, src=(Buf.INPUT, 0))])]),
            Gpu(1, 1, 1, 0, [Threadblock(0, recv=0, steps=[step(0, StepType.RECV, dst=(Buf.OUTPUT, 0))])]),
            Gpu(2, 1, 1, 0, [Threadblock(0, recv=0, steps=[step(0, StepType.RECV, dst=(Buf.OUTPUT, 0))])]),
        ])
    sw = topo(None, n=3, alpha=1.0, bw=1.0, switch=True)
    assert simulate(prog(), sw, 1000, options=NOTILE).time_us == pytest.approx(3.0)
    direct = topo([(0, 1), (0, 2)], n=3, alpha=1.0, bw=1.0)
    assert simulate(prog(), direct, 1000, options=NOTILE).time_us == pytest.approx(2.0)


def test_a_transfer_waiting_for_its_own_port_does_not_hold_the_receivers():
    # rank 0's out-port is busy 10 us with a send to 1, so its send to 2 waits until then; rank 3's send to 2,
    # ready at the same time, uses 2's in-port meanwhile instead of queueing behind a booking for later
    p = program([
        Gpu(0, 12, 12, 0, [Threadblock(0, send=1, steps=[step(0, StepType.SEND, src=(Buf.INPUT, 0), cnt=10)]),
                           Threadblock(1, send=2, steps=[step(0, StepType.SEND, src=(Buf.INPUT, 10))])]),
        Gpu(1, 12, 12, 0, [Threadblock(0, recv=0, steps=[step(0, StepType.RECV, dst=(Buf.OUTPUT, 0), cnt=10)])]),
        Gpu(2, 12, 12, 0, [Threadblock(0, recv=0, steps=[step(0, StepType.RECV, dst=(Buf.OUTPUT, 0))]),
                           Threadblock(1, recv=3, steps=[step(0, StepType.RECV, dst=(Buf.OUTPUT, 1))])]),
        Gpu(3, 12, 12, 0, [Threadblock(0, send=2, steps=[step(0, StepType.SEND, src=(Buf.INPUT, 0))])]),
    ], nchunks=12)
    sw = topo(None, n=4, alpha=0.0, bw=1.0, switch=True)  # 1000-byte chunks: 1 us each
    trace = []
    r = Simulator(p, sw, NOTILE).run(12000, trace=trace)
    done = {(rank, tb): end for rank, tb, _, _, _, end in trace}
    assert done[(0, 0)] == pytest.approx(10.0) and done[(0, 1)] == pytest.approx(11.0)
    assert done[(3, 0)] == pytest.approx(1.0)  # not 12: 2's in-port was free until rank 0's send could start
    assert r.time_us == pytest.approx(11.0)


def test_relay_dependency_and_local_copy():
    # 0 -> 1 (recv into o0), then another tb on 1 copies o0 -> o1 (dep), then sends o1 to 2
    p = program([
        Gpu(0, 1, 2, 0, [Threadblock(0, send=1, steps=[step(0, StepType.SEND, src=(Buf.INPUT, 0))])]),
        Gpu(1, 1, 2, 0, [Threadblock(0, recv=0, steps=[step(0, StepType.RECV, dst=(Buf.OUTPUT, 0), hasdep=True)]),
                         Threadblock(1, send=2, steps=[
                             step(0, StepType.COPY, src=(Buf.OUTPUT, 0), dst=(Buf.OUTPUT, 1), dep=(0, 0)),
                             step(1, StepType.SEND, src=(Buf.OUTPUT, 1))])]),
        Gpu(2, 1, 2, 0, [Threadblock(0, recv=1, steps=[step(0, StepType.RECV, dst=(Buf.OUTPUT, 0))])]),
    ], nchunks=2)
    t = topo([(0, 1), (1, 2)], n=3, alpha=1.0, bw=1.0)
    opts = SimOptions(tiling=False, local_bw_GBps=1.0)
    # chunk 1000 bytes: 2 us per hop, 1 us local copy
    assert simulate(p, t, 2000, options=opts).time_us == pytest.approx(2.0 + 1.0 + 2.0)


def test_fifo_depth_limits_run_ahead():
    # sender issues 4 sends; receiver waits on a slow dependency before receiving: with Simple (depth 2)
    # the 3rd send waits for the 1st receive
    sends = [step(i, StepType.SEND, src=(Buf.INPUT, i)) for i in range(4)]
    recvs = [step(i, StepType.RECV, dst=(Buf.OUTPUT, i)) for i in range(4)]
    p = program([Gpu(0, 4, 4, 0, [Threadblock(0, send=1, steps=sends)]),
                 Gpu(1, 4, 4, 0, [Threadblock(0, recv=0, steps=recvs)])], nchunks=4)
    t = topo([(0, 1)], alpha=1.0, bw=1.0)
    r = simulate(p, t, 4000, options=NOTILE)
    assert r.time_us == pytest.approx(4 * 2.0)


def test_tiling_replays_program():
    t = topo([(0, 1)], alpha=1.0, bw=1.0)
    p = one_send()
    p.proto = Proto.LL  # 32 KiB tiles
    sim = Simulator(p, t, SimOptions(proto_bw_factor=False, proto_alpha_factor=False))
    r = sim.run(4 * 32 * 1024)
    assert r.tiles == 4 and r.exact
    assert r.time_us == pytest.approx(4 * (1.0 + 32 * 1024 / 1000.0))
    big = sim.run(64 * 32 * 1024)  # more than max_exact_tiles: extrapolated
    assert not big.exact and big.tiles == 64
    assert big.time_us == pytest.approx(64 * (1.0 + 32 * 1024 / 1000.0), rel=1e-6)


def test_extrapolated_tiles_are_not_faster_than_the_busiest_resource():
    # a synthesized 2x NDv2 AllToAll in LL (written by `taccl batch`): at 64 MiB it runs 128 tiles; the slope
    # over the first 16 is the pipeline filling (2.2x too fast), the resource floor is the steady state
    from pathlib import Path

    from taccl.topology import load_topology
    from taccl.xmlio import read_program

    p = read_program(Path(__file__).parent / "data" / "batch" / "ndv2-alltoall-ll.xml")
    t = load_topology("ndv2", 2)
    approx = Simulator(p, t).run(64 << 20)
    exact = Simulator(p, t, SimOptions(max_exact_tiles=1000)).run(64 << 20)
    assert not approx.exact and exact.exact and exact.tiles == 128
    assert approx.time_us == pytest.approx(exact.time_us, rel=0.03)


def test_protocol_trades_latency_for_bandwidth():
    # LL pays NCCL's lower per-hop latency (x0.18) but moves half the bytes per wire byte: it wins small
    # messages, Simple wins large ones
    t = topo([(0, 1)], alpha=3.4, bw=10.0)
    times = {}
    for proto in (Proto.SIMPLE, Proto.LL):
        p = one_send()
        p.proto = proto
        times[proto] = [simulate(p, t, size, options=NOTILE).time_us for size in (1000, 10_000_000)]
    assert times[Proto.LL][0] == pytest.approx(0.6 + 1000 / 5000.0)
    assert times[Proto.SIMPLE][0] == pytest.approx(3.4 + 1000 / 10000.0)
    assert times[Proto.LL][0] < times[Proto.SIMPLE][0]
    assert times[Proto.LL][1] > times[Proto.SIMPLE][1]


def test_missing_link_names_rank_tb_step():
    t = topo([(1, 0)], alpha=1.0, bw=1.0, oneway=True)
    with pytest.raises(UserError, match=r"rank 0 tb 0 step 0.*no link 0->1"):
        simulate(one_send(), t, 1000)


def test_a_program_without_chunks_is_refused_not_divided_by():
    p = one_send()
    p.nchunksperloop = 0  # `taccl check` refuses it; the simulator once divided by it (a fuzz found it)
    with pytest.raises(UserError, match="nchunksperloop=0 must be at least 1"):
        simulate(p, topo([(0, 1)], alpha=1.0, bw=1.0, oneway=True), 1000)


def test_fused_and_unfused_consistent():
    t = load_topology("ndv2", 1)
    fused = build("ring", t, "allreduce")
    from taccl.baselines import build_dsl
    unfused = build_dsl("ring", t, "allreduce").lower(fuse=False)
    for size in (1 << 16, 1 << 24):
        a = simulate(fused, t, size).time_us
        b = simulate(unfused, t, size).time_us
        assert a <= b * 1.05
        assert b <= a * 3  # same transfers, same links: the same order of magnitude


def test_busbw_factors():
    assert busbw_factor("allreduce", 8) == pytest.approx(1.75)
    assert busbw_factor("allgather", 4) == pytest.approx(0.75)
    assert busbw_factor("broadcast", 4) == 1.0


@pytest.mark.parametrize("path", sorted(glob.glob(os.path.join(SHARED, "*.xml"))))
def test_shared_xmls_simulate(path):
    prog = read_program(path)
    if prog.ngpus == 8:
        t = load_topology("dgx-a100", 1)
    else:  # NCv4: 4 A100 over PCIe; any all-to-all fabric of 4 GPUs will do for the model
        t = topo(None, n=prog.ngpus, alpha=1.0, bw=20.0, switch=True)
    results = sweep(prog, t, [1024, 1 << 20, 1 << 26])
    assert all(r.time_us > 0 for r in results)
    assert results[0].time_us < results[-1].time_us


def test_sizes_in_forked_workers_match_one_by_one(monkeypatch):
    # a 1024-rank program's sizes run in forked workers (seconds each); small programs' sizes too when the
    # threshold says so, and the results are the same, in order
    import taccl.simulator as simulator

    t = load_topology("dgx2", 1)
    sim = Simulator(build("ring", t, "allgather"), t)
    sizes = [1000, 64000, 4 << 20]
    alone = [sim.run(s) for s in sizes]
    monkeypatch.setattr(simulator, "PARALLEL_MIN_STEPS", 0)
    monkeypatch.setattr(simulator.os, "cpu_count", lambda: 2)
    assert sim.run_sizes(sizes) == alone


def test_simulate_cli(tmp_path, capsys):
    t = load_topology("dgx2", 1)
    from taccl.lowering import write_program
    write_program(build("direct", t, "alltoall"), tmp_path / "a2a.xml")
    assert main(["simulate", str(tmp_path / "a2a.xml"), "-t", "dgx2", "--sizes", "1K:2M:32", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert [r["size_bytes"] for r in doc["results"]] == [1 << 10, 1 << 15, 1 << 20]  # K, M: 2^10, 2^20
    assert all(r["time_us"] >= r["lower_bound_us"] for r in doc["results"])
    assert main(["simulate", str(tmp_path / "a2a.xml"), "-t", "dgx2", "--sizes", "1M", "--no-tiling"]) == 0
    assert "x bound" in capsys.readouterr().out
    assert main(["simulate", str(tmp_path / "a2a.xml"), "-t", "ndv2", "--sizes", "1M"]) == 2


def test_a_network_send_is_as_slow_as_the_slower_of_its_two_nics():
    """The link of a network send took the sending NIC's type alone: 64 MiB into a 2 GB/s NIC simulated at 44
    GB/s, and a reservation of the receiving NIC changed nothing."""
    from taccl.topology import Topology, spec_from_dict

    def box(nic1, reservations=()):
        return Topology(spec_from_dict({
            "name": "box2", "gpus_per_node": 2,
            "link_types": {"nv": {"alpha_us": 0.5, "bw_GBps": 50}, "fast": {"alpha_us": 1, "bw_GBps": 50},
                           "slow": {"alpha_us": 10, "bw_GBps": 2}},
            "links": [{"src": 0, "dst": 1, "type": "nv"}],
            "nics": [{"name": "ib0", "gpus": [0], "type": "fast"}, {"name": "ib1", "gpus": [1], "type": nic1}],
            "reservations": list(reservations)}), 2)

    mixed = box("slow")
    for src, dst in ((0, 3), (1, 2)):  # fast -> slow and slow -> fast
        link = mixed.link(src, dst)
        assert (link.alpha_us, link.bw_GBps) == (10, 2)
        assert link.type.cost("Simple") == mixed.link(1, 3).type.cost("Simple")
    assert (mixed.link(0, 2).alpha_us, mixed.link(0, 2).bw_GBps) == (1, 50)
    reserved = box("fast", [{"fraction": 0.9, "nics": ["ib1"]}])
    assert reserved.link(0, 3).bw_GBps == pytest.approx(5.0)  # what the other job leaves of the receiving NIC
    prog = build("direct", mixed, "alltoall")
    slow, fast = simulate(prog, mixed, 64 << 20).time_us, simulate(prog, box("fast"), 64 << 20).time_us
    assert slow > 10 * fast


def test_steps_of_several_chunks_are_simulated_as_the_runtimes_calls():
    """Where a step's chunks do not fit one call (a chunk over 1/cnt of a tile) the runtime makes a call of
    each M of them, a FIFO slot and a sender's overhead each: simulated as those calls (it was one transfer)."""
    from taccl.program import split_calls
    from taccl.topology import load_topology

    topo = load_topology("dgx-h100", 2)
    prog = build("hierarchical", topo, "allreduce")  # node phases move a shard of 2 chunks a step
    assert max(st.cnt for _, _, st in prog.iter_steps()) == 2
    sim = Simulator(prog, topo)
    whole = Simulator(prog, topo)
    whole._largest_cnt = 1  # as before: one call a step at every size
    small, large = 1 << 20, 64 << 20  # chunks of 64 KiB (two a call) and 4 MiB (one a call)
    assert sim.run(small).time_us == whole.run(small).time_us
    split = sim.run(large).time_us
    assert split == Simulator(split_calls(prog, 1), topo).run(large).time_us
    assert split > whole.run(large).time_us
    # two ranks, each sending 3 chunks in one step, then receiving: fine while a step is one call, a deadlock
    # where each chunk is a call (two fill Simple's FIFO), as the host runtime shows
    gpus = []
    for r in range(2):
        peer = 1 - r
        steps = [Step(0, StepType.COPY, Buf.INPUT, 0, Buf.OUTPUT, 3 * r, cnt=3),
                 Step(1, StepType.SEND, Buf.OUTPUT, 3 * r, Buf.OUTPUT, -1, cnt=3),
                 Step(2, StepType.RECV, Buf.INPUT, -1, Buf.OUTPUT, 3 * peer, cnt=3)]
        gpus.append(Gpu(id=r, i_chunks=3, o_chunks=6, threadblocks=[Threadblock(id=0, send=peer, recv=peer, steps=steps)]))
    ring = Program(name="cnt3", collective="allgather", proto=Proto.SIMPLE, nchannels=1, nchunksperloop=6, ngpus=2,
                   gpus=gpus)
    two = load_topology("torus-1x2", 1)
    assert simulate(ring, two, 6 << 20).time_us > 0
    with pytest.raises(Exception, match="deadlocks in simulation.*moves a step's chunks 1 a call"):
        simulate(ring, two, 12 << 20)
