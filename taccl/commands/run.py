"""`taccl run FILE.xml`: execute an MSCCL XML program on the runtime (host backend by default) and check it.

Exit codes: 0 ran (and, with --check, matched the reference), 1 deadlock or wrong result, 2 bad file or call.
"""
from __future__ import annotations

import json

from ..errors import UserError
from ..units import SIZE_HELP, parse_size


def register(subparsers) -> None:
    p = subparsers.add_parser("run", help="execute an XML program on the runtime and verify the result")
    p.add_argument("file", metavar="FILE.xml")
    p.add_argument("--ranks", type=int, default=None, help="number of ranks (must equal the file's ngpus; "
                                                           "default: the file's)")
    p.add_argument("--size", default="1M", help=f"bytes of the larger buffer, e.g. 1M, 64KiB (default 1M; {SIZE_HELP})")
    p.add_argument("--dtype", default="float32", help="int8 uint8 int32 uint32 int64 uint64 float16 bfloat16 "
                                                      "float32 float64 (default float32)")
    p.add_argument("--op", default="sum", help="sum prod min max (default sum)")
    p.add_argument("--inplace", action="store_true", help="in-place call (default: out-of-place when the "
                                                          "program allows it)")
    p.add_argument("--check", action="store_true", help="compare every rank's output with the reference")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.add_argument("--backend", choices=["host", "cuda"], default="host")
    p.add_argument("--seed", type=int, default=0, help="seed of the random input data")
    p.add_argument("--timeout-ms", type=int, default=None, help="watchdog: stop after this long without "
                                                                "progress (default 10000)")
    p.add_argument("--tile-bytes", type=int, default=None, help="override the protocol's tile size (bytes)")
    p.add_argument("--root", type=int, default=0, help="root rank for broadcast/reduce (default 0)")
    p.add_argument("--no-analysis", action="store_true", help="skip the load-time race/cycle analysis (the "
                                                               "run-time watchdog still applies)")
    p.set_defaults(func=run)


def run(args) -> int:
    from ..runtime import run_program

    size = parse_size(args.size, where="--size")
    if args.ranks is not None and args.ranks < 1:
        raise UserError(f"must be at least 1, got {args.ranks}", where="--ranks")
    if args.seed < 0:
        raise UserError(f"must be 0 or more, got {args.seed}", where="--seed")
    if args.timeout_ms is not None and args.timeout_ms < 1:
        raise UserError(f"must be at least 1 ms, got {args.timeout_ms}", where="--timeout-ms")
    if args.tile_bytes is not None and args.tile_bytes < 0:
        raise UserError(f"must be 0 (the protocol's tile) or more, got {args.tile_bytes}", where="--tile-bytes")
    for flag, value in (("--tile-bytes", args.tile_bytes), ("--timeout-ms", args.timeout_ms)):
        if value is not None and value >= 1 << 63:  # the runtime takes an int64 (it wrapped negative)
            raise UserError(f"must be less than 2^63, got {value}", where=flag)
    report = run_program(args.file, ranks=args.ranks, size=size, dtype=args.dtype, op=args.op,
                         inplace=True if args.inplace else None, check=args.check, backend=args.backend,
                         seed=args.seed, timeout_ms=args.timeout_ms, tile_bytes=args.tile_bytes, root=args.root,
                         analysis=not args.no_analysis)
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        verdict = "check OK" if report["checked"] \
            else "not checked"
        print(f"{report['file']}: {report['coll']} {report['ranks']} ranks, {report['bytes']} bytes "
              f"{report['dtype']} {report['op']} {'in-place' if report['inplace'] else 'out-of-place'} on "
              f"{report['backend']} ({report['proto']}, {report['tiles']} tile(s) per chunk): "
              f"{report['elapsed_us'] / 1000:.3f} ms, {verdict}")
    return 0
