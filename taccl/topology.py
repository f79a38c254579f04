"""Physical topologies: one node type (GPUs, links, switches, NICs, PCIe groups) and its multi-node instance.

A topology file (`topologies/*.json`, schema `taccl/schemas/topology.schema.json`) describes one node.
`Topology(spec, nodes)` instantiates it: global rank = node * gpus_per_node + local GPU.

Every physical transfer path between two ranks is a `Link` with an alpha-beta cost and the set of exclusive
*resources* it occupies while it moves data:

- a direct link (NVLink, xGMI, torus wire) occupies ("link", src, dst);
- a switch path occupies the source's switch out-port and the destination's switch in-port,
  ("swout", switch, src) and ("swin", switch, dst), so a GPU sending to many peers through an NVSwitch
  shares its port bandwidth among them;
- an inter-node path occupies the sending NIC's egress and the receiving NIC's ingress,
  ("nicout", node, nic) and ("nicin", node, nic), so GPUs that share a NIC share its bandwidth.

The same resource model serves the routing MILP (relaxed bandwidth), the scheduling MILP (strict
one-at-a-time use) and the simulator (contention).

What a transfer costs depends on the runtime protocol (``Simple``, ``LL128``, ``LL``): a link type may give,
per protocol, the latency of one step (`alpha_us`), the data bandwidth the protocol reaches over the link
(`bw_GBps`) and what one thread block (one channel's connection) can push over it (`tb_bw_GBps`); the file's
`runtime.call_us` is the fixed cost of one collective call (launch and set-up). These calibrated figures are
what the simulator, the bounds and the synthesizer use (`LinkType.cost(proto)`). A link type without them
costs `alpha_us` and `bw_GBps` scaled by NCCL's ring protocol factors (`DEFAULT_ALPHA_FACTOR`,
`DEFAULT_BW_FACTOR`), with no thread-block limit and no call cost: the uncalibrated model.

A topology may share its links with another job (`reservations`): each entry takes a `fraction` of the
bandwidth of every link, switch and NIC of a `link_type`, of chosen GPU pairs (`links`, both directions) or
of chosen NICs (`nics`), and this job sees the rest: those elements get a derived link type (``nvlink2~25%``)
whose bandwidths, per protocol and per thread block, are scaled by 1 - fraction (latencies unchanged).
Synthesis, bounds and the simulator all cost links through these types, so all of them honour it.

Also accepted unchanged: the reference TACCL profile files (`name`, `gpus_per_node`, `alpha`,
`node_betas_list`, `remote_alpha`, `remote_beta`, ...), whose costs are microseconds per chunk of the size
in the file's name; they are converted to bandwidths so that chunk size enters the cost.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path

from .errors import UserError
from .fileio import load_json, validate
from .units import parse_size, transfer_time_us

BUILTIN_DIR = Path(__file__).resolve().parent.parent / "topologies"
_TORUS_RE = re.compile(r"^torus-(\d+)x(\d+)$")


PROTOCOLS = ("Simple", "LL128", "LL")
# Uncalibrated link types: a protocol's latency and bandwidth relative to Simple's, NCCL's ring figures
# (hwLat over NVLink 0.6 / 1.9 / 3.4 us; LL moves 8 data bytes per 16, LL128 120 per 128:
# shared/docs/reference-numbers.md section 1.8).
DEFAULT_ALPHA_FACTOR = {"Simple": 1.0, "LL128": 1.9 / 3.4, "LL": 0.6 / 3.4}
DEFAULT_BW_FACTOR = {"Simple": 1.0, "LL128": 0.92, "LL": 0.5}


@dataclass(frozen=True)
class ProtoCost:
    """What one transfer costs over a link type under one protocol.

    A step (one tile of one send) arrives ``alpha_us + bytes / bandwidth`` after its sender starts it; of
    the latency, ``overhead_us`` keeps the sending thread block busy (Simple's fence and flag handshake over
    NVLink), the rest is in flight (LL's flags travel with the data; a network send is the proxy's).
    """

    alpha_us: float  # latency of one step
    bw_GBps: float  # data bandwidth the protocol reaches over the link
    tb_bw_GBps: float | None = None  # what one thread block can push over it (None: no limit)
    overhead_us: float | None = None  # the part of alpha the sender is busy for (None: all of it)

    @property
    def busy_us(self) -> float:
        """The sender's share of alpha."""
        return self.alpha_us if self.overhead_us is None else min(self.overhead_us, self.alpha_us)

    def time_us(self, nbytes: float) -> float:
        return transfer_time_us(nbytes, self.alpha_us, self.bw_GBps)


def lanes_and_rate(bw_GBps: float, tb_bw_GBps: float | None) -> tuple:
    """A whole number of equal lanes for a resource of bandwidth B shared by thread blocks limited to c (the
    solver's model: `Problem.path_cost`): (lanes, GB/s each) = round(B / c) lanes of min(c, B / lanes); one
    lane of B without a limit. The simulator's lanes are `lane_capacity`'s."""
    if tb_bw_GBps is None or tb_bw_GBps >= bw_GBps:
        return 1, bw_GBps
    lanes = max(1, int(bw_GBps / tb_bw_GBps + 0.5))
    return lanes, min(tb_bw_GBps, bw_GBps / lanes)


# a resource's last, partial lane is modelled when it carries at least this fraction of a block's rate
MIN_PARTIAL_LANE = 0.1


def lane_capacity(bw_GBps: float, tb_bw_GBps: float | None) -> tuple:
    """How the simulator serves thread blocks limited to c on a shared resource of bandwidth B: (full lanes,
    the last lane's share of c, GB/s of a full lane) = floor(B / c) lanes of c and one of B - floor(B / c) c
    (dropped below `MIN_PARTIAL_LANE`), so that one block gets c and enough blocks get all of B; one lane
    of B without a limit."""
    if tb_bw_GBps is None or tb_bw_GBps >= bw_GBps:
        return 1, 0.0, bw_GBps
    lanes = bw_GBps / tb_bw_GBps
    full = int(lanes + 0.02)  # a lane short of a full one by a rounding of the calibration counts as full
    partial = lanes - full
    return full, (partial if partial >= MIN_PARTIAL_LANE else 0.0), tb_bw_GBps


@dataclass(frozen=True)
class LinkType:
    name: str
    alpha_us: float
    bw_GBps: float
    protocols: tuple = ()  # ((protocol, ProtoCost), ...): calibrated costs, see the module docstring

    def cost_us(self, nbytes: float) -> float:
        return transfer_time_us(nbytes, self.alpha_us, self.bw_GBps)

    @property
    def calibrated(self) -> bool:
        return bool(self.protocols)

    def cost(self, proto="Simple") -> ProtoCost:
        """The calibrated cost under `proto`, else the raw figures scaled by NCCL's protocol factors."""
        p = str(getattr(proto, "value", proto))
        for name, c in self.protocols:
            if name == p:
                return c
        return ProtoCost(self.alpha_us * DEFAULT_ALPHA_FACTOR[p], self.bw_GBps * DEFAULT_BW_FACTOR[p])


@dataclass(frozen=True)
class Link:
    """A directed path between two ranks that data can take in one send."""

    src: int
    dst: int
    type: LinkType
    kind: str  # "direct", "switch" or "net"
    resources: tuple

    @property
    def alpha_us(self) -> float:
        return self.type.alpha_us

    @property
    def bw_GBps(self) -> float:
        return self.type.bw_GBps

    def cost_us(self, nbytes: float) -> float:
        return self.type.cost_us(nbytes)


@dataclass
class TopologySpec:
    """One node type, as read from a topology file."""

    name: str
    gpus_per_node: int
    link_types: dict
    links: list = field(default_factory=list)  # (src, dst, type name), directed, local indices
    switches: list = field(default_factory=list)  # (name, frozenset of local gpus, type name)
    nics: list = field(default_factory=list)  # (name, tuple of local gpus, type name)
    pcie_switches: list = field(default_factory=list)
    max_nodes: int | None = None
    call_us: dict = field(default_factory=dict)  # protocol -> fixed cost of one collective call
    local_bw_GBps: float | None = None  # one thread block's on-GPU copy / reduce bandwidth
    sync_us: float = 0.0  # a dependency between thread blocks of one GPU: flag published, then seen
    sm_count: int | None = None  # streaming multiprocessors: the most thread blocks a rank may have
    protocols: tuple = PROTOCOLS  # the protocols programs may use here (LL128 only over NVLink, as NCCL)
    vendor: str = "nvidia"  # the GPUs' maker: which runtime runs the programs by default (`taccl.targets`)
    description: str = ""
    sources: list = field(default_factory=list)
    path: str | None = None
    raw: dict = field(default_factory=dict)

    @property
    def multi_node(self) -> bool:
        return bool(self.nics) and self.max_nodes != 1

    def check_protocol(self, proto, where: str = "--proto") -> None:
        """Refuse a protocol this machine's runtime must not use (`runtime.protocols`): NCCL turns LL128 on only
        where the GPUs of a node talk over NVLink, as its 128-byte lines are stored whole only there."""
        p = str(getattr(proto, "value", proto))
        if p not in self.protocols:
            why = (" (NCCL enables LL128 only where the GPUs of a node talk over NVLink: elsewhere its lines may be "
                   "torn and the data corrupted)" if p == "LL128" else "")
            raise UserError(f"protocol {p} is not used on topology {self.name}: its runtime.protocols allow "
                            f"{', '.join(self.protocols)}{why}", path=self.path, where=where)

    def protocol_note(self) -> str | None:
        """One sentence for the user where this machine excludes a protocol, else None."""
        off = [p for p in PROTOCOLS if p not in self.protocols]
        if not off:
            return None
        return (f"topology {self.name} allows only {', '.join(self.protocols)} (runtime.protocols): no program or "
                f"baseline in {', '.join(off)} is made for it")

    def calibration_note(self) -> str | None:
        """What of this topology is uncalibrated, as one sentence for the user, or None when nothing is: its
        simulated times (and a synthesis's ranking of programs) then leave out the per-call and per-step
        latencies and the per-block bandwidth, which dominate below about 1 MiB (docs/calibration.md)."""
        used = {t for _, _, t in self.links} | {t for _, _, t in self.switches} | {t for _, _, t in self.nics}
        raw = sorted(t for t in used if not self.link_types[t].calibrated)
        gaps = ([f"link type{'s' if len(raw) > 1 else ''} {', '.join(raw)} without calibrated protocol costs"]
                if raw else []) + ([] if self.call_us else ["no per-call cost"])
        if not gaps:
            return None
        fix = ""
        samples = (self.raw.get("measurements") or {}).get("samples_file") if self.vendor == "nvidia" else None
        if samples:  # written by `taccl profile` before it derived costs, or without the GPU's compute capability
            fix = (f"; `taccl profile --analyze {samples} --compute-capability X.Y` writes it again with costs "
                   f"derived for that GPU generation")
        return (f"topology {self.name} is not calibrated ({'; '.join(gaps)}): its simulated times leave out "
                f"latencies and per-block limits that real runtimes pay, so below about 1 MiB they can be several "
                f"times too short (docs/calibration.md){fix}")


def _check_gpu(g, n, path, where):
    if not 0 <= g < n:
        raise UserError(f"GPU index {g} is outside this node (gpus_per_node = {n})", path=path, where=where)


def check_node_connected(spec: "TopologySpec") -> None:
    """That the links and switches join every GPU of a node to every other: without that no collective can be
    synthesized on it (and the routing would blame the sketch for a route it cannot find). A topology file may
    still lack them: `taccl profile` started from `nvidia-smi topo -m` output has no GPU-GPU link of a PCIe-only
    node (its probes measure one: a switch of link type "pcie")."""
    import networkx as nx

    n = spec.gpus_per_node
    d = nx.DiGraph()  # links as they go; a switch as a hub each member reaches and is reached from (linear size)
    d.add_nodes_from(range(n))
    d.add_edges_from((a, b) for a, b, _ in spec.links)
    for si, (_, gpus, _) in enumerate(spec.switches):
        hub = ("switch", si)
        d.add_edges_from((g, hub) for g in gpus)
        d.add_edges_from((hub, g) for g in gpus)
    gpu_sets = (sorted(g for g in part if isinstance(g, int)) for part in nx.weakly_connected_components(d))
    parts = sorted(part for part in gpu_sets if part)  # a switch of no GPU is a part of none
    if len(parts) > 1:
        raise UserError(f"GPU {parts[1][0]} is joined to GPU 0 by no path of links and switches (the "
                        f"{n} GPUs of a node fall into {len(parts)} unconnected groups): nothing can "
                        f"be synthesized on it", path=spec.path, where="$.links")
    unreached = sorted(set(range(n)) - nx.descendants(d, 0) - {0})
    stuck = sorted(set(range(n)) - nx.ancestors(d, 0) - {0})
    if unreached or stuck:
        gpu, way = (unreached[0], "in") if unreached else (stuck[0], "out")
        ends = f"from GPU 0 to GPU {gpu}" if unreached else f"from GPU {gpu} to GPU 0"
        raise UserError(f"no path of links and switches goes {ends} (one-way links, \"bidirectional\": false, "
                        f"leave GPU {gpu} without a way {way}): nothing can be synthesized on it", path=spec.path,
                        where="$.links")


def spec_from_dict(doc: dict, *, path: str | None = None) -> TopologySpec:
    """Validate a topology document (schema, then cross-references) and build its spec."""
    if isinstance(doc, dict) and "node_betas_list" in doc:
        doc = convert_reference_profile(doc, path=path)
    validate(doc, "topology.schema.json", path=path)
    n = doc["gpus_per_node"]
    types = {}
    for k, v in doc["link_types"].items():
        protos = _protocol_costs(v.get("protocols", {}), path, f"$.link_types.{k}.protocols")
        types[k] = LinkType(k, float(v["alpha_us"]), float(v["bw_GBps"]), protos)
    runtime = doc.get("runtime", {})
    call_us = {p: float(t) for p, t in runtime.get("call_us", {}).items()}
    if any(t.calibrated for t in types.values()):
        missing = [p for p in PROTOCOLS if p not in call_us]
        if missing:
            raise UserError(f"calibrated link types need the call cost of every protocol; missing {missing}",
                            path=path, where="$.runtime.call_us")

    def check_type(t, where):
        if t not in types:
            raise UserError(f"unknown link type {t!r}; declared types: {sorted(types)}", path=path, where=where)

    links, seen = [], set()
    for i, l in enumerate(doc.get("links", [])):
        where = f"$.links[{i}]"
        _check_gpu(l["src"], n, path, where + ".src")
        _check_gpu(l["dst"], n, path, where + ".dst")
        if l["src"] == l["dst"]:
            raise UserError("a link must join two different GPUs", path=path, where=where)
        check_type(l["type"], where + ".type")
        pairs = [(l["src"], l["dst"])] + ([(l["dst"], l["src"])] if l.get("bidirectional", True) else [])
        for s, d in pairs:
            if (s, d) in seen:
                raise UserError(f"link {s}->{d} is declared twice", path=path, where=where)
            seen.add((s, d))
            links.append((s, d, l["type"]))
    switches = []
    for i, sw in enumerate(doc.get("switches", [])):
        where = f"$.switches[{i}]"
        for g in sw["gpus"]:
            _check_gpu(g, n, path, where + ".gpus")
        check_type(sw["type"], where + ".type")
        switches.append((sw.get("name", f"switch{i}"), frozenset(sw["gpus"]), sw["type"]))
    nics, nic_of = [], {}
    for i, nic in enumerate(doc.get("nics", [])):
        where = f"$.nics[{i}]"
        for g in nic["gpus"]:
            _check_gpu(g, n, path, where + ".gpus")
            if g in nic_of:
                raise UserError(f"GPU {g} is attached to NIC {nic_of[g]} and NIC {i}; each GPU uses one NIC", path=path, where=where)
            nic_of[g] = i
        check_type(nic["type"], where + ".type")
        nics.append((nic.get("name", f"nic{i}"), tuple(nic["gpus"]), nic["type"]))
    if nics and len(nic_of) != n:
        missing = sorted(set(range(n)) - set(nic_of))
        raise UserError(f"GPUs {missing} are attached to no NIC; every GPU needs one for inter-node traffic", path=path, where="$.nics")
    for i, grp in enumerate(doc.get("pcie_switches", [])):
        for g in grp:
            _check_gpu(g, n, path, f"$.pcie_switches[{i}]")
    listed = len(doc.get("pcie_switches", []))
    for i, nic in enumerate(doc.get("nics", [])):  # (information only, but a wrong index is a wrong file)
        if nic.get("pcie_switch") is not None and nic["pcie_switch"] >= listed:
            raise UserError(f"PCIe switch {nic['pcie_switch']} does not exist: $.pcie_switches lists {listed}",
                            path=path, where=f"$.nics[{i}].pcie_switch")
    if doc.get("reservations"):
        links, switches, nics = _reserve(doc["reservations"], types, links, switches, nics, n, path)
    return TopologySpec(
        name=doc["name"], gpus_per_node=n, link_types=types, links=links, switches=switches, nics=nics,
        pcie_switches=[list(g) for g in doc.get("pcie_switches", [])], max_nodes=doc.get("max_nodes"),
        call_us=call_us, local_bw_GBps=runtime.get("local_bw_GBps"), sync_us=float(runtime.get("sync_us", 0.0)),
        sm_count=runtime.get("sm_count"), protocols=tuple(p for p in PROTOCOLS if p in runtime.get("protocols", PROTOCOLS)),
        vendor=doc.get("vendor", "nvidia"),
        description=doc.get("description", ""), sources=doc.get("sources", []), path=path, raw=doc,
    )


def structure_digest(spec: TopologySpec) -> str:
    """A digest of what a baseline's program is built from: the GPUs, which pairs links join and in what
    order of bandwidth (a ring follows the fastest), the switches' and NICs' members; not the costs of NICs
    and switches, which only its simulation reads. A degraded or shared NIC keeps the digest, so the batch
    reuses every baseline program and simulates them again."""
    import hashlib
    import json

    doc = {"gpus_per_node": spec.gpus_per_node,
           "links": sorted([s, d, spec.link_types[t].bw_GBps] for s, d, t in spec.links),
           "switches": sorted([name, sorted(gpus)] for name, gpus, _ in spec.switches),
           "nics": sorted([name, list(gpus)] for name, gpus, _ in spec.nics),
           "pcie_switches": spec.pcie_switches, "sm_count": spec.sm_count}
    return hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest()


def _reserved_type(t: LinkType, share: float) -> LinkType:
    """`t` with `share` (0 < share < 1) of its bandwidth: what this job gets when another holds the rest."""
    protos = tuple((p, ProtoCost(c.alpha_us, c.bw_GBps * share,
                                 None if c.tb_bw_GBps is None else min(c.tb_bw_GBps, c.bw_GBps * share),
                                 c.overhead_us)) for p, c in t.protocols)
    return LinkType(f"{t.name}~{round((1 - share) * 100, 2):g}%", t.alpha_us, t.bw_GBps * share, protos)


def _reserve(reservations: list, types: dict, links: list, switches: list, nics: list, n: int, path) -> tuple:
    """Apply `reservations` (see the module docstring): the links, switches and NICs with their types
    replaced where another job holds part of their bandwidth; the derived types are added to `types`."""
    held = {}  # ("link", s, d) | ("switch", name) | ("nic", name) -> fraction held by others
    nic_names = {name for name, _, _ in nics}
    for i, r in enumerate(reservations):
        where = f"$.reservations[{i}]"
        f = float(r["fraction"])
        chosen = []
        if "link_type" in r:
            if r["link_type"] not in types:
                raise UserError(f"unknown link type {r['link_type']!r}; declared types: {sorted(types)}", path=path,
                                where=where + ".link_type")
            chosen += [("link", s, d) for s, d, t in links if t == r["link_type"]]
            chosen += [("switch", name) for name, _, t in switches if t == r["link_type"]]
            chosen += [("nic", name) for name, _, t in nics if t == r["link_type"]]
        for j, (s, d) in enumerate(r.get("links", [])):
            _check_gpu(s, n, path, f"{where}.links[{j}]")
            _check_gpu(d, n, path, f"{where}.links[{j}]")
            pair = [k for k in (("link", s, d), ("link", d, s)) if any(k[1:] == (a, b) for a, b, _ in links)]
            if not pair:
                raise UserError(f"no link joins GPUs {s} and {d}", path=path, where=f"{where}.links[{j}]")
            chosen += pair
        for j, name in enumerate(r.get("nics", [])):
            if name not in nic_names:
                raise UserError(f"unknown NIC {name!r}; NICs: {sorted(nic_names)}", path=path, where=f"{where}.nics[{j}]")
            chosen.append(("nic", name))
        if not chosen:
            raise UserError("names no link_type, links or nics to reserve", path=path, where=where)
        for key in set(chosen):
            held[key] = held.get(key, 0.0) + f
            if held[key] >= 1.0:
                raise UserError(f"reservations hold {held[key]:.0%} of {key[0]} {' '.join(map(str, key[1:]))}: "
                                f"nothing would be left for this job", path=path, where=where)

    def retype(key, tname):
        if key not in held:
            return tname
        derived = _reserved_type(types[tname], 1.0 - held[key])
        types.setdefault(derived.name, derived)
        return derived.name

    links = [(s, d, retype(("link", s, d), t)) for s, d, t in links]
    switches = [(name, gpus, retype(("switch", name), t)) for name, gpus, t in switches]
    nics = [(name, gpus, retype(("nic", name), t)) for name, gpus, t in nics]
    return links, switches, nics


def _protocol_costs(doc: dict, path, where) -> tuple:
    """A link type's calibrated costs; all three protocols or none (a program may use any of them)."""
    if not doc:
        return ()
    missing = [p for p in PROTOCOLS if p not in doc]
    if missing:
        raise UserError(f"calibrated costs must cover every protocol; missing {missing}", path=path, where=where)
    out = []
    for p in PROTOCOLS:
        c = doc[p]
        tb = c.get("tb_bw_GBps")
        cost = ProtoCost(float(c["alpha_us"]), float(c["bw_GBps"]), None if tb is None else float(tb),
                         float(c.get("overhead_us", 0.0)))
        if cost.overhead_us > cost.alpha_us:
            raise UserError(f"overhead_us {cost.overhead_us} is above alpha_us {cost.alpha_us}: the sender's part of "
                            f"a step's latency cannot exceed the latency", path=path, where=f"{where}.{p}.overhead_us")
        if cost.tb_bw_GBps is not None and cost.tb_bw_GBps > cost.bw_GBps:
            raise UserError(f"tb_bw_GBps {cost.tb_bw_GBps} is above the link's {p} bandwidth {cost.bw_GBps}: one "
                            f"thread block cannot move more than the link", path=path, where=f"{where}.{p}.tb_bw_GBps")
        out.append((p, cost))
    return tuple(out)


# DGX-1 / Azure NDv2 hybrid cube-mesh: pairs joined by two NVLinks, and by one.
# Source: `nvidia-smi topo -m` of DGX-1V (NV2/NV1 entries); the same wiring is used by the TACCL paper's NDv2.
DGX1_DOUBLE = [(0, 3), (0, 4), (1, 2), (1, 5), (2, 3), (4, 7), (5, 6), (6, 7)]
DGX1_SINGLE = [(0, 1), (0, 2), (1, 3), (2, 6), (3, 7), (4, 5), (4, 6), (5, 7)]
# The reference TACCL implementation wires its NDv2 profiles otherwise (microsoft/taccl @ 426bd1e,
# taccl/topologies/generic.py, ndv2()): the same sixteen GPU pairs, but node_betas_list[0] (the faster,
# 23 us per 1 MB chunk in topo-ndv2-1MB.json) on these, node_betas_list[1] on the rest. A reference profile
# is loaded onto this wiring, so that an algorithm for "the same" input is optimized for the same machine.
TACCL_NDV2_FIRST = [(0, 1), (0, 4), (1, 3), (2, 3), (2, 6), (4, 5), (5, 7), (6, 7)]
TACCL_NDV2_SECOND = [(0, 2), (0, 3), (1, 2), (1, 5), (3, 7), (4, 6), (4, 7), (5, 6)]


def convert_reference_profile(doc: dict, *, path: str | None = None) -> dict:
    """Turn a reference TACCL profile (costs per chunk of the file's size) into our topology document."""
    name = str(doc.get("name", "reference"))
    m = re.search(r"_(\d+[KMGkmg]i?B?)$", name)
    chunk_bytes = parse_size(m.group(1).rstrip("Bb") if m else "1M", path=path, where="$.name")
    try:
        gpn = int(doc["gpus_per_node"])
        betas = [float(b) for b in doc["node_betas_list"]]
        alpha = float(doc["alpha"])
        r_alpha, r_beta = float(doc["remote_alpha"]), float(doc["remote_beta"])
        nics_per_node = int(doc.get("nics_per_node", 1))
    except (KeyError, TypeError, ValueError) as exc:
        raise UserError(f"reference TACCL profile is missing or has a bad field: {exc}", path=path) from None

    def bw(beta_us):  # beta is microseconds for one chunk of chunk_bytes
        if beta_us <= 0:
            raise UserError("beta must be positive", path=path, where="$.node_betas_list")
        return chunk_bytes / (beta_us * 1000.0)

    out = {"name": name, "gpus_per_node": gpn, "sources": [f"converted from reference TACCL profile {path or name}"],
           "description": f"reference TACCL profile; costs were per {chunk_bytes}-byte chunk"}
    types = {"ib": {"alpha_us": r_alpha, "bw_GBps": bw(r_beta)}}
    if gpn == 8 and len(betas) == 2:
        types["nvlink2"] = {"alpha_us": alpha, "bw_GBps": bw(betas[0])}
        types["nvlink1"] = {"alpha_us": alpha, "bw_GBps": bw(betas[1])}
        out["links"] = [{"src": s, "dst": d, "type": "nvlink2"} for s, d in TACCL_NDV2_FIRST] + \
                       [{"src": s, "dst": d, "type": "nvlink1"} for s, d in TACCL_NDV2_SECOND]
        out["sources"].append("NVLink wiring: the reference's ndv2() (node_betas_list[0] on 0-1, 0-4, 1-3, 2-3, "
                              "2-6, 4-5, 5-7, 6-7), not the DGX-1V nvidia-smi wiring of the built-in ndv2")
    elif len(betas) == 1:
        types["nvswitch"] = {"alpha_us": alpha, "bw_GBps": bw(betas[0])}
        out["switches"] = [{"name": "nvswitch", "gpus": list(range(gpn)), "type": "nvswitch"}]
    else:
        raise UserError("reference profile not recognised: expected 8 GPUs with two NVLink betas (NDv2) "
                        "or one beta for an NVSwitch node (DGX-2)", path=path, where="$.node_betas_list")
    per_nic = max(1, gpn // max(1, nics_per_node))
    out["nics"] = [{"gpus": list(range(i, min(gpn, i + per_nic))), "type": "ib"} for i in range(0, gpn, per_nic)]
    out["link_types"] = types
    return out


def torus_spec(rows: int, cols: int) -> dict:
    """A 2-D torus of rows x cols accelerators (one 'node'), four neighbours each with wrap-around."""
    n = rows * cols
    links = set()
    for r in range(rows):
        for c in range(cols):
            a = r * cols + c
            for b in (r * cols + (c + 1) % cols, ((r + 1) % rows) * cols + c):
                if a != b:
                    links.add((min(a, b), max(a, b)))
    return {
        "name": f"torus-{rows}x{cols}",
        "description": f"2-D torus, {rows}x{cols}, wrap-around links in both dimensions",
        "sources": ["TPU v5e: 400 GB/s bidirectional ICI per chip over 4 ports -> 50 GB/s per port per direction "
                    "(cloud.google.com/tpu/docs/v5e, via shared/docs/reference-numbers.md); alpha 1 us assumed [I]"],
        "gpus_per_node": n, "max_nodes": 1,
        "link_types": {"ici": {"alpha_us": 1.0, "bw_GBps": 50.0}},
        "links": [{"src": a, "dst": b, "type": "ici"} for a, b in sorted(links)],
    }


def builtin_names() -> list:
    names = sorted(p.stem for p in BUILTIN_DIR.glob("*.json")) if BUILTIN_DIR.is_dir() else []
    return names + ["torus-RxC"]


def load_spec(name_or_path, *, where: str | None = None, source: str | None = None) -> TopologySpec:
    """A built-in name (`ndv2`, `dgx2`, `torus-6x8`, ...) or a path to a topology file."""
    text = str(name_or_path)
    m = _TORUS_RE.match(text)
    if m:
        rows, cols = int(m.group(1)), int(m.group(2))
        if rows < 1 or cols < 1 or rows * cols < 2:
            raise UserError(f"torus needs at least 2 GPUs, got {text}", path=source, where=where)
        return spec_from_dict(torus_spec(rows, cols), path=text)
    p = Path(text)
    if not p.suffix and (BUILTIN_DIR / f"{text}.json").is_file():
        p = BUILTIN_DIR / f"{text}.json"
    elif not p.is_file() and source and (Path(source).parent / text).is_file():
        p = Path(source).parent / text  # relative to the sketch that names it
    if not p.is_file():
        raise UserError(f"unknown topology {text!r}: not a file, and built-ins are {builtin_names()}", path=source, where=where)
    return spec_from_dict(load_json(p), path=str(p))


def _slower(x: ProtoCost, y: ProtoCost) -> ProtoCost:
    """One protocol's cost over two resources in series (two NICs): the larger latency and the smaller
    bandwidths."""
    limits = [c.tb_bw_GBps for c in (x, y) if c.tb_bw_GBps is not None]
    return ProtoCost(max(x.alpha_us, y.alpha_us), min(x.bw_GBps, y.bw_GBps), min(limits) if limits else None,
                     None if x.overhead_us is None and y.overhead_us is None else max(x.busy_us, y.busy_us))


class Topology:
    """A node type instantiated on `nodes` nodes. Ranks are global: node * gpus_per_node + local GPU."""

    def __init__(self, spec: TopologySpec, nodes: int = 1):
        if nodes < 1:
            raise UserError(f"node count must be at least 1, got {nodes}")
        if nodes > 1 and not spec.nics:
            raise UserError(f"topology {spec.name!r} has no NICs, so it cannot span {nodes} nodes", path=spec.path, where="$.nics")
        if spec.max_nodes is not None and nodes > spec.max_nodes:
            raise UserError(f"topology {spec.name!r} supports at most {spec.max_nodes} node(s), asked for {nodes}", path=spec.path)
        self.spec = spec
        self.nodes = nodes
        self.gpus_per_node = spec.gpus_per_node
        self.num_ranks = nodes * spec.gpus_per_node
        self._nic_of_local = {g: i for i, (_, gpus, _) in enumerate(spec.nics) for g in gpus}
        self._net_types = {}  # (sending NIC's type, receiving NIC's type) -> their combined LinkType

    @property
    def name(self) -> str:
        return self.spec.name

    def node_of(self, rank: int) -> int:
        return rank // self.gpus_per_node

    def local(self, rank: int) -> int:
        return rank % self.gpus_per_node

    def rank(self, node: int, local: int) -> int:
        return node * self.gpus_per_node + local

    def nic_of(self, rank: int) -> int | None:
        return self._nic_of_local.get(self.local(rank))

    @cached_property
    def _intra_local(self) -> dict:
        """(src, dst) local pairs -> (kind, type name, switch index); direct links win over switch paths."""
        out = {}
        for si, (_, gpus, tname) in enumerate(self.spec.switches):
            for s in gpus:
                for d in gpus:
                    if s != d:
                        cur = out.get((s, d))
                        # Several switches joining the same pair: keep the faster one.
                        if cur is None or self.spec.link_types[tname].bw_GBps > self.spec.link_types[cur[1]].bw_GBps:
                            out[(s, d)] = ("switch", tname, si)
        for s, d, tname in self.spec.links:
            out[(s, d)] = ("direct", tname, None)
        return out

    def link(self, src: int, dst: int) -> Link | None:
        """The physical path from src to dst usable in one send, or None."""
        if src == dst or not (0 <= src < self.num_ranks and 0 <= dst < self.num_ranks):
            return None
        ns, nd = self.node_of(src), self.node_of(dst)
        if ns == nd:
            entry = self._intra_local.get((self.local(src), self.local(dst)))
            if entry is None:
                return None
            kind, tname, si = entry
            lt = self.spec.link_types[tname]
            if kind == "direct":
                res = (("link", src, dst),)
            else:
                res = (("swout", ns, si, src), ("swin", ns, si, dst))
            return Link(src, dst, lt, kind, res)
        a, b = self.nic_of(src), self.nic_of(dst)
        return Link(src, dst, self._net_type(self.spec.nics[a][2], self.spec.nics[b][2]), "net",
                    (("nicout", ns, a), ("nicin", nd, b)))

    def _net_type(self, out_type: str, in_type: str) -> LinkType:
        """The cost of a network send from a NIC of type `out_type` to one of `in_type`: the slower of the two
        (the larger latency, the smaller bandwidth per protocol), so that a slow or reserved receiving NIC
        slows what it receives as much as what it sends."""
        types = self.spec.link_types
        if out_type == in_type:
            return types[out_type]
        key = (out_type, in_type)
        combined = self._net_types.get(key)
        if combined is None:
            x, y = types[out_type], types[in_type]
            protocols = ()
            if x.calibrated or y.calibrated:
                protocols = tuple((p, _slower(x.cost(p), y.cost(p))) for p in PROTOCOLS)
            combined = self._net_types[key] = LinkType(f"{out_type}->{in_type}", max(x.alpha_us, y.alpha_us),
                                                       min(x.bw_GBps, y.bw_GBps), protocols)
        return combined

    def intra_node_links(self):
        """Every intra-node link of every node, in a deterministic order."""
        for node in range(self.nodes):
            base = node * self.gpus_per_node
            for (s, d) in sorted(self._intra_local):
                yield self.link(base + s, base + d)

    def describe(self) -> str:
        kinds = {}
        for (s, d), (kind, tname, _) in self._intra_local.items():
            kinds[(kind, tname)] = kinds.get((kind, tname), 0) + 1
        parts = [f"{self.name}: {self.nodes} node(s) x {self.gpus_per_node} GPUs = {self.num_ranks} ranks"]
        for (kind, tname), cnt in sorted(kinds.items()):
            lt = self.spec.link_types[tname]
            parts.append(f"  {cnt:4d} {kind} paths per node of type {tname} (alpha {lt.alpha_us} us, {lt.bw_GBps} GB/s)")
        for name, gpus, tname in self.spec.nics:
            lt = self.spec.link_types[tname]
            parts.append(f"  NIC {name}: GPUs {list(gpus)}, type {tname} (alpha {lt.alpha_us} us, {lt.bw_GBps} GB/s)")
        return "\n".join(parts)


def load_topology(name_or_path, nodes: int = 1, **kw) -> Topology:
    return Topology(load_spec(name_or_path, **kw), nodes)
