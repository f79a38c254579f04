"""Targets (`taccl.targets`): XML each runtime runs, and `taccl check --target` refusing what it would not."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from taccl.cli import main
from taccl.program import StepType
from taccl.targets import FUSED_STEPS
from taccl.xmlio import read_program

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "runtime" / "tests" / "data"


def _fused(program) -> set:
    return {StepType(st.type) for g in program.gpus for tb in g.threadblocks for st in tb.steps} & FUSED_STEPS


def test_rccl_programs_have_no_fused_steps_and_run(tmp_path):
    """RCCL (since ROCm 6.1) fails the first call of a program with rcs/rrs/rrcs/rrc: `--target rccl` lowers
    reductions as a receive into scratch plus a local re, and `check --target rccl` refuses the executor's."""
    executor, rccl = tmp_path / "ring.xml", tmp_path / "ring-rccl.xml"
    assert main(["baseline", "ring", "-t", "ndv2", "-c", "allreduce", "-o", str(executor), "-q"]) == 0
    assert main(["baseline", "ring", "-t", "ndv2", "-c", "allreduce", "--target", "rccl", "-o", str(rccl), "-q"]) == 0
    assert _fused(read_program(str(executor))) and not _fused(read_program(str(rccl)))
    assert main(["check", "-q", "--target", "rccl", str(executor)]) == 1
    assert main(["check", "-q", "--target", "rccl", str(rccl)]) == 0
    from taccl import runtime

    assert runtime.run_program(rccl, size=64 * 1024)["wrong"] == 0
    assert runtime.run_program(rccl, size=64 * 1024, inplace=True)["wrong"] == 0
    # synthesized: solve, then lower the algorithm for RCCL
    assert main(["solve", str(ROOT / "sketches" / "ndv2-sk-1.json"), "--collective", "allreduce", "--target", "rccl",
                 "-o", str(tmp_path), "--name", "ar", "-q"]) == 0
    program = read_program(str(tmp_path / "ar.xml"))
    assert not _fused(program) and program.max_threadblocks <= 64
    assert main(["check", "-q", "--target", "rccl", str(tmp_path / "ar.xml")]) == 0
    assert runtime.run_program(tmp_path / "ar.xml", size=1 << 20)["wrong"] == 0


def test_programs_for_amd_gpus_are_written_for_rccl_unless_a_target_is_named(tmp_path):
    """On AMD GPUs RCCL alone runs MSCCL programs (the executor is a plugin of NVIDIA's NCCL, legacy MSCCL a fork
    of it), so a topology of `vendor` amd makes rccl the default of solve, lower, baseline and batch."""
    from taccl.batch.sku import load_sku

    sketch = tmp_path / "mi.json"
    sketch.write_text(json.dumps({"name": "mi", "topology": "mi300x", "collective": "allreduce",
                                  "input_size": "1M", "intranode_sketch": {"strategy": "none"}}))
    assert main(["solve", str(sketch), "-q", "-o", str(tmp_path / "ar.xml")]) == 0
    assert main(["lower", str(tmp_path / "ar.algo.json"), "-q", "-o", str(tmp_path / "lowered.xml")]) == 0
    assert main(["baseline", "ring", "-t", "mi300x", "-c", "allreduce", "-q", "-o", str(tmp_path / "ring.xml")]) == 0
    for name in ("ar.xml", "lowered.xml", "ring.xml"):
        program = read_program(str(tmp_path / name))
        assert not _fused(program) and program.max_threadblocks <= 64, name
    # a target named on the command line wins
    named = tmp_path / "executor.xml"
    assert main(["baseline", "ring", "-t", "mi300x", "-c", "allreduce", "-q", "--target", "msccl-executor",
                 "-o", str(named)]) == 0
    assert _fused(read_program(str(named)))
    sku = tmp_path / "mi.yaml"
    sku.write_text("topology: mi300x\nnodes: [1]\ncollectives: [allreduce]\nsizes: [1MiB]\n"
                   "candidates: [{sketch: mi.json}]\n")
    assert load_sku(sku).targets == ("rccl",)
    sku.write_text(sku.read_text().replace("mi300x", "ndv2"))
    assert load_sku(sku).targets == ("msccl-executor",)


def test_legacy_window_bounded_where_scratch_is_allocated(tmp_path):
    """Legacy MSCCL allocates maxBytes x s_chunks / nchunksperloop of scratch when the communicator is
    created: a program with scratch gets a bounded window (the runtime's default, 128 MiB exclusive), and a
    file with an unbounded one is refused by `check --target msccl-legacy`."""
    path = tmp_path / "oneshot.xml"
    assert main(["baseline", "one-shot", "-t", "dgx-h100", "-c", "allreduce", "--target", "msccl-legacy",
                 "-o", str(path), "-q"]) == 0
    head = path.read_text().splitlines()[0]
    assert 'inplace="0"' in head and "outofplace" not in head and "maxBytes" not in head  # the default, 2^27
    program = read_program(str(path), dialect="legacy")
    assert program.max_bytes == (1 << 27) - 1 and max(g.s_chunks for g in program.gpus) > 0
    assert main(["check", "-q", "--target", "msccl-legacy", str(path)]) == 0
    unbounded = tmp_path / "unbounded.xml"
    unbounded.write_text(path.read_text().replace('inplace="0">', 'inplace="0" maxBytes="9223372036854775807">', 1))
    assert main(["check", "-q", "--target", "msccl-legacy", str(unbounded)]) == 1
    # --dialect is the older spelling of --target; the two must agree
    assert main(["baseline", "ring", "-t", "ndv2", "--dialect", "executor", "--target", "msccl-legacy",
                 "-o", str(tmp_path / "x.xml")]) == 2


def test_rooted_program_refused_for_msccl_targets(capsys):
    """No MSCCL runtime reads root: a root-0 Broadcast would also run root-5 calls (wrongly)."""
    path = str(DATA / "chain_broadcast_4.xml")
    assert main(["check", "-q", path]) == 0
    for target in ("msccl-executor", "rccl"):
        capsys.readouterr()
        assert main(["check", "-q", "--target", target, path]) == 1
        assert "does not read root" in capsys.readouterr().out


def test_directory_checked_as_the_runtime_loads_it(tmp_path, capsys):
    """MSCCL_ALGO_DIR: every file is read in name order and one unreadable file makes the executor drop the
    whole directory; overlapping windows leave the overlap to the first file (RCCL: to readdir's order)."""
    d = tmp_path / "algos"
    d.mkdir()
    for r, lo, hi in ((0, 0, 65535), (1, 65536, 0)):
        text = (DATA / "ring_allreduce_4.xml").read_text().replace('minBytes="0" maxBytes="0"',
                                                                   f'minBytes="{lo}" maxBytes="{hi}"')
        (d / f"ar-{r}.xml").write_text(text)
    assert main(["check", "-q", str(d)]) == 0
    shutil.copy(d / "ar-1.xml", d / "ar-2.xml")  # the same window again
    capsys.readouterr()
    assert main(["check", str(d)]) == 0  # the executor sorts: ar-1 wins, ar-2 is never selected
    assert "ar-2.xml: warning [directory]: its window overlaps" in capsys.readouterr().out
    assert main(["check", "-q", "--target", "rccl", str(d)]) == 1  # readdir order: no telling which runs
    (d / "ar-2.xml").unlink()
    (d / "notes.txt").write_text("not a program\n")
    capsys.readouterr()
    assert main(["check", "-q", str(d)]) == 2  # a file that cannot be read
    assert "notes.txt: error [directory]: msccl-executor stops loading the directory" in capsys.readouterr().out
    # legacy MSCCL reads the list of MSCCL_XML_FILES, at most 4 files
    (d / "notes.txt").unlink()
    legacy = tmp_path / "legacy"
    legacy.mkdir()
    for k in range(5):
        assert main(["baseline", "ring", "-t", "ndv2", "-c", "allgather", "--target", "msccl-legacy",
                     "-o", str(legacy / f"ag-{k}.xml"), "-q"]) == 0
    capsys.readouterr()
    assert main(["check", "-q", "--target", "msccl-legacy", str(legacy)]) == 1
    assert "loads at most 4 files" in capsys.readouterr().out
    # a directory with nothing the runtime loads (a wrong path, say): the runtime would run its own algorithms
    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / "readme.txt").write_text("no program\n")
    assert main(["check", "-q", "--target", "msccl-legacy", str(empty)]) == 1
    assert "no *.xml file here for msccl-legacy to load" in capsys.readouterr().out
    (empty / "readme.txt").unlink()
    assert main(["check", "-q", str(empty)]) == 1
    assert "no file here for msccl-executor to load" in capsys.readouterr().out


def test_a_program_no_power_of_two_size_divides_is_noted(tmp_path, capsys):
    """Three instances of NDv2's 8 chunks make 24 chunks a loop: the runtimes select the program only for calls
    whose element count is a multiple of 24, never a power of two. `solve` says so; on two instances not."""
    sketch = str(ROOT / "sketches" / "ndv2-single.json")
    assert main(["solve", sketch, "--instances", "3", "-o", str(tmp_path), "--name", "i3", "-q"]) == 0
    assert "multiple of its nchunksperloop, 24, which no power-of-two size is" in capsys.readouterr().err
    assert main(["solve", sketch, "--instances", "2", "-o", str(tmp_path), "--name", "i2", "-q"]) == 0
    assert "nchunksperloop" not in capsys.readouterr().err
    from taccl.errors import UserError
    from taccl.runtime import count_for_size

    assert read_program(str(tmp_path / "i3.xml")).nchunksperloop == 24
    with pytest.raises(UserError, match="not divisible by nchunksperloop=24"):  # what `taccl run` says
        count_for_size("allgather", 8, 1 << 20, "float32", 24)
