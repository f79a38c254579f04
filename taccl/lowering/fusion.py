"""Pass: instruction fusion (MSCCLang section 4.3; rules in msccl-xml.md section 4).

Rewrite rules, applied to a receive X (``r`` or ``rrc``) on rank R and the first send Y on R that reads
exactly the slots X wrote and nothing else (so X is Y's only dependency):

- ``r``   + ``s``  -> ``rcs``   receive, store, forward;
- ``rrc`` + ``s``  -> ``rrcs``  receive, reduce, store, forward;
- ``rrc`` + ``s``  -> ``rrs``   when the reduced value is read by nobody else and is overwritten later
  or lives in scratch: receive, reduce, forward, store nothing.

The absorbed send moves to just after X in the global order (its receive Z on the next rank gets the key
``key(X) + (0,)``). That is allowed only when every dependency of Z precedes the new key; otherwise the pair
is left unfused. Z may in turn fuse with its own forward, so chains (a ring's ``rcs`` ... ``rcs``) fuse
step by step. Every dependency still points to an earlier key afterwards.
"""
from __future__ import annotations

import heapq

from ..program import Buf, StepType

__all__ = ["fuse"]

_FUSED = {StepType.RECV: StepType.RECV_COPY_SEND, StepType.RECV_REDUCE_COPY: StepType.RECV_REDUCE_COPY_SEND}


def _candidate(x):
    best = None
    for y in x.readers:
        if (y.type is StepType.SEND and not y.dead and y.srcbuf == x.dstbuf and y.srcoff == x.dstoff
                and y.cnt == x.cnt and len(y.deps) == 1 and x in y.deps and y.to is not None):
            if best is None or y.key < best.key:
                best = y
    return best


def fuse(instrs: list, *, allow_rrs: bool = True) -> int:
    """Fuse in place; returns the number of fusions. Absorbed sends are marked ``dead``."""
    heap = [(x.key, x.id) for x in instrs if x.type in _FUSED]
    heapq.heapify(heap)
    by_id = instrs
    count = 0
    while heap:
        key, xid = heapq.heappop(heap)
        x = by_id[xid]
        if x.key != key or x.type not in _FUSED or x.dead:
            continue
        y = _candidate(x)
        if y is None:
            continue
        z = y.to
        newkey = x.key + (0,)
        if any(not d.key < newkey for d in z.deps):
            continue
        dead_value = len(x.readers) == 1 and (x.dstbuf is Buf.SCRATCH or x.overwritten >= x.cnt)
        if x.type is StepType.RECV_REDUCE_COPY and allow_rrs and dead_value:
            x.type = StepType.RECV_REDUCE_SEND
            x.dstbuf, x.dstoff = Buf.OUTPUT, -1
        else:
            x.type = _FUSED[x.type]
        x.send_peer = y.send_peer
        x.to, z.frm = z, x
        if y.want_ch is not None and x.want_ch is None:
            x.want_ch = y.want_ch
        y.dead = True
        x.readers.discard(y)
        for dep in y.dependents:
            dep.deps.discard(y)
            if dep is not x:
                dep.deps.add(x)
                x.dependents.append(dep)
        x.dependents = [d for d in x.dependents if d is not y]
        z.key = newkey
        count += 1
        if z.type in _FUSED:
            heapq.heappush(heap, (z.key, z.id))
    return count
