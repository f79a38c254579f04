"""Derive the calibrated costs of the other machines from the DGX H100 fit (docs/calibration.md, "Other machines").

No published data of the kind `benchmarks/calibration.py` fits against is at hand for the other GPU
generations, so their topology files carry values derived from `topologies/dgx-h100.json`:

- per-step latencies, call costs and the flag latency as fitted (NCCL's tuning model uses one NVLink latency
  table for every generation);
- Simple and LL128 bandwidths: the link's raw bandwidth times the H100's protocol efficiency (fitted over raw);
- per-thread-block limits and LL bandwidth: the H100's, scaled by NCCL's generation ratios
  (src/graph/tuning.cc: perChMaxTreeBws for Simple, perChMaxRingLL128Bws for LL128, llMaxBws for LL);
  on a direct-link mesh (NDv2, DGX-1) a GPU's LL bandwidth is split over its links by their bandwidth;
- one block's on-GPU bandwidth scaled by HBM bandwidth; SMs per GPU from the data sheets;
- the network (IB, RoCE): NCCL's per-step ring latencies over the network and wire efficiencies.

Run it after a refit of the H100 (`python benchmarks/calibration.py --fit`, pasted into the file):

    python benchmarks/calibration_derive.py [--check]

``--check`` writes nothing and exits 1 if a file differs from what it would write.
"""
from __future__ import annotations

import argparse
import copy
import json
import sys
from pathlib import Path

TOPOLOGIES = Path(__file__).resolve().parent.parent / "topologies"
NETWORK_TYPES = ("ib", "roce")

# generation / Hopper ratios of NCCL 2.30's tuning constants (perChMaxTreeBws, perChMaxRingLL128Bws, llMaxBws,
# one node) and of HBM bandwidth (GB/s); SMs per GPU
GENERATIONS = {
    "volta": {"simple": 26.5 / 38.7, "ll128": 20.0 / 36.7, "ll": 39.0 / 141.0, "hbm": 900 / 3352, "sms": 80},
    "ampere": {"simple": 24.0 / 38.7, "ll128": 20.0 / 36.7, "ll": 87.7 / 141.0, "hbm": 2039 / 3352, "sms": 108},
    "blackwell": {"simple": 70.0 / 38.7, "ll128": 40.0 / 36.7, "ll": 282.0 / 141.0, "hbm": 8000 / 3352,
                  "sms": 148},
}
# NCCL's ring latency per step over the network (tuning.cc hwLat NET, us) and the data share of the wire
NETWORK = {"Simple": (14.0, 1.0), "LL128": (4.0, 0.92), "LL": (2.7, 0.5)}

# topology -> (GPU generation, a mesh of direct links (LL shared by link bandwidth), what the source line says)
DERIVED = {
    "dgx-a100": ("ampere", False, "A100: 108 SMs, HBM2e 2.0 TB/s"),
    "dgx2": ("volta", False, "V100: 80 SMs, HBM2 0.9 TB/s"),
    "ndv2": ("volta", True, "V100: 80 SMs, HBM2 0.9 TB/s; a GPU's LL bandwidth split over its NVLinks by "
                            "their bandwidth"),
    "dgx1": ("volta", True, "V100: 80 SMs, HBM2 0.9 TB/s; a GPU's LL bandwidth split over its NVLinks by "
                            "their bandwidth"),
    "gb200-nvl72": ("blackwell", False, "B200: 148 SMs, HBM3e 8 TB/s"),
}

H100_SOURCE = ("calibrated costs (link_types.*.protocols, runtime): fitted to published times of one 8x H100 "
               "node (Azure ND H100 v5, NCCL 2.18.3 and the MSCCL executor: benchmarks/data/calibration, "
               "`python benchmarks/calibration.py --fit`); Simple's latency is all sender overhead (fence and "
               "flag handshake per step), LL/LL128 latencies are in flight")
NETWORK_SOURCE = ("network (NET) costs: NCCL's ring latencies over the network, LL 2.7 / LL128 4.0 / Simple 14 "
                  "us per step (tuning.cc hwLat), all in flight (the proxy posts the sends); LL moves 8 data "
                  "bytes per 16, LL128 120 per 128")
_GENERATED = ("calibrated costs", "network (NET) costs")


def _derived_source(gen: str, what: str) -> str:
    return (f"calibrated costs derived from the DGX H100 fit (benchmarks/calibration_derive.py) [I]: the same "
            f"per-step latencies and call cost (NCCL's tuning model uses one NVLink latency table for every GPU "
            f"generation); bandwidths scaled from the H100's protocol efficiencies; per-thread-block limits and "
            f"LL bandwidth scaled by NCCL's {gen.capitalize()}/Hopper ratios (tuning.cc perChMaxTreeBws, "
            f"perChMaxRingLL128Bws, llMaxBws; shared/docs/reference-numbers.md 1.8); {what}")


def _r(x: float) -> float:
    return round(x, 3)


class Derivation:
    def __init__(self, h100: dict):
        self.fit = h100["link_types"]["nvswitch"]["protocols"]
        self.raw = h100["link_types"]["nvswitch"]["bw_GBps"]
        self.runtime_fit = h100["runtime"]

    def nvlink(self, raw: float, gen: str, ll_share: float = 1.0) -> dict:
        """Costs of an NVLink path of raw bandwidth `raw` (GB/s) on GPU generation `gen`."""
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

    def runtime(self, gen: str) -> dict:
        g = GENERATIONS[gen]
        return {"call_us": dict(self.runtime_fit["call_us"]),
                "local_bw_GBps": _r(self.runtime_fit["local_bw_GBps"] * g["hbm"]),
                "sync_us": self.runtime_fit["sync_us"], "sm_count": g["sms"]}

    def apply(self, doc: dict, gen: str, mesh: bool) -> dict:
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
            if t not in NETWORK_TYPES:
                lt["protocols"] = self.nvlink(lt["bw_GBps"], gen, share.get(t, 1.0))
        d["runtime"] = self.runtime(gen)
        return with_network(d)


def with_network(doc: dict) -> dict:
    """`doc` with NCCL's network costs on its network link types (in place)."""
    for t, lt in doc["link_types"].items():
        if t in NETWORK_TYPES:
            lt["protocols"] = {p: {"alpha_us": a, "bw_GBps": _r(lt["bw_GBps"] * f)} for p, (a, f) in NETWORK.items()}
    return doc


def _with_sources(doc: dict, lines: list) -> dict:
    doc["sources"] = [s for s in doc.get("sources", []) if not s.startswith(_GENERATED)] + lines
    return doc


def derive_all() -> dict:
    """{topology file: its new document}, the H100's own network block included."""
    h100 = json.loads((TOPOLOGIES / "dgx-h100.json").read_text())
    der = Derivation(h100)
    # the H100 keeps its fitted NVSwitch and runtime blocks: only its network is NCCL's
    out = {"dgx-h100": _with_sources(with_network(copy.deepcopy(h100)), [H100_SOURCE, NETWORK_SOURCE])}
    for name, (gen, mesh, what) in DERIVED.items():
        doc = json.loads((TOPOLOGIES / f"{name}.json").read_text())
        out[name] = _with_sources(der.apply(doc, gen, mesh), [_derived_source(gen, what), NETWORK_SOURCE])
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="write nothing; exit 1 if a file would change")
    args = ap.parse_args(argv)
    changed = []
    for name, doc in derive_all().items():
        path = TOPOLOGIES / f"{name}.json"
        text = json.dumps(doc, indent=1) + "\n"
        if path.read_text() != text:
            changed.append(name)
            if not args.check:
                path.write_text(text)
    verb = "differ" if args.check else "rewritten"
    print(f"{len(changed)} topology file(s) {verb}: {', '.join(changed) or '-'}")
    return 1 if args.check and changed else 0


if __name__ == "__main__":
    sys.exit(main())
