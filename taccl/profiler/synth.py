"""Generated probe samples for known layouts, with noise and outliers: the analysis is tested on these.

`generate(layout, seed=...)` returns a samples document (the probe's format) and the truth it was made
from. Layouts: "ndv2" (DGX-1 hybrid cube-mesh, one NIC on one of four PCIe switch pairs, GPUs renumbered
at random as an NDv2 VM does), "dgx-a100" (NVSwitch, four PCIe switches of two GPUs and two NICs each),
"h100" (NVSwitch, one GPU and one NIC per PCIe switch), "pcie" (no NVLink: every GPU pair over PCIe, two
GPUs per PCIe switch, two NICs). Numbers come from
shared/docs/reference-numbers.md (link parameters) and are only meant to be plausible.
"""
from __future__ import annotations

import random

from ..topology import DGX1_DOUBLE, DGX1_SINGLE
from .samples import FORMAT, VERSION

SIZES = [1 << k for k in range(10, 29)]  # 1 KiB .. 256 MiB
BIG = 64 << 20

LAYOUTS = {
    "ndv2": dict(n=8, fabric="mesh", nv={2: 43.5, 1: 21.7}, nv_alpha=0.3, pcie_p2p=(9.0, 9.0),
                 host=(11.5, 8.0), groups=[[0, 1], [2, 3], [4, 5], [6, 7]], sockets=[0, 0, 0, 0, 1, 1, 1, 1],
                 nics=1, nic_rate=100, net=(2.6, 9.5), sm=70, sms=80, mem=900.0),
    "dgx-a100": dict(n=8, fabric="switch", sw=(230.0, 2.0), host=(24.0, 6.0),
                     groups=[[0, 1], [2, 3], [4, 5], [6, 7]], sockets=[0, 0, 0, 0, 1, 1, 1, 1], nics=8,
                     nic_rate=200, net=(2.7, 23.0), sm=80, sms=108, mem=2039.0),
    # a PCIe-only server (8x L40S-class GPUs, no NVLink): GPU pairs at PCIe rates, two GPUs per PCIe switch
    "pcie": dict(n=8, fabric="pcie", sw=(21.0, 3.0), host=(25.0, 5.0), groups=[[0, 1], [2, 3], [4, 5], [6, 7]],
                 sockets=[0, 0, 0, 0, 1, 1, 1, 1], nics=2, nic_rate=200, net=(2.7, 23.0), sm=89, sms=142, mem=864.0),
    "h100": dict(n=8, fabric="switch", sw=(380.0, 2.0), host=(53.0, 5.0),
                 groups=[[g] for g in range(8)], sockets=[0, 0, 0, 0, 1, 1, 1, 1], nics=8, nic_rate=400,
                 net=(2.7, 47.0), sm=90, sms=132, mem=3352.0),
}


class _Noise:
    def __init__(self, seed, sigma=0.02, outliers=0.06):
        self.rng = random.Random(seed)
        self.sigma, self.outliers = sigma, outliers

    def __call__(self, t):
        t *= 1.0 + self.rng.gauss(0.0, self.sigma)
        if self.rng.random() < self.outliers:
            t *= self.rng.uniform(1.5, 4.0)
        return t


def _sweep(noise, alpha, bw, reps):
    return [[s, round(noise(alpha + s / (bw * 1000.0)), 5)] for s in SIZES for _ in range(reps)]


def generate(layout: str, seed: int = 0, *, reps: int = 5, sigma: float = 0.02, outliers: float = 0.06,
             nic_group: int | None = None, permute: bool | None = None, net: bool = True):
    """(samples document, truth dict) for one of `LAYOUTS`."""
    L = LAYOUTS[layout]
    rng = random.Random(seed)
    noise = _Noise(seed + 1, sigma, outliers)
    n = L["n"]
    permute = (layout == "ndv2") if permute is None else permute
    perm = list(range(n))  # canonical GPU c is probed as physical index perm[c]
    if permute:
        rng.shuffle(perm)
    # Canonical wiring.
    canon = {}
    if L["fabric"] == "mesh":
        for a, b in DGX1_DOUBLE:
            canon[(a, b)] = canon[(b, a)] = 2
        for a, b in DGX1_SINGLE:
            canon[(a, b)] = canon[(b, a)] = 1
    groups_c = L["groups"]
    group_of_c = {g: i for i, grp in enumerate(groups_c) for g in grp}
    if L["nics"] == 1:
        # The NDv2 NIC hangs off a switch in the orbit of GPU 0 under the graph's automorphisms (pairs {0,1}, {4,5}).
        nic_groups = [nic_group if nic_group is not None else rng.choice([0, 2])]
    else:
        nic_groups = [i * len(groups_c) // L["nics"] for i in range(L["nics"])]
    ph = lambda c: perm[c]  # noqa: E731
    hbw, halpha = L["host"]
    meas = []
    # GPU-GPU sweeps, both engines.
    for engine in ("ce", "sm"):
        for a in range(n):
            for b in range(n):
                if a == b:
                    continue
                if L["fabric"] == "mesh":
                    if (a, b) in canon:
                        bw, al = L["nv"][canon[(a, b)]], L["nv_alpha"]
                    else:
                        bw, al = L["pcie_p2p"]
                else:
                    bw, al = L["sw"]
                if engine == "sm":
                    bw *= 0.97
                meas.append({"probe": "p2p", "engine": engine, "src": ph(a), "dst": ph(b),
                             "samples": _sweep(noise, al, bw, reps)})
    # Same-source concurrent pairs (switch port sharing) and a few disjoint ones.
    for engine in ("ce", "sm"):
        for a in range(n):
            peers = [b for b in range(n) if b != a and (L["fabric"] != "mesh" or (a, b) in canon)][:2]
            if len(peers) < 2:
                continue
            times = []
            for _ in range(reps):
                row = []
                for b in peers:
                    if L["fabric"] != "mesh":  # a switch port or a PCIe link, shared by the two copies
                        bw, al = L["sw"][0] / 2, L["sw"][1]
                    else:
                        bw, al = L["nv"][canon[(a, b)]], L["nv_alpha"]
                    row.append(round(noise(al + BIG / (bw * (0.97 if engine == "sm" else 1.0) * 1000.0)), 4))
                times.append(row)
            meas.append({"probe": "p2p_concurrent", "engine": engine, "transfers": [[ph(a), ph(b)] for b in peers],
                         "bytes": BIG, "times_us": times})
    # Host copies alone and in pairs.
    for d in ("d2h", "h2d"):
        for c in range(n):
            meas.append({"probe": "host", "direction": d, "gpu": ph(c), "samples": _sweep(noise, halpha, hbw, reps)})
        for a in range(n):
            for b in range(a + 1, n):
                shared = group_of_c[a] == group_of_c[b]
                bw = hbw / 2 if shared else hbw
                times = [[round(noise(halpha + BIG / (bw * 1000.0)), 4) for _ in (a, b)] for _ in range(reps)]
                meas.append({"probe": "host_concurrent", "direction": d, "gpus": [ph(a), ph(b)], "bytes": BIG,
                             "times_us": times})
    nics = []
    for i, grp in enumerate(nic_groups):
        name = f"mlx5_{i}"
        socket = L["sockets"][groups_c[grp][0]]
        nics.append({"name": name, "pci_bus_id": f"0000:{0x10 + i:02x}:00.0", "numa_node": socket,
                     "rate_Gbps": L["nic_rate"]})
        for node in sorted(set(L["sockets"])):
            lat = 1.6 if node == socket else 2.3
            meas.append({"probe": "nic_loopback", "nic": name, "numa_node": node,
                         "samples": [[s, round(noise(lat + s / (L["nic_rate"] / 8 * 1000.0)), 5)]
                                     for s in SIZES[:12] for _ in range(reps)]})
        for c in range(n):
            keep = 0.55 if group_of_c[c] == grp else 1.0
            meas.append({"probe": "host_nic_busy", "nic": name, "direction": "d2h", "gpu": ph(c), "bytes": BIG,
                         "times_us": [round(noise(halpha + BIG / (hbw * keep * 1000.0)), 4) for _ in range(reps)]})
    if net:
        na, nb = L["net"]
        meas.append({"probe": "net", "peer": "peer:29500", "samples": _sweep(noise, na, nb, reps)})
    gpus = []
    for p in range(n):
        c = perm.index(p)
        gpus.append({"index": p, "name": f"synthetic {layout}", "pci_bus_id": f"0000:{0x80 + p:02x}:00.0",
                     "uuid": f"GPU-synthetic-{p}", "numa_node": L["sockets"][c], "sm": L["sm"], "sms": L["sms"],
                     **({"mem_GBps": L["mem"]} if "mem" in L else {})})
    doc = {"format": FORMAT, "version": VERSION, "tool": {"name": "taccl.profiler.synth", "layout": layout, "seed": seed},
           "host": {"hostname": f"synthetic-{layout}"}, "env": {"CUDA_DEVICE_ORDER": "PCI_BUS_ID"},
           "gpus": gpus, "nics": nics, "measurements": meas, "skipped": [], "status": "complete", "errors": []}
    truth = {
        "perm": perm,
        "pcie_groups": sorted(sorted(ph(c) for c in grp) for grp in groups_c),
        "nic_gpus": [sorted(ph(c) for c in groups_c[g]) for g in nic_groups],
        "nic_numa": [L["sockets"][groups_c[g][0]] for g in nic_groups],
        "edges": {(ph(a), ph(b)): k for (a, b), k in canon.items()},
        "fabric": L["fabric"],
        **{k: L[k] for k in ("host", "net") if k in L},
        **({"nv": L["nv"], "nv_alpha": L["nv_alpha"]} if "nv" in L else {"sw": L["sw"]}),
    }
    return doc, truth
