"""Every baseline passes the checker on several topologies and rank counts, and simulates."""
from __future__ import annotations

import json

import pytest

from taccl.baselines import (BASELINES, REFERENCE_MAX_NODES, REFERENCE_MAX_STEPS, applicable, build, build_dsl,
                             build_on_channels, node_cycle, operations, ring_order)
from taccl.budget import check_baseline_memory
from taccl.checker import check_program
from taccl.cli import main
from taccl.errors import UserError
from taccl.lowering import DEFAULT_MAX_STEPS
from taccl.program import MAX_NODES
from taccl.simulator import simulate
from taccl.topology import load_topology
from taccl.xmlio import read_program, write_program

TOPOS = [("ndv2", 1), ("ndv2", 2), ("dgx2", 1), ("dgx2", 2), ("torus-2x3", 1), ("torus-3x3", 1), ("dgx-a100", 3)]
CASES = [(t, n, b, c) for t, n in TOPOS for b, colls in BASELINES.items() for c in colls]


@pytest.mark.parametrize("tname,nodes,name,coll", CASES, ids=[f"{t}x{n}-{b}-{c}" for t, n, b, c in CASES])
def test_baseline_proven(tname, nodes, name, coll):
    t = load_topology(tname, nodes)
    if not applicable(name, t, coll):
        with pytest.raises(UserError):
            build(name, t, coll)
        return
    p = build(name, t, coll)
    report = check_program(p)
    assert report.ok and report.proven, report.summary()
    assert simulate(p, t, 1 << 20).time_us > 0
    traced = build_dsl(name, t, coll)
    assert operations(name, t, coll) == traced.operations  # counted without tracing
    assert operations(name, t, coll, chunks=True) == sum(src.size for _, src, _, _, _ in traced._ops)


def test_a_baseline_that_cannot_fit_in_memory_is_refused_before_it_is_traced():
    # 128x DGX H100: a ring AllGather has 8.4 M operations (a minute and gigabytes to trace); refused at once
    t = load_topology("dgx-h100", 128)
    with pytest.raises(UserError, match=r"about 8,388,608 steps over 1,047,552 \(chunk, rank\) pairs.*24\.3 GiB of "
                                        r"memory, more than the 8\.0 GiB of a test's limit"):
        build("ring", t, "allgather", reference=True, max_memory_bytes=8 << 30, max_memory_source="a test's limit")
    check_baseline_memory("hierarchical", t, "allreduce", 1, 8 << 30)  # 274,432 operations: passes
    # a chunk-up of 10^20 on one node: a few steps (four rings of 64), but a collective of 5.6 x 10^21 pairs (once
    # killed for memory)
    with pytest.raises(UserError, match=r"at chunk-up 100000000000000000000 makes about 256 steps over "
                                        r"5,600,000,000,000,000,000,000 \(chunk, rank\) pairs"):
        build("ring", load_topology("ndv2", 1), "allgather", chunkup=10 ** 20)


@pytest.mark.parametrize("name,coll", [("ring", "allreduce"), ("direct", "alltoall"), ("two-step", "alltoall")])
def test_baseline_instances_and_chunkup(name, coll):
    t = load_topology("dgx2", 2) if name == "two-step" else load_topology("dgx-a100", 1)
    p = build(name, t, coll, chunkup=2, instances=2)
    assert check_program(p).ok
    assert p.nchunksperloop == 2 * 2 * (t.num_ranks if coll != "allgather" else t.num_ranks)


def test_a_reference_ring_keeps_nccls_channels_past_the_executor_limits(tmp_path):
    # 64 ranks, 4 instances of 8 rings: 32 channels, 127 steps per block and 4161 XML nodes per rank
    t = load_topology("dgx-h100", 8)
    p = build("ring", t, "allreduce", instances=4, max_tbs=132, reference=True)
    assert p.nchannels == 32 and p.max_steps > DEFAULT_MAX_STEPS and p.max_nodes > MAX_NODES
    assert check_program(p, rendezvous=False).rules("error") == {"limit.steps", "limit.nodes"}
    write_program(p, tmp_path / "ring.xml")  # a runtime built with larger limits loads it
    assert main(["check", str(tmp_path / "ring.xml"), "-q", "--no-rendezvous", "--max-steps",
                 str(REFERENCE_MAX_STEPS), "--max-nodes", str(REFERENCE_MAX_NODES)]) == 0


def test_ring_follows_links():
    t = load_topology("ndv2", 2)
    order = ring_order(t)
    assert sorted(order) == list(range(16))
    for a, b in zip(order, order[1:] + order[:1]):
        assert t.link(a, b) is not None
    assert sorted(node_cycle(load_topology("torus-4x4", 1))) == list(range(16))


def test_trees_use_every_nic_each_on_its_own_channel():
    # NCCL's trees on a DGX H100 cluster: one pair per NIC, so every NIC sends and receives; each tree on a
    # channel of its own, shared round robin when the instances leave fewer channels than trees
    t = load_topology("dgx-h100", 4)
    for instances, channels in ((1, 16), (2, 32), (4, 32)):
        p = build("double-binary-tree", t, "allreduce", instances=instances, max_tbs=132)
        assert p.nchannels == channels
        out_nics, in_nics = set(), set()
        for g in p.gpus:
            for tb in g.threadblocks:
                if tb.send >= 0 and t.node_of(tb.send) != t.node_of(g.id):
                    out_nics.add((t.node_of(g.id), t.nic_of(g.id)))
                if tb.recv >= 0 and t.node_of(tb.recv) != t.node_of(g.id):
                    in_nics.add((t.node_of(g.id), t.nic_of(g.id)))
        every = {(n, k) for n in range(4) for k in range(8)}
        assert out_nics == every and in_nics == every


@pytest.mark.parametrize("name,nodes", [("ring", 1), ("ring", 2), ("double-binary-tree", 1), ("double-binary-tree", 2)])
def test_a_baseline_on_nccls_channel_count_has_that_many(name, nodes):
    t = load_topology("dgx-h100", nodes)
    flows = {"ring": 8, "double-binary-tree": 16}[name] if nodes > 1 else {"ring": 1, "double-binary-tree": 2}[name]
    for channels in (flows, 16, 32):
        p = build_on_channels(name, t, "allreduce", channels, max_tbs=132)
        assert p.nchannels == channels and check_program(p).ok
    if flows > 1 and nodes == 1:  # NCCL's smallest calls: one channel, the two chains share it
        assert build_on_channels(name, t, "allreduce", 1).nchannels == 1
    with pytest.raises(UserError, match="no rings or trees"):
        build_on_channels("direct", t, "allreduce", 4)


def test_baseline_cli(tmp_path, capsys):
    out = tmp_path / "tree.xml"
    assert main(["baseline", "double-binary-tree", "-t", "dgx2", "-n", "2", "-o", str(out)]) == 0
    assert read_program(out).collective == "allreduce"
    assert main(["baseline", "direct", "-t", "ndv2", "-o", str(tmp_path / "x.xml")]) == 2
    assert not (tmp_path / "x.xml").exists()
    assert main(["baseline", "ring", "-t", "ndv2", "-c", "alltoall", "-o", str(tmp_path / "y.xml")]) == 2


def _one_nic_per_gpu(tmp_path, gpus: int):
    """A node of `gpus` GPUs on one switch, a NIC each (a GB200 NVL72 rack, smaller)."""
    doc = {"name": f"switch{gpus}", "gpus_per_node": gpus,
           "link_types": {"nvswitch": {"alpha_us": 0.7, "bw_GBps": 450.0}, "ib": {"alpha_us": 3.0, "bw_GBps": 50.0}},
           "switches": [{"name": "sw", "gpus": list(range(gpus)), "type": "nvswitch"}],
           "nics": [{"name": f"nic{g}", "gpus": [g], "type": "ib"} for g in range(gpus)]}
    path = tmp_path / f"switch{gpus}.json"
    path.write_text(json.dumps(doc))
    return path


def test_rings_past_the_runtimes_limits_are_fewer_and_the_user_is_told(tmp_path, capsys):
    # 2 nodes of 33 GPUs, a NIC each: 33 rails, so NCCL runs a ring per channel, 32. Each ring has 65 steps a
    # block, over the executor's 64 on a channel of its own: 16 rings, two channels each, fit
    topo = _one_nic_per_gpu(tmp_path, 33)
    out = tmp_path / "ring.xml"
    assert main(["baseline", "ring", "-t", str(topo), "-n", "2", "-c", "allgather", "-o", str(out)]) == 0
    err = capsys.readouterr().err
    assert "32 rings (NCCL's most) exceed msccl-executor's limits on 66 ranks; built with 16 rings at most" in err
    p = read_program(out)
    assert p.nchannels == 32 and p.max_steps <= DEFAULT_MAX_STEPS and check_program(p).ok
    # the reference (NCCL itself, no step limit) keeps a ring per channel: 32 rings, not one per NIC (33)
    t = load_topology(str(topo), 2)
    assert operations("ring", t, "allgather") == build_dsl("ring", t, "allgather").operations == 32 * 66 * 66


def test_a_one_node_ring_on_few_instances_says_how_to_build_nccls(tmp_path, capsys):
    # NCCL runs one node's ring on 32 channels at large sizes; a ring on 1 instance is one thread block a
    # connection, several times slower there: the user is told how to build NCCL's
    out = tmp_path / "ring.xml"
    assert main(["baseline", "ring", "-t", "dgx-h100", "-o", str(out), "-q"]) == 0
    assert "NCCL runs this ring on 32 channels at large sizes, which --instances 32 builds" in capsys.readouterr().err
    assert main(["baseline", "ring", "-t", "dgx-h100", "-o", str(out), "-q", "--instances", "32"]) == 0
    assert main(["baseline", "ring", "-t", "dgx-h100", "-n", "2", "-o", str(out), "-q", "--instances", "4"]) == 0
    assert "NCCL runs" not in capsys.readouterr().err


@pytest.mark.parametrize("nodes", [2, 3])
def test_hierarchical_on_one_gpu_a_node_is_the_network_ring(tmp_path, nodes):
    # its node phases had nothing to do, and nothing copied the input to the output: a wrong program (exit 1)
    spec = {"name": "one", "gpus_per_node": 1, "link_types": {"eth": {"alpha_us": 5, "bw_GBps": 3}},
            "nics": [{"gpus": [0], "type": "eth"}]}
    path = tmp_path / "one.json"
    path.write_text(json.dumps(spec))
    topology = load_topology(str(path), nodes)
    assert check_program(build("hierarchical", topology, "allreduce")).proven
    traced = build_dsl("hierarchical", topology, "allreduce")
    assert operations("hierarchical", topology, "allreduce") == traced.operations
    assert operations("hierarchical", topology, "allreduce", chunks=True) == sum(src.size for _, src, _, _, _ in traced._ops)
