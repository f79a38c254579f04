"""Algorithm quality: the best synthesized program next to the best baseline and the optimum, per size.

For every instance of the synthesis benchmark (benchmarks/instances.py, group "core" by default) the sketch is
synthesized (`taccl.synthesize.synthesize`) in every protocol and instance count at each synthesis size, as a
SKU's batch does (64 KiB and 16 MiB by default, plus the instance's own size; at the largest also with each
chunk cut in two), and so are the instance's companions (`instances.COMPANIONS`: the one-shot and one-hop
sketches for small messages and the rail-aligned one for the largest that the SKUs synthesize beside it, each
at its own input size, and the hierarchical sketches in the variants that suit large messages). Each program is
lowered (`taccl.lowering.lower`, proven) and simulated (`taccl.simulator`, the calibrated model) at sizes
1 KiB to 1 GiB (a size the runtimes would not select it for does not count: `taccl.targets.selected_near`,
float32), as is every applicable baseline (`taccl.baselines`: NCCL's rings and trees, the all-pairs and
one-shot programs MSCCL ships, hierarchical and two-step; every protocol, 1 and 4 instances, and on one node
rings and trees also on all of NCCL's 32 channels (`taccl.batch.jobs.baseline_instances`), no executor step
limit). Printed per instance and size: the fastest of each side, the optimum (the lower bound; for AllReduce
the reduce-scatter plus all-gather optimum), the speedup, and whether the size meets the target of
`taccl.batch.selection` (no slower than the best baseline, and 1.1x faster than it or within 1.1x of the
optimum).

    python benchmarks/quality.py [--groups core] [--sizes 1K:1G:4] [--time-limit 30] [--only LABEL]
                                 [--instances 1,4] [--synthesis-sizes 64K,16M]
                                 [--large-chunkups 2] [--no-companions]
"""
from __future__ import annotations

import argparse
import dataclasses
import math
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from instances import COMPANIONS, INSTANCES, SKETCHES  # noqa: E402

from taccl.baselines import BASELINES, applicable, build, nccl_channel_instances  # noqa: E402
from taccl.batch.jobs import CAPPED_BLOCKS, baseline_instances  # noqa: E402
from taccl.batch.selection import TARGET_SPEEDUP, TARGET_VS_OPTIMUM, target_shortfall  # noqa: E402
from taccl.bounds import allreduce_optimum, lower_bound  # noqa: E402
from taccl.errors import TacclError  # noqa: E402
from taccl.lowering import LoweringMemo, lower, max_tbs_of  # noqa: E402
from taccl.simulator import Simulator  # noqa: E402
from taccl.targets import selected_near  # noqa: E402
from taccl.topology import PROTOCOLS  # noqa: E402
from taccl.units import format_size, parse_size, parse_size_range  # noqa: E402
from taccl.xmlio import program_to_xml  # noqa: E402


def run_instance(label, sketch, coll, size, args, nodes=None):
    from taccl.sketch import load_sketch
    from taccl.synthesize import SynthesisOptions, resolve, synthesize

    sk = load_sketch(SKETCHES / sketch)
    topo, collective, own_size = resolve(sk, nodes=nodes, collective=coll, input_size=size)
    max_tbs = max_tbs_of(topo.spec)
    sizes = parse_size_range(args.sizes)
    t0 = time.monotonic()
    syn, base, notes = {}, {}, []
    synthesis_sizes = sorted({parse_size(x) for x in args.synthesis_sizes.split(",")} | {own_size})
    # large messages also get finer chunks (more pipelining between phases and hops), as the SKUs do
    # runs: (sketch, synthesis size, chunk-up, protocols, instance counts, lowering policies, name prefix)
    runs = [(sk, at, sk.chunkup, PROTOCOLS, args.instances, ["auto"], "") for at in synthesis_sizes] + [
        (sk, synthesis_sizes[-1], cu, PROTOCOLS, args.instances, ["auto"], "")
        for cu in args.large_chunkups if cu != sk.chunkup]
    # companions (instances.COMPANIONS): other sketches for the same job, each at its own input size and in
    # every protocol and instance count, or in the variants the entry names
    for other in COMPANIONS.get(label, []) if args.companions else []:
        spec = {"sketch": other} if isinstance(other, str) else other
        csk = load_sketch(SKETCHES / spec["sketch"])
        at = (parse_size(spec["at"]) if "at" in spec
              else resolve(csk, nodes=topo.nodes, collective=collective.name)[2])
        runs.append((csk, at, spec.get("chunkup", csk.chunkup), spec.get("protocols", PROTOCOLS),
                     spec.get("instances", args.instances), spec.get("fusions", ["auto"]), f"{csk.name}/"))
    for sk_run, at, chunkup, protocols, instance_counts, fusions, prefix in runs:
        sk_at = dataclasses.replace(sk_run, chunkup=chunkup)
        for proto in protocols:
            for inst in instance_counts:
                name = (f"{prefix}{proto}.i{inst}" + (f".c{chunkup}" if chunkup != sk_run.chunkup else "")
                        + f"@{format_size(at)}")
                try:
                    algo = synthesize(sk_at, nodes=topo.nodes, collective=collective.name, input_size=at,
                                      options=SynthesisOptions(time_limit_s=args.time_limit, threads=1,
                                                               proto=proto, instances=inst))
                    # as a SKU's batch: each policy, and "auto" also with connections spread over one and two
                    # blocks at most (where it spread them further, the program it replaced can win further up)
                    memo, seen = LoweringMemo(), set()
                    for fusion in fusions:
                        for blocks, suffix in [(None, "")] + (list(CAPPED_BLOCKS) if fusion == "auto" else []):
                            program = lower(algo, max_tbs=max_tbs, topology=topo, fusion=fusion,
                                            max_connection_blocks=blocks, memo=memo)
                            text = program_to_xml(program)
                            if text in seen:
                                continue
                            seen.add(text)
                            sim = Simulator(program, topo)
                            variant = name + ("" if fusion == "auto" else f"+{fusion}") + suffix
                            # as a batch's selection: not at a size the runtimes would not select it for
                            syn[variant] = [sim.run(s).time_us if selected_near(
                                collective.name, topo.num_ranks, s, program.nchunksperloop) else math.inf
                                for s in sizes]
                except TacclError as exc:
                    notes.append(f"{name}: {str(exc).splitlines()[0][:80]}")
    t_syn = time.monotonic() - t0
    for name, colls in BASELINES.items():
        if collective.name not in colls or not applicable(name, topo, collective.name):
            continue
        for proto in PROTOCOLS:
            for inst in baseline_instances((1, 4), nccl_channel_instances(name, topo)):
                try:
                    prog = build(name, topo, collective.name, instances=inst, proto=proto, max_tbs=max_tbs,
                                 reference=True)
                except TacclError:
                    continue
                sim = Simulator(prog, topo)
                base[f"{name}/{proto}.i{inst}"] = [sim.run(s).time_us for s in sizes]
    print(f"\n## {label}: {collective.name} on {topo.name} x{topo.nodes} ({topo.num_ranks} ranks); "
          f"{len(syn)} synthesized variants in {t_syn:.1f} s" + (f"; failed: {'; '.join(notes)}" if notes else ""))
    print(f"{'size':>8} {'synth us':>10} {'variant':>44} {'base us':>10} {'baseline':>26} {'speedup':>7} "
          f"{'optimum':>10} {'x opt':>6}  target")
    met = total = 0
    for k, s in enumerate(sizes):
        bs = min(syn.items(), key=lambda kv: kv[1][k]) if syn else None
        bb = min(base.items(), key=lambda kv: kv[1][k]) if base else None
        opt = (allreduce_optimum(topo, s) if collective.name == "allreduce"
               else lower_bound(topo, collective.name, s, root=collective.root or 0))
        ok = target_shortfall(bs[1][k] if bs else None, bb[1][k] if bb else None, opt) is None
        met += ok
        total += 1
        print(f"{format_size(s):>8} {bs[1][k] if bs else float('nan'):10.1f} {bs[0] if bs else '-':>44} "
              f"{bb[1][k] if bb else float('nan'):10.1f} {bb[0] if bb else '-':>26} "
              f"{bb[1][k] / bs[1][k] if bb and bs else float('nan'):7.2f} {opt:10.1f} "
              f"{bs[1][k] / opt if bs else float('nan'):6.2f}  {'yes' if ok else 'NO'}")
    return met, total


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--groups", default="core", help="instance groups (core, scale, stretch, node)")
    ap.add_argument("--sizes", default="1K:1G:4", help="sizes to simulate (default 1K:1G:4)")
    ap.add_argument("--time-limit", type=float, default=30.0, help="per MILP stage, seconds")
    ap.add_argument("--only", default=None, help="run only instances whose label contains this text")
    ap.add_argument("--instances", default="1,4", help="instance counts to synthesize for (default 1,4)")
    ap.add_argument("--synthesis-sizes", default="64K,16M",
                    help="input sizes to synthesize at, besides the instance's own (default 64K,16M, as the SKUs)")
    ap.add_argument("--large-chunkups", default="2",
                    help="chunk-ups also tried at the largest synthesis size (default 2, as the SKUs)")
    ap.add_argument("--no-companions", dest="companions", action="store_false",
                    help="synthesize the instance's own sketch only, not its companions (instances.COMPANIONS)")
    args = ap.parse_args(argv)
    args.instances = [int(x) for x in args.instances.split(",")]
    args.large_chunkups = [int(x) for x in args.large_chunkups.split(",") if x]
    groups = set(args.groups.split(","))
    summary = []
    for label, sketch, coll, size, group, nodes in INSTANCES:
        if group not in groups or (args.only and args.only not in label):
            continue
        met, total = run_instance(label, sketch, coll, size, args, nodes)
        summary.append((label, met, total))
    print("\n## summary: sizes meeting the target (best synthesized no slower than the best baseline, and "
          f"{TARGET_SPEEDUP}x faster or within {TARGET_VS_OPTIMUM}x of the optimum)")
    for label, met, total in summary:
        print(f"{label:<48} {met:3d} of {total}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
