"""Correctness sweep of the runtime: every XML program given x data types x in/out of place x sizes, on random
data per rank and per iteration, checked element by element against the reference semantics.

This is the check a new backend (or a new GPU) must pass before its times mean anything. Each program is run
at every size of the grid, whatever its selection window says (the semantics hold at every size); a size is
rounded up to the nearest one the program can take. Prints one row per program and a summary; the exit
code is 1 when any run was wrong, deadlocked or failed.

    python benchmarks/runtime_sweep.py --backend cuda --sizes 1KiB,64KiB,1MiB --dtypes float32,float16,bfloat16 DIR...
"""
from __future__ import annotations

import argparse
import json
import sys
import time
import zlib
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from taccl import runtime as trt  # noqa: E402
from taccl.errors import TacclError, UserError  # noqa: E402
from taccl.targets import RANK_MULTIPLIED  # noqa: E402
from taccl.units import SIZE_HELP, parse_size  # noqa: E402


def program_files(paths: list[str]) -> list[Path]:
    out = []
    for p in map(Path, paths):
        if p.is_dir():
            out.extend(sorted(p.glob("*.xml")))
        elif p.exists():
            out.append(p)
        else:
            raise UserError(f"{p}: no such file or directory")
    return out


def fitting_size(coll: str, ranks: int, nchunks: int, size: int, dtype: str) -> int:
    """`size` rounded up to the nearest byte count the program can run (NCCL count x multiplier divisible by
    nchunksperloop)."""
    tsize = np.dtype(trt._NP[dtype]).itemsize
    mult = ranks if coll in RANK_MULTIPLIED else 1
    unit = int(np.lcm(nchunks, mult)) * tsize
    return max(unit, -(-size // unit) * unit)


def run_case(rt, idx, info, size, dtype, inplace, seed):
    """One checked run. Returns (status, wrong elements, elapsed us, message)."""
    count = trt.count_for_size(info.coll, info.ngpus, size, dtype, info.nchunksperloop)
    inputs = trt.make_inputs(info.coll, dtype, "sum", info.ngpus, count, seed)
    out = rt.run_raw(info.coll, dtype, "sum", inputs, inplace=inplace, program=idx)
    if out.status != "done":
        return out.status, 0, out.elapsed_us, out.message
    wrong, first = trt.count_wrong(out.outputs, trt.reference(info.coll, dtype, "sum", inputs), dtype)
    return ("wrong" if wrong else "ok"), wrong, out.elapsed_us, first or ""


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("paths", nargs="+", help="XML files or directories of them")
    ap.add_argument("--backend", choices=["host", "cuda"], default="host")
    ap.add_argument("--sizes", default="1KiB,64KiB,1MiB",
                    help=f"comma-separated sizes of the larger buffer ({SIZE_HELP})")
    ap.add_argument("--dtypes", default="float32,float16,bfloat16")
    ap.add_argument("--iters", type=int, default=2, help="runs per case, each on fresh random data")
    ap.add_argument("--timeout-ms", type=int, default=20000, help="the runtime's deadlock watchdog")
    ap.add_argument("--only-inplace", action="store_true")
    ap.add_argument("--only-outofplace", action="store_true")
    ap.add_argument("--json", default=None, help="also write every run as JSON to this file")
    args = ap.parse_args(argv)
    try:
        sizes = [parse_size(s) for s in args.sizes.split(",")]
        dtypes = args.dtypes.split(",")
        for d in dtypes:
            if d not in trt.DTYPES:
                raise UserError(f"unknown dtype {d!r}; one of {', '.join(trt.DTYPES)}")
        files = program_files(args.paths)
        runs, totals = [], {"ok": 0, "wrong": 0, "deadlock": 0, "failed": 0, "no_match": 0}
        print(f"{'program':<58} {'coll':<13} {'proto':<6} {'R':>3} {'runs':>5} {'wrong':>5} {'hang':>5} "
              f"{'fail':>5} {'max size':>10} {'slowest':>10}")
        print(f"{'':<58} {'':<13} {'':<6} {'':>3} {'':>5} {'':>5} {'':>5} {'':>5} {'(B)':>10} {'(us)':>10}")
        start = time.monotonic()
        for path in files:
            with trt.Runtime(backend=args.backend, timeout_ms=args.timeout_ms) as rt:
                idx = rt.load(path)
                info = rt.info(idx)
                modes = [m for m, ok in ((False, info.outofplace), (True, info.inplace)) if ok]
                modes = [m for m in modes if not (args.only_inplace and not m) and not (args.only_outofplace and m)]
                row = {"ok": 0, "wrong": 0, "deadlock": 0, "failed": 0, "no_match": 0}
                slowest, biggest, messages = 0.0, 0, []
                for size in sizes:
                    for dtype in dtypes:
                        n = fitting_size(info.coll, info.ngpus, info.nchunksperloop, size, dtype)
                        for inplace in modes:
                            for it in range(args.iters):
                                seed = zlib.crc32(f"{path.name}/{n}/{dtype}/{inplace}/{it}".encode())
                                status, wrong, us, msg = run_case(rt, idx, info, n, dtype, inplace, seed)
                                row[status] += 1
                                slowest, biggest = max(slowest, us), max(biggest, n)
                                if msg and len(messages) < 3:
                                    messages.append(f"{n} B {dtype} {'in' if inplace else 'out of'} place: {msg}")
                                runs.append(dict(program=path.name, coll=info.coll, proto=info.proto,
                                                 ranks=info.ngpus, bytes=n, dtype=dtype, inplace=inplace,
                                                 iteration=it, status=status, wrong=wrong, elapsed_us=us,
                                                 message=msg))
                for k in totals:
                    totals[k] += row[k]
                nruns = sum(row.values())
                print(f"{path.name[:58]:<58} {info.coll:<13} {info.proto:<6} {info.ngpus:>3} {nruns:>5} "
                      f"{row['wrong']:>5} {row['deadlock']:>5} {row['failed'] + row['no_match']:>5} "
                      f"{biggest:>10} {slowest:>10.0f}", flush=True)
                for m in messages:
                    print(f"    {m[:300]}")
        bad = totals["wrong"] + totals["deadlock"] + totals["failed"] + totals["no_match"]
        print(f"# {len(files)} programs, {sum(totals.values())} checked runs on the {args.backend} backend: "
              f"{totals['wrong']} wrong, {totals['deadlock']} deadlocked, {totals['failed'] + totals['no_match']} "
              f"failed; {time.monotonic() - start:.0f} s")
        if args.json:
            Path(args.json).write_text(json.dumps(runs, indent=1) + "\n")
        return 1 if bad else 0
    except TacclError as exc:
        print(f"benchmarks/runtime_sweep.py: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
