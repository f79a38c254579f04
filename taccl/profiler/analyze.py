"""From raw probe samples to what the topology file needs: link classes with costs, switch or direct wiring,
PCIe switch groups, NIC placement and the NIC's nearest CPU.

The three questions of TACCL section 4, and how each is answered here:

- *Which GPUs share a PCIe switch?*  Two GPUs copying to (or from) the host at the same time each lose
  bandwidth when they share the switch's uplink; `host_concurrent` samples give each pair's slowdown, and
  the groups are the connected components of the "slowed down together" graph.
- *Which switch holds the NIC?*  GPU-to-host copies slow down while the NIC runs loopback traffic only for
  the GPUs behind the NIC's switch (`host_nic_busy`).
- *Which CPU is nearest the NIC?*  Host-to-NIC loopback latency is lowest from the socket the NIC hangs
  off (`nic_loopback`, one series per NUMA node); sysfs's `numa_node` is the fallback.

Link costs: each directed GPU pair gets its own robust fit; pairs are clustered by bandwidth (gaps of more
than `CLUSTER_GAP` in log space start a new class); each class is then re-fitted on the pooled samples of
its members, which is the cost the synthesizer uses. A GPU pair counts as a direct (NVLink-class) link when
its bandwidth is clearly above what the host path gives (`PCIE_MARGIN` times the best GPU-host bandwidth);
slower pairs go through PCIe and the host and are recorded but not given to the synthesizer.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from . import samples as S
from .fit import Fit, fit_alpha_bw, robust_ratio

CLUSTER_GAP = 0.20  # a 20 % bandwidth gap between sorted pairs starts a new link class
PCIE_MARGIN = 1.25  # a pair is "direct" when faster than this times the best host bandwidth
# what a topology of a node without NVLink says of its model (also from the offline sources)
PCIE_NOTE = ("no NVLink between any two GPUs: they talk over PCIe, modelled as a switch whose ports are the GPUs' "
             "PCIe links; traffic between CPU sockets and PCIe switch uplinks shared by several GPUs are not modelled")
SHARED_RATIO = 0.80  # concurrent transfers keeping less than this of their alone bandwidth share something
NEAR_LATENCY_MARGIN = 0.05  # loopback latency must differ by 5 % to name a nearest socket


@dataclass
class LinkClass:
    name: str
    kind: str  # "direct", "switch" or "pcie"
    members: list  # directed (src, dst) pairs
    fit: Fit
    member_bw_GBps: list = field(default_factory=list)
    note: str = ""


@dataclass
class NicInfo:
    name: str
    numa_node: int | None = None  # nearest CPU socket / NUMA node
    numa_evidence: str = ""
    gpus_on_switch: list = field(default_factory=list)
    pcie_group: int | None = None
    switch_evidence: str = ""
    rate_Gbps: float | None = None


@dataclass
class Analysis:
    n_gpus: int
    engine: str | None = None
    pair_fits: dict = field(default_factory=dict)  # (engine, src, dst) -> Fit
    host_fits: dict = field(default_factory=dict)  # (direction, gpu) -> Fit
    classes: list = field(default_factory=list)
    switch_fabric: bool = False
    switch_evidence: str = ""
    pcie_groups: list | None = None
    pcie_evidence: list = field(default_factory=list)
    shared_paths: list = field(default_factory=list)
    nics: list = field(default_factory=list)
    loopback_fits: dict = field(default_factory=dict)  # (nic, numa) -> Fit
    net_fit: Fit | None = None
    unmeasured: list = field(default_factory=list)  # {"what", "reason"}
    notes: list = field(default_factory=list)

    def mark(self, what: str, reason: str) -> None:
        if {"what": what, "reason": reason} not in self.unmeasured:
            self.unmeasured.append({"what": what, "reason": reason})

    @property
    def direct_classes(self):
        return [c for c in self.classes if c.kind in ("direct", "switch")]


def _samples_xy(m):
    arr = np.asarray(m.get("samples", []), dtype=float).reshape(-1, 2)
    return arr[:, 0], arr[:, 1]


def cluster_by_bandwidth(values, gap: float = CLUSTER_GAP) -> list:
    """Indices of `values` grouped into clusters, slowest first; a jump of more than `gap` starts a new one.

    >>> cluster_by_bandwidth([21.0, 44.0, 22.5, 43.0, 21.7])
    [[0, 4, 2], [3, 1]]
    """
    order = sorted(range(len(values)), key=lambda i: values[i])
    out = []
    for i in order:
        if out and values[i] <= values[out[-1][-1]] * (1.0 + gap):
            out[-1].append(i)
        else:
            out.append([i])
    return out


def _components(n: int, edges) -> list:
    parent = list(range(n))

    def find(a):
        while parent[a] != a:
            parent[a] = parent[parent[a]]
            a = parent[a]
        return a

    for a, b in edges:
        parent[find(a)] = find(b)
    groups = {}
    for g in range(n):
        groups.setdefault(find(g), []).append(g)
    return sorted(groups.values())


def _alone_time(fit: Fit | None, nbytes: float) -> float:
    if fit is None or not math.isfinite(fit.alpha_us):
        return float("nan")
    return fit.time_us(nbytes)


def _column(times, k):
    vals = []
    for row in times:
        if isinstance(row, list) and len(row) > k:
            vals.append(float(row[k]))
        elif not isinstance(row, list) and k == 0:
            vals.append(float(row))
    return vals


def _best(values) -> float:
    """The fastest repetition: interference only ever slows a copy down, so the minimum is the robust choice."""
    v = [x for x in values if x is not None and math.isfinite(x) and x > 0]
    return min(v) if v else float("nan")


def _slowdowns(m, alone_fits):
    """Per transfer of a concurrent record: alone time / concurrent time (1 = no loss, 0.5 = halved)."""
    out = []
    for k, fit in enumerate(alone_fits):
        t = _best(_column(m.get("times_us", []), k))
        ta = _alone_time(fit, float(m.get("bytes", 0)))
        out.append(ta / t if t > 0 and math.isfinite(ta) else float("nan"))
    return out


def analyze(doc: dict, *, engine: str | None = None) -> Analysis:
    """Run every inference on a checked samples document (see `samples.check_samples`)."""
    n = len(doc.get("gpus", []))
    an = Analysis(n_gpus=n)
    for s in doc.get("skipped", []):
        an.mark(str(s.get("what") or s.get("probe")), str(s.get("reason", "skipped by the probe")))
    for e in doc.get("errors", []):
        an.notes.append(f"probe error: {e}")
    meas = doc.get("measurements", [])
    for m in meas:
        if not S.ok(m):
            what = m.get("probe", "?") + "".join(f" {k}={m[k]}" for k in ("engine", "src", "dst", "gpu", "nic", "direction") if k in m)
            an.mark(what, f"{m.get('status')}: {m.get('reason', 'no reason given')}")
    if n == 0:
        an.mark("GPUs", "no GPU visible to the probe: nothing to build a topology from")
    _fit_host(an, meas)
    _fit_pairs(an, meas, engine)
    _classify(an, meas)
    _pcie_groups(an, meas)
    _nics(an, doc, meas)
    _net(an, meas)
    return an


def _fit_host(an: Analysis, meas) -> None:
    for m in meas:
        if m["probe"] == "host" and S.ok(m):
            x, t = _samples_xy(m)
            f = fit_alpha_bw(x, t)
            an.host_fits[(m.get("direction", "d2h"), m["gpu"])] = f
            if not f.ok:
                an.mark(f"host {m.get('direction')} gpu={m['gpu']}", f.problem)
    if an.n_gpus and not an.host_fits:
        an.mark("GPU-host bandwidth", "no host copy samples")


def _fit_pairs(an: Analysis, meas, engine) -> None:
    by_engine = {}
    for m in meas:
        if m["probe"] == "p2p" and S.ok(m):
            x, t = _samples_xy(m)
            by_engine.setdefault(m.get("engine", "ce"), {})[(m["src"], m["dst"])] = (x, t)
    if engine is None:
        # Kernels move the data in the runtime, so SM-driven copies are preferred when they cover as many pairs.
        engine = max(sorted(by_engine), key=lambda e: (len(by_engine[e]), e == "sm"), default=None)
    an.engine = engine
    if an.n_gpus >= 2 and engine not in by_engine:
        an.mark("GPU-GPU links", f"no p2p samples{' for engine ' + engine if engine else ''}")
        return
    for e, pairs in by_engine.items():
        for (s, d), (x, t) in pairs.items():
            f = fit_alpha_bw(x, t)
            an.pair_fits[(e, s, d)] = f
            if e == engine and not f.ok:
                an.mark(f"p2p {e} {s}->{d}", f.problem)


def _classify(an: Analysis, meas) -> None:
    pairs = {(s, d): f for (e, s, d), f in an.pair_fits.items() if e == an.engine and f.ok}
    if not pairs:
        return
    host_bw = [f.bw_GBps for f in an.host_fits.values() if f.ok]
    cut = PCIE_MARGIN * max(host_bw) if host_bw else 0.0
    if not host_bw:
        an.notes.append("no GPU-host bandwidth: every measured GPU pair is treated as a direct link")
    keys = sorted(pairs)
    direct = [k for k in keys if pairs[k].bw_GBps > cut]
    pcie = [k for k in keys if pairs[k].bw_GBps <= cut]
    xy = {(m["src"], m["dst"]): _samples_xy(m) for m in meas
          if m["probe"] == "p2p" and S.ok(m) and m.get("engine", "ce") == an.engine}

    def pooled(members):
        xs = np.concatenate([xy[k][0] for k in members])
        ts = np.concatenate([xy[k][1] for k in members])
        return fit_alpha_bw(xs, ts)

    clusters = cluster_by_bandwidth([pairs[k].bw_GBps for k in direct])
    bws = [float(np.median([pairs[direct[i]].bw_GBps for i in c])) for c in clusters]
    names = _class_names(bws)
    for c, name in zip(clusters, names):
        members = [direct[i] for i in c]
        an.classes.append(LinkClass(name, "direct", sorted(members), pooled(members),
                                    [round(pairs[k].bw_GBps, 3) for k in sorted(members)]))
    if pcie and not direct and len({tuple(sorted(k)) for k in pcie}) == an.n_gpus * (an.n_gpus - 1) // 2:
        # No NVLink at all: the GPUs talk over PCIe, each through its own PCIe link, which all its transfers
        # share, as an NVSwitch port is shared: a switch of link type "pcie" (LL128 is not used over it)
        an.classes.append(LinkClass("pcie", "switch", pcie, pooled(pcie), [round(pairs[k].bw_GBps, 3) for k in pcie],
                                    note="no NVLink: every GPU pair over PCIe (at most "
                                         f"{PCIE_MARGIN} x the GPU-host bandwidth), a switch whose port is each "
                                         "GPU's PCIe link"))
        an.notes.append(PCIE_NOTE + " (the link type's bandwidth is the pooled pair fit)")
    elif pcie:
        an.classes.append(LinkClass("pcie", "pcie", pcie, pooled(pcie), [round(pairs[k].bw_GBps, 3) for k in pcie],
                                    note=f"through PCIe and the host (at most {PCIE_MARGIN} x the GPU-host bandwidth); "
                                         "not given to the synthesizer"))
    _switch_or_mesh(an, meas, direct)


def _class_names(bws) -> list:
    """'nvlink' for one class; 'nvlink_xK' (K = bandwidth multiple of the slowest) for several."""
    if len(bws) <= 1:
        return ["nvlink"][:len(bws)]
    names, lo = [], min(bws)
    for i, b in enumerate(bws):
        k = b / lo
        name = f"nvlink_x{round(k)}" if abs(k - round(k)) < 0.15 * round(k) else f"nvlink_c{i}"
        while name in names:
            name += "b"
        names.append(name)
    return names


def _switch_or_mesh(an: Analysis, meas, direct) -> None:
    n = an.n_gpus
    und = {tuple(sorted(k)) for k in direct}
    if n < 3 or len(an.direct_classes) != 1 or len(und) != n * (n - 1) // 2:
        return
    # Every pair is joined at one speed: an NVSwitch, or a full mesh of direct links. Two copies from one
    # GPU to two peers at once share the GPU's switch port (each slows to about half) but not mesh links.
    fits = {(s, d): f for (e, s, d), f in an.pair_fits.items() if e == an.engine}
    ratios = []
    for m in meas:
        if m["probe"] != "p2p_concurrent" or not S.ok(m) or m.get("engine", "ce") != an.engine:
            continue
        tr = [tuple(t) for t in m.get("transfers", [])]
        if len(tr) == 2 and tr[0][0] == tr[1][0]:
            ratios.extend(_slowdowns(m, [fits.get(t) for t in tr]))
    r = robust_ratio(ratios)
    cls = an.direct_classes[0]
    if math.isfinite(r) and r >= SHARED_RATIO:
        an.switch_evidence = (f"full mesh: two copies from one GPU keep {r:.0%} of their bandwidth "
                              f"({len(ratios)} transfers)")
        return
    an.switch_fabric = True
    cls.kind, cls.name = "switch", "nvswitch"
    if math.isfinite(r):
        an.switch_evidence = f"switch: two copies from one GPU keep only {r:.0%} of their bandwidth ({len(ratios)} transfers)"
    else:
        an.switch_evidence = "switch assumed: all pairs joined at one speed, and no same-source concurrent samples"
        an.mark("switch port sharing", "no same-source p2p_concurrent samples; an NVSwitch was assumed")


def _pcie_groups(an: Analysis, meas) -> None:
    n = an.n_gpus
    if n == 0:
        return
    pair_kept = {}
    for m in meas:
        if m["probe"] == "p2p_concurrent" and S.ok(m):
            fits = {(s, d): f for (e, s, d), f in an.pair_fits.items() if e == m.get("engine", "ce")}
            tr = [tuple(t) for t in m.get("transfers", [])]
            r = _slowdowns(m, [fits.get(t) for t in tr])
            if r and all(math.isfinite(v) for v in r):
                an.shared_paths.append({"transfers": [list(t) for t in tr], "kept": [round(v, 3) for v in r],
                                        "shared": bool(np.mean(r) < SHARED_RATIO)})
        if m["probe"] != "host_concurrent" or not S.ok(m):
            continue
        gpus = list(m.get("gpus", []))
        if len(gpus) != 2:
            continue
        d = m.get("direction", "d2h")
        r = _slowdowns(m, [an.host_fits.get((d, g)) for g in gpus])
        if not all(math.isfinite(v) for v in r):
            continue
        kept = float(np.mean(r))
        key = tuple(sorted(gpus))
        an.pcie_evidence.append({"gpus": gpus, "direction": d, "kept": round(kept, 3)})
        # A pair shares a switch only if it loses bandwidth in every direction measured.
        pair_kept[key] = max(pair_kept.get(key, 0.0), kept)
    seen = set(pair_kept)
    share = [k for k, v in pair_kept.items() if v < SHARED_RATIO]
    if n == 1:
        an.pcie_groups = [[0]]
        return
    if not seen:
        an.mark("PCIe switch groups", "no concurrent GPU-host samples (host_concurrent)")
        return
    missing = n * (n - 1) // 2 - len(seen)
    if missing:
        an.notes.append(f"PCIe groups: {missing} GPU pairs were not measured together; they are assumed not to share")
    an.pcie_groups = _components(n, share)


def _nics(an: Analysis, doc, meas) -> None:
    nic_meta = {x.get("name"): x for x in doc.get("nics", []) if isinstance(x, dict) and x.get("name")}
    names = list(nic_meta)
    for m in meas:
        if m["probe"] in ("nic_loopback", "host_nic_busy") and m.get("nic") not in names:
            names.append(m.get("nic"))
    if not names:
        an.mark("NIC", "no NIC found (no RDMA device under /sys/class/infiniband)")
        return
    for name in names:
        meta = nic_meta.get(name, {})
        info = NicInfo(name=name, rate_Gbps=meta.get("rate_Gbps"))
        # Nearest CPU: lowest loopback latency.
        lat = {}
        for m in meas:
            if m["probe"] == "nic_loopback" and m.get("nic") == name and S.ok(m):
                x, t = _samples_xy(m)
                f = fit_alpha_bw(x, t)
                an.loopback_fits[(name, m.get("numa_node"))] = f
                if math.isfinite(f.alpha_us):
                    lat[m.get("numa_node")] = f.alpha_us
        if len(lat) >= 2:
            best = sorted(lat, key=lambda k: lat[k])
            if lat[best[1]] > lat[best[0]] * (1 + NEAR_LATENCY_MARGIN):
                info.numa_node = best[0]
                info.numa_evidence = "loopback latency " + ", ".join(f"node {k}: {lat[k]:.2f} us" for k in sorted(lat))
            else:
                info.numa_evidence = "loopback latencies within 5 % of each other: " + \
                    ", ".join(f"node {k}: {lat[k]:.2f} us" for k in sorted(lat))
        if info.numa_node is None and isinstance(meta.get("numa_node"), int) and meta["numa_node"] >= 0:
            info.numa_node = meta["numa_node"]
            info.numa_evidence = (info.numa_evidence + "; " if info.numa_evidence else "") + "sysfs numa_node"
        if info.numa_node is None:
            an.mark(f"NIC {name} nearest CPU", "no loopback latencies from two sockets and no sysfs numa_node")
        # Switch: which GPUs lose host bandwidth while the NIC is busy.
        kept = {}
        for m in meas:
            if m["probe"] == "host_nic_busy" and m.get("nic") == name and S.ok(m):
                g = m["gpu"]
                t = _best(_column(m.get("times_us", []), 0))
                ta = _alone_time(an.host_fits.get((m.get("direction", "d2h"), g)), float(m.get("bytes", 0)))
                if t > 0 and math.isfinite(ta):
                    kept[g] = ta / t
        if kept:
            info.gpus_on_switch = sorted(g for g, r in kept.items() if r < SHARED_RATIO)
            info.switch_evidence = "GPU-host bandwidth kept while the NIC is busy: " + \
                ", ".join(f"GPU{g} {kept[g]:.0%}" for g in sorted(kept))
            if an.pcie_groups and info.gpus_on_switch:
                votes = [i for i, grp in enumerate(an.pcie_groups) for g in info.gpus_on_switch if g in grp]
                info.pcie_group = max(set(votes), key=votes.count)
        else:
            an.mark(f"NIC {name} PCIe switch", "no GPU-host samples with the NIC busy (host_nic_busy)")
        an.nics.append(info)


def _net(an: Analysis, meas) -> None:
    got = [m for m in meas if m["probe"] == "net"]
    good = [m for m in got if S.ok(m)]
    if not good:
        if not got:
            an.mark("inter-node alpha and bandwidth", "no peer node given (run with --peer on two nodes)")
        return
    xs = np.concatenate([_samples_xy(m)[0] for m in good])
    ts = np.concatenate([_samples_xy(m)[1] for m in good])
    an.net_fit = fit_alpha_bw(xs, ts)
    if not an.net_fit.ok:
        an.mark("inter-node link", an.net_fit.problem)
