"""`taccl solve` end to end, every shipped sketch and topology, and every bad input's message."""
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from taccl.cli import main
from taccl.errors import UserError
from taccl.problem import build_problem
from taccl.sketch import load_sketch
from taccl.synthesize import resolve
from taccl.topology import builtin_names, load_topology

ROOT = Path(__file__).resolve().parent.parent
SHARED = ROOT.parent / "shared" / "data" / "taccl-examples"


@pytest.mark.parametrize("path", sorted((ROOT / "sketches").glob("*.json")), ids=lambda p: p.stem)
def test_every_shipped_sketch_builds_its_problem(path):
    sk = load_sketch(path)
    topo, coll, size = resolve(sk)
    prob = build_problem(topo, coll.dual() if coll.combining else coll, sk, size)
    assert prob.links and len(prob.group) >= 1


@pytest.mark.parametrize("name", [n for n in builtin_names() if n != "torus-RxC"] + ["torus-6x8", "torus-2x2"])
def test_every_topology_loads(name):
    topo = load_topology(name)
    assert topo.num_ranks >= 2
    assert all(l.cost_us(1e6) > 0 for l in topo.intra_node_links())


@pytest.mark.skipif(not SHARED.is_dir(), reason="shared data not present")
@pytest.mark.parametrize("name", ["sk1-dgx2-n2", "sk1-ndv2-n2", "sk2-ndv2-n2"])
def test_reference_sketches_load_unchanged(name, tmp_path):
    topo = "dgx2" if "dgx2" in name else "ndv2"
    rc = main(["solve", str(SHARED / f"{name}.json"), "--topology", topo, "--no-xml", "-q", "-o", str(tmp_path)])
    assert rc == 0
    doc = json.loads((tmp_path / f"{name}.algo.json").read_text())
    assert doc["transfers"] and doc["time_us"] >= doc["lower_bound_us"] > 0


def test_solve_writes_algorithm_with_stage_statistics(tmp_path, capsys):
    rc = main(["solve", str(ROOT / "sketches" / "ndv2-sk-1.json"), "--no-xml", "--json", "-o", str(tmp_path)])
    assert rc == 0
    summary = json.loads(capsys.readouterr().out)
    doc = json.loads((tmp_path / "ndv2-sk-1.algo.json").read_text())
    assert summary["time_us"] == pytest.approx(doc["time_us"]) and summary["simulated_us"] is None  # no XML
    assert summary["elapsed_s"] > 0 and summary["peak_memory_mb"] > 10  # a Python process with HiGHS loaded
    stages = {s["stage"]: s for s in doc["stages"]}
    assert set(stages) == {"routing", "ordering", "contiguity"}
    for key in ("variables", "constraints", "binaries", "time_s", "status", "gap"):
        assert key in stages["routing"]
    t = doc["transfers"][0]
    assert {"chunks", "src", "dst", "send_us", "arrive_us", "op", "deps"} <= set(t)


def test_an_output_ending_in_xml_names_the_program_as_lower_and_baseline_take_it(tmp_path, capsys):
    sketch = str(ROOT / "sketches" / "ndv2-single.json")
    assert main(["solve", sketch, "-q", "-o", str(tmp_path / "new" / "ag.xml")]) == 0
    assert sorted(p.name for p in (tmp_path / "new").iterdir()) == ["ag.algo.json", "ag.xml"]
    assert main(["solve", sketch, "-q", "-o", str(tmp_path / "upper" / "ag.XML")]) == 0  # was written ag.xml
    assert sorted(p.name for p in (tmp_path / "upper").iterdir()) == ["ag.XML", "ag.algo.json"]
    # an existing directory keeps its meaning, whatever its name
    (tmp_path / "d.xml").mkdir()
    assert main(["solve", sketch, "-q", "--no-xml", "-o", str(tmp_path / "d.xml")]) == 0
    assert [p.name for p in (tmp_path / "d.xml").iterdir()] == ["ndv2-single.algo.json"]
    capsys.readouterr()
    for argv, needle in ((["-o", str(tmp_path / "x.xml"), "--name", "y"], "-o: names the program's file (x.xml)"),
                         (["-o", str(tmp_path / ".xml")], "-o: expected the program's file name before .xml")):
        assert main(["solve", sketch, "-q", *argv]) == 2
        err = capsys.readouterr().err
        assert needle in err and err.count("\n") == 1, err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["d.xml", "new", "upper"]  # nothing written on an error


def test_a_topology_without_calibration_is_said_to_be_so_wherever_its_times_are_shown(tmp_path, capsys):
    """mi300x carries raw alpha-beta costs only: solve, simulate and a batch report say its times are not
    calibrated; a calibrated topology's are shown without a note."""
    from taccl.batch.report import render
    from taccl.topology import load_spec

    sketch = tmp_path / "mi.json"
    sketch.write_text(json.dumps({"name": "mi", "topology": "mi300x", "collective": "allgather",
                                  "input_size": "64K", "intranode_sketch": {"strategy": "none"}}))
    assert main(["solve", str(sketch), "--json", "-o", str(tmp_path / "mi.xml")]) == 0
    note = json.loads(capsys.readouterr().out)["uncalibrated"]
    assert note.startswith("topology mi300x is not calibrated (link types roce, xgmi without calibrated protocol "
                           "costs; no per-call cost)")
    assert main(["simulate", str(tmp_path / "mi.xml"), "--topology", "mi300x", "--sizes", "64K"]) == 0
    assert f"# note: {note}\n" in capsys.readouterr().out
    assert load_spec("ndv2").calibration_note() is None and load_spec("dgx-h100").calibration_note() is None

    class Sku:  # what the report reads of a SKU
        spec, nodes, collectives, solver, time_limit_s, stall_s, path = (
            load_spec("mi300x"), [1], ["allgather"], "highs", 30.0, 0.0, "mi.yaml")

    from taccl.batch.selection import Selection

    text = render(Selection(sku="mi", topology="mi300x", grid=[1024], groups=[], jobs=[], tool="t",
                            target="rccl"), Sku, plots=False)
    assert f"**Caution**: {note}." in text


def test_json_on_stdout_is_all_that_a_fresh_process_prints_there(tmp_path):
    # highspy's constructor prints HiGHS's banner on the process's stdout, once per process (so only a
    # fresh process shows it): it preceded the JSON
    out = subprocess.run([sys.executable, "-m", "taccl.cli", "solve", str(ROOT / "sketches" / "ndv2-sk-1.json"),
                          "--no-xml", "--json", "-o", str(tmp_path)], capture_output=True, text=True, check=True)
    assert json.loads(out.stdout)["name"] == "ndv2-sk-1"


def write(tmp_path, doc, name="bad.json"):
    p = tmp_path / name
    p.write_text(doc if isinstance(doc, str) else json.dumps(doc))
    return str(p)


GOOD = {"topology": "ndv2", "nodes": 2, "collective": "allgather", "input_size": "1M",
        "internode_sketch": {"strategy": "relay", "internode_conn": {"0": [1]}}}


def variant(**changes):
    doc = json.loads(json.dumps(GOOD))
    for k, v in changes.items():
        doc[k] = v
    return doc


BAD = [
    ("malformed", '{"topology": "ndv2",\n "nodes": }', ["bad.json", "line 2"]),
    ("schema", variant(nodes="two"), ["$.nodes", "is not of type"]),
    ("unknown-key", variant(colective="allgather"), ["Additional properties"]),
    ("rank-outside", variant(internode_sketch={"strategy": "relay", "internode_conn": {"9": [1]}}),
     ["internode_conn", "GPU 9", "8-GPU node"]),
    ("switch-without-links", variant(intranode_sketch={"strategy": "switch", "switches": [[0, 5, 6]]}),
     ["switches[0]", "no physical path"]),
    ("relay-disconnects", variant(internode_sketch={"strategy": "relay", "internode_conn": {"0": [1]},
                                                    "gpus_to_sender_rev_map": {"0": [0]}}),
     ["chunk 1 (from rank 1) cannot reach rank 8"]),
    ("unknown-collective", variant(collective="allsome"), ["bad.json", "$.collective", "unknown collective 'allsome'"]),
    ("unknown-topology", variant(topology="dgx-9000"), ["unknown topology 'dgx-9000'", "$.topology"]),
    ("bad-symmetry", variant(symmetry_offsets=[[1, 8]]), ["$.symmetry_offsets[0]", "not a symmetry", "rotation maps link 0->1"]),
    ("symmetry-size", variant(symmetry_offsets=[[1, 7]]), ["does not divide the 16 ranks of 2 node(s)"]),
    ("symmetry-at-node-count", variant(nodes=3, symmetry_offsets=[[8, 16]]),
     ["$.symmetry_offsets[0]", "24 ranks of 3 node(s) of 8 GPUs", "a multiple of 16", "group size 0"]),
    ("bad-size", variant(input_size="lots"), ["$.input_size", "expected a size"]),
    ("no-nics", variant(topology="torus-2x2"), ["has no NICs", "cannot span 2 nodes"]),
    # what a fuzz of the command line found: errors that named no file, or the wrong place, or none
    ("root-outside", variant(collective={"name": "broadcast", "root": 99}),
     ["bad.json: $.collective.root: root 99 is not a rank of the 16 ranks"]),
    ("beta-split-gpu", variant(internode_sketch={"strategy": "relay", "internode_conn": {"0": [1]},
                                                 "beta_split": {"9": 2}}),
     ["$.internode_sketch.beta_split.9", "GPU 9 is not in a 8-GPU node"]),
    ("beta-split-huge", variant(internode_sketch={"strategy": "relay", "internode_conn": {"0": [1]},
                                                  "beta_split": {"0": 1e300}}),
     ["$.internode_sketch.beta_split.0", "greater than the maximum of 1024"]),
    # a share below 1 multiplied the NIC's bandwidth (0.01: a schedule at 0.03x the bound, the program 2.9x slower)
    ("beta-split-below-one", variant(internode_sketch={"strategy": "relay", "beta_split": {"0": 0.5}}),
     ["$.internode_sketch.beta_split.0", "less than the minimum of 1"]),
    # a key past the node named local GPU 1 of the next node, which then sent off-node
    ("sender-map-gpu", variant(internode_sketch={"strategy": "relay", "gpus_to_sender_rev_map": {"0": [0, 1], "9": [0]}}),
     ["$.internode_sketch.gpus_to_sender_rev_map.9", "GPU 9 (key) is not in a 8-GPU node"]),
    ("size-twice", variant(hyperparameters={"input_size": "2M"}), ["$.hyperparameters.input_size", "given twice"]),
    ("size-below-chunks", variant(input_size=7),
     ["$.input_size", "7 bytes are less than a byte for each of the 16 chunks", "at least 16 bytes"]),
    ("name-a-path", variant(name="../../x"), ["bad.json: $.name: '../../x' is not a file name"]),
    ("name-empty", variant(name=""), ["bad.json: $.name: '' should be non-empty"]),  # fell back to the file's
    ("solver-threads", variant(solver={"threads": 100000}), ["$.solver.threads", "greater than the maximum of 1024"]),
    ("ring-direction-without-ring", variant(intranode_sketch={"strategy": "direct", "ring_direction": "forward"}),
     ["$.intranode_sketch.ring_direction", "applies to strategy 'ring', not 'direct'"]),
    # JSON Schema takes 2.0 for an integer; the code that counted with it raised a TypeError
    ("integer-as-float", variant(nodes=2.0), ["bad.json: $.nodes: 2.0 is not of type 'integer'"]),
    ("offset-as-float", variant(symmetry_offsets=[[8.0, 16]]), ["$.symmetry_offsets[0][0]: 8.0 is not of type"]),
    ("ring-forward-allreduce", variant(collective="allreduce", intranode_sketch={
        "strategy": "ring", "ring": [0, 1, 2, 3, 4, 5, 6, 7], "ring_direction": "forward"}),
     ["$.intranode_sketch.ring_direction", "cannot hold for allreduce"]),
]


@pytest.mark.parametrize("case,doc,needles", BAD, ids=[b[0] for b in BAD])
def test_bad_input_gets_one_clear_message(tmp_path, capsys, case, doc, needles):
    sketch = write(tmp_path, doc)
    out = tmp_path / "out"
    rc = main(["solve", sketch, "-o", str(out), "--no-xml", "-q"])
    err = capsys.readouterr().err
    assert rc == 2
    assert "Traceback" not in err
    assert err.count("\n") == 1, err
    for needle in needles:
        assert needle in err
    assert not out.exists() or not any(out.iterdir())  # no partial output


def test_a_problem_over_the_memory_limit_is_refused_before_any_solver_runs(monkeypatch, tmp_path, capsys):
    from taccl import synthesize as syn

    def no_routing(*a, **kw):
        raise AssertionError("the routing solver ran")

    monkeypatch.setattr(syn, "route", no_routing)
    out = tmp_path / "out"
    rc = main(["solve", str(ROOT / "sketches" / "dgx-h100-n128.json"), "--max-memory", "2G", "-o", str(out)])
    err = capsys.readouterr().err
    assert rc == 2 and "Traceback" not in err
    assert "allgather on 1024 ranks" in err and "1,047,552 transfers" in err and "--max-memory" in err
    assert not out.exists()


def test_the_fewest_transfers_a_collective_needs():
    from taccl.budget import min_transfers
    from taccl.collectives import make_collective

    # each rank lacks 7 chunks (AllToAll: 7 of its 8); a sum gathers 7 contributions, AllReduce sends it on
    # to 7 ranks; one root sends or receives 7
    expected = {"allgather": 56, "alltoall": 56, "reducescatter": 56, "allreduce": 112, "broadcast": 7,
                "reduce": 7}
    assert {n: min_transfers(make_collective(n, 8, 1, root=0)) for n in expected} == expected
    assert min_transfers(make_collective("allgather", 8, 4)) == 4 * 56


def test_missing_file_and_bad_option(tmp_path, capsys):
    assert main(["solve", str(tmp_path / "nope.json")]) == 2
    assert "file not found" in capsys.readouterr().err
    assert main(["solve", write(tmp_path, GOOD), "--time-limit", "-1"]) == 2
    assert "--time-limit" in capsys.readouterr().err
    assert main(["solve", write(tmp_path, GOOD), "--stall", "-1"]) == 2
    assert "--stall" in capsys.readouterr().err


def test_solver_limits_come_from_the_command_line_then_the_sketch_then_the_defaults(monkeypatch, tmp_path):
    from taccl import routing, synthesize as syn

    seen = []
    real = routing.milp.solve

    def spy(model, name="highs", options=None):
        seen.append((options.time_limit_s, options.stall_s))
        return real(model, name, options)

    monkeypatch.setattr(routing.milp, "solve", spy)
    doc = dict(GOOD, solver={"time_limit_s": 7, "stall_s": 0})
    sketch = load_sketch(write(tmp_path, doc, "limits.json"))
    syn.synthesize(sketch)
    assert seen[0] == (7, None)  # the sketch's; stall 0: no stall limit
    seen.clear()
    syn.synthesize(sketch, options=syn.SynthesisOptions(time_limit_s=9, stall_s=2))
    assert seen[0] == (9, 2)
    seen.clear()
    syn.synthesize(load_sketch(write(tmp_path, GOOD, "plain.json")))
    assert seen[0] == (syn.DEFAULT_TIME_LIMIT_S, syn.DEFAULT_STALL_S)


def test_solver_without_solution_falls_back_to_heuristic(monkeypatch, tmp_path):
    from taccl import routing, solver

    def nothing(model, name="highs", options=None):
        return solver.Result(status="no_solution", values=None, objective=None, bound=None, gap=None, time_s=0.0, solver=name)

    monkeypatch.setattr(routing.milp, "solve", nothing)
    from taccl.synthesize import synthesize

    algo = synthesize(load_sketch(write(tmp_path, GOOD, "ok.json")))
    assert algo.stages[0]["status"] == "no_solution"
    assert any("heuristic" in n for n in algo.notes)


def test_solved_program_serves_in_place_calls_when_proven(tmp_path, capsys):
    rc = main(["solve", str(ROOT / "sketches" / "ndv2-single.json"), "--json", "-o", str(tmp_path)])
    assert rc == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["inplace"] is True
    from taccl.simulator import simulate
    from taccl.topology import load_topology
    from taccl.xmlio import read_program

    prog = read_program(tmp_path / "ndv2-single.xml")
    assert prog.inplace and prog.outofplace
    # the written program's time on the calibrated simulator, beside the schedule's
    size = json.loads((tmp_path / "ndv2-single.algo.json").read_text())["input_size_bytes"]
    assert summary["simulated_us"] == pytest.approx(simulate(prog, load_topology("ndv2", 1), size).time_us)
    # an AllToAll program cannot run in place (a rank overwrites blocks it has yet to send)
    rc = main(["solve", str(ROOT / "sketches" / "ndv2-single.json"), "--collective", "alltoall", "--json",
               "-o", str(tmp_path), "--time-limit", "5"])
    assert rc == 0 and json.loads(capsys.readouterr().out)["inplace"] is False


def test_solve_reports_what_each_long_stage_is_doing(tmp_path, capsys):
    rc = main(["solve", str(ROOT / "sketches" / "ndv2-single.json"), "-o", str(tmp_path)])
    assert rc == 0
    err = capsys.readouterr().err
    for line in ("routing:", "ordering:", " distinct programs, ranked on the simulator", "simulated: ",
                 "lowering: proving the fastest (policy", "proving it for in-place calls", "finished in"):
        assert line in err, line


def test_a_progress_meter_estimates_the_time_left_from_the_pace_so_far():
    import io
    import time

    from taccl.progress import Reporter

    out = io.StringIO()
    meter = Reporter(stream=out).progress("ordering", 400, "transfers", every_s=0)
    meter.update(0)  # nothing done: no pace to estimate from
    time.sleep(0.2)
    meter.update(100)
    meter.update(400)  # done: the stage's own line says so
    lines = out.getvalue().splitlines()
    # 300 transfers left at the pace of 100 in (at least) 0.2 s: (at least) 0.6 s, printed rounded
    assert len(lines) == 1 and re.search(r"ordering: 100/400 transfers \(25%\), about [1-9]\d* s left", lines[0])
    quiet = Reporter(quiet=True, stream=out).progress("x", 2, "items", every_s=0)
    quiet.update(1)
    assert out.getvalue().splitlines() == lines
    slow = Reporter(stream=out).progress("x", 2, "items", every_s=60)
    slow.update(1)  # not a minute yet
    assert out.getvalue().splitlines() == lines


def test_sizes_are_read_as_nccl_tests_reads_them_and_printed_unambiguously(capsys):
    from taccl.units import format_size, parse_size, parse_size_range

    for text in ("1M", "1m", "1MB", "1MiB", "1048576", 1 << 20, "0.0009765625G", "1024K"):
        assert parse_size(text) == 1 << 20, text
    assert parse_size("64KiB") == parse_size("64K") == 65536 and parse_size("1G") == 1 << 30
    assert parse_size_range("1K:4K") == [1024, 2048, 4096] and parse_size("0.5M") == 1 << 19
    for bad in ("1iB", "1.5", "M", "-1K", "1.5B"):
        with pytest.raises(UserError):
            parse_size(bad)
    assert [format_size(n) for n in (1 << 20, 1536, 10 ** 6, 3 << 29)] == ["1MiB", "1536B", "1000000B", "1536MiB"]
    for command in ("solve", "simulate", "run", "lower"):
        with pytest.raises(SystemExit):
            main([command, "--help"])
        assert "powers of 1024 as in nccl-tests" in " ".join(capsys.readouterr().out.split()), command


def test_written_files_honour_the_umask_and_keep_a_replaced_files_mode(tmp_path):
    import os
    import stat

    from taccl.fileio import atomic_write

    old = os.umask(0o027)
    try:
        assert stat.S_IMODE(atomic_write(tmp_path / "a.xml", "x").stat().st_mode) == 0o640
        os.umask(0o002)
        assert stat.S_IMODE(atomic_write(tmp_path / "b.xml", "x").stat().st_mode) == 0o664
        os.chmod(tmp_path / "a.xml", 0o600)
        assert stat.S_IMODE(atomic_write(tmp_path / "a.xml", "y").stat().st_mode) == 0o600
    finally:
        os.umask(old)


SKETCH = str(ROOT / "sketches" / "ndv2-sk-1.json")
# (argv with {t} for the test's directory, words the one-line message must hold); a file "afile" and a proven
# ring "ring.xml" exist there. Each must exit 2 before any work, print no traceback and write nothing.
BAD_CALLS = [
    (["solve", SKETCH, "-o", "{t}/afile"], ["{t}/afile", "-o", "is a file, expected a directory"]),
    (["solve", SKETCH, "-o", "{t}/afile/sub"], ["-o", "cannot be made: {t}/afile is a file"]),
    (["solve", SKETCH, "-o", "{t}/" + "d" * 300], ["-o", "longer than the file system's 255 bytes"]),
    (["solve", SKETCH, "-o", "{t}/out", "--name", "../../escape"], ["--name", "is not a file name"]),
    (["solve", SKETCH, "-o", "{t}/out", "--name", "n" * 250], ["--name", "longer than the file system's 255"]),
    (["solve", SKETCH, "-o", "{t}/out", "--max-extra-hops", "-3"], ["--max-extra-hops", "0 (minimal routes only)"]),
    (["solve", SKETCH, "-o", "{t}/out", "--threads", "0"], ["--threads", "from 1 to 1024"]),
    (["solve", SKETCH, "-o", "{t}/out", "--threads", "100000"], ["--threads", "from 1 to 1024"]),  # hung
    (["solve", SKETCH, "-o", "{t}/out", "--time-limit", "nan"], ["--time-limit", "must be positive, got nan"]),
    (["solve", SKETCH, "-o", "{t}/out", "--collective", "{t}/nope.json"], ["{t}/nope.json", "file not found"]),
    (["solve", SKETCH, "-o", ""], ["-o", "an empty directory name"]),
    (["solve", SKETCH, "-o", "{t}/out", "--size", "7"], ["--size", "7 bytes are less than a byte for each"]),
    (["baseline", "ring", "-t", "ndv2", "-o", "{t}/x.xml/"], ["-o", "is a directory, expected a file name"]),
    (["solve", SKETCH, "-o", "{t}/out", "--collective", "allsome"], ["--collective", "unknown collective"]),
    (["baseline", "ring", "-t", "ndv2", "-o", "{t}"], ["-o", "is a directory, expected a file name"]),
    (["baseline", "ring", "-t", "ndv2", "-o", "{t}/afile/x.xml"], ["{t}/afile/x.xml", "cannot be made"]),
    (["profile", "--from-nvidia-smi", "{t}/afile", "--offline", "-o", "{t}/afile/t.json"], ["--out", "is a file"]),
    (["simulate", "{t}/ring.xml", "-t", "ndv2", "--sizes", "1K:1G:0.5"], ["--sizes", "a whole FACTOR >= 2"]),
    (["simulate", "{t}/ring.xml", "-t", "ndv2", "--sizes", ","], ["--sizes", "an empty item in the list ','"]),
    (["simulate", "{t}/ring.xml", "-t", "ndv2", "--sizes", "1K,,2K"], ["--sizes", "an empty item"]),  # was skipped
    (["simulate", "{t}/ring.xml", "-t", "ndv2", "--sizes", ""], ["--sizes", "at least one byte"]),
    (["simulate", "{t}/ring.xml", "-t", "ndv2", "--sizes", "0"], ["--sizes", "at least one byte"]),
    (["run", "{t}/ring.xml", "--seed", "-1"], ["--seed", "0 or more"]),
    (["check", "{t}/ring.xml", "--max-steps", "-1"], ["--max-steps", "at least 1"]),
    (["check", "{t}/ring.xml", "--tiles", "100000000"], ["--tiles", "at most 1024"]),
    (["simulate", "{t}/cnt.xml", "-t", "ndv2"], ["{t}/cnt.xml", "cnt=1000000 chunks", "at most 32"]),
    (["solve", "{t}/deep.json"], ["{t}/deep.json", "nested deeper"]),
    (["batch", "{t}/binary.yaml", "-o", "{t}/out"], ["{t}/binary.yaml", "not UTF-8 text"]),
    (["run", "{t}/ring.xml", "--size", "64T"], ["of buffers, more than", "this machine's memory", "--size"]),
    # what a new user's run found naming an internal name, the wrong thing, or nothing
    (["run", "{t}/ring.xml", "--timeout-ms", "0"], ["--timeout-ms", "at least 1 ms"]),
    (["run", "{t}/ring.xml", "--tile-bytes", "-1"], ["--tile-bytes", "0 (the protocol's tile) or more"]),
    (["run", "{t}/ring.xml", "--ranks", "0"], ["--ranks", "at least 1"]),
    (["run", "{t}"], ["{t}: is a directory, expected an XML file"]),
    (["run", "{t}/ring.xml", "--root", "9"], ["{t}/ring.xml", "root 9 given, but allgather has no root"]),
    (["profile", "--reference", "ndv2", "--no-reference", "--from-nvidia-smi", "{t}/afile", "--offline"],
     ["--reference", "not both"]),
    (["baseline", "ring", "-t", "ndv2", "--chunkup", "0", "-o", "{t}/b.xml"], ["--chunkup", "at least 1"]),
    (["baseline", "ring", "-t", "ndv2", "-n", "0", "-o", "{t}/b.xml"], ["--nodes", "at least 1"]),
    # building it took 100 s and 2.4 GB before the offsets were found too large
    (["baseline", "ring", "-t", "ndv2", "--chunkup", "10000", "-o", "{t}/b.xml"],
     ["--chunkup", "80000 chunks a buffer", "32768 offsets"]),
    (["simulate", "{t}/ring.xml", "-t", "ndv2", "-n", "0"], ["--nodes", "at least 1"]),
    (["simulate", "{t}/nogpus.xml", "-t", "ndv2"], ["{t}/nogpus.xml", "ngpus=0: expected at least one rank"]),
    (["swap", "{t}/empty", "--into", "{t}/live"], ["{t}/empty", "no file: expected the new set's XML files"]),
]


@pytest.mark.parametrize("argv,needles", BAD_CALLS, ids=[f"{a[0]}-{i}" for i, (a, _) in enumerate(BAD_CALLS)])
def test_bad_calls_get_one_clear_message_before_any_work(tmp_path, capsys, argv, needles):
    from taccl.baselines import build
    from taccl.lowering import write_program
    from taccl.topology import load_topology

    (tmp_path / "afile").write_text("not a directory\n")
    write_program(build("ring", load_topology("ndv2", 1), "allgather"), tmp_path / "ring.xml")
    (tmp_path / "cnt.xml").write_text((tmp_path / "ring.xml").read_text().replace('cnt="1"', 'cnt="1000000"'))
    (tmp_path / "deep.json").write_text("[" * 100_000 + "]" * 100_000)
    (tmp_path / "binary.yaml").write_bytes(bytes(range(256)))
    (tmp_path / "nogpus.xml").write_text(re.sub(r'ngpus="\d+"', 'ngpus="0"', (tmp_path / "ring.xml").read_text()))
    (tmp_path / "empty").mkdir()
    before = sorted(p.name for p in tmp_path.rglob("*"))
    rc = main([a.replace("{t}", str(tmp_path)) for a in argv])
    err = capsys.readouterr().err
    assert rc == 2 and "Traceback" not in err and err.count("\n") == 1, err
    for needle in needles:
        assert needle.replace("{t}", str(tmp_path)) in err
    assert sorted(p.name for p in tmp_path.rglob("*")) == before


def test_lower_spreads_connections_over_the_blocks_asked_for(tmp_path, capsys):
    assert main(["solve", SKETCH, "-o", str(tmp_path), "--no-xml", "-q"]) == 0
    algo = next(tmp_path.glob("*.algo.json"))
    out = tmp_path / "two.xml"
    assert main(["lower", str(algo), "--connection-blocks", "2", "-o", str(out), "-q"]) == 0
    assert main(["check", str(out), "-q"]) == 0
    capsys.readouterr()
    assert main(["lower", str(algo), "--connection-blocks", "0", "-o", str(tmp_path / "none.xml")]) == 2
    err = capsys.readouterr().err
    assert "--connection-blocks must be from 1 to" in err and "Traceback" not in err
    assert not (tmp_path / "none.xml").exists()


def test_lower_caps_the_blocks_auto_spreads_a_connection_over(tmp_path, capsys):
    # the README's demo (2x NDv2 AllGather, Simple at 1 MiB): "auto" spreads connections over four blocks;
    # capped at two and at one it keeps the programs it replaced, each slower at the input size
    from taccl.simulator import Simulator
    from taccl.topology import Topology, load_spec
    from taccl.xmlio import parse_xml

    assert main(["solve", SKETCH, "-o", str(tmp_path), "--no-xml", "-q"]) == 0
    algo = next(tmp_path.glob("*.algo.json"))
    times, texts = [], set()
    for cap in (None, 2, 1):
        out = tmp_path / f"cap{cap}.xml"
        capped = ["--max-connection-blocks", str(cap)] if cap else []
        assert main(["lower", str(algo), "-o", str(out), "-q"] + capped) == 0
        assert main(["check", str(out), "-q"]) == 0
        texts.add(out.read_text().split("\n", 1)[1])
        program = parse_xml(out.read_text()).program
        times.append(Simulator(program, Topology(load_spec("ndv2"), 2)).run(1 << 20).time_us)
    assert len(texts) == 3 and times == sorted(times), times
    capsys.readouterr()
    for args, needle in ((["--max-connection-blocks", "0"], "--max-connection-blocks must be from 1 to"),
                         (["--connection-blocks", "4", "--max-connection-blocks", "2"], "give one of them")):
        assert main(["lower", str(algo), "-o", str(tmp_path / "none.xml")] + args) == 2
        err = capsys.readouterr().err
        assert needle in err and "Traceback" not in err and str(algo) in err, err
        assert not (tmp_path / "none.xml").exists()


def test_lower_names_the_algorithm_file_whose_transfers_are_wrong(tmp_path, capsys):
    assert main(["solve", SKETCH, "-o", str(tmp_path), "--no-xml", "-q"]) == 0
    good = next(tmp_path.glob("*.algo.json"))
    doc = json.loads(good.read_text())
    later = next(t for t in doc["transfers"] if t["deps"])
    doc["transfers"][later["deps"][0]]["deps"].append(later["id"])  # a cycle of two
    bad = tmp_path / "cycle.algo.json"
    bad.write_text(json.dumps(doc))
    capsys.readouterr()
    assert main(["lower", str(bad), "-o", str(tmp_path / "cycle.xml")]) == 2
    err = capsys.readouterr().err
    assert f"{bad}: the transfers' dependencies form a cycle" in err and "Traceback" not in err
    assert not (tmp_path / "cycle.xml").exists()


@pytest.mark.parametrize("field,value,needle", [
    (("collective", "name"), None, "$.collective.name: expected the collective's name (a string), got None"),
    (("collective", "num_ranks"), None, "$.collective.num_ranks: expected an integer of at least 2, got None"),
    # once built before any check: the conditions of 10^12 ranks exhausted memory
    (("collective", "num_ranks"), 10 ** 12, "$.collective.num_ranks: 1000000000000 ranks, but no transfer reaches"),
    (("collective", "chunkup"), 10 ** 9, "$.collective.chunkup: chunk-up 1000000000, but no transfer moves"),
    (("collective", "root"), "x", "$.collective.root: expected a rank from 0 to 15 or null, got 'x'"),
    (("collective", "root"), 99, "$.collective.root: expected a rank from 0 to 15 or null, got 99"),
    (("topology",), "", "$.topology: expected an object, got ''"),
    (("topology", "nodes"), "x", "$.topology.nodes: expected a node count (an integer of at least 1), got 'x'"),
    (("topology", "path"), -1, "$.topology.path: expected the topology file's path (a string) or null, got -1"),
    (("topology", "nodes"), 3, "$.topology.nodes: 3 node(s) of ndv2 make 24 ranks, but the collective has 16"),
    (("input_size_bytes",), "1M", "$.input_size_bytes: expected a positive integer (bytes), got '1M'"),
    (("input_size_bytes",), 0, "$.input_size_bytes: expected a positive integer (bytes), got 0"),
    (("chunk_bytes",), 0, "$.chunk_bytes: expected a positive number (bytes), got 0"),
    (("time_us",), "x", "$.time_us: expected a number (us), got 'x'"),
    (("transfers",), None, "$.transfers: expected a list of transfers, got None"),
    (("transfers", 0), None, "$.transfers[0]: expected a transfer (an object), got None"),
    (("transfers", 0, "src"), "a", "$.transfers[0].src: expected a rank, got 'a'"),
    (("transfers", 0, "chunks"), ["a"], "$.transfers[0].chunks: expected a list of chunk indices, got ['a']"),
    (("transfers", 0, "send_us"), -5, "$.transfers[0].send_us: expected a time of at least 0 (us), got -5.0"),
    (("transfers", 0, "arrive_us"), -1, "$.transfers[0].arrive_us: expected a time no earlier than the send's"),
    (("time_us",), -1, "$.time_us: expected a time of at least 0 (us), got -1.0"),
    (("block_steps",), 7, "$.block_steps: block_steps must be a multiple of 8 from 8 to 64"),
    (("instances",), 10000, "$.instances: instances must be from 1 to 32, got 10000"),
    # reported at $ with a Python exception, or (strings of digits) taken silently
    (("call_us",), "a", "$.call_us: expected a number (us), got 'a'"),
    (("notes",), 5, "$.notes: expected a list, got 5"),
    (("instances",), "2", "$.instances: expected an integer, got '2'"),
    (("transfers", 0, "src"), "0", "$.transfers[0].src: expected a rank, got '0'"),
    (("transfers", 0, "dst"), 1.5, "$.transfers[0].dst: expected a rank, got 1.5"),
])
def test_lower_names_the_field_of_a_malformed_algorithm_header(tmp_path, capsys, field, value, needle):
    """What a field-by-field fuzz of the algorithm file found: these once ended in a traceback or the OOM
    killer."""
    algo = tmp_path / "good.algo.json"
    assert main(["solve", SKETCH, "-o", str(tmp_path), "--no-xml", "-q", "--name", "good"]) == 0
    doc = json.loads(algo.read_text())
    doc["collective"]["name"] = "broadcast" if field == ("collective", "root") else doc["collective"]["name"]
    node = doc
    for key in field[:-1]:
        node = node[key]
    node[field[-1]] = value
    bad = tmp_path / "bad.algo.json"
    bad.write_text(json.dumps(doc))
    capsys.readouterr()
    assert main(["lower", str(bad), "-o", str(tmp_path / "bad.xml")]) == 2
    err = capsys.readouterr().err
    assert f"{bad}: " in err and needle in err and "Traceback" not in err, err
    assert not (tmp_path / "bad.xml").exists()


def test_a_reader_that_goes_away_stops_the_output_quietly(tmp_path):
    xml = tmp_path / "ring.xml"
    assert main(["baseline", "ring", "-t", "ndv2", "-n", "2", "-o", str(xml), "-q"]) == 0
    # a report larger than the pipe's 64 KiB buffer (about 80 KB), read one byte of
    r = subprocess.run(f"{sys.executable} -m taccl.cli check --json {' '.join([str(xml)] * 50)} | head -c 1",
                       shell=True, capture_output=True, text=True, cwd=ROOT)
    assert r.stdout == "[" and "Traceback" not in r.stderr and "BrokenPipe" not in r.stderr, r.stderr


def test_a_collective_too_large_to_build_is_refused_from_its_shape(tmp_path, capsys):
    from taccl.budget import min_transfers, shape_min_transfers
    from taccl.collectives import make_collective

    for name, form in (("allgather", ""), ("alltoall", ""), ("reducescatter", ""), ("allreduce", ""),
                       ("allreduce", "one-shot"), ("broadcast", "")):
        for R, k in ((2, 1), (5, 3), (8, 2)):
            exact = min_transfers(make_collective(name, R, k, form=form))
            assert shape_min_transfers(name, R, k, form) == (exact if name != "broadcast" else 0), (name, form, R, k)
    # 24,000 ranks: the collective alone (576 M pairs) would not fit; refused before it is built, in 0.5 s
    rc = main(["solve", SKETCH, "--nodes", "3000", "--max-memory", "8G", "-o", str(tmp_path / "out"), "-q"])
    err = capsys.readouterr().err
    assert rc == 2 and "allgather on 24000 ranks at chunk-up 1 makes at least 575,976,000 transfers" in err
    assert not (tmp_path / "out").exists()


def test_ctrl_c_stops_a_running_milp_at_once(tmp_path):
    # the contiguity MILP of this AllToAll runs to its time limit with --stall 0 (200 s); Ctrl-C after 4 s
    # must stop HiGHS at its next interrupt check, exit 130 and write nothing
    import signal
    import time

    out = tmp_path / "out"
    p = subprocess.Popen([sys.executable, "-m", "taccl.cli", "solve", str(ROOT / "sketches" / "ndv2-alltoall-sk-1.json"),
                          "--stall", "0", "--time-limit", "200", "-o", str(out)], cwd=ROOT, stdout=subprocess.PIPE,
                         stderr=subprocess.STDOUT, text=True,
                         preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    time.sleep(4)
    p.send_signal(signal.SIGINT)
    t0 = time.monotonic()
    text, _ = p.communicate(timeout=60)
    assert p.returncode == 130 and time.monotonic() - t0 < 10, text
    assert "contiguity: MILP" in text and "interrupted" in text and "Traceback" not in text
    assert not out.exists()


def test_output_to_a_full_disk_and_stray_bytes_get_a_message(tmp_path):
    """Output that cannot be written (a full disk) is one message and exit 2; a non-UTF-8 byte in an XML
    name or in a file's path is read as the runtimes read it (bytes), by `check` and `run` alike."""
    from taccl.baselines import build
    from taccl.lowering import write_program
    from taccl.topology import load_topology

    ring = tmp_path / "ring.xml"
    write_program(build("ring", load_topology("ndv2", 1), "allgather"), ring)
    if os.path.exists("/dev/full"):
        with open("/dev/full", "w") as full:
            r = subprocess.run([sys.executable, "-m", "taccl.cli", "check", "--json", str(ring)], stdout=full,
                               stderr=subprocess.PIPE, text=True, cwd=ROOT)
        assert r.returncode == 2 and "cannot write the output: No space left on device" in r.stderr, r.stderr
        assert "Traceback" not in r.stderr
    name = tmp_path / "name.xml"
    name.write_bytes(ring.read_bytes().replace(b'name="', b'name="ab\xff', 1))
    odd = tmp_path / os.fsdecode(b"p\xff.xml")
    odd.write_bytes(ring.read_bytes())
    for path in (name, odd):
        assert main(["check", "-q", str(path)]) == 0
        assert main(["run", str(path), "--size", "64K", "--check"]) == 0


def test_output_to_a_device_or_a_fifo_is_written_to_not_replaced(tmp_path, capsys):
    """A write goes through a temporary file and a rename, which replaced /dev/full with a regular file when
    run as root: a device or a FIFO is written to as it is, and a write that fails is one message."""
    import stat
    import threading

    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    got = []
    reader = threading.Thread(target=lambda: got.append(fifo.read_text()))
    reader.start()
    assert main(["baseline", "ring", "-t", "ndv2", "-o", str(fifo)]) == 0
    reader.join(timeout=30)
    assert stat.S_ISFIFO(fifo.stat().st_mode) and got and got[0].startswith("<algo ")
    assert main(["baseline", "ring", "-t", "ndv2", "-o", os.devnull]) == 0
    assert stat.S_ISCHR(os.stat(os.devnull).st_mode)
    if os.path.exists("/dev/full"):
        capsys.readouterr()
        assert main(["baseline", "ring", "-t", "ndv2", "-o", "/dev/full"]) == 2
        assert "/dev/full: cannot write: No space left on device" in capsys.readouterr().err
        assert stat.S_ISCHR(os.stat("/dev/full").st_mode)


def test_a_program_that_deadlocks_in_simulation_names_its_file(tmp_path, capsys):
    from taccl.baselines import build
    from taccl.lowering import write_program
    from taccl.topology import load_topology

    ring = tmp_path / "ring.xml"
    write_program(build("ring", load_topology("ndv2", 1), "allgather"), ring)
    text = ring.read_text()
    stuck = tmp_path / "stuck.xml"  # rank 0's step 1 waits for itself
    head, tail = text.split('<step s="1" ', 1)
    stuck.write_text(head + '<step s="1" ' + tail.replace('depid="-1" deps="-1"', 'depid="0" deps="1"', 1))
    capsys.readouterr()
    rc = main(["simulate", str(stuck), "-t", "ndv2"])
    err = capsys.readouterr().err
    assert rc == 1 and f"{stuck}: the program deadlocks in simulation" in err and "taccl check" in err, err


def test_a_user_defined_collective_is_solved_lowered_and_written_for_legacy_msccl(tmp_path, capsys):
    """--collective FILE.json (README, `load_custom_collective`) once failed on every path: its default output
    name held the file's path, the lower bound knew only built-in collectives, and the lowering proved and
    fingerprinted in the executor's dialect, which has no coll="custom"."""
    R = 16
    custom = tmp_path / "swap-nodes.json"  # every rank's chunk to the same GPU of the other node
    custom.write_text(json.dumps({"name": "swap-nodes", "num_ranks": R, "chunks": R,
                                  "precondition": [[c, c] for c in range(R)],
                                  "postcondition": [[c, (c + 8) % R] for c in range(R)]}))
    sketch = json.loads(Path(SKETCH).read_text())
    # without the sketch's rotation, which the solver refuses for this collective (it names no chunk's owner)
    del sketch["symmetry_offsets"]
    sketch["name"] = "nosym"
    sketch_path = tmp_path / "nosym.json"
    sketch_path.write_text(json.dumps(sketch))
    out = tmp_path / "out"
    argv = ["solve", str(sketch_path), "--collective", str(custom), "-o", str(out), "-q", "--time-limit", "10"]
    assert main(argv) == 2  # the executor has no custom collectives: refused before any work
    assert "--target: a user-defined collective runs only on legacy MSCCL" in capsys.readouterr().err
    assert not out.exists()
    assert main(argv + ["--target", "msccl-legacy"]) == 0
    algo = json.loads((out / "nosym-swap-nodes.algo.json").read_text())
    assert 0 < algo["lower_bound_us"] <= algo["time_us"] and algo["lower_bounds"]["ingress_us"] > 0
    xml = (out / "nosym-swap-nodes.xml").read_text()
    assert 'coll="custom"' in xml and f'nchunksperloop="{R}"' in xml and f'i_chunks="{R}"' in xml
    assert main(["check", str(out / "nosym-swap-nodes.xml"), "--target", "msccl-legacy", "-q"]) == 0
    capsys.readouterr()
    assert main(["lower", str(out / "nosym-swap-nodes.algo.json"), "-o", str(tmp_path / "l.xml")]) == 2
    assert "runs only on legacy MSCCL" in capsys.readouterr().err and not (tmp_path / "l.xml").exists()


R = 16  # the ranks of SKETCH (2x NDv2)


@pytest.mark.parametrize("change,needle", [
    ({"num_ranks": "x"}, "$.num_ranks: expected the number of ranks (an integer), got 'x'"),  # was a traceback
    ({"chunks": 10 ** 12}, "$.chunks: expected a whole number of chunks from 1 to 1048576"),  # was a hang
    ({"precondition": [[c, c] for c in range(1, 16)]}, "$.precondition: chunk 0 is needed on ranks [8]"),
    ({"postcondition": 0}, "$.postcondition: expected a list of [chunk, rank] pairs, got 0"),  # was a traceback
    # nothing to send: a lower bound of 0 was divided by (a traceback)
    ({"postcondition": []}, "$.postcondition: nothing moves between ranks"),
    ({"postcondition": [[c, c] for c in range(R)]}, "$.postcondition: nothing moves between ranks"),
    # a built-in name was checked against the built-in collective's conditions, late and without the file
    ({"name": "allgather"}, "$.name: expected a name of its own, got 'allgather'"),
    ({"name": "AR"}, "$.name: expected a name of its own, got 'AR'"),
])
def test_a_malformed_user_defined_collective_names_its_field(tmp_path, capsys, change, needle):
    doc = {"name": "swap-nodes", "num_ranks": R, "chunks": R, "precondition": [[c, c] for c in range(R)],
           "postcondition": [[c, (c + 8) % R] for c in range(R)], **change}
    custom = tmp_path / "bad.json"
    custom.write_text(json.dumps(doc))
    assert main(["solve", SKETCH, "--collective", str(custom), "--no-xml", "-o", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert f"{custom}: {needle}" in err and "Traceback" not in err, err


def test_a_program_the_runtime_would_refuse_simulates_with_a_warning(tmp_path, capsys):
    from taccl.baselines import build
    from taccl.lowering import write_program
    from taccl.topology import load_topology

    ring = tmp_path / "ring.xml"
    write_program(build("ring", load_topology("ndv2", 1), "allgather"), ring)
    assert main(["simulate", str(ring), "-t", "ndv2", "--sizes", "1M"]) == 0
    assert "warning" not in capsys.readouterr().err
    text = ring.read_text()
    nochannel = tmp_path / "nochannel.xml"
    nochannel.write_text(re.sub(r'nchannels="\d+"', 'nchannels="0"', text, count=1))
    assert main(["simulate", str(nochannel), "-t", "ndv2", "--sizes", "1M"]) == 0
    out, err = capsys.readouterr()
    assert "1048576" in out
    assert (f"{nochannel}: warning: the MSCCL executor would refuse this program (nchannels=0 must be in 1..32"
            in err and f"`taccl check {nochannel}` lists them" in err), err


def test_simulate_warns_of_blocks_past_the_sms_names_a_wrong_node_count_and_marks_unrun_sizes(tmp_path, capsys):
    from taccl.baselines import build
    from taccl.lowering import write_program
    from taccl.topology import load_topology

    rings = tmp_path / "rings.xml"
    write_program(build("ring", load_topology("ndv2", 1), "allgather", instances=4), rings)
    topo = tmp_path / "few-sms.json"
    doc = json.loads((Path(__file__).resolve().parent.parent / "topologies" / "ndv2.json").read_text())
    doc.setdefault("runtime", {})["sm_count"] = 4
    topo.write_text(json.dumps(doc))
    assert main(["simulate", str(rings), "-t", str(topo), "--sizes", "1M"]) == 0
    assert "more than the 4 SMs" in capsys.readouterr().err
    assert main(["simulate", str(rings), "-t", "ndv2", "--nodes", "2", "--sizes", "1M"]) == 2
    assert "--nodes: 2 node(s) of 'ndv2' have 16 GPUs, the program 8 ranks" in capsys.readouterr().err
    # a size no runtime selects the program for is marked (it printed a time like any other)
    assert main(["simulate", str(rings), "-t", "ndv2", "--sizes", "3,1M"]) == 0
    out = capsys.readouterr().out
    rows = {line.split()[0]: line for line in out.splitlines() if line.strip() and line.split()[0].isdigit()}
    assert rows["3"].endswith(" *") and not rows["1048576"].endswith("*")
    assert "# '*': no runtime runs the program at that size" in out


def test_a_size_no_runtime_runs_the_program_at_is_noted(tmp_path, capsys):
    # 1000 bytes over 16 chunks: synthesized and simulated there, but no runtime selects the program for it
    assert main(["solve", SKETCH, "--size", "1000", "-o", str(tmp_path / "a"), "-q"]) == 0
    assert "no runtime runs this program at 1000B" in capsys.readouterr().err
    assert main(["solve", SKETCH, "--size", "1M", "-o", str(tmp_path / "b"), "-q"]) == 0
    assert "no runtime runs" not in capsys.readouterr().err


def test_simulate_json_is_json_when_a_bandwidth_is_infinite(tmp_path, capsys):
    # a program that moves nothing on an uncalibrated topology takes 0 us: its bandwidth is infinite, which
    # JSON cannot hold (Python wrote Infinity, which JSON parsers refuse)
    from taccl.baselines import build
    from taccl.lowering import write_program
    from taccl.topology import load_topology

    raw = json.loads((ROOT / "topologies" / "ndv2.json").read_text())
    raw.pop("runtime", None)
    for lt in raw["link_types"].values():
        lt.pop("protocols", None)
    (tmp_path / "raw.json").write_text(json.dumps(raw))
    write_program(build("ring", load_topology("ndv2", 1), "allgather"), tmp_path / "ring.xml")
    text = re.sub(r"<gpu .*</gpu>\s*", "", (tmp_path / "ring.xml").read_text(), flags=re.S)
    (tmp_path / "empty.xml").write_text(text)
    assert main(["simulate", str(tmp_path / "empty.xml"), "-t", str(tmp_path / "raw.json"), "--sizes", "1M",
                 "--json"]) == 0

    def refuse(name):
        raise ValueError(name)

    (row,) = json.loads(capsys.readouterr().out, parse_constant=refuse)["results"]
    assert row["time_us"] == 0 and row["algbw_GBps"] is None


def test_sizes_are_parsed_exactly():
    from taccl.budget import gib
    from taccl.units import parse_size

    assert parse_size("99999999999999999999999") == 99999999999999999999999  # read through a float, it changed
    assert parse_size("1.5K") == 1536 and parse_size("64KiB") == 65536
    assert gib(1024) == "1 KiB" and gib(3 << 20) == "3 MiB"  # a 1 KiB limit was "the 0 MiB of --max-memory"
