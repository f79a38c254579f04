"""`taccl batch SKU.yaml [-o OUTDIR] [--workers N] [--executor local|ray]`: everything a new cluster SKU needs."""
from __future__ import annotations

import json
import sys

from ..errors import UserError
from ..progress import Reporter


def register(sub) -> None:
    p = sub.add_parser("batch", help="synthesize, verify and select algorithms for a cluster SKU (many collectives, "
                                     "sizes and sketches; parallel, cached, resumable)",
                       description="Run every synthesis a SKU file asks for (in parallel, cached by the hash of its "
                                   "inputs, resumable after a kill), simulate every candidate and baseline on the size "
                                   "grid, and write one proven XML per winning size window, a selection table "
                                   "(CSV, JSON) and a Markdown report with plots.")
    p.add_argument("sku", metavar="SKU.yaml", help="SKU description (see sketches/skus/)")
    p.add_argument("-o", "--output", metavar="OUTDIR", help="output directory (default batch-<sku name>)")
    p.add_argument("--workers", type=int, default=None, help="jobs run at once (default: CPUs / solver threads)")
    p.add_argument("--executor", choices=("local", "ray"), default="local",
                   help="local processes (default) or a Ray cluster")
    p.add_argument("--ray-address", default=None, metavar="ADDR",
                   help="Ray cluster to join (default $RAY_ADDRESS, else a local Ray instance)")
    p.add_argument("--retry-failed", action="store_true", help="recompute jobs whose cached result is a failure")
    p.add_argument("--no-plots", action="store_true", help="skip the PNG plots of the report")
    p.add_argument("--prune", action="store_true",
                   help="after the run, delete cached results this SKU no longer uses (older inputs or taccl versions)")
    p.add_argument("--dry-run", action="store_true",
                   help="check the SKU file and list the jobs with what the cache already holds; run nothing")
    p.add_argument("-q", "--quiet", action="store_true")
    p.add_argument("--json", action="store_true", help="print a JSON summary on stdout")
    p.set_defaults(func=run)


def run(args) -> int:
    from ..batch import dry_run, run_batch
    from ..targets import default_target

    if args.ray_address and args.executor != "ray":
        raise UserError("a Ray cluster serves --executor ray only; give both, or neither", where="--ray-address")
    if args.dry_run and args.prune:
        raise UserError("--dry-run runs and deletes nothing; --prune deletes after a run: give one of them",
                        where="--prune")

    if args.dry_run:
        rows = dry_run(args.sku, args.output, retry_failed=args.retry_failed)
        if args.json:
            json.dump([{"label": t.label, "kind": t.kind, "collective": t.collective, "nodes": t.nodes,
                        "programs": len(t.programs), "state": state} for t, state in rows], sys.stdout, indent=1)
            print()
            return 0
        for t, state in rows:
            print(f"{state:<14} {t.kind:<10} {t.collective:<14} {t.nodes:>3} node(s)  {t.label} "
                  f"({len(t.programs)} program(s))")
        failed = sum(s == "cached failure" for _, s in rows)
        print(f"{len(rows)} jobs, {sum(s.startswith('cached') for _, s in rows)} cached"
              + (f" ({failed} of them failed: --retry-failed runs them again)" if failed else ""))
        return 0
    report = Reporter(quiet=args.quiet or args.json)
    result = run_batch(args.sku, args.output, workers=args.workers, executor=args.executor,
                       ray_address=args.ray_address, retry_failed=args.retry_failed, report=report,
                       plots=not args.no_plots, prune=args.prune)
    targets = result.targets or {"msccl-executor": (result.selection, result.outdir)}
    sel = result.selection

    def xml_files(selection, out):
        return {str(r): ":".join(str(out / f) for f in files) for r, files in selection.files.items()}

    if args.json:
        per = {name: {"outdir": str(out), "windows": sum(len(g.windows) for g in s.groups),
                      "msccl_algo_dir": str(out / "msccl-algorithms"), "msccl_xml_files": xml_files(s, out),
                      "report": str(out / "report.md")} for name, (s, out) in targets.items()}
        first = next(iter(per.values()))
        json.dump({"jobs": len(sel.jobs), "computed": result.computed, "cached": result.cached,
                   "failed": result.failed, "wall_s": round(result.wall_s, 1), **first, "targets": per},
                  sys.stdout, indent=1)
        print()
        return 0
    if not args.quiet:
        print(f"{len(sel.jobs)} jobs: {result.computed} run, {result.cached} from the cache, {result.failed} failed; "
              f"{result.wall_s:.0f} s")
        uncalibrated = result.sku.spec.calibration_note()
        if uncalibrated:
            print(f"note: {uncalibrated}")
        protocols = result.sku.spec.protocol_note()
        if protocols:
            print(f"note: {protocols}")
        for name, (s, out) in targets.items():
            if len(targets) > 1 or name != default_target(result.sku.spec):
                print(f"{name} ({out}):")
            _print_target(name, s, out, xml_files(s, out))
        if set(targets) == {"msccl-executor"} and sel.files:
            print("  (executor-dialect files: legacy MSCCL reads their windows otherwise, and RCCL refuses fused "
                  "steps: add `targets:` to the SKU; see docs/targets.md)")
        if result.failed:
            print(f"{result.failed} job(s) failed; their reasons are in the report (their sizes use the best "
                  f"remaining program)")
    return 0


def _print_target(name: str, sel, out, env: dict) -> None:
    from ..targets import get_target

    for g in sel.groups:
        for w in g.windows:
            lo, hi = w.speedup_range
            sp = f"  {lo:.2f}x-{hi:.2f}x vs baseline" if lo is not None and w.kind == "synthesized" else ""
            print(f"  {g.collective:<14} {g.ranks:>4} GPUs  {w.sizes[0]:>11} .. {w.sizes[-1]:<11} "
                  f"{w.winner or '(runtime default)'}{sp}")
    print(f"selection: {out / 'selection.csv'}  report: {out / 'report.md'}")
    if not env:
        return
    print("tell the runtime:")
    if name != "msccl-legacy":
        print(f"  export MSCCL_ALGO_DIR={out / 'msccl-algorithms'}    # {'RCCL' if name == 'rccl' else 'the MSCCL executor'}")
    for setting, why in get_target(name).env:
        print(f"  export {setting}    # {why}")
    for ranks, files in env.items():
        n = files.count(":") + 1
        who = "legacy MSCCL" if name == "msccl-legacy" else "taccl's runtime"
        print(f"  export MSCCL_XML_FILES={files}    # {ranks} GPUs, {n} file(s): {who}")
