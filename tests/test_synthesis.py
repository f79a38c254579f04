"""The synthesizer on small cases whose optimum is derived by hand, plus combining collectives and determinism."""
import json
from pathlib import Path

import pytest

from taccl.algorithm import Algorithm, verify
from taccl.errors import CheckFailed, UserError
from taccl.sketch import sketch_from_dict
from taccl.synthesize import SynthesisOptions, synthesize
from taccl.topology import Topology, spec_from_dict


def topo_file(tmp_path, doc):
    p = tmp_path / f"{doc['name']}.json"
    p.write_text(json.dumps(doc))
    return str(p)


def ring4(tmp_path):
    # 4 GPUs in a bidirectional ring; a 1000-byte chunk takes exactly 1 us (alpha 0, 1 GB/s).
    return topo_file(tmp_path, {"name": "ring4", "gpus_per_node": 4, "max_nodes": 1,
                                "link_types": {"l": {"alpha_us": 0.0, "bw_GBps": 1.0}},
                                "links": [{"src": i, "dst": (i + 1) % 4, "type": "l"} for i in range(4)]})


def switch4(tmp_path):
    return topo_file(tmp_path, {"name": "switch4", "gpus_per_node": 4, "max_nodes": 1,
                                "link_types": {"sw": {"alpha_us": 0.0, "bw_GBps": 1.0}},
                                "switches": [{"gpus": [0, 1, 2, 3], "type": "sw"}]})


def two_by_two(tmp_path):
    # 2 GPUs per node joined by a 1 us link; one NIC per node shared by both GPUs, 2 us per chunk.
    return topo_file(tmp_path, {"name": "two_by_two", "gpus_per_node": 2,
                                "link_types": {"nv": {"alpha_us": 0.0, "bw_GBps": 1.0}, "ib": {"alpha_us": 0.0, "bw_GBps": 0.5}},
                                "links": [{"src": 0, "dst": 1, "type": "nv"}], "nics": [{"gpus": [0, 1], "type": "ib"}]})


def solve(topology, collective, size, nodes=1, **sketch):
    doc = {"topology": topology, "nodes": nodes, "collective": collective, "input_size": size}
    doc.update(sketch)
    return synthesize(sketch_from_dict(doc, path="test.json"), options=SynthesisOptions(time_limit_s=30))


def test_ring_allgather_optimum(tmp_path):
    # Each GPU receives 3 chunks over 2 in-links (>= 2 us) and the opposite chunk is 2 hops away (>= 2 us).
    algo = solve(ring4(tmp_path), "allgather", 4000)
    assert algo.time_us == pytest.approx(2.0)
    assert algo.stages[0]["status"] == "optimal"


def test_switch_allgather_optimum(tmp_path):
    # Each GPU's switch in-port takes its 3 missing chunks one after another: 3 us.
    algo = solve(switch4(tmp_path), "allgather", 4000,
                 intranode_sketch={"strategy": "switch", "switches": [[0, 1, 2, 3]], "switch_hyperedge_strategy": "uc-min"})
    assert algo.time_us == pytest.approx(3.0)


def test_two_nodes_allgather_optimum(tmp_path):
    # The NIC brings 2 chunks into each node (2 us each, last at 4 us); the last one is forwarded (+1 us).
    algo = solve(two_by_two(tmp_path), "allgather", 4000, nodes=2)
    assert algo.time_us == pytest.approx(5.0)
    net = [t for t in algo.transfers if t.link == "ib"]
    assert len(net) == 4  # each chunk crosses once, never twice


def test_switch_contiguity_merges_alpha_dominated_sends(tmp_path):
    # With a large alpha, sending both chunks of a rank together (one alpha) beats two sends.
    doc = {"name": "sw2", "gpus_per_node": 2, "max_nodes": 1, "link_types": {"sw": {"alpha_us": 10.0, "bw_GBps": 1.0}},
           "links": [{"src": 0, "dst": 1, "type": "sw"}]}
    algo = solve(topo_file(tmp_path, doc), "allgather", 4000, hyperparameters={"input_chunkup": 2},
                 routing={"merge_links": "all"})
    # Two 1000-byte chunks each way: merged 10 + 2 = 12 us instead of 2 x 11 = 22 us.
    assert algo.time_us == pytest.approx(12.0)
    assert all(len(t.chunks) == 2 for t in algo.transfers)


@pytest.mark.parametrize("collective", ["reducescatter", "allreduce", "alltoall", "broadcast", "reduce", "gather", "scatter"])
def test_every_collective_verifies(tmp_path, collective):
    algo = solve(ring4(tmp_path), collective, 4000)
    assert algo.time_us > 0
    assert algo.time_us >= algo.lower_bound_us - 1e-9
    verify(algo, algo.make_collective())  # proven again from the JSON-level data


def test_allreduce_is_reduce_then_copy(tmp_path):
    algo = solve(ring4(tmp_path), "allreduce", 4000)
    ops = [t.op for t in algo.transfers]
    assert "reduce" in ops and "copy" in ops
    # A ring ReduceScatter needs 2 us by the same argument as AllGather; AllReduce at most twice that, plus
    # the local pass that folds a rank's two converging partial sums (4 ns at the default 400 GB/s).
    assert algo.time_us <= 4.0 + 0.01


def test_verify_rejects_a_broken_schedule(tmp_path):
    algo = solve(ring4(tmp_path), "allgather", 4000)
    coll = algo.make_collective()
    broken = Algorithm.from_json(algo.to_json())
    needed = {d for t in broken.transfers for d in t.deps}
    leaf = next(t for t in broken.transfers if t.id not in needed)
    broken.transfers = [t for t in broken.transfers if t is not leaf]
    with pytest.raises(CheckFailed, match="never reaches"):
        verify(broken, coll)
    early = Algorithm.from_json(algo.to_json())
    later = max(early.transfers, key=lambda t: t.send_us)
    later.send_us = later.arrive_us = -1.0
    with pytest.raises(CheckFailed):
        verify(early, coll)


def test_same_input_same_output(tmp_path):
    a = solve(two_by_two(tmp_path), "allgather", 4000, nodes=2).to_json()
    b = solve(two_by_two(tmp_path), "allgather", 4000, nodes=2).to_json()
    for doc in (a, b):
        for st in doc["stages"]:
            st.pop("time_s", None)
    assert a == b


def test_symmetry_reduces_the_model(tmp_path):
    path = ring4(tmp_path)
    plain = solve(path, "allgather", 4000)
    sym = solve(path, "allgather", 4000, symmetry_offsets=[[1, 4]])
    assert sym.time_us == pytest.approx(plain.time_us)
    assert sym.stages[0]["variables"] < plain.stages[0]["variables"]
    assert sym.stages[0]["chunk_orbits"] == 1


def test_reference_profile_costs_scale_with_chunk_size():
    from taccl.topology import load_spec

    spec = load_spec(str(Path(__file__).resolve().parent / "data" / "reference-taccl" / "topo-ndv2-1MB.json"))
    topo = Topology(spec, 2)
    # wired as the reference's ndv2() wires it: its first beta (23 us for a 1 MB chunk, 2^20 bytes as nccl-tests
    # reads 1MB) on 0-1, 0-4, 1-3, 2-3, 2-6, 4-5, 5-7, 6-7, the second (46 us) on the other NVLink pairs
    first = {(0, 1), (0, 4), (1, 3), (2, 3), (2, 6), (4, 5), (5, 7), (6, 7)}
    second = {(0, 2), (0, 3), (1, 2), (1, 5), (3, 7), (4, 6), (4, 7), (5, 6)}
    for a, b in first | second:
        beta = 23.0 if (a, b) in first else 46.0
        assert topo.link(a, b).cost_us(1 << 20) == topo.link(b, a).cost_us(1 << 20) == pytest.approx(0.3 + beta)
    assert sum(topo.link(a, b) is not None for a in range(8) for b in range(8) if a != b) == 32
    assert topo.link(0, 1).cost_us(1 << 19) == pytest.approx(0.3 + 11.5)
    assert topo.link(0, 9).cost_us(1 << 20) == pytest.approx(2.6 + 105.0)


def test_equal_tasks_take_the_rings_turn():
    # three single-GPU nodes, each sending one chunk to each other over its NIC (one transfer in and one out
    # at a time). By task id every rank sends to the lowest-numbered node first, two of them to node 0 at
    # once: three rounds. Taking turns (rank r to r+1 first) every NIC is busy in both: two rounds.
    from taccl.ordering import Task, best_schedule, rotation_turns

    tasks = []
    for src in range(3):
        for dst in range(3):
            if dst != src:
                tasks.append(Task(len(tasks), dst, src, dst, "copy", 0.0, 1.0, (("out", src), ("in", dst)), "ib", True))
    assert best_schedule(tasks).makespan_us == pytest.approx(3.0)
    turns = rotation_turns(tasks, gpus_per_node=1, nodes=3)
    assert turns[0] == (1, 0, 1, 0) and turns[1] == (2, 0, 2, 0)  # rank 0 -> node 1, then node 2
    best = best_schedule(tasks, turns=turns)
    assert best.makespan_us == pytest.approx(2.0) and best.variant.endswith("+turns")


def test_ordering_network_sends_is_cheap_with_instances():
    from taccl.synthesize import _order_is_cheap

    sync = 1.75
    assert _order_is_cheap(14.0, sync, 1)  # long enough to cover a flag on its own
    assert not _order_is_cheap(10.5, sync, 1)  # one channel: every send would wait a flag
    assert _order_is_cheap(10.5, sync, 4)  # the three other channels' quarters (7.9 us) cover it
    assert not _order_is_cheap(2.0, sync, 4)  # 1.5 us of other channels' sends do not


def test_network_sends_keep_their_scheduled_order_with_instances():
    # 4x DGX H100, hierarchical AllGather at 8 MiB: each GPU's NIC sends its 256 KiB (5.2 us) to three nodes.
    # With four instances the lowering sequences those sends as scheduled (each channel's send waits for
    # the previous one, a flag that the other channels' sends cover); left to the blocks, they take the NIC
    # in whatever order they reach it, and the node phase waits for chunks that went out late.
    from dataclasses import replace

    from taccl.lowering import lower
    from taccl.simulator import Simulator
    from taccl.sketch import load_sketch

    sketch = load_sketch(Path(__file__).resolve().parent.parent / "sketches" / "dgx-h100-hier.json")

    def run(instances):
        return synthesize(sketch, nodes=4, collective="allgather", input_size="8M",
                          options=SynthesisOptions(time_limit_s=20, proto="Simple", instances=instances))

    assert not any(t.after for t in run(1).transfers)  # one channel: 5.2 us sends do not cover a flag
    algo = run(4)
    net = [t for t in algo.transfers if t.link == "ib"]
    assert len(net) == 32 * 3 and sum(1 for t in net if t.after) == 32 * 2  # all but each GPU's first
    topo = algo.load_topology()
    ordered = Simulator(lower(algo, max_tbs=132), topo).run(algo.input_size_bytes).time_us
    free = replace(algo, transfers=[replace(t, after=()) for t in algo.transfers])
    unordered = Simulator(lower(free, max_tbs=132), topo).run(algo.input_size_bytes).time_us
    assert ordered <= algo.time_us < unordered


def test_the_solver_costs_a_path_as_the_simulator_serves_it():
    # One NDv2 node, AllToAll on four channels in Simple: one V100 thread block pushes 14.9 GB/s, and a
    # single NVLink2 brick (20.7 GB/s) serves one block at a time in the calibrated model, however many
    # channels share it. Costed at the brick's 20.7 GB/s, the routing sent three relayed blocks over one
    # brick and the program ran 1.34x its schedule (437 us against 327 at 16 MiB).
    from taccl.bounds import lower_bound
    from taccl.lowering import lower
    from taccl.simulator import Simulator
    from taccl.sketch import load_sketch

    sketch = load_sketch(Path(__file__).resolve().parent.parent / "sketches" / "ndv2-single.json")
    algo = synthesize(sketch, collective="alltoall", input_size="16MiB",
                      options=SynthesisOptions(time_limit_s=30, proto="Simple", instances=4))
    topo = algo.load_topology()
    simulated = Simulator(lower(algo, topology=topo), topo).run(algo.input_size_bytes).time_us
    assert lower_bound(topo, "alltoall", algo.input_size_bytes) <= simulated <= 1.10 * algo.time_us


@pytest.mark.parametrize("sketch,collective,nodes", [("dgx2-sk-1.json", None, None),
                                                     ("dgx-h100-hier.json", "allreduce", 4),
                                                     ("ndv2-single.json", "alltoall", None)])
def test_bandwidth_rows_summed_per_resource_orbit_are_every_chunks_rows(monkeypatch, sketch, collective, nodes):
    # the routing sums one resource per orbit under the sketch's symmetry; summing every chunk's every
    # candidate link (the fallback, when the group does not map resources to resources) gives the same rows
    import taccl.routing as routing
    from taccl.sketch import load_sketch

    found = []
    by_orbit = routing.bandwidth_rows

    def both(prob, orbits, spaces, xvar):
        rows = by_orbit(prob, orbits, spaces, xvar)
        assert orbits.resource_orbit_reps([routing.resource_loads(prob, l) for l in prob.links])
        with monkeypatch.context() as m:
            m.setattr(orbits, "resource_orbit_reps", lambda loads: None)
            found.append((rows, by_orbit(prob, orbits, spaces, xvar)))
        return rows

    monkeypatch.setattr(routing, "bandwidth_rows", both)
    root = Path(__file__).resolve().parent.parent
    synthesize(load_sketch(root / "sketches" / sketch), collective=collective, nodes=nodes,
               options=SynthesisOptions(time_limit_s=10, threads=1))
    assert found and all(rows and rows == every for rows, every in found)


@pytest.mark.parametrize("sketch,collective,proto", [("dgx2-hier", "allreduce", "Simple"),
                                                     ("dgx-h100-hier", "reducescatter", "LL"),
                                                     ("ndv2-alltoall-sk-1", "alltoall", "Simple")])
def test_the_greedy_schedules_times_are_its_exact_times_without_merges(monkeypatch, sketch, collective, proto):
    # where contiguity merges nothing it reads the times off the schedule instead of recomputing them: a list
    # schedule starts each transfer as soon as its orders allow, so both must agree
    from taccl import synthesize as syn
    from taccl.contiguity import exact_times, schedule_times
    from taccl.sketch import load_sketch

    seen = []
    original = syn.contiguity

    def compare(tasks, sched, adjacent, *, fifo_depth=0, **kw):
        exact = {g.tasks[0]: g for g in exact_times(tasks, sched, set(), fifo_depth).groups}
        read = schedule_times(tasks, sched)
        assert sorted(len(g.tasks) for g in read.groups) == [1] * len(tasks)
        for g in read.groups:
            e = exact[g.tasks[0]]
            assert (g.start_us, g.sent_us, g.finish_us) == pytest.approx((e.start_us, e.sent_us, e.finish_us),
                                                                          abs=1e-9)
        seen.append(len(tasks))
        return original(tasks, sched, adjacent, fifo_depth=fifo_depth, **kw)

    monkeypatch.setattr(syn, "contiguity", compare)
    root = Path(__file__).resolve().parent.parent
    synthesize(load_sketch(root / "sketches" / f"{sketch}.json"), collective=collective,
               options=SynthesisOptions(time_limit_s=10, proto=proto))
    assert seen and seen[0] > 100


def _a100_direct_allgather():
    """2x DGX A100, the flat sketch, AllGather of 64 KiB in LL: (sketch, problem)."""
    from taccl.problem import build_problem
    from taccl.sketch import load_sketch
    from taccl.synthesize import resolve

    sk = load_sketch(Path(__file__).resolve().parent.parent / "sketches" / "dgx-a100-direct.json")
    topo, coll, size_bytes = resolve(sk, input_size="64KiB")
    return sk, build_problem(topo, coll, sk, size_bytes, proto="LL")


def test_the_routing_relaxation_counts_a_resources_flight_and_a_relays_fanout():
    # 2x DGX A100, 4 KiB chunks in LL: sent straight to every remote rank, a GPU's NIC takes eight chunks
    # (2.62 us of data) and the last one still flies the NIC's 2.7 us; the relaxation said 2.95 us (one
    # chunk's path), so the routing never offloaded the NICs onto relays in the node.
    from taccl import routing

    _, prob = _a100_direct_allgather()
    nic = [l for l in prob.links if l.internode][0]
    tails = routing.resource_tails(prob)
    assert all(tails[res] == pytest.approx(nic.alpha_us) for res in nic.resources)
    direct = [{d: prob.link_index[(src, d)] for d in range(prob.num_ranks) if d != src}
              for src in (prob.collective.sources(c)[0] for c in range(prob.collective.num_chunks))]
    assert routing.relaxed_time(prob, direct) >= nic.alpha_us + 8 * nic.beta_us - 1e-9
    # a relay that forwards a chunk to two ranks pays another thread block's flag on both forwards
    src, relay, a, b = 0, 8, 9, 10
    fanned = [dict(direct[0])]
    fanned[0][a], fanned[0][b] = prob.link_index[(relay, a)], prob.link_index[(relay, b)]
    path = prob.links[fanned[0][relay]].cost_us + prob.links[fanned[0][a]].cost_us
    assert routing.relaxed_time(prob, fanned) >= path + prob.topology.spec.sync_us - 1e-9


def test_rail_relays_beat_the_direct_program_on_small_allgathers():
    # With the NIC's flight and the relays' flags in the relaxation, the routing sends part of each node's
    # chunks through one NIC and on by one fused forward each: faster than every chunk over the NIC.
    from taccl.baselines import build
    from taccl.lowering import lower
    from taccl.simulator import Simulator

    sk, prob = _a100_direct_allgather()
    algo = synthesize(sk, input_size="64KiB", options=SynthesisOptions(time_limit_s=30, proto="LL", instances=4))
    forwards = {}  # (chunk, relay) -> ranks it forwards the chunk to
    for t in algo.transfers:
        for c in t.chunks:
            if t.src not in prob.collective.sources(c):
                forwards[(c, t.src)] = forwards.get((c, t.src), 0) + 1
    assert forwards and max(forwards.values()) == 1
    topo = algo.load_topology()
    size = algo.input_size_bytes
    synthesized = Simulator(lower(algo, topology=topo), topo).run(size).time_us
    direct = Simulator(build("direct", topo, "allgather", proto="LL", instances=4), topo).run(size).time_us
    assert synthesized < 0.97 * direct, (synthesized, direct)


@pytest.mark.parametrize("direction", ["both", "forward"])
def test_a_forward_ring_sums_each_chunk_around_the_ring(tmp_path, direction):
    # On a switch, a ring sketch limits the links to ring neighbours; "forward" to the next GPU only, as NCCL's
    # rings: every partial sum then travels the three hops to its owner, gaining one input per hop, so nothing
    # is ever landed aside to be summed later (no transfer into a rank that already holds its own partial sum
    # of that chunk from another neighbour).
    ring = [0, 2, 1, 3]
    algo = solve(switch4(tmp_path), "reducescatter", 4000,
                 intranode_sketch={"strategy": "ring", "ring": ring, "ring_direction": direction})
    verify(algo, algo.make_collective())
    following = {ring[i]: ring[(i + 1) % 4] for i in range(4)}
    forward = [t.dst == following[t.src] for t in algo.transfers]
    assert all(t.op == "reduce" for t in algo.transfers)
    if direction == "forward":
        assert all(forward) and len(algo.transfers) == 4 * 3  # each chunk: three hops
    else:
        assert not all(forward)  # the shorter way round: chunks meet at their owner from both sides


def test_a_forward_ring_allreduce_is_refused_unless_phased(tmp_path):
    # A flat AllReduce retraces its gather's routes backwards for the reduction: a one-way ring cannot hold
    # for both halves, so it is refused naming the field; as a ReduceScatter phase then an AllGather phase
    # (each on its own routes) it runs forward throughout.
    ring = {"strategy": "ring", "ring": [0, 1, 2, 3], "ring_direction": "forward"}
    with pytest.raises(UserError, match="ring_direction 'forward' cannot hold for allreduce") as err:
        solve(switch4(tmp_path), "allreduce", 4000, intranode_sketch=ring)
    assert err.value.where == "$.intranode_sketch.ring_direction"
    algo = solve(switch4(tmp_path), "allreduce", 4000, intranode_sketch=ring,
                 phases=[{"collective": "reducescatter", "groups": "node"},
                         {"collective": "allgather", "groups": "node"}])
    verify(algo, algo.make_collective())
    assert all(t.dst == (t.src + 1) % 4 for t in algo.transfers)


def test_the_shipped_forward_ring_is_nccls_ring_on_one_dgx_h100():
    # sketches/dgx-h100-ring.json: the ReduceScatter it synthesizes in LL on 32 blocks a connection runs as
    # NCCL's 32-channel ring does (the optimum at 1 MiB); the one-hop sketch lands partial sums aside and is
    # slower there (16.2 us against 14.4)
    from taccl.baselines import build
    from taccl.lowering import lower
    from taccl.sketch import load_sketch
    from taccl.simulator import Simulator

    sketch = load_sketch(Path(__file__).parent.parent / "sketches" / "dgx-h100-ring.json")
    algo = synthesize(sketch, options=SynthesisOptions(time_limit_s=30))
    topo = algo.load_topology()
    program = lower(algo, topology=topo)
    assert program.proto.value == "LL" and program.gpus[0].s_chunks == 0  # nothing lands aside
    ring = build("ring", topo, "reducescatter", proto="LL", instances=32)
    for size in (1 << 20, 4 << 20):
        ours, nccl = (Simulator(p, topo).run(size).time_us for p in (program, ring))
        assert ours == pytest.approx(nccl, rel=0.005), (size, ours, nccl)
