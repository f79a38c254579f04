"""`taccl simulate FILE.xml --topology T [--nodes N] --sizes 1K:1G`: predicted time and bandwidth per size.

Prints a fixed-width table (nccl-tests' columns: size, time, algbw, busbw) with the lower bound next to
each time, or JSON with ``--json``.
"""
from __future__ import annotations

import json
import math
import sys

from ..bounds import lower_bound
from ..checker import check_program
from ..errors import CheckFailed, UserError, about_file
from ..simulator import SimOptions, Simulator
from ..targets import RANK_MULTIPLIED, selects_size
from ..topology import Topology, load_spec
from ..units import SIZE_HELP, format_size, parse_size_range
from ..xmlio import read_xml


def register(subparsers) -> None:
    p = subparsers.add_parser("simulate", help="simulate an MSCCL XML program on a topology (alpha-beta with "
                                               "contention): time and algbw per size")
    p.add_argument("file", metavar="FILE.xml")
    p.add_argument("--topology", "-t", required=True, help="built-in name (ndv2, dgx2, ...) or topology file")
    p.add_argument("--nodes", "-n", type=int, default=None, help="node count (default: ranks / GPUs per node)")
    p.add_argument("--sizes", default="1K:1G", help=f"LO:HI[:FACTOR] or a comma list, e.g. 1K:1G (default; {SIZE_HELP})")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    p.add_argument("--no-tiling", action="store_true", help="move each chunk in one piece (no runtime tiles)")
    p.set_defaults(func=run)


def load_for(program, topology: str, nodes: int | None, path: str | None = None) -> Topology:
    if program.ngpus < 1:  # no node count fits it (the checker's algo.ranks)
        raise UserError(f"<algo> ngpus={program.ngpus}: expected at least one rank", path=path)
    if nodes is not None and nodes < 1:
        raise UserError(f"must be at least 1, got {nodes}", where="--nodes")
    spec = load_spec(topology, where="--topology")
    if nodes is None:
        if program.ngpus % spec.gpus_per_node:
            raise UserError(f"the program has {program.ngpus} ranks, not a multiple of the {spec.gpus_per_node} "
                            f"GPUs per node of {spec.name!r}", where="--topology")
        nodes = program.ngpus // spec.gpus_per_node
    elif nodes * spec.gpus_per_node != program.ngpus:
        raise UserError(f"{nodes} node(s) of {spec.name!r} have {nodes * spec.gpus_per_node} GPUs, the program "
                        f"{program.ngpus} ranks", where="--nodes")
    return Topology(spec, nodes)


_RUNTIME = {"executor": "the MSCCL executor", "legacy": "legacy MSCCL"}  # who reads each dialect


def _warn_if_refused(path: str, program, dialect: str) -> None:
    """A program that breaks a rule of the runtime it is written for (no channel, a channel index beyond
    nchannels, too many steps in a block, ...) still simulates, but would never run: say so on stderr."""
    report = check_program(program, dialect=dialect, rules_only=True)
    if report.ok:
        return
    first = report.errors[0]
    more = report.error_count - 1
    line = f":{first.line}" if first.line is not None else ""
    print(f"{path}{line}: warning: {_RUNTIME[dialect]} would refuse this program ({first.message}"
          f"{f'; {more} more rule error(s)' if more else ''}); simulated as written, `taccl check {path}` lists "
          f"them", file=sys.stderr)


def _json_numbers(row: dict) -> dict:
    """`row` with its infinite or NaN numbers as null: JSON has no Infinity (a program that moves nothing has an
    infinite bandwidth)."""
    return {k: None if isinstance(v, float) and not math.isfinite(v) else v for k, v in row.items()}


def run(args) -> int:
    parsed = read_xml(args.file)
    program = parsed.program
    topo = load_for(program, args.topology, args.nodes, args.file)
    sizes = parse_size_range(args.sizes)
    with about_file(args.file):  # a program the simulator cannot make sense of
        sim = Simulator(program, topo, SimOptions(tiling=not args.no_tiling))
    rows = []
    coll = "reducescatter" if program.collective == "reduce_scatter" else program.collective
    try:
        results = sim.run_sizes(sizes)
    except CheckFailed as exc:  # a deadlock: about the file (`taccl check` finds which steps)
        raise CheckFailed(f"{args.file}: {exc}; `taccl check {args.file}` names the steps") from None
    _warn_if_refused(args.file, program, parsed.dialect)  # once it simulated: an error comes alone
    blocks = max((len(g.threadblocks) for g in program.gpus), default=0)
    if topo.spec.sm_count and blocks > topo.spec.sm_count:  # every block spins: all must be resident at once
        print(f"{args.file}: warning: a rank has {blocks} thread blocks, more than the {topo.spec.sm_count} SMs of "
              f"{topo.name!r}'s GPUs (runtime.sm_count): on them the program hangs; simulated as written",
              file=sys.stderr)
    for s, r in zip(sizes, results):
        lb = None
        try:
            lb = lower_bound(topo, coll, s, root=program.root or 0, proto=program.proto)
        except UserError:
            pass
        rows.append((r, lb))
    uncalibrated = topo.spec.calibration_note()
    if args.json:
        print(json.dumps({"file": args.file, "topology": topo.name, "nodes": topo.nodes, "collective": coll,
                          "proto": str(program.proto), "uncalibrated": uncalibrated,
                          "results": [_json_numbers(dict(r.to_dict(), lower_bound_us=lb)) for r, lb in rows]},
                         indent=1, allow_nan=False))
        return 0
    print(f"# {args.file}: {coll} on {topo.name} x{topo.nodes} ({program.ngpus} ranks), proto {program.proto}, "
          f"tiling {'off' if args.no_tiling else 'on'}")
    if uncalibrated:
        print(f"# note: {uncalibrated}")
    print(f"{'size':>12} {'time':>12} {'algbw':>9} {'busbw':>9} {'bound':>12} {'x bound':>8} {'tiles':>6}")
    print(f"{'(B)':>12} {'(us)':>12} {'(GB/s)':>9} {'(GB/s)':>9} {'(us)':>12} {'':>8} {'':>6}")
    unselected = 0
    for r, lb in rows:
        ratio = f"{r.time_us / lb:8.2f}" if lb else f"{'-':>8}"
        lbs = f"{lb:12.2f}" if lb is not None else f"{'-':>12}"
        tiles = f"{r.tiles}" + ("" if r.exact else "~")
        # no runtime selects the program for a call of this size in any data type (single bytes included)
        mark = "" if selects_size(coll, program.ngpus, r.size_bytes, program.nchunksperloop, elem_bytes=1) else " *"
        unselected += bool(mark)
        print(f"{r.size_bytes:>12} {r.time_us:12.2f} {r.algbw_GBps:9.3f} {r.busbw_GBps:9.3f} {lbs} {ratio} {tiles:>6}"
              f"{mark}")
    print(f"# {len(rows)} size(s), {format_size(sizes[0])} to {format_size(sizes[-1])}; '~': tiles extrapolated")
    if unselected:
        ranks = f" and of its {program.ngpus} ranks" if coll in RANK_MULTIPLIED else ""
        print(f"# '*': no runtime runs the program at that size: it runs at calls whose element count is a multiple "
              f"of its nchunksperloop, {program.nchunksperloop}{ranks}")
    return 0
