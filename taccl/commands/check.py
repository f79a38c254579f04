"""`taccl check FILE.xml|DIR ...`: prove MSCCL XML programs correct.

A directory is checked as the target runtime loads it (`taccl.targets.load_order`): every file it would
read, in its order, and what goes wrong when they are loaded together (`directory_problems`).

Exit codes: 0 every file passes (warnings allowed), 1 some check fails, 2 a file cannot be read.
"""
from __future__ import annotations

import json
import os
import sys

from ..checker import check_program
from ..errors import UserError
from ..program import MAX_NODES
from ..targets import DEFAULT_TARGET, TARGETS, check_dialect, directory_problems, get_target, load_order
from ..xmlio import DIALECTS, read_xml


def register(subparsers) -> None:
    p = subparsers.add_parser("check", help="prove an MSCCL XML program implements its collective and obeys the "
                                            "runtime's rules")
    p.add_argument("files", nargs="+", metavar="FILE.xml|DIR",
                   help="programs, or directories checked as the target runtime loads them (MSCCL_ALGO_DIR; "
                        "for msccl-legacy the *.xml files as the MSCCL_XML_FILES list)")
    p.add_argument("--json", action="store_true", help="print one JSON report per file (a list)")
    p.add_argument("--dialect", choices=DIALECTS, default=None,
                   help="read and check for this runtime (default: detect; 'outofplace' present = executor)")
    p.add_argument("--target", choices=sorted(TARGETS), default=None,
                   help="also refuse what this runtime refuses or runs otherwise beyond its dialect (rccl: fused "
                        "steps, more than 64 thread blocks a rank; msccl-legacy: an unbounded window with scratch; "
                        "all: rooted programs); reads the target's dialect")
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
    check_dialect(args.target, args.dialect)
    docs = []
    single = len(args.files) == 1 and not os.path.isdir(args.files[0])
    worst = 0
    for path in args.files:
        if not os.path.isdir(path):
            worst = max(worst, _check_one(args, path, docs, single)[0])
            continue
        target = get_target(args.target or DEFAULT_TARGET)
        loaded = []
        for f in load_order(path, target):
            code, program = _check_one(args, str(f), docs, False)
            worst = max(worst, code)
            loaded.append((f, program))
        problems = directory_problems(loaded, target)
        if not loaded:  # a wrong directory: the runtime would load nothing and run its own algorithms
            what = "*.xml file" if target.dialect == "legacy" else "file"
            problems.append(("error", path, f"no {what} here for {target.name} to load"))
        for severity, where, message in problems:
            if args.json:
                docs.append({"directory": path, "file": where, "severity": severity, "rule": "directory",
                             "message": message})
            elif severity == "error" or not args.quiet:
                print(f"{where}: {severity} [directory]: {message}")
        errors = sum(s == "error" for s, _, _ in problems)
        worst = max(worst, 1 if errors else 0)
        if not args.json:
            print(f"{path}: {len(loaded)} file(s) as {target.name} loads them: "
                  f"{'OK' if not errors else f'{errors} directory error(s)'}")
    if args.json:
        print(json.dumps(docs, indent=1))
    return worst


def _check_one(args, path: str, docs: list, single: bool) -> tuple:
    """Check one file and print (or collect) its findings: (exit code, the Program or None if unreadable)."""
    try:
        parsed, report = check_file(path, dialect=args.dialect, max_steps=args.max_steps, max_nodes=args.max_nodes,
                                    root=args.root, tiles=args.tiles, rendezvous=not args.no_rendezvous,
                                    target=args.target)
    except UserError as exc:
        if single and not args.json:
            raise
        if args.json:
            docs.append({"file": path, "ok": False, "unreadable": str(exc)})
        else:
            print(f"{exc}", file=sys.stderr)
        return 2, None
    if args.json:
        docs.append({"file": path, "dialect": parsed.dialect, **report.to_dict(),
                     "notes": [{"line": n.line, "message": n.message} for n in parsed.notes]})
        return (0 if report.ok else 1), parsed.program
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
    return (0 if report.ok else 1), parsed.program
