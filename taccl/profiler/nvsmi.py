"""Read `nvidia-smi topo -m` output into `NodeFacts` (structure only; link costs are nominal).

The matrix gives, per GPU pair, either `NV#` (# bonded NVLinks) or the PCIe relation (`PIX` one switch,
`PXB` several switches below one host bridge, `PHB` through a host bridge, `NODE` across host bridges of
one NUMA node, `SYS`/`SOC` across sockets), the same for GPU-NIC pairs, then the CPU and NUMA affinity.

What is inferred:
- links: `NV#` pairs. If every pair shows the same `NV#`, the GPUs sit on an NVSwitch (a full mesh of
  NVLinks is possible in principle, but NVIDIA's 8- and 16-GPU boards with uniform NV# are switch based);
  otherwise each pair is a direct link whose bandwidth is # times the per-link rate.
- PCIe switch groups: GPUs related by `PIX`/`PXB`, directly or through a NIC both of them see as
  `PIX`/`PXB` (NVLink pairs hide their PCIe relation, so the NIC columns matter).
- NIC placement: the GPUs at `PIX`/`PXB` from the NIC; its NUMA node is that of the GPUs at `PIX`..`NODE`.
- no NVLink at all (L40S, RTX, PCIe A100/H100 servers) and a PCIe relation for every GPU pair: the GPUs talk
  over PCIe, each through its own PCIe link, modelled as the probe's analysis does (`analyze._classify`): a
  switch of link type `pcie` whose port is each GPU's PCIe link.
Costs: `nvlink_GBps` per link and direction (default 25 GB/s, NVLink2-4, shared/docs/reference-numbers.md),
alpha 0.7 us (TE-CCL's NVLink alpha, same file); `pcie_GBps` per GPU's PCIe link and direction (default 24 GB/s:
NCCL's figure for a Gen4 x16 link, width x 16 GT/s x 120 / 80 in its `kvDictPciGen`; Gen5: 48), alpha the
NVLink one scaled as NCCL's Simple per-step latency is for PCI (`taccl.costs.PCIE_LATENCY`); they are marked
nominal in the topology file.
"""
from __future__ import annotations

import re

from ..errors import UserError
from ..fileio import read_text
from .analyze import PCIE_NOTE
from .writer import NOMINAL_NVLINK_ALPHA_US as NVLINK_ALPHA_US, NodeFacts, nominal_pcie_class

NVLINK_GBPS = 25.0
PCIE_GBPS = 24.0
NEAR = ("PIX", "PXB")
SAME_NUMA = ("PIX", "PXB", "PHB", "NODE")
_REL = re.compile(r"^(X|NV\d+|PIX|PXB|PHB|NODE|SYS|SOC|PSB|N/A)$")


def _cpu_set(text):
    out = set()
    for part in text.split(","):
        if "-" in part:
            a, b = part.split("-", 1)
            if a.isdigit() and b.isdigit():
                out.update(range(int(a), int(b) + 1))
        elif part.isdigit():
            out.add(int(part))
    return frozenset(out)


def parse_text(text: str, *, path: str | None = None, nvlink_GBps: float = NVLINK_GBPS,
               pcie_GBps: float = PCIE_GBPS, nic_Gbps: float | None = None) -> NodeFacts:
    lines = [l.rstrip() for l in text.replace("\r", "").split("\n")]
    header_i = next((i for i, l in enumerate(lines) if re.match(r"^\s+GPU0\b", l)), None)
    if header_i is None:
        raise UserError("not `nvidia-smi topo -m` output: no header line starting with GPU0", path=path)
    header = lines[header_i].split()
    cut = header.index("CPU") if "CPU" in header else len(header)
    devices = header[:cut]
    twice = sorted({d for d in devices if devices.count(d) > 1})
    if twice:
        raise UserError(f"the header names {', '.join(twice)} more than once; expected each device once",
                        path=path, where=f"line {header_i + 1}")
    legend = {}
    for l in lines:
        m = re.match(r"^\s*(NIC\d+)\s*:\s*(\S+)\s*$", l)
        if m:
            legend[m.group(1)] = m.group(2)
    rows = {}
    for ln, l in enumerate(lines[header_i + 1:], start=header_i + 2):
        tok = l.split()
        if not tok or tok[0] not in devices:
            if tok and tok[0].startswith("Legend"):
                break
            continue
        cells = tok[1:1 + len(devices)]
        if len(cells) < len(devices):
            raise UserError(f"row {tok[0]} has {len(cells)} cells, expected one per device: {len(devices)} "
                            f"(X, NV#, PIX, PXB, PHB, NODE, SYS)", path=path, where=f"line {ln}")
        for col, c in zip(devices, cells):
            if not _REL.match(c) or c == "NV0":
                raise UserError(f"row {tok[0]}, column {col}: {c!r} is not a link kind; expected X, NV# (# NVLinks, "
                                f"at least 1), PIX, PXB, PHB, NODE or SYS", path=path, where=f"line {ln}")
            if (col == tok[0]) != (c == "X"):
                raise UserError(f"row {tok[0]}, column {col}: {c!r}; expected X exactly where a device meets itself",
                                path=path, where=f"line {ln}")
        if tok[0] in rows:
            raise UserError(f"a second row for {tok[0]}", path=path, where=f"line {ln}")
        rows[tok[0]] = (cells, tok[1 + len(devices):], ln)
    gpus = [d for d in devices if re.match(r"^GPU\d+$", d)]
    nics = [d for d in devices if d not in gpus]
    if not gpus:
        raise UserError("no GPU columns in the matrix", path=path, where=f"line {header_i + 1}")
    missing = [g for g in gpus if g not in rows]
    if missing:
        raise UserError(f"rows missing for {missing}", path=path)
    n = len(gpus)
    col = {d: i for i, d in enumerate(devices)}
    rel = lambda a, b: rows[a][0][col[b]]  # noqa: E731
    for a in gpus:  # one link between two GPUs, seen from either end
        for b in gpus:
            if rel(a, b) != rel(b, a):
                raise UserError(f"row {a}, column {b}: {rel(a, b)!r}, but row {b}, column {a}: {rel(b, a)!r}; "
                                f"expected the same relation both ways", path=path, where=f"line {rows[a][2]}")

    f = NodeFacts(n_gpus=n, name="nvidia-smi-topo")
    f.sources.append(f"nvidia-smi topo -m output {path or '(text)'}: wiring and PCIe relations; costs nominal")
    # GPU NUMA node: "NUMA Affinity" column when present, else sockets numbered by CPU affinity sets.
    numa, cpusets = [], []
    for g in gpus:
        rest = rows[g][1]
        cpusets.append(_cpu_set(rest[0]) if rest else frozenset())
        numa.append(int(rest[1]) if len(rest) > 1 and rest[1].isdigit() else None)
    if all(v is not None for v in numa):
        f.gpu_numa = numa
    elif all(cpusets):
        order = sorted(set(cpusets), key=min)
        f.gpu_numa = [order.index(c) for c in cpusets]
        f.notes.append("GPU NUMA nodes numbered from the CPU affinity sets (no NUMA Affinity column)")
    # NVLinks.
    nv = {}
    for i, a in enumerate(gpus):
        for j, b in enumerate(gpus):
            if i != j and rel(a, b).startswith("NV"):
                nv[(i, j)] = int(rel(a, b)[2:])
    counts = sorted(set(nv.values()))
    if nv and len(counts) == 1 and len(nv) == n * (n - 1) and n > 2:
        k = counts[0]
        f.classes.append({"name": "nvswitch", "kind": "switch", "pairs": sorted(nv), "alpha_us": NVLINK_ALPHA_US,
                          "bw_GBps": k * nvlink_GBps,
                          "note": f"nominal: NV{k} to every peer read as an NVSwitch, {k} x {nvlink_GBps:g} GB/s"})
    else:
        for k in counts:
            pairs = sorted(p for p, c in nv.items() if c == k)
            f.classes.append({"name": f"nvlink_x{k}", "kind": "direct", "pairs": pairs, "alpha_us": NVLINK_ALPHA_US,
                              "bw_GBps": k * nvlink_GBps, "note": f"nominal: NV{k}, {k} x {nvlink_GBps:g} GB/s"})
    # without NV#, every pair's cell is a PCIe relation (PIX .. SYS) unless the matrix says N/A
    if not nv and n > 1 and all(rel(a, b) != "N/A" for a in gpus for b in gpus):
        f.classes.append(nominal_pcie_class(n, pcie_GBps, "the rate is --pcie-gbps: nvidia-smi gives neither the "
                                                    "PCIe generation nor whether P2P works, and where it does "
                                                    "not (consumer cards) NCCL goes through host memory, "
                                                    "slower; taccl profile measures it"))
        f.notes.append(PCIE_NOTE)
    elif not nv:
        f.unmeasured.append({"what": "GPU-GPU links", "reason": "nvidia-smi shows no NVLink and not every GPU pair a "
                                                                "PCIe relation"})
    # PCIe groups through PIX/PXB, directly or via a shared NIC.
    parent = list(range(n + len(nics)))

    def find(a):
        while parent[a] != a:
            parent[a] = parent[parent[a]]
            a = parent[a]
        return a

    evidence = False
    for i, a in enumerate(gpus):
        for j, b in enumerate(gpus):
            if i < j and rel(a, b) in NEAR:
                parent[find(i)] = find(j)
                evidence = True
        for k, c in enumerate(nics):
            if rel(a, c) in NEAR:
                parent[find(i)] = find(n + k)
                evidence = True
    if evidence:
        groups = {}
        for i in range(n):
            groups.setdefault(find(i), []).append(i)
        f.pcie_groups = sorted(groups.values())
    else:
        f.unmeasured.append({"what": "PCIe switch groups", "reason": "no PIX/PXB relation in the matrix"})
    for k, c in enumerate(nics):
        name = legend.get(c, c)
        near = [i for i, a in enumerate(gpus) if rel(a, c) in NEAR]
        same = [i for i, a in enumerate(gpus) if rel(a, c) in SAME_NUMA]
        node = None
        if f.gpu_numa and same:
            nodes = [f.gpu_numa[i] for i in same]
            node = max(set(nodes), key=nodes.count)
        order = ("PIX", "PXB", "PHB", "NODE")
        levels = [order.index(rel(a, c)) for a in gpus if rel(a, c) in order]
        closest = [i for i, a in enumerate(gpus) if levels and rel(a, c) == order[min(levels)]]
        f.nics.append({"name": name, "gpus_on_switch": near, "gpus_closest": closest, "numa_node": node,
                       "rate_Gbps": nic_Gbps,
                       "evidence": {"matrix": {gpus[i]: rel(gpus[i], c) for i in range(n)}}})
    f.measurements = {"nvidia_smi": {"devices": devices, "nic_legend": legend}}
    return f


def parse(path, **kw) -> NodeFacts:
    return parse_text(read_text(path), path=str(path), **kw)
