"""Pass: instruction generation (MSCCLang section 4.2, TACCL section 6.2).

Each remote copy becomes a ``s`` on the source rank and a ``r`` on the destination; each remote reduce a
``s`` and a ``rrc`` whose local operand is the op's operand slot (normally the destination itself); a local
copy becomes ``cpy``, a local reduce ``re`` (preceded by a ``cpy`` when the operand is not the destination).

Same-rank dependencies come from each slot's last writer and the readers since (msccl-tools'
``rank_dag``): a read depends on the last writer (RAW); a write depends on the readers since the last
write, or on that writer when there were none (WAR, WAW). The ops are processed in key order, so every
dependency points to an earlier key. Each written value also records who read it and whether it was
overwritten: the fusion pass needs both.
"""
from __future__ import annotations

from ..errors import UserError
from ..program import StepType
from .ops import COPY, REDUCE, Instr

__all__ = ["generate"]


class _Slots:
    """Per-rank slot state: (buf, idx) -> [last writer, readers since]."""

    __slots__ = ("state",)

    def __init__(self):
        self.state = {}

    def read(self, ins: Instr, slots) -> None:
        st = self.state
        for sl in slots:
            cur = st.get(sl)
            if cur is None:
                st[sl] = [None, [ins]]
                continue
            w = cur[0]
            if w is not None and w is not ins:
                ins.deps.add(w)
                w.readers.add(ins)
            cur[1].append(ins)

    def write(self, ins: Instr, slots) -> None:
        st = self.state
        for sl in slots:
            cur = st.get(sl)
            if cur is None:
                st[sl] = [ins, []]
                continue
            w, readers = cur
            if readers:
                for r in readers:
                    if r is not ins:
                        ins.deps.add(r)
            elif w is not None and w is not ins:
                ins.deps.add(w)
            if w is not None and w is not ins:
                w.overwritten += 1
            cur[0] = ins
            cur[1] = []


def _slots(buf, off, cnt):
    return [(buf, off + k) for k in range(cnt)]


def generate(ops: list, num_ranks: int) -> list:
    """ChunkOps (any order; sorted here by key) -> Instrs with dependencies and send/receive matches."""
    instrs: list[Instr] = []
    ranks = [_Slots() for _ in range(num_ranks)]

    def new(rank, type_, **kw) -> Instr:
        ins = Instr(len(instrs), rank, type_, **kw)
        instrs.append(ins)
        return ins

    for op in sorted(ops, key=lambda o: o.key):
        for r in (op.src_rank, op.dst_rank):
            if not 0 <= r < num_ranks:
                raise UserError(f"{op.origin or 'operation'}: rank {r} is not one of the {num_ranks} ranks")
        if op.kind not in (COPY, REDUCE):
            raise UserError(f"{op.origin or 'operation'}: unknown operation {op.kind!r}")
        src = _slots(op.src_buf, op.src_off, op.cnt)
        dst = _slots(op.dst_buf, op.dst_off, op.cnt)
        operand = op.operand if op.operand is not None else (op.dst_buf, op.dst_off)
        opnd = _slots(operand[0], operand[1], op.cnt)
        if op.remote:
            s = new(op.src_rank, StepType.SEND, srcbuf=op.src_buf, srcoff=op.src_off, cnt=op.cnt,
                    send_peer=op.dst_rank, key=op.key, origin=op.origin, want_ch=op.ch, span=op.span)
            ranks[op.src_rank].read(s, src)
            if op.kind == COPY:
                r = new(op.dst_rank, StepType.RECV, dstbuf=op.dst_buf, dstoff=op.dst_off, cnt=op.cnt,
                        recv_peer=op.src_rank, key=op.key, origin=op.origin, want_ch=op.ch, span=op.span)
            else:
                r = new(op.dst_rank, StepType.RECV_REDUCE_COPY, srcbuf=operand[0], srcoff=operand[1],
                        dstbuf=op.dst_buf, dstoff=op.dst_off, cnt=op.cnt, recv_peer=op.src_rank, key=op.key,
                        origin=op.origin, want_ch=op.ch, span=op.span)
                ranks[op.dst_rank].read(r, opnd)
            ranks[op.dst_rank].write(r, dst)
            s.to, r.frm = r, s
            continue
        rk = ranks[op.src_rank]
        if op.kind == COPY:
            if src == dst:
                continue
            c = new(op.src_rank, StepType.COPY, srcbuf=op.src_buf, srcoff=op.src_off, dstbuf=op.dst_buf,
                    dstoff=op.dst_off, cnt=op.cnt, key=op.key, origin=op.origin)
            rk.read(c, src)
            rk.write(c, dst)
            continue
        if opnd != dst:  # dst := operand, then dst += src
            if set(src) & set(dst):
                raise UserError(f"{op.origin or 'operation'}: a local reduce into a third slot may not overlap "
                                f"its source")
            c = new(op.src_rank, StepType.COPY, srcbuf=operand[0], srcoff=operand[1], dstbuf=op.dst_buf,
                    dstoff=op.dst_off, cnt=op.cnt, key=op.key, origin=op.origin)
            rk.read(c, opnd)
            rk.write(c, dst)
            op_key = op.key + (0,)
        else:
            op_key = op.key
        e = new(op.src_rank, StepType.REDUCE, srcbuf=op.src_buf, srcoff=op.src_off, dstbuf=op.dst_buf,
                dstoff=op.dst_off, cnt=op.cnt, key=op_key, origin=op.origin)
        rk.read(e, src + dst)
        rk.write(e, dst)
    # scheduled orders on one-at-a-time resources: a send waits for the sends its op comes after
    sends = {}
    for ins in instrs:
        if ins.type is StepType.SEND:
            sends.setdefault((ins.rank, ins.key[0]), []).append(ins)
    for op in ops:
        if op.after and op.remote:
            mine = [s for s in sends.get((op.src_rank, op.key[0]), ()) if s.key == op.key]
            for a in op.after:
                for prev in sends.get((op.src_rank, a), ()):
                    for s in mine:
                        s.deps.add(prev)
    for ins in instrs:
        for d in ins.deps:
            d.dependents.append(ins)
    return instrs


def check_keys(instrs) -> None:
    """Invariant: every dependency has a smaller key than its dependent (internal consistency check)."""
    for ins in instrs:
        for d in ins.deps:
            if not d.key < ins.key:
                raise AssertionError(f"dependency {d} does not precede {ins}")

