"""`taccl baseline NAME --topology T --nodes N -o FILE.xml`: a checked baseline program (ring, tree, ...)."""
from __future__ import annotations

from ..baselines import BASELINES, build, nccl_channel_instances
from ..collectives import canonical_name
from ..errors import UserError
from ..fileio import check_output_file
from ..lowering import DEFAULT_MAX_TBS, max_tbs_of, write_program
from ..lowering.emit import MAX_OFFSET
from ..progress import warn
from ..targets import RANK_MULTIPLIED, add_target_argument, prepare_for_target, target_of_args
from ..topology import load_topology


def register(subparsers) -> None:
    p = subparsers.add_parser("baseline", help=f"write a baseline algorithm ({', '.join(BASELINES)}) as a checked "
                                               f"MSCCL XML program")
    p.add_argument("name", choices=sorted(BASELINES))
    p.add_argument("--topology", "-t", required=True, help="built-in name (ndv2, dgx2, ...) or topology file")
    p.add_argument("--nodes", "-n", type=int, default=1)
    p.add_argument("--collective", "-c", default=None,
                   help="collective (default: the baseline's first: " +
                        ", ".join(f"{k} {v[0]}" for k, v in BASELINES.items()) + ")")
    p.add_argument("--chunkup", type=int, default=1, help="chunks per rank (pipelining depth; default 1)")
    p.add_argument("--instances", type=int, default=1, help="split every chunk N ways on N channel sets")
    p.add_argument("--proto", choices=("Simple", "LL", "LL128"), default="Simple")
    p.add_argument("--max-tbs", type=int, default=None,
                   help=f"thread blocks per rank at most (default: the topology's SM count, else {DEFAULT_MAX_TBS})")
    add_target_argument(p)
    p.add_argument("-o", "--output", required=True, metavar="FILE.xml")
    p.add_argument("--quiet", "-q", action="store_true")
    p.set_defaults(func=run)


def run(args) -> int:
    check_output_file(args.output)
    for flag, value in (("--nodes", args.nodes), ("--chunkup", args.chunkup)):
        if value < 1:
            raise UserError(f"must be at least 1, got {value}", where=flag)
    topo = load_topology(args.topology, args.nodes, where="--topology")
    target = target_of_args(args, topo.spec)
    coll = args.collective or BASELINES[args.name][0]
    # a buffer of these collectives holds chunk-up chunks of every rank (each instance its own): past the offsets
    # the runtimes store (int16) no program fits, which building one would take minutes and gigabytes to find
    every_rank = canonical_name(coll) in RANK_MULTIPLIED
    per_buffer = args.chunkup * max(args.instances, 1) * (topo.num_ranks if every_rank else 1)
    if per_buffer > MAX_OFFSET + 1:
        raise UserError(f"{per_buffer} chunks a buffer (chunk-up x instances{' x ranks' if every_rank else ''}) "
                        f"exceed the {MAX_OFFSET + 1} offsets the runtimes store (int16)", where="--chunkup")
    program = build(args.name, topo, coll, chunkup=args.chunkup, instances=args.instances, proto=args.proto,
                    max_tbs=args.max_tbs if args.max_tbs is not None else max_tbs_of(topo.spec), target=target.name,
                    report=warn)
    prepare_for_target(program, target, report=warn)
    write_program(program, args.output, target=target.name)
    full = nccl_channel_instances(args.name, topo)
    if full is not None and args.instances < full:
        warn(f"note: NCCL runs this {args.name} on 32 channels at large sizes, which --instances {full} builds; "
             f"on {args.instances} instance(s) it has {args.instances} thread block(s) a connection, too few to "
             f"fill the GPUs' links")
    if not args.quiet:
        print(f"{args.output}: {args.name} {program.collective} on {topo.name} x{topo.nodes} ({program.ngpus} ranks), "
              f"{program.nchannels} channel(s), {program.max_threadblocks} thread block(s) per rank; checked for "
              f"{target.name}"
              f"{' (in place too)' if program.inplace else ''}")
    return 0
