"""The Algorithm: a timed schedule of transfers, the synthesizer's output and the lowering's input.

File form (`<name>.algo.json`, documented in docs/algorithm-format.md):

    {"format": "taccl.algorithm/1", "name": ..., "collective": {"name", "num_ranks", "chunkup", "root", ...},
     "topology": {"name", "nodes", "path"}, "input_size_bytes", "chunk_bytes",
     "transfers": [{"id", "chunks", "src", "dst", "op", "send_us", "arrive_us", "deps", "link"}, ...],
     "time_us", "lower_bound_us", "lower_bounds": {...}, "stages": [...], "notes": [...]}

A transfer moves one or more chunks (its contiguity group: sent together in one send, one alpha) from `src`
to `dst`. `op` is "copy" (dst now holds the chunks) or "reduce" (dst adds src's partial sums of the chunks
into its own). `deps` are the ids of the transfers whose arrival at `src` this one waits for; `after` (if
any) the transfers from the same source that the schedule puts just before it on a resource that carries
one transfer at a time (a NIC, say): the lowering makes it wait for them, so the program keeps the order.
`exchange` (if any) names the reductions from this one's destination that it swaps partial sums with (the
members of a group exchanging their sums, `taccl.phases`; a pair's: the reverse reduction): for the chunks
they share, each sends its source's sum without what the others bring, and the destination adds what it got
once its own exchange sends left, whatever the timing (the lowering receives the sums aside,
`taccl.lowering.buffers`).
Transfers are listed in send-time order; on each (src, dst) pair, list order is the order of the sends.

`verify(algorithm, collective)` is the transfer-level proof that the schedule implements the collective:
every transfer sends only what its source holds at its send time (after every dependency arrived), no
resource is used by two transfers at once, and the postcondition holds at the end (for combining
collectives, every contribution is summed exactly once).
"""
from __future__ import annotations

from collections import defaultdict
from dataclasses import asdict, dataclass, field, replace

from .collectives import (NAMES, Collective, add_contributions, canonical_name, contribution, custom_collective,
                          make_collective, mask_of, ranks_in)
from .errors import CheckFailed, UserError
from .fileio import is_count

FORMAT = "taccl.algorithm/1"
EPS_US = 1e-6


@dataclass
class Transfer:
    id: int
    chunks: tuple
    src: int
    dst: int
    op: str  # "copy" | "reduce"
    send_us: float
    arrive_us: float
    deps: tuple = ()
    link: str = ""
    after: tuple = ()  # transfers of the same source sharing a one-at-a-time resource, scheduled just before
    exchange: tuple = ()  # reverse reductions it swaps partial sums with (see the module docstring)


@dataclass
class Algorithm:
    name: str
    collective: dict  # {"name", "num_ranks", "chunkup", "root"} (+ pre/postcondition for custom ones)
    topology: dict  # {"name", "nodes", "path"}
    input_size_bytes: int
    chunk_bytes: float
    transfers: list
    time_us: float
    lower_bound_us: float = 0.0
    lower_bounds: dict = field(default_factory=dict)
    stages: list = field(default_factory=list)
    notes: list = field(default_factory=list)
    sketch: str | None = None
    protocol: str = "Simple"  # the runtime protocol the costs are for and the lowering uses by default
    instances: int = 1  # thread blocks per connection the costs assume and the lowering uses by default
    block_steps: int | None = None  # the step cap per thread block the lowering starts at by default (the sketch's)
    call_us: float = 0.0  # the runtime's fixed cost per call, included in time_us

    def load_topology(self):
        """The Topology it was synthesized on: its topology file where it still is, else the built-in of that
        name (`UserError` if neither)."""
        from pathlib import Path

        from .topology import load_topology

        path = self.topology.get("path")
        return load_topology(path if path and Path(path).is_file() else self.topology["name"],
                             int(self.topology["nodes"]))

    def to_json(self) -> dict:
        doc = {"format": FORMAT}
        doc.update(asdict(replace(self, transfers=[])))  # asdict of a million transfers took 20 s
        doc["transfers"] = [
            dict({"id": t.id, "chunks": list(t.chunks), "src": t.src, "dst": t.dst, "op": t.op,
                  "send_us": round(t.send_us, 6), "arrive_us": round(t.arrive_us, 6), "deps": list(t.deps),
                  "link": t.link}, **({"after": list(t.after)} if t.after else {}),
                 **({"exchange": list(t.exchange)} if t.exchange else {}))
            for t in self.transfers
        ]
        doc["time_us"] = round(self.time_us, 6)
        doc["lower_bound_us"] = round(self.lower_bound_us, 6)
        return doc

    @classmethod
    def from_json(cls, doc, *, path: str | None = None) -> "Algorithm":
        if not isinstance(doc, dict) or doc.get("format") != FORMAT:
            raise UserError(f"not a taccl algorithm file (expected \"format\": \"{FORMAT}\")", path=path, where="$.format")
        for key in ("collective", "topology"):
            if not isinstance(doc.get(key), dict):
                raise UserError(f"expected an object, got {doc.get(key)!r}", path=path, where=f"$.{key}")
        malformed = _first_malformed(doc)  # before converting: int("2") would take a string for a number
        if malformed:
            raise UserError(malformed[1], path=path, where=malformed[0])
        try:
            transfers = [Transfer(id=int(t["id"]), chunks=tuple(int(c) for c in t["chunks"]), src=int(t["src"]),
                                  dst=int(t["dst"]), op=str(t["op"]), send_us=float(t["send_us"]),
                                  arrive_us=float(t["arrive_us"]), deps=tuple(int(d) for d in t.get("deps", ())),
                                  link=str(t.get("link", "")), after=tuple(int(d) for d in t.get("after", ())),
                                  exchange=tuple(int(d) for d in t.get("exchange", ())))
                         for t in doc["transfers"]]
            algo = cls(name=str(doc["name"]), collective=dict(doc["collective"]), topology=dict(doc["topology"]),
                       input_size_bytes=int(doc["input_size_bytes"]), chunk_bytes=float(doc["chunk_bytes"]),
                       transfers=transfers, time_us=float(doc["time_us"]),
                       lower_bound_us=float(doc.get("lower_bound_us", 0.0)), lower_bounds=dict(doc.get("lower_bounds", {})),
                       stages=list(doc.get("stages", [])), notes=list(doc.get("notes", [])), sketch=doc.get("sketch"),
                       protocol=str(doc.get("protocol", "Simple")), instances=int(doc.get("instances", 1)),
                       call_us=float(doc.get("call_us", 0.0)),
                       block_steps=None if doc.get("block_steps") is None else int(doc["block_steps"]))
        except (KeyError, TypeError, ValueError) as exc:
            where, message = _first_malformed(doc) or ("$", f"malformed algorithm file: {exc!r}")
            raise UserError(message, path=path, where=where) from None
        _check_header(algo, path)
        if algo.protocol not in ("Simple", "LL128", "LL"):
            raise UserError(f"unknown protocol {algo.protocol!r}; expected Simple, LL128 or LL", path=path,
                            where="$.protocol")
        # the lowering's own limits (`LoweringOptions.validate`), reported at the file's fields, not as options
        from .lowering import DEFAULT_MAX_STEPS, MAX_CHANNELS

        if not 1 <= algo.instances <= MAX_CHANNELS:  # an instance takes channels of its own
            raise UserError(f"instances must be from 1 to {MAX_CHANNELS}, got {algo.instances}", path=path,
                            where="$.instances")
        if algo.block_steps is not None and not (8 <= algo.block_steps <= DEFAULT_MAX_STEPS
                                                 and algo.block_steps % 8 == 0):
            raise UserError(f"block_steps must be a multiple of 8 from 8 to {DEFAULT_MAX_STEPS} (the runtime's "
                            f"steps a thread block), got {algo.block_steps}", path=path, where="$.block_steps")
        try:
            exchange_partners(algo.transfers)
        except UserError as exc:
            raise UserError(exc.message, path=path, where="$.transfers") from None
        return algo

    @property
    def makespan_us(self) -> float:
        """The schedule's own length: `time_us` without the call cost."""
        return self.time_us - self.call_us

    def make_collective(self) -> Collective:
        return collective_from_json(self.collective)


# an algorithm file's fields that `Algorithm.from_json` converts: (key, type, what is expected)
_HEADER_FIELDS = (("name", str, "a string"), ("input_size_bytes", int, "a positive integer (bytes)"),
                  ("chunk_bytes", float, "a positive number (bytes)"), ("time_us", float, "a number (us)"),
                  ("transfers", list, "a list of transfers"))
# and the optional ones: (key, type, what is expected); None is allowed where the type is (type, None)
_OPTIONAL_FIELDS = (("lower_bound_us", float, "a number (us)"), ("lower_bounds", dict, "an object"),
                    ("stages", list, "a list"), ("notes", list, "a list"), ("protocol", str, "Simple, LL128 or LL"),
                    ("instances", int, "an integer"), ("call_us", float, "a number (us)"),
                    ("block_steps", (int, None), "an integer or null"))
_TRANSFER_FIELDS = (("id", int, "an integer"), ("chunks", list, "a list of chunk indices"), ("src", int, "a rank"),
                    ("dst", int, "a rank"), ("op", str, "\"copy\" or \"reduce\""), ("send_us", float, "a number (us)"),
                    ("arrive_us", float, "a number (us)"))


def _malformed(value, kind) -> bool:
    """Whether `value` is not what a field of `kind` (int, float, str, list) needs."""
    if kind is int:
        return isinstance(value, bool) or not isinstance(value, int)
    if kind is float:
        return isinstance(value, bool) or not isinstance(value, (int, float))
    return not isinstance(value, kind)


_NUMBER = (int, float)


def _well_formed_transfer(t) -> bool:
    """The common case of `_first_malformed`'s test of one transfer, quickly (a file may hold 500,000): every
    field of the type it needs (`type(x) is int` also keeps JSON's true and false out)."""
    if type(t) is not dict:
        return False
    get = t.get
    if not (type(get("id")) is int and type(get("src")) is int and type(get("dst")) is int
            and type(get("op")) is str and type(get("send_us")) in _NUMBER and type(get("arrive_us")) in _NUMBER
            and type(get("chunks")) is list):
        return False
    for key in ("chunks", "deps", "after", "exchange"):
        ids = get(key)
        if ids is not None:
            if type(ids) is not list:
                return False
            for x in ids:
                if type(x) is not int:
                    return False
    return True


def _first_malformed(doc: dict):
    """(JSON path, message) of the first field `from_json` cannot convert, or None: an error names the field
    instead of the Python exception."""
    for key, kind, expected in _HEADER_FIELDS:
        if key not in doc:
            return f"$.{key}", f"missing; expected {expected}"
        if _malformed(doc[key], kind):
            return f"$.{key}", f"expected {expected}, got {doc[key]!r}"
    for key, kind, expected in _OPTIONAL_FIELDS:
        nullable = isinstance(kind, tuple)
        if key in doc and not (nullable and doc[key] is None) and _malformed(doc[key], kind[0] if nullable else kind):
            return f"$.{key}", f"expected {expected}, got {doc[key]!r}"
    for i, t in enumerate(doc["transfers"]):
        if _well_formed_transfer(t):
            continue
        if not isinstance(t, dict):
            return f"$.transfers[{i}]", f"expected a transfer (an object), got {t!r}"
        for key, kind, expected in _TRANSFER_FIELDS:
            if key not in t:
                return f"$.transfers[{i}].{key}", f"missing; expected {expected}"
            if _malformed(t[key], kind) or (kind is list and any(_malformed(c, int) for c in t[key])):
                return f"$.transfers[{i}].{key}", f"expected {expected}, got {t[key]!r}"
        for key in ("deps", "after", "exchange"):
            if key in t and (not isinstance(t[key], list) or any(_malformed(d, int) for d in t[key])):
                return f"$.transfers[{i}].{key}", f"expected a list of transfer ids, got {t[key]!r}"
    return None


def _check_header(algo: Algorithm, path: str | None) -> None:
    """The "collective" and "topology" objects' fields, before anything is built from them. A rank count or
    chunk-up beyond what the transfers reach is refused too: every rank of a built-in collective sends or
    receives, and every chunk moves, so the file cannot be right, and building the collective's conditions
    for 10^12 ranks would exhaust memory before any check ran."""
    coll, topo = algo.collective, algo.topology

    def refuse(message, where):
        raise UserError(message, path=path, where=where)

    if not isinstance(coll.get("name"), str):
        refuse(f"expected the collective's name (a string), got {coll.get('name')!r}", "$.collective.name")
    for key, low, default in (("num_ranks", 2, None), ("chunkup", 1, 1)):
        if not is_count(coll.get(key, default), low):
            refuse(f"expected an integer of at least {low}, got {coll.get(key)!r}", f"$.collective.{key}")
    if not isinstance(topo.get("name"), str):
        refuse(f"expected the topology's name (a string), got {topo.get('name')!r}", "$.topology.name")
    if not is_count(topo.get("nodes"), 1):
        refuse(f"expected a node count (an integer of at least 1), got {topo.get('nodes')!r}", "$.topology.nodes")
    if topo.get("path") is not None and not isinstance(topo["path"], str):
        refuse(f"expected the topology file's path (a string) or null, got {topo['path']!r}", "$.topology.path")
    if algo.input_size_bytes < 1:
        refuse(f"expected a positive integer (bytes), got {algo.input_size_bytes}", "$.input_size_bytes")
    if not 0 < algo.chunk_bytes < float("inf"):
        refuse(f"expected a positive number (bytes), got {algo.chunk_bytes}", "$.chunk_bytes")
    if not 0 <= algo.time_us < float("inf"):
        refuse(f"expected a time of at least 0 (us), got {algo.time_us}", "$.time_us")
    root = coll.get("root")
    # unrooted collectives ignore the root, but one out of range is a mistake all the same
    if root is not None and not is_count(root, 0, coll["num_ranks"] - 1):
        refuse(f"expected a rank from 0 to {coll['num_ranks'] - 1} or null, got {root!r}", "$.collective.root")
    for i, t in enumerate(algo.transfers):  # the lowering orders sends by these times
        if not 0 <= t.send_us < float("inf"):
            refuse(f"expected a time of at least 0 (us), got {t.send_us}", f"$.transfers[{i}].send_us")
        if not t.send_us <= t.arrive_us < float("inf"):
            refuse(f"expected a time no earlier than the send's ({t.send_us} us), got {t.arrive_us}",
                   f"$.transfers[{i}].arrive_us")
    if canonical_name(coll["name"]) in NAMES and algo.transfers:
        ranks = 1 + max(max(t.src, t.dst) for t in algo.transfers)
        chunks = 1 + max(max(t.chunks, default=0) for t in algo.transfers)
        if coll["num_ranks"] > ranks:
            refuse(f"{coll['num_ranks']} ranks, but no transfer reaches a rank above {ranks - 1}",
                   "$.collective.num_ranks")
        if coll.get("chunkup", 1) > chunks:
            refuse(f"chunk-up {coll['chunkup']}, but no transfer moves a chunk above {chunks - 1}",
                   "$.collective.chunkup")


def collective_to_json(coll: Collective) -> dict:
    doc = {"name": coll.name, "num_ranks": coll.num_ranks, "chunkup": coll.chunkup, "root": coll.root}
    if coll.form:
        doc["form"] = coll.form
    if coll.local_blocks:
        doc["local_blocks"] = coll.local_blocks
    if coll.name not in NAMES:  # user-defined: keep its full definition
        doc["custom"] = {"chunks": coll.num_chunks, "precondition": sorted(map(list, coll.precondition)),
                         "postcondition": sorted(map(list, coll.postcondition))}
    return doc


def collective_from_json(doc: dict) -> Collective:
    """The Collective of an algorithm file's "collective" object; `UserError` naming the field when it is
    malformed (a missing name, a rank count that is not a number, ...)."""
    try:
        return _collective_from_json(doc)
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise UserError(f"malformed collective: {exc!r}", where="$.collective") from None


def _collective_from_json(doc: dict) -> Collective:
    if "custom" in doc:
        cu = doc["custom"]
        return custom_collective(doc["name"], doc["num_ranks"], cu["chunks"], set(map(tuple, cu["precondition"])),
                                 set(map(tuple, cu["postcondition"])))
    return make_collective(doc["name"], doc["num_ranks"], doc.get("chunkup", 1), root=doc.get("root") or 0,
                           form=doc.get("form", ""), local_blocks=doc.get("local_blocks", 0))


def exchange_partners(transfers) -> dict:
    """(transfer id, chunk) -> the ids of the reductions from its destination it swaps that chunk's partial
    sums with (`Transfer.exchange`); a UserError where a transfer names one that is not a reduction from its
    destination, itself part of an exchange, sharing a chunk."""
    by_id = {t.id: t for t in transfers}
    out = {}
    for t in transfers:
        for pid in t.exchange:
            p = by_id.get(pid)
            shared = set(t.chunks) & set(p.chunks) if p is not None else set()
            if (p is None or t.op != "reduce" or p.op != "reduce" or p.src != t.dst or not p.exchange
                    or (p.dst == t.src and t.id not in p.exchange) or not shared):
                raise UserError(f"transfer {t.id} ({t.src}->{t.dst}) exchanges with transfer {pid}, which is not a "
                                f"reduction from rank {t.dst} of a chunk it carries, exchanging too (naming this "
                                f"one back if it goes to rank {t.src})")
            for c in shared:
                out[(t.id, c)] = out.get((t.id, c), ()) + (pid,)
    return out


def verify(algo: Algorithm, coll: Collective, resources_of=None) -> None:
    """Prove the schedule implements `coll`; raise CheckFailed naming the first broken transfer.

    `resources_of(src, dst)` (optional) gives a link's latency, the sender's share of it and its shared
    resources, ``(alpha_us, overhead_us, [(resource, lanes), ...])`` (the synthesizer's model,
    `taccl.ordering`); when given, no two transfers overlap on one connection (src, dst) until their data
    left, and no shared resource carries more transfers' data (which starts the overhead after the send and
    leaves the in-flight latency before the arrival) at once than it has lanes.

    A chunk a transfer exchanges (`Transfer.exchange`) is added at its destination once it has arrived and
    the partners have been sent: they send the destination's sum without it, as the lowering's program does.
    """
    by_id = {t.id: t for t in algo.transfers}
    # contributions (`taccl.collectives.contribution`) of each copy: state[(chunk, rank)]
    state = {}
    for c, r in coll.precondition:
        state[(c, r)] = contribution(r) if coll.combining else contribution(0)
    ready_at = {(c, r): 0.0 for c, r in coll.precondition}
    order = sorted(algo.transfers, key=lambda t: (t.send_us, t.id))
    busy = defaultdict(list)
    snapshot = {}
    for t in order:
        if t.op not in ("copy", "reduce"):
            raise CheckFailed(f"transfer {t.id}: unknown op {t.op!r}")
        if t.arrive_us + EPS_US < t.send_us:
            raise CheckFailed(f"transfer {t.id}: arrives before it is sent")
        for d in t.deps:
            if d not in by_id or by_id[d].arrive_us > t.send_us + EPS_US:
                raise CheckFailed(f"transfer {t.id} ({t.src}->{t.dst}) is sent at {t.send_us:.3f} us before its dependency {d} arrives")
        if resources_of is not None:
            alpha, overhead, shared = resources_of(t.src, t.dst)
            sent = max(t.send_us, t.arrive_us - (alpha - overhead))  # the data has left
            busy[("conn", t.src, t.dst)].append((t.send_us, sent, t.id, 1))
            for res, lanes in shared:
                busy[res].append((min(t.send_us + overhead, sent), sent, t.id, lanes))
    for res, spans in busy.items():
        # sweep: ends before starts at the same instant (within EPS_US)
        events = sorted([(s0 + EPS_US, 1, i, n) for s0, _, i, n in spans] + [(e0, -1, i, n) for _, e0, i, n in spans])
        active = set()
        for _, kind, i, lanes in events:
            if kind < 0:
                active.discard(i)
                continue
            active.add(i)
            if len(active) > lanes:
                raise CheckFailed(f"transfers {sorted(active)} use {res} at the same time, which carries "
                                  f"{lanes} at once")
    # Replay in time order, arrivals before sends at the same instant: a send reads its source's state then;
    # an exchanged chunk lands after its partner's send (kind 2: after the sends of the same instant).
    partners = exchange_partners(algo.transfers)
    events = [(t.send_us, 1, t.id, t.chunks) for t in algo.transfers]
    for t in algo.transfers:
        plain = tuple(c for c in t.chunks if (t.id, c) not in partners)
        if plain:
            events.append((t.arrive_us, 0, t.id, plain))
        events += [(max([t.arrive_us] + [by_id[p].send_us for p in partners[(t.id, c)]]), 2, t.id, (c,))
                   for c in t.chunks if (t.id, c) in partners]
    for when, kind, tid, chunks in sorted(events, key=lambda e: (round(e[0], 6),) + e[1:]):
        t = by_id[tid]
        if kind == 1:
            for c in chunks:
                if (c, t.src) not in state or ready_at[(c, t.src)] > t.send_us + EPS_US:
                    raise CheckFailed(f"transfer {t.id}: rank {t.src} sends chunk {c} to rank {t.dst} at {t.send_us:.3f} us "
                                      f"but does not hold it then")
                snapshot[(tid, c)] = state[(c, t.src)]
        else:
            for c in chunks:
                got = snapshot[(tid, c)]
                key = (c, t.dst)
                if t.op == "copy":
                    state[key] = got
                else:
                    if key not in state:
                        raise CheckFailed(f"transfer {t.id}: rank {t.dst} reduces chunk {c} but holds no contribution of it")
                    state[key] = add_contributions(state[key], got)
                ready_at[key] = when
    full_sum = {}  # chunk -> the mask of its contributors
    for c, r in sorted(coll.postcondition):
        got = state.get((c, r))
        if got is None:
            raise CheckFailed(f"chunk {c} never reaches rank {r}")
        if coll.combining:
            if c not in full_sum:
                full_sum[c] = mask_of(coll.sources(c))
            want = full_sum[c]
            summed, twice = got
            if summed != want or twice:
                missing, dup = ranks_in(want & ~summed), ranks_in(twice)
                raise CheckFailed(f"chunk {c} on rank {r} is not the full sum: missing contributions of ranks {missing}, "
                                  f"duplicated from {dup}")
