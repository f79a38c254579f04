"""The two intermediate forms the lowering passes work on.

`ChunkOp` is the front-end form shared by the Algorithm path (`taccl.lowering.buffers`) and the DSL
(`taccl.dsl`): a copy or reduce of ``cnt`` consecutive slots from one rank's buffer to another's (or the
same rank's), with a *key*, its position in a valid global order (the algorithm's send order, or the DSL's
trace order). Buffers are already allocated: slots are (buffer, index).

`Instr` is one instruction on one rank (the Instruction DAG of MSCCLang, section 4): a send, a receive,
a fused receive-send, or a local copy/reduce, with its same-rank dependencies, the instruction it is matched
with on the peer, and, once scheduled, its channel and thread block.

Keys are tuples compared lexicographically. A matched send/receive pair shares one key (one event). Fusion
gives the absorbed send the key ``key(recv) + (0,)``, which no other key falls strictly between, so a fused
instruction still occupies one indivisible interval of the global order; this is what makes the thread-block
order deadlock-free (see `taccl.lowering.schedule`).
"""
from __future__ import annotations

from dataclasses import dataclass

from ..program import Buf, StepType

__all__ = ["ChunkOp", "Instr", "COPY", "REDUCE", "MAX_CNT"]

COPY = "copy"
REDUCE = "reduce"
MAX_CNT = 71  # MSCCL_MAX_COUNT = 72, exclusive


@dataclass
class ChunkOp:
    """dst[dst_off .. +cnt] on dst_rank := src (copy) or operand + src (reduce).

    For a reduce, ``operand`` is the local operand slot on ``dst_rank`` (default: the destination itself);
    an out-of-place first accumulation reads the input buffer and writes the output.
    ``ch`` pins the transfer to a set of allowed channels (a DSL scheduling directive); None lets the
    scheduler choose.
    """

    kind: str
    src_rank: int
    src_buf: Buf
    src_off: int
    dst_rank: int
    dst_buf: Buf
    dst_off: int
    cnt: int = 1
    operand: tuple | None = None
    ch: int | None = None
    key: tuple = ()
    origin: str = ""
    span: tuple | None = None  # (send, arrival) in the algorithm's schedule, us; None from the DSL
    after: tuple = ()  # first key elements of ops whose sends this op's send waits for (same source rank)

    @property
    def remote(self) -> bool:
        return self.src_rank != self.dst_rank


class Instr:
    """One instruction of one rank (see the module docstring)."""

    __slots__ = ("id", "rank", "type", "srcbuf", "srcoff", "dstbuf", "dstoff", "cnt", "send_peer", "recv_peer",
                 "key", "pos", "deps", "dependents", "readers", "overwritten", "to", "frm", "dead", "ch", "want_ch",
                 "tb", "origin", "span")

    def __init__(self, id, rank, type, *, srcbuf=Buf.INPUT, srcoff=-1, dstbuf=Buf.OUTPUT, dstoff=-1, cnt=1,
                 send_peer=-1, recv_peer=-1, key=(), origin="", want_ch=None, span=None):
        self.id = id
        self.rank = rank
        self.type = type
        self.srcbuf, self.srcoff, self.dstbuf, self.dstoff, self.cnt = srcbuf, srcoff, dstbuf, dstoff, cnt
        self.send_peer, self.recv_peer = send_peer, recv_peer
        self.key = key
        self.pos = key  # where it sits in its thread block's order (fusion may move it later)
        self.deps = set()  # Instr on the same rank that must complete first
        self.dependents = []  # reverse of deps
        self.readers = set()  # instructions that read a value this one wrote
        self.overwritten = 0  # how many of the written slots a later instruction overwrites
        self.to = None  # receive matched with this instruction's send part
        self.frm = None  # send matched with this instruction's receive part
        self.dead = False  # absorbed by fusion
        self.ch = None
        self.want_ch = want_ch
        self.tb = None
        self.origin = origin
        self.span = span  # (send, arrival) of its transfer in the algorithm's schedule, or None

    def __repr__(self) -> str:
        return (f"Instr({self.id}, r{self.rank}, {self.type}, src={self.srcbuf}{self.srcoff}, "
                f"dst={self.dstbuf}{self.dstoff}, cnt={self.cnt}, send={self.send_peer}, recv={self.recv_peer}, "
                f"key={self.key}, pos={self.pos})")

    @property
    def reads_slots(self):
        t = self.type
        out = []
        if t.uses_src:
            out += [(self.srcbuf, self.srcoff + k) for k in range(self.cnt)]
        if t is StepType.REDUCE:
            out += [(self.dstbuf, self.dstoff + k) for k in range(self.cnt)]
        return out

    @property
    def writes_slots(self):
        if self.type.uses_dst:
            return [(self.dstbuf, self.dstoff + k) for k in range(self.cnt)]
        return []
