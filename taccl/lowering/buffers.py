"""Pass: buffer allocation, from an Algorithm's transfers to `ChunkOp`s on concrete slots (TACCL 6.2).

Where chunk c lives on rank r:

- at the start, where the precondition puts it: the input buffer, at ``Collective.input_index``;
- its *home* on r is the output buffer (``Collective.output_index``) when the postcondition wants c on r,
  else a scratch slot (a relay); a transfer that brings several chunks allocates their scratch slots
  consecutively, in the transfer's order, so they can travel on together;
- a copy transfer writes the home; a reduce transfer writes the home with the current value as the local
  operand (an out-of-place first accumulation reads the input and writes the output, later ones add in
  place); reductions that several ranks send into one copy back to back are received into scratch instead
  and folded into the home by one run of local reductions once all have arrived (``converge="aside"``), or
  all but the last, which then reduces into the folded sum as it lands (``"direct-last"``, for the
  protocols with short steps), or each reduces into the home as it lands, one after another
  (``"in-place"``: no scratch, no local steps, and fewer flag waits, for programs at the runtime's limit of
  XML nodes);
  ranks that swap partial sums (an exchange, `taccl.phases`; `Transfer.exchange`, or two reverse
  reductions each sent before the other lands) each send their sum without the others', which one place in
  the transfer order cannot say: a rank receives the sums into scratch and folds them in once all have
  arrived and its own sends of the exchange were sent;
- at the end, every postcondition chunk not yet at its home is copied there locally (AllGather's own chunk
  from input to output, say).

A transfer of several chunks becomes one op with cnt > 1 for each run that is contiguous in the source
slots, the destination slots and (for a reduce) the operand slots; otherwise several ops. Runs are cut at
`MAX_CNT` chunks, and at 1 chunk when ``single=True`` (instances > 1 split every chunk, which breaks
contiguity; see `taccl.lowering.emit`).

Keys: the transfers in a topological order of their dependencies (and `Transfer.after` orders), ties by send
time then id. A transfer's sends wait for the sends of its `after` transfers (``ChunkOp.after``).
"""
from __future__ import annotations

import heapq

from ..algorithm import exchange_partners
from ..errors import UserError
from ..program import Buf
from .ops import COPY, MAX_CNT, REDUCE, ChunkOp

__all__ = ["algorithm_ops", "transfer_order", "CONVERGE_MODES"]

# how reductions that several ranks send into one copy land (the module docstring)
CONVERGE_MODES = ("direct-last", "aside", "in-place")


def transfer_order(transfers: list) -> list:
    """Transfers sorted by (send_us, id), moved later where a dependency would otherwise follow them."""
    by_id = {t.id: t for t in transfers}
    indeg = {t.id: 0 for t in transfers}
    succ = {t.id: [] for t in transfers}
    for t in transfers:
        for d in set(t.deps) | set(t.after):
            if d not in by_id:
                raise UserError(f"transfer {t.id} depends on transfer {d}, which does not exist")
            if d == t.id:
                raise UserError(f"transfer {t.id} depends on itself")
            indeg[t.id] += 1
            succ[d].append(t.id)
    heap = [(t.send_us, t.id) for t in transfers if indeg[t.id] == 0]
    heapq.heapify(heap)
    out = []
    while heap:
        _, i = heapq.heappop(heap)
        out.append(by_id[i])
        for j in succ[i]:
            indeg[j] -= 1
            if indeg[j] == 0:
                heapq.heappush(heap, (by_id[j].send_us, j))
    if len(out) != len(transfers):
        raise UserError("the transfers' dependencies form a cycle")
    return out


def _runs(items, single):
    """Split [(src, dst, operand)] (slots (buf, off)) into maximal runs contiguous in all three."""
    runs = []
    for it in items:
        if runs and not single and len(runs[-1]) < MAX_CNT:
            last = runs[-1][-1]
            if all((a is None and b is None) or (a is not None and b is not None and a[0] == b[0]
                                                  and b[1] == a[1] + 1) for a, b in zip(last, it)):
                runs[-1].append(it)
                continue
        runs.append([it])
    return runs


def _swaps(order: list) -> dict:
    """Partial sums ranks swap (an exchange): (transfer id, chunk) -> the ids of the destination's sends it
    is swapped with. The algorithm's `Transfer.exchange`, and reverse reductions of the same chunks each sent
    before the other lands (which the transfer-level semantics make a swap too: each send reads its rank's
    sum then)."""
    out = exchange_partners(order)
    by_pair = {}
    for t in order:
        if t.op == REDUCE:
            by_pair.setdefault((t.src, t.dst, tuple(sorted(t.chunks))), []).append(t)
    paired = {tid for tid, _ in out}
    for (a, b, chunks), ts in by_pair.items():
        for t in ts:
            for u in by_pair.get((b, a, chunks), ()):
                if (t.id not in paired and u.id not in paired and u.send_us < t.arrive_us
                        and t.send_us < u.arrive_us):
                    paired |= {t.id, u.id}
                    out.update({(t.id, c): (u.id,) for c in chunks})
                    out.update({(u.id, c): (t.id,) for c in chunks})
    return out


def _converging_reductions(order: list, direct_last: bool, swaps=()) -> dict:
    """Reductions that several ranks send into one rank's copy of a chunk back to back (nothing reads or
    writes that copy in between): (transfer id, chunk) -> a shared record {"last": id of the last one
    received aside, "slots": []}. Reduced one after another in place, each would wait for the previous;
    received aside into scratch, they land in parallel and one run of local reductions (which the runtime
    fuses) folds them in.

    With `direct_last` the last reduction of each run is not received aside: it reduces into the folded
    sum as it lands, in the thread block that receives it, so no other block has to wait for a fold before
    the sum moves on (and a single forwarding send can fuse with it into one receive-reduce-send). A swap
    (`_swaps`) is folded on its own and ends a run."""
    events = {}  # (chunk, rank) -> [(kind, transfer id)] in transfer order
    for t in order:
        for c in t.chunks:
            events.setdefault((c, t.src), []).append(("read", t.id))
            events.setdefault((c, t.dst), []).append(("reduce" if t.op == REDUCE and (t.id, c) not in swaps
                                                      else "write", t.id))
    out = {}
    for (c, _), evs in events.items():
        run = []
        for kind, tid in evs + [("end", None)]:
            if kind == "reduce":
                run.append(tid)
                continue
            if len(run) >= 2:
                aside = run[:-1] if direct_last else run
                record = {"last": aside[-1], "slots": []}
                for r in aside:
                    out[(r, c)] = record
            run = []
    return out


def _latest_arrival_last(order: list, max_span: int = 4096, swaps=()) -> list:
    """`order` with the partial sum that arrives last (the solver's arrival time) of each converging reduction
    moved to the end of its run, where that is safe: the direct one of `direct_last` should be the one the
    others are folded before, not the one sent last (a partial that crosses the network is sent early and
    lands late). It moves only past transfers that neither touch its chunks on its two ranks, nor use its
    connection, nor depend on it, and at most `max_span` places (the check scans them)."""
    touches = {}  # (chunk, rank) -> positions of the transfers reading or writing it
    for pos, t in enumerate(order):
        for c in t.chunks:
            touches.setdefault((c, t.src), []).append(pos)
            touches.setdefault((c, t.dst), []).append(pos)
    moves = {}  # position -> the run end it goes right after
    for (c, r), positions in touches.items():
        run = [p for p in positions if order[p].dst == r and order[p].op == REDUCE and (order[p].id, c) not in swaps]
        if len(run) < 2 or run != positions[-len(run):]:
            continue  # only a run of reductions that ends this copy's history (nothing reads it in between)
        latest, end = max(run, key=lambda p: (order[p].arrive_us, p)), run[-1]
        if latest != end and end - latest <= max_span and _can_move_later(order, latest, end):
            moves[latest] = min(moves.get(latest, end), end)  # a transfer of several chunks: the earliest end
    ends = set(moves.values())
    moves = {i: j for i, j in moves.items() if i not in ends and j not in moves}  # no chains of moves
    follow = {}
    for i, j in sorted(moves.items()):
        follow.setdefault(j, []).append(order[i])
    out = []
    for pos, t in enumerate(order):
        if pos not in moves:
            out.append(t)
            out += follow.get(pos, [])
    return out


def _can_move_later(order: list, i: int, j: int) -> bool:
    t = order[i]
    mine = {(c, r) for c in t.chunks for r in (t.src, t.dst)}
    for u in order[i + 1:j + 1]:
        if t.id in u.deps or t.id in u.after or (u.src, u.dst) == (t.src, t.dst):
            return False
        if any((c, u.src) in mine or ((c, u.dst) in mine and not (u.dst == t.dst and u.op == REDUCE
                                                                    and t.op == REDUCE)) for c in u.chunks):
            return False
    return True


def algorithm_ops(algo, coll, *, single: bool = False, converge: str = "aside") -> list:
    """The ChunkOps of an Algorithm (see the module docstring; `converge`: one of `CONVERGE_MODES`)."""
    if converge not in CONVERGE_MODES:
        raise ValueError(f"converge must be one of {CONVERGE_MODES}, not {converge!r}")
    direct_last = converge == "direct-last"
    R = coll.num_ranks
    loc = {}
    for c, r in coll.precondition:
        loc[(c, r)] = (Buf.INPUT, coll.input_index[(c, r)])
    scratch_next = [0] * R
    home = {}

    def home_of(c, r):
        h = home.get((c, r))
        if h is None:
            if (c, r) in coll.postcondition:
                h = (Buf.OUTPUT, coll.output_index[(c, r)])
            else:
                h = (Buf.SCRATCH, scratch_next[r])
                scratch_next[r] += 1
            home[(c, r)] = h
        return h

    def fold(r, c, slots, pos):
        """Local reductions of the partial sums received aside into `slots` into the home of c on r."""
        into = home_of(c, r)
        operand = loc[(c, r)]
        for j, slot in enumerate(slots):
            ops.append(ChunkOp(REDUCE, r, slot[0], slot[1], r, into[0], into[1],
                               operand=operand if j == 0 and operand != into else None,
                               key=(pos, 1000 + j), origin=f"local reduction on rank {r}"))
        loc[(c, r)] = into

    ops = []
    order = transfer_order(algo.transfers)
    swaps = _swaps(order)
    if direct_last:
        order = _latest_arrival_last(order, swaps=swaps)
    pos_of = {t.id: pos for pos, t in enumerate(order)}
    staged = {} if converge == "in-place" else _converging_reductions(order, direct_last, swaps)
    # (chunk, rank) of an exchange -> the sums it received aside, and the transfers still to come before it
    # adds them: every sum it gets, and its own sends of the exchange (they carry its sum without them)
    exchanges = {}
    by_id = {t.id: t for t in order}
    for (tid, c), partners in swaps.items():
        group = exchanges.setdefault((c, by_id[tid].dst), {"slots": [], "left": set()})
        group["left"].update((tid,) + partners)
    for pos, t in enumerate(order):
        where = f"transfer {t.id} ({t.src}->{t.dst})"
        if not (0 <= t.src < R and 0 <= t.dst < R) or t.src == t.dst:
            raise UserError(f"{where}: source and destination must be two different ranks of 0..{R - 1}")
        if t.op not in (COPY, REDUCE):
            raise UserError(f"{where}: unknown op {t.op!r}, expected copy or reduce")
        if not t.chunks:
            raise UserError(f"{where}: moves no chunk")
        items = []
        for c in t.chunks:
            if not 0 <= c < coll.num_chunks:
                raise UserError(f"{where}: chunk {c} is not a chunk of this collective (0..{coll.num_chunks - 1})")
            src = loc.get((c, t.src))
            if src is None:
                raise UserError(f"{where}: rank {t.src} sends chunk {c}, which it never holds")
            if t.op == REDUCE:
                operand = loc.get((c, t.dst))
                if operand is None:
                    raise UserError(f"{where}: rank {t.dst} reduces chunk {c} but holds no contribution to it")
            else:
                operand = None
            items.append([c, src, None, operand])
        for it in items:  # allocate homes in the transfer's chunk order (consecutive scratch)
            if (t.id, it[0]) in staged or (t.id, it[0]) in swaps:  # a partial sum received aside, reduced locally
                it[2] = (Buf.SCRATCH, scratch_next[t.dst])
                scratch_next[t.dst] += 1
                it[3] = None
            else:
                it[2] = home_of(it[0], t.dst)
        k = 0
        for kind in (COPY, REDUCE):
            part = [it for it in items if (it[3] is None if kind == COPY else it[3] is not None)]
            part.sort(key=lambda it: (it[1][0].value, it[1][1]))
            for run in _runs([(it[1], it[2], it[3]) for it in part], single):
                (sb, so), (db, do), opnd = run[0]
                ops.append(ChunkOp(kind if t.op == REDUCE else COPY, t.src, sb, so, t.dst, db, do, cnt=len(run),
                                   operand=opnd, key=(pos, k), origin=where, span=(t.send_us, t.arrive_us),
                                   after=tuple(pos_of[a] for a in t.after)))
                k += 1
        for it in items:
            c = it[0]
            if (t.id, c) in swaps:
                exchanges[(c, t.dst)]["slots"].append(it[2])
            elif (t.id, c) in staged:
                aside = staged[(t.id, c)]
                aside["slots"].append(it[2])
                if aside["last"] == t.id:  # every partial is here: fold them into the home, in one pass
                    fold(t.dst, c, aside["slots"], pos)
            else:
                loc[(c, t.dst)] = it[2]
            for r in (t.dst, t.src):
                group = exchanges.get((c, r))
                if group is not None and t.id in group["left"]:
                    group["left"].discard(t.id)
                    if not group["left"]:  # every sum is here and the rank's own went: add what it got
                        fold(r, c, group["slots"], pos)
    # final local copies to the postcondition slots
    finals = []
    for c, r in sorted(coll.postcondition, key=lambda cr: (cr[1], cr[0])):
        cur = loc.get((c, r))
        if cur is None:
            raise UserError(f"chunk {c} never reaches rank {r}, which the {coll.name} postcondition requires")
        want = home_of(c, r)
        if cur != want:
            finals.append((r, cur, want))
    n = len(order)
    by_rank = {}
    for r, cur, want in finals:
        by_rank.setdefault(r, []).append((cur, want, None))
    k = 0
    for r in sorted(by_rank):
        items = sorted(by_rank[r], key=lambda it: (it[0][0].value, it[0][1]))
        for run in _runs(items, single):
            (sb, so), (db, do), _ = run[0]
            ops.append(ChunkOp(COPY, r, sb, so, r, db, do, cnt=len(run), key=(n + k,), origin=f"local copy on rank {r}"))
            k += 1
    return ops
