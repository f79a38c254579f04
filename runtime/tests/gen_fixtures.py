#!/usr/bin/env python3
"""Write the hand-designed baseline and faulty XML programs in tests/data/ (committed; rerun to regenerate).

Each baseline is the textbook schedule for its collective, written out step by step in the exact dialect of
msccl-xml.md section 1. The faulty ones are minimal programs that must be refused or stopped.
"""
from __future__ import annotations

import os

HERE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data")


def step(s, t, sb="i", so=-1, db="o", do=-1, cnt=1, depid=-1, deps=-1, hasdep=0):
    return (f'      <step s="{s}" type="{t}" srcbuf="{sb}" srcoff="{so}" dstbuf="{db}" dstoff="{do}" cnt="{cnt}" '
            f'depid="{depid}" deps="{deps}" hasdep="{hasdep}"/>')


class Prog:
    def __init__(self, name, coll, ngpus, nchunks, proto="Simple", nchannels=1, inplace=1, outofplace=1,
                 minb=0, maxb=0):
        self.head = (f'<algo name="{name}" proto="{proto}" nchannels="{nchannels}" nchunksperloop="{nchunks}" '
                     f'ngpus="{ngpus}" coll="{coll}" inplace="{inplace}" outofplace="{outofplace}" '
                     f'minBytes="{minb}" maxBytes="{maxb}">')
        self.gpus = []

    def gpu(self, rank, i, o, s, tbs):
        lines = [f'  <gpu id="{rank}" i_chunks="{i}" o_chunks="{o}" s_chunks="{s}">']
        for tid, (send, recv, chan, steps) in enumerate(tbs):
            lines.append(f'    <tb id="{tid}" send="{send}" recv="{recv}" chan="{chan}">')
            for k, st in enumerate(steps):
                lines.append(step(k, **st))
            lines.append("    </tb>")
        lines.append("  </gpu>")
        self.gpus.append("\n".join(lines))

    def write(self, fname):
        with open(os.path.join(HERE, fname), "w") as f:
            f.write(self.head + "\n" + "\n".join(self.gpus) + "\n</algo>\n")


def ring_allgather(R=4, per=2):
    """Ring allgather, per chunks per rank moved as one cnt=per step; LL (with Simple's 2-call FIFOs a ring
    whose steps span several calls deadlocks once chunks exceed a tile); in- and out-of-place."""
    p = Prog("ring_allgather", "allgather", R, R * per, proto="LL")
    for r in range(R):
        st = [dict(t="cpy", sb="i", so=0, db="o", do=r * per, cnt=per),
              dict(t="s", sb="o", so=r * per, db="o", do=r * per, cnt=per)]
        for k in range(1, R):
            c = (r - k) % R
            st.append(dict(t="rcs" if k < R - 1 else "r", sb="o", so=c * per, db="o", do=c * per, cnt=per))
        p.gpu(r, per, R * per, 0, [((r + 1) % R, (r - 1) % R, 0, st)])
    p.write(f"ring_allgather_{R}.xml")


def ring_allreduce(R=4, nch=2, proto="LL128"):
    """Ring allreduce over nch channels (one tb each), chunk j of channel c is c*R + j."""
    p = Prog("ring_allreduce", "allreduce", R, R * nch, proto=proto, nchannels=nch)
    for r in range(R):
        tbs = []
        for c in range(nch):
            ch = lambda j: c * R + (j % R)
            st = [dict(t="s", sb="i", so=ch(r - 1), db="i", do=ch(r - 1))]
            for k in range(1, R - 1):
                j = ch(r - 1 - k)
                st.append(dict(t="rrs", sb="i", so=j, db="i", do=j))
            j = ch(r)
            st.append(dict(t="rrcs", sb="i", so=j, db="o", do=j))
            for k in range(1, R - 1):
                j = ch(r - k)
                st.append(dict(t="rcs", sb="o", so=j, db="o", do=j))
            j = ch(r - (R - 1))
            st.append(dict(t="r", sb="o", so=j, db="o", do=j))
            tbs.append(((r + 1) % R, (r - 1) % R, c, st))
        p.gpu(r, R * nch, R * nch, 0, tbs)
    p.write(f"ring_allreduce_{R}.xml")


def ring_reducescatter(R=4):
    p = Prog("ring_reducescatter", "reducescatter", R, R, proto="LL")
    for r in range(R):
        st = [dict(t="s", sb="i", so=(r - 1) % R, db="i", do=(r - 1) % R)]
        for k in range(1, R - 1):
            j = (r - 1 - k) % R
            st.append(dict(t="rrs", sb="i", so=j, db="i", do=j))
        st.append(dict(t="rrc", sb="i", so=r, db="o", do=0))
        p.gpu(r, R, 1, 0, [((r + 1) % R, (r - 1) % R, 0, st)])
    p.write(f"ring_reducescatter_{R}.xml")


def direct_alltoall(R=4):
    """All-pairs alltoall: one tb per peer, plus a local copy tb."""
    p = Prog("direct_alltoall", "alltoall", R, R, inplace=0, outofplace=1)
    for r in range(R):
        tbs = []
        for q in range(R):
            if q == r:
                continue
            tbs.append((q, q, 0, [dict(t="s", sb="i", so=q, db="o", do=r), dict(t="r", sb="i", so=q, db="o", do=q)]))
        tbs.append((-1, -1, 0, [dict(t="cpy", sb="i", so=r, db="o", do=r)]))
        p.gpu(r, R, R, 0, tbs)
    p.write(f"direct_alltoall_{R}.xml")


def direct_allreduce(R=4):
    """Direct reduce-scatter into scratch + local multi-source reduction (nops, re fusion shape) + direct
    allgather. Exercises scratch, dependencies across thread blocks, nop and re."""
    p = Prog("direct_allreduce", "allreduce", R, R, proto="Simple")
    for r in range(R):
        peers = [q for q in range(R) if q != r]
        red = len(peers)  # the reducer's tb id
        # reducer: cpy, nops, then re steps; the last re publishes.
        rst = [dict(t="cpy", sb="i", so=r, db="o", do=r)]
        for j in range(len(peers) - 1):
            rst.append(dict(t="nop", sb="i", so=-1, db="o", do=-1, cnt=0, depid=j, deps=1))
        for j in range(len(peers)):
            last = j == len(peers) - 1
            d = dict(depid=len(peers) - 1, deps=1) if j == 0 else {}
            rst.append(dict(t="re", sb="s", so=j, db="o", do=r, hasdep=1 if last else 0, **d))
        final = len(rst) - 1
        tbs = []
        for j, q in enumerate(peers):
            tbs.append((q, q, 0, [dict(t="s", sb="i", so=q, db="o", do=q),
                                  dict(t="r", sb="i", so=r, db="s", do=j, hasdep=1),
                                  dict(t="s", sb="o", so=r, db="o", do=r, depid=red, deps=final),
                                  dict(t="r", sb="o", so=q, db="o", do=q)]))
        tbs.append((-1, -1, 0, rst))
        p.gpu(r, R, R, R - 1, tbs)
    p.write(f"direct_allreduce_{R}.xml")


def chain_broadcast(R=4, nchunks=4):
    """Root 0 broadcasts down the chain 0 -> 1 -> ... -> R-1, one chunk per step (pipelined)."""
    p = Prog("chain_broadcast", "broadcast", R, nchunks, proto="LL")
    for r in range(R):
        if r == 0:
            st = [dict(t="cpy", sb="i", so=0, db="o", do=0, cnt=nchunks)]
            st += [dict(t="s", sb="i", so=c, db="o", do=c) for c in range(nchunks)]
            tbs = [(1, -1, 0, st)]
        elif r < R - 1:
            tbs = [(r + 1, r - 1, 0, [dict(t="rcs", sb="o", so=c, db="o", do=c) for c in range(nchunks)])]
        else:
            tbs = [(-1, r - 1, 0, [dict(t="r", sb="o", so=c, db="o", do=c) for c in range(nchunks)])]
        p.gpu(r, nchunks, nchunks, 0, tbs)
    p.write(f"chain_broadcast_{R}.xml")


def chain_reduce(R=4, nchunks=2):
    """Reduce to root 0 along R-1 -> ... -> 1 -> 0, all chunks in one cnt=nchunks call; out-of-place."""
    p = Prog("chain_reduce", "reduce", R, nchunks, proto="Simple", inplace=0, outofplace=1)
    for r in range(R):
        if r == R - 1:
            tbs = [(r - 1, -1, 0, [dict(t="s", sb="i", so=0, db="i", do=0, cnt=nchunks)])]
        elif r > 0:
            tbs = [(r - 1, r + 1, 0, [dict(t="rrs", sb="i", so=0, db="i", do=0, cnt=nchunks)])]
        else:
            tbs = [(-1, 1, 0, [dict(t="rrc", sb="i", so=0, db="o", do=0, cnt=nchunks)])]
        p.gpu(r, nchunks, nchunks, 0, tbs)
    p.write(f"chain_reduce_{R}.xml")


def swap_alltoall_inplace():
    """In-place AllToAll of 2 ranks: each rank sends i[peer] from one block and receives the peer's chunk into
    the same memory (o[peer]) from another, after a local dependency on the send. The receive must not be
    direct: the peer's send is not ordered after this rank's read, so a direct write could overtake it."""
    p = Prog("swap_alltoall_inplace", "alltoall", 2, 2, inplace=1, outofplace=0)
    for r in range(2):
        q = 1 - r
        p.gpu(r, 2, 2, 0, [(q, -1, 0, [dict(t="s", sb="i", so=q, db="o", do=r, hasdep=1)]),
                           (-1, q, 0, [dict(t="r", sb="i", so=q, db="o", do=q, depid=0, deps=0)])])
    p.write("swap_alltoall_inplace_2.xml")


def faulty():
    # Deadlock through FIFO capacity: both ranks send 3 Simple calls (2 fit) before receiving.
    p = Prog("fifo_deadlock", "allreduce", 2, 3, proto="Simple", inplace=0, outofplace=1)
    for r in range(2):
        st = [dict(t="s", sb="i", so=c, db="o", do=c) for c in range(3)]
        st += [dict(t="r", sb="i", so=c, db="o", do=c) for c in range(3)]
        p.gpu(r, 3, 3, 0, [(1 - r, 1 - r, 0, st)])
    p.write("bad_fifo_deadlock.xml")
    # The same with LL (8 calls fit): runs to completion (as an exchange, not a correct allreduce).
    # Deadlock by a cycle: each rank receives before it sends.
    p = Prog("cycle_deadlock", "allreduce", 2, 1, inplace=0, outofplace=1)
    for r in range(2):
        p.gpu(r, 1, 1, 0, [(1 - r, 1 - r, 0, [dict(t="r", sb="i", so=0, db="o", do=0),
                                              dict(t="s", sb="i", so=0, db="o", do=0)])])
    p.write("bad_cycle_deadlock.xml")
    # Data race: tb 0 receives into o[0] while tb 1 copies into o[0], with no dependency between them.
    p = Prog("racy", "allreduce", 2, 1, inplace=0, outofplace=1)
    for r in range(2):
        p.gpu(r, 1, 1, 0, [(1 - r, 1 - r, 0, [dict(t="s", sb="i", so=0, db="o", do=0),
                                              dict(t="r", sb="i", so=0, db="o", do=0)]),
                           (-1, -1, 0, [dict(t="cpy", sb="i", so=0, db="o", do=0)])])
    p.write("bad_race.xml")


if __name__ == "__main__":
    os.makedirs(HERE, exist_ok=True)
    ring_allgather()
    ring_allgather(8, 1)
    ring_allreduce()
    ring_allreduce(8, 4, "Simple")
    ring_reducescatter()
    direct_alltoall()
    direct_allreduce()
    direct_allreduce(3)
    chain_broadcast()
    chain_reduce()
    swap_alltoall_inplace()
    faulty()
