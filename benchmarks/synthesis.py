"""Synthesis benchmark: model size and time per stage, predicted time, lower bound, ratio, and how well the
written program keeps the schedule (its simulated time over the solver's prediction, same size). "lower s" is
what `taccl solve` does after synthesis (lower, prove, prove in place, write the XML), "e2e s" the whole, and
"peak MiB" the instance's peak resident memory (each instance runs in a child process of its own).

    python benchmarks/synthesis.py [--groups core,scale] [--time-limit S] [--stall S] [--stretch]

Runs HiGHS with one thread (the CI machine has 2 cores). Prints one table.
"""
from __future__ import annotations

import argparse
import multiprocessing
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from instances import INSTANCES, REFERENCE_ROUTING_SIZE, SKETCHES  # noqa: E402

from taccl.errors import TacclError  # noqa: E402
from taccl.lowering import lower, max_tbs_of, serve_inplace, write_program  # noqa: E402
from taccl.progress import peak_memory_mb  # noqa: E402
from taccl.simulator import Simulator  # noqa: E402
from taccl.sketch import load_sketch  # noqa: E402
from taccl.synthesize import SynthesisOptions, resolve, synthesize  # noqa: E402


def fmt_size(stage):
    if not stage or not stage.get("variables"):
        return "-"
    return f"{stage['variables']}/{stage['constraints']}/{stage['binaries']}"


def run_instance(entry, args) -> tuple:
    """One table row: synthesis, then what `taccl solve` does after it (lower, prove, in-place proof, write),
    timed end to end; the written program simulated at the size it was synthesized for."""
    label, sketch, coll, size, _group, nodes = entry
    t0 = time.monotonic()
    sk = load_sketch(SKETCHES / sketch)
    algo = synthesize(sk, nodes=nodes, collective=coll, input_size=size,
                      options=SynthesisOptions(time_limit_s=args.time_limit, stall_s=args.stall, threads=1))
    total = time.monotonic() - t0
    st = {s["stage"]: s for s in algo.stages}
    ref = REFERENCE_ROUTING_SIZE.get(label)
    sim = lowering_s = "-"
    end_to_end = f"{total:.1f}"
    if not args.no_sim:
        topo = resolve(sk, nodes=nodes, collective=coll, input_size=size)[0]
        try:
            t1 = time.monotonic()
            program = lower(algo, max_tbs=max_tbs_of(topo.spec), topology=topo)
            serve_inplace(program)
            with tempfile.TemporaryDirectory() as out:
                write_program(program, Path(out) / "program.xml")
            lowering_s = f"{time.monotonic() - t1:.1f}"
            end_to_end = f"{time.monotonic() - t0:.1f}"
            sim = f"{Simulator(program, topo).run(algo.input_size_bytes).time_us:.2f}"
        except TacclError as exc:
            sim = f"({str(exc).splitlines()[0][:40]})"
    return (label, fmt_size(st["routing"]), "/".join(map(str, ref)) if ref else "-", fmt_size(st["contiguity"]),
            f"{st['routing']['time_s']:.2f}", f"{st['ordering']['time_s']:.2f}", f"{st['contiguity']['time_s']:.2f}",
            f"{total:.1f}", lowering_s, end_to_end, f"{peak_memory_mb():.0f}", f"{algo.time_us:.2f}",
            f"{algo.lower_bound_us:.2f}", f"{algo.time_us / algo.lower_bound_us:.2f}" if algo.lower_bound_us else "-",
            sim, f"{float(sim) / algo.time_us:.2f}" if sim[0].isdigit() else "-")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--groups", default="core,scale", help="instance groups to run (core, scale, stretch)")
    ap.add_argument("--stretch", action="store_true", help="also run the 512- and 1024-GPU instances (minutes each)")
    ap.add_argument("--time-limit", type=float, default=60.0, help="per MILP stage, seconds")
    ap.add_argument("--stall", type=float, default=None,
                    help="stop a MILP stage once its best solution stalls this long, seconds (default: taccl's; 0: never)")
    ap.add_argument("--no-sim", action="store_true", help="skip lowering and simulating the programs")
    args = ap.parse_args(argv)
    groups = set(args.groups.split(",")) | ({"stretch"} if args.stretch else set())
    header = ("instance", "routing v/c/b", "reference v/c/b", "contig v/c/b", "route s", "order s", "contig s",
              "total s", "lower s", "e2e s", "peak MiB", "time us", "bound us", "ratio", "sim us", "sim/pred")
    rows = []
    # each instance in a fresh child process, so that its peak memory is its own (as `taccl solve` prints it)
    with multiprocessing.get_context("fork").Pool(1, maxtasksperchild=1) as pool:
        for entry in INSTANCES:
            if entry[4] not in groups:
                continue
            row = pool.apply(run_instance, (entry, args))
            rows.append(row)
            print(f"  done: {entry[0]} in {row[9]} s", file=sys.stderr, flush=True)
    widths = [max(len(str(r[i])) for r in rows + [header]) for i in range(len(header))]
    line = "  ".join(h.ljust(w) for h, w in zip(header, widths))
    print(line)
    print("-" * len(line))
    for r in rows:
        print("  ".join(str(c).ljust(w) for c, w in zip(r, widths)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
