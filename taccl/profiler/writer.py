"""What is known about one node (`NodeFacts`), from measurements or from what the machine reports, and the
topology file written from it.

Three sources produce `NodeFacts` in the probe's (physical) GPU numbering: the analysis of probe samples
(`facts_from_analysis`), `nvidia-smi topo -m` (`nvsmi.parse`) and NCCL's topology dump (`nccl_xml.parse`).
`merge_facts(base, measured)` keeps every measured item and fills the gaps from the base, so a user can start
from what the machine reports and refine it with measurements. `to_topology` then picks the GPU renumbering
and writes a document that `taccl.topology.spec_from_dict` accepts, with calibrated costs derived for the
GPU's generation (`taccl.costs`) where its compute capability is known.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

from ..costs import PCIE_LATENCY, PCIE_TYPE
from ..errors import UserError
from .renumber import Renumbering, cuda_visible_devices, find_renumbering

# Nominal inter-node latency when none is measured: TACCL's remote alpha (shared/docs/reference-numbers.md).
NOMINAL_NET_ALPHA_US = 2.6


@dataclass
class NodeFacts:
    n_gpus: int
    name: str = "profiled"
    classes: list = field(default_factory=list)  # {name, kind: direct|switch, pairs: [(s, d)], alpha_us, bw_GBps, fit?, note}
    pcie_groups: list | None = None
    nics: list = field(default_factory=list)  # {name, gpus_on_switch, numa_node, rate_Gbps, evidence}
    gpu_numa: list | None = None
    net: dict | None = None  # {alpha_us, bw_GBps, fit?, note}
    env_visible: str | None = None
    sources: list = field(default_factory=list)
    unmeasured: list = field(default_factory=list)
    notes: list = field(default_factory=list)
    measurements: dict = field(default_factory=dict)
    compute_capability: int | None = None  # major * 10 + minor, the lowest of the node's GPUs (as NCCL takes it)
    sm_count: int | None = None  # streaming multiprocessors per GPU, the fewest
    mem_bw_GBps: float | None = None  # peak memory bandwidth per GPU, the lowest (the probe's `mem_GBps`)


# The offline sources' (`nvsmi`, `nccl_xml`) nominal NVLink alpha: TE-CCL's, shared/docs/reference-numbers.md
NOMINAL_NVLINK_ALPHA_US = 0.7
# A node without NVLink, from what it reports: one switch of link type "pcie" whose port is each GPU's PCIe
# link, as the probe's analysis makes it from measurements (`analyze._classify`). Its nominal alpha: the NVLink
# one scaled as NCCL's Simple per-step latency is for PCI.
NOMINAL_PCIE_ALPHA_US = round(NOMINAL_NVLINK_ALPHA_US * PCIE_LATENCY["Simple"], 3)


def nominal_pcie_class(n_gpus: int, bw_GBps: float, why: str) -> dict:
    """The `NodeFacts.classes` entry of a PCIe-only node of `n_gpus` GPUs at a nominal rate (`why`: its source)."""
    return {"name": PCIE_TYPE, "kind": "switch", "pairs": [(a, b) for a in range(n_gpus) for b in range(n_gpus) if a != b],
            "alpha_us": NOMINAL_PCIE_ALPHA_US, "bw_GBps": bw_GBps,
            "note": f"nominal: no NVLink, every GPU pair over PCIe, a switch whose port is each GPU's PCIe link at "
                    f"{bw_GBps:g} GB/s a direction; {why}"}


def _lowest(values, kind=int):
    """The lowest of the positive, finite numbers of type `kind` in `values` (whole numbers by default), None
    when there is none."""
    known = [v for v in values if isinstance(v, kind) and not isinstance(v, bool) and math.isfinite(v) and v > 0]
    return min(known) if known else None


def facts_from_analysis(an, doc: dict, *, name: str | None = None, samples_path: str | None = None) -> NodeFacts:
    host = doc.get("host", {}) if isinstance(doc.get("host"), dict) else {}
    f = NodeFacts(n_gpus=an.n_gpus, name=name or f"profiled-{host.get('hostname', 'node')}")
    f.env_visible = (doc.get("env") or {}).get("CUDA_VISIBLE_DEVICES")
    gpus = doc.get("gpus", [])
    f.compute_capability = _lowest(g.get("sm") for g in gpus)
    f.sm_count = _lowest(g.get("sms") for g in gpus)
    mem = _lowest((g.get("mem_GBps") for g in gpus), kind=(int, float))
    f.mem_bw_GBps = None if mem is None else float(mem)
    if gpus and all(isinstance(g.get("numa_node"), int) and g["numa_node"] >= 0 for g in gpus):
        f.gpu_numa = [g["numa_node"] for g in gpus]
    for c in an.direct_classes:
        f.classes.append({"name": c.name, "kind": c.kind, "pairs": list(c.members), "alpha_us": c.fit.alpha_us,
                          "bw_GBps": c.fit.bw_GBps, "fit": _fit_doc(c.fit, c, an.engine), "note": c.note or
                          f"measured ({an.engine} copies), {len(c.members)} directed pairs"})
    f.pcie_groups = an.pcie_groups
    for nic in an.nics:
        f.nics.append({"name": nic.name, "gpus_on_switch": nic.gpus_on_switch, "numa_node": nic.numa_node,
                       "rate_Gbps": nic.rate_Gbps, "evidence": {"nearest_cpu": nic.numa_evidence,
                                                                "switch": nic.switch_evidence}})
    if an.net_fit is not None and math.isfinite(an.net_fit.alpha_us):
        f.net = {"alpha_us": an.net_fit.alpha_us, "bw_GBps": an.net_fit.bw_GBps, "fit": an.net_fit.as_dict(),
                 "note": "measured: NCCL send/recv ping-pong between two nodes"}
    f.unmeasured = list(an.unmeasured)
    f.notes = list(an.notes)
    f.sources = [f"taccl profile: probe samples {samples_path or '(in memory)'}"]
    f.measurements = {
        "samples_file": samples_path,
        "tool": doc.get("tool"),
        "gpus": [{k: g.get(k) for k in ("index", "name", "pci_bus_id", "uuid", "numa_node", "sm", "sms", "mem_GBps")
                  if k in g}
                 for g in gpus],
        "engine": an.engine,
        "pair_fits": [{"engine": e, "src": s, "dst": d, **fit.as_dict()} for (e, s, d), fit in sorted(an.pair_fits.items())],
        "host_fits": [{"direction": k[0], "gpu": k[1], **fit.as_dict()} for k, fit in sorted(an.host_fits.items())],
        "pcie_classes": [{"name": c.name, "pairs": [list(p) for p in c.members], "fit": c.fit.as_dict(), "note": c.note}
                         for c in an.classes if c.kind == "pcie"],
        "switch_evidence": an.switch_evidence or None,
        "pcie_evidence": an.pcie_evidence,
        "shared_paths": an.shared_paths,
        "nic_loopback_fits": [{"nic": k[0], "numa_node": k[1], **fit.as_dict()} for k, fit in
                              sorted(an.loopback_fits.items(), key=lambda kv: (str(kv[0][0]), str(kv[0][1])))],
        "probe_status": doc.get("status"),
    }
    return f


def _fit_doc(fit, cls, engine) -> dict:
    d = fit.as_dict()
    d["engine"] = engine
    d["links"] = len(cls.members)
    bws = cls.member_bw_GBps
    if bws:
        d["member_bw_GBps_min"], d["member_bw_GBps_max"] = min(bws), max(bws)
    return d


def merge_facts(base: NodeFacts | None, measured: NodeFacts | None) -> NodeFacts:
    """Measured items win; the base fills in what was not measured. GPU counts must agree."""
    if base is None or measured is None:
        return measured or base
    if base.n_gpus != measured.n_gpus:
        one, other = (f.sources[0] if f.sources else "one source" for f in (base, measured))
        raise UserError(f"the sources disagree on the GPUs: {base.n_gpus} in {one}, {measured.n_gpus} in {other}; "
                        f"take both on the same machine with the same CUDA_VISIBLE_DEVICES")
    out = NodeFacts(n_gpus=measured.n_gpus, name=measured.name)
    out.classes = measured.classes or base.classes
    if measured.classes and base.classes:
        base_pairs = {frozenset(p) for c in base.classes for p in c["pairs"]}
        meas_pairs = {frozenset(p) for c in measured.classes for p in c["pairs"]}
        if base_pairs != meas_pairs and not any(c["kind"] == "switch" for c in base.classes + measured.classes):
            out.notes.append("the measured GPU links differ from the base topology's; the measured ones are used")
    out.pcie_groups = measured.pcie_groups if measured.pcie_groups else base.pcie_groups
    by_name = {n["name"]: dict(n) for n in base.nics}
    for n in measured.nics:
        b = by_name.get(n["name"], {})
        merged = dict(b)
        merged.update({k: v for k, v in n.items() if v not in (None, [], "")})
        by_name[n["name"]] = merged
    out.nics = [by_name[k] for k in sorted(by_name)]
    out.gpu_numa = measured.gpu_numa or base.gpu_numa
    out.net = measured.net or base.net
    out.env_visible = measured.env_visible or base.env_visible
    out.compute_capability = measured.compute_capability or base.compute_capability
    out.sm_count = measured.sm_count or base.sm_count
    out.mem_bw_GBps = measured.mem_bw_GBps or base.mem_bw_GBps
    out.sources = base.sources + measured.sources
    covered = set()
    if out.pcie_groups:
        covered.add("PCIe switch groups")
    out.unmeasured = [u for u in measured.unmeasured if u["what"] not in covered]
    out.notes = measured.notes + base.notes + out.notes
    out.measurements = dict(measured.measurements)
    out.measurements["base"] = base.measurements
    return out


def _nic_assignment(f: NodeFacts) -> list:
    """Every GPU to exactly one NIC: the NIC on its PCIe switch, else one on its NUMA node, else the least used."""
    nics = [dict(n) for n in f.nics]
    if not nics:
        return []
    assigned = {}
    # NICs that share the same GPUs split them in order (two NICs on a two-GPU switch: one GPU each).
    by_set = {}
    for i, n in enumerate(nics):
        on_switch = n.get("gpus_on_switch") or []
        closest = [g for g in n.get("gpus_closest") or [] if g in on_switch]  # PIX before PXB
        key = tuple(sorted(closest or on_switch))
        if key:
            by_set.setdefault(key, []).append(i)
    for gpus, idxs in by_set.items():
        for j, g in enumerate(gpus):
            assigned.setdefault(g, idxs[j % len(idxs)])
    for g in range(f.n_gpus):
        if g in assigned:
            continue
        load = lambda i: sum(1 for v in assigned.values() if v == i)  # noqa: E731
        numa = f.gpu_numa[g] if f.gpu_numa else None
        near = [i for i, n in enumerate(nics) if numa is not None and n.get("numa_node") == numa]
        pool = near or list(range(len(nics)))
        assigned[g] = min(pool, key=lambda i: (load(i), i))
    for i, n in enumerate(nics):
        n["gpus"] = sorted(g for g, v in assigned.items() if v == i)
    return nics


def _near_nic(f: NodeFacts, nics) -> list:
    if not nics:
        return []
    first = next((n for n in nics if n.get("gpus_on_switch") or n.get("gpus_closest")), nics[0])
    if first.get("gpus_on_switch") or first.get("gpus_closest"):
        return list(first.get("gpus_on_switch") or first["gpus_closest"])
    if f.gpu_numa and first.get("numa_node") is not None:
        return [g for g in range(f.n_gpus) if f.gpu_numa[g] == first["numa_node"]]
    return []


def _edges(f: NodeFacts) -> dict:
    """Undirected labelled GPU graph; labels are the class's bandwidth rank, so names do not matter."""
    order = sorted(f.classes, key=lambda c: -c["bw_GBps"])
    rank = {c["name"]: i for i, c in enumerate(order)}
    edges = {}
    for c in f.classes:
        for s, d in c["pairs"]:
            edges[(min(s, d), max(s, d))] = ("switch" if c["kind"] == "switch" else "link", rank[c["name"]])
    return edges


def reference_from_spec(spec) -> tuple:
    """(edges, pcie groups) of a loaded topology spec, labelled like `_edges`."""
    types = sorted({t for _, _, t in spec.links} | {t for _, _, t in spec.switches},
                   key=lambda t: -spec.link_types[t].bw_GBps)
    rank = {t: i for i, t in enumerate(types)}
    edges = {}
    for _, gpus, t in spec.switches:
        for a in gpus:
            for b in gpus:
                if a < b:
                    edges[(a, b)] = ("switch", rank[t])
    for s, d, t in spec.links:
        edges[(min(s, d), max(s, d))] = ("link", rank[t])
    return edges, spec.pcie_switches


def to_topology(f: NodeFacts, *, reference=None, auto_reference: bool = True) -> tuple:
    """(topology document, Renumbering). `reference` is a loaded TopologySpec whose numbering to follow."""
    if f.n_gpus < 1:
        raise UserError("no GPU was found, so no topology can be written; the samples file says what was measured")
    n = f.n_gpus
    nics = _nic_assignment(f)
    near = _near_nic(f, nics)
    edges = _edges(f)
    ren, ref_note = None, None
    refs = [reference] if reference is not None else (_builtin_candidates(n) if auto_reference else [])
    refs.sort(key=lambda sp: len(sp.nics) != len(nics))  # a built-in with as many NICs first (ndv2 before dgx1)
    for spec in refs:
        r_edges, r_groups = reference_from_spec(spec)
        if not r_edges or all(k == "switch" for k, _ in r_edges.values()):
            continue  # nothing to align with
        ren = find_renumbering(n, edges, near_nic=near, pcie_groups=f.pcie_groups, reference_edges=r_edges,
                               reference_groups=r_groups, reference_name=spec.name)
        if ren is not None:
            break
        if reference is not None:
            ref_note = f"the measured GPU graph is not the reference {spec.name}'s; numbered by automorphism instead"
    if ren is None:
        ren = find_renumbering(n, edges, near_nic=near, pcie_groups=f.pcie_groups)
    if ref_note:
        ren.notes.append(ref_note)
    inv = ren.inverse()

    doc = {"name": f.name, "description": f"{n}-GPU node measured by taccl profile", "sources": list(f.sources),
           "gpus_per_node": n}
    types, links, switches = {}, [], []
    for c in f.classes:
        t = {"alpha_us": _r(c["alpha_us"]), "bw_GBps": _r(c["bw_GBps"]), "note": c.get("note", "")}
        if c.get("fit"):
            t["fit"] = c["fit"]
        types[c["name"]] = t
        if c["kind"] == "switch":
            gpus = sorted({inv[g] for p in c["pairs"] for g in p})
            switches.append({"name": c["name"], "gpus": gpus, "type": c["name"]})
            continue
        dirs = {(inv[s], inv[d]) for s, d in c["pairs"]}
        for s, d in sorted(dirs):
            if (d, s) in dirs:
                if s < d:
                    links.append({"src": s, "dst": d, "type": c["name"]})
            else:
                links.append({"src": s, "dst": d, "type": c["name"], "bidirectional": False})
    # A link measured in one direction only, whose reverse is in another class: keep both directed.
    seen = set()
    for l in links:
        pairs = [(l["src"], l["dst"])] + ([(l["dst"], l["src"])] if l.get("bidirectional", True) else [])
        for p in pairs:
            if p in seen:
                raise UserError(f"GPU pair {p} falls in two link classes; the samples are inconsistent")
            seen.add(p)
    if links:
        doc["links"] = links
    if switches:
        doc["switches"] = switches
    if nics and any(n_["gpus"] for n_ in nics):
        net = f.net or _nominal_net(nics, f)
        types["ib"] = {k: (_r(v) if isinstance(v, float) else v) for k, v in net.items()}
        out_nics = []
        for n_ in nics:
            if not n_["gpus"]:
                continue
            e = {"name": n_["name"], "gpus": sorted(inv[g] for g in n_["gpus"]), "type": "ib"}
            grp = _group_index(n_, f.pcie_groups, inv)
            if grp is not None:
                e["pcie_switch"] = grp
            if isinstance(n_.get("numa_node"), int) and n_["numa_node"] >= 0:
                e["numa_node"] = n_["numa_node"]
            out_nics.append(e)
        doc["nics"] = out_nics
    else:
        doc["max_nodes"] = 1
    if f.pcie_groups:
        doc["pcie_switches"] = _renumbered_groups(f.pcie_groups, inv)
    if not types:
        types["none"] = {"alpha_us": 0.0, "bw_GBps": 1.0, "note": "placeholder: no link could be measured"}
    doc["link_types"] = types
    if PCIE_TYPE in types:  # GPUs over PCIe: NCCL does not enable LL128 there (its lines may be torn);
        doc["runtime"] = {"protocols": ["Simple", "LL"]}  # derived costs keep this (`Derivation.apply`)
    doc["cuda_visible_devices"] = cuda_visible_devices(ren.order, f.env_visible)
    m = dict(f.measurements)
    m["renumbering"] = {"order": ren.order, "reason": ren.reason, "reference": ren.reference,
                        "nic_next_to_gpu0": ren.nic_next_to_gpu0, "notes": ren.notes,
                        "usage": "export CUDA_DEVICE_ORDER=PCI_BUS_ID CUDA_VISIBLE_DEVICES=" + doc["cuda_visible_devices"]}
    m["nics"] = [{k: v for k, v in n_.items()} for n_ in nics]
    doc, calibration, gaps = with_derived_costs(doc, f)
    m["calibration"] = calibration
    m["unmeasured"] = f.unmeasured + gaps
    m["notes"] = f.notes
    doc["measurements"] = m
    return doc, ren


def with_derived_costs(doc: dict, f: NodeFacts) -> tuple:
    """(`doc` with calibrated costs derived for the GPU generation of `f`'s compute capability (`taccl.costs`),
    what they were derived for, [entries for the list of what was not measured]), or, where the compute capability
    is unknown, (`doc` as it is, None, [the gap]). Without them the simulator has no per-step latency, per-block
    limit or call cost, and grades every program below about 1 MiB several times too fast (docs/calibration.md).

    The SM count bounds the thread blocks a program may have on a rank (all must be resident at once, or the
    program hangs), so it is never guessed below what the GPU may have: where neither the probe nor
    ``--sm-count`` gives it, the generation's SXM part's is taken only for GPUs of that part's compute capability
    on NVLink (said in the list); for any other GPU (PCIe cards, compute capabilities such as 8.9 that span GPUs
    of 58 to 142 SMs) `UserError` asks for ``--sm-count``."""
    from ..costs import (GENERATIONS, H100_MEMORY_GBPS, NETWORK_SOURCE, NETWORK_TYPES, Derivation, derived_source,
                         generation)

    if not doc.get("links") and not doc.get("switches"):
        return doc, None, []  # no link between GPUs: nothing a program could use (`taccl profile` writes nothing)
    if f.compute_capability is None:
        if f.sm_count:  # no costs, but the bound on a program's thread blocks a rank holds anyway
            doc = {**doc, "runtime": {**doc.get("runtime", {}), "sm_count": f.sm_count}}
        return doc, None, [{"what": "calibrated costs", "reason": (
            "the GPUs' compute capability is not known (the probe and NCCL's topology XML give it, nvidia-smi topo "
            "output does not); pass --compute-capability (e.g. 9.0 for H100) to derive per-step latencies, "
            "per-block limits and call costs for that GPU generation")}]
    gen = generation(f.compute_capability)
    part = GENERATIONS[gen]
    cc = f"{f.compute_capability / 10:.1f}"
    gaps = []
    sm_count = f.sm_count
    if sm_count is None:
        nvlink = any(t != PCIE_TYPE and t not in NETWORK_TYPES for t in doc["link_types"])
        if f.compute_capability != part["cc"] or not nvlink:
            which = (f"compute capability {cc}, not the {part['part']}'s {part['cc'] / 10:.1f}" if nvlink else
                     f"no NVLink: a PCIe card, not the {part['part']}")
            raise UserError(f"the GPUs' SM count is not known ({which}, whose {part['sms']} SMs would be a guess); a "
                            f"program with more thread blocks a rank than the GPU has SMs hangs: pass --sm-count (the "
                            f"data sheet of the GPU that `nvidia-smi --query-gpu=name --format=csv` names)",
                            where="--sm-count")
        sm_count = part["sms"]
        gaps.append({"what": "SM count", "reason": (
            f"the {part['part']}'s {sm_count} (its data sheet), the GPU of compute capability {cc} with NVLink; a GPU "
            f"with fewer SMs hangs on programs with more thread blocks a rank than it has: pass --sm-count")})
    if f.mem_bw_GBps is None:
        gaps.append({"what": "memory bandwidth", "reason": (
            f"the {part['part']}'s {round(part['hbm'] * H100_MEMORY_GBPS)} GB/s (its data sheet) scales one "
            f"thread block's local copies and reductions; pass --memory-gbps for another GPU")})
    sms = f"{sm_count} SMs ({'given or measured' if f.sm_count else 'the data sheet'})"
    what = (f"compute capability {cc}, {sms}; the link bandwidths as measured (or "
            f"nominal, as their notes say), scaled as the H100's measured 396 GB/s is")
    mesh = "switches" not in doc
    if mesh:
        what += "; a GPU's LL bandwidth split over its NVLinks by their bandwidth"
    if f.mem_bw_GBps:
        what += f"; one block's on-GPU bandwidth scaled by the GPUs' {f.mem_bw_GBps:g} GB/s of memory"
    out = Derivation().apply(doc, gen, mesh=mesh, sm_count=sm_count, mem_bw_GBps=f.mem_bw_GBps)
    network = [NETWORK_SOURCE] if any(t in out["link_types"] for t in NETWORK_TYPES) else []
    out["sources"] = list(doc.get("sources", [])) + [derived_source(gen, what)] + network
    calibration = {"derived_from": "dgx-h100", "generation": gen, "compute_capability": f.compute_capability,
                   "sm_count": out["runtime"]["sm_count"]}
    return out, calibration, gaps


def _r(v, nd=4):
    return round(float(v), nd)


def _nominal_net(nics, f: NodeFacts) -> dict:
    rates = [n.get("rate_Gbps") for n in nics if n.get("rate_Gbps")]
    if rates:
        bw, why = min(rates) / 8.0, f"nominal: {min(rates):g} Gb/s port rate / 8"
    else:
        bw, why = 12.5, "nominal: port rate unknown, 100 Gb/s assumed"
    f.unmeasured.append({"what": "inter-node alpha and bandwidth", "reason": why + "; run taccl profile --peer to measure"})
    return {"alpha_us": NOMINAL_NET_ALPHA_US, "bw_GBps": bw,
            "note": f"{why}; alpha {NOMINAL_NET_ALPHA_US} us is TACCL's remote alpha, not measured"}


def _renumbered_groups(groups, inv):
    return sorted(sorted(inv[g] for g in grp) for grp in groups)


def _group_index(nic, groups, inv):
    if not groups or not nic.get("gpus_on_switch"):
        return None
    new_groups = _renumbered_groups(groups, inv)
    target = {inv[g] for g in nic["gpus_on_switch"]}
    for i, grp in enumerate(new_groups):
        if target & set(grp):
            return i
    return None


def _builtin_candidates(n: int) -> list:
    from ..topology import BUILTIN_DIR, load_spec

    out = []
    for p in sorted(BUILTIN_DIR.glob("*.json")) if BUILTIN_DIR.is_dir() else []:
        try:
            spec = load_spec(str(p))
        except Exception:  # noqa: BLE001 - a broken built-in must not stop profiling
            continue
        if spec.gpus_per_node == n and spec.links:
            out.append(spec)
    return out


def renumbering_summary(ren: Renumbering) -> str:
    return f"CUDA_VISIBLE_DEVICES order {ren.order}: {ren.reason}"
