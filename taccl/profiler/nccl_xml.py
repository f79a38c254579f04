"""Read NCCL's topology XML (`NCCL_TOPO_DUMP_FILE`, or a `NCCL_TOPO_FILE` such as Azure's) into `NodeFacts`.

Structure: `<system>` holds `<cpu numaid=..>` elements, under which `<pci>` elements nest (bridges have
class 0x0604xx, GPUs 0x0302xx/0x0300xx, NICs 0x0207xx/0x0200xx); a GPU's `<pci>` holds `<gpu dev= sm=>`
with `<nvlink target=BUSID count= tclass=>` children (tclass 0x068000: an NVSwitch); a NIC's holds
`<nic><net name= dev= speed=(Mb/s)>`.

What is inferred:
- GPU index: `gpu@dev` when present, else the order of GPU `<pci>` elements (what a hand-written
  NCCL_TOPO_FILE gives).
- links: NVLinks to another GPU's bus id are direct links of `count` bricks; NVLinks to NVSwitches make
  the GPUs a switch group with the sum of counts.
- PCIe switch groups: GPUs under the same top-level bridge below their CPU (that bridge's uplink is what
  they share); a GPU hanging directly off the CPU is a group of its own.
- NICs: `net@speed` gives the port rate; the NIC's switch and NUMA node come from its place in the tree.
- no NVLink in a dump (every GPU has its `<gpu>` element, which NCCL writes with the NVLinks it found; a
  hand-written file may leave both out): the GPUs talk over PCIe, one switch of link type `pcie` at the
  slowest GPU's PCIe link as NCCL rates it (`link_width` x per-lane rate of `link_speed` / 80 GB/s, its
  `kvDictPciGen`: 24 GB/s for Gen4 x16).
Costs are nominal: NCCL's own per-link NVLink bandwidths by SM version (src/graph/topo.h, via
shared/docs/reference-numbers.md 1.8), alpha 0.7 us.
"""
from __future__ import annotations

import xml.etree.ElementTree as ET

from ..errors import UserError
from ..fileio import read_text
from .analyze import PCIE_NOTE
from .writer import NOMINAL_NVLINK_ALPHA_US as NVLINK_ALPHA_US, NodeFacts, nominal_pcie_class

# NCCL topo.h per-link NVLink bandwidth (GB/s) by SM major*10+minor (reference-numbers.md 1.8).
NCCL_NVLINK_GBPS = {60: 18.0, 70: 20.0, 80: 20.0, 86: 12.0, 90: 20.6, 100: 40.1}
NVSWITCH_CLASS = "0x068000"
# NCCL's per-lane PCIe rate by link speed, in 100 Mb/s (src/graph/topo.cc kvDictPciGen; kernels up to 5.6 omit
# the ".0" and " PCIe")
PCI_LANE_RATE = {"2.5": 15, "5": 30, "8": 60, "16": 120, "32": 240, "64": 480}


def _is(cls: str, prefix: str) -> bool:
    return (cls or "").lower().startswith(prefix)


def _link_bw(sm: int | None) -> float:
    if not sm:
        return 20.0
    best = max((k for k in NCCL_NVLINK_GBPS if k <= sm), default=60)
    return NCCL_NVLINK_GBPS[best]


def _pci_GBps(speed: str | None, width: str | None) -> float | None:
    """A PCIe link's bandwidth as NCCL rates it ("16.0 GT/s PCIe", "16" -> 24.0 GB/s), None if unreadable."""
    lane = PCI_LANE_RATE.get((speed or "").split(" ")[0].removesuffix(".0"))
    if lane is None or not (width or "").isdigit() or int(width) < 1:
        return None
    return int(width) * lane / 80


def parse_text(text: str, *, path: str | None = None) -> NodeFacts:
    try:
        root = ET.fromstring(text)
    except ET.ParseError as exc:
        raise UserError(f"invalid XML: {exc}", path=path) from None
    if root.tag != "system":
        raise UserError(f"not an NCCL topology file: root element <{root.tag}>, expected <system>", path=path)
    gpus, nics = [], []  # dicts with busid, numa, group key, ...

    def walk(el, numa, top_bridge):
        for ch in el:
            if ch.tag == "pci":
                cls = ch.get("class", "")
                bridge = top_bridge
                if top_bridge is None and _is(cls, "0x0604"):
                    bridge = ch.get("busid")
                gpu_el = ch.find("gpu")
                if gpu_el is not None or _is(cls, "0x0302") or _is(cls, "0x0300"):
                    g = {"busid": ch.get("busid", "").lower(), "numa": numa, "group": bridge, "el": gpu_el,
                         "pci_GBps": _pci_GBps(ch.get("link_speed"), ch.get("link_width"))}
                    gpus.append(g)
                nic_el = ch.find("nic")
                if nic_el is not None or _is(cls, "0x0207") or _is(cls, "0x0200"):
                    nets = nic_el.findall("net") if nic_el is not None else []
                    for net in nets or [None]:
                        nics.append({"busid": ch.get("busid", "").lower(), "numa": numa, "group": bridge,
                                     "name": net.get("name") if net is not None else f"nic@{ch.get('busid')}",
                                     "speed": net.get("speed") if net is not None else None})
                walk(ch, numa, bridge)
            elif ch.tag == "nic" and el.tag == "cpu":  # a NIC directly under the CPU
                for net in ch.findall("net"):
                    nics.append({"busid": "", "numa": numa, "group": None, "name": net.get("name"),
                                 "speed": net.get("speed")})

    for cpu in root.findall("cpu"):
        numa = cpu.get("numaid")
        walk(cpu, int(numa) if numa is not None and numa.lstrip("-").isdigit() else None, None)
    if not gpus:
        raise UserError("no GPU in the NCCL topology file", path=path)
    # GPU numbering: gpu@dev if every GPU has one.
    devs = [g["el"].get("dev") if g["el"] is not None else None for g in gpus]
    if all(d is not None and d.isdigit() for d in devs) and sorted(map(int, devs)) == list(range(len(gpus))):
        gpus.sort(key=lambda g: int(g["el"].get("dev")))
    n = len(gpus)
    idx = {g["busid"]: i for i, g in enumerate(gpus)}
    f = NodeFacts(n_gpus=n, name="nccl-topo")
    f.sources.append(f"NCCL topology XML {path or '(text)'}: PCIe tree, NVLinks, NICs; costs nominal")
    if all(g["numa"] is not None for g in gpus):
        f.gpu_numa = [g["numa"] for g in gpus]
    direct, to_switch, sms = {}, {}, []
    for i, g in enumerate(gpus):
        el = g["el"]
        if el is None:
            continue
        sm = el.get("sm")
        sms.append(int(sm) if sm and sm.isdigit() else None)
        for nl in el.findall("nvlink"):
            raw = nl.get("count", "1")
            if not raw.isdigit() or int(raw) < 1:
                raise UserError(f"<nvlink count=\"{raw}\"> of GPU {g['busid']}: expected a whole number of NVLinks, "
                                f"at least 1", path=path)
            cnt = int(raw)
            tgt = (nl.get("target") or "").lower()
            if nl.get("tclass", "").lower() == NVSWITCH_CLASS:
                to_switch[i] = to_switch.get(i, 0) + cnt
            elif tgt in idx and idx[tgt] != i:
                direct[(i, idx[tgt])] = direct.get((i, idx[tgt]), 0) + cnt
    per_link = _link_bw(max((s for s in sms if s), default=None))
    f.compute_capability = min((s for s in sms if s), default=None)
    if len(to_switch) >= 2:
        members = sorted(to_switch)
        k = min(to_switch.values())
        f.classes.append({"name": "nvswitch", "kind": "switch",
                          "pairs": [(a, b) for a in members for b in members if a != b],
                          "alpha_us": NVLINK_ALPHA_US, "bw_GBps": k * per_link,
                          "note": f"nominal: {k} NVLinks per GPU into NVSwitches x {per_link:g} GB/s (NCCL topo.h)"})
    for k in sorted(set(direct.values())):
        pairs = sorted(p for p, c in direct.items() if c == k)
        f.classes.append({"name": f"nvlink_x{k}", "kind": "direct", "pairs": pairs, "alpha_us": NVLINK_ALPHA_US,
                          "bw_GBps": k * per_link, "note": f"nominal: {k} NVLinks x {per_link:g} GB/s (NCCL topo.h)"})
    pci = [g["pci_GBps"] for g in gpus if g["pci_GBps"]]
    if not f.classes and n > 1 and all(g["el"] is not None for g in gpus) and len(pci) == n:
        f.classes.append(nominal_pcie_class(n, min(pci), "the slowest GPU's link_speed and link_width, rated as "
                                                        "NCCL does"))
        f.notes.append(PCIE_NOTE)
    if not f.classes:
        f.unmeasured.append({"what": "GPU-GPU links", "reason": "the NCCL topology file lists no NVLink "
                             "(hand-written files often leave them to NVML at run time)"})
    groups = {}
    for i, g in enumerate(gpus):
        groups.setdefault(g["group"] if g["group"] else f"gpu{i}", []).append(i)
    f.pcie_groups = sorted(groups.values())
    for nic in nics:
        near = [i for i, g in enumerate(gpus) if nic["group"] and g["group"] == nic["group"]]
        rate = float(nic["speed"]) / 1000.0 if nic.get("speed") and str(nic["speed"]).replace(".", "").isdigit() else None
        f.nics.append({"name": nic["name"], "gpus_on_switch": near, "numa_node": nic["numa"], "rate_Gbps": rate,
                       "evidence": {"nccl_xml": {"busid": nic["busid"], "bridge": nic["group"]}}})
    f.measurements = {"nccl_topo": {"gpus": [{"busid": g["busid"], "numa_node": g["numa"], "bridge": g["group"]}
                                              for g in gpus]}}
    return f


def parse(path) -> NodeFacts:
    return parse_text(read_text(path), path=str(path))
