"""The simulator's C++ event loop (taccl/native/simcore.cpp) against its Python reference: the same results,
double for double, on programs that exercise every part of the model (fused steps, FIFO credits, partial
lanes, dependencies across blocks, extrapolated tiles, every protocol), and the same deadlock report."""
from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest

from taccl.baselines import build
from taccl.errors import CheckFailed
from taccl.program import Buf, Gpu, Program, Proto, Step, StepType, Threadblock
from taccl.simulator import SimOptions, Simulator, native_engine
from taccl.topology import load_topology

ROOT = Path(__file__).resolve().parent.parent
SIZES = (1024, 1 << 20, 48 << 20, 1 << 30)  # 1 GiB of a 16-rank program: more tiles than are simulated exactly

needs_native = pytest.mark.skipif(native_engine() is None, reason="taccl._simcore was not built (no C++ compiler)")


def test_the_extension_is_built_where_a_compiler_is():
    # `pip install` builds it as an optional extension: a broken build would silently fall back to Python
    if sys.platform.startswith("linux") and (shutil.which("c++") or shutil.which("g++")):
        assert native_engine() is not None, "taccl._simcore did not build: see pip install's output"


def _same(program, topology, sizes=SIZES, options=None):
    python = Simulator(program, topology, options, native=False)
    native = Simulator(program, topology, options, native=True)
    for size in sizes:
        assert native.run(size) == python.run(size), f"{program.name} at {size} bytes"


BASELINES = [  # (topology, nodes, baseline, collective, protocol, instances)
    ("ndv2", 2, "ring", "allgather", "Simple", 1),
    ("ndv2", 1, "ring", "allgather", "Simple", 4),  # more channels than an NVLink2 brick's full lanes
    ("ndv2", 2, "ring", "allreduce", "LL128", 2),
    ("ndv2", 1, "double-binary-tree", "allreduce", "LL", 1),
    ("dgx2", 2, "two-step", "alltoall", "Simple", 1),  # a switch
    ("dgx-h100", 2, "hierarchical", "allreduce", "Simple", 1),  # dependencies across blocks
    ("dgx-h100", 2, "ring", "reducescatter", "LL", 4),
    ("dgx-a100", 2, "direct", "alltoall", "LL128", 1),
]


@needs_native
@pytest.mark.parametrize("topology,nodes,name,collective,proto,instances", BASELINES)
def test_native_and_python_agree_on_baselines(topology, nodes, name, collective, proto, instances):
    topo = load_topology(topology, nodes)
    _same(build(name, topo, collective, proto=proto, instances=instances), topo)


@needs_native
def test_native_and_python_agree_on_a_synthesized_program_with_every_option():
    from taccl.lowering import lower
    from taccl.sketch import load_sketch
    from taccl.synthesize import SynthesisOptions, synthesize

    algo = synthesize(load_sketch(ROOT / "sketches" / "ndv2-sk-1.json"), input_size="1MiB",
                      options=SynthesisOptions(time_limit_s=20))
    topo = algo.load_topology()
    program = lower(algo, topology=topo)
    _same(program, topo)
    for options in (SimOptions(tiling=False), SimOptions(cut_through=False, call_cost=False),
                    SimOptions(max_exact_tiles=3, proto_bw_factor=False, local_bw_GBps=50.0)):
        _same(program, topo, sizes=(1 << 20, 256 << 20), options=options)


def _fifo_deadlock():
    # ranks 0 and 1 each send three times before they receive: the third send waits for a FIFO slot
    # (Simple has two) that only the other side's receive would free
    def gpu(r):
        peer = 1 - r
        steps = [Step(s=i, type=StepType.SEND if i < 3 else StepType.RECV, srcbuf=Buf.INPUT, srcoff=0,
                      dstbuf=Buf.OUTPUT, dstoff=0, cnt=1) for i in range(6)]
        return Gpu(r, 1, 1, 0, [Threadblock(0, send=peer, recv=peer, steps=steps)])

    return Program(name="deadlock", collective="custom", proto=Proto.SIMPLE, nchannels=1, nchunksperloop=1,
                   ngpus=2, gpus=[gpu(0), gpu(1)])


@needs_native
def test_native_and_python_report_the_same_deadlock():
    topo = load_topology("ndv2", 1)
    program = _fifo_deadlock()
    program.ngpus = 8
    program.gpus += [Gpu(r, 1, 1, 0, []) for r in range(2, 8)]
    messages = []
    for native in (False, True):
        with pytest.raises(CheckFailed, match="deadlocks in simulation") as err:
            Simulator(program, topo, native=native).run(4096)
        messages.append(str(err.value))
    assert messages[0] == messages[1] and "rank 0 tb 0 at step 2 of tile 0" in messages[0]


@needs_native
def test_the_environment_can_ask_for_the_python_engine(monkeypatch):
    topo = load_topology("ndv2", 1)
    program = build("ring", topo, "allgather")
    assert Simulator(program, topo).native
    monkeypatch.setenv("TACCL_SIMULATOR", "python")
    assert not Simulator(program, topo).native
    trace = []
    Simulator(program, topo, native=True).run(1 << 20, trace=trace)  # a trace is Python's
    assert trace
