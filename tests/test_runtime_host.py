"""Host backend through the Python binding: every shared and baseline program, every reduction, a spread of
types and sizes (including chunks that are not a multiple of the tile), in-place and out-of-place, against
a reference computed from the collective's definition. Plus the failure behaviour: refused files, the
race and cycle analysis, the watchdog, selection from MSCCL_XML_FILES, and the `taccl run` command."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from taccl.errors import CheckFailed, UserError

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "runtime" / "tests" / "data"
SHARED_XML = ROOT.parent / "shared" / "data" / "msccl-xml"


@pytest.fixture(scope="module", autouse=True)
def built():
    r = subprocess.run(["make", "-C", str(ROOT / "runtime"), "-j2", "build/libtaccl_runtime.so"],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]


def rt_mod():
    from taccl import runtime
    return runtime


# (file, sizes in "elements of the larger buffer" multiples of the chunk unit)
PROGRAMS = [
    (SHARED_XML / "r48ll.xml", [64 * 1040 * 8]),                # allreduce, LL, window 266240..2078719 B
    (SHARED_XML / "ar_ll128.xml", [40 * 2560 * 4]),             # allreduce, LL128
    (SHARED_XML / "a2a2ll.xml", [16 * 8, 16 * 24]),             # alltoall
    (SHARED_XML / "ag_hier_4_LL.xml", [16 * 4, 16 * 100]),      # allgather
    (DATA / "ring_allgather_4.xml", [8 * 3, 8 * 101]),
    (DATA / "ring_allgather_8.xml", [8 * 5]),
    (DATA / "ring_allreduce_4.xml", [8 * 7, 8 * 333]),
    (DATA / "ring_allreduce_8.xml", [32 * 9]),
    (DATA / "ring_reducescatter_4.xml", [4 * 3, 4 * 250]),
    (DATA / "direct_alltoall_4.xml", [4 * 4 * 5]),
    (DATA / "direct_allreduce_4.xml", [4 * 11, 4 * 257]),
    (DATA / "direct_allreduce_3.xml", [3 * 19]),
    (DATA / "chain_broadcast_4.xml", [4 * 13]),
    (DATA / "chain_reduce_4.xml", [2 * 77]),
    (DATA / "swap_alltoall_inplace_2.xml", [2 * 40, 2 * 999]),
]
TYPES = ["int8", "uint32", "int64", "float16", "bfloat16", "float32", "float64"]


def _ids(p):
    return p[0].name


@pytest.mark.parametrize("prog", PROGRAMS, ids=[_ids(p) for p in PROGRAMS])
@pytest.mark.parametrize("op", ["sum", "prod", "min", "max"])
def test_program_matches_reference(prog, op):
    runtime = rt_mod()
    path, sizes = prog
    if not path.exists():
        pytest.skip(f"{path} missing")
    with runtime.Runtime(timeout_ms=5000) as rt:
        idx = rt.load(path)
        info = rt.info(idx)
        modes = [m for m, ok in ((False, info.outofplace), (True, info.inplace)) if ok]
        for k, elems in enumerate(sizes):
            for dt in TYPES[k % 2::2] if len(sizes) > 1 else TYPES:
                mult = info.ngpus if info.coll in ("allgather", "reducescatter", "alltoall") else 1
                count = elems // mult
                for inplace in modes:
                    inputs = runtime.make_inputs(info.coll, dt, op, info.ngpus, count, seed=k + 17 * len(dt))
                    out = rt.run_raw(info.coll, dt, op, inputs, inplace=inplace, program=idx)
                    assert out.status == "done", out.message
                    ref = runtime.reference(info.coll, dt, op, inputs)
                    for r in range(info.ngpus):
                        if ref[r] is not None:
                            assert np.array_equal(out.outputs[r], ref[r]), \
                                f"{path.name} {dt} {op} inplace={inplace} rank {r}"


@pytest.mark.parametrize("tile", [24, 40, 96, 1000])
def test_ragged_tiles(tile):
    """Chunks that are not a multiple of the tile: several tiles per chunk and a short last one."""
    runtime = rt_mod()
    for path, elems in [(DATA / "ring_allreduce_4.xml", 8 * 101), (DATA / "direct_allreduce_4.xml", 4 * 77),
                        (DATA / "ring_allgather_4.xml", 8 * 45), (DATA / "ring_reducescatter_4.xml", 4 * 63),
                        (SHARED_XML / "ag_hier_4_LL.xml", 16 * 33), (DATA / "chain_broadcast_4.xml", 4 * 55)]:
        if not path.exists():
            continue
        with runtime.Runtime(timeout_ms=5000, tile_bytes=tile) as rt:
            idx = rt.load(path)
            info = rt.info(idx)
            mult = info.ngpus if info.coll in ("allgather", "reducescatter", "alltoall") else 1
            for dt in ("float32", "int8", "float64"):
                inputs = runtime.make_inputs(info.coll, dt, "sum", info.ngpus, elems // mult, seed=tile)
                for inplace in [m for m, ok in ((False, info.outofplace), (True, info.inplace)) if ok]:
                    out = rt.run_raw(info.coll, dt, "sum", inputs, inplace=inplace, program=idx)
                    assert out.status == "done", out.message
                    ts = np.dtype(inputs[0].dtype).itemsize
                    assert out.tiles == -(-(elems // info.nchunksperloop) // max(1, tile // ts))
                    ref = runtime.reference(info.coll, dt, "sum", inputs)
                    for r in range(info.ngpus):
                        assert np.array_equal(out.outputs[r], ref[r]), f"{path.name} tile={tile} {dt} rank {r}"


def test_watchdog_stops_fifo_deadlock_and_names_blocks():
    runtime = rt_mod()
    with pytest.raises(CheckFailed) as e:
        runtime.run_program(DATA / "bad_fifo_deadlock.xml", size=3 * 4 * 8, dtype="int32", timeout_ms=300)
    msg = str(e.value)
    assert "deadlock" in msg and "rank 0 tb 0 step 2" in msg and "rank 1 tb 0 step 2" in msg


def test_cycle_refused_at_load_and_stopped_by_watchdog_without_analysis():
    runtime = rt_mod()
    with pytest.raises(UserError, match="dependency cycle"):
        runtime.run_program(DATA / "bad_cycle_deadlock.xml", size=64, dtype="int32")
    with pytest.raises(CheckFailed, match=r"rank 0 tb 0 step 0 \(tile 0\): waits for data from rank 1"):
        runtime.run_program(DATA / "bad_cycle_deadlock.xml", size=64, dtype="int32", timeout_ms=300, analysis=False)


def test_a_run_the_memory_cannot_hold_is_an_error_not_a_traceback(monkeypatch):
    # the estimate is against the machine's memory; less may be free (a ulimit): numpy's MemoryError escaped
    runtime = rt_mod()

    def no_memory(*args, **kwargs):
        raise MemoryError

    monkeypatch.setattr(runtime, "make_inputs", no_memory)
    with pytest.raises(UserError, match="not enough memory for the buffers of a run of 1,024 bytes on 4 ranks"):
        runtime.run_program(DATA / "ring_allreduce_4.xml", size=1024)


def test_race_refused():
    runtime = rt_mod()
    with pytest.raises(UserError, match=r"data race on chunk o\[0\].*tb 0 step 1.*tb 1 step 0"):
        runtime.run_program(DATA / "bad_race.xml", size=64, dtype="int32")


def test_malformed_file_refused_with_location(tmp_path):
    runtime = rt_mod()
    text = (DATA / "ring_allreduce_4.xml").read_text().splitlines()
    text[5] = text[5].replace('cnt="1"', 'cnt="1" ').replace("depid", " depid")
    bad = tmp_path / "bad.xml"
    bad.write_text("\n".join(text) + "\n")
    with pytest.raises(UserError) as e:
        runtime.run_program(bad, size=8 * 4 * 4)
    assert f"{bad}:6:" in str(e.value) and "two spaces" in str(e.value)


def test_env_selection_by_size_window_and_inplace(tmp_path, monkeypatch):
    runtime = rt_mod()
    small = tmp_path / "small.xml"
    small.write_text((DATA / "ring_allreduce_4.xml").read_text().replace('maxBytes="0"', 'maxBytes="4096"'))
    monkeypatch.setenv("MSCCL_XML_FILES", f"{small}:{DATA / 'direct_allreduce_4.xml'}:{DATA / 'ring_allgather_4.xml'}")
    with runtime.Runtime() as rt:
        assert rt.load_from_env() == 3
        assert rt.select("allreduce", 4, 1024, "float32", False) == 0  # 4096 B: inside the window
        assert rt.select("allreduce", 4, 1032, "float32", False) == 1  # too big for the first: next match
        assert rt.select("allreduce", 4, 1026, "float32", False) == -1  # not divisible by 8 nor 4 -> 1026 % 4 != 0
        assert rt.select("allgather", 4, 2, "float32", True) == 2
        assert rt.select("allgather", 8, 2, "float32", True) == -1
        inputs = runtime.make_inputs("allreduce", "float32", "sum", 4, 1032)
        out = rt.run_raw("allreduce", "float32", "sum", inputs)
        assert out.status == "done" and out.program == 1
        out = rt.run_raw("allreduce", "float32", "sum", runtime.make_inputs("allreduce", "float32", "sum", 4, 1034))
        assert out.status == "no_match"
    monkeypatch.delenv("MSCCL_XML_FILES")
    monkeypatch.setenv("TACCL_XML_FILES", str(DATA / "bad_race.xml"))
    with runtime.Runtime() as rt, pytest.raises(UserError, match="data race"):
        rt.load_from_env()


def _cli(*args):
    return subprocess.run([sys.executable, "-m", "taccl.cli", "run", *map(str, args)], capture_output=True,
                          text=True, cwd=ROOT, timeout=120)


def test_cli_run_check_and_json():
    r = _cli(DATA / "ring_allreduce_4.xml", "--ranks", "4", "--size", "64K", "--check", "--dtype", "bfloat16",
             "--op", "max")
    assert r.returncode == 0, r.stderr
    assert "check OK" in r.stdout
    r = _cli(DATA / "ring_allgather_4.xml", "--size", "4096", "--inplace", "--check", "--json")
    assert r.returncode == 0, r.stderr
    import json
    rep = json.loads(r.stdout)
    assert rep["inplace"] and rep["checked"] and rep["wrong"] == 0


def test_cli_errors_have_exit_codes():
    r = _cli(DATA / "ring_allreduce_4.xml", "--ranks", "8", "--size", "64K")
    assert r.returncode == 2 and "written for 4 ranks" in r.stderr and "Traceback" not in r.stderr
    r = _cli(DATA / "ring_allreduce_4.xml", "--size", "100")
    assert r.returncode == 2 and "nearest sizes" in r.stderr
    r = _cli(DATA / "bad_fifo_deadlock.xml", "--size", "96", "--dtype", "int32", "--timeout-ms", "200")
    assert r.returncode == 1 and "deadlock" in r.stderr
    r = _cli(DATA / "nonexistent.xml")
    assert r.returncode == 2 and "Traceback" not in r.stderr
    r = _cli(DATA / "direct_alltoall_4.xml", "--inplace", "--size", "1K")
    assert r.returncode == 2 and "not for in-place" in r.stderr


def test_runtime_sweep_checks_every_case(tmp_path):
    """benchmarks/runtime_sweep.py (the correctness sweep run on a lent GPU) on the host backend: every
    program x type x mode x size checked, rounded sizes, a JSON record per run, exit 0 only when all are
    right."""
    out = tmp_path / "runs.json"
    files = [str(DATA / "ring_allreduce_4.xml"), str(DATA / "ring_allgather_4.xml")]
    r = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "runtime_sweep.py"), "--sizes", "1000,4KiB",
                        "--dtypes", "float32,bfloat16", "--iters", "2", "--json", str(out), *files],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "0 wrong, 0 deadlocked, 0 failed" in r.stdout
    import json
    runs = json.loads(out.read_text())
    assert {x["status"] for x in runs} == {"ok"}
    assert {x["bytes"] for x in runs if x["program"] == "ring_allreduce_4.xml" and x["dtype"] == "float32"} \
        == {1024, 4096}  # 1000 B rounded up to a multiple of 8 chunks x 4 bytes
    bad = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "runtime_sweep.py"), "--dtypes", "float33",
                          files[0]], capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "unknown dtype" in bad.stderr


def test_runtime_latency_takes_a_call_apart_into_its_cost_and_hops(tmp_path):
    """benchmarks/runtime_latency.py (run on a lent GPU) on the host backend: one ring AllGather a rank count
    and protocol, each checked once and timed per mode, a call cost and a hop from the line through them; the
    CUDA timing options are accepted by any handle, and an unknown mode is refused."""
    r = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "runtime_latency.py"), "--backend", "host",
                        "--ranks", "2,4", "--protos", "LL,LL128", "--modes", "hold,no-hold,ll128-lines",
                        "--calls", "2", "--warmup", "0", "--keep", str(tmp_path)],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    rows = [line.split() for line in r.stdout.splitlines()[2:]]
    assert [row[:2] for row in rows] == [["LL", "hold"], ["LL", "no-hold"], ["LL128", "hold"], ["LL128", "no-hold"],
                                         ["LL128", "ll128-lines"]]  # lines only for LL128 programs
    assert all(len(row) == 6 and float(row[2]) > 0 for row in rows)
    assert {p.name for p in tmp_path.iterdir()} == {f"ring-allgather-{n}r-{p}.xml" for p in ("LL", "LL128")
                                                     for n in (2, 4)}
    with rt_mod().Runtime() as rt:
        for name in ("cuda_hold", "cuda_cooperative"):
            rt._option(name, 0)
        with pytest.raises(UserError):
            rt._option("cuda_holds", 1)
    bad = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "runtime_latency.py"), "--modes", "fast"],
                         capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "unknown mode" in bad.stderr


@pytest.mark.parametrize("inplace,outofplace,o_chunks,input_only,accepted", [
    # an in-place AllReduce that names only its input buffer: the executor ignores o_chunks (legacy wants 0 or 8)
    ("1", "0", "3", True, True),
    ("1", "1", "5", False, False),  # out-of-place steps use o[5..7], which o_chunks=5 does not declare
    ("1", "0", "9", True, False),   # past the output buffer
    ("0", "0", "8", False, False),  # no call ever selects it
])
def test_check_and_run_accept_the_same_files(tmp_path, inplace, outofplace, o_chunks, input_only, accepted):
    from taccl.cli import main

    text = (DATA / "ring_allreduce_4.xml").read_text()  # 8 chunks a loop, in and out of place
    assert 'inplace="1" outofplace="1"' in text and text.count('o_chunks="8"') == 4
    text = text.replace('inplace="1" outofplace="1"', f'inplace="{inplace}" outofplace="{outofplace}"')
    if input_only:  # in place, output chunk j is input chunk j
        text = text.replace('srcbuf="o"', 'srcbuf="i"').replace('dstbuf="o"', 'dstbuf="i"')
    path = tmp_path / "ar.xml"
    path.write_text(text.replace('o_chunks="8"', f'o_chunks="{o_chunks}"', 1))
    checked = main(["check", str(path), "-q"]) == 0
    ran = _cli(path, "--size", "64K", "--check", *(["--inplace"] if inplace == "1" else [])).returncode == 0
    assert checked == ran == accepted
    if accepted:
        assert main(["check", str(path), "-q", "--dialect", "legacy"]) != 0  # the legacy loader would refuse it


def test_baseline_and_lower_declare_in_place_where_proven(tmp_path):
    from taccl.cli import main
    from taccl.xmlio import read_program

    ring, a2a = tmp_path / "ring.xml", tmp_path / "a2a.xml"
    assert main(["baseline", "ring", "-t", "ndv2", "-c", "allreduce", "-o", str(ring), "-q"]) == 0
    assert main(["baseline", "direct", "-t", "dgx2", "-c", "alltoall", "-o", str(a2a), "-q"]) == 0
    assert read_program(str(ring)).inplace and not read_program(str(a2a)).inplace  # an AllToAll cannot be
    r = _cli(ring, "--size", "64K", "--inplace", "--check")
    assert r.returncode == 0 and "in-place" in r.stdout, r.stderr
    assert main(["solve", str(ROOT / "sketches" / "ndv2-sk-1.json"), "-o", str(tmp_path), "--no-xml", "-q"]) == 0
    lowered = tmp_path / "lowered.xml"
    assert main(["lower", str(next(tmp_path.glob("*.algo.json"))), "-o", str(lowered), "-q"]) == 0
    assert read_program(str(lowered)).inplace
    assert _cli(lowered, "--size", "64K", "--inplace", "--check").returncode == 0


def test_direct_transfers_only_where_proven_safe():
    """The loader lets a send write straight into its receiver's buffer where every other access of the
    receiving rank to those chunks is ordered before the send or after the receive. The swap fixture's
    receive overwrites chunks that its rank's other block still has to send, ordered by a local dependency
    only: a direct write there would send the peer its own data back (a loader without the check fails
    every run of the loop below)."""
    runtime = rt_mod()
    expect = {"ring_allgather_8.xml": (56, 56), "ring_allreduce_4.xml": (24, 48), "ring_reducescatter_4.xml": (0, 12),
              "direct_allreduce_4.xml": (24, 24), "swap_alltoall_inplace_2.xml": (0, 2)}
    for name, (direct, receives) in expect.items():
        with runtime.Runtime() as rt:
            info = rt.info(rt.load(DATA / name))
            assert (info.direct_receives, info.receives) == (direct, receives), name
    # every tile of the swap is its own chance for a direct write to overtake the read
    with runtime.Runtime(tile_bytes=256) as rt:
        idx = rt.load(DATA / "swap_alltoall_inplace_2.xml")
        for seed in range(20):
            inputs = runtime.make_inputs("alltoall", "float32", "sum", 2, 1 << 12, seed)
            out = rt.run_raw("alltoall", "float32", "sum", inputs, inplace=True, program=idx)
            ref = runtime.reference("alltoall", "float32", "sum", inputs)
            assert all(np.array_equal(out.outputs[r], ref[r]) for r in range(2)), seed


@pytest.mark.parametrize("direct", [True, False])
def test_direct_and_fifo_transfers_agree(direct):
    runtime = rt_mod()
    for name, elems in (("ring_allgather_8.xml", 8 * 1001), ("ring_allreduce_8.xml", 32 * 77),
                        ("direct_allreduce_4.xml", 4 * 513), ("chain_broadcast_4.xml", 4 * 300)):
        with runtime.Runtime(tile_bytes=512, direct=direct) as rt:
            idx = rt.load(DATA / name)
            info = rt.info(idx)
            mult = info.ngpus if info.coll in ("allgather", "reducescatter", "alltoall") else 1
            for inplace in (False, True):
                inputs = runtime.make_inputs(info.coll, "int32", "sum", info.ngpus, elems // mult, seed=5)
                out = rt.run_raw(info.coll, "int32", "sum", inputs, inplace=inplace, program=idx)
                assert out.status == "done", out.message
                ref = runtime.reference(info.coll, "int32", "sum", inputs)
                assert all(ref[r] is None or np.array_equal(out.outputs[r], ref[r]) for r in range(info.ngpus))


@pytest.mark.parametrize("inplace,src,dst,refused", [
    ("0", "s", "s", True),    # s[0..1] -> s[1..2] in one buffer
    ("1", "i", "o", True),    # in place, o is i: i[0..1] -> i[1..2]
    ("0", "i", "o", False),   # out of place: two buffers
])
def test_overlapping_step_refused_by_runtime_and_checker(tmp_path, inplace, src, dst, refused):
    """A step whose source and destination overlap without being the same chunks races on the GPU, whose
    threads move the elements in parallel; the loader and `taccl check` both refuse it."""
    from taccl.cli import main

    path = tmp_path / "overlap.xml"
    path.write_text(
        f'<algo name="overlap" proto="Simple" nchannels="1" nchunksperloop="3" ngpus="1" coll="allreduce" '
        f'inplace="{inplace}" outofplace="{1 - int(inplace)}" minBytes="0" maxBytes="0">\n'
        f'  <gpu id="0" i_chunks="3" o_chunks="3" s_chunks="3">\n    <tb id="0" send="-1" recv="-1" chan="0">\n'
        f'      <step s="0" type="cpy" srcbuf="i" srcoff="0" dstbuf="{src}" dstoff="0" cnt="3" depid="-1" deps="-1" '
        f'hasdep="0"/>\n'
        f'      <step s="1" type="cpy" srcbuf="{src}" srcoff="0" dstbuf="{dst}" dstoff="1" cnt="2" depid="-1" '
        f'deps="-1" hasdep="0"/>\n'
        f'      <step s="2" type="cpy" srcbuf="i" srcoff="0" dstbuf="o" dstoff="0" cnt="3" depid="-1" deps="-1" '
        f'hasdep="0"/>\n    </tb>\n  </gpu>\n</algo>\n')
    r = _cli(path, "--size", "1020", "--check", *(["--inplace"] if inplace == "1" else []))
    if refused:
        assert r.returncode == 2 and "overlap" in r.stderr, r.stderr
        assert main(["check", str(path), "-q"]) != 0
    else:
        assert r.returncode == 0, r.stderr
        assert main(["check", str(path), "-q"]) == 0


def test_rooted_program_runs_only_for_its_root(tmp_path):
    """No MSCCL runtime reads root (a root-0 Broadcast would serve a root-2 call, wrongly); taccl's runtime
    selects and runs a rooted program only for calls with its root."""
    runtime = rt_mod()
    text = (DATA / "chain_broadcast_4.xml").read_text()
    assert "root=" not in text  # root 0 when absent
    two = tmp_path / "bcast-root2.xml"
    two.write_text(text.replace('coll="broadcast"', 'coll="broadcast" root="2"'))
    assert runtime.run_program(DATA / "chain_broadcast_4.xml", size=4 * 64, dtype="int32", root=0)["wrong"] == 0
    with pytest.raises(UserError, match="program for root 0 cannot run a call with root 2"):
        runtime.run_program(DATA / "chain_broadcast_4.xml", size=4 * 64, dtype="int32", root=2)
    with pytest.raises(UserError, match="program for root 2 cannot run a call with root 0"):
        runtime.run_program(two, size=4 * 64, dtype="int32", root=0)
    with runtime.Runtime() as rt:  # selection: the file for the call's root, whatever the load order
        first, second = rt.load(DATA / "chain_broadcast_4.xml"), rt.load(two)
        for root, want in ((0, first), (2, second)):
            inputs = runtime.make_inputs("broadcast", "int32", "sum", 4, 64, seed=root)
            out = rt.run_raw("broadcast", "int32", "sum", inputs, root=root)
            assert out.status == "done" and out.program == want, out.message
        out = rt.run_raw("broadcast", "int32", "sum", runtime.make_inputs("broadcast", "int32", "sum", 4, 64, 1), root=1)
        assert out.status == "no_match" and "root 1" in out.message
