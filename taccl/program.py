"""MSCCL-IR: the lowered program, as plain dataclasses.

A `Program` is what one MSCCL XML file holds (see ``shared/docs/msccl-xml.md``): per rank (`Gpu`), a list of
thread blocks (`Threadblock`, one send peer, one receive peer, one channel), each an ordered list of
instructions (`Step`). The enums' values are the XML spellings, so ``StepType("rrcs")`` and
``str(StepType.RECV_REDUCE_COPY_SEND) == "rrcs"``.

The model is format-neutral: `taccl.xmlio` reads and writes it in the MSCCL executor dialect (default) or the
legacy dialect, and `taccl.checker` proves it. Conventions:

- ``collective`` is the canonical name: ``allgather``, ``reducescatter`` (written ``reduce_scatter`` in the
  legacy dialect), ``allreduce``, ``alltoall``, ``broadcast``, ``reduce``, ``gather``, ``scatter``, ``custom``,
  or one of the executor's other names (``send``, ``recv``, ``alltoallv``).
- ``inplace`` / ``outofplace`` say which calls the program serves (the executor may set both; the legacy
  runtime serves exactly one kind, ``inplace`` deciding).
- ``min_bytes`` / ``max_bytes`` have the executor's meaning: an inclusive window, ``max_bytes == 0`` means
  unbounded. The legacy reader and writer convert (legacy ``maxBytes`` is exclusive, default 2**27).
- ``line`` fields (not compared) record where an element was read from, for error messages.

Examples
--------
>>> st = Step(s=0, type=StepType.SEND, srcbuf=Buf.INPUT, srcoff=1, dstbuf=Buf.INPUT, dstoff=1, cnt=1)
>>> st.is_send_type, st.is_recv_type, st.reads(), st.writes()
(True, False, [(Buf.INPUT, 1)], [])
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from enum import Enum
from typing import Iterator

__all__ = [
    "Proto",
    "Buf",
    "StepType",
    "step_type",
    "Step",
    "Threadblock",
    "Gpu",
    "Program",
    "SEND_TYPES",
    "RECV_TYPES",
    "COLLECTIVES",
    "nop_step",
]


class _XmlEnum(str, Enum):
    """A str-valued enum whose str() and format() are the XML spelling."""

    def __str__(self) -> str:
        return self.value

    def __format__(self, spec: str) -> str:
        return format(self.value, spec)

    def __repr__(self) -> str:
        return f"{type(self).__name__}.{self.name}"


class Proto(_XmlEnum):
    SIMPLE = "Simple"
    LL = "LL"
    LL128 = "LL128"

    @property
    def fifo_depth(self) -> int:
        """Primitive calls that may be in flight on one connection before the sender blocks (msccl-xml.md 3)."""
        return 2 if self is Proto.SIMPLE else 8

    @property
    def tile_bytes(self) -> int:
        """Bytes of a chunk the runtime moves per tile iteration with default buffer sizes (msccl-xml.md 1.8)."""
        return {Proto.SIMPLE: 2 * 1024 * 1024, Proto.LL: 32 * 1024, Proto.LL128: 576_000}[self]


# A step of cnt chunks is moved at most this many chunks a primitive call (maxAllowedCount's cap, msccl-xml.md 1.8)
MAX_ALLOWED_COUNT = 71


class Buf(_XmlEnum):
    INPUT = "i"
    OUTPUT = "o"
    SCRATCH = "s"


class StepType(_XmlEnum):
    SEND = "s"
    RECV = "r"
    RECV_COPY_SEND = "rcs"
    RECV_REDUCE_SEND = "rrs"
    RECV_REDUCE_COPY = "rrc"
    RECV_REDUCE_COPY_SEND = "rrcs"
    COPY = "cpy"
    REDUCE = "re"
    NOP = "nop"

    @property
    def is_send_type(self) -> bool:
        """Pushes data to the thread block's send peer."""
        return self in SEND_TYPES

    @property
    def is_recv_type(self) -> bool:
        """Pulls data from the thread block's receive peer."""
        return self in RECV_TYPES

    @property
    def uses_src(self) -> bool:
        """Reads the local slots srcbuf[srcoff .. srcoff+cnt-1] (the local operand for reducing types)."""
        return self in _USES_SRC

    @property
    def uses_dst(self) -> bool:
        """Writes the local slots dstbuf[dstoff .. dstoff+cnt-1]."""
        return self in _USES_DST

    @property
    def reads_dst(self) -> bool:
        """The destination's old value is an operand (only ``re``)."""
        return self is StepType.REDUCE

    @property
    def is_reducing(self) -> bool:
        return self in _REDUCING

    @property
    def is_local(self) -> bool:
        """Needs no peer: ``cpy``, ``re``, ``nop``."""
        return self in (StepType.COPY, StepType.REDUCE, StepType.NOP)


SEND_TYPES = frozenset(
    {StepType.SEND, StepType.RECV_COPY_SEND, StepType.RECV_REDUCE_SEND, StepType.RECV_REDUCE_COPY_SEND}
)
RECV_TYPES = frozenset(
    {
        StepType.RECV,
        StepType.RECV_COPY_SEND,
        StepType.RECV_REDUCE_SEND,
        StepType.RECV_REDUCE_COPY,
        StepType.RECV_REDUCE_COPY_SEND,
    }
)
_USES_SRC = frozenset(
    {
        StepType.SEND,
        StepType.RECV_REDUCE_SEND,
        StepType.RECV_REDUCE_COPY,
        StepType.RECV_REDUCE_COPY_SEND,
        StepType.COPY,
        StepType.REDUCE,
    }
)
_USES_DST = frozenset(
    {
        StepType.RECV,
        StepType.RECV_COPY_SEND,
        StepType.RECV_REDUCE_COPY,
        StepType.RECV_REDUCE_COPY_SEND,
        StepType.COPY,
        StepType.REDUCE,
    }
)
_REDUCING = frozenset(
    {StepType.RECV_REDUCE_SEND, StepType.RECV_REDUCE_COPY, StepType.RECV_REDUCE_COPY_SEND, StepType.REDUCE}
)


# StepType(x) through Enum.__call__ costs about half a microsecond, and every writer, simulation and proof of
# a 128-rank program reads 10^5 steps: a dict first (x is a member or its XML spelling; a str enum's member
# hashes and compares as its spelling), the enum for anything else (which it refuses)
_STEP_TYPES = {m: m for m in StepType}


def step_type(x) -> StepType:
    """`StepType(x)`, fast."""
    return _STEP_TYPES.get(x) or StepType(x)


MAX_NODES = 4096  # XML nodes one rank's parser stores, in the executor, RCCL and runtime/ alike

# Canonical collective names (executor spelling). The legacy dialect writes reducescatter as reduce_scatter.
COLLECTIVES = (
    "allgather",
    "reducescatter",
    "allreduce",
    "alltoall",
    "broadcast",
    "reduce",
    "gather",
    "scatter",
    "custom",
    "send",
    "recv",
    "alltoallv",
)


@dataclass
class Step:
    """One instruction. All ten XML attributes; ``depid``/``deps`` = -1 means no dependency."""

    s: int
    type: StepType
    srcbuf: Buf = Buf.INPUT
    srcoff: int = -1
    dstbuf: Buf = Buf.OUTPUT
    dstoff: int = -1
    cnt: int = 1
    depid: int = -1
    deps: int = -1
    hasdep: bool = False
    line: int | None = field(default=None, compare=False, repr=False)

    @property
    def is_send_type(self) -> bool:
        return self.type in SEND_TYPES

    @property
    def is_recv_type(self) -> bool:
        return self.type in RECV_TYPES

    @property
    def has_dependency(self) -> bool:
        return self.depid >= 0 or self.deps >= 0

    def src_slots(self) -> list[tuple[Buf, int]]:
        return [(self.srcbuf, self.srcoff + k) for k in range(self.cnt)]

    def dst_slots(self) -> list[tuple[Buf, int]]:
        return [(self.dstbuf, self.dstoff + k) for k in range(self.cnt)]

    def reads(self) -> list[tuple[Buf, int]]:
        """Local slots this step reads (source operand, and the destination for ``re``)."""
        out: list[tuple[Buf, int]] = []
        if self.type.uses_src:
            out += self.src_slots()
        if self.type.reads_dst:
            out += [x for x in self.dst_slots() if x not in out]
        return out

    def writes(self) -> list[tuple[Buf, int]]:
        """Local slots this step writes."""
        return self.dst_slots() if self.type.uses_dst else []


def nop_step(s: int, depid: int, deps: int) -> Step:
    """A ``nop`` carrying one dependency, in the shape the runtimes expect (cnt 0, unused buffers)."""
    return Step(s=s, type=StepType.NOP, srcbuf=Buf.INPUT, srcoff=-1, dstbuf=Buf.OUTPUT, dstoff=-1, cnt=0,
                depid=depid, deps=deps, hasdep=False)


@dataclass
class Threadblock:
    """One CUDA thread block: at most one send peer and one receive peer (-1: none), on channel ``chan``."""

    id: int
    send: int = -1
    recv: int = -1
    chan: int = 0
    steps: list[Step] = field(default_factory=list)
    line: int | None = field(default=None, compare=False, repr=False)


@dataclass
class Gpu:
    """One rank's part: buffer sizes in chunks and its thread blocks (ids 0..n-1, usually in order)."""

    id: int
    i_chunks: int
    o_chunks: int
    s_chunks: int = 0
    threadblocks: list[Threadblock] = field(default_factory=list)
    line: int | None = field(default=None, compare=False, repr=False)

    def tb(self, tb_id: int) -> Threadblock | None:
        for tb in self.threadblocks:
            if tb.id == tb_id:
                return tb
        return None

    def chunks(self, buf: Buf | str) -> int:
        buf = Buf(buf)
        if buf is Buf.INPUT:
            return self.i_chunks
        if buf is Buf.OUTPUT:
            return self.o_chunks
        return self.s_chunks


@dataclass
class Program:
    """A whole MSCCL-IR program (one XML file)."""

    name: str
    collective: str
    proto: Proto
    nchannels: int
    nchunksperloop: int
    ngpus: int
    inplace: bool = False
    outofplace: bool = True
    min_bytes: int = 0
    max_bytes: int = 0
    extra: dict[str, str] = field(default_factory=dict)
    gpus: list[Gpu] = field(default_factory=list)
    root: int | None = None

    def gpu(self, rank: int) -> Gpu | None:
        for g in self.gpus:
            if g.id == rank:
                return g
        return None

    def iter_steps(self) -> Iterator[tuple[Gpu, Threadblock, Step]]:
        for g in self.gpus:
            for tb in g.threadblocks:
                for st in tb.steps:
                    yield g, tb, st

    @property
    def nsteps(self) -> int:
        return sum(len(tb.steps) for g in self.gpus for tb in g.threadblocks)

    @property
    def max_threadblocks(self) -> int:
        return max((len(g.threadblocks) for g in self.gpus), default=0)

    @property
    def max_steps(self) -> int:
        """The most steps (nops included) any thread block has: MSCCL_MAX_NUM_STEPS must allow it."""
        return max((len(tb.steps) for g in self.gpus for tb in g.threadblocks), default=0)

    def stored_nodes(self, gpu: Gpu) -> int:
        """The XML nodes `gpu`'s rank parses and stores: the algo, every gpu, its own tbs and steps."""
        return 1 + len(self.gpus) + len(gpu.threadblocks) + sum(len(tb.steps) for tb in gpu.threadblocks)

    @property
    def max_nodes(self) -> int:
        """The most XML nodes any rank stores: the runtimes' MAX_NODES (`MAX_NODES`) must allow it."""
        return max((self.stored_nodes(g) for g in self.gpus), default=0)


def moves_data(st: Step) -> bool:
    """Whether a step sends or receives (so takes FIFO slots, one a primitive call)."""
    t = step_type(st.type)
    return t.is_send_type or t.is_recv_type


def allowed_count(program: Program, size_bytes: float) -> int:
    """maxAllowedCount at a call of `size_bytes` (the larger buffer): how many chunks of a step the runtime moves
    in one primitive call, tile // chunk bytes, at least 1 and at most 71 (msccl-xml.md 1.8)."""
    chunk = max(1, -(-int(size_bytes) // max(1, program.nchunksperloop)))
    return max(1, min(MAX_ALLOWED_COUNT, Proto(program.proto).tile_bytes // chunk))


def split_calls(program: Program, M: int) -> Program:
    """The program as the runtime runs it where it moves M chunks a call: each sending or receiving step of
    more chunks becomes ceil(cnt / M) steps of at most M (the first keeps the step's dependency, the last its
    hasdep, and a dependency on it points at its last part). The same data moves; each part is a call of its
    own, with its own FIFO slot and per-call cost."""
    gpus = []
    for g in program.gpus:
        last = {}  # (tb id, step index) -> index of its last part
        tbs = []
        for tb in g.threadblocks:
            steps = []
            for i, st in enumerate(tb.steps):
                parts = -(-st.cnt // M) if moves_data(st) and st.cnt > M else 1
                for j in range(parts):
                    if parts == 1:
                        steps.append(replace(st, s=len(steps)))
                        continue
                    shift = j * M
                    steps.append(replace(st, s=len(steps), cnt=min(M, st.cnt - shift),
                                         srcoff=st.srcoff + shift if st.srcoff >= 0 else st.srcoff,
                                         dstoff=st.dstoff + shift if st.dstoff >= 0 else st.dstoff,
                                         depid=st.depid if j == 0 else -1, deps=st.deps if j == 0 else -1,
                                         hasdep=st.hasdep and j == parts - 1))
                last[(tb.id, i)] = len(steps) - 1
            tbs.append(replace(tb, steps=steps))
        for tb in tbs:
            for st in tb.steps:
                if st.depid >= 0:
                    st.deps = last.get((st.depid, st.deps), st.deps)
        gpus.append(replace(g, threadblocks=tbs))
    return replace(program, gpus=gpus)
