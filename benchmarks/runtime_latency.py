"""Where a small call's time goes in taccl's runtime: a call's fixed cost against its hops (issue 14).

Ring AllGather on one channel for 2, 4, 8 and 16 ranks (virtual ranks: with one GPU they all share it), at
one small size: a ring of n ranks takes a call's fixed cost plus n - 1 hops, so a least-squares line through
the rings' times gives both, per protocol and launch mode. Modes are runtime options: `hold` (the default:
the stream waits in a spin kernel until the launch is queued, so the events time the GPU alone), `no-hold`
(the events also time the host's submission of the launch), `plain` (a plain launch instead of a cooperative
one) and, for LL128 programs, `ll128-lines` (NCCL's LL128 line protocol). Each time is the median of the
calls' kernel times (CUDA events; the host backend's own clock with --backend host) after warm-up calls.

    python benchmarks/runtime_latency.py [--backend cuda|host] [--ranks 2,4,8,16] [--protos LL,LL128,Simple]
                                         [--size 1KiB] [--calls 50] [--keep DIR]
"""
from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from taccl import runtime as trt  # noqa: E402
from taccl.baselines import build  # noqa: E402
from taccl.topology import Topology, spec_from_dict  # noqa: E402
from taccl.units import format_size, parse_size  # noqa: E402
from taccl.xmlio import write_program  # noqa: E402

# mode: the runtime options it sets (the rest at their defaults)
MODES = {
    "hold": {},
    "no-hold": {"cuda_hold": 0},
    "plain": {"cuda_cooperative": 0},
    "ll128-lines": {"ll128": 1},
}


def ring_program(ranks: int, proto: str, directory: Path) -> Path:
    """The ring AllGather baseline for `ranks` GPUs behind one switch (one ring, so one channel)."""
    doc = {"name": f"ranks-{ranks}", "gpus_per_node": ranks, "max_nodes": 1,
           "link_types": {"link": {"alpha_us": 1.0, "bw_GBps": 100.0}},
           "switches": [{"name": "switch", "gpus": list(range(ranks)), "type": "link"}]}
    program = build("ring", Topology(spec_from_dict(doc), 1), "allgather", proto=proto)
    return write_program(program, directory / f"ring-allgather-{ranks}r-{proto}.xml")


def median_us(path: Path, backend: str, options: dict, size: int, calls: int, warmup: int) -> float:
    with trt.Runtime(backend=backend) as rt:
        for name, value in options.items():
            rt._option(name, value)
        idx = rt.load(path)
        info = rt.info(idx)
        count = trt.count_for_size(info.coll, info.ngpus, size, "float32", info.nchunksperloop)
        inputs = trt.make_inputs(info.coll, "float32", "sum", info.ngpus, count, seed=1)
        ref = trt.reference(info.coll, "float32", "sum", inputs)
        times = []
        for call in range(warmup + calls):
            out = rt.run_raw(info.coll, "float32", "sum", inputs, program=idx)
            if out.status != "done":
                raise RuntimeError(f"{path.name}: {out.status}: {out.message}")
            if call == 0 and trt.count_wrong(out.outputs, ref, "float32")[0]:
                raise RuntimeError(f"{path.name}: wrong result")
            if call >= warmup:
                times.append(out.elapsed_us)
        return statistics.median(times)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--backend", choices=("cuda", "host"), default="cuda")
    ap.add_argument("--ranks", default="2,4,8,16")
    ap.add_argument("--protos", default="LL,LL128,Simple")
    ap.add_argument("--modes", default=",".join(MODES), help=f"of {', '.join(MODES)}")
    ap.add_argument("--size", default="1KiB", help="bytes of the output buffer (1KiB = 1024)")
    ap.add_argument("--calls", type=int, default=50)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--keep", help="write the ring programs into this directory (else a temporary one)")
    args = ap.parse_args(argv)
    ranks = [int(r) for r in args.ranks.split(",")]
    protos = args.protos.split(",")
    modes = args.modes.split(",")
    unknown = [m for m in modes if m not in MODES]
    if unknown:
        ap.error(f"unknown mode {unknown[0]!r}; one of {', '.join(MODES)}")
    if args.backend == "cuda" and not trt.cuda_available():
        print("runtime_latency: the CUDA backend needs a GPU and the library built with nvcc", file=sys.stderr)
        return 2
    size = parse_size(args.size)
    with tempfile.TemporaryDirectory() as tmp:
        directory = Path(args.keep or tmp)
        directory.mkdir(parents=True, exist_ok=True)
        print(f"ring AllGather, one channel, {format_size(size)} float32, {args.backend} backend: median kernel us "
              f"of {args.calls} calls")
        print(f"{'protocol':9s} {'mode':12s} " + " ".join(f"{r:>5d}r" for r in ranks) + f" {'call us':>8s} {'hop us':>7s}")
        for proto in protos:
            paths = [ring_program(r, proto, directory) for r in ranks]
            for mode in modes:
                if mode == "ll128-lines" and proto != "LL128":
                    continue
                us = [median_us(p, args.backend, MODES[mode], size, args.calls, args.warmup) for p in paths]
                hop, call = np.polyfit([r - 1 for r in ranks], us, 1) if len(ranks) > 1 else (float("nan"), us[0])
                print(f"{proto:9s} {mode:12s} " + " ".join(f"{u:6.1f}" for u in us) + f" {call:8.1f} {hop:7.2f}",
                      flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
