"""`taccl lower ALGO.json [-o OUT.xml]`: lower an algorithm file to a checked MSCCL XML program.

Exit codes: 0 written, 1 the checker rejected the program (nothing written), 2 bad input or a runtime limit
that cannot be met.
"""
from __future__ import annotations

from pathlib import Path

from ..algorithm import Algorithm
from ..errors import UserError, about_file
from ..fileio import check_output_file, load_json
from ..lowering import AUTO_POLICIES_MAX_TRANSFERS, DEFAULT_MAX_TBS, FUSION_POLICIES, lower, max_tbs_of, write_program
from ..progress import warn
from ..targets import (add_target_argument, check_custom_target, check_dialect, prepare_for_target,
                       target_of_args)
from ..units import SIZE_HELP, parse_size


def register(subparsers) -> None:
    p = subparsers.add_parser("lower", help="lower an algorithm (.algo.json) to a checked MSCCL XML program")
    p.add_argument("algorithm", metavar="ALGO.json")
    p.add_argument("-o", "--output", metavar="OUT.xml", help="output file (default: ALGO name with .xml)")
    p.add_argument("--instances", type=int, default=None,
                   help="split every chunk N ways on N channel sets (default: the algorithm's, 1 if unset)")
    p.add_argument("--proto", choices=("Simple", "LL", "LL128"), default=None,
                   help="NCCL protocol (default: the one the algorithm was synthesized for, Simple if unset)")
    add_target_argument(p)
    p.add_argument("--min-bytes", default="0", help=f"smallest buffer size the runtime selects this for (default 0; {SIZE_HELP})")
    p.add_argument("--max-bytes", default="0", help=f"largest buffer size, inclusive; 0 = unbounded (default; {SIZE_HELP})")
    p.add_argument("--max-tbs", type=int, default=None,
                   help="thread blocks per rank at most (default: the SM count of the algorithm's topology, "
                        f"else {DEFAULT_MAX_TBS}, an A100's)")
    p.add_argument("--no-fusion", action="store_true",
                   help="emit plain s/r/rrc steps (no rcs, rrs, rrcs); the same as --fusion none")
    p.add_argument("--fusion", choices=FUSION_POLICIES, default="auto",
                   help="which receives fuse with their forwarding sends: schedule (where the solver's schedule "
                        "allows), eager (wherever the rules allow), none, network (eager, plus a fan-out's send "
                        "that leaves the node; several nodes only), or auto (default: the fastest of them at the "
                        "algorithm's input size, on its topology; the schedule's alone above "
                        f"{AUTO_POLICIES_MAX_TRANSFERS} transfers)")
    p.add_argument("--block-steps", type=int, default=None, metavar="N",
                   help="steps a thread block takes before a connection's next transfers go to another channel: "
                        "smaller spreads connections over more channels (thread blocks) without splitting chunks; "
                        "a multiple of 8, default 64 (the runtime's limit)")
    p.add_argument("--connection-blocks", type=int, default=None, metavar="K",
                   help="spread each connection with several transfers over at least K thread blocks (channels), "
                        "its transfers alternating between them (default: as --block-steps needs; --fusion auto "
                        "also lowers its fastest policies with 2, and with 4 where that may help, and keeps the "
                        "fastest)")
    p.add_argument("--max-connection-blocks", type=int, default=None, metavar="K",
                   help="--fusion auto spreads a connection over at most K thread blocks itself (1: none; default: "
                        "as many as 4); a batch's '+one-block' and '+two-block' programs are these with 1 and 2")
    p.add_argument("--quiet", "-q", action="store_true")
    p.set_defaults(func=run)


def default_output(algo_path: str) -> Path:
    p = Path(algo_path)
    name = p.name
    for suffix in (".algo.json", ".json"):
        if name.endswith(suffix):
            name = name[: -len(suffix)]
            break
    return p.with_name(name + ".xml")


def run(args) -> int:
    if args.no_fusion and args.fusion not in ("auto", "none"):
        raise UserError(f"--no-fusion and --fusion {args.fusion} contradict each other: give one of them")
    check_dialect(args.target, args.dialect)
    out = check_output_file(args.output if args.output is not None else default_output(args.algorithm))
    algo = Algorithm.from_json(load_json(args.algorithm), path=args.algorithm)
    try:  # on the topology it was synthesized for, `lower` keeps the fastest of its fusion policies
        topology = algo.load_topology()
    except UserError as exc:  # its topology file is gone: fuse as the schedule says
        topology = None
        warn(f"{args.algorithm}: $.topology: {exc}; lowered without it (fusion as the schedule says, "
             f"at most {DEFAULT_MAX_TBS} thread blocks a rank unless --max-tbs)")
    target = target_of_args(args, topology and topology.spec)
    if "custom" in algo.collective:  # a user-defined collective (`collective_to_json`)
        check_custom_target(target)
    ranks = algo.collective.get("num_ranks")
    if topology is not None and topology.num_ranks != ranks:
        raise UserError(f"{topology.nodes} node(s) of {topology.name} make {topology.num_ranks} ranks, but the "
                        f"collective has {ranks}", path=args.algorithm, where="$.topology.nodes")
    min_bytes = parse_size(args.min_bytes, where="--min-bytes")
    max_bytes = parse_size(args.max_bytes, where="--max-bytes")
    with about_file(args.algorithm):  # a bad transfer, or an algorithm that cannot fit
        program = lower(algo, instances=args.instances, proto=args.proto, min_bytes=min_bytes, max_bytes=max_bytes,
                        max_tbs=args.max_tbs if args.max_tbs is not None else max_tbs_of(topology and topology.spec),
                        topology=topology, fusion="none" if args.no_fusion else args.fusion,
                        block_steps=args.block_steps, connection_blocks=args.connection_blocks,
                        max_connection_blocks=args.max_connection_blocks, target=target.name)
    prepare_for_target(program, target, report=warn)
    write_program(program, out, target=target.name)
    if not args.quiet:
        print(f"{out}: {program.collective} on {program.ngpus} ranks, {program.nchannels} channel(s), "
              f"{program.max_threadblocks} thread block(s) per rank at most, {program.nsteps} steps; checked for "
              f"{target.name}"
              f"{' (in place too)' if program.inplace else ''}")
    return 0
