"""Hierarchical, multi-phase synthesis: a collective as a sequence of sub-collectives over groups of ranks.

A sketch's ``phases`` list says, in order, what happens inside which groups:

    "phases": [{"collective": "reducescatter", "groups": "node"},     # inside every node
               {"collective": "allreduce", "groups": "rail"},         # among the GPUs of one local index
               {"collective": "allgather", "groups": "node"}]

``phases`` may also be an object of such lists by collective (one sketch for several collectives), or
``"hierarchical"``: the standard decomposition of each collective (`STANDARD`), rail-first for AllGather so
that each chunk crosses the network once.

A phase with ``"parts": [i, ...]`` moves only those pieces of each chunk (with ``input_chunkup`` k, the pieces
0 .. k-1); the others pass through it unchanged. So one collective can take two routes: a ReduceScatter whose
pieces 0-6 are reduced inside the node and then over the rails, and whose piece 7 crosses the rails first
(each GPU's own contribution, sent over its NIC at once instead of after a node round) and is reduced inside
the node last, moves fewer bytes over NVSwitch and more over the NICs, which the standard order leaves idle:

    "phases": [{"collective": "reducescatter", "groups": "node", "parts": [0, 1, 2, 3, 4, 5, 6]},
               {"collective": "reducescatter", "groups": "rail"},
               {"collective": "reducescatter", "groups": "node", "parts": [7]}]

Groups: ``node`` (the GPUs of one node), ``rail`` (the GPUs with the same local index on every node: the
NIC rails of a rail-optimised cluster), ``all`` (every rank). A phase may carry its own
``intranode_sketch``, ``internode_sketch``, ``symmetry_offsets`` and ``routing``; otherwise the sketch's
apply. A phase only uses links inside its groups.

What each phase moves follows from the collective and the phases before it. Every chunk has a *target*
(AllGather and AllReduce: its owner rank, whose copy every rank needs; ReduceScatter and AllToAll: the rank
that must hold it). A phase can change only the coordinate its groups vary (a node phase the local index,
a rail phase the node), so inside each group it moves the chunk towards the member closest to the target:

=============  ============================================================================================
allgather      every member of a group that holds the chunk gets it
reducescatter  the partial sums of a group's holders are reduced into the member closest to the target
allreduce      the same reduction, then the group's sum is sent back to every member of the group; in
               groups of two, the two members exchange their partial sums and each adds the other's
               (the same traffic on each link, one crossing on the critical path instead of two); with
               ``"exchange": true`` groups of any size do so: every member sends its partial sum to every
               other and adds the n - 1 it gets (one crossing instead of two, n - 1 partial sums in and
               out of each member instead of about one: small messages over many nodes' rails)
alltoall       the chunk moves to the member of its holder's group closest to its destination
=============  ============================================================================================

`plan_phases` computes every phase's chunk placement before and after, and proves that the phases compose
into the declared collective (every postcondition met, every contribution summed exactly once); a phase
that does not fit the collective or the topology is refused naming ``$.phases[i]``. The synthesizer
(`taccl.synthesize`) runs the three stages on each phase's sub-problem and composes the phases chunk by
chunk: a transfer of a later phase waits only for the arrival of its own chunk.
"""
from __future__ import annotations

from dataclasses import dataclass

from .collectives import Collective, add_contributions, contribution, mask_of, ranks_in
from .errors import UserError
from .sketch import Sketch, sketch_from_dict

__all__ = ["PhasePlan", "plan_phases", "highest_part", "chunk_targets", "phase_list", "relocate", "GROUPS", "KINDS",
           "STANDARD"]

GROUPS = ("node", "rail", "all")
KINDS = ("allgather", "reducescatter", "allreduce", "alltoall")
# which phase kinds may make up which collective
_ALLOWED = {"allgather": {"allgather"}, "reducescatter": {"reducescatter"}, "alltoall": {"alltoall"},
            "allreduce": {"reducescatter", "allreduce", "allgather"}}
_SKETCH_KEYS = ("intranode_sketch", "internode_sketch", "symmetry_offsets", "routing")
STANDARD = {
    "allgather": [("allgather", "rail"), ("allgather", "node")],
    "reducescatter": [("reducescatter", "node"), ("reducescatter", "rail")],
    "allreduce": [("reducescatter", "node"), ("allreduce", "rail"), ("allgather", "node")],
    "alltoall": [("alltoall", "node"), ("alltoall", "rail")],
}


def phase_list(sketch: Sketch, topology, collective: str, form: str = "") -> list:
    """The sketch's phases for `collective`: [(phase document, its place in the file)]."""
    ph = sketch.phases
    if ph == "hierarchical":
        if collective not in STANDARD:
            raise UserError(f"\"hierarchical\" phases exist for {', '.join(STANDARD)}, not {collective}",
                            path=sketch.path, where="$.phases")
        kind = _kind_of(collective, form)
        steps = STANDARD[kind] if topology.nodes > 1 else [(kind, "node")]
        return [({"collective": k, "groups": g}, "$.phases") for k, g in steps]
    if isinstance(ph, dict):
        if collective not in ph:
            raise UserError(f"the sketch gives phases for {', '.join(sorted(ph))}, not {collective}",
                            path=sketch.path, where="$.phases")
        return [(d, f"$.phases.{collective}[{i}]") for i, d in enumerate(ph[collective])]
    return [(d, f"$.phases[{i}]") for i, d in enumerate(ph)]


def highest_part(phases) -> int:
    """The highest piece any phase's ``parts`` names, in a sketch's ``phases`` as written; -1 if none does."""
    lists = phases.values() if isinstance(phases, dict) else [phases] if isinstance(phases, list) else []
    return max((p for phase_list_ in lists for ph in phase_list_ if isinstance(ph, dict)
                for p in ph.get("parts", ())), default=-1)


def _kind_of(collective: str, form: str) -> str:
    """The collective whose phases make up this one: a one-shot AllReduce's chunks (each summed at one rank)
    are reduced like a ReduceScatter's."""
    return "reducescatter" if form == "one-shot" else collective


@dataclass
class PhasePlan:
    index: int
    name: str
    kind: str  # what the phase does inside each group (KINDS)
    groups: str  # GROUPS
    sketch: Sketch  # the sketch the phase is synthesized with (its own keys over the top-level ones)
    route_coll: Collective  # what the routing MILP routes: copies from sources to destinations
    task_coll: Collective  # what the transfers do (combining for reductions, routed as the inverse)
    where: str  # "$.phases[i]", for errors
    doc: dict  # the phase as written
    def scope(self, topology):
        """The phase's link filter: (src rank, dst rank) -> whether the link joins members of one group."""
        if self.groups == "node":
            return lambda s, d: topology.node_of(s) == topology.node_of(d)
        if self.groups == "rail":
            return lambda s, d: topology.local(s) == topology.local(d) and topology.node_of(s) != topology.node_of(d)
        return None


def _group_key(groups: str, topology, rank: int):
    if groups == "node":
        return topology.node_of(rank)
    if groups == "rail":
        return topology.local(rank)
    return 0


def _members(groups: str, topology, key) -> list:
    if groups == "node":
        return [topology.rank(key, l) for l in range(topology.gpus_per_node)]
    if groups == "rail":
        return [topology.rank(n, key) for n in range(topology.nodes)]
    return list(range(topology.num_ranks))


def _toward(groups: str, topology, member_of_group: int, target: int) -> int:
    """The member of `member_of_group`'s group closest to `target` (it shares the coordinate the group fixes)."""
    if groups == "node":
        return topology.rank(topology.node_of(member_of_group), topology.local(target))
    if groups == "rail":
        return topology.rank(topology.node_of(target), topology.local(member_of_group))
    return target


def chunk_targets(coll: Collective) -> list:
    """Per chunk, the rank the phases move it towards (see the module docstring); None for a chunk that
    several ranks must end with and that does not start on one (a broadcast's)."""
    if coll.name in ("allgather", "allreduce"):
        dual = coll.dual() if coll.combining else coll
        return [dual.sources(c)[0] for c in range(coll.num_chunks)]
    holders = [[] for _ in range(coll.num_chunks)]
    for c, r in coll.postcondition:
        holders[c].append(r)
    return [h[0] if len(h) == 1 else None for h in holders]


def _phase_collective(coll: Collective, name: str, pre, post, combining: bool, form: str = "") -> Collective:
    return Collective(name=name, num_ranks=coll.num_ranks, chunkup=coll.chunkup, num_chunks=coll.num_chunks,
                      precondition=frozenset(pre), postcondition=frozenset(post), combining=combining, form=form,
                      labels=coll.labels, input_index=coll.input_index, output_index=coll.output_index,
                      input_chunks=coll.input_chunks, output_chunks=coll.output_chunks,
                      label_rank_slots=coll.label_rank_slots)


def _phase_sketch(sketch: Sketch, phase: dict, where: str) -> Sketch:
    doc = {k: v for k, v in sketch.doc.items() if k != "phases"}
    for k in _SKETCH_KEYS:
        if k in phase:
            doc[k] = phase[k]
    try:
        return sketch_from_dict(doc, path=sketch.path, name=sketch.name)
    except UserError as exc:
        raise relocate(exc, phase, where) from None


def relocate(exc: UserError, phase: dict, where: str) -> UserError:
    """An error about a sketch key the phase overrides, reported at the phase's own copy of it."""
    w = exc.where or ""
    for k in _SKETCH_KEYS:
        if k in phase and w.startswith(f"$.{k}"):
            return UserError(exc.message, path=exc.path, where=where + w[1:])
    return exc


def plan_phases(sketch: Sketch, topology, coll: Collective) -> list:
    """Every phase's sub-collectives; raises `UserError` (at ``$.phases[i]``) unless they compose into `coll`."""
    if coll.name not in _ALLOWED:
        raise UserError(f"phases can make up allgather, reducescatter, allreduce or alltoall, not {coll.name}",
                        path=sketch.path, where="$.phases")
    targets = chunk_targets(coll)
    # holders: chunk -> {rank: its copy's contributions (`taccl.collectives.contribution`; rank 0's for a copy)}
    holders = [dict() for _ in range(coll.num_chunks)]
    for c, r in coll.precondition:
        holders[c][r] = contribution(r) if coll.combining else contribution(0)
    plans = []
    allowed = _ALLOWED[_kind_of(coll.name, coll.form)]
    what = f"{coll.form} {coll.name}" if coll.form else coll.name
    summed_everywhere = None  # the index of an earlier allreduce phase
    for i, (ph, where) in enumerate(phase_list(sketch, topology, coll.name, coll.form)):
        kind, groups = ph["collective"], ph["groups"]
        if kind not in allowed:
            raise UserError(f"a {kind} phase cannot be part of a {what}; allowed: {', '.join(sorted(allowed))}",
                            path=sketch.path, where=where + ".collective")
        if kind in ("reducescatter", "allreduce") and summed_everywhere is not None:
            # the sums an allreduce phase leaves on every member are summed again wrongly by the synthesis
            # (contributions counted twice) or the lowering: refused until that is supported
            raise UserError(f"{'an' if kind == 'allreduce' else 'a'} {kind} phase after the allreduce phase "
                            f"$.phases[{summed_everywhere}] is not supported: reduce the sums once, e.g. node "
                            f"reducescatter, rail allreduce, node allgather (\"phases\": \"hierarchical\")",
                            path=sketch.path, where=where + ".collective")
        if kind == "allreduce":
            summed_everywhere = i
        if groups == "rail" and topology.nodes < 2:
            raise UserError(f"a rail phase needs several nodes; the topology has {topology.nodes}",
                            path=sketch.path, where=where + ".groups")
        if groups == "node" and topology.gpus_per_node < 2:
            raise UserError("a node phase needs several GPUs per node", path=sketch.path, where=where + ".groups")
        if ph.get("exchange") and kind != "allreduce":
            raise UserError(f"only an allreduce phase exchanges partial sums, not a {kind} phase", path=sketch.path,
                            where=where + ".exchange")
        pre, post, route_pre, route_post = set(), set(), set(), set()
        after = []
        parts = ph.get("parts")
        for j, part in enumerate(parts or ()):
            if part >= coll.chunkup:
                raise UserError(f"piece {part} does not exist: each chunk is cut into {coll.chunkup} pieces "
                                f"(input_chunkup), numbered 0 to {coll.chunkup - 1}", path=sketch.path,
                                where=f"{where}.parts[{j}]")
        for c in range(coll.num_chunks):
            held = holders[c]
            if parts is not None and coll.labels[c][-1] not in parts:  # a piece the phase leaves where it is
                after.append(dict(held))
                continue
            new = {}
            by_group = {}
            for r in sorted(held):
                by_group.setdefault(_group_key(groups, topology, r), []).append(r)
            for key, hs in by_group.items():
                for h in hs:
                    pre.add((c, h))
                if kind == "allgather":
                    for h in hs:
                        new[h] = held[h]
                    got = held[hs[0]]
                    for m in _members(groups, topology, key):
                        post.add((c, m))
                        if m not in held:
                            new[m] = got
                elif kind == "alltoall":
                    if len(hs) != 1:
                        raise UserError(f"chunk {c} has several holders in one group: an alltoall phase moves "
                                        f"single copies", path=sketch.path, where=where + ".collective")
                    t = _toward(groups, topology, hs[0], targets[c])
                    post.add((c, t))
                    new[t] = held[hs[0]]
                else:  # reducescatter / allreduce
                    if len(hs) != len(_members(groups, topology, key)):
                        raise UserError(f"a {kind} phase reduces inside groups where every member holds a partial "
                                        f"sum, but chunk {c} is held by {len(hs)} of the {groups} group's "
                                        f"{len(_members(groups, topology, key))} members here", path=sketch.path,
                                        where=where + ".groups")
                    owner = _toward(groups, topology, hs[0], targets[c])
                    total = held[hs[0]]
                    for h in hs[1:]:
                        total = add_contributions(total, held[h])
                    route_pre.add((c, owner))
                    for h in hs:
                        route_post.add((c, h))
                    if kind == "reducescatter":
                        post.add((c, owner))
                        new[owner] = total
                    else:
                        for m in _members(groups, topology, key):
                            post.add((c, m))
                            route_post.add((c, m))
                            new[m] = total
            after.append(new)
        if kind in ("allgather", "alltoall"):
            route = task = _phase_collective(coll, kind, pre, post, False)
        else:
            route = _phase_collective(coll, "allgather", route_pre, route_post, False)
            pairs = kind == "allreduce" and len(_members(groups, topology, _group_key(groups, topology, 0))) == 2
            exchange = pairs or ph.get("exchange", False)
            task = _phase_collective(coll, kind, pre, post, True, form="exchange" if exchange else "")
        # a reduction over groups of two or more always sums (twice, if the sums were whole: said below)
        moved = kind in ("reducescatter", "allreduce") or any(
            set(a) != set(h) or any(a[r] != h.get(r) for r in a) for a, h in zip(after, holders))
        if not moved:
            raise UserError(f"this {kind} phase over {groups} groups moves no data (the chunks are already where "
                            f"it would put them)", path=sketch.path, where=where)
        holders = after
        plans.append(PhasePlan(i, ph.get("name", f"{kind}/{groups}"), kind, groups, _phase_sketch(sketch, ph, where),
                               route, task, where, ph))
    _check_composition(sketch, coll, holders)
    return plans


def _check_composition(sketch: Sketch, coll: Collective, holders: list) -> None:
    full = mask_of(range(coll.num_ranks))
    for c, r in sorted(coll.postcondition):
        got = holders[c].get(r)
        if got is None:
            raise UserError(f"the phases do not make up {coll.name}: after the last phase rank {r} lacks chunk {c} "
                            f"(a phase over other groups is missing)", path=sketch.path, where="$.phases")
        if coll.combining:
            want = mask_of(coll.sources(c)) if coll.name != "allreduce" else full
            summed, twice = got
            if summed != want or twice:
                dup, missing = ranks_in(twice), ranks_in(want & ~summed)
                why = f"contributions of ranks {dup} are summed twice" if dup else f"ranks {missing} are missing"
                raise UserError(f"the phases do not make up {coll.name}: chunk {c} on rank {r} is not the full sum "
                                f"({why})", path=sketch.path, where="$.phases")
