"""Lowering: from an Algorithm (or a DSL trace) to a proven MSCCL-IR Program.

The passes, in order (one module each; ``docs/lowering.md`` explains the choices):

====================  =============================================================================
buffers               Algorithm transfers -> `ChunkOp`s on concrete slots (input, output, scratch)
instructions          ChunkOps -> instructions (s, r, rrc, cpy, re) with same-rank dependencies
fusion                r+s -> rcs, rrc+s -> rrcs / rrs
schedule              channels and thread blocks (one per connection and channel), deadlock-free order
emit                  scratch compaction, dependencies and nops, instances, the Program
check                 `taccl.checker.check_program`: a program that fails is never returned
====================  =============================================================================

Public API
----------
``lower(algorithm, *, instances=None, proto=None, min_bytes=0, max_bytes=0, max_tbs=108, topology=None,
fusion="auto") -> Program``
    (instances and protocol default to the algorithm's; with a topology, the fastest of its fusion policies)
``lower_ops(ops, collective, *, name, ...) -> Program``   (the DSL's entry point)
``lower_ops_protocols(ops, collective, protocols, *, name, options) -> {protocol: Program | UserError}``
    the same ops for several protocols, lowered and proven once where the protocol changes nothing
``write_program(program, path, dialect="executor") -> Path``   check, then write atomically
"""
from __future__ import annotations

import gc
import hashlib
import math
from collections import defaultdict
from contextlib import contextmanager
from dataclasses import dataclass, field, replace

from ..errors import CheckFailed, RuntimeLimitsError, UserError
from ..program import MAX_NODES, Buf, Program, Proto
from ..progress import SILENT
from ..targets import get_target
from .buffers import CONVERGE_MODES, algorithm_ops
from .emit import MAX_DEPID, check_limits, compact_scratch, emit
from .fusion import fuse
from .instructions import generate
from .ops import COPY, REDUCE, ChunkOp
from .schedule import ChannelsFull, OrderFailed, allocate

__all__ = ["lower", "lower_ops", "lower_ops_protocols", "write_program", "LoweringOptions", "LoweringMemo", "ChunkOp",
           "verify_program", "serve_inplace", "DEFAULT_MAX_TBS", "FUSION_POLICIES", "max_tbs_of",
           "RuntimeLimitsError"]

MAX_CHANNELS = 32
DEFAULT_MAX_TBS = 108  # SMs of an A100: every thread block must be co-resident
DEFAULT_MAX_STEPS = 64  # MSCCL_MAX_NUM_STEPS of a default executor build


def max_tbs_of(spec) -> int:
    """The most thread blocks a rank may have on a `TopologySpec` (its GPUs' SMs; None or unknown: an A100's)."""
    sm = spec.sm_count if spec is not None else None
    return sm or DEFAULT_MAX_TBS


@dataclass(frozen=True)
class LoweringOptions:
    instances: int = 1
    proto: str = "Simple"
    min_bytes: int = 0
    max_bytes: int = 0
    max_tbs: int = DEFAULT_MAX_TBS
    max_steps: int = DEFAULT_MAX_STEPS
    # steps a thread block may take before a connection's next transfers go to another channel: smaller
    # spreads a connection over more channels (blocks): more bandwidth per connection without splitting
    # chunks into more steps as instances do; a multiple of 8 up to max_steps (None: max_steps)
    block_steps: int | None = None
    # thread blocks (channels) each connection with several transfers is spread over at least: its transfers
    # then alternate between blocks, so a block waiting for one chunk's partial does not hold the next
    # chunk's send back (None: as many as block_steps needs)
    connection_blocks: int | None = None
    # merge each instance's blocks down to its share of the 128 ids a dependency can name (int8), as before a
    # rank could have more blocks than that: fewer blocks, where one peer's sends and receives share one
    blocks_within_ids: bool = False
    max_nodes: int = MAX_NODES  # XML nodes a rank's parser stores (a custom runtime build may allow more)
    fuse: bool = True
    # False for a runtime that runs no fused step (RCCL, `taccl.targets`): no fusion, and a remote reduction
    # lands in scratch and is added by a local step instead of one rrc
    fused_receives: bool = True
    keep_schedule: bool = True  # fuse only where the solver's schedule is kept (fusion._serial_pairs)
    network_fan_out: int = 0  # GPUs per node: fuse a fan-out's first send that leaves the node (0: never)
    flag_us: float = 0.0  # the runtime's dependency latency between thread blocks (0: unknown)
    check: bool = True

    def validate(self) -> None:
        if self.instances < 1:
            raise UserError(f"--instances must be at least 1, got {self.instances}")
        if self.instances > MAX_CHANNELS:
            raise UserError(f"--instances {self.instances}: each instance needs its own channel and there are "
                            f"at most {MAX_CHANNELS}")
        try:
            Proto(self.proto)
        except ValueError:
            raise UserError(f"unknown protocol {self.proto!r}; expected Simple, LL or LL128") from None
        if self.min_bytes < 0 or self.max_bytes < 0 or (self.max_bytes and self.min_bytes > self.max_bytes):
            raise UserError(f"size window [{self.min_bytes}, {self.max_bytes}] is invalid: need 0 <= min <= max "
                            f"(max 0 = unbounded)")
        if self.max_tbs < 1:
            raise UserError(f"--max-tbs must be at least 1, got {self.max_tbs}")
        if self.block_steps is not None and not (8 <= self.block_steps <= self.max_steps
                                                 and self.block_steps % 8 == 0):
            raise UserError(f"--block-steps must be a multiple of 8 from 8 to {self.max_steps}, got "
                            f"{self.block_steps}")
        if self.connection_blocks is not None and not 1 <= self.connection_blocks <= MAX_CHANNELS // self.instances:
            raise UserError(f"--connection-blocks must be from 1 to {MAX_CHANNELS // self.instances} (the channels of "
                            f"an instance), got {self.connection_blocks}")


# named fusion policies (`lower`'s `fusion`, `taccl lower --fusion`, a SKU's `fusion` variant); "auto" lowers
# every one that applies and keeps the fastest at the algorithm's input size
FUSION_POLICIES = ("auto", "schedule", "eager", "none", "network")
# "auto" also ranks the schedule's fusion lowered on one instance with at most this many steps a thread block
# before a connection's next transfers take another channel (`LoweringOptions.block_steps`): a connection
# then runs on as many blocks as its transfers need, each step a whole chunk, where instances split every
# chunk into smaller steps on every connection. Saved 16-node DGX H100 and A100 algorithms simulate 18-28%
# faster at 1 MiB this way than lowered as synthesized; at 16 MiB they tie or lose (docs/lowering.md)
SPREAD_BLOCK_STEPS = 8
# "auto" lowers its fastest policies (this many) again with each connection of several transfers on at least
# CONNECTION_BLOCKS thread blocks (`LoweringOptions.connection_blocks`), on the same instances, and keeps the
# fastest program
CONNECTION_BLOCKS = 2
TWO_BLOCKS_POLICIES = 2
# where the fastest program so far takes more than SCHEDULE_KEPT times the schedule's time, or is one on two
# blocks a connection, "auto" also lowers the same policies with each connection on MORE_CONNECTION_BLOCKS
# blocks (the same test of the sizes above)
SCHEDULE_KEPT = 1.10
MORE_CONNECTION_BLOCKS = 4
# "auto" lowers its fastest policies (this many) again landing converging reductions the other way
# (`CONVERGE_MODES`: the protocol's default is the first lowering's, `_lower_one`): Simple lands every partial
# sum aside, where reducing the one that lands last as it lands saves its receiver's flag wait on the critical
# path; LL and LL128 do that by default, where landing them all aside may keep more in flight
OTHER_LANDING = {"aside": "direct-last", "direct-last": "aside"}
OTHER_LANDING_POLICIES = 2
LANDING_NAMES = {"direct-last": "the last partial sum reduced as it lands", "aside": "partial sums landed aside"}
# above this many transfers "auto" lowers the schedule's policy alone: each policy's build takes minutes there
# (64x DGX H100 AllToAll, 487424 transfers: 97, 214, 72 and 40 s, then a simulation of each distinct program)
AUTO_POLICIES_MAX_TRANSFERS = 100_000


@dataclass
class LoweringMemo:
    """What `lower` computed for one algorithm, for the next `lower` of it with other options (a batch lowers a
    synthesis with several fusion policies, and "auto" also with `connection_blocks=1`): every policy's
    program or the error it raised, the rankings' simulations and the proofs. Programs are reused only where
    the later call's options would build the same one; a program lowered unchecked serves a checked call once
    it is proven (the checked lowering would have returned its first attempt)."""

    algorithm: object = None  # the one algorithm it serves (kept, so that no other takes its id)
    programs: dict = field(default_factory=dict)  # `_lower_one`'s options but the name -> its result or error
    simulated: dict = field(default_factory=dict)  # `_ranked`'s simulations
    proofs: dict = field(default_factory=dict)  # id of a program -> (the program, whether it is proven)
    ops: dict = field(default_factory=dict)  # what every policy starts from: `_lower_one`'s `shared`

    def lower_one(self, algorithm, **kw) -> tuple:
        """`_lower_one(algorithm, **kw)`, or what an earlier call with the same options returned."""
        if self.algorithm is None:
            self.algorithm = algorithm
        elif self.algorithm is not algorithm:
            raise ValueError("a LoweringMemo serves the algorithm it was first used for")
        key = tuple(sorted((k, v) for k, v in kw.items() if k != "name"))
        hit = self.programs.get(key)
        if hit is None and kw.get("check"):
            unchecked = self.programs.get(tuple(sorted((k, False if k == "check" else v) for k, v in key)))
            if isinstance(unchecked, tuple) and self.proven(unchecked[0]):
                hit = unchecked
        if hit is None:
            try:
                hit = _lower_one(algorithm, shared=self.ops, **kw)
            except (UserError, CheckFailed) as exc:
                hit = exc
            self.programs[key] = hit
        if isinstance(hit, Exception):
            raise hit
        return hit

    def proven(self, program: Program) -> bool:
        """Whether `verify_program` proves the program (each program checked once)."""
        if id(program) not in self.proofs:
            self.proofs[id(program)] = (program, verify_program(program).ok)
        return self.proofs[id(program)][1]


def _fusion_policy(name: str, topology) -> dict:
    """`_lower_one`'s arguments for a named fusion policy (not "auto")."""
    if name == "schedule":
        return dict(keep_schedule=True)
    if name == "eager":
        return dict(keep_schedule=False)
    if name == "none":
        return dict(keep_schedule=True, fuse=False)
    return dict(keep_schedule=False, network_fan_out=topology.spec.gpus_per_node)


def lower(algorithm, *, instances: int | None = None, proto: str | None = None, min_bytes: int = 0,
          max_bytes: int = 0, max_tbs: int = DEFAULT_MAX_TBS, fuse: bool = True, check: bool = True,
          name: str | None = None, topology=None, keep_schedule: bool | None = None,
          fusion: str = "auto", block_steps: int | None = None, connection_blocks: int | None = None,
          max_connection_blocks: int | None = None, target: str = "msccl-executor",
          memo: LoweringMemo | None = None, report=SILENT) -> Program:
    """Lower an `taccl.algorithm.Algorithm` to a Program that `check_program` has proven.

    `instances` and `proto` default to the ones the algorithm was synthesized for; when the default
    instance count needs more thread blocks than `max_tbs` (every instance repeats the blocks), it is halved
    until the program fits (fewer channels: the XML's `nchannels` shows it).

    Fusion puts a receive and the send that forwards it into one step, which ties their two connections to
    one thread block. `keep_schedule=True` fuses only where the solver's schedule says the two never
    overlap; False fuses wherever the rules allow. The schedule is a model too (it does not see the flag
    wait between two blocks that fusion saves, nor that a block holding a fused step takes every other step
    of its two connections in one order), so no choice wins everywhere: with a `topology` and no
    `keep_schedule`, both, no fusion at all and (on several nodes) fusion wherever allowed plus each fan-out
    fused with a send that leaves the node (`taccl.lowering.fusion`: the sum of a rail's reduction sent back
    over the network without a flag wait) are lowered, and, where neither `instances` nor `block_steps` is
    given, the schedule's fusion spread over channels on one instance (`SPREAD_BLOCK_STEPS`); the one the
    calibrated simulator finds fastest at the algorithm's input size is returned; within
    `taccl.simulator.TIE_TOLERANCE` of each other (a tie), of those that also tie at 4x the size, the fastest
    at a size 1024 times smaller (at least 1 KiB), then the schedule's. The two fastest are also lowered with their
    converging reductions landing the other way (`OTHER_LANDING`: with the last partial sum reduced as it lands
    where the first lowering landed them all aside, Simple's default, and the reverse for LL and LL128), ranked with
    them where they lose no more against the fastest at 4x the size than they gain at it. Where neither
    `block_steps` nor `connection_blocks` is given, the two fastest (`TWO_BLOCKS_POLICIES`), and the two fastest of
    the first landing, are lowered again with each connection's transfers alternating between two blocks
    (`CONNECTION_BLOCKS`), and such a program replaces the fastest where it is faster and loses less against it
    at 4x the size than it gains at the size (a loss within `TIE_TOLERANCE` is none: the ranking breaks the
    tie); where one of them is then the fastest, or the fastest is still over `SCHEDULE_KEPT` times the
    schedule's time, the same again on `MORE_CONNECTION_BLOCKS` blocks. Where `max_tbs` is over 128, each
    candidate with more blocks than that is also lowered with each instance's blocks
    merged down to its share of 128 (`LoweringOptions.blocks_within_ids`) and ranked with the others. The candidates
    are lowered unchecked and only the one returned is proven (on 16 nodes a proof takes seconds); a policy whose
    program fails the proof or deadlocks in simulation is lowered again proving each fusion mode (falling back to
    the next mode) and the candidates are ranked again. Without a topology, or above `AUTO_POLICIES_MAX_TRANSFERS`
    transfers, the schedule's fusion is the only one lowered.

    `fusion` names one policy instead of "auto" (`FUSION_POLICIES`): "schedule" (keep_schedule=True),
    "eager" (False), "none" (fuse=False) or "network" (eager plus the fan-outs whose send leaves the node;
    it needs the multi-node `topology`). One size's winner is not every size's: the network fan-out can win
    well below the input size and lose at it (2x NDv2 AllReduce synthesized at 64 KiB: 7% faster at 8-16 KiB,
    2% slower at 64 KiB), so a SKU may list several policies as variants.

    `block_steps` (`LoweringOptions.block_steps`) below 64 spreads each connection's transfers over more
    channels, one thread block each: with one instance at 8 steps a block, 16-node DGX H100 and A100
    programs simulate 18-28% faster at 1 MiB than lowered as synthesized (four instances, which split every
    chunk into more, smaller steps, or one instance at 64), and tie or lose at 16 MiB. Given (or by the
    sketch: `Algorithm.block_steps`), it applies to every candidate "auto" ranks.

    `connection_blocks` (`LoweringOptions.connection_blocks`) spreads each connection with several transfers
    over at least that many channels, on the same instances: neither one block's bandwidth cap nor its wait
    for a chunk's partial sum holds the connection's next transfer back (2x DGX H100 AllReduce over the
    rails, Simple on four instances at 256 MiB: 4% faster; docs/lowering.md). Given, it applies to every
    candidate. `max_connection_blocks` caps the blocks "auto" spreads a connection over itself (1: none, 2: not
    four): a batch offers those programs too (`taccl.batch`), since the spread that wins at the input size can
    lose far above it (16x DGX H100 AllToAll synthesized at 64 KiB, Simple on four instances, on 1/2/4 blocks a
    connection: 143.8/87.8/59.3 us at 64 KiB, 352.2/347.8/353.0 at 16 MiB). Through a `memo` holding the
    uncapped lowering it costs nothing new: the same candidates, fewer of them ranked.

    `target` (`taccl.targets`) is the runtime the program is for: for RCCL, which runs no fused step, every
    receive is a plain one (a partial sum lands in scratch and a local step adds it) and a rank has at most
    64 thread blocks.

    `memo` (`LoweringMemo`) carries what one call computed to the next calls for the same algorithm, so that
    lowering it again with another policy or `connection_blocks` builds, simulates and proves only what is
    new; each call returns its own Program object.

    Raises `UserError` when the program cannot respect a runtime limit (the message names it) and
    `CheckFailed` if the checker rejects the result (a lowering bug; the findings are in the message).
    Progress (each policy lowered, the ranking, the proof) goes to `report`.
    """
    if topology is not None:
        topology.spec.check_protocol(algorithm.protocol if proto is None else proto)
    program = _lower(algorithm, memo or LoweringMemo(), instances=instances, proto=proto, min_bytes=min_bytes,
                     max_bytes=max_bytes, max_tbs=max_tbs, fuse=fuse, check=check, name=name, topology=topology,
                     keep_schedule=keep_schedule, fusion=fusion, block_steps=block_steps,
                     connection_blocks=connection_blocks, max_connection_blocks=max_connection_blocks,
                     target=target, report=report)
    # a memo's program may be another call's, under its name: a copy of it (the steps shared) is this call's
    return program if memo is None else replace(program, name=name or algorithm.name)


def _lower(algorithm, memo: LoweringMemo, *, instances, proto, min_bytes, max_bytes, max_tbs, fuse, check, name,
           topology, keep_schedule, fusion, block_steps, connection_blocks, max_connection_blocks, target,
           report) -> Program:
    """`lower`, its policies lowered, simulated and proven through `memo`."""
    if max_connection_blocks is not None and not 1 <= max_connection_blocks <= MAX_CHANNELS:
        raise UserError(f"--max-connection-blocks must be from 1 to {MAX_CHANNELS}, got {max_connection_blocks}")
    if None not in (connection_blocks, max_connection_blocks) and connection_blocks > max_connection_blocks:
        raise UserError(f"--connection-blocks {connection_blocks} is over --max-connection-blocks "
                        f"{max_connection_blocks}: give one of them")
    if block_steps is None:
        block_steps = algorithm.block_steps  # the sketch's, if it gives one
    lower_one = memo.lower_one
    # one block a connection is what no `connection_blocks` builds: the same memo entries
    kw = dict(instances=instances, proto=proto, min_bytes=min_bytes, max_bytes=max_bytes, max_tbs=max_tbs,
              fuse=fuse, check=check, name=name, block_steps=block_steps,
              connection_blocks=None if connection_blocks == 1 else connection_blocks)
    runtime = get_target(target)
    if runtime.max_tbs is not None:
        kw["max_tbs"] = min(max_tbs, runtime.max_tbs)
    if not runtime.fused_steps:
        if fusion not in ("auto", "none") or keep_schedule is not None:
            raise UserError(f"target {target} runs no fused step: lower it with fusion 'none' (the default for it)")
        return lower_one(algorithm, **{**kw, "keep_schedule": True, "fuse": False, "fused_receives": False})[0]
    if fusion != "auto":
        if fusion not in FUSION_POLICIES:
            raise UserError(f"unknown fusion policy {fusion!r}; expected one of {', '.join(FUSION_POLICIES)}")
        if fusion == "network" and (topology is None or topology.nodes < 2):
            raise UserError("fusion policy 'network' fuses the sends that leave a node: it needs the algorithm's "
                            "topology with several nodes")
        if topology is not None:
            kw["flag_us"] = topology.spec.sync_us
        return lower_one(algorithm, **{**kw, **_fusion_policy(fusion, topology)})[0]
    if keep_schedule is not None or topology is None or not fuse:
        return lower_one(algorithm, keep_schedule=keep_schedule is not False, **kw)[0]
    kw["flag_us"] = topology.spec.sync_us
    # the candidates are lowered unchecked and proven once ranked, the chosen one first: the others are
    # simulated and dropped
    kw["check"] = False
    names = ["schedule", "eager", "none"] + (["network"] if topology.nodes > 1 else [])
    policies = [_fusion_policy(n, topology) for n in names]
    if block_steps is None and instances is None:
        # the schedule's fusion spread over channels on one instance (see SPREAD_BLOCK_STEPS)
        names.append("spread")
        policies.append({**policies[0], "instances": 1, "block_steps": SPREAD_BLOCK_STEPS})
    if len(algorithm.transfers) > AUTO_POLICIES_MAX_TRANSFERS:
        report(f"lowering: {len(algorithm.transfers)} transfers > {AUTO_POLICIES_MAX_TRANSFERS}: only the "
               f"schedule's fusion policy (`taccl lower --fusion` lowers another)")
        names, policies = names[:1], policies[:1]
    # the blocks "auto" may spread a connection over itself (each pass below asks for its count)
    cap = MAX_CHANNELS if max_connection_blocks is None else max_connection_blocks
    two_blocks = (block_steps is None and connection_blocks is None and len(policies) > 1
                  and cap >= CONNECTION_BLOCKS)
    # a policy takes a few seconds on 16 nodes: past the first 2 s, a line per policy lowered
    progress = report.progress("lowering", len(names) + OTHER_LANDING_POLICIES + two_blocks * TWO_BLOCKS_POLICIES,
                               "lowering policies", every_s=2.0)
    first, converge, instances_kept = lower_one(algorithm, keep_schedule=True, **kw)
    # the other policies take the first's choices: retrying the other ways of landing converging reductions
    # would repeat a failing lowering, and a policy that fits the runtime's limits only on fewer instances than
    # the schedule's (eager fusion pins more connections to a block) would give a program on fewer channels that
    # costs builds and a simulation to lose (16x DGX H100 AllToAll: its unproven lowering 27.5 -> 12.5 s)
    kw["converges"] = (converge,)
    kw["instances"] = instances_kept
    candidates = {0: first}  # policy index -> its program
    seen = {_fingerprint(first)}

    def add(k):
        progress.update(k)
        try:
            program = lower_one(algorithm, **{**kw, **policies[k]})[0]
        except UserError:
            return  # within the runtime's limits only with more fusion, or (fan-outs) nothing to fuse
        fingerprint = _fingerprint(program)
        if fingerprint not in seen:
            seen.add(fingerprint)
            candidates[k] = program

    for k in range(1, len(policies)):
        add(k)
    simulated = memo.simulated  # the rankings' simulations, by program
    size = algorithm.input_size_bytes

    def trades_well(key, against) -> bool:
        """Whether candidate `key` loses no more against candidate `against` at 4x the size than it gains at
        the size (a loss within a tie is none: the ranking breaks ties as for the other policies)."""
        from ..simulator import TIE_TOLERANCE

        (one_at, one_above), (two_at, two_above) = (
            [_simulated_us(candidates[k], topology, n, simulated) for n in (size, 4 * size)] for k in (against, key))
        gain, loss = 1 - two_at / one_at, two_above / one_above - 1
        return math.isfinite(two_at + two_above) and loss <= max(TIE_TOLERANCE, gain)

    other = OTHER_LANDING.get(converge)
    landing_keys = set()  # the candidates landing the other way
    if other is not None and len(policies) > 1:
        # the fastest policies again with the converging reductions landing the other way (OTHER_LANDING),
        # kept where they do not lose more against the fastest at 4x the size than they gain at it, as for
        # more blocks a connection below; the same program where nothing converges (dropped as seen). 2x DGX
        # H100 ReduceScatter on two pieces a chunk, Simple on eight instances at 16 MiB: 70.0 us aside, 59.9
        # with the last as it lands
        fastest_first = sorted(candidates, key=lambda key: (_simulated_us(candidates[key], topology, size,
                                                                          simulated), key))
        for base in fastest_first[:OTHER_LANDING_POLICIES]:
            names.append(f"{names[base]}, {LANDING_NAMES[other]}")
            policies.append({**policies[base], "converges": (other,)})
            k = len(policies) - 1
            add(k)
            if k in candidates and not trades_well(k, fastest_first[0]):
                del candidates[k]
            elif k in candidates:
                landing_keys.add(k)
    if two_blocks:
        # the fastest policies again with each connection's transfers alternating between two blocks: more
        # blocks to hide flag waits, each with less bandwidth, so such a program must not lose more against the
        # fastest at 4x the size than it gains at the size. Not only the fastest's: 1x NDv2 AllToAll, Simple on
        # six instances at 1 MiB, unfused 41.9 us and 39.4 on two blocks, the schedule's fusion 47.1 and 35.9
        best, _ = _ranked(candidates, topology, size, simulated)
        at_size = {key: _simulated_us(p, topology, size, simulated) for key, p in candidates.items()}
        others = sorted((key for key in candidates if key != best and math.isfinite(at_size[key])),
                        key=lambda key: (at_size[key], key))
        spread_keys = set()  # the candidates spread over more blocks a connection that were kept

        def spread(base, blocks):
            names.append(f"{names[base]}, {blocks} blocks a connection")
            policies.append({**policies[base], "connection_blocks": blocks})
            k = len(policies) - 1
            add(k)
            if k in candidates:
                if trades_well(k, best):
                    spread_keys.add(k)
                else:
                    del candidates[k]

        # the two fastest, and the two fastest landing the first way as if no other landing had been tried:
        # a candidate landing the other way among the first few took the place of a policy whose spread was
        # the fastest (2x NDv2 AllReduce at 1 MiB: 181.8 us, 185.2 without that policy's spread)
        first_landing = [key for key in [best] + others if key not in landing_keys]
        bases = list(dict.fromkeys([best] + others[:TWO_BLOCKS_POLICIES - 1] + first_landing[:TWO_BLOCKS_POLICIES]))
        for base in bases:
            spread(base, CONNECTION_BLOCKS)
        # still far from the schedule, or faster on two blocks a connection than on one: the connections may
        # need more blocks than two to reach the link's bandwidth or to hide their per-step latency (LL on DGX
        # A100: a block moves 9 GB/s, a GPU's NVSwitch port 63; the two-route ReduceScatter at 1 MiB, one
        # instance: 24.1 us on two blocks, 20.9 on four, as the schedule says; 2x NDv2 AllGather at 1 MiB,
        # Simple, unfused: 167.5 us on one block, 111.5 on two, 104.1 on four)
        fastest = min(_simulated_us(p, topology, size, simulated) for p in candidates.values())
        leader, _ = _ranked(candidates, topology, size, simulated)
        if cap >= MORE_CONNECTION_BLOCKS and (fastest > SCHEDULE_KEPT * algorithm.time_us or leader in spread_keys):
            for base in bases:
                spread(base, MORE_CONNECTION_BLOCKS)
    if kw["max_tbs"] > MAX_DEPID + 1:
        # past 128 blocks a rank fewer pairs of blocks have to share one, but the links are shared in other
        # ways, and not always faster (16x DGX H100 AllGather, LL128 on four instances at 16 MiB: 75.2 us on
        # 132 blocks, 73.4 with each instance's blocks merged down to 32): such programs are lowered again that
        # way and ranked with the others
        for k in list(candidates):
            if candidates[k].max_threadblocks > MAX_DEPID + 1:
                names.append(f"{names[k]}, blocks within the dependency ids")
                policies.append({**policies[k], "blocks_within_ids": True})
                add(len(policies) - 1)
    proven = set()  # policies lowered again with each fusion mode proven
    while True:
        if len(candidates) > 1:
            report(f"lowering: {len(candidates)} distinct programs, ranked on the simulator")
        best, deadlocked = _ranked(candidates, topology, algorithm.input_size_bytes, simulated)
        retry = deadlocked - proven if check else set()
        if not retry:
            if check and best not in proven:
                report(f"lowering: proving the fastest (policy {names[best]!r}, "
                       f"{candidates[best].nsteps} steps)")
            if not check or best in proven or memo.proven(candidates[best]):
                return candidates[best]
            retry = {best}
        # not proven (eager fusion that deadlocks with the runtime's FIFOs, say): lower those policies again
        # proving each fusion mode, which falls back to the next mode, and rank again
        for k in retry:
            del candidates[k]
            try:
                candidates[k] = lower_one(algorithm, **{**kw, **policies[k], "check": True})[0]
                proven.add(k)
            except (CheckFailed, UserError):
                if not candidates:
                    raise  # no policy gives a proven program: the checker's findings


def _ranked(candidates: dict, topology, size: int, simulated: dict | None = None) -> tuple:
    """(the key of the candidate the calibrated simulator finds fastest at `size`, the keys of those that
    deadlock in simulation or that it refuses, unproven programs both). Within `TIE_TOLERANCE` of the
    fastest, those also within it at 4x `size` (the sizes above: two programs that tie at 16 MiB can differ by
    4% at 64 MiB), and of those the one with the least latency (at a size 1024 times smaller) serves the
    sizes below it best; then the smaller key (0 is the schedule's fusion). `simulated` keeps the
    simulations for the next ranking (id of a program -> the program, its Simulator, its times by size)."""
    from ..simulator import TIE_TOLERANCE

    if len(candidates) == 1:
        return next(iter(candidates)), set()  # (the proof tells whether it deadlocks)
    simulated = {} if simulated is None else simulated

    def time_at(k, nbytes):
        return _simulated_us(candidates[k], topology, nbytes, simulated)

    times = {k: time_at(k, size) for k in candidates}
    deadlocked = {k for k, t in times.items() if t == math.inf}
    near = [k for k, t in times.items() if t <= min(times.values()) * (1 + TIE_TOLERANCE)]
    if len(near) > 1:
        # the program serves the sizes above its input size too: a tie there need not be one at 4x
        big = {k: time_at(k, 4 * size) for k in near}
        near = [k for k in near if big[k] <= min(big.values()) * (1 + TIE_TOLERANCE)]
    if len(near) == 1:
        return near[0], deadlocked
    small = max(1024, size // 1024)
    return min(near, key=lambda k: (time_at(k, small), k)), deadlocked


def _simulated_us(program: Program, topology, nbytes: int, simulated: dict) -> float:
    """The calibrated simulator's time of an unproven program at `nbytes`: infinite where it deadlocks or the
    simulator refuses it. `simulated` keeps each program's Simulator and times (id of a program -> the
    program, so that its id stays its own, its Simulator, its times by size)."""
    from ..simulator import Simulator

    if id(program) not in simulated:
        try:
            sim = Simulator(program, topology)
        except UserError:  # an ill-formed program (a lowering bug): its proof would fail too
            sim = None
        simulated[id(program)] = (program, sim, {})
    _, sim, times = simulated[id(program)]
    if nbytes not in times:
        try:
            times[nbytes] = math.inf if sim is None else sim.run(nbytes).time_us
        except (CheckFailed, UserError):
            times[nbytes] = math.inf
    return times[nbytes]


def _lower_one(algorithm, *, instances, proto, min_bytes, max_bytes, max_tbs, fuse, check, name,
               keep_schedule, network_fan_out=0, flag_us=0.0, converges=None,
               block_steps=None, connection_blocks=None, fused_receives=True, blocks_within_ids=False,
               shared=None) -> tuple:
    """(the program, how its converging reductions land (`CONVERGE_MODES`), its instances). `shared` keeps
    the collective and the ChunkOps for the next call (no pass changes them; 16x DGX H100: 0.5 s a call)."""
    proto = algorithm.protocol if proto is None else proto
    shared = {} if shared is None else shared
    if "collective" not in shared:
        shared["collective"] = algorithm.make_collective()
    coll = shared["collective"]
    # LL and LL128 steps are shorter than a flag wait between thread blocks, so the last partial sum of a converging
    # reduction is reduced as it lands rather than received aside and folded (measured on the simulator: 2-10%
    # faster below 1 MiB); with Simple's long steps, landing every partial in parallel usually wins (up to 4.5% at
    # 256 MiB; "auto" tries the other way too, `OTHER_LANDING`). Reducing as it lands pins more receives to the
    # blocks that forward the sums, which can exceed the runtime's limits on many nodes (16x DGX H100
    # ReduceScatter): then every partial lands aside. Landing aside costs a local step per partial and the flag
    # waits of the fold (nops): on 1024 ranks that is over the parser's 4096 XML nodes, and the partials then reduce
    # in place one after another.
    error = None
    for converge in converges or (CONVERGE_MODES if proto != "Simple" else CONVERGE_MODES[1:]):
        n = algorithm.instances if instances is None else instances
        while True:
            opts = LoweringOptions(instances=n, proto=proto, min_bytes=min_bytes, max_bytes=max_bytes,
                                   max_tbs=max_tbs, fuse=fuse, keep_schedule=keep_schedule,
                                   network_fan_out=network_fan_out, flag_us=flag_us, check=check,
                                   block_steps=block_steps, connection_blocks=connection_blocks,
                                   fused_receives=fused_receives, blocks_within_ids=blocks_within_ids)
            opts.validate()
            if (n > 1, converge) not in shared:
                shared[(n > 1, converge)] = algorithm_ops(algorithm, coll, single=n > 1, converge=converge)
            ops = shared[(n > 1, converge)]
            try:
                return lower_ops(ops, coll, name=name or algorithm.name, options=opts), converge, n
            except UserError as exc:
                if "runtime's limits" not in str(exc):
                    raise
                error = exc
                if instances is not None or n == 1 or "thread blocks" not in str(exc):
                    break
                n //= 2  # halved, so that the instances still divide the links' lanes evenly
    raise error


def lower_ops(ops: list, coll, *, name: str, options: LoweringOptions | None = None, **kw) -> Program:
    """Lower ChunkOps (from `taccl.lowering.buffers` or `taccl.dsl`) for `coll`; see `lower`."""
    return _lower_ops(ops, coll, name, options or LoweringOptions(**kw))


def lower_ops_protocols(ops: list, coll, protocols, *, name: str, options: LoweringOptions) -> dict:
    """`lower_ops` for each of `protocols` ({protocol: Program, or the UserError its lowering raised}),
    lowering and proving once where the protocol cannot change the outcome.

    The protocol enters a lowering only through the proof, as the FIFO depth of its deadlock search
    (`Proto.fifo_depth`): a program free of deadlock with shallow FIFOs is free of it with deeper ones (a
    step waits only on data, credits and other steps, and deeper FIFOs only grant credits earlier), and
    races and the postcondition do not depend on the depth. So when the shallowest protocol's lowering succeeds without
    a failed proof on the way, every other protocol's lowering would try the same attempts, fail them for the
    same reasons and return the same program: that program serves them all with its protocol changed. A
    512-rank ring baseline is 2 M steps and over two minutes a lowering."""
    for proto in protocols:
        replace(options, proto=proto).validate()
    out = {}
    first, *rest = sorted(dict.fromkeys(protocols), key=lambda p: Proto(p).fifo_depth)
    failed_proofs = []
    try:
        shared = _lower_ops(ops, coll, name, replace(options, proto=first), failed_proofs)
    except UserError as exc:
        shared = exc
    out[first] = shared
    for proto in rest:
        if isinstance(shared, UserError) and not failed_proofs:
            out[proto] = shared  # every attempt failed on the runtime's limits, which the protocol does not move
        elif not failed_proofs:
            out[proto] = replace(shared, proto=Proto(proto))
        else:
            try:
                out[proto] = _lower_ops(ops, coll, name, replace(options, proto=proto))
            except UserError as exc:
                out[proto] = exc
    return out


def _lower_ops(ops: list, coll, name: str, opts: LoweringOptions, failed_proofs: list | None = None) -> Program:
    """See `lower_ops`; the (fusion mode, step cap) of every attempt whose proof failed is appended to
    `failed_proofs`."""
    opts.validate()
    N = opts.instances
    if N > 1 and any(op.cnt > 1 for op in ops):
        ops = _split_ops(ops)
    ops = _cap_cnt(ops)
    if not opts.fused_receives:
        ops = _receive_then_reduce(ops)
    # as many blocks as the SMs hold (emit gives the blocks others wait on the ids <= 127 that int8 stores);
    # should more than 128 blocks of a rank be waited on, it is built again within 128 blocks
    tb_limit = opts.max_tbs
    per_instance_tbs = max(1, (min(tb_limit, MAX_DEPID + 1) if opts.blocks_within_ids else tb_limit) // N)
    # a block has one send peer and one receive peer: a rank with more peers on one side than the blocks
    # allow cannot be lowered at all (checked before building: on 1024 ranks a build takes minutes)
    rank, peers = _most_peers(ops)
    if peers * N > opts.max_tbs:
        raise RuntimeLimitsError(f"cannot lower {name!r} within the runtime's limits: rank {rank} has {peers} peers "
                                 f"on one side (send or receive), a thread block each per instance: {peers * N} "
                                 f"thread blocks > {opts.max_tbs} (--max-tbs, the SMs that must hold every block "
                                 f"at once)")
    # fusion modes, best first: natural (time order, relies on FIFO buffering), safe (deadlock-free even
    # unbuffered), none; each with a decreasing cap on steps per thread block (nops may exceed it)
    modes = ["natural", "safe", None] if opts.fuse and opts.fused_receives else [None]
    if opts.fuse and opts.network_fan_out:
        modes.remove(None)  # without fusion there is no fan-out to fuse: that program is the fuse=False one
    attempts = [(m, cap, False) for m in modes for cap in _step_caps(opts.block_steps or opts.max_steps)]
    last_problems = []
    full = None
    packed = False
    k = 0
    while k < len(attempts):
        mode, cap, pack = attempts[k]
        k += 1
        try:
            with _no_gc():
                program = _build(ops, coll, name, opts, mode, cap, per_instance_tbs, pack)
        except ChannelsFull as exc:  # so is every smaller cap of this mode; less fusion may fit
            full = exc
            k = _skip_caps(attempts, k, mode)
            continue
        if program is _NOTHING_TO_FUSE:
            k = _skip_caps(attempts, k, mode)  # the same at every step cap
            continue
        if program is None:
            continue  # the blocks cannot be ordered under this step cap
        if isinstance(program, _OverNodes):
            # no step cap or block packing lowers it, and neither does less fusion (as for a program over the
            # node limit below)
            last_problems = [f"a rank stores at least {program.nodes} XML nodes > {opts.max_nodes} (the "
                             f"parser's MAX_NODES)"]
            break
        problems = check_limits(program, max_tbs=tb_limit, max_steps=opts.max_steps, max_nodes=opts.max_nodes)
        if problems and all("dependency on tb" in p for p in problems) and tb_limit > MAX_DEPID + 1:
            tb_limit = MAX_DEPID + 1  # more blocks waited on than int8 ids: the same attempt within 128 blocks
            per_instance_tbs = max(1, tb_limit // N)
            k -= 1
            continue
        if problems:
            last_problems = problems
            # (within 128 blocks, a block id past 127 is one block too many)
            if "thread blocks" in problems[0] and all("thread blocks" in p or "dependency on tb" in p
                                                      for p in problems):
                if not packed:
                    # too many thread blocks: pack connections into shared thread blocks, same modes again
                    packed = True
                    attempts = [(m, c, True) for m, c, _ in attempts[k - 1:]]
                    k = 0
                    continue
                # still too many: a smaller step cap only adds blocks, but less fusion pins fewer
                # (receive peer, send peer) pairs to one block: go on with the next fusion mode
                k = _skip_caps(attempts, k, mode)
                continue
            if len(problems) == 1 and "steps" in problems[0]:
                # nops pushed a block over the limit: retry with a lower cap per block, one that leaves room
                # for as many nops per step as that block has (a block of 64 sends that each wait on two
                # others has 127 steps: cap 32, not four builds at 56, 48, 40 and 32)
                room = cap * opts.max_steps // program.max_steps
                k = _skip_caps(attempts, k, mode, above=room)
                continue
            break
        if opts.check:
            report = verify_program(program, max_steps=opts.max_steps if opts.max_steps != DEFAULT_MAX_STEPS else None,
                                    max_nodes=opts.max_nodes)
            if not report.ok:
                if failed_proofs is not None:
                    failed_proofs.append((mode, cap))
                if mode is not None:
                    # (a fused order that deadlocks): fewer steps per block may break the cycle; halving the
                    # cap bounds the retries (at a baseline's reference limit of 1024 steps, 8 builds, not 128)
                    k = _skip_caps(attempts, k, mode, above=cap // 2)
                    continue
                report.raise_if_failed(path=f"lowered program {name!r}")
        return program
    if not last_problems and full is not None:
        raise full
    if not last_problems and opts.network_fan_out:
        raise UserError(f"lowering {name!r}: no fan-out leaves a node, nothing for network_fan_out to fuse")
    raise RuntimeLimitsError(f"cannot lower {name!r} within the runtime's limits: {'; '.join(last_problems)}")


def _skip_caps(attempts: list, k: int, mode, *, above: int = 0) -> int:
    """The index of the next attempt from `k` on that is of another fusion mode or caps at most `above` steps
    per thread block (by default: the next mode)."""
    while k < len(attempts) and attempts[k][0] == mode and attempts[k][1] > above:
        k += 1
    return k


def _step_caps(first: int) -> list:
    """The caps on steps per thread block a lowering tries, largest first: by eights from the executor's 64
    down, and halving above it (a baseline's reference limit of 1024 steps: 12 builds at most, not 128)."""
    caps = []
    while first > DEFAULT_MAX_STEPS:
        caps.append(first)
        first //= 2
    return caps + list(range(first, 7, -8))


def _most_peers(ops) -> tuple:
    """(rank, count): the rank with the most distinct peers it sends to, or receives from."""
    sends, recvs = defaultdict(set), defaultdict(set)
    for op in ops:
        if op.src_rank != op.dst_rank:
            sends[op.src_rank].add(op.dst_rank)
            recvs[op.dst_rank].add(op.src_rank)
    return max(((r, len(p)) for side in (sends, recvs) for r, p in side.items()), key=lambda rp: (rp[1], -rp[0]),
               default=(0, 0))


@contextmanager
def _no_gc():
    """The passes build many small cyclic objects; the cycle collector only slows them down."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


# `_build`'s answer when the fusion mode finds nothing that the program without it would not have
_NOTHING_TO_FUSE = object()


class _OverNodes:
    """`_build`'s answer when a rank's instructions alone pass the parser's node limit: `nodes` is a floor."""

    def __init__(self, nodes: int):
        self.nodes = nodes


def _nodes_floor(instrs, num_ranks: int, instances: int) -> int:
    """The fewest XML nodes some rank's parser will store: the algo and every gpu element, and on the rank
    with the most instructions one step per instruction and instance and a block per instance (blocks and
    nops only add to it)."""
    per_rank = [0] * num_ranks
    for ins in instrs:
        if not ins.dead:
            per_rank[ins.rank] += 1
    return 1 + num_ranks + instances * (max(per_rank, default=0) + 1)


def _build(ops, coll, name, opts, mode, cap, per_instance_tbs, pack=False):
    """The program, None when its blocks cannot be ordered under `cap`, `_NOTHING_TO_FUSE`, or `_OverNodes`
    (checked before allocating: on 1024 ranks that is two thirds of a build that cannot fit)."""
    instrs = generate(ops, coll.num_ranks)
    if mode is not None and not fuse(instrs, mode=mode, keep_schedule=opts.keep_schedule,
                                     network_fan_out=opts.network_fan_out):
        return _NOTHING_TO_FUSE
    floor = _nodes_floor(instrs, coll.num_ranks, opts.instances)
    if floor > opts.max_nodes:
        return _OverNodes(floor)
    try:
        tbs = allocate(instrs, coll.num_ranks, max_channels=MAX_CHANNELS // opts.instances, step_cap=cap,
                       max_tbs=per_instance_tbs, pack=pack, flag_us=opts.flag_us,
                       connection_blocks=opts.connection_blocks or 1)
        scratch = compact_scratch(tbs, coll.num_ranks)
        return emit(tbs, coll, name=name, instances=opts.instances, proto=opts.proto, min_bytes=opts.min_bytes,
                    max_bytes=opts.max_bytes, scratch=scratch)
    except OrderFailed:
        return None


def _split_ops(ops):
    out = []
    for op in ops:
        if op.cnt == 1:
            out.append(op)
            continue
        for k in range(op.cnt):
            opnd = None if op.operand is None else (op.operand[0], op.operand[1] + k)
            out.append(ChunkOp(op.kind, op.src_rank, op.src_buf, op.src_off + k, op.dst_rank, op.dst_buf,
                               op.dst_off + k, 1, opnd, op.ch, op.key + (k,), op.origin, op.span, op.after))
    return out


def _receive_then_reduce(ops):
    """Every remote reduce as a receive into fresh scratch slots of the destination rank and a local reduce
    from there (for runtimes without rrc). The two keep the op's place in key order."""
    top = defaultdict(int)  # the first scratch slot no op uses, per rank
    for op in ops:
        places = [(op.src_rank, op.src_buf, op.src_off), (op.dst_rank, op.dst_buf, op.dst_off)]
        if op.operand is not None:
            places.append((op.dst_rank, *op.operand))
        for rank, buf, off in places:
            if buf is Buf.SCRATCH:
                top[rank] = max(top[rank], off + op.cnt)
    out = []
    for op in ops:
        if not (op.remote and op.kind == REDUCE):
            out.append(op)
            continue
        at = top[op.dst_rank]
        top[op.dst_rank] += op.cnt
        out.append(ChunkOp(COPY, op.src_rank, op.src_buf, op.src_off, op.dst_rank, Buf.SCRATCH, at, op.cnt, None,
                           op.ch, op.key + (0,), op.origin, op.span, op.after))
        out.append(ChunkOp(REDUCE, op.dst_rank, Buf.SCRATCH, at, op.dst_rank, op.dst_buf, op.dst_off, op.cnt,
                           op.operand, None, op.key + (1,), op.origin))
    return out


def _cap_cnt(ops):
    from .ops import MAX_CNT

    if all(op.cnt <= MAX_CNT for op in ops):
        return ops
    out = []
    for op in ops:
        if op.cnt <= MAX_CNT:
            out.append(op)
            continue
        for k, start in enumerate(range(0, op.cnt, MAX_CNT)):
            n = min(MAX_CNT, op.cnt - start)
            opnd = None if op.operand is None else (op.operand[0], op.operand[1] + start)
            out.append(ChunkOp(op.kind, op.src_rank, op.src_buf, op.src_off + start, op.dst_rank, op.dst_buf,
                               op.dst_off + start, n, opnd, op.ch, op.key + (k,), op.origin, op.span, op.after))
    return out


# ------------------------------------------------------------------------------------------------------
# Checking and writing

_PROVEN: dict = {}  # sha256 of the executor-dialect text -> True, for programs this process has proven


def _fingerprint(program: Program, text: str | None = None) -> str:
    """The program's content: sha256 of its text in `_own_dialect` (`text`, when the caller has it)."""
    if text is None:
        from ..xmlio import program_to_xml

        text = program_to_xml(program, dialect=_own_dialect(program))
    return hashlib.sha256(text.encode()).hexdigest()


def _own_dialect(program: Program) -> str:
    """The executor's dialect, except for a user-defined collective (`custom`), which legacy MSCCL alone runs
    (`ncclCustomCollective`) and only its dialect can say."""
    from ..xmlio import EXECUTOR_COLLECTIVES

    return "executor" if program.collective in EXECUTOR_COLLECTIVES else "legacy"


def verify_program(program: Program, *, dialect: str | None = None, max_steps: int | None = None,
                   max_nodes: int = MAX_NODES):
    """Run the checker (in `dialect`, by default `_own_dialect`); remember the program's content when it is
    proven (with the executor's own limits)."""
    from ..checker import check_program

    dialect = dialect or _own_dialect(program)
    report = check_program(program, dialect=dialect, sm_count=max(DEFAULT_MAX_TBS, program.max_threadblocks),
                           max_steps=max_steps, max_nodes=max_nodes)
    if report.ok and dialect == "executor" and max_steps is None and max_nodes == MAX_NODES:
        _PROVEN[_fingerprint(program)] = True
        if len(_PROVEN) > 4096:
            _PROVEN.clear()
    return report


def serve_inplace(program: Program) -> bool:
    """Let a proven out-of-place program serve in-place calls too (executor dialect: both flags set) when the
    checker proves it with input and output aliased as the runtime aliases them; returns whether it does."""
    program.inplace = True
    if not verify_program(program).ok:
        program.inplace = False
    return program.inplace


def write_program(program: Program, path, dialect: str = "executor", target: str | None = None):
    """Check the program and write it atomically; raise `CheckFailed` (with the findings) otherwise.
    With a `target` (`taccl.targets`), in its dialect, and refused if that runtime would refuse it.

    The check is skipped only for a program whose exact content this process has already proven.
    """
    from ..fileio import atomic_write
    from ..targets import target_problems
    from ..xmlio import program_to_xml

    if target is not None:
        runtime = get_target(target)
        dialect = runtime.dialect
        problems = target_problems(program, runtime)
        if problems:
            raise CheckFailed(f"{path}: not written, {target} would refuse it: " +
                              "; ".join(m if r is None else f"rank {r}: {m}" for r, m in problems[:5]))
    text = program_to_xml(program, dialect=dialect)  # serialized once: fingerprinted, then written
    if not (dialect == "executor" and _PROVEN.get(_fingerprint(program, text))):
        report = verify_program(program, dialect=dialect)
        if not report.ok:
            first = "\n".join(str(f) for f in report.errors[:10])
            raise CheckFailed(f"{path}: not written, the program fails {len(report.errors)} check(s):\n{first}")
    return atomic_write(path, text)
