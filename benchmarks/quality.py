"""Algorithm quality: simulated time of each synthesized program next to the baselines and the lower bound.

For every instance of the synthesis benchmark (benchmarks/instances.py, group "core" by default) the sketch
is synthesized (`taccl.synthesize.synthesize`), lowered (`taccl.lowering.lower`, checked), and simulated
(`taccl.simulator`) at sizes 1 KB to 1 GB, as is every applicable baseline (`taccl.baselines`) on the same
topology. Printed per instance and size: the times, the best baseline, the lower bound
(`taccl.bounds`), and TACCL's time relative to the best baseline (< 1 is better).

    python benchmarks/quality.py [--groups core] [--sizes 1K:1G:4] [--time-limit 30] [--only LABEL]
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from instances import INSTANCES, SKETCHES  # noqa: E402

from taccl.baselines import BASELINES, applicable, build  # noqa: E402
from taccl.bounds import lower_bound  # noqa: E402
from taccl.errors import TacclError  # noqa: E402
from taccl.lowering import lower  # noqa: E402
from taccl.simulator import Simulator  # noqa: E402
from taccl.units import format_size, parse_size_range  # noqa: E402


def _fmt(t):
    return f"{t:10.1f}" if t is not None else f"{'-':>10}"


def run_instance(label, sketch, coll, size, args):
    from taccl.sketch import load_sketch
    from taccl.synthesize import SynthesisOptions, resolve, synthesize

    sk = load_sketch(SKETCHES / sketch)
    topo, collective, _ = resolve(sk, collective=coll, input_size=size)
    t0 = time.monotonic()
    note = ""
    try:
        algo = synthesize(sk, collective=coll, input_size=size,
                          options=SynthesisOptions(time_limit_s=args.time_limit, threads=1))
        prog = lower(algo)
        progs = {"taccl": prog}
        note = f"synthesized+lowered in {time.monotonic() - t0:.1f} s"
    except TacclError as exc:
        progs = {}
        note = f"synthesis/lowering failed: {exc}".splitlines()[0]
    for name, colls in BASELINES.items():
        if collective.name in colls and applicable(name, topo, collective.name):
            try:
                progs[name] = build(name, topo, collective.name)
            except TacclError as exc:
                note += f"; {name}: {exc}".splitlines()[0]
    sims = {k: Simulator(p, topo) for k, p in progs.items()}
    sizes = parse_size_range(args.sizes)
    names = [k for k in progs if k != "taccl"]
    print(f"\n## {label}: {collective.name} on {topo.name} x{topo.nodes} ({topo.num_ranks} ranks); {note}")
    head = f"{'size':>10} {'taccl us':>10} " + " ".join(f"{n[:10]:>10}" for n in names)
    print(head + f" {'bound us':>10} {'best base':>18} {'taccl/best':>10}")
    ratios = []
    for s in sizes:
        times = {k: sim.run(s).time_us for k, sim in sims.items()}
        base = {k: v for k, v in times.items() if k != "taccl"}
        best = min(base.items(), key=lambda kv: kv[1]) if base else None
        lb = lower_bound(topo, collective.name, s, root=collective.root or 0)
        ratio = times["taccl"] / best[1] if best and "taccl" in times else None
        if ratio is not None:
            ratios.append(ratio)
        print(f"{format_size(s):>10} {_fmt(times.get('taccl'))} " + " ".join(_fmt(times[n]) for n in names)
              + f" {_fmt(lb)} {(best[0] if best else '-'):>18} {(f'{ratio:10.2f}' if ratio else f'{chr(45):>10}')}")
    return ratios


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--groups", default="core", help="instance groups (core, scale, stretch)")
    ap.add_argument("--sizes", default="1K:1G:4", help="sizes to simulate (default 1K:1G:4)")
    ap.add_argument("--time-limit", type=float, default=30.0, help="per MILP stage, seconds")
    ap.add_argument("--only", default=None, help="run only instances whose label contains this text")
    args = ap.parse_args(argv)
    groups = set(args.groups.split(","))
    summary = []
    for label, sketch, coll, size, group in INSTANCES:
        if group not in groups or (args.only and args.only not in label):
            continue
        ratios = run_instance(label, sketch, coll, size, args)
        if ratios:
            summary.append((label, min(ratios), max(ratios)))
    print("\n## summary: taccl time / best baseline time over the sizes (< 1: taccl faster)")
    for label, lo, hi in summary:
        print(f"{label:<40} {lo:6.2f} .. {hi:6.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
