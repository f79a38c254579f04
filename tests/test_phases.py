"""Hierarchical, multi-phase synthesis: planning, composition errors, and programs that compute the collective."""
import json
import subprocess
from pathlib import Path

import pytest

from taccl.cli import main
from taccl.collectives import make_collective
from taccl.errors import UserError
from taccl.lowering import lower, write_program
from taccl.phases import plan_phases
from taccl.sketch import sketch_from_dict
from taccl.synthesize import SynthesisOptions, synthesize
from taccl.topology import Topology, spec_from_dict

ROOT = Path(__file__).resolve().parent.parent

# 2 GPUs per node on a switch, one NIC per GPU (rail-aligned), 3 nodes: 6 ranks.
NODE = {"name": "pair", "gpus_per_node": 2,
        "link_types": {"sw": {"alpha_us": 0.5, "bw_GBps": 10.0}, "ib": {"alpha_us": 2.0, "bw_GBps": 2.0}},
        "switches": [{"gpus": [0, 1], "type": "sw"}],
        "nics": [{"gpus": [0], "type": "ib"}, {"gpus": [1], "type": "ib"}]}


def topo_file(tmp_path):
    p = tmp_path / "pair.json"
    p.write_text(json.dumps(NODE))
    return str(p)


def sketch(tmp_path, phases="hierarchical", nodes=3, collective="allgather", **extra):
    doc = {"topology": topo_file(tmp_path), "nodes": nodes, "collective": collective, "input_size": "96K",
           "intranode_sketch": {"strategy": "switch", "switches": [[0, 1]], "switch_hyperedge_strategy": "uc-min"},
           "internode_sketch": {"strategy": "relay", "internode_conn": {"0": [0], "1": [1]}},
           "symmetry_offsets": [[1, 2], [2, 0]]}
    if phases is not None:  # None: a flat sketch
        doc["phases"] = phases
    doc.update(extra)
    return sketch_from_dict(doc, path=str(tmp_path / "hier.json"))


def plan(tmp_path, collective, **kw):
    sk = sketch(tmp_path, collective=collective, **kw)
    topo = Topology(spec_from_dict(NODE), kw.get("nodes", 3))
    return plan_phases(sk, topo, make_collective(collective, topo.num_ranks))


def assert_runs_right(program, path, size=None):
    """Write the proven `program` and run it on the host runtime (built first if needed): the right result."""
    write_program(program, path)
    r = subprocess.run(["make", "-C", str(ROOT / "runtime"), "-j2", "build/libtaccl_runtime.so"],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-2000:]
    from taccl.runtime import run_program

    report = run_program(path, size=size or program.nchunksperloop * 4 * 7, dtype="float32", op="sum")
    assert report["checked"] and report["wrong"] == 0


def test_hierarchical_phases_by_collective(tmp_path):
    steps = {c: [(p.kind, p.groups) for p in plan(tmp_path, c)]
             for c in ("allgather", "reducescatter", "allreduce", "alltoall")}
    assert steps == {"allgather": [("allgather", "rail"), ("allgather", "node")],
                     "reducescatter": [("reducescatter", "node"), ("reducescatter", "rail")],
                     "allreduce": [("reducescatter", "node"), ("allreduce", "rail"), ("allgather", "node")],
                     "alltoall": [("alltoall", "node"), ("alltoall", "rail")]}


def test_phase_collectives_move_chunks_towards_their_targets(tmp_path):
    rail, node = plan(tmp_path, "allgather")
    # rank 0's chunk 0 first reaches rank 0 of every node (ranks 2, 4), then every rank
    assert {r for c, r in rail.route_coll.postcondition if c == 0} == {0, 2, 4}
    assert {r for c, r in node.route_coll.precondition if c == 0} == {0, 2, 4}
    assert {r for c, r in node.route_coll.postcondition if c == 0} == set(range(6))
    rs_node, rs_rail = plan(tmp_path, "reducescatter")
    # chunk 3 belongs to rank 3 (node 1, GPU 1): each node first reduces it into its GPU 1
    assert {r for c, r in rs_node.task_coll.postcondition if c == 3} == {1, 3, 5}
    assert {r for c, r in rs_rail.task_coll.postcondition if c == 3} == {3}


@pytest.mark.parametrize("collective", ["allgather", "reducescatter", "allreduce", "alltoall"])
def test_hierarchical_programs_are_proven_and_compute_the_collective(tmp_path, collective):
    algo = synthesize(sketch(tmp_path, collective=collective), options=SynthesisOptions(time_limit_s=20))
    assert [s["stage"] for s in algo.stages] == ["routing", "ordering", "contiguity"]
    assert len(algo.stages[0]["phases"]) == (3 if collective == "allreduce" else 2)
    program = lower(algo)  # proven by the checker, or it raises
    assert_runs_right(program, tmp_path / f"{collective}.xml")


def test_a_pair_exchanges_its_partial_sums(tmp_path):
    # on two nodes a rail holds two ranks: each sends its partial sum to the other and adds the one it gets
    # (one network crossing on the critical path instead of a reduction and the sum sent back); three nodes
    # keep the reduction to one rank and the broadcast
    assert [p.task_coll.form for p in plan(tmp_path, "allreduce", nodes=2)] == ["", "exchange", ""]
    assert [p.task_coll.form for p in plan(tmp_path, "allreduce", nodes=3)] == ["", "", ""]
    algo = synthesize(sketch(tmp_path, collective="allreduce", nodes=2), options=SynthesisOptions(time_limit_s=20))
    net = [t for t in algo.transfers if t.link == "ib"]
    assert net and all(t.op == "reduce" for t in net)
    pairs = {(t.src, t.dst, t.chunks) for t in net}
    assert all((d, s, c) in pairs for s, d, c in pairs)
    program = lower(algo)  # proven by the checker, or it raises
    assert_runs_right(program, tmp_path / "allreduce.xml")


def test_an_allreduce_past_the_node_limit_sends_node_phase_blocks_as_one(tmp_path, monkeypatch):
    # a phased AllReduce lays its buffer out by local index: the pieces GPU 1 of every node sums sit side by
    # side; where one transfer a step would pass the executor's XML node limit, a connection's transfers of
    # consecutive pieces that could start together are merged greedily into one send. The algorithm is
    # verified, the program proven and its sum right.
    import taccl.synthesize as synthesize_mod
    from taccl.algorithm import Algorithm

    coll = make_collective("allreduce", 6, local_blocks=2)
    assert [coll.input_index[(c, 0)] for c in range(6)] == [0, 3, 1, 4, 2, 5]  # ranks 1, 3, 5: places 3-5
    assert coll.output_index == coll.input_index
    with pytest.raises(UserError, match="local_blocks 2 applies to an AllReduce"):
        make_collective("allgather", 6, local_blocks=2)
    plain = synthesize(sketch(tmp_path, collective="allreduce"), options=SynthesisOptions(time_limit_s=20))
    assert plain.collective["local_blocks"] == 2 and plain.stages[2]["status"] != "greedy"
    monkeypatch.setattr(synthesize_mod, "MAX_NODES", 20)
    algo = synthesize(sketch(tmp_path, collective="allreduce"), options=SynthesisOptions(time_limit_s=20))
    assert algo.stages[2]["status"] == "greedy" and len(algo.transfers) < len(plain.transfers)
    node_sends = [t for t in algo.transfers if t.link == "sw"]
    assert max(len(t.chunks) for t in node_sends) == 3  # a node's three pieces for one GPU, one send
    assert Algorithm.from_json(algo.to_json()).make_collective().local_blocks == 2
    program = lower(algo)  # proven by the checker, or it raises
    assert any(s.cnt > 1 for g in program.gpus for tb in g.threadblocks for s in tb.steps)
    assert_runs_right(program, tmp_path / "allreduce.xml")


def test_phases_are_composed_chunk_by_chunk(tmp_path):
    """A chunk's node phase starts as soon as that chunk crossed the network, not after the whole rail phase."""
    algo = synthesize(sketch(tmp_path, collective="allgather"), options=SynthesisOptions(time_limit_s=20))
    net = [t for t in algo.transfers if t.link == "ib"]
    intra = [t for t in algo.transfers if t.link == "sw" and any(d in {n.id for n in net} for d in t.deps)]
    assert intra and min(t.send_us for t in intra) < max(t.arrive_us for t in net)


def test_phases_that_do_not_make_up_the_collective(tmp_path):
    with pytest.raises(UserError, match=r"\$\.phases: the phases do not make up allgather: after the last phase"):
        plan(tmp_path, "allgather", phases=[{"collective": "allgather", "groups": "node"}])
    with pytest.raises(UserError, match=r"\$\.phases\[1\]\.collective: a reducescatter phase cannot be part of a "
                                        r"allgather"):
        plan(tmp_path, "allgather", phases=[{"collective": "allgather", "groups": "rail"},
                                            {"collective": "reducescatter", "groups": "node"}])
    # a reduction after an allreduce phase: these compose, but the synthesis summed the node sums twice
    for phases in ([{"collective": "allreduce", "groups": "node"}, {"collective": "allreduce", "groups": "rail"}],
                   [{"collective": "allreduce", "groups": "rail"}, {"collective": "allreduce", "groups": "node"}],
                   [{"collective": "allreduce", "groups": "node"}, {"collective": "reducescatter", "groups": "rail"},
                    {"collective": "allgather", "groups": "rail"}]):
        with pytest.raises(UserError, match=r"\$\.phases\[1\]\.collective: an? \w+ phase after the allreduce phase "
                                            r"\$\.phases\[0\] is not supported"):
            plan(tmp_path, "allreduce", phases=phases)
    with pytest.raises(UserError, match=r"\$\.phases: the sketch gives phases for allgather, not alltoall"):
        plan(tmp_path, "alltoall", phases={"allgather": [{"collective": "allgather", "groups": "all"}]})


def test_phase_that_does_not_fit_the_topology(tmp_path):
    with pytest.raises(UserError, match=r"\$\.phases\[0\]\.groups: a rail phase needs several nodes"):
        plan(tmp_path, "allgather", nodes=1, phases=[{"collective": "allgather", "groups": "rail"}])
    # a phase's own sketch is checked where the phase writes it
    bad = [{"collective": "allgather", "groups": "rail"},
           {"collective": "allgather", "groups": "node",
            "intranode_sketch": {"strategy": "switch", "switches": [[0, 7]]}}]
    with pytest.raises(UserError, match=r"\$\.phases\[1\]\.intranode_sketch\.switches\[0\]: GPU 7 is not in a 2-GPU node"):
        synthesize(sketch(tmp_path, phases=bad), options=SynthesisOptions(time_limit_s=5))
    no_rail = sketch(tmp_path, internode_sketch={"strategy": "relay", "internode_conn": {"0": [1], "1": [0]}})
    with pytest.raises(UserError, match=r"\$\.internode_sketch\.internode_conn: a rail phase needs inter-node links"):
        synthesize(no_rail, options=SynthesisOptions(time_limit_s=5))


def test_cli_refuses_bad_phases_and_writes_nothing(tmp_path, capsys):
    doc = {"topology": topo_file(tmp_path), "nodes": 3, "collective": "allgather",
           "phases": [{"collective": "allgather", "groups": "node"}]}
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(doc))
    out = tmp_path / "out"
    assert main(["solve", str(path), "-o", str(out), "-q"]) == 2
    err = capsys.readouterr().err
    assert "bad.json: $.phases: the phases do not make up allgather" in err and "Traceback" not in err
    assert not out.exists() or not any(out.iterdir())
    doc["phases"] = [{"collective": "allgather", "groups": "rails"}]
    path.write_text(json.dumps(doc))
    assert main(["solve", str(path), "-o", str(out), "-q"]) == 2
    assert "$.phases" in capsys.readouterr().err


@pytest.mark.parametrize("name", ["dgx-h100-hier", "dgx-a100-hier", "dgx2-hier", "ndv2-hier"])
def test_shipped_hierarchical_sketches_plan_every_collective(name):
    from taccl.sketch import load_sketch
    from taccl.synthesize import build_problems, resolve

    sk = load_sketch(ROOT / "sketches" / f"{name}.json")
    for nodes in (2, 4):
        for coll in ("allgather", "reducescatter", "allreduce", "alltoall"):
            topo, c, size = resolve(sk, nodes=nodes, collective=coll)
            assert len(build_problems(sk, topo, c, size)) >= 2


def test_one_shot_allreduce_layout():
    """Chunk r*k+i of a one-shot AllReduce is piece i of the whole buffer, summed at rank r."""
    coll = make_collective("allreduce", 4, 2, form="one-shot")
    assert (coll.num_chunks, coll.input_chunks, coll.output_chunks) == (8, 2, 2)
    assert coll.input_index[(5, 0)] == 1 and coll.output_index[(5, 2)] == 1
    assert {r for c, r in coll.postcondition if c == 5} == {2}
    assert make_collective("allreduce", 4, 2, form="reduce-broadcast").form == ""
    with pytest.raises(UserError, match="a allgather has no form 'one-shot'"):
        make_collective("allgather", 4, 1, form="one-shot")


@pytest.mark.parametrize("phases", ["hierarchical", None], ids=["node-then-rail", "flat"])
def test_one_shot_allreduce_is_proven_and_computes_the_sum(tmp_path, phases):
    """Every rank's buffer reduced towards every rank, no sum sent back: proven, right on the host runtime."""
    sk = sketch(tmp_path, phases=phases, collective="allreduce", hyperparameters={"allreduce": "one-shot"})
    algo = synthesize(sk, options=SynthesisOptions(time_limit_s=20))
    assert algo.make_collective().form == "one-shot"
    assert all(t.op == "reduce" for t in algo.transfers)  # one pass: nothing is copied back
    if phases:
        assert [p["phase"] for p in algo.stages[0]["phases"]] == ["reducescatter/node", "reducescatter/rail"]
    program = lower(algo, proto="LL")
    assert program.nchunksperloop == 1 and program.collective == "allreduce"
    assert_runs_right(program, tmp_path / "one-shot.xml", size=4 * 48)


def test_one_shot_allreduce_takes_reduce_scatter_phases_only(tmp_path):
    with pytest.raises(UserError, match=r"\$\.phases\[0\]\.collective: a allgather phase cannot be part of a one-shot "
                                        r"allreduce; allowed: reducescatter"):
        plan_phases(sketch(tmp_path, collective="allreduce", hyperparameters={"allreduce": "one-shot"},
                           phases=[{"collective": "allgather", "groups": "node"}]),
                    Topology(spec_from_dict(NODE), 3), make_collective("allreduce", 6, form="one-shot"))
    with pytest.raises(UserError, match=r"hyperparameters\.allreduce"):
        sketch(tmp_path, collective="allreduce", hyperparameters={"allreduce": "two-shot"})


EXCHANGE = [{"collective": "reducescatter", "groups": "node"},
            {"collective": "allreduce", "groups": "rail", "exchange": True},
            {"collective": "allgather", "groups": "node"}]


def _network_crossings(algo) -> int:
    by_id, depth = {t.id: t for t in algo.transfers}, {}

    def crossings(t):
        if t.id not in depth:
            depth[t.id] = (t.link == "ib") + max((crossings(by_id[d]) for d in t.deps), default=0)
        return depth[t.id]

    return max(crossings(t) for t in algo.transfers)


def test_a_group_of_any_size_exchanges_when_the_phase_says_so(tmp_path):
    # three nodes: each rail member sends its node's partial sum to both others and adds the two it gets (one
    # network crossing where the reduction to one member and the sum sent back take two)
    assert [p.task_coll.form for p in plan(tmp_path, "allreduce", phases=EXCHANGE)] == ["", "exchange", ""]
    options = SynthesisOptions(time_limit_s=20, proto="LL")
    algo = synthesize(sketch(tmp_path, collective="allreduce", phases=EXCHANGE, input_size="6K"), options=options)
    net = [t for t in algo.transfers if t.link == "ib"]
    assert net and all(t.op == "reduce" and len(t.exchange) == 2 for t in net)
    assert {(t.src, t.dst) for t in net} == {(a, b) for a in range(6) for b in range(6) if a % 2 == b % 2 and a != b}
    assert_runs_right(lower(algo), tmp_path / "exchange.xml")  # proven by the checker, or lower raises
    hier = synthesize(sketch(tmp_path, collective="allreduce", input_size="6K"), options=options)
    assert (_network_crossings(algo), _network_crossings(hier)) == (1, 2)  # on the longest chain of transfers
    with pytest.raises(UserError, match=r"hier\.json: \$\.phases\[0\]\.exchange: only an allreduce phase"):
        plan(tmp_path, "allreduce", phases=[dict(EXCHANGE[0], exchange=True)] + EXCHANGE[1:])


def test_an_exchange_over_a_shared_nic_is_right_whatever_the_timing():
    # 2x NDv2 (one NIC per node for eight GPUs): the schedule sends some swapped sums only after the other
    # side's has landed; each still sends its own node's sum (`Transfer.exchange`), so the synthesis is
    # proven and lowers to a proven program (these syntheses failed their proof before)
    sk = sketch_from_dict(json.loads((ROOT / "sketches" / "ndv2-hier.json").read_text()),
                          path=str(ROOT / "sketches" / "ndv2-hier.json"))
    algo = synthesize(sk, nodes=2, collective="allreduce", input_size=1 << 20,
                      options=SynthesisOptions(proto="Simple", time_limit_s=20))
    by_id = {t.id: t for t in algo.transfers}
    swapped = [t for t in algo.transfers if t.exchange]
    assert swapped and all(t.link == "ib" and t.op == "reduce" for t in swapped)
    assert any(by_id[p].send_us > t.arrive_us for t in swapped for p in t.exchange)
    lower(algo)  # proven by the checker, or it raises


TWO_ROUTES = {
    # piece 0 of each chunk reduced inside the node and then over the rails, piece 1 the other way round
    "reducescatter": [{"collective": "reducescatter", "groups": "node", "parts": [0]},
                      {"collective": "reducescatter", "groups": "rail"},
                      {"collective": "reducescatter", "groups": "node", "parts": [1]}],
    "allgather": [{"collective": "allgather", "groups": "rail", "parts": [0]},
                  {"collective": "allgather", "groups": "node"},
                  {"collective": "allgather", "groups": "rail", "parts": [1]}],
}


@pytest.mark.parametrize("collective", sorted(TWO_ROUTES))
def test_pieces_of_a_chunk_take_two_routes(tmp_path, collective):
    sk = sketch(tmp_path, phases=TWO_ROUTES[collective], collective=collective, nodes=2,
                hyperparameters={"input_chunkup": 2})
    topo = Topology(spec_from_dict(NODE), 2)
    coll = make_collective(collective, topo.num_ranks, 2)
    first, middle, last = plan_phases(sk, topo, coll)
    pieces = lambda phase: {coll.labels[c][-1] for c, _ in phase.task_coll.precondition}  # noqa: E731
    assert (pieces(first), pieces(middle), pieces(last)) == ({0}, {0, 1}, {1})
    algo = synthesize(sk, options=SynthesisOptions(time_limit_s=20))
    program = lower(algo)  # proven by the checker, or it raises
    assert_runs_right(program, tmp_path / f"{collective}.xml")


def test_pieces_that_do_not_exist_or_miss_a_route(tmp_path):
    two = {"hyperparameters": {"input_chunkup": 2}}
    with pytest.raises(UserError, match=r"\$\.phases\[2\]\.parts\[1\]: piece 2 does not exist: each chunk is cut "
                                        r"into 2 pieces \(input_chunkup\), numbered 0 to 1"):
        plan_phases(sketch(tmp_path, phases=[*TWO_ROUTES["reducescatter"][:2],
                                             {"collective": "reducescatter", "groups": "node", "parts": [1, 2]}],
                           collective="reducescatter", nodes=2, **two),
                    Topology(spec_from_dict(NODE), 2), make_collective("reducescatter", 4, 2))
    # piece 1 is never reduced inside the node: its owner lacks the other GPU's contributions
    with pytest.raises(UserError, match=r"\$\.phases: the phases do not make up reducescatter: chunk 1 on rank 0 "
                                        r"is not the full sum \(ranks \[1, 3\] are missing\)"):
        plan_phases(sketch(tmp_path, phases=TWO_ROUTES["reducescatter"][:2], collective="reducescatter", nodes=2,
                           **two), Topology(spec_from_dict(NODE), 2), make_collective("reducescatter", 4, 2))
    with pytest.raises(UserError, match=r"\$\.phases\[0\]\.parts\[0\]: -1 is less than the minimum of 0"):
        sketch(tmp_path, phases=[{"collective": "reducescatter", "groups": "node", "parts": [-1]}])
