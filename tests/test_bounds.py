"""Lower bounds: valid for every program the simulator grades, and tight where a baseline reaches them."""
import pytest

from taccl.baselines import applicable, build
from taccl.bounds import allreduce_optimum, lower_bound, lower_bounds
from taccl.simulator import simulate
from taccl.topology import load_topology

H100_LL_NVSWITCH, H100_LL_NIC, H100_SYNC = 0.752, 2.7, 1.751


def test_a_reduction_pays_for_merging_what_crosses_the_network():
    t = load_topology("dgx-h100", 2)
    read = min(H100_SYNC, 2 * H100_LL_NVSWITCH)  # reading another block's data: a flag, or a round trip

    def gathered(k):  # a sending block holding k inputs of other ranks: a chain of hops, or a hop and a read
        return 0.0 if k < 2 else min((k - 1) * H100_LL_NVSWITCH, H100_LL_NVSWITCH + read)

    for size in (1024, 65536):
        # The 8 inputs from the other node cross in one connection whose sender gathered them first, or k of
        # them do and the other 8 - k, sent raw to the summing rank, are read after they landed: the 16 NICs
        # (25 GB/s each in LL) carry 8 - k copies of all the summed bytes before the flag
        raw = min(max(gathered(k), read + (8 - k) * size / (16 * 25e3)) for k in range(8))
        merge = H100_LL_NIC + min(gathered(8), raw)
        for coll in ("reducescatter", "allreduce"):
            assert lower_bounds(t, coll, size, proto="LL")["latency_us"] == pytest.approx(merge)
    # at 64 KiB the raw inputs take longer than gathering them on the other node: a hop, a read, the NIC
    assert merge == pytest.approx(H100_LL_NIC + H100_LL_NVSWITCH + read)
    # gathering needs no merge: the farthest pair's latency stays the bound
    assert lower_bounds(t, "allgather", 1024, proto="LL")["latency_us"] == pytest.approx(H100_LL_NIC)


def test_the_direct_reduce_scatter_reaches_the_merge_bound_and_no_baseline_beats_it():
    t = load_topology("dgx-h100", 2)
    direct = simulate(build("direct", t, "reducescatter", proto="LL"), t, 1024).time_us
    bound = lower_bound(t, "reducescatter", 1024, proto="LL")
    assert bound <= direct <= 1.04 * bound  # it pays the flag, 0.25 us above the round trip the bound allows
    for name in ("ring", "direct", "one-shot", "hierarchical", "double-binary-tree"):
        for coll in ("reducescatter", "allreduce"):
            if not applicable(name, t, coll):
                continue
            for proto in ("LL", "LL128"):
                prog = build(name, t, coll, proto=proto)
                for size in (1024, 65536):
                    assert simulate(prog, t, size).time_us >= lower_bound(t, coll, size, proto=proto) * (1 - 1e-9), \
                        (name, coll, proto, size)


def test_one_node_reductions_merge_once_too():
    t = load_topology("dgx-h100", 1)
    b = lower_bounds(t, "reducescatter", 1024, proto="LL")
    assert b["latency_us"] == pytest.approx(H100_LL_NVSWITCH + min(H100_SYNC, 2 * H100_LL_NVSWITCH))
    prog = build("direct", t, "reducescatter", proto="LL")
    assert simulate(prog, t, 1024).time_us >= lower_bound(t, "reducescatter", 1024, proto="LL")


def test_without_a_flag_cost_a_reduction_bound_is_the_alpha_diameter():
    # a topology without a runtime block (no flag cost): reading another block's data is free in the model
    def latencies(topo):
        return [lower_bounds(topo, c, 1024, proto="LL")["latency_us"] for c in ("reducescatter", "allgather")]

    for name in ("mi300x", "torus-2x2"):
        topo = load_topology(name, 1)
        assert topo.spec.sync_us == 0.0 and topo.num_ranks >= 3
        rs, ag = latencies(topo)
        assert rs == pytest.approx(ag)
    rs, ag = latencies(load_topology("dgx-h100", 1))  # with the flag the merge costs more than the diameter
    assert rs > ag + 0.5


def test_the_allreduce_optimum_is_the_provable_bound_at_small_sizes_and_rs_plus_ag_at_large():
    # one node, 1 KiB: one merge (2.26 us) outweighs both volumes' port times with their latencies (1.5 us)
    assert allreduce_optimum(load_topology("dgx-h100", 1), 1024) == pytest.approx(
        lower_bound(load_topology("dgx-h100", 1), "allreduce", 1024))
    t = load_topology("dgx-h100", 2)
    size = 1 << 30
    rs_ag = min(lower_bound(t, "reducescatter", size, proto=p) + lower_bound(t, "allgather", size, proto=p)
                - lower_bounds(t, "allgather", size, proto=p)["call_us"] for p in ("Simple", "LL128", "LL"))
    assert allreduce_optimum(t, size) == pytest.approx(rs_ag)
    assert allreduce_optimum(t, size) > 1.5 * lower_bound(t, "allreduce", size)


def test_an_allgather_sends_its_blocks_through_its_own_nic_or_pays_a_relay():
    t = load_topology("dgx-h100", 2)
    b = lower_bounds(t, "allgather", 65536, proto="LL")
    # 8 remote copies of a 4 KiB block on one 25 GB/s NIC take 1.3 us; a relay costs one NVSwitch hop instead
    assert b["fanout_us"] == pytest.approx(H100_LL_NIC + min(8 * 4096 / 25e3, H100_LL_NVSWITCH))
    direct = simulate(build("direct", t, "allgather", proto="LL"), t, 65536).time_us
    assert lower_bound(t, "allgather", 65536, proto="LL") <= direct <= 1.08 * lower_bound(t, "allgather", 65536, proto="LL")
    assert lower_bounds(load_topology("dgx-h100", 1), "allgather", 65536, proto="LL")["fanout_us"] == 0.0


def test_the_module_examples_hold():
    import doctest

    import taccl.bounds

    assert doctest.testmod(taccl.bounds).failed == 0


def test_an_alltoall_on_a_partial_mesh_pays_for_its_relayed_blocks():
    # One NDv2 node (hybrid cube-mesh): each GPU has NVLinks to 4 of its 7 peers, so 3 of every GPU's blocks
    # cross at least two links. Every link carries at most bandwidth x T, so T is at least the block-hops
    # over the summed bandwidth: a weaker bound than the flow program's, and far above the per-GPU port one.
    import networkx as nx

    t = load_topology("ndv2", 1)
    size, proto = 1 << 28, "Simple"
    b = lower_bounds(t, "alltoall", size, proto=proto)
    g = nx.DiGraph([(s, d) for s, d, _ in t.spec.links])
    hops = sum(nx.shortest_path_length(g, s, d) for s in range(8) for d in range(8) if s != d)
    total_bw = sum(t.spec.link_types[ty].cost(proto).bw_GBps for _, _, ty in t.spec.links)
    assert b["flow_us"] > hops * size / 8 / (total_bw * 1000.0) > 1.3 * b["ingress_us"]
    assert lower_bound(t, "alltoall", size, proto=proto) == pytest.approx(b["call_us"] + b["flow_us"])
    # where every pair is one switch hop apart, the flow bound is the per-port one
    h = lower_bounds(load_topology("dgx-h100", 1), "alltoall", size, proto=proto)
    assert h["flow_us"] == pytest.approx(h["ingress_us"], rel=1e-6)


def test_no_alltoall_program_beats_the_flow_bound():
    for name, nodes in (("ndv2", 2), ("dgx-h100", 2), ("dgx2", 2)):
        t = load_topology(name, nodes)
        for baseline in ("direct", "two-step"):
            if not applicable(baseline, t, "alltoall"):
                continue
            for proto in ("Simple", "LL128"):
                prog = build(baseline, t, "alltoall", proto=proto, instances=2)
                for size in (1 << 20, 1 << 26):
                    assert simulate(prog, t, size).time_us >= lower_bound(t, "alltoall", size, proto=proto) * (1 - 1e-9), \
                        (name, baseline, proto, size)


def test_gpus_that_share_a_nic_count_it_once():
    # DGX-2: a NIC per GPU pair. Each GPU must take in 31 of 32 blocks through its NVSwitch port or the NIC;
    # the pair together through two ports and one NIC, not one NIC each.
    t = load_topology("dgx2", 2)
    size = 256 << 20
    switch, nic = (t.spec.link_types[k].cost("Simple") for k in ("nvswitch", "ib"))
    pair = 2 * 31 / 32 * size / ((2 * switch.bw_GBps + nic.bw_GBps) * 1000.0)
    b = lower_bounds(t, "allgather", size, proto="Simple")
    # each resource carries data only after its own alpha (the NIC's 14 us, the ports' less)
    lag = (2 * switch.bw_GBps * switch.alpha_us + nic.bw_GBps * nic.alpha_us) / (2 * switch.bw_GBps + nic.bw_GBps)
    assert b["ingress_us"] == pytest.approx(lag + pair)
    assert b["ingress_us"] > 31 / 32 * size / ((switch.bw_GBps + nic.bw_GBps) * 1000.0) * 1.04
    # still a bound: the rings NCCL would run take longer
    for proto in ("Simple", "LL128"):
        ring = simulate(build("ring", t, "allgather", proto=proto, instances=4), t, size).time_us
        assert ring >= lower_bound(t, "allgather", size, proto=proto)


def test_a_relayed_copy_reaches_one_rank_per_thread_block():
    # DGX-2, LL, 16 KiB AllGather: a block relayed inside the other node reaches one rank from the thread
    # block that took it in (n + a); any other rank waits a second hop. So either half of the other node's
    # 16 ranks take every block over a NIC, or some rank waits n + 2a.
    t = load_topology("dgx2", 2)
    size = 16 << 10
    switch, nic = (t.spec.link_types[k].cost("LL") for k in ("nvswitch", "ib"))
    half = 16 * 8 * size / 32 / (8 * nic.bw_GBps * 1000.0)
    assert nic.alpha_us + half < nic.alpha_us + 2 * switch.alpha_us
    assert lower_bounds(t, "allgather", size, proto="LL")["fanout_us"] == pytest.approx(nic.alpha_us + half)
    for name in ("direct", "ring"):
        for proto in ("LL", "LL128"):
            prog = build(name, t, "allgather", proto=proto)
            for s in (size, 4 * size):
                assert simulate(prog, t, s).time_us >= lower_bound(t, "allgather", s, proto=proto), (name, proto, s)


@pytest.mark.parametrize("links,nics", [
    # two sockets joined by 8 us links, NICs of 2 us: 0 -> 1 is faster through the other node (2 + 2 us)
    ({"nv": {"alpha_us": 8, "bw_GBps": 10}, "a": {"alpha_us": 2, "bw_GBps": 12.5}, "b": {"alpha_us": 2, "bw_GBps": 12.5}},
     ("a", "b")),
    # GPU 1's NIC takes 10 us, GPU 0's 1 us: GPU 1's blocks reach the other node sooner through GPU 0's
    ({"nv": {"alpha_us": 0.5, "bw_GBps": 50}, "a": {"alpha_us": 1, "bw_GBps": 50}, "b": {"alpha_us": 10, "bw_GBps": 2}},
     ("a", "b")),
])
def test_programs_through_other_nodes_and_other_nics_stay_above_the_bound(tmp_path, links, nics):
    """The latency bound took paths inside a node only, the fan-out bound each GPU's own NIC: synthesized
    programs that went out through the network and back, or through a neighbour's faster NIC, simulated at
    0.51x and 0.15x the printed bound."""
    import contextlib
    import io
    import json

    from taccl.cli import main

    topo = tmp_path / "box.json"
    topo.write_text(json.dumps({"name": "box", "gpus_per_node": 2, "link_types": links,
                                "links": [{"src": 0, "dst": 1, "type": "nv"}],
                                "nics": [{"gpus": [0], "type": nics[0]}, {"gpus": [1], "type": nics[1]}]}))
    sketch = tmp_path / "s.json"
    sketch.write_text(json.dumps({"topology": str(topo), "nodes": 2, "collective": "allgather", "input_size": "1K"}))
    for coll in ("allgather", "reducescatter", "allreduce"):
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            assert main(["solve", str(sketch), "--collective", coll, "-o", str(tmp_path / coll), "-q", "--json"]) == 0
        summary = json.loads(out.getvalue())
        assert summary["simulated_us"] >= summary["lower_bound_us"] * (1 - 1e-9), (coll, summary)
        assert summary["time_us"] >= summary["lower_bound_us"] * (1 - 1e-9), (coll, summary)
