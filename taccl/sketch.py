"""Communication sketches: the user's hints that cut a logical topology out of the physical one.

The format is a superset of the reference TACCL format (paper Listing 1); its files load unchanged. Added:
`topology`, `nodes`, `collective`, `input_size` (so `taccl solve sketch.json` needs nothing else), `name`,
`routing` options (bounded non-minimal paths, which links may merge chunks) and `solver` defaults.
Schema: `taccl/schemas/sketch.schema.json`.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from .errors import UserError
from .fileio import load_json, validate
from .units import parse_size

DEFAULT_INPUT_SIZE = "1M"


@dataclass
class Sketch:
    name: str
    path: str | None
    topology: str | None = None
    nodes: int | None = None
    collective: str | None = None
    collective_root: int = 0
    collective_file: str | None = None
    input_size_bytes: int | None = None
    chunkup: int = 1
    protocol: str | None = None  # runtime protocol to synthesize and lower for (None: Simple)
    instances: int | None = None  # thread blocks per connection in the lowered program (None: 1)
    block_steps: int | None = None  # the lowering's first step cap per thread block (None: the executor's 64)
    allreduce_form: str = "reduce-broadcast"  # or "one-shot" (taccl.collectives.make_collective's `form`)
    intranode_strategy: str = "none"
    switches: list = field(default_factory=list)  # lists of local GPUs
    switch_policies: list = field(default_factory=list)  # per switch: "uc-min" | "uc-max" | "none"
    ring: list = field(default_factory=list)
    ring_forward_only: bool = False  # ring_direction "forward": each GPU sends only to the next in ring order
    internode_strategy: str = "relay"
    internode_conn: dict | None = None  # local src -> [local dst]; None = fully connected
    sender_map: dict | None = None  # relay local GPU -> local GPUs whose chunks it may send off-node
    chunk_to_relay_map: tuple | None = None
    beta_split: dict = field(default_factory=dict)  # local GPU -> n (uses 1/n of the NIC bandwidth)
    node_topology: str = "all"
    enforce_ordering: bool = False
    symmetry_offsets: list = field(default_factory=list)  # [(offset, group_size)]; group size 0: all ranks
    max_extra_hops: int | None = None
    merge_links: str = "internode"
    solver: str | None = None
    time_limit_s: float | None = None
    stall_s: float | None = None  # 0: no stall limit
    threads: int | None = None
    phases: list | dict | str = field(default_factory=list)  # as written (see taccl.phases)
    doc: dict = field(default_factory=dict)  # the document it was read from


def _int_keys(d: dict, path, where) -> dict:
    out = {}
    for k, v in d.items():
        out[int(k)] = v
    return out


def sketch_from_dict(doc: dict, *, path: str | None = None, name: str | None = None) -> Sketch:
    validate(doc, "sketch.schema.json", path=path)
    sk = Sketch(name=doc.get("name") or name or "sketch", path=path, doc=doc, phases=doc.get("phases", []))
    sk.topology = doc.get("topology")
    if "nodes" in doc and "nnodes" in doc and doc["nodes"] != doc["nnodes"]:
        raise UserError(f"nodes ({doc['nodes']}) and nnodes ({doc['nnodes']}) disagree", path=path, where="$.nodes")
    sk.nodes = doc.get("nodes", doc.get("nnodes"))
    coll = doc.get("collective")
    if isinstance(coll, dict):
        sk.collective, sk.collective_root, sk.collective_file = coll["name"], coll.get("root", 0), coll.get("file")
        if sk.collective_file and path and not Path(sk.collective_file).is_absolute():
            sk.collective_file = str(Path(path).parent / sk.collective_file)
    else:
        sk.collective = coll
    hp = doc.get("hyperparameters", {})
    size = doc.get("input_size", hp.get("input_size"))
    if "input_size" in doc and "input_size" in hp:  # two sizes: which one the user meant is unknowable
        raise UserError("the input size is given twice, also as $.input_size: keep one", path=path,
                        where="$.hyperparameters.input_size")
    if size is not None:
        where = "$.input_size" if "input_size" in doc else "$.hyperparameters.input_size"
        sk.input_size_bytes = parse_size(size, path=path, where=where)
        if sk.input_size_bytes <= 0:
            raise UserError("input size must be positive", path=path, where=where)
    sk.chunkup = hp.get("input_chunkup", 1)
    sk.protocol = hp.get("protocol")
    sk.instances = hp.get("instances")
    sk.block_steps = hp.get("block_steps")
    sk.allreduce_form = hp.get("allreduce", "reduce-broadcast")
    intra = doc.get("intranode_sketch", {"strategy": "none"})
    sk.intranode_strategy = intra["strategy"]
    if sk.intranode_strategy == "switch":
        if not intra.get("switches"):
            raise UserError("strategy 'switch' needs a non-empty 'switches' list", path=path, where="$.intranode_sketch.switches")
        sk.switches = [list(s) for s in intra["switches"]]
        pol = intra.get("switch_hyperedge_strategy", ["none"] * len(sk.switches))
        if isinstance(pol, str):
            pol = [pol] * len(sk.switches)
        if len(pol) == 1 and len(sk.switches) > 1:
            pol = pol * len(sk.switches)
        if len(pol) != len(sk.switches):
            raise UserError(f"{len(pol)} switch_hyperedge_strategy entries for {len(sk.switches)} switches",
                            path=path, where="$.intranode_sketch.switch_hyperedge_strategy")
        sk.switch_policies = list(pol)
    if "ring_direction" in intra and sk.intranode_strategy != "ring":
        raise UserError(f"ring_direction applies to strategy 'ring', not {sk.intranode_strategy!r}", path=path,
                        where="$.intranode_sketch.ring_direction")
    if sk.intranode_strategy == "ring":
        if not intra.get("ring"):
            raise UserError("strategy 'ring' needs the 'ring' order of local GPUs", path=path, where="$.intranode_sketch.ring")
        sk.ring = list(intra["ring"])
        sk.ring_forward_only = intra.get("ring_direction", "both") == "forward"
    inter = doc.get("internode_sketch", {"strategy": "relay"})
    sk.internode_strategy = inter["strategy"]
    conn = inter.get("internode_conn", "fully-connected")
    sk.internode_conn = None if conn == "fully-connected" else _int_keys(conn, path, "$.internode_sketch.internode_conn")
    if "gpus_to_sender_rev_map" in inter:
        sk.sender_map = _int_keys(inter["gpus_to_sender_rev_map"], path, "$.internode_sketch.gpus_to_sender_rev_map")
    if "chunk_to_relay_map" in inter:
        r1, r2 = inter["chunk_to_relay_map"]
        if r1 < 1 or r2 >= r1:
            raise UserError(f"chunk_to_relay_map [r1, r2] needs r1 >= 1 and 0 <= r2 < r1, got [{r1}, {r2}]",
                            path=path, where="$.internode_sketch.chunk_to_relay_map")
        sk.chunk_to_relay_map = (r1, r2)
    sk.beta_split = {int(k): float(v) for k, v in inter.get("beta_split", {}).items()}
    sk.node_topology = inter.get("node_topology", "all")
    sk.enforce_ordering = bool(inter.get("enforce_ordering", False))
    for i, so in enumerate(doc.get("symmetry_offsets", [])):
        o, g = so
        if g < 0:
            raise UserError(f"symmetry group size must be positive (or 0: all ranks), got {g}", path=path,
                            where=f"$.symmetry_offsets[{i}]")
        sk.symmetry_offsets.append((o, g))
    routing = doc.get("routing", {})
    sk.max_extra_hops = routing.get("max_extra_hops")
    sk.merge_links = routing.get("merge_links", "internode")
    solver = doc.get("solver", {})
    sk.solver, sk.time_limit_s, sk.threads = solver.get("name"), solver.get("time_limit_s"), solver.get("threads")
    sk.stall_s = solver.get("stall_s")
    return sk


def load_sketch(path) -> Sketch:
    p = Path(path)
    return sketch_from_dict(load_json(p), path=str(p), name=p.name.removesuffix(".json"))
