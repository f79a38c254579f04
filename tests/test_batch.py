"""`taccl batch`: a small SKU end to end, the cache, kill and resume, Ray, faults and bad SKU files."""
import csv
import json
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from taccl.batch import dry_run, load_sku, plan, run_batch
from taccl.batch.selection import TIE_TOLERANCE, Contender, _picks, target_shortfall
from taccl.cli import main
from taccl.errors import UserError
from taccl.topology import load_topology
from taccl.xmlio import read_program

ROOT = Path(__file__).resolve().parent.parent
SMALL = ROOT / "tests" / "data" / "batch" / "small.yaml"
SKETCH = ROOT / "sketches" / "ndv2-sk-1.json"


def rows(outdir):
    with open(Path(outdir) / "selection.csv") as fh:
        return list(csv.DictReader(fh))


def sku_file(tmp_path, extra: str = "", name: str = "sku.yaml") -> Path:
    """The small SKU, with absolute sketch paths, plus `extra` top-level YAML (a key it gives replaces the
    small SKU's line: a key given twice is an error)."""
    keys = {line.split(":")[0] for line in extra.splitlines() if line and not line[0].isspace()}
    text = "".join(line for line in SMALL.read_text().splitlines(keepends=True)
                   if line.split(":")[0] not in keys or line[0].isspace())
    text = text.replace("../../../sketches/", f"{ROOT / 'sketches'}/") + extra
    path = tmp_path / name
    path.write_text(text)
    return path


def cache_files(outdir):
    return {p: p.stat().st_mtime_ns for p in (Path(outdir) / "cache").glob("*/*.json")}


@pytest.fixture(scope="module")
def small(tmp_path_factory):
    out = tmp_path_factory.mktemp("batch") / "out"
    result = run_batch(SMALL, out, workers=2)
    return result, out


def test_small_sku_files_table_report_and_plots_agree(small):
    result, out = small
    sel = json.loads((out / "selection.json").read_text())
    table = rows(out)
    windows = [w for g in sel["groups"] for w in g["windows"]]
    assert len(table) == len(windows) > 0
    assert {(g["collective"], g["nodes"]) for g in sel["groups"]} == {("allgather", 2), ("reducescatter", 2)}
    # the XML directory holds exactly the files of the table
    files = {r["file"] for r in table if r["file"] != "-"}
    assert files == {f"msccl-algorithms/{p.name}" for p in (out / "msccl-algorithms").iterdir()}
    report = (out / "report.md").read_text()
    for f in files:
        assert f in report
    for g in sel["groups"]:
        plot = out / "plots" / f"{g['collective']}-{g['ranks']}r.png"
        assert plot.stat().st_size > 1000 and f"plots/{plot.name}" in report
    for row, w in zip(table, windows):
        assert (row["winner"], int(row["min_bytes"]), int(row["max_bytes"])) == (w["winner"], w["min_bytes"], w["max_bytes"])
        if row["file"] != "-":
            prog = read_program(out / row["file"])
            assert (prog.min_bytes, prog.max_bytes, prog.ngpus) == (w["min_bytes"], w["max_bytes"], 16)
            assert prog.collective == w["collective"]


def test_windows_tile_the_size_axis_and_pick_the_fastest(small):
    _, out = small
    sel = json.loads((out / "selection.json").read_text())
    topo = load_topology("ndv2", 2)
    from taccl.bounds import lower_bound

    for g in sel["groups"]:
        ws = g["windows"]
        assert ws[0]["min_bytes"] == 0 and ws[-1]["max_bytes"] == 0
        for a, b in zip(ws, ws[1:]):
            assert b["min_bytes"] == a["max_bytes"] + 1 and a["winner"] != b["winner"]
        assert [s for w in ws for s in w["sizes"]] == g["sizes"]
        ok = {c["label"]: c for c in g["contenders"] if c["status"] == "ok"}
        assert any(c["kind"] == "baseline" for c in ok.values()) and any(c["kind"] == "synthesized" for c in ok.values())
        for w in ws:
            for k, size in enumerate(w["sizes"]):
                i = g["sizes"].index(size)
                best = min(c["time_us"][i] for c in ok.values())
                t = ok[w["winner"]]["time_us"][i]
                assert t == best  # merge_tolerance 0: the fastest per size
                assert t >= g["lower_bound_us"][i] * (1 - 1e-9)
                base = min(c["time_us"][i] for c in ok.values() if c["kind"] == "baseline")
                assert w["speedup"][k] == pytest.approx(base / t)
                assert lower_bound(topo, g["collective"], size) == pytest.approx(g["lower_bound_us"][i])


def test_every_written_xml_passes_taccl_check(small, capsys):
    _, out = small
    files = sorted((out / "msccl-algorithms").glob("*.xml"))
    assert files
    for f in files:
        assert main(["check", str(f)]) == 0, capsys.readouterr()


def test_runtime_picks_each_window_winner(small, monkeypatch):
    """Both ways of handing the files over find the window's program: the MSCCL_XML_FILES list the batch
    prints, and every file of the directory in sorted order (MSCCL_ALGO_DIR), first match wins."""
    r = subprocess.run(["make", "-C", str(ROOT / "runtime"), "-j2", "build/libtaccl_runtime.so"],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-2000:]
    from taccl.runtime import Runtime

    _, out = small
    sel = json.loads((out / "selection.json").read_text())
    monkeypatch.setenv("MSCCL_XML_FILES", ":".join(str(out / f) for f in sel["files"]["16"]))
    with Runtime() as listed, Runtime() as directory:
        assert listed.load_from_env() == len(sel["files"]["16"])
        for f in sorted((out / "msccl-algorithms").iterdir()):
            directory.load(f)
        for g in sel["groups"]:
            for w in g["windows"]:
                for size in w["sizes"] + ([w["sizes"][-1] * 64] if w["max_bytes"] == 0 else []):
                    count = size // 4 // g["ranks"]  # float32; AllGather/ReduceScatter count one rank's share
                    for rt in (listed, directory):
                        idx = rt.select(g["collective"], g["ranks"], count, "float32", False)
                        assert idx >= 0 and rt.info(idx).path == str(out / w["file"]), (g["collective"], size)


def test_written_programs_compute_the_collective_on_the_runtime(small):
    """Every file runs on taccl's host runtime at a size of its window and matches the reference result, out of
    place and, where the table says the file serves them, in place."""
    from taccl.runtime import run_program

    _, out = small
    table = rows(out)
    assert any(r["inplace"] == "yes" for r in table)
    for r in table:
        for inplace in (False, True) if r["inplace"] == "yes" else (False,):
            rep = run_program(out / r["file"], size=int(r["first_grid_size"]), inplace=inplace)
            assert rep["checked"] and rep["wrong"] == 0, (r["file"], inplace)


def test_rerun_is_a_cache_hit(small, tmp_path):
    result, out = small
    copy = tmp_path / "again"
    shutil.copytree(out, copy)
    before = cache_files(copy)
    again = run_batch(SMALL, copy, workers=2)
    assert again.computed == 0 and again.cached == result.computed + result.cached
    assert cache_files(copy) == before  # nothing rewritten
    assert rows(copy) == rows(out)
    assert all(j.cached for j in again.selection.jobs)


def test_a_deployed_program_in_another_protocol_competes_again(small, tmp_path):
    """A previous run's program whose steps repeat a fresh program's in another protocol (which only its <algo>
    line says) simulates otherwise: it competes as the deployed program instead of being taken for the fresh
    one."""
    _, out = small
    copy = tmp_path / "edited"
    shutil.copytree(out, copy)
    sel = json.loads((copy / "selection.json").read_text())
    w = next(w for g in sel["groups"] for w in g["windows"] if w["kind"] == "synthesized" and w.get("file"))
    path = copy / w["file"]
    text = path.read_text()
    proto = re.search(r' proto="([^"]*)"', text).group(1)
    assert proto != "LL128"  # not a protocol of the small SKU: no fresh program is in it
    path.write_text(text.replace(f' proto="{proto}"', ' proto="LL128"', 1))
    run_batch(SMALL, copy, workers=1)
    again = json.loads((copy / "selection.json").read_text())
    group = next(g for g in again["groups"] if g["collective"] == w["collective"])
    assert [c["proto"] for c in group["contenders"] if c["source"] == "deployed"] == ["LL128"]


def test_prune_keeps_exactly_the_current_results(small, tmp_path):
    _, out = small
    copy = tmp_path / "pruned"
    shutil.copytree(out, copy)
    stale = copy / "cache" / "ab" / ("ab" + "0" * 62 + ".json")
    stale.parent.mkdir(exist_ok=True)
    stale.write_text('{"key": "stale"}\n')
    before = set(cache_files(copy)) - {stale}
    again = run_batch(SMALL, copy, workers=1, prune=True)
    assert again.computed == 0 and not stale.exists() and set(cache_files(copy)) == before


def test_dry_run_reports_the_cache_and_writes_nothing(small, tmp_path, capsys):
    _, out = small
    assert {state for _, state in dry_run(SMALL, out)} == {"cached"}
    fresh = tmp_path / "fresh"
    assert main(["batch", str(SMALL), "-o", str(fresh), "--dry-run"]) == 0
    assert "10 jobs, 0 cached" in capsys.readouterr().out and not fresh.exists()


def test_kill_and_resume_loses_nothing(small, tmp_path):
    _, ref = small
    out = tmp_path / "killed"
    proc = subprocess.Popen([sys.executable, "-m", "taccl.cli", "batch", str(SMALL), "-o", str(out), "--workers", "1",
                             "-q"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 120
    while not list((out / "cache").glob("*/*.json")) and time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.02)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    time.sleep(0.5)  # the worker gets SIGTERM from the kernel when its parent dies
    assert not (out / "selection.csv").exists(), "the batch finished before it could be killed"
    done = cache_files(out)
    assert done
    for p in done:
        json.loads(p.read_text())  # every stored record is whole
    resumed = run_batch(SMALL, out, workers=2)
    assert all(cache_files(out)[p] == m for p, m in done.items())  # nothing finished was recomputed
    assert resumed.cached + resumed.computed == len(plan(load_sku(SMALL)))
    # the same problems and programs as a run never killed; their times are not compared: a synthesis is not
    # reproducible across processes (the routing's earliest-arrival solve stops at a work limit counted in CPU
    # time, so a loaded machine may stop it elsewhere), which once made a resumed table differ from a fresh one
    labels = [{(c["label"], c["status"]) for g in json.loads((d / "selection.json").read_text())["groups"]
               for c in g["contenders"]} for d in (out, ref)]
    assert labels[0] == labels[1]
    # and the resumed cache is whole: a rerun computes nothing and writes the same table
    table = rows(out)
    assert run_batch(SMALL, out, workers=2).computed == 0 and rows(out) == table
    assert not list(out.rglob("*.tmp"))


def test_ray_executor_gives_the_same_table(small, tmp_path):
    pytest.importorskip("ray")
    _, ref = small
    out = tmp_path / "ray"
    # the syntheses come from the reference run: a MILP stopped by its time limit on a loaded machine may
    # return another incumbent; ray lowers and simulates every program again
    for record in (ref / "cache").glob("*/*.json"):
        if json.loads(record.read_text()).get("kind") == "synthesis":
            (out / "cache" / record.parent.name).mkdir(parents=True, exist_ok=True)
            shutil.copy(record, out / "cache" / record.parent.name / record.name)
    result = run_batch(SMALL, out, workers=2, executor="ray")
    assert result.computed > 0
    assert rows(out) == rows(ref)


def test_failed_synthesis_falls_back_to_the_best_baseline(tmp_path, monkeypatch):
    def broken(*args, **kwargs):
        raise UserError("the solver found no routing (test)")

    monkeypatch.setattr("taccl.synthesize.synthesize", broken)  # forked workers inherit it
    out = tmp_path / "out"
    result = run_batch(sku_file(tmp_path), out, workers=2)
    assert result.failed == 8  # two collectives x two chunk-ups x two protocols
    sel = result.selection
    for g in sel.groups:
        assert {w.kind for w in g.windows} == {"baseline"}
        assert all("synthesis failed" in w.note for w in g.windows)
        assert len(g.failed_jobs) == 4
    report = (out / "report.md").read_text()
    assert "the solver found no routing (test)" in report and "fell back" in report
    assert all(r["kind"] == "baseline" and r["file"] != "-" for r in rows(out))


def test_local_workers_share_the_machines_memory(tmp_path, monkeypatch):
    # two workers on a machine of 250 MiB: each synthesis may use 125 MiB, below the smallest estimate
    # (`taccl.budget`), so every one is refused before its solver runs, with the reason in the report
    monkeypatch.setattr("taccl.batch.machine_memory_bytes", lambda: 250 << 20)
    out = tmp_path / "out"
    result = run_batch(sku_file(tmp_path), out, workers=2)
    assert result.failed == 8
    assert "more than the 125 MiB of this machine's memory shared by 2 worker(s)" in (out / "report.md").read_text()


def test_a_winning_baseline_larger_than_the_executor_loads_is_left_to_nccl(tmp_path, monkeypatch):
    def broken(*args, **kwargs):
        raise UserError("the solver found no routing (test)")

    monkeypatch.setattr("taccl.synthesize.synthesize", broken)
    monkeypatch.setattr("taccl.program.MAX_NODES", 10)  # what the selection holds the written programs to
    out = tmp_path / "out"
    sel = run_batch(sku_file(tmp_path), out, workers=2).selection
    windows = [w for g in sel.groups for w in g.windows]
    assert windows and all(w.kind == "baseline" and not w.file for w in windows)
    assert all("left to NCCL" in w.note and "XML nodes > 10" in w.note for w in windows)
    assert all(r["file"] == "-" for r in rows(out)) and not list((out / "msccl-algorithms").glob("*.xml"))


def test_a_job_over_its_timeout_is_stopped_and_retried_when_the_limit_grows(tmp_path, monkeypatch):
    def slow(*args, **kwargs):
        time.sleep(120)

    monkeypatch.setattr("taccl.synthesize.synthesize", slow)
    out = tmp_path / "out"
    t0 = time.monotonic()
    result = run_batch(sku_file(tmp_path, "job_timeout_s: 1\n"), out, workers=2)
    assert time.monotonic() - t0 < 60
    reasons = [j.reason for j in result.selection.jobs if j.kind == "synthesis"]
    assert reasons and all("timed out after 1 s" in r for r in reasons)
    same = run_batch(sku_file(tmp_path, "job_timeout_s: 1\n"), out, workers=2)
    assert same.computed == 0  # a timeout under the same limit is a result
    monkeypatch.undo()
    longer = run_batch(sku_file(tmp_path, "job_timeout_s: 300\n"), out, workers=2)
    assert longer.failed == 0 and longer.computed == 8


def test_a_timeout_under_a_second_stops_its_job_on_time(monkeypatch):
    # the scheduling loop polls once a second for its progress line; a 0.3 s timeout still ends at 0.3 s
    from taccl.batch import executors

    class Pool:
        stopped = []

        def submit(self, task):
            return task

        def wait(self, handles, seconds):
            time.sleep(seconds)
            return []

        def stop(self, handle):
            self.stopped.append(handle)

    class Progress:
        finished_after = {}

        def started(self, task):
            pass

        def finished(self, task, seconds, *, failed):
            self.finished_after[task] = seconds

        def tick(self):
            pass

    reasons = []
    monkeypatch.setattr(executors, "complete", lambda task, store, reason, **extra: reasons.append(reason) or True)
    progress = Progress()
    executors._drive(Pool(), ["job"], None, workers=1, timeout_s=0.3, progress=progress)
    assert Pool.stopped == ["job"] and reasons == ["timed out after 0.3 s (job_timeout_s)"]
    assert 0.3 <= progress.finished_after["job"] < 0.6


def test_bad_sku_lists_every_problem_before_any_work(tmp_path, capsys):
    bad = tmp_path / "bad.yaml"
    bad.write_text(f"""name: bad
topology: ndv3
nodes: [2, 0]
collectives: [allgather, allsum]
sizes: 1K:0.5
synthesis_sizes: [1M, 0]
candidates:
  - sketch: missing.json
    variants: {{protocol: [LL64], chunkup: [0]}}
  - sketch: {SKETCH}
    collectives: [alltoall]
    variants: {{instances: [64]}}
baselines: {{names: [ring, torus]}}
colectives: [allreduce]
""")
    out = tmp_path / "out"
    assert main(["batch", str(bad), "-o", str(out)]) == 2
    err = capsys.readouterr().err
    assert "12 problems" in err
    assert "line 12: $.candidates[1].variants.instances[0]: 64 is greater than the maximum of 32" in err
    for text in ("line 2: $.topology: unknown topology 'ndv3'", "line 3: $.nodes[1]", "$.collectives[1]: unknown collective 'allsum'",
                 "line 5: $.sizes", "$.synthesis_sizes: a size must be at least one byte, got 0",
                 "line 8: $.candidates[0].sketch: no such sketch file",
                 "$.candidates[0].variants.protocol[0]", "$.candidates[0].variants.chunkup[0]",
                 "$.candidates[1].collectives[0]: 'alltoall' is not one of the SKU's collectives",
                 "$.baselines.names[1]: unknown baseline 'torus'", "line 14: $.colectives: unknown key"):
        assert text in err, text
    assert "Traceback" not in err and not out.exists()


@pytest.mark.parametrize("text,needle", [
    ("topology: ndv2\nnodes: [2.0]\ncollectives: [allgather]\n", "line 2: $.nodes[0]: 2.0 is not of type 'integer'"),
    ("topology: ndv2\nnodes: [2]\ncollectives: [allgather]\ntopology: dgx2\n",
     "line 4: key 'topology' given twice (lines 1 and 4)"),
    # every job ran twice
    ("topology: ndv2\nnodes: [2, 2]\ncollectives: [allgather]\n", "$.nodes[1]: 2 is listed already"),
    ("topology: ndv2\nnodes: [2]\ncollectives: [allgather, all_gather]\n",
     "$.collectives[1]: 'all_gather' is listed already (allgather)"),
    # the default output directory, batch-<name>, escaped the working directory
    ("name: ../../escape\ntopology: ndv2\nnodes: [2]\ncollectives: [allgather]\n",
     "line 1: $.name: '../../escape' does not match"),
])
def test_what_yaml_would_take_silently_or_crash_on_is_refused(tmp_path, capsys, text, needle):
    bad = tmp_path / "bad.yaml"
    bad.write_text(text + f"candidates:\n  - sketch: {SKETCH}\n")
    assert main(["batch", str(bad), "--dry-run", "-o", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert needle in err and "Traceback" not in err, err


def test_invalid_yaml_names_the_line(tmp_path, capsys):
    bad = tmp_path / "bad.yaml"
    bad.write_text("topology: ndv2\nnodes: [2\ncollectives: []\n")
    assert main(["batch", str(bad)]) == 2
    assert "bad.yaml: line 3" in capsys.readouterr().err


def test_nan_and_infinity_are_refused_in_a_sku_and_in_json_files(tmp_path, capsys):
    # YAML's .nan passes every bound of the schema, and Python's JSON parser takes NaN and Infinity
    bad = tmp_path / "bad.yaml"
    bad.write_text(f"topology: ndv2\nnodes: [2]\ncollectives: [allgather]\nsizes: [1KiB, .nan]\n"
                   f"time_limit_s: .nan\nmerge_tolerance: .inf\ncandidates:\n  - sketch: {SKETCH}\n")
    out = tmp_path / "out"
    assert main(["batch", str(bad), "-o", str(out)]) == 2
    err = capsys.readouterr().err
    assert "3 problems" in err and "Traceback" not in err and not out.exists()
    for text in ("line 4: $.sizes[1]: not a finite number", "line 5: $.time_limit_s: not a finite number",
                 "line 6: $.merge_tolerance: not a finite number"):
        assert text in err, text
    topo = json.loads((ROOT / "topologies" / "ndv2.json").read_text())
    topo["runtime"]["sync_us"] = float("nan")
    path = tmp_path / "nan-topology.json"
    path.write_text(json.dumps(topo, indent=1))
    assert main(["baseline", "ring", "--topology", str(path), "--nodes", "1", "-o", str(tmp_path / "r.xml")]) == 2
    err = capsys.readouterr().err
    line = next(i for i, text in enumerate(path.read_text().splitlines(), 1) if "NaN" in text)
    assert f"nan-topology.json: line {line} column" in err and "NaN is not a JSON number" in err, err
    assert not (tmp_path / "r.xml").exists()


def test_sketch_that_does_not_fit_the_topology_is_a_sku_error(tmp_path):
    path = tmp_path / "sku.yaml"
    path.write_text(f"topology: dgx2\nnodes: [2]\ncollectives: [allgather]\ncandidates:\n  - sketch: {SKETCH}\n")
    with pytest.raises(UserError, match=r"line 5: \$\.candidates\[0\]\.sketch: does not fit dgx2 x2"):
        load_sku(path)


def test_a_chunkup_variant_too_coarse_for_the_sketchs_parts_is_a_sku_error(tmp_path):
    # dgx-a100-rs-split.json's phases name piece 7 of each chunk: a chunk-up of 4 has no such piece
    path = tmp_path / "sku.yaml"
    path.write_text(f"topology: dgx-a100\nnodes: [2]\ncollectives: [reducescatter]\ncandidates:\n"
                    f"  - sketch: {ROOT / 'sketches' / 'dgx-a100-rs-split.json'}\n"
                    f"    variants: {{chunkup: [8, 4], protocol: [LL]}}\n")
    with pytest.raises(UserError, match=r"line 6: \$\.candidates\[0\]\.variants\.chunkup\[1\]: chunk-up 4 cuts "
                                        r"each chunk into 4 pieces, but the sketch's phases name piece 7 \(parts\)"):
        load_sku(path)


def test_a_sku_too_large_for_this_machine_loads_and_plans_without_building_its_collectives(tmp_path, capsys):
    """10^12 nodes: the sketch's fit and a tree baseline's operation count once built the collective itself
    (the OOM killer ended a --dry-run; a fuzz found it). Its jobs say what they need when they run."""
    path = tmp_path / "huge.yaml"
    path.write_text(f"topology: ndv2\nnodes: [1000000000000]\ncollectives: [allreduce]\ncandidates:\n"
                    f"  - sketch: {SKETCH}\n")
    assert main(["batch", str(path), "--dry-run", "-o", str(tmp_path / "out")]) == 0
    out = capsys.readouterr().out
    assert "double-binary-tree allreduce x1000000000000" in out and "synthesis" in out


@pytest.mark.parametrize("path", sorted((ROOT / "sketches" / "skus").glob("*.yaml")), ids=lambda p: p.stem)
def test_shipped_skus_load_and_plan(path):
    sku = load_sku(path)
    tasks = plan(sku)
    assert any(t.kind == "synthesis" for t in tasks) and any(t.kind == "baseline" for t in tasks)
    keys = [k for t in tasks for k in t.keys()]
    assert len(keys) == len(set(keys))  # every result has its own key
    for coll in sku.collectives:
        assert any(t.collective == coll and t.kind == "synthesis" for t in tasks), coll


def test_cache_key_follows_the_inputs(tmp_path):
    a = plan(load_sku(sku_file(tmp_path)))
    b = plan(load_sku(sku_file(tmp_path, "time_limit_s: 21\n", name="b.yaml").resolve()))
    assert [t.key for t in a] == [t.key for t in plan(load_sku(sku_file(tmp_path)))]  # stable
    syn_a = {t.key for t in a if t.kind == "synthesis"}
    syn_b = {t.key for t in b if t.kind == "synthesis"}
    assert syn_a.isdisjoint(syn_b)  # a solver setting is part of a synthesis key
    assert {t.key for t in a if t.kind == "baseline"} == {t.key for t in b if t.kind == "baseline"}


def test_a_fusion_variant_lowers_each_synthesis_once_more(tmp_path):
    # `fusion: [auto, network]`: the network one (labelled so) on two nodes only, where sends leave a node;
    # "auto" also with each connection on one block and on two at most; the default program keeps the key it had
    # without the variant
    path = tmp_path / "sku.yaml"
    hier = ROOT / "sketches" / "ndv2-hier.json"
    base = f"topology: ndv2\nnodes: [1, 2]\ncollectives: [allreduce]\ncandidates:\n  - sketch: {hier}\n"
    path.write_text(base + "    variants: {protocol: [LL], fusion: [auto, network]}\n")
    tasks = [t for t in plan(load_sku(path)) if t.kind == "synthesis"]
    labels = {t.nodes: sorted(p.label for p in t.programs) for t in tasks}
    auto = ["ndv2-hier@1MiB/LL", "ndv2-hier@1MiB/LL+one-block", "ndv2-hier@1MiB/LL+two-block"]
    assert labels == {1: auto, 2: auto[:1] + ["ndv2-hier@1MiB/LL+network"] + auto[1:]}
    assert {p.fusion for t in tasks for p in t.programs} == {"auto", "network"}
    path.write_text(base + "    variants: {protocol: [LL]}\n")
    plain = {p.key for t in plan(load_sku(path)) if t.kind == "synthesis" for p in t.programs}
    assert plain == {p.key for t in tasks for p in t.programs if p.fusion == "auto"}
    path.write_text(base + "    variants: {fusion: [eagerly]}\n")
    with pytest.raises(UserError, match=r"variants\.fusion\[0\]"):
        load_sku(path)


def test_auto_competes_with_fewer_blocks_a_connection_too_and_a_program_twice_is_simulated_once(tmp_path,
                                                                                                  monkeypatch):
    # "auto" may spread each connection over two or four blocks where that wins at the synthesis size, and lose
    # further up, where a window may still serve: the programs capped at one and two blocks compete too. 2x
    # NDv2 AllGather at 1 MiB: in Simple auto takes four blocks, and the capped programs are programs of their
    # own; in LL it keeps one, and the three are the same program, lowered once through the memo, simulated once
    import taccl.batch.jobs as jobs

    simple, ll = [t for t in plan(load_sku(sku_file(tmp_path))) if t.kind == "synthesis"][:2]
    for task in (simple, ll):
        assert [(p.label, p.max_connection_blocks) for p in task.programs] == [
            (task.label, None), (task.label + "+one-block", 1), (task.label + "+two-block", 2)]
    simulated = []
    real = jobs._simulate
    monkeypatch.setattr(jobs, "_simulate", lambda *a, **k: simulated.append(a[1].label) or real(*a, **k))
    for task, distinct in ((simple, 3), (ll, 1)):
        simulated.clear()
        records = []
        jobs.execute(task, records.append)
        by_key = {r["key"]: r for r in records}
        progs = [(by_key[p.key], by_key[p.sim_key]) for p in task.programs]
        digests = [jobs._unnamed_digest(xml["xml"]) for xml, _ in progs]
        assert len(set(digests)) == distinct
        # each distinct program simulated once, the first to have it; a repeat has its times under its own label
        assert simulated == [p.label for i, (p, d) in enumerate(zip(task.programs, digests)) if digests.index(d) == i]
        for (xml, sim), d in zip(progs, digests):
            assert sim["status"] == "ok" and sim["label"] == xml["label"]
            assert sim["time_us"] == progs[digests.index(d)][1]["time_us"]
        if distinct > 1:  # auto keeps the fastest at the synthesis size (in the grid)
            at = progs[0][1]["sizes"].index(task.size_bytes)
            assert progs[0][1]["time_us"][at] < min(sim["time_us"][at] for _, sim in progs[1:])


def test_second_batch_on_the_same_outdir_is_refused(tmp_path):
    from taccl.batch.cache import OutdirLock

    with OutdirLock(tmp_path):
        with pytest.raises(UserError, match="another `taccl batch`"):
            run_batch(SMALL, tmp_path, workers=1)


def _c(label, times, kind="synthesized"):
    return Contender(label=label, kind=kind, source=label, proto="Simple", instances=1, status="ok", time_us=times)


def test_tolerance_gives_the_fewest_windows():
    a = _c("a", [1.0, 1.0, 1.02, 1.5])
    b = _c("b", [1.01, 0.99, 1.0, 1.0])
    base = _c("ring", [1.0, 2.0, 2.0, 2.0], kind="baseline")
    ok = [base, a, b]
    assert [c.label for c in _picks(ok, 4, 0.0)] == ["ring", "b", "b", "b"]  # tie at size 0 goes to the baseline
    assert [c.label for c in _picks(ok, 4, 0.03)] == ["b", "b", "b", "b"]
    assert _picks([], 3, 0.0) == [None, None, None]


def test_a_program_competes_only_at_sizes_the_runtimes_select_it_for():
    # 2 nodes of DGX H100, ReduceScatter: a program of 320 chunks a loop (chunks in four on five instances) is
    # the fastest everywhere, but no power-of-two size divides into 320 chunks: the runtimes never select it,
    # so the one of 256 chunks (four instances) wins, or NCCL's own where nothing else runs
    from taccl.batch.selection import Group, _contender, _shortfalls, _windows
    from taccl.batch.jobs import ProgramJob

    sizes = [1 << 20, 1 << 24]
    store = {}  # key -> record: the program's XML (its <algo> element) and its simulation

    def prog(label, chunks, times, kind="synthesized"):
        store[label] = {"xml": f'<algo name="{label}" proto="Simple" nchannels="8" nchunksperloop="{chunks}" '
                               f'ngpus="16" coll="reducescatter">'}
        store[label + ".sim"] = {"status": "ok", "time_us": times, "algbw_GBps": [1.0] * len(times)}
        return ProgramJob(key=label, sim_key=label + ".sim", label=label, kind=kind, source=label, proto="Simple",
                          instances=1)

    g = Group(collective="reducescatter", nodes=2, ranks=16, sizes=sizes, lower_bound_us=[None, None],
              contenders=[], optimum_us=[10.0, 50.0])

    five = _contender(prog("c4.i5", 320, [20.0, 59.0]), store, g)
    four = _contender(prog("c4.i4", 256, [30.0, 60.5]), store, g)
    ring = _contender(prog("ring", 320, [25.0, 66.0], kind="baseline"), store, g)  # NCCL's own: no condition
    assert five.runs == [False, False] and four.runs == [True, True] and ring.runs == []
    g.contenders = [ring, five, four]
    assert [(w.winner, w.sizes) for w in _windows(g)] == [("ring", [1 << 20]), ("c4.i4", [1 << 24])]
    assert [size for size, _ in _shortfalls(g)] == [1 << 20, 1 << 24]  # 30.0 > 25.0; 60.5 is 1.09x the ring
    g.contenders = [ring, five]
    assert [(w.winner, w.kind) for w in _windows(g)] == [("ring", "baseline")]
    assert all("no synthesized program runs at this size" in why for _, why in _shortfalls(g))


def test_which_sizes_the_runtimes_select_a_program_for():
    from taccl.targets import selected_near, selects_size

    assert selects_size("allreduce", 16, 1 << 20, 256) and not selects_size("allreduce", 16, 1 << 20, 320)
    assert not selects_size("allreduce", 16, 1 << 10, 512)  # 256 float32 elements: fewer than the chunks
    assert selects_size("allreduce", 16, 1 << 10, 512, elem_bytes=2)  # 512 float16 elements
    # 24 ranks: an AllGather's calls hold 24 counts, so a program of 24 x 4 chunks is selected near 1 MiB;
    # an AllReduce's calls need not be a multiple of 24 (a power of two never is)
    assert selected_near("allgather", 24, 1 << 20, 96) and not selects_size("allgather", 24, 1 << 20, 96)
    assert not selected_near("allreduce", 24, 1 << 20, 96) and selected_near("allreduce", 16, 1 << 20, 64)


def test_target_counts_a_tie_with_the_baseline_but_not_a_loss():
    # synthesized and baseline equal to the model's precision, within 1.1x of the optimum: met
    assert target_shortfall(9.80, 9.79, 9.0) is None
    assert target_shortfall(7.37, 7.37, 7.3) is None
    # a real loss, however close to the optimum
    slower = 9.79 * (1 + 2 * TIE_TOLERANCE)
    assert "slower than the best baseline" in target_shortfall(slower, 9.79, 9.7)
    # a tie far from the optimum misses on the second condition
    assert "1.00x the best baseline, 1.55x the optimum" == target_shortfall(11.6, 11.6, 7.5)
    # no baseline: only the optimum counts
    assert target_shortfall(8.0, None, 7.5) is None
    assert target_shortfall(None, 7.0, 7.0) == "no synthesized program"


def test_a_baseline_task_lowers_once_per_instance_count(tmp_path, monkeypatch):
    # two protocols x two instance counts: two lowerings and proofs, not four; each variant's record is what
    # building it alone gives, and simulating the lowered Program gives what its XML read back gives
    import taccl.lowering as lowering
    from taccl.baselines import build
    from taccl.batch.jobs import _simulate, execute
    from taccl.topology import Topology, load_spec
    from taccl.xmlio import program_to_xml

    path = sku_file(tmp_path)
    path.write_text(path.read_text().replace("  protocol: [Simple, LL]", "  protocol: [Simple, LL]\n  instances: [1, 2]"))
    task = next(t for t in plan(load_sku(path)) if t.kind == "baseline" and t.baseline == "ring")
    assert sorted((p.proto, p.instances) for p in task.programs) == [("LL", 1), ("LL", 2), ("Simple", 1),
                                                                      ("Simple", 2)]
    lowerings = []
    real = lowering._lower_ops
    monkeypatch.setattr(lowering, "_lower_ops", lambda *a, **k: lowerings.append(a[3].proto) or real(*a, **k))
    records = []
    execute(task, records.append)
    assert lowerings == ["Simple", "Simple"]
    topo = Topology(load_spec(task.topology), task.nodes)
    by_key = {r["key"]: r for r in records}
    for prog in task.programs:
        xml = by_key[prog.key]
        alone = build("ring", topo, task.collective, proto=prog.proto, instances=prog.instances, reference=True)
        alone.name = prog.label
        assert xml["status"] == "ok" and xml["xml"] == program_to_xml(alone)
        assert by_key[prog.sim_key]["time_us"] == _simulate(task, prog, xml, topo)["time_us"]


def test_targets_get_their_own_lowering_files_and_limits(tmp_path):
    """`targets:` writes each runtime's files in its own directory: RCCL's without fused steps, legacy
    MSCCL's in its dialect (out-of-place, bounded where there is scratch, at most 4 a GPU count); each
    directory passes `taccl check DIR --target`. The executor's programs keep the keys of a SKU without
    targets, so adding targets reuses its cache."""
    from taccl.cli import main
    from taccl.program import StepType
    from taccl.targets import FUSED_STEPS

    def sku(extra, name):
        path = sku_file(tmp_path, extra, name=name)
        path.write_text(path.read_text().replace("collectives: [allgather, reducescatter]",
                                                 "collectives: [allgather, allreduce]"))
        return path

    path = sku("targets: [msccl-executor, rccl, msccl-legacy]\n", "sku.yaml")
    plain = sku("", "plain.yaml")
    keys = {p.key for t in plan(load_sku(plain)) for p in t.programs}
    targeted = [p for t in plan(load_sku(path)) for p in t.programs]
    assert keys == {p.key for p in targeted if p.target == "msccl-executor"}
    assert {p.target for p in targeted if p.kind == "baseline"} == {"msccl-executor"}  # the runtime's own
    out = tmp_path / "out"
    result = run_batch(path, out, workers=2)
    assert list(result.targets) == ["msccl-executor", "rccl", "msccl-legacy"]
    for name, (sel, where) in result.targets.items():
        assert where == out / name and (where / "report.md").exists() and sel.target == name
        assert main(["check", "-q", "--target", name, str(where / "msccl-algorithms")]) == 0
    rccl = sorted((out / "rccl" / "msccl-algorithms").glob("*.xml"))
    assert rccl and all(p.name.endswith("+rccl.xml") for p in rccl)
    # RCCL selects MSCCL programs off one MI300X node only when forced: its report says how
    assert "RCCL_MSCCL_FORCE_ENABLE=1" in (out / "rccl" / "report.md").read_text()
    assert "RCCL_MSCCL_FORCE_ENABLE" not in (out / "msccl-executor" / "report.md").read_text()
    for f in rccl:
        program = read_program(str(f))
        assert not {StepType(st.type) for g in program.gpus for tb in g.threadblocks for st in tb.steps} & FUSED_STEPS
    legacy = sorted((out / "msccl-legacy" / "msccl-algorithms").glob("*.xml"))
    assert 0 < len(legacy) <= 4
    for f in legacy:
        head = f.read_text().splitlines()[0]
        assert "outofplace" not in head and 'inplace="0"' in head
        program = read_program(str(f), dialect="legacy")
        if any(g.s_chunks for g in program.gpus):
            assert program.max_bytes  # bounded: scratch is allocated for it at communicator creation


def test_legacy_keeps_the_four_windows_that_gain_most():
    from taccl.batch.selection import Group, _fit_file_limit, _windows
    from taccl.targets import get_target

    # two programs that alternate as the fastest by 2x at every one of 6 sizes: no tolerance merges them
    n = 6
    a = _c("a", [1.0 if i % 2 == 0 else 2.0 for i in range(n)])
    b = _c("b", [2.0 if i % 2 == 0 else 1.0 for i in range(n)])
    base = _c("ring", [3.0 + i for i in range(n)], kind="baseline")
    g = Group(collective="allgather", nodes=2, ranks=16, sizes=[1 << (10 + i) for i in range(n)],
              lower_bound_us=[None] * n, contenders=[base, a, b])
    g.windows = _windows(g)
    assert len(g.windows) == 6
    _fit_file_limit([g], get_target("msccl-legacy"), 0.0)
    kept = [w for w in g.windows if w.kind == "synthesized"]
    dropped = [w for w in g.windows if w.kind == "none"]
    assert len(kept) == 4 and len(dropped) == 2
    assert all("at most 4 files" in w.note for w in dropped)
    # the baseline gains least over itself at the smallest sizes: those windows go back to NCCL
    assert [w.index for w in dropped] == [0, 1]


def test_rooted_collectives_are_refused_in_a_sku(tmp_path):
    path = sku_file(tmp_path, "")
    path.write_text(path.read_text().replace("collectives: [allgather, reducescatter]",
                                             "collectives: [allgather, broadcast]"))
    with pytest.raises(UserError, match="broadcast: no MSCCL runtime reads root"):
        load_sku(path)


def test_a_baseline_no_runtime_runs_is_part_of_the_bar_but_wins_no_sizes():
    # 72 GPUs on one switch (GB200 NVL72), AllReduce: the direct baseline, lowered as NCCL's own algorithms are
    # (past the executor's 64 steps a block), was the fastest at every size and its windows were "left to
    # NCCL", whose own algorithm is not direct and took 5-11x longer. Only what a runtime runs may win a size:
    # NCCL's own algorithms (ring, trees), synthesized programs, baseline files the target loads
    from taccl.batch.jobs import ProgramJob
    from taccl.batch.selection import Group, _undeliverable, _windows
    from taccl.targets import get_target

    store = {"direct": {"max_steps": 142, "max_nodes": 300}, "direct-small": {"max_steps": 40, "max_nodes": 300}}

    def job(name, key=None):
        return ProgramJob(key=key or name, sim_key="", label=name, kind="baseline", source=name, proto="LL",
                          instances=1)

    executor, rccl = get_target("msccl-executor"), get_target("rccl")
    why = _undeliverable(job("direct"), store, executor, True)
    assert "142 steps in a thread block > 64 (MSCCL_MAX_NUM_STEPS)" in why and "NCCL does not run direct" in why
    assert _undeliverable(job("direct", "direct-small"), store, executor, True) == ""
    assert "not NCCL's algorithm" in _undeliverable(job("direct", "direct-small"), store, executor, False)
    assert "rccl runs no baseline file" in _undeliverable(job("one-shot", "direct-small"), store, rccl, True)
    assert _undeliverable(job("ring", "direct"), store, rccl, False) == ""  # NCCL's own: the runtime runs it

    direct = _c("direct/LL", [10.0, 60.0], kind="baseline")
    direct.undeliverable = why
    ring = _c("ring/LL", [100.0, 300.0], kind="baseline")
    syn = _c("sk/Simple", [140.0, 200.0])
    g = Group(collective="allreduce", nodes=1, ranks=72, sizes=[1 << 16, 1 << 24], lower_bound_us=[None, None],
              contenders=[direct, ring, syn], optimum_us=[5.0, 40.0])
    windows = _windows(g)
    assert [(w.winner, w.sizes) for w in windows] == [("ring/LL", [1 << 16]), ("sk/Simple", [1 << 24])]
    assert all(w.best_baseline == ["direct/LL"] for w in windows)  # still the bar
    assert windows[1].speedup == [60.0 / 200.0]
    assert all(f"faster, not run: direct/LL ({why})" in w.note for w in windows)


def test_rings_and_trees_are_also_built_on_all_of_nccls_channels(tmp_path):
    # One DGX H100 node has one ring: on the SKU's 1 and 4 instances it ran on 1 or 4 thread blocks, which cannot
    # fill an NVSwitch port (64 MiB AllGather: 720 us on 4, where NCCL's 32 channels take 185 simulated and 192
    # measured), so synthesized programs "beat" a ring NCCL does not run. The bar holds the 32-channel ring.
    from taccl.baselines import build_protocols
    from taccl.batch.jobs import baseline_instances
    from taccl.simulator import simulate
    from taccl.topology import Topology, load_spec

    sku = tmp_path / "one-node.yaml"
    sketch = ROOT / "sketches" / "dgx-h100-direct.json"
    sku.write_text(f"name: one-node\ntopology: dgx-h100\nnodes: [1, 2]\ncollectives: [allgather, allreduce]\n"
                   f"sizes: [64MiB]\ncandidates:\n  - sketch: {sketch}\nbaselines:\n"
                   f"  names: [ring, double-binary-tree, direct]\n  protocol: [Simple]\n  instances: [1, 4]\n")
    labels = {(t.nodes, p.label) for t in plan(load_sku(sku)) if t.kind == "baseline" for p in t.programs}
    assert {(1, "ring/Simple.i32"), (1, "double-binary-tree/Simple.i16")} <= labels
    # on two nodes NCCL's channels follow the NICs (a ring per NIC, as the SKU's instances have them)
    assert not {label for n, label in labels if n == 2 and re.search(r"\.i(32|16)$", label)}
    assert not {label for _, label in labels if label.startswith("direct/") and label.endswith(".i32")}
    assert baseline_instances((1, 4), 32) == (1, 4, 32) and baseline_instances((1, 4), 4) == (1, 4)
    topo = Topology(load_spec("dgx-h100"), 1)
    times = {i: simulate(build_protocols("ring", topo, "allgather", ["Simple"], instances=i)["Simple"], topo,
                         64 << 20).time_us for i in (4, 32)}
    assert times[32] < 0.3 * times[4] and abs(times[32] / 192.4 - 1) < 0.25  # NCCL measured 192.4 us


@pytest.mark.parametrize("flags,needle", [
    (["--ray-address", "1.2.3.4:6379"], "--ray-address: a Ray cluster serves --executor ray only"),  # was ignored
    (["--dry-run", "--prune"], "--prune: --dry-run runs and deletes nothing"),  # --prune was ignored
])
def test_batch_flags_that_would_do_nothing_are_refused(tmp_path, capsys, flags, needle):
    assert main(["batch", str(sku_file(tmp_path)), "-o", str(tmp_path / "out")] + flags) == 2
    assert needle in capsys.readouterr().err and not (tmp_path / "out").exists()


def test_a_rerun_keeps_foreign_files_and_names_what_is_stale(small, tmp_path, capsys):
    """A rerun replaces msccl-algorithms/ whole: a file of the user's there was deleted silently (refused now,
    before any work); a plot of a group the report no longer shows, or any with --no-plots, passed for this
    run's (removed; other files of plots/ stay); another layout's target directory is named as not updated."""
    _, built = small
    out = tmp_path / "out"
    shutil.copytree(built, out)
    mine = out / "msccl-algorithms" / "my-allreduce.xml"
    mine.write_text("<algo/>")
    for flags in ([], ["--dry-run"]):
        assert main(["batch", str(SMALL), "-o", str(out), "--workers", "1"] + flags) == 2
        err = capsys.readouterr().err
        assert "holds 'my-allreduce.xml', which no batch writes" in err and err.count("\n") == 1, err
    assert mine.read_text() == "<algo/>"
    mine.unlink()
    (out / "plots" / "alltoall-16r.png").write_bytes(b"old")
    (out / "plots" / "notes.png").write_bytes(b"mine")
    (out / "rccl").mkdir()
    (out / "rccl" / "selection.json").write_text("{}")
    assert main(["batch", str(SMALL), "-o", str(out), "--workers", "1", "--no-plots"]) == 0
    assert [p.name for p in (out / "plots").iterdir()] == ["notes.png"]
    assert f"note: {out / 'rccl' / 'msccl-algorithms'} is left from an earlier run" in capsys.readouterr().err


def test_a_job_whose_programs_all_fail_counts_as_failed_everywhere(tmp_path, capsys):
    """A synthesis whose every program exceeded the thread blocks was FAILED in the progress lines, ok in
    selection.json, 0 'failed jobs' in the report and left out of the summary's count: one definition now."""
    sku = tmp_path / "sku.yaml"
    sku.write_text(f"name: tight\ntopology: dgx-h100\nnodes: [2]\ncollectives: [allgather]\nsizes: [4KiB, 1MiB]\n"
                   f"synthesis_sizes: [64KiB]\ntime_limit_s: 10\nmax_tbs: 2\ncandidates:\n"
                   f"  - sketch: {ROOT / 'sketches' / 'dgx-h100-direct.json'}\n    variants: {{protocol: [LL], instances: [1]}}\n"
                   f"baselines: {{protocol: [Simple], instances: [1], emit: nccl}}\n")
    out = tmp_path / "out"
    assert main(["batch", str(sku), "-o", str(out), "--workers", "1", "--no-plots"]) == 0
    err = capsys.readouterr().err
    assert err.count("FAILED ") == 3 and "3 failed" in err
    jobs = json.loads((out / "selection.json").read_text())["jobs"]
    assert [j["status"] for j in jobs] == ["failed"] * 3
    assert "no program of it could be lowered and simulated" in jobs[0]["reason"]
    assert "| 3 | 4KiB, 1MiB |" in (out / "report.md").read_text()
    # and --dry-run says so (it showed them as plain "cached")
    assert main(["batch", str(sku), "-o", str(out), "--dry-run"]) == 0
    listing = capsys.readouterr().out
    assert listing.count("cached failure ") == 3 and "3 cached (3 of them failed: --retry-failed" in listing
