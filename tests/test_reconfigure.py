"""Live reconfiguration in the runtime (issue 13): a running communicator takes a new program set at an
epoch (a call sequence number), calls never mix sets, and a bad set is refused whole while the old one serves."""
from __future__ import annotations

import random
import subprocess
import threading
from pathlib import Path

import numpy as np
import pytest

from taccl.errors import UserError

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "runtime" / "tests" / "data"


@pytest.fixture(scope="module", autouse=True)
def built():
    r = subprocess.run(["make", "-C", str(ROOT / "runtime"), "-j2", "build/libtaccl_runtime.so"],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]


@pytest.fixture(scope="module")
def sets(tmp_path_factory):
    """Three program sets for 16 ranks (2x NDv2), each serving AllReduce (ring, hierarchical, or ring on two
    instances) and AllGather, in directories as a batch writes them."""
    from taccl.baselines import build
    from taccl.lowering import write_program
    from taccl.topology import load_topology

    topo = load_topology("ndv2", 2)
    base = tmp_path_factory.mktemp("sets")
    dirs = []
    for k, (name, instances) in enumerate((("ring", 1), ("hierarchical", 1), ("ring", 2))):
        d = base / f"set{k}"
        d.mkdir()
        write_program(build(name, topo, "allreduce", instances=instances), d / "allreduce.xml")
        write_program(build("ring", topo, "allgather", instances=1 + k % 2), d / "allgather.xml")
        dirs.append(d)
    return dirs


def _as_legacy(text: str) -> str:
    """The same program in the legacy dialect: no outofplace (inplace="0" then means out-of-place only), no
    window attributes."""
    head = text.splitlines()[0]
    return text.replace(head, head.replace(' outofplace="1"', "").replace(' inplace="1"', ' inplace="0"')
                        .replace(' minBytes="0" maxBytes="0"', ""))


def _call(rt, rng, runtime):
    coll = rng.choice(["allreduce", "allgather"])
    count = 16 * rng.choice([4, 32])
    inputs = runtime.make_inputs(coll, "int32", "sum", 16, count, seed=rng.randrange(1 << 30))
    out = rt.run_raw(coll, "int32", "sum", inputs)
    ref = runtime.reference(coll, "int32", "sum", inputs)
    right = out.status == "done" and all(np.array_equal(out.outputs[r], ref[r]) for r in range(16))
    return out, right


def _run_with_swaps(runtime, sets, calls: int, swaps: int, seed: int, broken: Path) -> None:
    """`calls` collectives on one communicator while another thread swaps sets in `swaps` times at random
    moments (and offers a broken set once): every result right, and every call on exactly the set whose
    epoch it reached."""
    rng = random.Random(seed)
    with runtime.Runtime(timeout_ms=20000) as rt:
        rt.swap(sets[0])
        assert _call(rt, rng, runtime)[1]  # the job runs before the first swap is offered
        first = rt.next_call
        done = threading.Event()
        epochs, refused = [], []

        def swapper():
            srng = random.Random(seed + 1)
            for k in range(swaps):
                if k == swaps // 2:
                    try:
                        rt.swap(broken)
                    except UserError as exc:
                        refused.append(str(exc))
                # half as soon as possible, half announced a few calls ahead of the last one waiting (a call
                # may pass the announced epoch first: the swap is refused, and proposed again later)
                for _ in range(100):
                    ahead = None if k % 2 else max([rt.next_call] + [e + 1 for e in epochs]) + srng.randrange(1, 4)
                    try:
                        epochs.append(rt.swap(sets[(k + 1) % len(sets)], epoch=ahead))
                        break
                    except UserError as exc:
                        assert "has passed" in str(exc)
                threading.Event().wait(srng.uniform(0.0, 0.02))
                if done.is_set():
                    break

        t = threading.Thread(target=swapper)
        t.start()
        stamps = []
        try:
            for _ in range(calls):
                out, right = _call(rt, rng, runtime)
                assert right, out.message
                stamps.append((out.call, out.generation))
        finally:
            done.set()
            t.join()
        assert len(refused) == 1 and "data race" in refused[0]
        assert len(epochs) == swaps, "the swaps must all land while the calls run"
        # the set a call ran on is the last one whose epoch the call had reached: no call mixes or skips
        gen0 = stamps[0][1]
        for call, generation in stamps:
            assert call >= first
            assert generation == gen0 + sum(e <= call for e in epochs), (call, generation, epochs)


def test_a_thousand_calls_with_twenty_swaps_and_a_broken_set(sets, tmp_path):
    from taccl import runtime

    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "allreduce.xml").write_text((DATA / "bad_race.xml").read_text())
    _run_with_swaps(runtime, sets, 1000, 20, seed=7, broken=broken)


def test_several_communicators_swap_concurrently(sets, tmp_path):
    from taccl import runtime

    broken = tmp_path / "broken.xml"
    broken.write_text((DATA / "bad_race.xml").read_text())
    errors = []

    def job(seed):
        try:
            _run_with_swaps(runtime, sets, 120, 6, seed=seed, broken=broken)
        except BaseException as exc:  # reported by the main thread
            errors.append(exc)

    threads = [threading.Thread(target=job, args=(s,)) for s in (1, 2, 3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors[0]


def test_bad_sets_are_refused_and_the_old_one_serves(sets, tmp_path):
    from taccl import runtime

    legacy = tmp_path / "legacy.xml"
    legacy.write_text(_as_legacy((sets[0] / "allgather.xml").read_text()))
    mixed = tmp_path / "mixed"
    mixed.mkdir()
    (mixed / "a.xml").write_text((sets[1] / "allreduce.xml").read_text())
    (mixed / "b.xml").write_text(legacy.read_text())
    rng = random.Random(3)
    with runtime.Runtime() as rt:
        rt.swap(sets[0])
        for _ in range(3):
            assert _call(rt, rng, runtime)[1]
        cases = [
            (DATA / "ring_allreduce_8.xml", None, "holds no program for 16 ranks, this communicator's "
                                                  r"\(.*ring_allreduce_8.xml is written for 8\)"),
            (sets[1] / "allgather.xml", None, "the new set has no allreduce program for 16 ranks"),
            (mixed, None, "mixes XML dialects"),
            (sets[1], 1, "epoch 1 has passed: the communicator's next call is number"),
            (tmp_path / "missing.xml", None, "cannot open the file"),
        ]
        for path, epoch, needle in cases:
            with pytest.raises(UserError, match=needle):
                rt.swap(path, epoch=epoch)
        rt.swap(sets[1], epoch=rt.next_call + 5)
        with pytest.raises(UserError, match="already waiting for epoch"):
            rt.swap(sets[2], epoch=rt.next_call + 5)
        gen = _call(rt, rng, runtime)[0].generation
        for _ in range(8):  # the old set until the epoch, then the new one
            out, right = _call(rt, rng, runtime)
            assert right
        assert out.generation == gen + 1


def test_a_watched_directory_is_swapped_in_and_a_bad_one_reported(sets, tmp_path):
    """A batch rewrites its MSCCL_ALGO_DIR whole; a watching communicator takes the new files without
    stopping, and keeps the old set (reporting why) when the new files are refused."""
    import os
    import shutil
    import time

    from taccl import runtime

    live = tmp_path / "algos"
    shutil.copytree(sets[0], live)
    rng = random.Random(5)
    with runtime.Runtime() as rt:
        rt.swap(live)
        rt.watch(live, every_ms=10)
        gen = _call(rt, rng, runtime)[0].generation

        def rewrite(src):  # as the batch does: build aside, then swap the directory in
            staging = tmp_path / "staging"
            shutil.copytree(src, staging)
            old = tmp_path / "old"
            os.replace(live, old)
            os.replace(staging, live)
            shutil.rmtree(old)

        def wait_for(pred):
            for _ in range(500):
                if pred():
                    return True
                time.sleep(0.01)
            return False

        rewrite(sets[1])
        assert wait_for(lambda: rt.watch_status()[0] == 1)
        out, right = _call(rt, rng, runtime)
        assert right and out.generation == gen + 1
        broken = tmp_path / "broken"
        broken.mkdir()
        (broken / "allreduce.xml").write_text((DATA / "bad_race.xml").read_text())
        rewrite(broken)
        assert wait_for(lambda: "data race" in rt.watch_status()[1])
        out, right = _call(rt, rng, runtime)
        assert right and out.generation == gen + 1  # the set before keeps serving
        rt.watch(None)


def test_tenant_share_is_honoured_by_bounds_simulator_and_synthesis(tmp_path):
    """A topology may reserve part of chosen links for another job: this job's costs use the rest."""
    import json

    from taccl.baselines import build
    from taccl.bounds import lower_bound
    from taccl.simulator import Simulator
    from taccl.topology import Topology, spec_from_dict

    doc = json.loads((ROOT / "topologies" / "ndv2.json").read_text())
    full = Topology(spec_from_dict(doc), 2)
    shared = dict(doc, reservations=[{"fraction": 0.5, "nics": ["ib0"], "tenant": "job-b"},
                                     {"fraction": 0.25, "links": [[0, 3]]}])
    half = Topology(spec_from_dict(shared), 2)
    assert half.spec.nics[0][2] == "ib~50%" and half.link(0, 3).type.name == "nvlink2~25%"
    assert half.link(3, 0).type.name == "nvlink2~25%" and half.link(0, 4).type.name == "nvlink2"
    size = 64 << 20
    assert lower_bound(half, "allgather", size) > 1.8 * lower_bound(full, "allgather", size)
    ring = build("ring", full, "allgather")
    assert Simulator(ring, half).run(size).time_us > 1.5 * Simulator(ring, full).run(size).time_us
    # the synthesizer costs the shared NIC too
    from taccl.sketch import load_sketch
    from taccl.synthesize import synthesize

    topo_file = tmp_path / "ndv2-shared.json"
    topo_file.write_text(json.dumps(shared))
    sketch = load_sketch(ROOT / "sketches" / "ndv2-sk-1.json")
    a = synthesize(sketch, topology="ndv2", input_size="32M")
    b = synthesize(sketch, topology=str(topo_file), input_size="32M")
    assert b.time_us > 1.5 * a.time_us
    for bad, needle in (([{"fraction": 0.6, "nics": ["ib0"]}, {"fraction": 0.5, "link_type": "ib"}], "nothing would be left"),
                        ([{"fraction": 0.5, "nics": ["eth9"]}], "unknown NIC 'eth9'"),
                        ([{"fraction": 0.5, "links": [[0, 6]]}], "no link joins GPUs 0 and 6"),
                        ([{"fraction": 0.5}], "names no link_type, links or nics")):
        with pytest.raises(UserError, match=needle):
            spec_from_dict(dict(doc, reservations=bad), path="t.json")


def test_degraded_nic_loop_end_to_end(tmp_path):
    """benchmarks/degraded_nic.py on the small SKU: a running job, the NIC degraded, the batch again (its
    baseline programs from the cache), the new set live in the job, every result right."""
    import sys

    r = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "degraded_nic.py"), "--sku",
                        str(ROOT / "tests" / "data" / "batch" / "small.yaml"), "--collective", "allgather",
                        "--workers", "1", "-o", str(tmp_path)], capture_output=True, text=True, cwd=ROOT, timeout=600)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert "new set live in the job" in r.stdout and ", 0 wrong, 0 failed" in r.stdout
    reused = int(r.stdout.split("batch again in")[1].split(": ")[1].split(" of")[0])
    assert reused > 0  # the baselines' programs
    # on the degraded topology the new set is faster than the old one over the grid
    assert float(r.stdout.split("geometric mean ")[1].split()[0]) <= 1.0


def test_a_set_for_several_rank_counts_serves_each_communicator_its_own(sets, tmp_path, capsys):
    """A batch for several node counts writes programs for several rank counts into one directory, and a file
    serves only communicators of its rank count (as in MSCCL_ALGO_DIR): a 16-rank communicator takes such a set,
    and the next one too, and runs its own programs; `taccl swap` publishes one over another."""
    import shutil

    from taccl import runtime
    from taccl.cli import main

    def with_eight(k):
        d = tmp_path / f"both{k}-{len(list(tmp_path.iterdir()))}"
        shutil.copytree(sets[k], d)
        shutil.copy(DATA / "ring_allreduce_8.xml", d / "allreduce-8r.xml")  # sorted first of the set
        return d

    rng = random.Random(5)
    with runtime.Runtime() as rt:
        rt.swap(with_eight(0))
        assert _call(rt, rng, runtime)[1]
        rt.swap(with_eight(1))  # refused before: "written for 8 ranks, but this communicator has 16"
        for _ in range(4):
            out, right = _call(rt, rng, runtime)
            assert right
        assert out.generation == 2
    live = tmp_path / "live"
    assert main(["swap", str(with_eight(0)), "--into", str(live), "-q"]) == 0
    assert main(["swap", str(with_eight(2)), "--into", str(live), "-q"]) == 0
    assert "allreduce-8r.xml" in {p.name for p in live.iterdir()}


def test_swap_command_publishes_only_a_set_the_watching_jobs_would_take(sets, tmp_path, capsys):
    """`taccl swap NEW --into DIR` checks the new set as a communicator watching DIR would, then replaces
    DIR's files at once; a refused set leaves DIR as it was (exit 2, one message)."""
    from taccl.cli import main

    live = tmp_path / "live"
    assert main(["swap", str(sets[0]), "--into", str(live), "-q"]) == 0  # made when absent
    before = {p.name: p.read_bytes() for p in live.iterdir()}
    legacy_dir = tmp_path / "mixed"
    legacy_dir.mkdir()
    (legacy_dir / "a.xml").write_text((sets[1] / "allreduce.xml").read_text())
    (legacy_dir / "b.xml").write_text(_as_legacy((sets[1] / "allgather.xml").read_text()))
    for new, needle in ((DATA / "ring_allreduce_8.xml", "holds no program for 16 ranks, the counts the current "
                                                        "set serves"),
                        (sets[1] / "allgather.xml", "the new set has no allreduce program for 16 ranks"),
                        (legacy_dir, "mixes XML dialects"),
                        (DATA / "bad_race.xml", "data race")):
        capsys.readouterr()
        assert main(["swap", str(new), "--into", str(live)]) == 2
        err = capsys.readouterr().err
        assert needle in err and "unchanged" in err and err.count("\n") == 1, err
        assert {p.name: p.read_bytes() for p in live.iterdir()} == before
    assert main(["swap", str(sets[2]), "--into", str(live), "-q"]) == 0
    assert {p.name: p.read_bytes() for p in live.iterdir()} == {p.name: p.read_bytes() for p in sets[2].iterdir()}


def test_swap_keeps_what_is_not_the_set_and_follows_a_link(sets, tmp_path, capsys):
    """The swap replaces the directory whole: a subdirectory there was deleted with it, silently; a link to
    the directory was replaced by a plain one, so what resolved the link never saw the new set."""
    from taccl.cli import main

    live = tmp_path / "live"
    (live / "backup").mkdir(parents=True)
    (live / "backup" / "notes.txt").write_text("precious\n")
    assert main(["swap", str(sets[0]), "--into", str(live)]) == 2
    assert "holds 'backup', which is not a file" in capsys.readouterr().err
    assert (live / "backup" / "notes.txt").read_text() == "precious\n"
    real, link = tmp_path / "real", tmp_path / "link"
    real.mkdir()
    link.symlink_to(real)
    assert main(["swap", str(sets[0]), "--into", str(link), "-q"]) == 0
    assert link.is_symlink() and sorted(p.name for p in real.iterdir()) == sorted(p.name for p in sets[0].iterdir())
    assert not any(p.name.startswith(".") for p in tmp_path.iterdir())  # no staging or old copy left behind


def test_swap_warns_where_two_programs_of_the_set_take_the_same_sizes(sets, tmp_path, capsys):
    """Overlapping windows are a valid set (selection takes the first by name, a fallback for sizes the
    first cannot divide) but mostly a mistake: the swap publishes it and says which file runs there. The set
    is checked in the order the watching job loads it, by name, whatever order the command line gives."""
    import shutil

    from taccl.cli import main

    new = tmp_path / "new"
    shutil.copytree(sets[0], new)
    shutil.copy(sets[1] / "allreduce.xml", tmp_path / "b-allreduce.xml")
    live = tmp_path / "live"
    assert main(["swap", str(tmp_path / "b-allreduce.xml"), str(new / "allgather.xml"), str(new / "allreduce.xml"),
                 "--into", str(live), "-q"]) == 0
    err = capsys.readouterr().err
    assert err.startswith(f"warning: {live / 'b-allreduce.xml'}: its window overlaps {live / 'allreduce.xml'}'s "
                          f"(allreduce, 16 ranks)") and err.count("\n") == 1, err
    assert sorted(p.name for p in live.iterdir()) == ["allgather.xml", "allreduce.xml", "b-allreduce.xml"]
