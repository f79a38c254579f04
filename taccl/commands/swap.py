"""`taccl swap NEW... --into DIR`: publish a new program set into a directory running jobs watch.

A job's communicator that watches DIR (`Runtime.watch`, `tacclWatch`) takes its files at its next call. This
command checks the new set as that communicator would (the runtime's own loader and analysis: every file
loads and proves, one dialect, a program for a rank count the files DIR holds now serve, every collective
DIR serves now at those counts) before it replaces DIR's files all at once, so a job never sees half a set
or one it would refuse. Programs whose size windows overlap are published with a warning.

Exit codes: 0 published, 2 refused (nothing changed) or bad input.
"""
from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

from ..errors import UserError
from ..fileio import check_output_dir


def register(subparsers) -> None:
    p = subparsers.add_parser("swap", help="check a new program set and publish it into a watched directory")
    p.add_argument("new", nargs="+", metavar="NEW", help="the new set's XML files or directories")
    p.add_argument("--into", required=True, metavar="DIR",
                   help="the MSCCL_ALGO_DIR running jobs watch (created when absent)")
    p.add_argument("--quiet", "-q", action="store_true")
    p.set_defaults(func=run)


def _files(paths) -> list:
    out = []
    for p in map(Path, paths):
        if p.is_dir():
            out += sorted(f for f in p.iterdir() if f.is_file())
        elif p.is_file():
            out.append(p)
        else:
            raise UserError("no such file or directory", path=str(p))
    if not out:
        raise UserError("no file: expected the new set's XML files", path=", ".join(map(str, paths)))
    names = [f.name for f in out]
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        raise UserError(f"two files of the new set are named {dup[0]}: a directory holds one of each",
                        path=", ".join(str(f) for f in out if f.name == dup[0]))
    # checked in the order a watching job loads the published directory: by name (selection takes the first
    # program whose window fits, so the order decides where windows overlap)
    return sorted(out, key=lambda f: f.name)


def _overlap_warnings(files: list, target: Path) -> list:
    """Where two programs of the set take the same sizes, named as published in `target`: the first by name
    runs there (as `taccl check DIR` warns for the MSCCL executor, whose scan is the same)."""
    from ..targets import DEFAULT_TARGET, directory_problems, get_target
    from ..xmlio import read_program

    loaded = [(target / f.name, read_program(f)) for f in files]
    return [(path, msg) for severity, path, msg in directory_problems(loaded, get_target(DEFAULT_TARGET))
            if severity == "warning"]


def run(args) -> int:
    from ..runtime import Runtime

    target = check_output_dir(args.into, where="--into")
    if target.is_symlink():  # publish where the link points: what resolved it (a job, another link) sees it
        target = target.resolve()
    if target.is_dir():
        # the swap replaces the directory whole: what is not a file of the set would be lost with it
        others = sorted(p.name for p in target.iterdir() if not p.is_file())
        if others:
            raise UserError(f"holds {others[0]!r}, which is not a file: swap replaces the directory whole and "
                            f"would delete it; move it out (the directory should hold the program set alone)",
                            path=str(target), where="--into")
    files = _files(args.new)
    with Runtime() as rt:  # the communicator as the job holds it now, then the swap it would make
        current = sorted(f for f in target.iterdir() if f.is_file()) if target.is_dir() else []
        if current:
            try:
                rt.swap(current)
            except UserError as exc:
                raise UserError(f"its current files do not load, so no job can be watching them: {exc}",
                                where="--into") from None
        try:
            rt.swap(files)
        except UserError as exc:
            raise UserError(f"refused, {target} unchanged: {exc}") from None
    for path, msg in _overlap_warnings(files, target):
        print(f"warning: {path}: {msg}", file=sys.stderr)
    # build the directory aside and swap it in whole: a watcher sees the old set or the new one, never a mix
    staging = target.parent / f".{target.name}.new"
    old = target.parent / f".{target.name}.old"
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    for f in files:
        shutil.copy2(f, staging / f.name)
    shutil.rmtree(old, ignore_errors=True)
    if target.exists():
        os.replace(target, old)
    os.replace(staging, target)
    shutil.rmtree(old, ignore_errors=True)
    if not args.quiet:
        print(f"{target}: {len(files)} file(s) published; watching jobs take them at their next call")
    return 0
