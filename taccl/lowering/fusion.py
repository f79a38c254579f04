"""Pass: instruction fusion (MSCCLang section 4.3; rules in msccl-xml.md section 4).

Rewrite rules, applied to a receive X (``r`` or ``rrc``) on rank R whose only reader is a send Y on R that
reads exactly the slots X wrote and nothing else (so X is Y's only dependency; with more readers, they
would all wait for the fused send), and, for a synthesized algorithm with ``keep_schedule`` (the default),
only where its schedule never overlaps the transfers of X's and Y's connections (a fused step puts both in
one thread block, which would serialise them; `taccl.lowering.lower` with a topology also tries without
this check and without fusion, and keeps the fastest program):

- ``r``   + ``s``  -> ``rcs``   receive, store, forward;
- ``rrc`` + ``s``  -> ``rrcs``  receive, reduce, store, forward;
- ``rrc`` + ``s``  -> ``rrs``   when the reduced value is read by nobody else and is overwritten later
  or lives in scratch: receive, reduce, forward, store nothing.

With ``network_fan_out`` (GPUs per node), a receive read by several instructions may also fuse with the
first of them that is a send to another node: the others, even those scheduled before it, then wait for
the fused step, that is until the network send's data has left (at small sizes a fraction of the flag wait
it saves on the slowest hop, at large sizes much more: `taccl.lowering.lower` keeps such a program only
where it simulates faster).

The fused instruction does its receive and its send at one point of its thread block's order. Two modes
choose that point:

``natural`` (tried first)
    keys stay as they are: the fused instruction receives at X's event and sends at Y's; its thread block
    orders it by the send (`taccl.lowering.schedule` keeps every connection in event order). The data
    may wait in the connection's FIFO meanwhile, as in NCCL's ring, and every thread block keeps the
    algorithm's time order. Such programs rely on FIFO buffering; the checker proves them.
``safe``
    at X's place: Y's receive Z on the next rank moves to ``key(X) + (0,)``, allowed only when every
    dependency of Z precedes that key. Z may in turn fuse, so chains fuse step by step. The result is
    deadlock-free even with unbuffered sends (see `taccl.lowering.schedule`), but a fused chain runs
    ahead of everything keyed after its start, which serialises rings; it is the fallback.
"""
from __future__ import annotations

import heapq

from ..program import Buf, StepType

__all__ = ["fuse"]

_FUSED = {StepType.RECV: StepType.RECV_COPY_SEND, StepType.RECV_REDUCE_COPY: StepType.RECV_REDUCE_COPY_SEND}


def _candidate(x, serial=None, network_fan_out=0):
    fan_out = len(x.readers) > 1
    if fan_out and not network_fan_out:
        # the other readers of a fused receive would wait for its send too (a dependency is on a whole
        # step): a fan-out forwards faster from a plain receive
        return None
    best = None
    for y in x.readers:
        if (y.type is StepType.SEND and not y.dead and y.srcbuf == x.dstbuf and y.srcoff == x.dstoff
                and y.cnt == x.cnt and len(y.deps) == 1 and x in y.deps and y.to is not None
                and not (fan_out and y.send_peer // network_fan_out == x.rank // network_fan_out)):
            if best is None or y.key < best.key:
                best = y  # (a fan-out fuses only with a send that leaves the node)
    if best is not None and serial is not None and not serial(x.rank, x.recv_peer, best.send_peer):
        return None
    return best


def _serial_pairs(instrs):
    """Whether fusing receives from A with sends to B on rank R keeps the schedule. Fused steps put both
    connections in one thread block, which takes its steps one at a time in order (a fused step at its
    send's place): a receive holds the block until its data arrived, a send until its data left. The pair
    is fine when, walked so, every send still starts at its scheduled time. Programs without times (the
    DSL) always are."""
    steps = {}
    for ins in instrs:
        if ins.dead:
            continue
        if ins.span is None:
            if ins.send_peer >= 0 or ins.recv_peer >= 0:
                return None
            continue
        if ins.recv_peer >= 0:
            steps.setdefault((ins.rank, "R", ins.recv_peer), []).append(ins)
        if ins.send_peer >= 0:
            steps.setdefault((ins.rank, "S", ins.send_peer), []).append(ins)
    memo = {}

    def serial(r, a, b):
        key = (r, a, b)
        if key in memo:
            return memo[key]
        sends = steps.get((r, "S", b), [])
        fused = {}  # receive from A -> the send to B it would fuse with
        for y in sends:
            x = next(iter(y.deps)) if len(y.deps) == 1 else None
            if x is not None and x.recv_peer == a and len(x.readers) == 1 and x.type in _FUSED:
                fused[x] = y
        ready = {y: x.span[1] for x, y in fused.items()}
        order = _block_order(sends, steps.get((r, "R", a), []), fused)
        ok, free = order is not None, 0.0
        for ins in order or ():
            send, arrive = ins.span
            if ins.send_peer == b:  # a send (fused or not)
                free = max(free, ready.get(ins, 0.0))
                if free > send + 1e-6:
                    ok = False
                    break
                free = arrive
            else:  # a receive from A that stays plain
                free = max(free, arrive)
        memo[key] = ok
        return ok

    return serial


def _block_order(sends, receives, fused):
    """The order one thread block would take the sends to B and the receives from A in, as
    `taccl.lowering.schedule.order_tb` does: each connection in event order, a fused step (standing as its
    send) once it heads both, otherwise the smallest position first. None when the two orders conflict.
    `receives` includes the fused ones (the keys of `fused`, each mapped to its send)."""
    chains = [[fused.get(x, x) for x in sorted(receives, key=lambda i: i.key)], sorted(sends, key=lambda i: i.key)]
    joint = set(fused.values())
    heads, out = [0, 0], []
    while heads[0] < len(chains[0]) or heads[1] < len(chains[1]):
        top = [ch[h] if h < len(ch) else None for ch, h in zip(chains, heads)]
        ready = [k for k in (0, 1) if top[k] is not None and (top[k] not in joint or top[0] is top[1])]
        if not ready:
            return None
        k = min(ready, key=lambda k: top[k].pos)
        out.append(top[k])
        for j in (0, 1):
            if top[j] is top[k]:
                heads[j] += 1
    return out


def fuse(instrs: list, *, mode: str = "safe", allow_rrs: bool = True, keep_schedule: bool = True,
         network_fan_out: int = 0) -> bool:
    """Fuse in place; absorbed sends are marked ``dead``. ``keep_schedule=False`` skips the schedule check
    (`_serial_pairs`): every pair the rules allow is fused. ``network_fan_out`` (GPUs per node, 0 for
    none): see the module docstring. Returns True, or, with ``network_fan_out``, whether some fan-out fused
    (when none did, the result is the one without it)."""
    serial = _serial_pairs(instrs) if keep_schedule else None
    if mode == "natural":
        fan_outs = _fuse_natural(instrs, allow_rrs, serial, network_fan_out)
    else:
        fan_outs = _fuse_safe(instrs, allow_rrs, serial, network_fan_out)
    return fan_outs > 0 or not network_fan_out


def _fuse_safe(instrs, allow_rrs, serial, network_fan_out) -> int:
    """The ``safe`` mode; returns the number of fan-outs fused."""
    fan_outs = 0
    heap = [(x.key, x.id) for x in instrs if x.type in _FUSED]
    heapq.heapify(heap)
    while heap:
        key, xid = heapq.heappop(heap)
        x = instrs[xid]
        if x.key != key or x.type not in _FUSED or x.dead:
            continue
        y = _candidate(x, serial, network_fan_out)
        if y is None:
            continue
        z = y.to
        newkey = x.key + (0,)
        if any(not d.key < newkey for d in z.deps):
            continue
        fan_outs += len(x.readers) > 1
        _absorb(x, y, allow_rrs)
        z.key = z.pos = newkey
        if z.type in _FUSED:
            heapq.heappush(heap, (z.key, z.id))
    return fan_outs


def _absorb(x, y, allow_rrs):
    z = y.to
    dead_value = len(x.readers) == 1 and (x.dstbuf is Buf.SCRATCH or x.overwritten >= x.cnt)
    if x.type is StepType.RECV_REDUCE_COPY and allow_rrs and dead_value:
        x.type = StepType.RECV_REDUCE_SEND
    else:
        x.type = _FUSED[x.type]
    x.send_peer = y.send_peer
    x.to, z.frm = z, x
    if y.want_ch is not None:
        x.want_ch = y.want_ch if x.want_ch is None else x.want_ch & y.want_ch
    y.dead = True
    x.readers.discard(y)
    for dep in y.dependents:
        dep.deps.discard(y)
        if dep is not x:
            dep.deps.add(x)
            x.dependents.append(dep)
    x.dependents = [d for d in x.dependents if d is not y]


def _fuse_natural(instrs, allow_rrs, serial=None, network_fan_out=0) -> int:
    """The ``natural`` mode; returns the number of fan-outs fused."""
    fan_outs = 0
    for x in sorted((i for i in instrs if i.type in _FUSED), key=lambda i: i.key):
        y = _candidate(x, serial, network_fan_out)
        if y is None:
            continue
        fan_outs += len(x.readers) > 1
        _absorb(x, y, allow_rrs)
        x.pos = y.key
    return fan_outs
