"""Batch benchmark: wall time of `taccl batch` on a SKU from an empty cache, then of the rerun, and the table.

    python benchmarks/batch.py [SKU.yaml] [--workers N] [--executor local|ray] [--keep DIR]

Default SKU: sketches/skus/ndv2.yaml (2x NDv2; AllGather, ReduceScatter, AllReduce, AllToAll; 1 KiB to 1 GiB),
the issue's target being under 30 minutes on the 2-core CI machine. Prints the selection table, the
synthesis cost per job, and the two wall times.
"""
from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from taccl.batch import run_batch  # noqa: E402
from taccl.units import format_size  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent


def _speedup(w) -> str:
    lo, hi = w.speedup_range
    return "-" if lo is None else f"{lo:.2f}-{hi:.2f}"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("sku", nargs="?", default=str(ROOT / "sketches" / "skus" / "ndv2.yaml"))
    ap.add_argument("--workers", type=int, default=None)
    ap.add_argument("--executor", default="local", choices=("local", "ray"))
    ap.add_argument("--keep", default=None, metavar="DIR", help="write the output here and keep it")
    args = ap.parse_args(argv)
    out = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="taccl-batch-"))
    shutil.rmtree(out / "cache", ignore_errors=True)
    t0 = time.monotonic()
    first = run_batch(args.sku, out, workers=args.workers, executor=args.executor)
    cold = time.monotonic() - t0
    t0 = time.monotonic()
    again = run_batch(args.sku, out, workers=args.workers, executor=args.executor)
    warm = time.monotonic() - t0
    sel = first.selection
    print(f"# {sel.sku}: {len(sel.jobs)} jobs ({first.computed} run, {first.failed} failed), "
          f"{sum(len(g.contenders) for g in sel.groups)} programs simulated at {len(sel.grid)} sizes")
    print(f"{'collective':<14} {'GPUs':>4} {'sizes':<22} {'winner':<34} {'kind':<11} {'best baseline':<26} {'speedup':>10}")
    for g in sel.groups:
        for w in g.windows:
            sizes = f"{format_size(w.sizes[0])}-{format_size(w.sizes[-1])}"
            base = ",".join(sorted({b for b in w.best_baseline if b})) or "-"
            print(f"{g.collective:<14} {g.ranks:>4} {sizes:<22} {w.winner or '-':<34} {w.kind:<11} {base:<26} "
                  f"{_speedup(w):>10}")
    print(f"\n{'synthesis job':<34} {'collective':<14} {'status':<8} {'time s':>7} {'pred us':>10} {'bound us':>10}")
    for j in sel.jobs:
        if j.kind == "synthesis":
            pred = f"{j.predicted_us:.1f}" if j.predicted_us is not None else "-"
            lb = f"{j.lower_bound_us:.1f}" if j.lower_bound_us is not None else "-"
            print(f"{j.label:<34} {j.collective:<14} {j.status:<8} {j.time_s:>7.1f} {pred:>10} {lb:>10}")
    print(f"\nwall time: {cold:.1f} s from an empty cache, {warm:.1f} s rerun ({again.computed} jobs recomputed); "
          f"output in {out}")
    if not args.keep:
        shutil.rmtree(out, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
