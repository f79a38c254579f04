"""Simulate an MSCCL-IR Program on a Topology: time and bandwidth per buffer size.

Model (alpha-beta with contention, the runtime's execution rules, calibrated costs from the topology):

- Every thread block runs its steps in order. A step starts when the previous one finished and its
  dependency (same tile iteration) is met. A receive needs its matched send's data to have arrived; a send
  needs room in its connection's FIFO (it may run at most ``depth`` calls ahead of the matching receives:
  Simple 2, LL/LL128 8, msccl-xml.md section 3).
- A send is one transfer over `Topology.link(src, dst)` arriving ``alpha + bytes / rate`` after it starts,
  under the program's protocol (`LinkType.cost`: calibrated per protocol in the topology file, else the raw
  link scaled by NCCL's ring factors). The sender's share of alpha (``overhead_us``: Simple's fence and
  handshake; all of alpha for uncalibrated links) occupies its thread block; the data then occupies the
  block and every resource of the link (the direct link, the switch out- and in-ports, the NICs) for
  ``bytes / rate``; the rest of alpha is in flight (LL's flags, the network), so a block can stream
  consecutive steps and the latencies of concurrent sends overlap while their data shares the bandwidth. A
  resource of bandwidth B whose link limits one thread block to c (``tb_bw_GBps``) has ``floor(B / c)``
  lanes of c and a last, partial lane of the rest (``topology.lane_capacity``): one block cannot fill an
  NVLink4 port, many channels can, and one NVLink2 brick of 1.39 blocks gives a block c and a second block
  the other 0.39 c. A transfer that would wait for a full lane takes a partial one when that ends it no
  later (the full lanes of its other resources are then booked for the time their share of it takes).
  Without a limit a resource carries one transfer at a time at B. Transfers are granted first come,
  first served by ready time, each at the earliest time every resource of its link has a lane free for
  its whole duration, gaps between earlier bookings included: a transfer booked for later, because
  another of its resources is busy, does not hold a lane idle meanwhile (it did: a 16x DGX A100
  AllGather simulated 185 us against its 123 us schedule, 122 us since).
- Fused steps (rcs, rrs, rrcs) forward slice by slice, as the runtimes' primitives do: the outgoing send can
  start once the first slice has arrived (Simple: a call is two slices; LL / LL128: a few KiB per block
  iteration) and ends no earlier than the last slice's arrival plus its own forwarding.
- Local work goes at one thread block's ``local_bw`` (the topology's ``runtime.local_bw_GBps``, else
  400 GB/s): a ``cpy`` moves its data once, a ``re`` 1.5 times (two reads, one write), a ``re`` the
  runtime fuses into the run before it 0.5 times (one more read). A receive (``r`` 1, ``rrc`` 1.5) takes
  its data out of the FIFO: while it streams in when the block was already waiting, else after the
  block's own pace (a receive that waited on a dependency while the data sat in the FIFO).
- A dependency on another thread block is seen ``runtime.sync_us`` after that block's step finished (the
  flag is published after a fence, then polled).
- Every call pays the topology's fixed ``runtime.call_us`` for its protocol (launch and set-up) once.
- A step of ``cnt`` chunks is one primitive call while that many chunks fit in a tile; at sizes where they do
  not, the runtime moves them M = tile / chunk at a time (maxAllowedCount, msccl-xml.md 1.8), and the
  program is simulated as those calls (`taccl.program.split_calls`): each part a step of its own, with its
  FIFO slot and its sender's overhead (a ring whose first step sends two chunks deadlocks where each chunk is
  a call, as on the runtime).
- Tiling (on by default, ``tiling=False`` / ``--no-tiling`` to turn off): the runtime cuts each chunk of
  S = size / nchunksperloop bytes into tiles (Simple 2 MiB, LL 32 KiB, LL128 576,000 B; section 1.8) and
  replays the whole program per tile; dependencies and FIFO positions refer to tile iterations. When a
  size needs more than ``max_exact_tiles`` tiles, that many are simulated and the rest extrapolated from
  the time per tile over the second half of them, never less than the busiest resource's or thread
  block's work per tile (a pipeline still filling would otherwise look faster than it can run);
  ``SimResult.exact`` is then False.

The event loop (`Simulator._run_tiles`) also exists in C++ (taccl/native/simcore.cpp, the optional
extension taccl._simcore, ~25x faster), operation for operation the same, so both give the same doubles
(tests/test_simulator_native.py); this module is the reference and the fallback. A change to the model is
made in both.

`simulate(program, topology, size_bytes) -> SimResult`; `sweep(program, topology, sizes) -> list`.
A program that uses a link the topology lacks raises `UserError` naming rank, thread block and step.
"""
from __future__ import annotations

import ctypes
import heapq
import importlib.util
import math
import multiprocessing
import os
from bisect import bisect_right
from collections import deque
from dataclasses import asdict, dataclass

import numpy as np

from .errors import CheckFailed, UserError
from .program import Program, Proto, StepType, allowed_count, moves_data, split_calls, step_type
from .topology import DEFAULT_ALPHA_FACTOR, DEFAULT_BW_FACTOR, ProtoCost, lane_capacity

__all__ = ["SimOptions", "SimResult", "simulate", "sweep", "busbw_factor", "TIE_TOLERANCE", "TILE_BYTES",
           "PROTO_BW_FACTOR", "PROTO_ALPHA_FACTOR", "Simulator"]

# Two simulated times within this fraction of each other are a tie: the same algorithm synthesized and
# hand-written, or lowered with another fusion policy, differs by float summation order or a step's place in
# its block (0.01 us of 10), far below what the calibrated model can tell apart.
TIE_TOLERANCE = 0.005
# from this many steps a size takes seconds to simulate (1024 ranks: ~15 s): `Simulator.run_sizes` runs the
# sizes in forked workers, one per core
PARALLEL_MIN_STEPS = 200_000

TILE_BYTES = {p: p.tile_bytes for p in Proto}
PROTO_BW_FACTOR = {Proto(p): f for p, f in DEFAULT_BW_FACTOR.items()}
PROTO_ALPHA_FACTOR = {Proto(p): f for p, f in DEFAULT_ALPHA_FACTOR.items()}
# Forwarding granularity of a fused step: Simple moves a call in two slices (MSCCL's SLICESTEPS of
# CHUNKSTEPS); LL and LL128 forward what one block iteration read (512 threads x 8 / 16 bytes).
SLICES_PER_CALL = {Proto.SIMPLE: 2, Proto.LL: None, Proto.LL128: None}
SLICE_BYTES = {Proto.LL: 4096, Proto.LL128: 8192}
DEFAULT_LOCAL_BW_GBPS = 400.0  # on-GPU copy (read + write of HBM) [I]



_SEND, _RECV, _LOCAL = 1, 2, 4


def busbw_factor(collective: str, n: int) -> float:
    """nccl-tests' bus-bandwidth factor (doc/PERFORMANCE.md)."""
    c = "reducescatter" if collective == "reduce_scatter" else collective
    if n <= 1:
        return 1.0
    if c == "allreduce":
        return 2.0 * (n - 1) / n
    if c in ("allgather", "reducescatter", "alltoall", "gather", "scatter", "alltoallv"):
        return (n - 1) / n
    return 1.0


@dataclass(frozen=True)
class SimOptions:
    tiling: bool = True
    max_exact_tiles: int = 16
    local_bw_GBps: float | None = None  # None: the topology's runtime.local_bw_GBps, else 400 GB/s
    proto_bw_factor: bool = True  # uncalibrated link types: scale bandwidth by the protocol's factor
    proto_alpha_factor: bool = True  # uncalibrated link types: scale alpha by the protocol's factor
    cut_through: bool = True  # fused steps forward slice by slice
    call_cost: bool = True  # add the topology's per-call cost and dependency latency


@dataclass
class SimResult:
    size_bytes: int
    time_us: float
    algbw_GBps: float
    busbw_GBps: float
    tiles: int
    exact: bool
    transfers: int

    def to_dict(self) -> dict:
        return asdict(self)


class Simulator:
    """The size-independent part: the flattened program, its connections and links.

    `native`: run the event loop in C++ (`taccl._simcore`, the same model and the same doubles) or in
    Python; None (the default) takes C++ where it was built, unless the environment sets
    ``TACCL_SIMULATOR=python``. A traced run is always Python's."""

    def __init__(self, program: Program, topology, options: SimOptions | None = None, *, native: bool | None = None):
        self.p = program
        self.topo = topology
        self.opts = options or SimOptions()
        if native is None:
            native = os.environ.get("TACCL_SIMULATOR", "").lower() != "python" and native_engine() is not None
        elif native and native_engine() is None:
            raise RuntimeError("the simulator's C++ event loop (taccl._simcore) was not built")
        self.native = native
        self._native_args = None
        # a step of more chunks than fit a call at some size is simulated as the runtime's calls there (`run`)
        self._largest_cnt = max((st.cnt for _, _, st in program.iter_steps() if moves_data(st)), default=1)
        self._split = {}  # maxAllowedCount -> Simulator of `split_calls(program, M)`
        self._calls_of = None  # M, in such a Simulator
        if topology.num_ranks != program.ngpus:
            raise UserError(f"the program is for {program.ngpus} ranks but topology {topology.name!r} with "
                            f"{topology.nodes} node(s) has {topology.num_ranks}")
        if program.nchunksperloop < 1:  # a chunk's size is the buffer over it (`taccl check` says the same)
            raise UserError(f"nchunksperloop={program.nchunksperloop} must be at least 1")
        self.proto = Proto(program.proto)
        self._flatten()

    def _flatten(self):
        p = self.p
        tbs = []  # (rank, tb)
        gid = {}
        for g in p.gpus:
            for tb in g.threadblocks:
                gid[(g.id, tb.id)] = len(tbs)
                tbs.append((g.id, tb))
        self.ntb = len(tbs)
        conn_of = {}  # (src, dst, chan) -> conn index
        conns = []  # [sender gtb, receiver gtb, link]
        self.out_conn = [-1] * self.ntb
        self.in_conn = [-1] * self.ntb
        for G, (r, tb) in enumerate(tbs):
            if tb.send >= 0:
                key = (r, tb.send, tb.chan)
                if key not in conn_of:
                    conn_of[key] = len(conns)
                    conns.append([None, None, None])
                conns[conn_of[key]][0] = G
                self.out_conn[G] = conn_of[key]
            if tb.recv >= 0:
                key = (tb.recv, r, tb.chan)
                if key not in conn_of:
                    conn_of[key] = len(conns)
                    conns.append([None, None, None])
                conns[conn_of[key]][1] = G
                self.in_conn[G] = conn_of[key]
        self.kind, self.cnt, self.dep, self.hasdep, self.sidx, self.ridx = [], [], [], [], [], []
        self.local_cost = []  # per step: copies of the data a local step costs (see _local_costs)
        self.nsend, self.nrecv = [], []
        self.where = []
        # a step moves at most a whole buffer: a larger count is a broken file (which `taccl check` explains)
        largest = {g.id: max(g.i_chunks, g.o_chunks, g.s_chunks, p.nchunksperloop) for g in p.gpus}
        for G, (r, tb) in enumerate(tbs):
            kinds, cnts, deps, hd, si, ri = [], [], [], [], [], []
            cap = largest[r]
            ns = nr = 0
            for i, st in enumerate(tb.steps):
                t = step_type(st.type)
                k = 0
                if t.is_send_type:
                    k |= _SEND
                if t.is_recv_type:
                    k |= _RECV
                if t in (StepType.COPY, StepType.REDUCE):
                    k |= _LOCAL
                kinds.append(k)
                if not 0 <= st.cnt <= cap:
                    raise UserError(f"rank {r} tb {tb.id} step {i}: cnt={st.cnt} chunks, where every buffer of rank "
                                    f"{r} holds at most {cap} (taccl check shows what else is wrong)")
                cnts.append(st.cnt)
                if st.depid >= 0:
                    dg = gid.get((r, st.depid))
                    if dg is None:
                        raise UserError(f"rank {r} tb {tb.id} step {i}: depends on tb {st.depid}, which rank {r} "
                                        f"does not have")
                    deps.append((dg, st.deps))
                else:
                    deps.append(None)
                hd.append(bool(st.hasdep))
                si.append(ns)
                ri.append(nr)
                if k & _SEND:
                    if tb.send < 0:
                        raise UserError(f"rank {r} tb {tb.id} step {i}: {t} sends but the tb has no send peer")
                    ns += 1
                if k & _RECV:
                    if tb.recv < 0:
                        raise UserError(f"rank {r} tb {tb.id} step {i}: {t} receives but the tb has no recv peer")
                    nr += 1
            self.kind.append(kinds)
            self.local_cost.append(_local_costs(tb.steps))
            self.cnt.append(cnts)
            self.dep.append(deps)
            self.hasdep.append(hd)
            self.sidx.append(si)
            self.ridx.append(ri)
            self.nsend.append(ns)
            self.nrecv.append(nr)
            self.where.append((r, tb.id))
        # every dependency target records its finish time (whether or not the XML set hasdep)
        for G in range(self.ntb):
            for d in self.dep[G]:
                if d is not None:
                    dg, ds = d
                    if not 0 <= ds < len(self.hasdep[dg]):
                        r, tbid = self.where[G]
                        raise UserError(f"rank {r} tb {tbid}: depends on step {ds} of tb {self.where[dg][1]}, "
                                        f"which does not exist")
                    self.hasdep[dg][ds] = True
        # links and matching
        self.conn_sender, self.conn_receiver, self.conn_alpha, self.conn_bpus, self.conn_res = [], [], [], [], []
        self.conn_busy = []
        res_ids = {}
        self.res_lanes = []  # full lanes per resource
        self.res_partial = []  # the share of a full lane's rate that its last, partial lane carries (0: none)
        for (src, dst, chan), c in sorted(conn_of.items(), key=lambda kv: kv[1]):
            sg, rg = conns[c][0], conns[c][1]
            if (sg is None or self.nsend[sg] == 0) and (rg is None or self.nrecv[rg] == 0):
                # a peer named but never used (the checker's tb.unused-peer): no connection
                self.conn_sender.append(-1)
                self.conn_receiver.append(-1)
                self.conn_busy.append(0.0)
                self.conn_alpha.append(0.0)
                self.conn_bpus.append(1.0)
                self.conn_res.append(())
                continue
            if sg is None or rg is None:
                G = sg if sg is not None else rg
                r, tbid = self.where[G]
                raise UserError(f"rank {r} tb {tbid}: connection {src}->{dst} on channel {chan} has no thread "
                                f"block on the other side")
            if self.nsend[sg] != self.nrecv[rg]:
                raise UserError(f"connection {src}->{dst} channel {chan}: rank {src} tb {self.where[sg][1]} sends "
                                f"{self.nsend[sg]} time(s) but rank {dst} tb {self.where[rg][1]} receives "
                                f"{self.nrecv[rg]} time(s)")
            link = self.topo.link(src, dst)
            if link is None:
                step = next((i for i, k in enumerate(self.kind[sg]) if k & _SEND), 0)
                raise UserError(f"rank {src} tb {self.where[sg][1]} step {step}: sends to rank {dst}, but topology "
                                f"{self.topo.name!r} has no link {src}->{dst}")
            cost = self._cost(link)
            lanes, partial, rate = lane_capacity(cost.bw_GBps, cost.tb_bw_GBps)
            ids = []
            for res in link.resources:
                rid = res_ids.get(res)
                if rid is None:
                    rid = res_ids[res] = len(self.res_lanes)
                    self.res_lanes.append(lanes)
                    self.res_partial.append(partial)
                elif lanes + partial < self.res_lanes[rid] + self.res_partial[rid]:
                    # a resource shared by links of other costs: the most restrictive lanes
                    self.res_lanes[rid], self.res_partial[rid] = lanes, partial
                ids.append(rid)
            self.conn_sender.append(sg)
            self.conn_receiver.append(rg)
            self.conn_busy.append(cost.busy_us)
            self.conn_alpha.append(cost.alpha_us)
            self.conn_bpus.append(rate * 1000.0)  # bytes per microsecond, one thread block
            self.conn_res.append(tuple(ids))
        self.nres = len(self.res_lanes)
        self.nconn = len(self.conn_sender)
        spec = self.topo.spec
        self.call_us = spec.call_us.get(self.proto.value, 0.0) if self.opts.call_cost else 0.0
        local = self.opts.local_bw_GBps or spec.local_bw_GBps or DEFAULT_LOCAL_BW_GBPS
        self.local_bpus = local * 1000.0
        self.sync_us = spec.sync_us if self.opts.call_cost else 0.0

    def _cost(self, link) -> ProtoCost:
        """The link's cost under the program's protocol (see `LinkType.cost`; the options can drop the
        uncalibrated protocol factors)."""
        lt = link.type
        if lt.calibrated:
            return lt.cost(self.proto)
        a = PROTO_ALPHA_FACTOR[self.proto] if self.opts.proto_alpha_factor else 1.0
        b = PROTO_BW_FACTOR[self.proto] if self.opts.proto_bw_factor else 1.0
        return ProtoCost(lt.alpha_us * a, lt.bw_GBps * b)  # no overhead given: the sender is busy for alpha

    # ---------------------------------------------------------------------------------------------------
    def tiles_for(self, size_bytes: float) -> tuple:
        """(chunk bytes, number of tiles, tile bytes)."""
        chunk = float(size_bytes) / self.p.nchunksperloop
        if not self.opts.tiling:
            return chunk, 1, chunk
        tile = TILE_BYTES[self.proto]
        n = max(1, math.ceil(chunk / tile - 1e-9))
        return chunk, n, min(tile, chunk)

    def run_sizes(self, sizes) -> list:
        """`run` at each size, in order; a large program's sizes run in forked workers, one per core."""
        global _forked
        workers = min(len(sizes), os.cpu_count() or 1)
        if (workers < 2 or self.p.nsteps < PARALLEL_MIN_STEPS or "fork" not in multiprocessing.get_all_start_methods()
                or multiprocessing.current_process().daemon):  # a batch worker may not have children
            return [self.run(s) for s in sizes]
        if self.native and self._native_args is None:
            self._native_args = self._native_inputs()  # flattened once, before the workers inherit it
        _forked = self  # inherited by the workers, not pickled
        try:
            with multiprocessing.get_context("fork").Pool(workers) as pool:
                return pool.map(_run_forked, sizes, chunksize=1)
        finally:
            _forked = None

    def run(self, size_bytes: float, trace: list | None = None) -> SimResult:
        """Simulate one size; with `trace` (a list), each finished step is appended to it as
        ``(rank, tb, step, tile, previous step's end, end)`` (microseconds, without the call cost; where the
        runtime splits steps into several calls, the steps of `split_calls`' program)."""
        if self.opts.tiling and self._largest_cnt > 1:
            M = allowed_count(self.p, size_bytes)
            if M < self._largest_cnt:  # chunks too large for a step's cnt in one call: the runtime's calls
                split = self._split.get(M)
                if split is None:
                    split = self._split[M] = Simulator(split_calls(self.p, M), self.topo, self.opts,
                                                       native=self.native)
                    split._calls_of = M
                return split.run(size_bytes, trace)
        self._trace = trace
        chunk, ntiles, tile = self.tiles_for(size_bytes)
        K = ntiles
        exact = True
        if ntiles > self.opts.max_exact_tiles:
            K = max(2, self.opts.max_exact_tiles)
            exact = False
        sizes = [tile] * K
        if exact and ntiles > 1:
            sizes[-1] = chunk - tile * (ntiles - 1)
        if self.native and trace is None:
            finish, transfers = self._run_tiles_native(sizes)
        else:
            finish, transfers = self._run_tiles(sizes)
        total = finish[-1]
        if not exact:
            h = K // 2
            # The slope over the second half can still be the pipeline filling (FIFOs absorbing sends), so it
            # is never taken below the busiest resource's or thread block's work per tile.
            per_tile = max((finish[-1] - finish[h - 1]) / (K - h), self.tile_floor_us(tile))
            rest = chunk - tile * K  # bytes per chunk beyond the simulated tiles
            total = finish[-1] + per_tile * (rest / tile)
            transfers = int(transfers * ntiles / K)
        total += self.call_us
        algbw = size_bytes / total / 1000.0 if total > 0 else float("inf")
        return SimResult(size_bytes=int(size_bytes), time_us=total, algbw_GBps=algbw,
                         busbw_GBps=algbw * busbw_factor(self.p.collective, self.p.ngpus), tiles=ntiles,
                         exact=exact, transfers=transfers)

    def tile_floor_us(self, tile_bytes: float) -> float:
        """Work per tile of the busiest link resource or thread block: no steady state is faster."""
        busy = [0.0] * self.nres
        tb_busy = 0.0
        for G in range(self.ntb):
            c = self.out_conn[G]
            t = 0.0
            for i, (k, n) in enumerate(zip(self.kind[G], self.cnt[G])):
                if k & _SEND:
                    d = n * tile_bytes / self.conn_bpus[c]
                    t += self.conn_busy[c] + d
                    for r in self.conn_res[c]:
                        busy[r] += d / (self.res_lanes[r] + self.res_partial[r])
                elif k & _LOCAL:
                    t += n * tile_bytes / self.local_bpus * self.local_cost[G][i]
            tb_busy = max(tb_busy, t)
        return max(busy + [tb_busy])

    def _run_tiles(self, tile_bytes: list) -> tuple:
        """Event-driven run over the given tile iterations; returns (finish time per iteration, transfers)."""
        T = len(tile_bytes)
        ntb = self.ntb
        kind, cnt, dep, hasdep = self.kind, self.cnt, self.dep, self.hasdep
        sidx, ridx, nsend, nrecv = self.sidx, self.ridx, self.nsend, self.nrecv
        out_conn, in_conn = self.out_conn, self.in_conn
        conn_sender, conn_receiver = self.conn_sender, self.conn_receiver
        conn_alpha, conn_bpus, conn_res, conn_busy = self.conn_alpha, self.conn_bpus, self.conn_res, self.conn_busy
        depth = self.proto.fifo_depth
        local_bpus = self.local_bpus
        local_cost = self.local_cost
        sync = self.sync_us
        cut = self.opts.cut_through
        per_call = SLICES_PER_CALL[self.proto]
        slice_fixed = SLICE_BYTES.get(self.proto, 0)
        nsteps = [len(k) for k in kind]
        pc = [0] * ntb
        it = [0] * ntb
        tfree = [0.0] * ntb
        pending = [False] * ntb
        fwd_after = [0.0] * ntb  # a fused send's lower bound on its end: the last incoming slice's arrival
        arrivals = [[] for _ in range(self.nconn)]  # end of each transfer
        first_slice = [[] for _ in range(self.nconn)]  # when its first slice is at the receiver
        recv_done = [[] for _ in range(self.nconn)]
        # the lanes of each resource, each its booked intervals as sorted (starts, ends)
        lanes = [[([], []) for _ in range(n)] for n in self.res_lanes]
        partial = self.res_partial
        partial_lane = [([], []) if f else None for f in partial]
        fin = {}
        dep_waiters = {}
        iter_finish = [0.0] * T
        heap = []
        seq = 0
        transfers = 0
        work = deque(range(ntb))
        for G in range(ntb):
            if nsteps[G] == 0:
                it[G] = T
        push = heapq.heappush
        pop = heapq.heappop

        trace = getattr(self, "_trace", None)

        def complete(G, t):
            # step pc[G] of iteration it[G] finished at t
            i = pc[G]
            itx = it[G]
            if trace is not None:
                trace.append(self.where[G] + (i, itx, tfree[G], t))
            if hasdep[G][i]:
                key = (G, itx, i)
                fin[key] = t
                ws = dep_waiters.pop(key, None)
                if ws:
                    work.extend(ws)
            tfree[G] = t
            i += 1
            if i == nsteps[G]:
                if t > iter_finish[itx]:
                    iter_finish[itx] = t
                pc[G] = 0
                it[G] = itx + 1
            else:
                pc[G] = i

        while True:
            while work:
                G = work.popleft()
                if pending[G]:
                    continue
                while it[G] < T:
                    i = pc[G]
                    itx = it[G]
                    ready = tfree[G]
                    d = dep[G][i]
                    if d is not None:
                        key = (d[0], itx, d[1])
                        f = fin.get(key)
                        if f is None:
                            dep_waiters.setdefault(key, []).append(G)
                            break
                        f += sync
                        if f > ready:
                            ready = f
                    k = kind[G][i]
                    if k & _RECV:
                        c = in_conn[G]
                        q = itx * nrecv[G] + ridx[G][i]
                        arr = arrivals[c]
                        if len(arr) <= q:
                            break  # the sender's arrival will wake this tb
                        if cut and k & _SEND:
                            # forward as slices arrive: start after the first, end after the last
                            fwd_after[G] = arr[q]
                            if first_slice[c][q] > ready:
                                ready = first_slice[c][q]
                        else:
                            # the block takes the data out of the FIFO (and reduces it): as it streams in
                            # when the block was waiting, at the block's own pace when it comes later
                            ready += cnt[G][i] * tile_bytes[itx] / local_bpus * local_cost[G][i]
                            if arr[q] > ready:
                                ready = arr[q]
                    if k & _SEND:
                        c = out_conn[G]
                        q = itx * nsend[G] + sidx[G][i]
                        if q >= depth:
                            rd = recv_done[c]
                            if len(rd) <= q - depth:
                                break  # the receiver's progress will wake this tb
                            credit = rd[q - depth] + conn_alpha[c] - conn_busy[c]  # the credit travels back
                            if credit > ready:
                                ready = credit
                        pending[G] = True
                        seq += 1
                        push(heap, (ready, seq, G))
                        break
                    if k & _RECV:
                        c = in_conn[G]
                        recv_done[c].append(ready)
                        work.append(conn_sender[c])
                        complete(G, ready)
                        continue
                    if k & _LOCAL:
                        ready += cnt[G][i] * tile_bytes[itx] / local_bpus * local_cost[G][i]
                    complete(G, ready)
            if not heap:
                break
            t0, _, G = pop(heap)
            i = pc[G]
            itx = it[G]
            c = out_conn[G]
            # the sender's share of the step's latency (fence, handshake) runs first; the data then holds one
            # lane of every resource of the link for bytes / rate, and arrives the rest of the latency later
            pending[G] = False
            start = t0 + conn_busy[c]
            res = conn_res[c]
            nbytes = cnt[G][i] * tile_bytes[itx]
            rate = conn_bpus[c]
            flight = conn_alpha[c] - conn_busy[c]
            duration = nbytes / rate
            sl = nbytes / per_call if per_call else min(nbytes, slice_fixed)
            tail = 0.0
            if fwd_after[G]:
                tail = fwd_after[G] + sl / rate  # the last incoming slice, forwarded
                fwd_after[G] = 0.0
            # the earliest time every resource has a full lane free for the whole transfer, gaps included;
            # when it has to wait, a resource's partial lane may finish it sooner at that lane's rate (the
            # full lanes it holds meanwhile are booked for the time their share of the bytes takes)
            ready_at = start
            start, chosen = _fit([(lanes[r], duration, None) for r in res], start, tail)
            if start > ready_at and any(partial[r] for r in res):
                start_p, chosen_p = _fit([(lanes[r], duration, (partial_lane[r], duration / partial[r])
                                           if partial[r] else None) for r in res], ready_at, tail)
                if start_p + max(d for _, d in chosen_p) <= start + duration:
                    start, chosen = start_p, chosen_p
            slowest = max(d for _, d in chosen) if chosen else duration
            end = start + slowest
            if tail > end:
                end = tail
            rate = nbytes / slowest if slowest > 0 else rate
            for lane, d in chosen:
                starts, ends = lane
                k = bisect_right(starts, start)
                starts.insert(k, start)
                ends.insert(k, max(start + d, tail))
            transfers += 1
            arrivals[c].append(end + flight)
            fs = start + sl / rate
            first_slice[c].append((fs if fs < end else end) + flight)
            work.append(conn_receiver[c])
            if kind[G][i] & _RECV:
                ci = in_conn[G]
                recv_done[ci].append(end)
                work.append(conn_sender[ci])
            complete(G, end)
            work.append(G)
        stuck = [G for G in range(ntb) if it[G] < T]
        if stuck:
            self._deadlock(len(stuck), stuck[0], pc[stuck[0]], it[stuck[0]])
        return _monotone(iter_finish), transfers

    def _deadlock(self, nstuck: int, G: int, step: int, tile: int):
        r, tbid = self.where[G]
        split = "" if self._calls_of is None else (
            f" (counting each call as a step: at this size the runtime moves a step's chunks {self._calls_of} a call)")
        raise CheckFailed(f"the program deadlocks in simulation: {nstuck} thread block(s) never finish, "
                          f"e.g. rank {r} tb {tbid} at step {step} of tile {tile}{split}")

    def _run_tiles_native(self, tile_bytes: list) -> tuple:
        """`_run_tiles` in C++ (taccl/native/simcore.cpp)."""
        if self._native_args is None:
            self._native_args = self._native_inputs()
        arrays, scalars = self._native_args
        T = len(tile_bytes)
        tiles = np.asarray(tile_bytes, dtype=np.float64)
        finish = np.zeros(T, dtype=np.float64)
        transfers = ctypes.c_int64(0)
        stuck = np.zeros(4, dtype=np.int64)
        ptr = lambda a: a.ctypes.data_as(ctypes.c_void_p)  # noqa: E731
        blocks, conns, resources = arrays
        rc = native_engine()(self.ntb, *map(ptr, blocks), self.nconn, *map(ptr, conns), self.nres,
                             *map(ptr, resources), *scalars, T, ptr(tiles), ptr(finish), ctypes.byref(transfers),
                             ptr(stuck))
        if rc == 2:
            raise MemoryError("the simulator's C++ event loop ran out of memory")
        if rc == 1:
            self._deadlock(*(int(x) for x in stuck))
        return _monotone(finish.tolist()), transfers.value

    def _native_inputs(self) -> tuple:
        """The flattened program as the C++ event loop takes it: steps of all blocks back to back, each
        dependency as the slot of the step it waits for (`fin_slot`: an index over the steps whose finish
        times are kept)."""
        flat = lambda rows, dtype: np.fromiter((x for row in rows for x in row), dtype=dtype)  # noqa: E731
        tb_off = np.zeros(self.ntb + 1, dtype=np.int64)
        np.cumsum([len(k) for k in self.kind], out=tb_off[1:])
        hasdep = flat(self.hasdep, np.bool_)
        fin_slot = np.full(len(hasdep), -1, dtype=np.int64)
        fin_slot[hasdep] = np.arange(int(hasdep.sum()))
        dep_slot = np.fromiter((-1 if d is None else fin_slot[tb_off[d[0]] + d[1]] for row in self.dep for d in row),
                               dtype=np.int64, count=len(hasdep))
        i32 = lambda xs: np.asarray(xs, dtype=np.int32)  # noqa: E731
        f64 = lambda xs: np.asarray(xs, dtype=np.float64)  # noqa: E731
        res_off = np.zeros(self.nconn + 1, dtype=np.int64)
        np.cumsum([len(r) for r in self.conn_res], out=res_off[1:])
        blocks = (tb_off, flat(self.kind, np.int8), flat(self.cnt, np.int32), dep_slot, fin_slot,
                  flat(self.sidx, np.int32), flat(self.ridx, np.int32), flat(self.local_cost, np.float64),
                  i32(self.nsend), i32(self.nrecv), i32(self.out_conn), i32(self.in_conn))
        conns = (i32(self.conn_sender), i32(self.conn_receiver), f64(self.conn_alpha), f64(self.conn_bpus),
                 f64(self.conn_busy), res_off, np.fromiter((r for rs in self.conn_res for r in rs), dtype=np.int32))
        resources = (i32(self.res_lanes), f64(self.res_partial))
        per_call = SLICES_PER_CALL[self.proto]
        scalars = (int(hasdep.sum()), self.proto.fifo_depth, self.local_bpus, self.sync_us, int(self.opts.cut_through),
                   per_call or 0, float(SLICE_BYTES.get(self.proto, 0)))
        return (blocks, conns, resources), scalars


def _monotone(iter_finish: list) -> list:
    """Each tile iteration finishes no earlier than the one before it."""
    for x in range(1, len(iter_finish)):
        if iter_finish[x] < iter_finish[x - 1]:
            iter_finish[x] = iter_finish[x - 1]
    return iter_finish


_native_fn = False  # not loaded yet


def native_engine():
    """The C++ event loop's entry point (`taccl_sim_run` of the optional extension taccl._simcore, through
    ctypes), or None where it was not built."""
    global _native_fn
    if _native_fn is False:
        _native_fn = None
        spec = importlib.util.find_spec("taccl._simcore")
        if spec is not None and spec.origin:
            try:
                fn = ctypes.CDLL(spec.origin).taccl_sim_run
            except (OSError, AttributeError):
                fn = None
            if fn is not None:
                p, i32, i64, f64 = ctypes.c_void_p, ctypes.c_int32, ctypes.c_int64, ctypes.c_double
                fn.restype = ctypes.c_int
                fn.argtypes = ([i32] + [p] * 12 + [i32] + [p] * 7 + [i32] + [p] * 2
                               + [i64, i32, f64, f64, i32, i32, f64] + [i32, p, p, p, p])
                _native_fn = fn
    return _native_fn


def _fit(candidates, start: float, tail: float) -> tuple:
    """(the earliest time >= start at which every resource has a lane free for the transfer, the (lane, how
    long the transfer holds it) taken on each). `candidates`, per resource: (its full lanes, the time on
    one, None or (its partial lane, the time on it)). A resource that makes the transfer wait pushes the
    start, and the others are asked again."""
    chosen = [None] * len(candidates)
    moved = True
    while moved:
        moved = False
        for k, (full, duration, slow) in enumerate(candidates):
            best = None
            for lane in full:
                t = _lane_fit(lane, start, duration, tail)
                if best is None or t < best:
                    best, chosen[k] = t, (lane, duration)
                    if t <= start:
                        break  # no lane does better: the first free one, as a full scan picks
            if slow is not None and best > start:
                t = _lane_fit(slow[0], start, slow[1], tail)
                if t < best:
                    best, chosen[k] = t, slow
            if best > start:
                start, moved = best, True
    return start, chosen


def _lane_fit(lane, t: float, duration: float, tail: float) -> float:
    """The earliest time >= t at which `lane` (booked intervals, sorted starts and ends) is free for a
    transfer: `duration` long, and not ending before `tail`. Gaps between bookings count: a transfer booked
    for later (waiting on another resource) does not hold the lane meanwhile."""
    starts, ends = lane
    if not ends or ends[-1] <= t:
        return t  # nothing booked after t (a lane's bookings do not overlap: its ends are sorted too)
    k = bisect_right(starts, t) - 1
    if k >= 0 and ends[k] > t:
        t = ends[k]
    k += 1
    n = len(starts)
    while k < n:
        end = t + duration
        if tail > end:
            end = tail
        if starts[k] >= end:
            break
        if ends[k] > t:
            t = ends[k]
        k += 1
    return t


def _local_costs(steps) -> list:
    """Per step, its local work in units of one copy (read and write the data once): a copy or a receive
    (out of the FIFO) 1, a reduction or receive-reduce 1.5 (two reads, one write); a reduction the runtime
    fuses into the one before it (same destination and source buffer, no wait of its own, the previous
    publishes nothing) adds one read, 0.5."""
    out = []
    for i, st in enumerate(steps):
        t = step_type(st.type)
        if t in (StepType.COPY, StepType.RECV):
            out.append(1.0)
        elif t is StepType.RECV_REDUCE_COPY:
            out.append(1.5)
        elif t is StepType.REDUCE:
            prev = steps[i - 1] if i else None
            fused = (prev is not None and step_type(prev.type) is StepType.REDUCE and prev.dstbuf == st.dstbuf
                     and prev.dstoff == st.dstoff and prev.srcbuf == st.srcbuf and st.depid < 0 and not prev.hasdep)
            out.append(0.5 if fused else 1.5)
        else:
            out.append(0.0)
    return out


def simulate(program: Program, topology, size_bytes: float, *, options: SimOptions | None = None) -> SimResult:
    """Simulate one size (see the module docstring)."""
    return Simulator(program, topology, options).run(size_bytes)


def sweep(program: Program, topology, sizes, *, options: SimOptions | None = None) -> list:
    """Simulate every size; the program is flattened once."""
    sim = Simulator(program, topology, options)
    return [sim.run(s) for s in sizes]


_forked = None  # the Simulator whose sizes forked workers run (`Simulator.run_sizes`)


def _run_forked(size_bytes):
    return _forked.run(size_bytes)
