"""Derive the calibrated costs of the other machines from the DGX H100 fit (docs/calibration.md, "Other machines").

The derivation itself lives in `taccl/costs.py` (which `taccl profile` applies to the nodes it measures); this
script writes its blocks into the built-in files of the other GPU generations, from `topologies/dgx-h100.json`.

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

from taccl.costs import NETWORK_SOURCE, Derivation, derived_source, with_network

TOPOLOGIES = Path(__file__).resolve().parent.parent / "topologies"

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
_GENERATED = ("calibrated costs", "network (NET) costs")


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
        out[name] = _with_sources(der.apply(doc, gen, mesh), [derived_source(gen, what), NETWORK_SOURCE])
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
