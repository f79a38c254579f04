"""Simulator calibration: published hardware times next to what the simulator predicts for the same algorithm.

For every row of the data sets in benchmarks/data/calibration/ (see its README.md) the algorithm that ran is
rebuilt from taccl's baselines, lowered, and simulated on the matching topology file; printed per size:
the published time, the prediction, their ratio, and whether it is within the 25% target.

- NCCL rows (nccl-tests, NCCL's own choice of algorithm and protocol): the prediction is the faster of the
  `ring` and (AllReduce) `double-binary-tree` baselines, each in its best protocol, with as many channels as
  NCCL gives that call, a ring or a tree per channel (`nccl_channels`: 32 were allowed, NCCL uses fewer for
  small messages). AllReduce
  rows above NCCL's NVLS crossover are printed but excluded: NCCL runs NVLink SHARP there (in-switch
  reduction), which no MSCCL XML program can express.
- MSCCL rows (the MSCCL executor running Azure's published XML set for the machine): the prediction is the
  same algorithm rebuilt with taccl's DSL baselines (`direct` = all-pairs, `ring`), same protocol and
  instance count as the file that ran.

    python benchmarks/calibration.py [--only allgather] [--fit]

`--fit` re-derives the calibrated costs of the data sets' topology (least squares on the log ratios,
starting from the topology file's values) and prints them as the topology file's JSON blocks; it takes a
few minutes.
"""
from __future__ import annotations

import argparse
import copy
import csv
import math
import sys
import time
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from taccl.baselines import build, build_on_channels  # noqa: E402
from taccl.simulator import Simulator  # noqa: E402
from taccl.topology import PROTOCOLS, Topology, load_spec, spec_from_dict  # noqa: E402
from taccl.units import format_size  # noqa: E402

DATA = Path(__file__).resolve().parent / "data" / "calibration"
TARGET = 0.25  # |predicted / published - 1|
PRIOR_WEIGHT = 0.05  # fit: weight of log(value / starting value) next to each point's log error
NCCL_CHANNELS = 32  # NCCL_MIN_NCHANNELS=32 in the published runs
# NCCL 2.18 runs AllReduce on one H100 node with NVLS (NVLink SHARP) above this size: its tuning model
# (src/graph/tuning.cc @ v2.18.3) costs NVLS at 23 us of base latency and the ring's LL at 6.6 + 14 x 0.6 us
# but at most 87.7 GB/s bus bandwidth (llMaxBws, Hopper, one node), so NVLS wins from about 300 KiB; the
# published times jump there (20.5 us at 256 KiB, 29.9 us at 512 KiB) while MSCCL's LL ring stays at 19.1 us.
NVLS_ABOVE = {"dgx-h100": 262144}

# data set file -> (topology, nodes, kind)
DATASETS = {
    "h100-1node-nccl.csv": ("dgx-h100", 1, "nccl"),
    "h100-1node-msccl.csv": ("dgx-h100", 1, "msccl"),
}

# The MSCCL executor files of Azure's NDv5 set (msccl-scheduler tools/msccl-algorithms/ndv5), rebuilt:
# (baseline, protocol, instances). ag-*: all-pairs or ring AllGather; ap-1pass: one-shot AllReduce (each
# whole input into every peer's scratch, one local reduction); ap2ll, ap4ll: all-pairs AllReduce (scratch
# and one local reduction, then gathered); r48*: ring AllReduce, 8 rings x 4 channels.
MSCCL_PROGRAMS = {
    "ag-1k-512k.xml": ("direct", "LL", 2),
    "ag-1m.xml": ("direct", "LL", 4),
    "ag-2m.xml": ("direct", "LL128", 4),
    "ag-4m.xml": ("direct", "Simple", 4),
    "ag-8m.xml": ("direct", "Simple", 4),
    "ag-16m.xml": ("direct", "Simple", 4),
    "ag-32m-1g.xml": ("ring", "Simple", 32),
    "ap-1pass.xml": ("one-shot", "LL", 4),
    "ap2ll.xml": ("direct", "LL", 2),
    "ap4ll.xml": ("direct", "LL", 4),
    "r48ll.xml": ("ring", "LL", 32),
    "r48ll128.xml": ("ring", "LL128", 32),
}


# NCCL 2.18.3 (src/enqueue.cc getAlgoInfo, src/include/comm.h, src/include/devcomm.h): a ring or tree call
# of n bytes uses channels while n >= channels x threads x threshold; threads 512 (LL, Simple) or 640
# (LL128); thresholds 8 (LL, LL128) and 64 (Simple) bytes per thread, the ring's LL one times the ranks.
_NCCL_THREADS = {"LL": 512, "LL128": 640, "Simple": 512}
_NCCL_THRESHOLD = {"LL": 8, "LL128": 8, "Simple": 64}


def nccl_channels(algo: str, proto: str, nranks: int, nbytes: int, max_channels: int = NCCL_CHANNELS) -> int:
    """The channel count NCCL 2.18 gives one ring / tree call (at least 1)."""
    per = _NCCL_THREADS[proto] * _NCCL_THRESHOLD[proto] * (nranks if algo == "ring" and proto == "LL" else 1)
    return max(1, min(max_channels, nbytes // per))


@dataclass
class Row:
    dataset: str
    kind: str  # "nccl" | "msccl"
    topology: str
    nodes: int
    collective: str
    size: int
    published_us: float
    programs: list  # (label, baseline, collective, proto, n): the prediction is the fastest; n is NCCL's channel
    # count for the nccl rows (a ring or tree per channel), the program's instances for the msccl ones
    excluded: str = ""


def load_rows(data_dir: Path, only: str | None) -> list:
    rows = []
    for fname, (topo, nodes, kind) in DATASETS.items():
        path = data_dir / fname
        if not path.is_file():
            continue
        with open(path, newline="") as fh:
            for rec in csv.DictReader(fh):
                coll = rec["collective"].lower()
                if only and only != coll:
                    continue
                size = int(rec["bytes"])
                row = Row(fname, kind, topo, nodes, coll, size, float(rec["time_us"]), [])
                if kind == "nccl":
                    names = ["ring"] + (["double-binary-tree"] if coll == "allreduce" else [])
                    ranks = nodes * load_spec(topo).gpus_per_node
                    row.programs = []
                    for b in names:
                        for p in PROTOCOLS:
                            nc = nccl_channels("ring" if b == "ring" else "tree", p, ranks, size)
                            row.programs.append((f"{b}/{p}.{nc}ch", b, coll, p, nc))
                    limit = NVLS_ABOVE.get(topo)
                    if coll == "allreduce" and limit is not None and size > limit:
                        row.excluded = "NVLS"
                else:
                    algo = rec["msccl_algorithm"]
                    b, p, inst = MSCCL_PROGRAMS[algo]
                    row.programs = [(f"{algo}={b}/{p}.i{inst}", b, coll, p, inst)]
                rows.append(row)
    return rows


class Predictor:
    """Builds each program once and simulates it on a topology document (refit: on changed costs)."""

    def __init__(self, rows):
        self.rows = rows
        self.programs = {}
        for row in rows:
            topo = Topology(load_spec(row.topology), row.nodes)
            for _, b, coll, p, n in row.programs:
                key = (row.kind, row.topology, row.nodes, b, coll, p, n)
                if key in self.programs:
                    continue
                if row.kind == "nccl":
                    self.programs[key] = build_on_channels(b, topo, coll, n, proto=p, max_tbs=132)
                else:
                    self.programs[key] = build(b, topo, coll, instances=n, proto=p, max_tbs=132)
        self._sims = {}
        self._docs = None

    def predict(self, docs: dict) -> list:
        """Per row: (predicted us, label of the fastest program)."""
        if docs is not self._docs:  # costs changed: flatten again
            self._sims, self._docs = {}, docs
        sims = self._sims
        out = []
        for row in self.rows:
            best = None
            for label, b, coll, p, n in row.programs:
                key = (row.kind, row.topology, row.nodes, b, coll, p, n)
                sim = sims.get(key)
                if sim is None:
                    topo = Topology(spec_from_dict(docs[row.topology]), row.nodes)
                    sim = sims[key] = Simulator(self.programs[key], topo)
                t = sim.run(row.size).time_us
                if best is None or t < best[0]:
                    best = (t, label)
            out.append(best)
        return out


def print_tables(rows, preds) -> tuple:
    within = total = 0
    worst = 0.0  # largest |predicted / published - 1|
    for kind, title in (("nccl", "NCCL (nccl-tests, NCCL's choice) vs taccl's ring/tree baselines with NCCL's channels"),
                        ("msccl", "MSCCL executor (Azure's XML set) vs the same algorithm rebuilt in taccl's DSL")):
        sel = [(r, p) for r, p in zip(rows, preds) if r.kind == kind]
        if not sel:
            continue
        print(f"\n## {title}")
        print(f"{'collective':<11} {'size':>8} {'published':>10} {'predicted':>10} {'ratio':>6}  {'ok':<8} program")
        for r, (t, label) in sel:
            ratio = t / r.published_us
            if r.excluded:
                ok = f"excl:{r.excluded}"
            else:
                good = abs(ratio - 1) <= TARGET
                ok = "yes" if good else "NO"
                within += good
                total += 1
                worst = max(worst, abs(ratio - 1))
            print(f"{r.collective:<11} {format_size(r.size):>8} {r.published_us:10.2f} {t:10.2f} {ratio:6.2f}  {ok:<8} {label}")
    return within, total, worst


# ------------------------------------------------------------------------------------------------------
# Fitting

# physical ranges of the fitted parameters: a data bandwidth never exceeds the raw link's
_RANGES = {"alpha_us": (0.05, 30.0), "tb_bw_GBps": (1.0, None), "call_us": (0.5, 50.0),
           "local_bw_GBps": (10.0, 3000.0), "sync_us": (0.01, 5.0)}


def _params(doc):
    """The fitted parameters of a topology document, in nodes=1 data: (names, values, lower, upper)."""
    names, vals, lo, hi = [], [], [], []

    def add(name, v, rng):
        names.append(name)
        vals.append(v)
        lo.append(rng[0])
        hi.append(rng[1])

    for tname, lt in doc["link_types"].items():
        if tname in {t for _, _, t in _nic_types(doc)}:
            continue  # one node: the network is not in the data
        for p, c in lt.get("protocols", {}).items():
            add(("link", tname, p, "alpha_us"), c["alpha_us"], _RANGES["alpha_us"])
            add(("link", tname, p, "bw_GBps"), c["bw_GBps"], (1.0, lt["bw_GBps"]))
            if "tb_bw_GBps" in c:
                add(("link", tname, p, "tb_bw_GBps"), c["tb_bw_GBps"], (1.0, lt["bw_GBps"]))
    for p, v in doc.get("runtime", {}).get("call_us", {}).items():
        add(("call", p), v, _RANGES["call_us"])
    for f in ("local_bw_GBps", "sync_us"):
        if f in doc.get("runtime", {}):
            add(("runtime", f), doc["runtime"][f], _RANGES[f])
    return names, vals, lo, hi


def _nic_types(doc):
    return [(i, n.get("name"), n["type"]) for i, n in enumerate(doc.get("nics", []))]


def _apply(doc, names, vals):
    d = copy.deepcopy(doc)
    for n, v in zip(names, vals):
        if n[0] == "link":
            d["link_types"][n[1]]["protocols"][n[2]][n[3]] = float(v)
        elif n[0] == "call":
            d["runtime"]["call_us"][n[1]] = float(v)
        else:
            d["runtime"][n[1]] = float(v)
    for tname, lt in d["link_types"].items():
        for p, c in lt.get("protocols", {}).items():
            if "tb_bw_GBps" in c:  # keep each thread block's limit within its link
                c["tb_bw_GBps"] = min(c["tb_bw_GBps"], c["bw_GBps"])
            base = doc["link_types"][tname]["protocols"][p]
            if base.get("overhead_us") == base["alpha_us"]:  # a sender busy for all of alpha stays so
                c["overhead_us"] = c["alpha_us"]
    return d


def fit(rows, predictor, base_docs, max_evals: int = 600, only: list | None = None) -> dict:
    """Refine the one topology's calibrated parameters (those whose name contains one of `only`, or all)."""
    import numpy as np
    from scipy.optimize import minimize

    (tname, doc), = base_docs.items()
    names, x0, lo, hi = _params(doc)
    if only:
        keep = [i for i, n in enumerate(names) if any(o in "/".join(n) for o in only)]
        names, x0, lo, hi = ([v[i] for i in keep] for v in (names, x0, lo, hi))
        if not names:
            raise SystemExit(f"--fit-params {','.join(only)}: no parameter matches")
    used = [i for i, r in enumerate(rows) if not r.excluded]
    start = [math.log(v) for v in x0]

    def residuals(logx):
        d = _apply(doc, names, [math.exp(v) for v in logx])
        preds = predictor.predict({tname: d})
        errs = [math.log(preds[i][0] / rows[i].published_us) for i in used]
        # a weak pull towards the starting values keeps parameters the data cannot see where they were
        return errs + [PRIOR_WEIGHT * (a - b) for a, b in zip(logx, start)]

    t0 = time.monotonic()
    bounds = [(math.log(a), math.log(b)) for a, b in zip(lo, hi)]
    x = [min(max(v, a), b) for v, (a, b) in zip(start, bounds)]
    # derivative-free: lane counts (floor(B / c)) and the fastest-protocol choice make the error stepwise
    # small first steps (10% in each parameter): a refinement of the file's values, not a global search
    res = minimize(lambda v: sum(r * r for r in residuals(v)), x, method="Powell", bounds=bounds,
                   options={"maxfev": max_evals, "xtol": 0.01, "ftol": 1e-4, "direc": 0.1 * np.eye(len(x))})
    fitted = _apply(doc, names, [round(math.exp(v), 3) for v in res.x])
    errs = residuals(res.x)[:len(used)]
    print(f"# fit: {len(used)} points, {len(names)} parameters, {res.nfev} evaluations, "
          f"{time.monotonic() - t0:.0f} s, rms log error {math.sqrt(sum(v * v for v in errs) / len(used)):.3f}",
          file=sys.stderr)
    return {tname: fitted}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", type=Path, default=DATA, help="directory of the data sets (default: %(default)s)")
    ap.add_argument("--only", choices=["allgather", "allreduce"], help="one collective")
    ap.add_argument("--fit", action="store_true", help="refit the topology's calibrated costs and print them")
    ap.add_argument("--max-evals", type=int, default=600, help="fit: most model evaluations (default 600)")
    ap.add_argument("--fit-params", default=None,
                    help="fit: only the parameters whose path contains one of these comma-separated texts "
                         "(e.g. LL,call,sync_us; paths look like link/nvswitch/LL/alpha_us, call/LL)")
    args = ap.parse_args(argv)
    rows = load_rows(args.data, args.only)
    if not rows:
        print(f"no data sets found in {args.data}", file=sys.stderr)
        return 2
    predictor = Predictor(rows)
    docs = {r.topology: copy.deepcopy(load_spec(r.topology).raw) for r in rows}
    if args.fit:
        import json

        docs = fit(rows, predictor, docs, args.max_evals,
                   args.fit_params.split(",") if args.fit_params else None)
        for tname, d in docs.items():
            print(json.dumps({"link_types": d["link_types"], "runtime": d["runtime"]}, indent=1))
    preds = predictor.predict(docs)
    within, total, worst = print_tables(rows, preds)
    print(f"\n## summary: {within} of {total} predictions within {TARGET:.0%} of the published time "
          f"(largest error {worst:.0%}); excluded rows are not counted")
    return 0


if __name__ == "__main__":
    sys.exit(main())
