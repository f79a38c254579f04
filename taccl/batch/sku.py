"""SKU descriptions for `taccl batch`: what a new cluster type needs synthesized, as a YAML (or JSON) file.

    name: ndv2-2node
    topology: ndv2                  # built-in name, or a topology file relative to this file
    nodes: [2]
    collectives: [allgather, reducescatter, allreduce, alltoall]
    sizes: 1KiB:1GiB                # the grid every program is simulated on and selected over
    synthesis_sizes: [1M]           # input sizes the synthesizer optimises for (default [1M])
    time_limit_s: 30                # per MILP stage; solver, threads, seed as for `taccl solve`
    stall_s: 3                      # per MILP stage: stop once the best solution stalls this long (0: never)
    job_timeout_s: 900              # wall clock per synthesis job, lowering and simulation included
    merge_tolerance: 0.03           # a program within 3% of the fastest may keep a size: fewer windows
    candidates:
      - sketch: ../ndv2-sk-1.json   # relative to this file
        collectives: [allgather, reducescatter, allreduce]   # default: all of the SKU's
        variants: {chunkup: [1, 2], switch_policy: [uc-min], instances: [1, 2], protocol: [Simple, LL]}
        # fusion: [auto, network]   # lowering policies, one program each (default [auto]; see `taccl lower`)
    baselines: {protocol: [Simple, LL, LL128], emit: xml}     # names: default every applicable one
    targets: [msccl-executor, rccl, msccl-legacy]              # runtimes to write for (default the topology's:
                                                               # the executor, rccl on AMD GPUs)

`load_sku(path) -> Sku` reports every problem in the file at once (schema and meaning: unknown topology,
missing sketch, impossible node count, unknown collective...), each with its line and JSON path, before
any work starts. Schema: `taccl/schemas/sku.schema.json`.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from ..baselines import BASELINES
from ..collectives import NAMES, canonical_name
from ..errors import UserError
from ..fileio import json_path, load_json, load_schema, shortened, strict_validator
from ..lowering import max_tbs_of
from ..phases import highest_part
from ..sketch import sketch_from_dict
from ..synthesize import DEFAULT_STALL_S
from ..targets import ROOTED, default_target
from ..topology import TopologySpec, load_spec
from ..units import parse_size, parse_size_range

DEFAULT_GRID = "1KiB:1GiB"
DEFAULT_SYNTHESIS_SIZES = ("1M",)
DEFAULT_TIME_LIMIT_S = 60.0
DEFAULT_PROTOCOLS = ("Simple", "LL", "LL128")


@dataclass(frozen=True)
class Candidate:
    """One candidate sketch and the variants generated from it."""

    name: str
    sketch_path: str
    sketch_doc: dict = field(hash=False, compare=False)
    collectives: tuple
    nodes: tuple
    synthesis_sizes: tuple
    chunkups: tuple = (None,)  # None: the sketch's own
    switch_policies: tuple = (None,)
    instances: tuple = (1,)
    protocols: tuple = ("Simple",)
    fusions: tuple = ("auto",)  # lowering policies (`taccl.lowering.FUSION_POLICIES`), one program each


@dataclass
class Sku:
    name: str
    path: str
    topology: str  # built-in name or absolute path, as load_spec takes it
    spec: TopologySpec
    nodes: tuple
    collectives: tuple
    grid: tuple  # sizes in bytes, ascending
    candidates: list
    solver: str = "highs"
    time_limit_s: float = DEFAULT_TIME_LIMIT_S
    stall_s: float = DEFAULT_STALL_S
    threads: int = 1
    seed: int = 0
    job_timeout_s: float = 0.0
    max_tbs: int = 108
    baseline_names: tuple = tuple(BASELINES)
    baseline_protocols: tuple = DEFAULT_PROTOCOLS
    baseline_instances: tuple = (1,)
    emit_baselines: bool = True  # write baseline programs for the windows they win (else leave them to NCCL)
    merge_tolerance: float = 0.0  # a program within this fraction of the fastest may keep a size (fewer windows)
    targets: tuple = ("msccl-executor",)  # runtimes the programs are written for (`taccl.targets`)


class _Problems:
    """Collects every problem with the line it comes from, then raises them together."""

    def __init__(self, path: str, lines: dict):
        self.path, self.lines, self.items = path, lines, []

    def add(self, parts, message: str) -> None:
        parts = tuple(parts)
        line = None
        for k in range(len(parts), -1, -1):  # the nearest enclosing place that has a line
            line = self.lines.get(parts[:k])
            if line is not None:
                break
        at = f"line {line}: " if line else ""
        self.items.append((line or 0, f"{at}{json_path(parts)}: {message}"))

    def raise_if_any(self) -> None:
        if self.items:
            n = len(self.items)
            lines = "\n".join(f"  - {p}" for _, p in sorted(self.items, key=lambda item: item[0]))
            raise UserError(f"{n} problem{'s' if n > 1 else ''} in the SKU file:\n{lines}", path=self.path)


def _line_map(node, parts=(), out=None) -> dict:
    """JSON path (as a tuple) -> 1-based line, from PyYAML's node tree."""
    out = {} if out is None else out
    out[parts] = node.start_mark.line + 1
    if isinstance(node, yaml.MappingNode):
        for k, v in node.value:
            _line_map(v, parts + (k.value,), out)
    elif isinstance(node, yaml.SequenceNode):
        for i, v in enumerate(node.value):
            _line_map(v, parts + (i,), out)
    return out


def _parse(path: Path):
    try:
        text = path.read_text()
    except OSError as exc:
        raise UserError(f"cannot read the SKU file: {exc.strerror}", path=str(path)) from None
    except UnicodeDecodeError as exc:
        raise UserError(f"not a SKU file: not UTF-8 text (byte {exc.start})", path=str(path)) from None
    try:
        node = yaml.compose(text, Loader=yaml.SafeLoader)
        doc = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1} column {mark.column + 1}" if mark else None
        raise UserError(f"invalid YAML: {getattr(exc, 'problem', None) or exc}", path=str(path), where=where) from None
    if not isinstance(doc, dict):
        raise UserError("expected a mapping (topology, nodes, collectives, candidates, ...) at the top", path=str(path))
    repeat = _repeated_key(node)
    if repeat:  # YAML keeps the last silently: the file would not say what runs
        key, first, again = repeat
        raise UserError(f"key {key!r} given twice (lines {first} and {again}); expected each key once",
                        path=str(path), where=f"line {again}")
    return doc, _line_map(node) if node is not None else {}


def _repeated_key(node):
    """(key, first line, repeat's line) of the first key a mapping of the YAML node tree repeats, or None."""
    if isinstance(node, yaml.MappingNode):
        seen = {}
        for k, v in node.value:
            if isinstance(k, yaml.ScalarNode) and k.value in seen:
                return k.value, seen[k.value], k.start_mark.line + 1
            seen[getattr(k, "value", None)] = k.start_mark.line + 1
            found = _repeated_key(v)
            if found:
                return found
    elif isinstance(node, yaml.SequenceNode):
        for v in node.value:
            found = _repeated_key(v)
            if found:
                return found
    return None


def _canon_collective(name: str):
    c = canonical_name(name)
    return c if c in NAMES else None


def _sizes(value, problems, parts):
    try:
        if isinstance(value, list):
            sizes = tuple(parse_size(v) for _, v in _items(value))
            if 0 in sizes:
                raise UserError("sizes: a size must be at least one byte, got 0")
            return sizes
        return tuple(parse_size_range(value, where="sizes"))
    except UserError as exc:
        problems.add(parts, str(exc).removeprefix("sizes: "))
        return ()


_BAD = object()  # stands for a value the schema rejected (already reported), keeping list indices


def _drop(doc, parts) -> None:
    """Take out the value at `parts` so the checks of meaning skip it instead of tripping over it."""
    parent = doc
    for p in parts[:-1]:
        try:
            parent = parent[p]
        except (KeyError, IndexError, TypeError):
            return
    if isinstance(parent, dict):
        parent.pop(parts[-1], None)
    elif isinstance(parent, list) and isinstance(parts[-1], int) and parts[-1] < len(parent):
        parent[parts[-1]] = _BAD


def _schema_problems(doc, problems: _Problems) -> None:
    import jsonschema

    # YAML's .nan and .inf: NaN passes every bound of the schema. Reported once each, not again by the
    # schema at the value or by an alternative of the list or mapping that holds it
    bad = _non_finite(doc)
    for parts in bad:
        problems.add(parts, "not a finite number")

    def about_bad(err) -> bool:
        at = tuple(err.absolute_path)
        return any(at[:len(b)] == b or (err.validator in ("anyOf", "oneOf") and b[:len(at)] == at) for b in bad)

    validator = strict_validator(jsonschema.Draft7Validator)(load_schema("sku.schema.json"))
    errors = sorted((e for e in validator.iter_errors(doc) if not about_bad(e)),
                    key=lambda e: [str(p) for p in e.absolute_path])
    for err in errors:
        parts = tuple(err.absolute_path)
        if err.validator == "additionalProperties" and isinstance(err.instance, dict):
            for key in sorted(set(err.instance) - set(err.schema.get("properties", {}))):
                problems.add(parts + (key,), f"unknown key {key!r}; expected one of "
                                             f"{', '.join(sorted(err.schema.get('properties', {})))}")
            continue
        problems.add(parts, shortened(err.message))
    for err in errors:
        if err.absolute_path and err.validator != "additionalProperties":
            _drop(doc, tuple(err.absolute_path))
    for parts in bad:
        _drop(doc, parts)


def _non_finite(node, parts=()) -> list:
    """JSON paths (tuples) of the NaN and infinite numbers in a parsed document."""
    if isinstance(node, float) and not math.isfinite(node):
        return [parts]
    if isinstance(node, dict):
        return [p for k, v in node.items() for p in _non_finite(v, parts + (k,))]
    if isinstance(node, list):
        return [p for i, v in enumerate(node) for p in _non_finite(v, parts + (i,))]
    return []


def _items(value) -> list:
    """(index, item) of a list, skipping what the schema rejected."""
    return [(i, v) for i, v in enumerate(value) if v is not _BAD] if isinstance(value, list) else []


def load_sku(path) -> Sku:
    path = Path(path)
    doc, lines = _parse(path)
    problems = _Problems(str(path), lines)
    _schema_problems(doc, problems)  # every problem is listed: meaning is checked on what the schema let through

    base = path.parent
    spec = topology = None
    if isinstance(doc.get("topology"), str):
        topology = doc["topology"]
        if (base / topology).is_file():
            topology = str((base / topology).resolve())
        try:
            spec = load_spec(topology, source=str(path))
        except UserError as exc:
            problems.add(("topology",), str(exc).split(": ", 1)[-1])

    nodes = tuple(n for _, n in _items(doc.get("nodes")))
    seen = set()
    for i, n in _items(doc.get("nodes")):
        if n in seen:
            problems.add(("nodes", i), f"{n} is listed already: each of its jobs would run twice")
        seen.add(n)
    if spec is not None:
        for i, n in _items(doc.get("nodes")):
            if n > 1 and not spec.nics:
                problems.add(("nodes", i), f"topology {spec.name!r} has no NICs, so it cannot span {n} nodes")
            if spec.max_nodes is not None and n > spec.max_nodes:
                problems.add(("nodes", i), f"topology {spec.name!r} supports at most {spec.max_nodes} node(s)")
            if n * spec.gpus_per_node < 2:
                problems.add(("nodes", i), "a collective needs at least 2 ranks")

    collectives = []
    for i, c in _items(doc.get("collectives")):
        canon = _canon_collective(c)
        if canon is None:
            problems.add(("collectives", i), f"unknown collective {c!r}; known: {', '.join(NAMES)}")
        elif canon in ROOTED:
            problems.add(("collectives", i), f"{canon}: no MSCCL runtime reads root, so a program written for one "
                                             f"root would also run the calls of every other root, wrongly; "
                                             f"synthesize it with `taccl solve` for taccl's runtime, which matches "
                                             f"the root")
        elif canon not in collectives:
            collectives.append(canon)
        else:
            problems.add(("collectives", i), f"{c!r} is listed already ({canon}): each of its jobs would run twice")

    grid = tuple(sorted(set(_sizes(doc.get("sizes", DEFAULT_GRID), problems, ("sizes",)))))
    if any(s <= 0 for s in grid):
        problems.add(("sizes",), "sizes must be positive")
    default_synth = _sizes(doc.get("synthesis_sizes", list(DEFAULT_SYNTHESIS_SIZES)), problems, ("synthesis_sizes",))

    candidates, names = [], set()
    for i, cdoc in _items(doc.get("candidates")):
        cand = _candidate(cdoc, i, base, problems, collectives, nodes, default_synth, spec)
        if cand is None:
            continue
        if cand.name in names:
            problems.add(("candidates", i, "name"), f"two candidates are named {cand.name!r}; give one a `name`")
        names.add(cand.name)
        candidates.append(cand)

    bdoc = doc.get("baselines", {})
    bnames = tuple(b for _, b in _items(bdoc.get("names", list(BASELINES))))
    for i, b in _items(bdoc.get("names")):
        if b not in BASELINES:
            problems.add(("baselines", "names", i), f"unknown baseline {b!r}; known: {', '.join(BASELINES)}")
    problems.raise_if_any()

    time_limit = float(doc.get("time_limit_s", DEFAULT_TIME_LIMIT_S))
    return Sku(name=doc.get("name") or path.stem, path=str(path), topology=topology, spec=spec, nodes=nodes,
               collectives=tuple(collectives), grid=grid, candidates=candidates, solver=doc.get("solver", "highs"),
               time_limit_s=time_limit, stall_s=float(doc.get("stall_s", DEFAULT_STALL_S)),
               threads=int(doc.get("threads", 1)), seed=int(doc.get("seed", 0)),
               # three MILP stages, plus lowering, checking and simulation
               job_timeout_s=float(doc.get("job_timeout_s", 4 * time_limit + 300)),
               max_tbs=int(doc.get("max_tbs", max_tbs_of(spec))), baseline_names=bnames,
               baseline_protocols=tuple(bdoc.get("protocol", DEFAULT_PROTOCOLS)),
               baseline_instances=tuple(bdoc.get("instances", (1,))), emit_baselines=bdoc.get("emit", "xml") == "xml",
               merge_tolerance=float(doc.get("merge_tolerance", 0.0)),
               targets=tuple(doc.get("targets", (default_target(spec),))))


def _misfit(sketch, spec, nodes: int, collective: str) -> str | None:
    """Why the sketch cannot be used on `nodes` nodes of `spec` (relay GPUs, switches, symmetry), or None."""
    from ..budget import check_shape_memory
    from ..synthesize import build_problems, sketch_collective
    from ..topology import Topology

    try:
        topo = Topology(spec, nodes)
    except UserError as exc:
        return str(exc)
    try:  # the check builds the collective: not where that alone would exhaust this machine's memory
        check_shape_memory(collective, topo.num_ranks, sketch.chunkup, None, form=sketch.allreduce_form)
    except UserError:
        return None  # its jobs say so when they run, on this machine (a Ray cluster's may be larger)
    try:
        coll = sketch_collective(sketch, collective, topo)
        build_problems(sketch, topo, coll, 1 << 20)
    except UserError as exc:
        return str(exc)
    return None


def _candidate(cdoc, i, base: Path, problems: _Problems, collectives, nodes, default_synth, spec):
    at = ("candidates", i)
    if not isinstance(cdoc, dict) or "sketch" not in cdoc:
        return None  # reported by the schema
    sketch_path = base / cdoc["sketch"]
    sketch = doc = None
    if sketch_path.is_dir():
        problems.add(at + ("sketch",), f"{sketch_path} is a directory, expected a sketch file")
    elif not sketch_path.is_file():
        problems.add(at + ("sketch",), f"no such sketch file: {sketch_path}")
    else:
        try:
            doc = load_json(sketch_path)
            sketch = sketch_from_dict(doc, path=str(sketch_path))
        except UserError as exc:
            problems.add(at + ("sketch",), f"sketch does not load: {exc}")
    colls = []
    for j, c in _items(cdoc.get("collectives", list(collectives))):
        canon = _canon_collective(c)
        if canon is None:
            problems.add(at + ("collectives", j), f"unknown collective {c!r}; known: {', '.join(NAMES)}")
        elif canon not in collectives:
            problems.add(at + ("collectives", j), f"{canon!r} is not one of the SKU's collectives ({', '.join(collectives)})")
        else:
            colls.append(canon)
    cnodes = tuple(n for _, n in _items(cdoc.get("nodes", list(nodes))))
    for j, n in _items(cdoc.get("nodes")):
        if n not in nodes:
            problems.add(at + ("nodes", j), f"{n} is not one of the SKU's node counts {list(nodes)}")
    variants = cdoc.get("variants", {})
    policies = tuple(variants.get("switch_policy", (None,)))
    if sketch is not None and policies != (None,) and not sketch.switches:
        problems.add(at + ("variants", "switch_policy"),
                     "the sketch has no switches (intranode_sketch.switches), so a switch policy means nothing")
    named = highest_part(sketch.phases) if sketch is not None else -1
    for j, chunkup in _items(variants.get("chunkup")):
        if chunkup <= named:
            problems.add(at + ("variants", "chunkup", j),
                         f"chunk-up {chunkup} cuts each chunk into {chunkup} pieces, but the sketch's phases name "
                         f"piece {named} (parts)")
    synth = default_synth
    if "synthesis_sizes" in cdoc:
        synth = _sizes(cdoc["synthesis_sizes"], problems, at + ("synthesis_sizes",))
    if sketch is None:
        return None
    if spec is not None and colls:
        for j, n in _items(cdoc.get("nodes", list(cnodes))):
            for c in colls if sketch.phases else colls[:1]:  # phases differ by collective
                why = _misfit(sketch, spec, n, c)
                if why:
                    problems.add(at + ("sketch",), f"does not fit {spec.name} x{n} ({c}): {why}")
                    break
    name = cdoc.get("name") or sketch_path.name.removesuffix(".json")
    return Candidate(name=name, sketch_path=str(sketch_path.resolve()), sketch_doc=doc,
                     collectives=tuple(colls), nodes=cnodes, synthesis_sizes=tuple(synth),
                     chunkups=tuple(variants.get("chunkup", (None,))), switch_policies=policies,
                     instances=tuple(variants.get("instances", (1,))),
                     protocols=tuple(variants.get("protocol", ("Simple",))),
                     fusions=tuple(variants.get("fusion", ("auto",))))
