"""What one call of the CUDA backend costs the caller: host wall time per call (median) next to the kernel
time (CUDA events), on the caller's own device buffers (CuPy), with the backend's per-shape state kept
between calls (option cuda_cache=1, the default) and rebuilt in every call (cuda_cache=0).

Needs the CUDA backend, a GPU and CuPy; prints one row per program, size and mode; the first call of each
mode is a warm-up and not counted.

    python benchmarks/runtime_calls.py [--calls N] [--sizes 1KiB,1MiB] FILE.xml...
"""
from __future__ import annotations

import argparse
import ctypes
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from taccl import runtime as trt  # noqa: E402
from taccl.units import parse_size  # noqa: E402


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("files", nargs="+")
    ap.add_argument("--calls", type=int, default=30)
    ap.add_argument("--sizes", default="1KiB,1MiB")
    args = ap.parse_args(argv)
    if not trt.cuda_available():
        print("runtime_calls: needs the CUDA backend and a GPU", file=sys.stderr)
        return 2
    import cupy as cp

    lib = trt._lib(cuda=True)
    print(f"{'program':44s} {'size':>10s} {'cache':>5s} {'wall us':>9s} {'kernel us':>9s} {'wrong':>6s}")
    for f in args.files:
        for size in (parse_size(s) for s in args.sizes.split(",")):
            for cache in (1, 0):
                with trt.Runtime(backend="cuda") as rt:
                    rt._option("cuda_cache", cache)
                    idx = rt.load(f)
                    info = rt.info(idx)
                    R = info.ngpus
                    count = trt.count_for_size(info.coll, R, size, "float32", info.nchunksperloop)
                    inputs = trt.make_inputs(info.coll, "float32", "sum", R, count, seed=1)
                    ref = trt.reference(info.coll, "float32", "sum", inputs)
                    send = [cp.asarray(x) for x in inputs]
                    recv = [cp.zeros(ref[r].size if ref[r] is not None else 1, cp.float32) for r in range(R)]
                    arr = lambda ptrs: (ctypes.c_void_p * R)(*ptrs)  # noqa: E731
                    sp, rp = arr([a.data.ptr for a in send]), arr([a.data.ptr for a in recv])
                    res = trt._RunResult()
                    walls, kernels = [], []
                    for call in range(args.calls + 1):
                        t0 = time.perf_counter()
                        st = lib.tacclRun(rt._h, idx, trt.COLLS.index(info.coll), trt.DTYPES.index("float32"), 0, R,
                                          count, sp, rp, 0, ctypes.byref(res))
                        t1 = time.perf_counter()
                        if st != 0 or res.outcome != 0:
                            print(f"{Path(f).name}: {rt._error()}")
                            break
                        if call:
                            walls.append((t1 - t0) * 1e6)
                            kernels.append(res.elapsedUs)
                    wrong = sum(int((cp.asnumpy(recv[r]) != ref[r]).sum()) for r in range(R) if ref[r] is not None)
                    if walls:
                        print(f"{Path(f).name[:44]:44s} {size:>10d} {cache:>5d} {statistics.median(walls):9.1f} "
                              f"{statistics.median(kernels):9.1f} {wrong:>6d}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
