"""`taccl check FILE.xml ...`: prove MSCCL XML programs correct.

Exit codes: 0 every file passes (warnings allowed), 1 some check fails, 2 a file cannot be read.
"""
from __future__ import annotations

import json
import sys

from ..checker import check_program
from ..errors import UserError
from ..program import MAX_NODES
from ..targets import TARGETS, get_target
from ..xmlio import DIALECTS, read_xml


def register(subparsers) -> None:
    p = subparsers.add_parser("check", help="prove an MSCCL XML program implements its collective and obeys the "
                                            "runtime's rules")
    p.add_argument("files", nargs="+", metavar="FILE.xml")
    p.add_argument("--json", action="store_true", help="print one JSON report per file (a list)")
    p.add_argument("--dialect", choices=DIALECTS, default=None,
                   help="read and check for this runtime (default: detect; 'outofplace' present = executor)")
    p.add_argument("--target", choices=sorted(TARGETS), default=None,
                   help="also refuse what this runtime refuses beyond its dialect (rccl: fused steps, more than 64 "
                        "thread blocks a rank); reads the target's dialect")
    p.add_argument("--max-steps", type=int, default=None, help="steps per tb allowed (default: 64 executor, "
                                                                "256 legacy)")
    p.add_argument("--max-nodes", type=int, default=MAX_NODES,
                   help=f"XML nodes one rank's parser may store (default {MAX_NODES}, MAX_NODES of every runtime)")
    p.add_argument("--root", type=int, default=None, help="root rank for broadcast/reduce/gather/scatter "
                                                          "when the file names none (default 0)")
    p.add_argument("--tiles", type=int, default=1, help=f"tile iterations replayed in the deadlock search (1 to "
                                                        f"{MAX_TILES}; default 1)")
    p.add_argument("--no-rendezvous", action="store_true", help="skip the unbuffered-send deadlock warning")
    p.add_argument("--quiet", "-q", action="store_true", help="print only errors and the summary")
    p.set_defaults(func=run)


def check_file(path: str, *, dialect=None, max_steps=None, max_nodes=MAX_NODES, root=None, tiles=1,
               rendezvous=True, target=None):
    """Read and check one file: (ParseResult, CheckReport). Raises UserError when unreadable."""
    if target is not None:
        dialect = get_target(target).dialect
    parsed = read_xml(path, dialect=dialect)
    report = check_program(parsed.program, dialect=parsed.dialect, max_steps=max_steps, max_nodes=max_nodes,
                           root=root, tiles=tiles, rendezvous=rendezvous, target=target)
    return parsed, report


# a deadlock between tiles needs a FIFO's worth of calls in flight (8 at most): far fewer tiles show it
MAX_TILES = 1024


def run(args) -> int:
    for flag, value, low, high in (("--max-steps", args.max_steps, 1, None), ("--max-nodes", args.max_nodes, 1, None),
                                   ("--tiles", args.tiles, 1, MAX_TILES)):
        if value is not None and (value < low or (high is not None and value > high)):
            raise UserError(f"must be at least {low}" + (f" and at most {high}" if high else "") + f", got {value}",
                            where=flag)
    if args.target and args.dialect and args.dialect != get_target(args.target).dialect:
        raise UserError(f"target {args.target} reads the {get_target(args.target).dialect} dialect, not "
                        f"{args.dialect}", where="--dialect")
    worst = 0
    docs = []
    for path in args.files:
        try:
            parsed, report = check_file(path, dialect=args.dialect, max_steps=args.max_steps,
                                        max_nodes=args.max_nodes, root=args.root, tiles=args.tiles,
                                        rendezvous=not args.no_rendezvous, target=args.target)
        except UserError as exc:
            if len(args.files) == 1 and not args.json:
                raise
            worst = max(worst, 2)
            if args.json:
                docs.append({"file": path, "ok": False, "unreadable": str(exc)})
            else:
                print(f"{exc}", file=sys.stderr)
            continue
        code = 0 if report.ok else 1
        worst = max(worst, code)
        if args.json:
            doc = {"file": path, "dialect": parsed.dialect, **report.to_dict(),
                   "notes": [{"line": n.line, "message": n.message} for n in parsed.notes]}
            docs.append(doc)
            continue
        for n in parsed.notes:
            if not args.quiet:
                print(f"{path}:{n.line}: note: {n.message}")
        for f in report.findings:
            if args.quiet and f.severity != "error":
                continue
            line = f"{path}:{f.line}:" if f.line is not None else f"{path}:"
            loc = f.location()
            print(f"{line} {f.severity} [{f.rule}]{' ' + loc if loc else ''}: {f.message}")
        for rule, n in report.suppressed.items():
            print(f"{path}: ... {n} more [{rule}] finding(s) not shown")
        print(f"{path}: {parsed.dialect} {report.summary()}")
    if args.json:
        print(json.dumps(docs, indent=1))
    return worst
