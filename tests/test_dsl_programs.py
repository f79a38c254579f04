"""The DSL: tracing, buffers, errors, and lowering through the shared passes."""
from __future__ import annotations

import pytest

from taccl.checker import check_program
from taccl.dsl import DSLProgram, Ref
from taccl.errors import UserError
from taccl.program import StepType


def ring_allgather(R=4, k=1):
    prog = DSLProgram("allgather", num_ranks=R, chunkup=k)
    for r in range(R):
        c = prog.chunk(r, "input", 0, k)
        c.copy(r, "output", r * k)
        for step in range(1, R):
            c = c.copy((r + step) % R, "output", r * k)
    return prog


def test_docs_example_is_proven():
    p = ring_allgather().lower()
    assert check_program(p).proven
    p = ring_allgather(5, 2).lower(instances=2, proto="LL")
    assert check_program(p).proven and p.nchunksperloop == 20


def test_reduce_scatter_with_named_scratch_and_into():
    R = 4
    prog = DSLProgram("reducescatter", num_ranks=R)
    for o in range(R):
        acc = prog.chunk((o + 1) % R, "input", o)
        for s in range(1, R):
            b = (o + 1 + s) % R
            acc = prog.chunk(b, "input", o).reduce(acc, into=("output", 0) if b == o else ("partial", o))
    p = prog.lower()
    assert check_program(p).proven
    # the partial sums are never stored: rrs, and the scratch buffer is compacted away
    assert StepType.RECV_REDUCE_SEND in {st.type for _, _, st in p.iter_steps()}
    assert all(g.s_chunks == 0 for g in p.gpus)


def test_local_reduce_and_channel_directive():
    prog = DSLProgram("allreduce", num_ranks=2)
    # rank 1 sends its chunks to rank 0 on channel 1, rank 0 reduces locally from scratch, sends back
    for c in range(2):
        prog.chunk(1, "input", c).copy(0, "tmp", c, ch=1)
        prog.chunk(0, "input", c).reduce(prog.chunk(0, "tmp", c), into=("output", c))
        prog.chunk(0, "output", c).copy(1, "output", c)
    p = prog.lower()
    assert check_program(p).proven
    assert p.gpu(0).s_chunks == 2
    assert StepType.REDUCE in {st.type for _, _, st in p.iter_steps()}
    assert any(tb.chan == 1 and tb.recv == 1 for tb in p.gpu(0).threadblocks)


def test_split_and_group():
    prog = DSLProgram("alltoall", num_ranks=2, chunkup=2)
    for s in range(2):
        for d in range(2):
            whole = prog.chunk(s, "input", d * 2, 2)
            a, b = whole.split(2)
            Ref.group([a, b]).copy(d, "output", s * 2)
    p = prog.lower()
    assert check_program(p).proven
    assert {st.cnt for _, _, st in p.iter_steps()} == {2}


def test_errors():
    prog = DSLProgram("allgather", num_ranks=2)
    with pytest.raises(UserError, match="rank"):
        prog.chunk(5, "input", 0)
    with pytest.raises(UserError, match="input buffer has 1"):
        prog.chunk(0, "input", 1)
    with pytest.raises(UserError, match="split"):
        prog.chunk(0, "output", 0, 2).split(3)
    with pytest.raises(UserError, match="no operations"):
        prog.lower()
    prog.chunk(0, "input", 0).copy(1, "output", 0)  # incomplete allgather: the checker refuses it
    with pytest.raises(Exception, match="check"):
        prog.lower()
