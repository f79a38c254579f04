"""What a live swap of the program set costs a running job (issue 13), on the host backend.

A job runs collectives back to back on one communicator (a runtime handle) while another thread swaps in a
new set every few calls (`Runtime.swap`, which loads and proves the files first). Prints, per program set
pair: the median time of a call, of the first call on a new set (the one that applies the swap), the time
the swapping thread spends loading and proving the set (it runs beside the job, which never waits for it),
and what the job lost to a swap: the median extra time of the first call on a set over that set's own
steady calls, in units of its call. Issue 13's target: a swap costs at most 2 calls' time.

    python benchmarks/reconfigure.py [--calls 400] [--swaps 20]
"""
from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from taccl import runtime as trt  # noqa: E402
from taccl.baselines import build  # noqa: E402
from taccl.lowering import write_program  # noqa: E402
from taccl.topology import load_topology  # noqa: E402

CASES = [  # (topology, nodes, collective, [(baseline, instances) of the sets swapped in turn], elements a rank)
    ("ndv2", 2, "allreduce", [("ring", 1), ("hierarchical", 1)], 1 << 10),
    ("ndv2", 2, "allgather", [("ring", 1), ("ring", 2)], 1 << 12),
    ("dgx-h100", 1, "allreduce", [("ring", 1), ("double-binary-tree", 1)], 1 << 14),
]


def measure(workdir: Path, topology: str, nodes: int, coll: str, sets: list, count: int, calls: int,
            swaps: int) -> dict:
    topo = load_topology(topology, nodes)
    dirs = []
    for k, (name, inst) in enumerate(sets):
        d = workdir / f"{topology}-{nodes}-{coll}-{k}"
        d.mkdir()
        write_program(build(name, topo, coll, instances=inst), d / f"{coll}.xml")
        dirs.append(d)
    R = topo.num_ranks
    inputs = trt.make_inputs(coll, "float32", "sum", R, count, seed=1)
    with trt.Runtime() as rt:
        rt.swap(dirs[0])
        for _ in range(5):
            rt.run_raw(coll, "float32", "sum", inputs)  # warm up
        every = max(2, calls // (swaps + 1))
        load_s, epochs, stamps = [], [], []

        def swapper(k):
            t0 = time.perf_counter()
            epochs.append(rt.swap(dirs[k % len(dirs)]))
            load_s.append(time.perf_counter() - t0)

        for i in range(calls):
            if i % every == every - 1 and len(epochs) < swaps:
                t = threading.Thread(target=swapper, args=(len(epochs) + 1,))
                t.start()
                t.join()  # the set waits for the next call: the swap lands between two calls, as in a job
            t0 = time.perf_counter()
            out = rt.run_raw(coll, "float32", "sum", inputs)
            stamps.append((out.call, out.generation, time.perf_counter() - t0))
            assert out.status == "done", out.message
    # each set's own steady call time (the sets alternate, and their programs differ), against the first
    # call on it after a swap
    gen0 = stamps[0][1]
    firsts = set(epochs)
    steady = {}
    for call, gen, s in stamps:
        if call not in firsts:
            steady.setdefault((gen - gen0) % len(dirs), []).append(s)
    med = {k: statistics.median(v) for k, v in steady.items()}
    costs = [(s - med[(gen - gen0) % len(dirs)]) / med[(gen - gen0) % len(dirs)]
             for call, gen, s in stamps if call in firsts]
    firsts_us = [s * 1e6 for call, gen, s in stamps if call in firsts]
    return {"case": f"{topology} x{nodes} {coll} ({R} ranks), {'/'.join(n for n, _ in sets)}", "swaps": len(epochs),
            "call_us": statistics.median([s for v in steady.values() for s in v]) * 1e6,
            "first_us": statistics.median(firsts_us), "load_us": statistics.median(load_s) * 1e6,
            "cost_calls": max(0.0, statistics.median(costs))}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--calls", type=int, default=400)
    ap.add_argument("--swaps", type=int, default=20)
    args = ap.parse_args(argv)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for topology, nodes, coll, sets, count in CASES:
            rows.append(measure(Path(tmp), topology, nodes, coll, sets, count, args.calls, args.swaps))
    print(f"{'case':<52} {'swaps':>5} {'call':>10} {'first call':>11} {'load+prove':>11} {'swap cost':>10}")
    print(f"{'':<52} {'':>5} {'(us)':>10} {'(us)':>11} {'(us, aside)':>11} {'(calls)':>10}")
    for r in rows:
        print(f"{r['case']:<52} {r['swaps']:>5} {r['call_us']:>10.1f} {r['first_us']:>11.1f} {r['load_us']:>11.1f} "
              f"{r['cost_calls']:>10.2f}")
    worst = max(r["cost_calls"] for r in rows)
    print(f"# worst swap cost {worst:.2f} calls (target: at most 2)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
