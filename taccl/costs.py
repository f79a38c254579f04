"""Calibrated costs derived from the DGX H100 fit, for machines known only by their links' bandwidths: the
built-in topologies of other GPU generations (`benchmarks/calibration_derive.py` writes their blocks) and the
nodes `taccl profile` measures (docs/calibration.md, "Other machines").

No published data of the kind `benchmarks/calibration.py` fits against is at hand for other machines, so:

- per-step latencies, call costs and the flag latency as fitted (NCCL's tuning model uses one NVLink latency
  table for every generation);
- Simple and LL128 bandwidths: the link's bandwidth times the H100's protocol efficiency (fitted over the
  H100 file's link bandwidth, 396 GB/s, itself a measured copy bandwidth: so a profiled link's measured
  bandwidth is scaled the same way);
- per-thread-block limits and LL bandwidth: the H100's, scaled by NCCL's generation ratios
  (src/graph/tuning.cc: perChMaxTreeBws for Simple, perChMaxRingLL128Bws for LL128, llMaxBws for LL);
  on a direct-link mesh (NDv2, DGX-1) a GPU's LL bandwidth is split over its links by their bandwidth;
- one block's on-GPU bandwidth scaled by HBM bandwidth; SMs per GPU from the data sheets;
- the network (IB, RoCE): NCCL's per-step ring latencies over the network and wire efficiencies.
"""
from __future__ import annotations

import copy
import json

NETWORK_TYPES = ("ib", "roce")

H100_MEMORY_GBPS = 3352  # the H100 SXM's HBM3 bandwidth, the denominator of GENERATIONS' "hbm"
# generation / Hopper ratios of NCCL 2.30's tuning constants (perChMaxTreeBws, perChMaxRingLL128Bws, llMaxBws,
# one node) and of HBM bandwidth (GB/s); SMs per GPU: the data sheets' SXM parts ("part", of compute capability
# "cc"), which other GPUs of the generation do not share (A30: 8.0 and 56 SMs; H100 PCIe: 9.0 and 114)
GENERATIONS = {
    "volta": {"simple": 26.5 / 38.7, "ll128": 20.0 / 36.7, "ll": 39.0 / 141.0,
               "hbm": 900 / H100_MEMORY_GBPS, "sms": 80, "part": "V100 SXM2", "cc": 70},
    "ampere": {"simple": 24.0 / 38.7, "ll128": 20.0 / 36.7, "ll": 87.7 / 141.0,
                "hbm": 2039 / H100_MEMORY_GBPS, "sms": 108, "part": "A100 SXM", "cc": 80},
    "hopper": {"simple": 1.0, "ll128": 1.0, "ll": 1.0, "hbm": 1.0, "sms": 132, "part": "H100 SXM", "cc": 90},
    "blackwell": {"simple": 70.0 / 38.7, "ll128": 40.0 / 36.7, "ll": 282.0 / 141.0, "hbm": 8000 / H100_MEMORY_GBPS,
                  "sms": 148, "part": "B200", "cc": 100},
}
# NCCL's ring latency per step over the network (tuning.cc hwLat NET, us) and the data share of the wire
NETWORK = {"Simple": (14.0, 1.0), "LL128": (4.0, 0.92), "LL": (2.7, 0.5)}

# NCCL's ring latency per step over PCIe against NVLink (tuning.cc hwLat, PCI / NVLINK: LL 1.0 / 0.6, LL128
# 2.5 / 1.9, Simple 5.7 / 3.4): a PCIe link's per-step latencies are the fitted NVLink ones times these
PCIE_LATENCY = {"Simple": 5.7 / 3.4, "LL128": 2.5 / 1.9, "LL": 1.0 / 0.6}
# the link type `taccl profile` writes for GPUs that talk over PCIe only (its file leaves LL128 out of
# runtime.protocols: NCCL does not enable it there)
PCIE_TYPE = "pcie"

NETWORK_SOURCE = ("network (NET) costs: NCCL's ring latencies over the network, LL 2.7 / LL128 4.0 / Simple 14 "
                  "us per step (tuning.cc hwLat), all in flight (the proxy posts the sends); LL moves 8 data "
                  "bytes per 16, LL128 120 per 128")


def generation(compute_capability: int) -> str:
    """The GPU generation whose tuning constants NCCL applies to a GPU of this compute capability (major * 10 +
    minor): NCCL's own rule (tuning.cc, compCapIndex: 100 and up Blackwell, 90 Hopper, 80 Ampere, below Volta)."""
    cc = int(compute_capability)
    return "blackwell" if cc >= 100 else "hopper" if cc >= 90 else "ampere" if cc >= 80 else "volta"


def derived_source(gen: str, what: str) -> str:
    """The `sources` line of a topology whose costs `Derivation.apply` derived."""
    return (f"calibrated costs derived from the DGX H100 fit (taccl/costs.py) [I]: the same "
            f"per-step latencies and call cost (NCCL's tuning model uses one NVLink latency table for every GPU "
            f"generation); bandwidths scaled from the H100's protocol efficiencies; per-thread-block limits and "
            f"LL bandwidth scaled by NCCL's {gen.capitalize()}/Hopper ratios (tuning.cc perChMaxTreeBws, "
            f"perChMaxRingLL128Bws, llMaxBws; shared/docs/reference-numbers.md 1.8); {what}")


def _r(x: float) -> float:
    return round(x, 3)


class Derivation:
    """The H100 fit (a `dgx-h100` topology document), applied to other machines."""

    def __init__(self, h100: dict | None = None):
        if h100 is None:
            from .topology import BUILTIN_DIR

            h100 = json.loads((BUILTIN_DIR / "dgx-h100.json").read_text())
        self.fit = h100["link_types"]["nvswitch"]["protocols"]
        self.raw = h100["link_types"]["nvswitch"]["bw_GBps"]
        self.runtime_fit = h100["runtime"]

    def nvlink(self, raw: float, gen: str, ll_share: float = 1.0) -> dict:
        """Costs of an NVLink path of bandwidth `raw` (GB/s) on GPU generation `gen`."""
        g, f = GENERATIONS[gen], self.fit
        out = {
            "Simple": {"alpha_us": f["Simple"]["alpha_us"], "overhead_us": f["Simple"]["alpha_us"],
                       "bw_GBps": _r(raw * f["Simple"]["bw_GBps"] / self.raw),
                       "tb_bw_GBps": _r(f["Simple"]["tb_bw_GBps"] * g["simple"])},
            "LL128": {"alpha_us": f["LL128"]["alpha_us"], "bw_GBps": _r(raw * f["LL128"]["bw_GBps"] / self.raw),
                      "tb_bw_GBps": _r(f["LL128"]["tb_bw_GBps"] * g["ll128"])},
            "LL": {"alpha_us": f["LL"]["alpha_us"], "bw_GBps": _r(f["LL"]["bw_GBps"] * g["ll"] * ll_share),
                   "tb_bw_GBps": _r(f["LL"]["tb_bw_GBps"] * g["ll"])},
        }
        for p in out.values():  # one block never beats its link
            p["tb_bw_GBps"] = min(p["tb_bw_GBps"], p["bw_GBps"])
        return out

    def pcie(self, raw: float, gen: str) -> dict:
        """Costs of a PCIe path of measured bandwidth `raw` (GB/s): an NVLink path's, with NCCL's PCIe per-step
        latencies (`PCIE_LATENCY`) and LL at most half the link (8 data bytes in 16)."""
        out = self.nvlink(raw, gen)
        for p, c in out.items():
            c["alpha_us"] = _r(c["alpha_us"] * PCIE_LATENCY[p])
            if "overhead_us" in c:
                c["overhead_us"] = c["alpha_us"]
        out["LL"]["bw_GBps"] = min(out["LL"]["bw_GBps"], _r(raw * 0.5))
        for c in out.values():
            c["tb_bw_GBps"] = min(c["tb_bw_GBps"], c["bw_GBps"])
        return out

    def runtime(self, gen: str, sm_count: int | None = None, mem_bw_GBps: float | None = None) -> dict:
        """The runtime block for generation `gen`; one block's on-GPU bandwidth scaled by the GPU's memory
        bandwidth (`mem_bw_GBps`, e.g. as the probe read it) against the H100's, else by the generation's HBM."""
        g = GENERATIONS[gen]
        mem = mem_bw_GBps / H100_MEMORY_GBPS if mem_bw_GBps else g["hbm"]
        return {"call_us": dict(self.runtime_fit["call_us"]),
                "local_bw_GBps": _r(self.runtime_fit["local_bw_GBps"] * mem),
                "sync_us": self.runtime_fit["sync_us"], "sm_count": sm_count or g["sms"]}

    def apply(self, doc: dict, gen: str, mesh: bool, sm_count: int | None = None,
              mem_bw_GBps: float | None = None) -> dict:
        """A copy of topology document `doc` with the costs of generation `gen` on every link type and its
        runtime block; `mesh`: its GPUs are wired by direct links (each link's LL share by bandwidth)."""
        d = copy.deepcopy(doc)
        share = {}
        if mesh:  # each link's share of its GPU's NVLink bandwidth
            total = {}
            for link in d["links"]:
                bw = d["link_types"][link["type"]]["bw_GBps"]
                for g in (link["src"], link["dst"]) if link.get("bidirectional", True) else (link["src"],):
                    total[g] = total.get(g, 0) + bw
            per_gpu = max(total.values())
            share = {t: lt["bw_GBps"] / per_gpu for t, lt in d["link_types"].items()}
        for t, lt in d["link_types"].items():
            if t == PCIE_TYPE:
                lt["protocols"] = self.pcie(lt["bw_GBps"], gen)
            elif t not in NETWORK_TYPES:
                lt["protocols"] = self.nvlink(lt["bw_GBps"], gen, share.get(t, 1.0))
        protocols = d.get("runtime", {}).get("protocols")  # what the machine allows is not a cost: kept
        d["runtime"] = self.runtime(gen, sm_count, mem_bw_GBps)
        if protocols is not None:
            d["runtime"]["protocols"] = protocols
        return with_network(d)


def with_network(doc: dict) -> dict:
    """`doc` with NCCL's network costs on its network link types (in place)."""
    for t, lt in doc["link_types"].items():
        if t in NETWORK_TYPES:
            lt["protocols"] = {p: {"alpha_us": a, "bw_GBps": _r(lt["bw_GBps"] * f)} for p, (a, f) in NETWORK.items()}
    return doc
