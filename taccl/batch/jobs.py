"""The work of a batch: plan it from a SKU, key every result by the hash of its inputs, and run one task.

Three kinds of result, each stored under its own key (`taccl.batch.cache`):

    synthesis   sketch variant (protocol and instance count included: they set the link costs) + topology +
                nodes + collective + input size + solver settings -> Algorithm
    program     a synthesis (or a baseline) lowered with its protocol and instance count, proven -> XML
    simulation  a program simulated on the SKU's size grid -> time and algbw per size

A key hashes everything the result depends on, the tool's version and a digest of its source included, so
a rerun reuses exactly what is still valid and a changed input or a new release recomputes. A `Task` is
what one worker runs: one synthesis and all its lowerings and simulations, or one baseline in all its
variants. `execute(task, emit)` calls `emit(record)` as each result is ready, so a worker killed half-way
keeps what it finished.
"""
from __future__ import annotations

import copy
import hashlib
import json
import re
import time
import traceback
from dataclasses import asdict, dataclass, field
from functools import lru_cache
from importlib import metadata
from pathlib import Path

from .. import __version__
from ..errors import TacclError
from ..targets import DEFAULT_TARGET, get_target, lowered_for
from ..units import format_size
from .sku import Sku

CACHE_FORMAT = 1
# the label suffixes of a synthesis lowered by "auto" with each connection spread over at most 1 or 2 thread
# blocks (`lower(max_connection_blocks=...)`): "auto" spreads connections over two or four blocks where that is
# faster at the input size and loses less at 4x it, and the spread program can lose further up, where the
# batch's windows may still run it (2x DGX H100 AllReduce synthesized at 64 KiB: two blocks faster at 64 and
# 256 KiB, 2.9% slower at 1 MiB; 16x DGX H100 AllToAll at 64 KiB: four blocks 32% faster there, 1.5% slower
# than two at 16 MiB). Through the synthesis' `LoweringMemo` they cost only their simulation, and none where
# they are the "auto" program itself
CAPPED_BLOCKS = ((1, "+one-block"), (2, "+two-block"))
# `plan` traces each baseline to see that the topology has its links (a 128-rank ring AllReduce: 260 k
# operations, 3 s); past this many its task finds out instead (a 512-rank ring: 2 M, tens of seconds and GBs)
PLAN_TRACE_MAX_OPS = 300_000


@lru_cache(maxsize=None)
def tool_version() -> str:
    """The release plus a digest of the package's Python sources: edited code never reuses stale results."""
    root = Path(__file__).resolve().parent.parent
    h = hashlib.sha256()
    for p in sorted(root.rglob("*.py")) + sorted(root.rglob("*.json")):
        h.update(str(p.relative_to(root)).encode())
        h.update(p.read_bytes())
    return f"{__version__}+{h.hexdigest()[:12]}"


def _package_version(solver: str) -> str:
    dist = {"highs": "highspy", "gurobi": "gurobipy", "cbc": "PuLP"}.get(solver, solver)
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return "absent"


def digest(inputs: dict) -> str:
    text = json.dumps({"format": CACHE_FORMAT, "tool": tool_version(), **inputs}, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()


@dataclass
class ProgramJob:
    """One program that competes in the selection: a lowering of a synthesis, or a baseline variant."""

    key: str
    sim_key: str
    label: str  # unique within (collective, nodes), used in tables, plots and file names
    kind: str  # "synthesized" | "baseline"
    source: str  # candidate or baseline name
    proto: str
    instances: int
    fusion: str = "auto"  # synthesized programs: the lowering policy (`taccl.lowering.FUSION_POLICIES`)
    target: str = "msccl-executor"  # the lowering's target (`taccl.targets.lowered_for`)
    max_connection_blocks: int | None = None  # synthesized programs: `lower`'s (None: its own choice)


@dataclass
class Task:
    kind: str  # "synthesis" | "baseline"
    key: str  # the synthesis key, or the baseline's own
    label: str
    collective: str
    nodes: int
    topology: str
    grid: tuple
    programs: list
    max_tbs: int = 108
    # synthesis
    sketch_path: str | None = None
    sketch_doc: dict | None = None
    size_bytes: int = 0
    solver: dict = field(default_factory=dict)
    # baseline
    baseline: str | None = None
    max_memory_bytes: int | None = None  # a synthesis' memory budget (`taccl.budget`; None: the machine's)
    max_memory_source: str = ""  # where that budget comes from
    # filled by the scheduler from the cache, so a worker never needs to read it
    done: set = field(default_factory=set)
    cached: dict = field(default_factory=dict)

    def keys(self) -> list:
        out = [self.key] if self.kind == "synthesis" else []
        for p in self.programs:
            out += [p.key, p.sim_key]
        return out


def job_failed(task: Task, get) -> bool:
    """Whether a job left no program that can compete: its synthesis failed, or every program of it failed to be
    lowered or simulated (`get`: key -> record or None). The one definition of a failed job for the progress
    lines, the summary, selection.json and the report."""
    def ok(key) -> bool:
        record = get(key)
        return record is not None and record.get("status") == "ok"

    if task.kind == "synthesis" and not ok(task.key):
        return True
    return not any(ok(p.key) and ok(p.sim_key) for p in task.programs)


def _variant_doc(doc: dict, chunkup, policy, proto=None, instances=None) -> dict:
    doc = copy.deepcopy(doc)
    hp = doc.setdefault("hyperparameters", {})
    if chunkup is not None:
        hp["input_chunkup"] = chunkup
    if proto is not None:  # the synthesizer costs links for the protocol and instance count it lowers with
        hp["protocol"] = proto
    if instances is not None:
        hp["instances"] = instances
    if policy is not None:
        intra = doc.setdefault("intranode_sketch", {})
        intra["switch_hyperedge_strategy"] = [policy] * len(intra.get("switches", []))
    return doc


def plan(sku: Sku) -> list:
    """Every task of the SKU, in a deterministic order (candidates first: they take longest)."""
    from ..simulator import SimOptions
    from ..topology import structure_digest

    topo_fp = hashlib.sha256(json.dumps(sku.spec.raw, sort_keys=True).encode()).hexdigest()
    # a baseline's program depends on the topology's structure only: a degraded NIC reuses it (issue 13)
    structure_fp = structure_digest(sku.spec)
    sim_opts = asdict(SimOptions())
    solver = {"name": sku.solver, "version": _package_version(sku.solver), "time_limit_s": sku.time_limit_s,
              "stall_s": sku.stall_s, "threads": sku.threads, "seed": sku.seed}
    grid = list(sku.grid)

    def program(key, label, kind, source, proto, inst, nodes, fusion="auto", target=DEFAULT_TARGET,
                max_connection_blocks=None):
        sim_key = digest({"kind": "simulation", "program": key, "topology": topo_fp, "nodes": nodes, "sizes": grid,
                          "options": sim_opts})
        return ProgramJob(key=key, sim_key=sim_key, label=label, kind=kind, source=source, proto=proto, instances=inst,
                          fusion=fusion, target=target, max_connection_blocks=max_connection_blocks)

    # a synthesis is lowered once per distinct lowering target (RCCL's has no fused steps; legacy runs the
    # executor's); the executor's keys and labels are those of a SKU without targets, so its cache stays valid
    lowerings = sorted({lowered_for(get_target(t)) for t in sku.targets}, key=lambda t: t != DEFAULT_TARGET)

    def targeted(pdoc: dict, label: str, target: str) -> tuple:
        if target == DEFAULT_TARGET:
            return digest(pdoc), label
        return digest({**pdoc, "target": target}), f"{label}+{target}"

    tasks = []
    for n in sku.nodes:
        for coll in sku.collectives:
            for cand in sku.candidates:
                if coll not in cand.collectives or n not in cand.nodes:
                    continue
                for size in cand.synthesis_sizes:
                    for chunkup in cand.chunkups:
                        for policy in cand.switch_policies:
                            for proto in [p for p in cand.protocols if p in sku.spec.protocols]:
                                for inst in cand.instances:
                                    # one synthesis per protocol and instance count: the link costs differ
                                    doc = _variant_doc(cand.sketch_doc, chunkup, policy, proto, inst)
                                    label = (cand.name + (f".c{chunkup}" if chunkup else "") +
                                             (f".{policy}" if policy else "") + f"@{format_size(size)}")
                                    key = digest({"kind": "synthesis", "sketch": doc, "topology": topo_fp, "nodes": n,
                                                  "collective": coll, "size": size, "solver": solver})
                                    plabel = f"{label}/{proto}" + (f".i{inst}" if inst > 1 else "")
                                    progs = []
                                    for target in lowerings:
                                        fusions = cand.fusions if get_target(target).fused_steps else ("auto",)
                                        for fusion in fusions:
                                            if fusion == "network" and n == 1:
                                                continue  # no send leaves the node
                                            pdoc = {"kind": "program", "synthesis": key, "proto": proto,
                                                    "instances": inst, "max_tbs": sku.max_tbs}
                                            if fusion != "auto":  # (the default keeps the keys cached before)
                                                pdoc["fusion"] = fusion
                                            pkey, lab = targeted(pdoc, plabel + ("" if fusion == "auto" else
                                                                                 f"+{fusion}"), target)
                                            progs.append(program(pkey, lab, "synthesized", cand.name, proto, inst, n,
                                                                 fusion, target))
                                            if fusion == "auto" and get_target(target).fused_steps:
                                                # and with connections spread over fewer blocks (CAPPED_BLOCKS)
                                                for blocks, suffix in CAPPED_BLOCKS:
                                                    pkey, lab = targeted({**pdoc, "max_connection_blocks": blocks},
                                                                         plabel + suffix, target)
                                                    progs.append(program(pkey, lab, "synthesized", cand.name, proto,
                                                                         inst, n, fusion, target, blocks))
                                    tasks.append(Task(kind="synthesis", key=key, label=plabel, collective=coll,
                                                      nodes=n, topology=sku.topology, grid=sku.grid, programs=progs,
                                                      max_tbs=sku.max_tbs, sketch_path=cand.sketch_path,
                                                      sketch_doc=doc, size_bytes=size, solver=solver))
    from ..baselines import BASELINES, applicable, nccl_channel_instances, operations
    from ..topology import Topology

    for n in sku.nodes:
        topo = Topology(sku.spec, n)
        for coll in sku.collectives:
            for name in sku.baseline_names:
                if coll not in BASELINES[name]:
                    continue  # a baseline for another collective
                if operations(name, topo, coll) <= PLAN_TRACE_MAX_OPS and not applicable(name, topo, coll):
                    continue  # one needing links this topology lacks (a larger one finds out in its task)
                # baselines stand for the runtime's own (NCCL's, RCCL's) algorithms, which fuse their steps
                # whatever the target: lowered once, for the executor (a window they win gets no file elsewhere)
                progs = []
                instances = baseline_instances(sku.baseline_instances, nccl_channel_instances(name, topo))
                for proto in [p for p in sku.baseline_protocols if p in sku.spec.protocols]:
                    for inst in instances:
                        pkey = digest({"kind": "program", "baseline": name, "structure": structure_fp, "nodes": n,
                                       "collective": coll, "proto": proto, "instances": inst, "max_tbs": sku.max_tbs})
                        plabel = f"{name}/{proto}" + (f".i{inst}" if inst > 1 else "")
                        progs.append(program(pkey, plabel, "baseline", name, proto, inst, n))
                key = digest({"kind": "baseline", "programs": [p.key for p in progs]})
                tasks.append(Task(kind="baseline", key=key, label=f"{name} {coll} x{n}", collective=coll, nodes=n,
                                  topology=sku.topology, grid=sku.grid, programs=progs, max_tbs=sku.max_tbs,
                                  baseline=name))
    return tasks


def baseline_instances(configured, full: int | None) -> tuple:
    """The instance counts a baseline is built with: the configured ones, and for a ring or tree on one node also
    `full`, the count that puts it on all of NCCL's 32 channels (`baselines.nccl_channel_instances`), where none
    of the configured ones reaches them: the bar must include what NCCL runs at large sizes."""
    configured = tuple(configured)
    if full is None or max(configured) >= full:
        return configured
    return configured + (full,)


def _body_digest(xml: str) -> str:
    """A program's digest without its <algo> line (name, window and call kinds are set when it is written) but
    with its protocol, which that line holds too: the same steps in another protocol simulate otherwise."""
    head, _, body = xml.partition("\n")
    proto = re.search(r' proto="([^"]*)"', head)
    return hashlib.sha256(f"{proto.group(1) if proto else ''}\n{body}".encode()).hexdigest()


def _unnamed_digest(xml: str) -> str:
    """A program's digest without its name: two programs that differ only in it simulate alike (a protocol, in
    the <algo> line too, does not)."""
    return hashlib.sha256(re.sub(r' name="[^"]*"', "", xml, count=1).encode()).hexdigest()


def deployed(sku: Sku, outdir: Path, tasks: list, store, target: str) -> tuple:
    """The programs a previous run of this batch wrote into `outdir` (for `target`) where a synthesized
    candidate won, that none of this run's programs repeats: ({(collective, nodes): [ProgramJob]}, {key:
    record}), their program and simulation records made here (on the SKU's topology as it is now) and kept
    out of the cache. They compete with this run's programs, so a rerun after the topology changed (a
    degraded NIC: `benchmarks/degraded_nic.py`) never replaces a window's program by a slower one: fresh
    syntheses for the new costs are heuristic and may do worse where the old program still does well.
    Files that no longer parse or simulate (another structure) are left out."""
    from ..simulator import Simulator
    from ..topology import Topology
    from ..xmlio import parse_xml

    previous = outdir / "selection.json"
    if not previous.is_file():
        return {}, {}
    try:
        doc = json.loads(previous.read_text())
    except (OSError, ValueError):
        return {}, {}
    fresh = set()  # this run's programs, by body, per group
    for t in tasks:
        for p in t.programs:
            rec = store.get(p.key)
            if rec and rec.get("status") == "ok" and t.kind == "synthesis":
                fresh.add((t.collective, t.nodes, _body_digest(rec["xml"])))
    out, records = {}, {}
    for g in doc.get("groups", []):
        if g.get("collective") not in sku.collectives or g.get("nodes") not in sku.nodes:
            continue
        for w in g.get("windows", []):
            if w.get("kind") != "synthesized" or not w.get("file"):
                continue
            try:
                text = (outdir / w["file"]).read_text()
            except (OSError, UnicodeDecodeError):
                continue
            body = _body_digest(text)
            key = digest({"kind": "deployed", "program": body})
            if (g["collective"], g["nodes"], body) in fresh or key in records:
                continue
            label = f"deployed:{w['winner'].removeprefix('deployed:')}"
            try:
                program = parse_xml(text).program
                sim = Simulator(program, Topology(sku.spec, g["nodes"]))
                results = [sim.run(s) for s in sku.grid]
            except Exception:  # another structure, a file edited by hand: it simply does not compete
                continue
            records[key] = {"key": key, "kind": "program", "status": "ok", "label": label, "xml": text}
            records[key + ".sim"] = _simulation_record(key + ".sim", label, results)
            out.setdefault((g["collective"], g["nodes"]), []).append(ProgramJob(
                key=key, sim_key=key + ".sim", label=label, kind="synthesized", source="deployed",
                proto=str(program.proto), instances=1, target=lowered_for(get_target(target))))
    return out, records


class WithRecords:
    """A store that also answers from `records` (kept in memory, never written)."""

    def __init__(self, store, records: dict):
        self.store, self.records = store, records

    def get(self, key: str):
        return self.records.get(key) or self.store.get(key)


# ------------------------------------------------------------------------------------------------------
# Running one task (in a worker process, a Ray worker, or inline)

def failure(key: str, kind: str, reason: str, **extra) -> dict:
    return {"key": key, "kind": kind, "status": "failed", "reason": reason, **extra}


def _reason(exc: BaseException) -> tuple:
    """(one-line reason, traceback or None): user-facing errors are expected, anything else is a bug."""
    if isinstance(exc, TacclError):
        return str(exc).strip(), None
    return f"internal error: {type(exc).__name__}: {exc}", traceback.format_exc()


def execute(task: Task, emit) -> None:
    """Compute every result of `task` not in `task.done`; `emit(record)` each one as soon as it exists."""
    from ..topology import Topology, load_spec

    topo = Topology(load_spec(task.topology), task.nodes)
    algo = task.cached.get(task.key)
    if task.kind == "synthesis" and task.key not in task.done:
        record = _synthesize(task)
        emit(record)
        algo = record
    # what the task's programs share: a baseline's programs by instance count (see `_baseline_program`), a
    # synthesis' Algorithm and its `LoweringMemo`
    built = {}
    simulated = {}  # `_unnamed_digest` of a program -> its simulation here: a program twice is simulated once
    for prog in task.programs:
        xml = task.cached.get(prog.key)
        program = None  # the Program just lowered, simulated as it is rather than parsed back from its XML
        if prog.key not in task.done:
            if task.kind == "synthesis" and (algo is None or algo["status"] != "ok"):
                why = algo["reason"] if algo else "no synthesis"
                xml = failure(prog.key, "program", f"synthesis failed: {why}", label=prog.label)
            else:
                xml, program = _lower(task, prog, algo, topo, built)
            emit(xml)
        if prog.sim_key not in task.done:
            if xml is None or xml["status"] != "ok":
                emit(failure(prog.sim_key, "simulation", xml["reason"] if xml else "no program", label=prog.label))
                continue
            content = _unnamed_digest(xml["xml"])
            if content in simulated:  # (its result, times or failure, is the other program's)
                emit({**simulated[content], "key": prog.sim_key, "label": prog.label, "time_s": 0.0})
            else:
                simulated[content] = _simulate(task, prog, xml, topo, program)
                emit(simulated[content])


def _synthesize(task: Task) -> dict:
    from ..sketch import sketch_from_dict
    from ..synthesize import SynthesisOptions, synthesize

    t0 = time.monotonic()
    s = task.solver
    try:
        sketch = sketch_from_dict(task.sketch_doc, path=task.sketch_path)
        algo = synthesize(sketch, topology=task.topology, nodes=task.nodes, collective=task.collective,
                          input_size=str(task.size_bytes),
                          name=task.label.replace("@", "-").replace("/", "-"),
                          options=SynthesisOptions(solver=s["name"], time_limit_s=s["time_limit_s"],
                                                   stall_s=s["stall_s"], threads=s["threads"], seed=s["seed"],
                                                   max_memory_bytes=task.max_memory_bytes,
                                                   max_memory_source=task.max_memory_source))
    except Exception as exc:  # a failed job is a result too: reported, and the others go on
        reason, tb = _reason(exc)
        return failure(task.key, "synthesis", reason, label=task.label, traceback=tb,
                       time_s=round(time.monotonic() - t0, 3))
    return {"key": task.key, "kind": "synthesis", "status": "ok", "label": task.label,
            "time_s": round(time.monotonic() - t0, 3), "predicted_us": algo.time_us,
            "lower_bound_us": algo.lower_bound_us, "stages": algo.stages, "notes": algo.notes,
            "algorithm": algo.to_json()}


def _lower(task: Task, prog: ProgramJob, algo_record, topo, built: dict) -> tuple:
    """(the program's record, the Program or None when it failed)."""
    from ..algorithm import Algorithm
    from ..xmlio import program_to_xml

    t0 = time.monotonic()
    try:
        if task.kind == "synthesis":
            from ..lowering import LoweringMemo, lower

            if "algorithm" not in built:  # parsed once: the memo serves one Algorithm object
                built["algorithm"] = Algorithm.from_json(algo_record["algorithm"])
                built["memo"] = LoweringMemo()
            algo = built["algorithm"]
            # the algorithm's own instance count is left to `lower`, which halves it if the blocks do not fit
            program = lower(algo, instances=None if prog.instances == algo.instances else prog.instances,
                            proto=prog.proto, max_tbs=task.max_tbs, name=prog.label, topology=topo,
                            fusion=prog.fusion, max_connection_blocks=prog.max_connection_blocks,
                            target=prog.target, memo=built["memo"])
        else:
            program = _baseline_program(task, prog, topo, built)
            program.name = prog.label
    except Exception as exc:
        reason, tb = _reason(exc)
        return failure(prog.key, "program", reason, label=prog.label, traceback=tb), None
    return {"key": prog.key, "kind": "program", "status": "ok", "label": prog.label,
            "time_s": round(time.monotonic() - t0, 3), "nchannels": program.nchannels,
            "threadblocks": program.max_threadblocks, "steps": program.nsteps,
            "max_steps": program.max_steps, "max_nodes": program.max_nodes,
            "xml": program_to_xml(program)}, program


def _baseline_program(task: Task, prog: ProgramJob, topo, built: dict):
    """The baseline variant `prog`. The first variant of an instance count builds that count's programs for
    every protocol still to do at once (one trace and, where the protocol changes nothing, one lowering and
    proof: `taccl.baselines.build_protocols`) into `built`, from which each variant then takes its own."""
    from ..baselines import build_protocols

    if prog.instances not in built:
        protocols = [p.proto for p in task.programs if p.instances == prog.instances and p.key not in task.done]
        try:
            # a baseline stands for NCCL's own algorithm: no executor step limit (see baselines.build)
            built[prog.instances] = build_protocols(
                task.baseline, topo, task.collective, protocols, instances=prog.instances, max_tbs=task.max_tbs,
                reference=True, max_memory_bytes=task.max_memory_bytes, max_memory_source=task.max_memory_source)
        except TacclError as exc:  # refused before lowering (memory, a missing link): so is every protocol
            built[prog.instances] = exc
    group = built[prog.instances]
    program = group if isinstance(group, TacclError) else group.pop(prog.proto)
    if isinstance(program, TacclError):
        raise program
    return program


def _simulate(task: Task, prog: ProgramJob, xml_record, topo, program=None) -> dict:
    from ..simulator import Simulator
    from ..xmlio import parse_xml

    t0 = time.monotonic()
    try:
        if program is None:
            program = parse_xml(xml_record["xml"]).program
        sim = Simulator(program, topo)
        results = [sim.run(s) for s in task.grid]
    except Exception as exc:
        reason, tb = _reason(exc)
        return failure(prog.sim_key, "simulation", reason, label=prog.label, traceback=tb)
    return _simulation_record(prog.sim_key, prog.label, results, time_s=round(time.monotonic() - t0, 3))


def _simulation_record(key: str, label: str, results: list, **extra) -> dict:
    """A program's times on the grid (`taccl.simulator.SimResult` per size) as the cache stores them."""
    return {"key": key, "kind": "simulation", "status": "ok", "label": label, **extra,
            "sizes": [r.size_bytes for r in results], "time_us": [r.time_us for r in results],
            "algbw_GBps": [r.algbw_GBps for r in results]}
