"""A small chunk-oriented DSL for writing algorithms by hand, in the spirit of MSCCLang.

    from taccl.dsl import DSLProgram
    prog = DSLProgram("allgather", num_ranks=4)
    for r in range(4):
        c = prog.chunk(r, "input", 0)                 # rank r's input chunk
        c.copy(r, "output", r)                        # local copy into its own output slot
        for step in range(1, 4):
            c = c.copy((r + step) % 4, "output", r)   # forward around the ring
    program = prog.lower()                            # traced, lowered and proven by the checker

A *reference* (`Ref`) names ``size`` consecutive slots of one buffer on one rank: ``"input"``/``"i"``,
``"output"``/``"o"``, ``"scratch"``/``"s"``, or any other name, which becomes a named scratch buffer (laid
out after the plain scratch slots, in order of first use). Operations, recorded in program order:

``ref.copy(dst_rank, buf, idx, ch=None) -> Ref``
    a remote copy is a send plus a receive, a local one a ``cpy``.
``ref.reduce(other, into=None, ch=None) -> Ref``
    ``ref := ref + other``, computed on ``ref``'s rank; ``into=(buf, idx)`` stores the sum elsewhere on that
    rank instead (an out-of-place first step: ``input + received -> output``). A remote ``other`` is a
    send plus a ``rrc``; a local one a ``re``.
``ref.split(n) -> [Ref]``, ``Ref.group(refs) -> Ref``
    pieces of a reference, and consecutive references joined into one (one send, one alpha).

``ch`` pins a transfer to a channel, or to any of several (a collection). Everything else (instruction fusion, thread blocks, channels,
dependencies, instances) is done by the same passes that lower synthesized algorithms
(`taccl.lowering`), and `DSLProgram.lower` returns only programs that `taccl.checker` has proven. The
program order is the trace order: a later operation sees what earlier ones wrote, and reuse of a slot
creates the needed dependencies (write-after-read, write-after-write).
"""
from __future__ import annotations

from dataclasses import dataclass

from .collectives import Collective, make_collective
from .errors import UserError
from .lowering import DEFAULT_MAX_STEPS, LoweringOptions, lower_ops_protocols
from .lowering.ops import COPY, REDUCE, ChunkOp
from .program import MAX_NODES, Buf, Program

__all__ = ["DSLProgram", "Ref"]

_BUF_ALIASES = {"input": "i", "i": "i", "in": "i", "output": "o", "o": "o", "out": "o", "scratch": "s", "s": "s"}


@dataclass(frozen=True)
class Ref:
    """``size`` consecutive slots of buffer ``buf`` on ``rank`` (see the module docstring)."""

    prog: "DSLProgram"
    rank: int
    buf: str  # "i", "o", "s" or a named scratch buffer
    idx: int
    size: int = 1

    def copy(self, dst_rank: int, buf: str | None = None, idx: int | None = None, *, ch: int | None = None) -> "Ref":
        """Copy these slots to ``dst_rank``'s ``buf[idx ..]`` (default: the same buffer and index)."""
        dst = self.prog.chunk(dst_rank, buf if buf is not None else self.buf, self.idx if idx is None else idx,
                              self.size)
        self.prog._record(COPY, self, dst, None, ch)
        return dst

    def reduce(self, other: "Ref", *, into: tuple | None = None, ch: int | None = None) -> "Ref":
        """``self := self + other`` on self's rank (or ``into=(buf, idx)`` := self + other); returns the result."""
        if not isinstance(other, Ref):
            raise UserError(f"reduce expects a chunk reference, got {other!r}")
        if other.size != self.size:
            raise UserError(f"reduce of {self.size} slot(s) with {other.size}: sizes must be equal")
        target = self if into is None else self.prog.chunk(self.rank, into[0], into[1], self.size)
        self.prog._record(REDUCE, other, target, self, ch)
        return target

    def split(self, n: int) -> list:
        if n < 1 or self.size % n:
            raise UserError(f"cannot split {self.size} slot(s) into {n} equal pieces")
        w = self.size // n
        return [Ref(self.prog, self.rank, self.buf, self.idx + i * w, w) for i in range(n)]

    @staticmethod
    def group(refs) -> "Ref":
        refs = list(refs)
        if not refs:
            raise UserError("group of no references")
        first = refs[0]
        pos = first.idx
        for r in refs:
            if r.rank != first.rank or r.buf != first.buf or r.idx != pos:
                raise UserError("group needs consecutive references of one buffer on one rank")
            pos += r.size
        return Ref(first.prog, first.rank, first.buf, first.idx, pos - first.idx)


class DSLProgram:
    """A traced program for ``collective`` (a name or a `Collective`) on ``num_ranks`` ranks."""

    def __init__(self, collective, num_ranks: int | None = None, chunkup: int = 1, *, name: str | None = None,
                 root: int = 0):
        if isinstance(collective, Collective):
            self.coll = collective
        else:
            if num_ranks is None:
                raise UserError("DSLProgram needs num_ranks")
            self.coll = make_collective(collective, num_ranks, chunkup, root=root)
        self.name = name or f"{self.coll.name}-dsl"
        self.num_ranks = self.coll.num_ranks
        self._ops = []  # (kind, src Ref, dst Ref, operand Ref | None, ch)
        self._named = {}  # name -> slots needed (max over ranks)
        self._named_order = []

    # --- references
    def chunk(self, rank: int, buf: str, idx: int, size: int = 1) -> Ref:
        if not isinstance(rank, int) or not 0 <= rank < self.num_ranks:
            raise UserError(f"rank {rank!r} is not one of the program's {self.num_ranks} ranks")
        if not isinstance(idx, int) or idx < 0 or not isinstance(size, int) or size < 1:
            raise UserError(f"chunk({rank}, {buf!r}, {idx!r}, size={size!r}): index >= 0 and size >= 1 expected")
        if not isinstance(buf, str) or not buf:
            raise UserError(f"buffer name expected, got {buf!r}")
        b = _BUF_ALIASES.get(buf, buf)
        limit = {"i": self.coll.input_chunks, "o": self.coll.output_chunks}.get(b)
        if limit is not None and idx + size > limit:
            name = "input" if b == "i" else "output"
            raise UserError(f"chunk({rank}, {buf!r}, {idx}, size={size}): the {self.coll.name} {name} buffer has "
                            f"{limit} chunk(s)")
        if b not in ("i", "o"):
            if b not in self._named:
                self._named[b] = 0
                self._named_order.append(b)
            self._named[b] = max(self._named[b], idx + size)
        return Ref(self, rank, b, idx, size)

    def _record(self, kind, src: Ref, dst: Ref, operand, ch) -> None:
        if ch is not None:
            chans = (ch,) if isinstance(ch, int) else tuple(ch) if isinstance(ch, (tuple, list, set, frozenset)) else None
            if not chans or any(not isinstance(c, int) or c < 0 for c in chans):
                raise UserError(f"channel {ch!r} must be a non-negative integer or a collection of them")
            ch = frozenset(chans)
        self._ops.append((kind, src, dst, operand, ch))

    @property
    def operations(self) -> int:
        return len(self._ops)

    # --- lowering
    def _scratch_base(self) -> dict:
        base, off = {}, 0
        order = (["s"] if "s" in self._named else []) + [n for n in self._named_order if n != "s"]
        for n in order:
            base[n] = off
            off += self._named[n]
        return base

    def chunk_ops(self) -> list:
        """The trace as `ChunkOp`s (the lowering's front-end form)."""
        base = self._scratch_base()

        def slot(ref: Ref):
            if ref.buf == "i":
                return Buf.INPUT, ref.idx
            if ref.buf == "o":
                return Buf.OUTPUT, ref.idx
            return Buf.SCRATCH, base[ref.buf] + ref.idx

        out = []
        for n, (kind, src, dst, operand, ch) in enumerate(self._ops):
            sb, so = slot(src)
            db, do = slot(dst)
            opnd = slot(operand) if operand is not None else None
            if opnd == (db, do):
                opnd = None
            out.append(ChunkOp(kind, src.rank, sb, so, dst.rank, db, do, cnt=src.size, operand=opnd, ch=ch,
                               key=(n,), origin=f"DSL operation {n} ({kind} {src.rank}->{dst.rank})"))
        return out

    def lower(self, *, instances: int = 1, proto: str = "Simple", min_bytes: int = 0, max_bytes: int = 0,
              max_tbs: int = 108, fuse: bool = True, check: bool = True,
              max_steps: int = DEFAULT_MAX_STEPS, max_nodes: int = MAX_NODES) -> Program:
        """Lower through `taccl.lowering` and prove with the checker (steps per thread block up to
        `max_steps`, XML nodes per rank up to `max_nodes`: the executor's default build allows 64 and 4096)."""
        program = self.lower_protocols([proto], instances=instances, min_bytes=min_bytes, max_bytes=max_bytes,
                                       max_tbs=max_tbs, fuse=fuse, check=check, max_steps=max_steps,
                                       max_nodes=max_nodes)[proto]
        if isinstance(program, UserError):
            raise program
        return program

    def lower_protocols(self, protocols, **options) -> dict:
        """`lower` (its keyword options) for each of `protocols` at once: {protocol: Program, or the UserError
        its lowering raised}, one lowering and proof shared where the protocol changes nothing
        (`taccl.lowering.lower_ops_protocols`)."""
        if not self._ops:
            raise UserError(f"DSL program {self.name!r} has no operations")
        return lower_ops_protocols(self.chunk_ops(), self.coll, protocols, name=self.name,
                                   options=LoweringOptions(**options))
