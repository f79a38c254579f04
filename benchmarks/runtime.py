"""Runtime benchmark: time the XML interpreter on the shared and baseline programs, nccl-tests style.

Prints one fixed-width table (with a units row): program, collective, ranks, size, backend, time, algbw,
busbw and #wrong (every run is checked against the reference). Without a GPU it measures the host backend,
whose numbers say how fast the reference interpreter is, not how fast a GPU would be. When the CUDA backend
is built and a GPU is usable it measures the CUDA backend and adds cudaMemcpy of the same size as a
reference row ("peak" = one copy of the whole buffer).

    python benchmarks/runtime.py [--iters N] [--warmup N] [--quick] [--json FILE]
"""
from __future__ import annotations

import argparse
import ctypes
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from taccl import runtime as trt  # noqa: E402
from taccl.errors import TacclError  # noqa: E402

SHARED = ROOT.parent / "shared" / "data" / "msccl-xml"
DATA = ROOT / "runtime" / "tests" / "data"
CASES = [  # (file, sizes in bytes)
    (SHARED / "r48ll.xml", [266240 * 2, 1064960 * 2 - 0]),
    (SHARED / "ar_ll128.xml", [409600, 4096000]),
    (SHARED / "a2a2ll.xml", [4096, 32768]),
    (SHARED / "ag_hier_4_LL.xml", [4096, 262144]),
    (DATA / "ring_allreduce_4.xml", [65536, 1 << 20, 8 << 20]),
    (DATA / "direct_allreduce_4.xml", [65536, 1 << 20]),
    (DATA / "ring_allgather_4.xml", [65536, 1 << 20]),
]
BUS = {"allreduce": lambda n: 2 * (n - 1) / n, "allgather": lambda n: (n - 1) / n,
       "reducescatter": lambda n: (n - 1) / n, "alltoall": lambda n: (n - 1) / n}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--iters", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--quick", action="store_true", help="first size of each program only")
    ap.add_argument("--json", default=None, help="also write the rows as JSON to this file")
    args = ap.parse_args(argv)
    try:
        backend = "cuda" if trt.cuda_available() else "host"
        rows = []
        hdr = f"{'program':<24} {'coll':<10} {'ranks':>5} {'size':>10} {'backend':>8} {'time':>10} {'algbw':>8} " \
              f"{'busbw':>8} {'#wrong':>7}"
        units = f"{'':<24} {'':<10} {'':>5} {'(B)':>10} {'':>8} {'(us)':>10} {'(GB/s)':>8} {'(GB/s)':>8} {'':>7}"
        print(hdr)
        print(units)
        failed = 0
        for path, sizes in CASES:
            if not path.exists():
                continue
            with trt.Runtime(backend=backend) as rt:
                idx = rt.load(path)
                info = rt.info(idx)
                inplace = not info.outofplace
                for size in sizes[:1] if args.quick else sizes:
                    count = trt.count_for_size(info.coll, info.ngpus, size, "float32", info.nchunksperloop)
                    inputs = trt.make_inputs(info.coll, "float32", "sum", info.ngpus, count)
                    times = []
                    out = None
                    for i in range(args.warmup + args.iters):
                        out = rt.run_raw(info.coll, "float32", "sum", inputs, inplace=inplace, program=idx)
                        if out.status != "done":
                            raise TacclError(out.message)
                        if i >= args.warmup:
                            times.append(out.elapsed_us)
                    ref = trt.reference(info.coll, "float32", "sum", inputs)
                    wrong, _ = trt.count_wrong(out.outputs, ref, "float32")
                    failed += wrong > 0
                    us = sorted(times)[len(times) // 2]
                    algbw = size / 1000.0 / us
                    busbw = algbw * BUS.get(info.coll, lambda n: 1.0)(info.ngpus)
                    row = dict(program=path.name, coll=info.coll, ranks=info.ngpus, bytes=size, backend=backend,
                               time_us=us, algbw=algbw, busbw=busbw, wrong=wrong)
                    rows.append(row)
                    print(f"{path.name[:24]:<24} {info.coll:<10} {info.ngpus:>5} {size:>10} {backend:>8} "
                          f"{us:>10.1f} {algbw:>8.3f} {busbw:>8.3f} {wrong:>7}")
                    if backend == "cuda":
                        lib = trt._lib(cuda=True)
                        lib.tacclCudaMemcpyUs.restype = ctypes.c_int
                        lib.tacclCudaMemcpyUs.argtypes = [ctypes.c_int64, ctypes.c_int, ctypes.POINTER(ctypes.c_double)]
                        mus = ctypes.c_double()
                        if lib.tacclCudaMemcpyUs(size, args.iters, ctypes.byref(mus)) == 0:
                            print(f"{'  cudaMemcpy':<24} {'copy':<10} {'':>5} {size:>10} {'cuda':>8} {mus.value:>10.1f} "
                                  f"{size / 1000.0 / mus.value:>8.3f} {'':>8} {'':>7}")
        print(f"# backend: {backend}; median of {args.iters} runs after {args.warmup} warm-up; "
              f"data check: {'FAILED' if failed else 'OK'}")
        if backend == "host":
            print("# host backend: threads stand in for thread blocks; these times include thread start-up and "
                  "say nothing about GPU speed")
        if args.json:
            from taccl.fileio import write_json
            write_json(args.json, rows)
        return 1 if failed else 0
    except TacclError as exc:
        print(f"benchmarks/runtime.py: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    start = time.monotonic()
    rc = main()
    print(f"# {time.monotonic() - start:.1f} s", file=sys.stderr)
    sys.exit(rc)
