"""The simulator fitted to taccl's own CUDA runtime, measured on one GPU (issue 14).

`benchmarks/results/gpu-1-2026-11-27/run1-h100-bench.txt` holds `taccl_bench` times of ring programs run by
the CUDA backend on one H100, 8 virtual ranks sharing the GPU (direct transfers on). This script rebuilds
those programs, describes the machine they ran on as a topology (8 GPUs behind one switch whose ports stand
for each rank's share of the GPU's memory; a thread block's rate, a step's latency and a call's cost per
protocol), fits those parameters to the measured times (least squares on the log ratios) and prints every
point, measured against predicted, and the fitted topology. The links are the GPU's own memory, not NVLink,
so this fits the runtime's costs (per block, per step, per call), not a cluster's.

    python benchmarks/runtime_fit.py [--write TOPOLOGY.json]
"""
from __future__ import annotations

import argparse
import json
import math
import re
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from taccl.baselines import build  # noqa: E402
from taccl.simulator import Simulator  # noqa: E402
from taccl.topology import Topology, load_topology, spec_from_dict  # noqa: E402
from taccl.units import format_size  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results" / "gpu-1-2026-11-27"
BENCH = RESULTS / "run1-h100-bench.txt"
MEMCPY_GBPS = 1496.8  # cudaMemcpy device to device at 256 MiB on the same H100 (run1-h100-bench.txt)
# the bench's program files: ring-<coll>-n1-<proto>[-i<instances>].xml, built as gpu_check.sh's inputs are
NAME = re.compile(r"ring-(allgather|allreduce|reducescatter)-n1-(Simple|LL128|LL)(?:-i(\d+))?\.xml")
# parameters, their starting values and what they are
PARAMS = [
    ("Simple.call_us", 6.0, "launch and set-up of a call"),
    ("Simple.alpha_us", 4.0, "one step: poll, barrier, post"),
    ("Simple.tb_bw_GBps", 30.0, "what one thread block moves"),
    ("Simple.bw_GBps", 150.0, "a rank's share of the GPU's memory bandwidth (delivered bytes)"),
    ("LL.call_us", 6.0, ""),
    ("LL.alpha_us", 3.0, ""),
    ("LL.tb_bw_GBps", 6.0, ""),
]


def measured() -> list:
    """[(file name, size bytes, out-of-place us)] of the runs with direct transfers on."""
    rows, name, direct = [], None, None
    for line in BENCH.read_text().splitlines():
        if line.startswith("# TACCL_RUNTIME_DIRECT="):
            direct = line.strip().endswith("=1")
        elif line.startswith("# taccl_bench "):
            name = Path(line.split()[2].rstrip(":")).name
        elif line.strip() and not line.startswith("#") and direct and name:
            f = line.split()
            rows.append((name, int(f[0]), float(f[5])))
    return rows


def topology_doc(x: dict) -> dict:
    """The 8-rank, one-GPU machine with the parameters `x` (LL128 runs the Simple path in this runtime)."""
    simple = {"alpha_us": x["Simple.alpha_us"], "overhead_us": x["Simple.alpha_us"], "bw_GBps": x["Simple.bw_GBps"],
              "tb_bw_GBps": min(x["Simple.tb_bw_GBps"], x["Simple.bw_GBps"])}
    ll = {"alpha_us": x["LL.alpha_us"], "bw_GBps": x["Simple.bw_GBps"] / 2,
          "tb_bw_GBps": min(x["LL.tb_bw_GBps"], x["Simple.bw_GBps"] / 2)}
    return {
        "name": "h100-virtual-ranks",
        "description": "taccl's CUDA runtime on one H100 with 8 virtual ranks (rank r on GPU 0): every rank reaches "
                       "every other through the GPU's own memory, modelled as one switch whose ports are each "
                       "rank's share of it; fitted by benchmarks/runtime_fit.py",
        "sources": [f"{BENCH.relative_to(ROOT)}: taccl_bench of ring AllGather (1, 8, 16 channels; Simple and LL) "
                    "and ring AllReduce (8 channels), NVIDIA H100 80GB HBM3, driver 580.159.04, CUDA 13.0, "
                    "direct transfers on"],
        "gpus_per_node": 8,
        "max_nodes": 1,
        "link_types": {"hbm": {"alpha_us": simple["alpha_us"], "bw_GBps": simple["bw_GBps"],
                               "protocols": {"Simple": simple, "LL128": dict(simple), "LL": ll}}},
        "switches": [{"name": "hbm", "gpus": list(range(8)), "type": "hbm"}],
        "runtime": {"call_us": {"Simple": x["Simple.call_us"], "LL128": x["Simple.call_us"], "LL": x["LL.call_us"]},
                    "local_bw_GBps": MEMCPY_GBPS / 8, "sync_us": x["Simple.alpha_us"] / 2, "sm_count": 132},
    }


def programs(rows) -> dict:
    out = {}
    ref = load_topology("dgx-h100", 1)  # the programs ran as built for it (the XML does not depend on costs)
    for name in {r[0] for r in rows}:
        m = NAME.fullmatch(name)
        coll, proto, inst = m.group(1), m.group(2), int(m.group(3) or 1)
        out[name] = build("ring", ref, coll, proto=proto, instances=inst)
    return out


def predict(progs: dict, rows, x: dict) -> list:
    topo = Topology(spec_from_dict(topology_doc(x)), 1)
    sims = {n: Simulator(p, topo) for n, p in progs.items()}
    return [sims[name].run(size).time_us for name, size, _ in rows]


def fit(progs, rows) -> dict:
    from scipy.optimize import least_squares

    names = [p for p, _, _ in PARAMS]
    meas = np.array([t for _, _, t in rows])

    def residuals(v):
        x = dict(zip(names, np.exp(v)))
        return np.log(np.array(predict(progs, rows, x)) / meas)

    start = np.log([s for _, s, _ in PARAMS])
    res = least_squares(residuals, start, diff_step=0.05, max_nfev=200)
    return dict(zip(names, np.exp(res.x)))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--write", default=None, help="write the fitted topology file here")
    args = ap.parse_args(argv)
    rows = measured()
    progs = programs(rows)
    x = fit(progs, rows)
    pred = predict(progs, rows, x)
    print(f"{'program':<34} {'size':>9} {'measured us':>12} {'predicted us':>13} {'ratio':>7}")
    errs = []
    for (name, size, t), p in zip(rows, pred):
        errs.append(abs(p / t - 1))
        print(f"{name:<34} {format_size(size):>9} {t:>12.1f} {p:>13.1f} {p / t:>7.3f}")
    within = sum(e <= 0.25 for e in errs)
    print(f"# {within} of {len(errs)} points within 25%; median error {100 * float(np.median(errs)):.1f}%, "
          f"largest {100 * max(errs):.1f}%")
    print("# fitted:")
    for name, _, what in PARAMS:
        print(f"#   {name:<20} {x[name]:9.3f}  {what}")
    if args.write:
        Path(args.write).write_text(json.dumps(topology_doc(x), indent=1) + "\n")
        print(f"# wrote {args.write}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
