"""`taccl solve SKETCH.json`: synthesize an algorithm, prove it, write <name>.algo.json (and <name>.xml)."""
from __future__ import annotations

import json
import sys
from pathlib import Path

from ..errors import UserError
from ..fileio import check_output_dir, check_output_file, check_output_name, load_json, write_json
from ..progress import Reporter, peak_memory_mb
from ..sketch import load_sketch
from ..solver import MAX_THREADS, SOLVERS
from ..targets import (RANK_MULTIPLIED, add_target_argument, check_custom_target, prepare_for_target, selects_size,
                       target_of_args)
from ..units import SIZE_HELP, parse_size


def register(sub):
    p = sub.add_parser("solve", help="synthesize an algorithm from a communication sketch",
                       description="Synthesize a collective algorithm (routing MILP, ordering heuristic, contiguity MILP), "
                                   "verify it, lower it to an MSCCL XML program proven by the checker, and write <name>.algo.json and <name>.xml.")
    p.add_argument("sketch", help="communication sketch (JSON)")
    p.add_argument("--topology", help="built-in topology name or topology file (overrides the sketch)")
    p.add_argument("--nodes", type=int, help="number of nodes (overrides the sketch)")
    p.add_argument("--collective", help="allgather, alltoall, reducescatter, allreduce, broadcast, reduce, gather, scatter, "
                                        "or a JSON file with a custom collective")
    p.add_argument("--size", help=f"input size, e.g. 1M, 64KiB (overrides the sketch; default 1M; {SIZE_HELP})")
    p.add_argument("--solver", choices=SOLVERS, default=None, help="MILP solver (default: the sketch's, else highs)")
    p.add_argument("--time-limit", type=float, default=None, metavar="S",
                   help="time limit per MILP stage in seconds (default: the sketch's, else 120)")
    p.add_argument("--stall", type=float, default=None, metavar="S",
                   help="stop a MILP stage once its best solution has not improved for S seconds of solver "
                        "work (CPU time, so machine load does not change the result; default: the sketch's, "
                        "else 3; 0: run to the time limit)")
    p.add_argument("--threads", type=int, default=None, help="solver threads (default: the sketch's, else 1)")
    p.add_argument("--max-extra-hops", type=int, default=None, help="allow routes this many hops longer than minimal")
    p.add_argument("--name", help="output name (default: the sketch's)")
    p.add_argument("--no-xml", action="store_true", help="write only the algorithm JSON")
    p.add_argument("--proto", default=None, choices=["Simple", "LL", "LL128"],
                   help="runtime protocol: the synthesizer costs links for it and the XML uses it "
                        "(default: the sketch's hyperparameters.protocol, else Simple)")
    p.add_argument("--instances", type=int, default=None,
                   help="thread blocks per connection (each chunk split N ways): the synthesizer costs links for "
                        "it and the XML uses it (default: the sketch's hyperparameters.instances, else 1)")
    p.add_argument("--max-memory", metavar="SIZE", default=None,
                   help="refuse, before solving, a problem whose synthesis is estimated to need more memory "
                        f"than this, e.g. 8G (default: this machine's memory; {SIZE_HELP})")
    add_target_argument(p)
    p.add_argument("-o", "--output", default=".", metavar="OUTDIR",
                   help="output directory (default .); a path ending in .xml names the program itself, the "
                        "algorithm then goes beside it as NAME.algo.json")
    p.add_argument("-q", "--quiet", action="store_true")
    p.add_argument("--json", action="store_true", help="print a JSON summary on stdout")
    p.set_defaults(func=run)


def run(args) -> int:
    from ..synthesize import (SynthesisOptions, custom_collective_file, default_name, sketch_topology_spec,
                              synthesize)

    if args.time_limit is not None and not args.time_limit > 0:  # (NaN too)
        raise UserError(f"must be positive, got {args.time_limit}", where="--time-limit")
    if args.stall is not None and not args.stall >= 0:
        raise UserError("must be 0 (no stall limit) or positive", where="--stall")
    if args.nodes is not None and args.nodes < 1:
        raise UserError("must be at least 1", where="--nodes")
    if args.threads is not None and not 1 <= args.threads <= MAX_THREADS:
        raise UserError(f"must be from 1 to {MAX_THREADS} (a solver thread per core), got {args.threads}",
                        where="--threads")
    if args.max_extra_hops is not None and args.max_extra_hops < 0:
        raise UserError("must be 0 (minimal routes only) or more", where="--max-extra-hops")
    report = Reporter(quiet=args.quiet or args.json)
    sketch = load_sketch(args.sketch)
    spec = sketch_topology_spec(sketch, args.topology)
    target = target_of_args(args, spec)
    if args.instances is not None and not 1 <= args.instances <= 32:
        raise UserError("must be between 1 and 32", where="--instances")
    opts = SynthesisOptions(solver=args.solver, threads=args.threads, max_extra_hops=args.max_extra_hops,
                            proto=args.proto, instances=args.instances, time_limit_s=args.time_limit,
                            stall_s=args.stall,
                            max_memory_bytes=None if args.max_memory is None else parse_size(args.max_memory,
                                                                                           where="--max-memory"))
    custom = custom_collective_file(sketch, args.collective)
    if custom and not isinstance(load_json(custom), dict):  # a missing or broken file before the target's rule
        raise UserError("expected a JSON object (a user-defined collective)", path=custom, where="$")
    if custom and not args.no_xml:
        check_custom_target(target)
    out, name, xml_suffix = _output_place(args.output, args.name)
    if name is None:  # the sketch's name, else its file's
        name = check_output_name(default_name(sketch, args.collective), suffix=".algo.json", path=sketch.path,
                                 where="$.name")
    algo = synthesize(sketch, topology=args.topology, nodes=args.nodes, collective=args.collective, input_size=args.size,
                      options=opts, report=report, name=name)
    xml_path = None
    program = simulated_us = None
    if not args.no_xml:
        program, simulated_us = _lower(algo, target, report)
    # Everything is proven before anything is written.
    algo_path = write_json(out / f"{name}.algo.json", algo.to_json())
    written = [str(algo_path)]
    if program is not None:
        from ..lowering import write_program

        xml_path = out / (name + xml_suffix)
        write_program(program, xml_path, target=target.name)
        written.append(str(xml_path))
    summary = {"name": name, "time_us": algo.time_us, "simulated_us": simulated_us,
               "uncalibrated": spec.calibration_note(),
               "lower_bound_us": algo.lower_bound_us, "inplace": bool(program is not None and program.inplace),
               "ratio": algo.time_us / algo.lower_bound_us if algo.lower_bound_us else None,
               "transfers": len(algo.transfers), "stages": algo.stages, "notes": algo.notes, "files": written,
               "elapsed_s": round(report.elapsed(), 3), "peak_memory_mb": round(peak_memory_mb(), 1)}
    if args.json:
        json.dump(summary, sys.stdout, indent=1)
        print()
    else:
        for f in written:
            report(f"wrote {f}")
        for n in algo.notes + ([summary["uncalibrated"]] if summary["uncalibrated"] else []):
            report(f"note: {n}")
        report(f"finished in {summary['elapsed_s']:.1f} s, peak memory {summary['peak_memory_mb']:.0f} MiB")
    return 0


def _output_place(output: str, name: str | None) -> tuple:
    """(directory, name or None for the sketch's, the program file's suffix) of `-o` and `--name`. `-o X.xml` (not
    a directory) is the program's file, as for `taccl lower` and `taccl baseline`: X.xml and X.algo.json, its
    directory made if need be (`-o X.XML` keeps the user's spelling of the suffix)."""
    path = Path(output)
    if output.lower().endswith(".xml") and not path.is_dir():
        if name is not None:
            raise UserError(f"names the program's file ({path.name}), so --name {name!r} has no place: give one "
                            f"of them", where="-o")
        check_output_file(path)
        if path.name[:-len(".xml")] in ("", "."):
            raise UserError("expected the program's file name before .xml", path=output, where="-o")
        stem, suffix = path.name[:-len(".xml")], path.name[-len(".xml"):]
        return path.parent, check_output_name(stem, suffix=".algo.json", where="-o"), suffix
    if name is not None:
        name = check_output_name(name, suffix=".algo.json")
    return check_output_dir(output), name, ".xml"


def _lower(algo, target, report):
    from ..lowering import lower, max_tbs_of
    from ..progress import warn
    from ..simulator import simulate
    from ..units import format_size

    report(f"lowering to MSCCL XML for {target.name} (proto {algo.protocol}, {algo.instances} instance(s))")
    # on the topology it was synthesized for, `lower` keeps the fastest of its fusion policies
    topology = algo.load_topology()
    program = lower(algo, topology=topology, max_tbs=max_tbs_of(topology.spec), target=target.name, report=report)
    if target.dialect == "executor":
        report("proving it for in-place calls (input and output aliased)")
    prepare_for_target(program, target, report=warn)
    size = algo.input_size_bytes
    if not selects_size(program.collective, program.ngpus, size, program.nchunksperloop, elem_bytes=1):
        ranks = f" and of its {program.ngpus} ranks" if program.collective in RANK_MULTIPLIED else ""
        warn(f"note: no runtime runs this program at {format_size(size)}, the size it was synthesized and "
             f"simulated for: it runs at calls whose element count is a multiple of its nchunksperloop, "
             f"{program.nchunksperloop}{ranks}")
    if program.inplace:
        report("the program also serves in-place calls (proven with input and output aliased)")
    # the schedule's time is the synthesizer's estimate; the written program's, on the calibrated simulator,
    # is what `taccl simulate` and `taccl batch` report for it (they can differ either way: 2x DGX H100
    # ReduceScatter, 16 MiB, four instances: 85.4 us scheduled, 59.8 simulated on two blocks a connection)
    try:
        simulated_us = simulate(program, topology, algo.input_size_bytes).time_us
    except UserError as exc:  # the proven program is written all the same
        warn(f"the written program could not be simulated: {exc}")
        return program, None
    report(f"simulated: {simulated_us:.2f} us at {format_size(algo.input_size_bytes)} "
           f"({simulated_us / algo.lower_bound_us:.2f}x the lower bound; the schedule said {algo.time_us:.2f} us)")
    return program, simulated_us
