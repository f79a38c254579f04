"""`taccl profile`: measure this node (or read what it reports) and write its topology file.

    taccl profile [--out FILE] [--quick]                  run the probes, analyse, write the topology
    taccl profile --analyze SAMPLES.json [--out FILE]     rerun only the analysis on saved samples
    taccl profile --from-nvidia-smi TOPO.txt --offline    topology from `nvidia-smi topo -m` output
    taccl profile --from-nccl-xml TOPO.xml [--analyze S]  NCCL topology XML, refined by measurements

Exit codes: 0 topology written; 1 nothing could be measured that makes a topology (no GPU; the samples
file is still written and says why); 2 bad input or the probe binary missing.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from ..errors import UserError
from ..fileio import check_output_file, write_json
from ..progress import Reporter

MAX_SM_COUNT = 1024  # well above any GPU's (B200: 148)


def register(subparsers) -> None:
    p = subparsers.add_parser("profile", help="measure this node's links (or read nvidia-smi / NCCL topology "
                                              "output) and write a topology file")
    p.add_argument("--out", "-o", default="taccl-topology.json", help="topology file to write "
                                                                      "(default: taccl-topology.json)")
    p.add_argument("--samples", default=None, help="where to save raw probe samples (default: next to --out, "
                                                   "*.samples.json)")
    p.add_argument("--quick", action="store_true", help="fewer sizes and repetitions (about a minute on 8 GPUs)")
    p.add_argument("--analyze", metavar="SAMPLES.json", help="do not probe: analyse saved samples")
    p.add_argument("--from-nvidia-smi", metavar="FILE", help="start from `nvidia-smi topo -m` output ('-' = stdin)")
    p.add_argument("--from-nccl-xml", metavar="FILE", help="start from an NCCL topology XML (NCCL_TOPO_DUMP_FILE)")
    p.add_argument("--offline", action="store_true", help="with --from-*: write the topology from those alone")
    p.add_argument("--reference", metavar="TOPOLOGY", help="number GPUs as in this topology (built-in name or "
                                                          "file) when the measured NVLink graph matches it; by "
                                                          "default a matching built-in is used")
    p.add_argument("--no-reference", action="store_true", help="never align with a built-in topology")
    p.add_argument("--name", help="topology name (default: profiled-<hostname>)")
    p.add_argument("--engine", choices=["ce", "sm"], help="copy engine whose samples set link costs "
                                                          "(default: sm when measured for every pair)")
    p.add_argument("--nvlink-gbps", type=float, default=None, help="per-NVLink bandwidth for --from-nvidia-smi "
                                                                   "(default 25)")
    p.add_argument("--pcie-gbps", type=float, default=None, help="per-GPU PCIe bandwidth and direction for "
                                                                  "--from-nvidia-smi on a node without NVLink "
                                                                  "(default 24: NCCL's for Gen4 x16; Gen5: 48)")
    p.add_argument("--compute-capability", metavar="X.Y", type=_compute_capability,
                   help="the GPUs' compute capability (e.g. 9.0 for H100), whose generation's calibrated costs the "
                        "topology gets (default: the probe's, or the NCCL topology XML's; nvidia-smi topo output "
                        "does not say it)")
    p.add_argument("--sm-count", type=int, default=None, metavar="N",
                   help="SMs per GPU, which bound a program's thread blocks a rank (default: the probe's; offline, the "
                        "SXM part's for its compute capability on NVLink, else required)")
    p.add_argument("--memory-gbps", type=float, default=None, metavar="GB/S",
                   help="memory bandwidth per GPU, which scales local copies and reductions (default: the probe's, "
                        "else the generation's SXM part's)")
    p.add_argument("--probe", metavar="PATH", help="probe binary (default: profiler/taccl-probe, $TACCL_PROBE)")
    p.add_argument("--timeout", type=float, default=20.0, help="per-probe watchdog in seconds (default 20)")
    p.add_argument("--peer", metavar="HOST:PORT", help="measure the inter-node link against a peer running "
                                                       "`taccl profile --listen PORT`")
    p.add_argument("--listen", type=int, metavar="PORT", help="be the first node of the inter-node measurement")
    p.add_argument("--quiet", "-q", action="store_true")
    p.add_argument("--json", action="store_true", help="print a JSON summary on stdout")
    p.set_defaults(func=run)


def _compute_capability(text: str) -> int:
    """"9.0" or "90" (NCCL's major * 10 + minor, as the samples and NCCL's topology XML give it) -> 90."""
    try:
        if "." in text:
            major, minor = text.split(".")
            value = int(major) * 10 + int(minor)
            ok = len(minor) == 1
        else:
            value = int(text)
            ok = True
    except ValueError:
        ok = False
    if not ok or not 30 <= value < 200:
        raise argparse.ArgumentTypeError(f"expected a compute capability such as 9.0 (or 90), got {text!r}")
    return value


def _base_facts(args):
    from ..profiler import nccl_xml, nvsmi
    from ..profiler.writer import merge_facts

    base = None
    if args.from_nvidia_smi:
        kw = {k: v for k, v in (("nvlink_GBps", args.nvlink_gbps), ("pcie_GBps", args.pcie_gbps)) if v}
        if args.from_nvidia_smi == "-":
            base = nvsmi.parse_text(sys.stdin.read(), path="<stdin>", **kw)
        else:
            base = nvsmi.parse(args.from_nvidia_smi, **kw)
    if args.from_nccl_xml:
        x = nccl_xml.parse(args.from_nccl_xml)
        base = merge_facts(x, base) if base is not None else x  # nvidia-smi's NVLink counts win
    return base


def run(args) -> int:
    from ..profiler.analyze import analyze
    from ..profiler.runner import find_probe, run_probes
    from ..profiler.samples import load_samples
    from ..profiler.writer import facts_from_analysis, merge_facts, to_topology
    from ..topology import load_spec, spec_from_dict

    rep = Reporter(quiet=args.quiet or args.json)
    if args.offline and not (args.from_nvidia_smi or args.from_nccl_xml):
        raise UserError("--offline needs --from-nvidia-smi or --from-nccl-xml", where="--offline")
    if args.reference and args.no_reference:
        raise UserError("give --reference or --no-reference, not both", where="--reference")
    if args.peer and args.listen:
        raise UserError("give --peer on one node and --listen on the other, not both", where="--peer")
    if args.peer and ":" not in args.peer:
        raise UserError(f"expected HOST:PORT, got {args.peer!r}", where="--peer")
    for flag, value in (("--nvlink-gbps", args.nvlink_gbps), ("--pcie-gbps", args.pcie_gbps),
                        ("--memory-gbps", args.memory_gbps)):
        if value is not None and not 0 < value < float("inf"):
            raise UserError(f"must be a positive bandwidth in GB/s, got {value}", where=flag)
    if args.sm_count is not None and not 1 <= args.sm_count <= MAX_SM_COUNT:
        raise UserError(f"must be a number of SMs from 1 to {MAX_SM_COUNT}, got {args.sm_count}", where="--sm-count")
    out = check_output_file(args.out, where="--out")
    samples_path = Path(args.samples) if args.samples else out.with_name(out.stem + ".samples.json")
    if not args.analyze and not args.offline:
        check_output_file(samples_path, where="--samples")
    reference = load_spec(args.reference, where="--reference") if args.reference else None
    base = _base_facts(args)

    measured, doc, an = None, None, None
    if args.analyze:
        rep(f"analysing saved samples {args.analyze}")
        doc = load_samples(args.analyze)
        samples_path = Path(args.analyze)
    elif not args.offline:
        probe = find_probe(args.probe)
        rep(f"probing with {probe}{' (quick)' if args.quick else ''}; per-probe watchdog {args.timeout:g} s")
        doc = run_probes(probe, quick=args.quick, timeout_s=args.timeout, peer=args.peer, listen=args.listen,
                         report=lambda line: rep(f"  {line}"))
        write_json(samples_path, doc)
        rep(f"raw samples written to {samples_path}")
    if doc is not None:
        rep("fitting alpha and bandwidth, clustering links, inferring PCIe groups and NIC placement")
        an = analyze(doc, engine=args.engine)
        measured = facts_from_analysis(an, doc, name=args.name, samples_path=str(samples_path))
    facts = merge_facts(base, measured) if base is not None else measured
    if args.name:
        facts.name = args.name
    if args.compute_capability:
        facts.compute_capability = args.compute_capability
    if args.sm_count:
        facts.sm_count = args.sm_count
    if args.memory_gbps:
        facts.mem_bw_GBps = args.memory_gbps
    if args.memory_gbps and facts.compute_capability is None:
        raise UserError("the memory bandwidth scales the costs derived for the GPUs' generation, which needs their "
                        "compute capability: pass --compute-capability too", where="--memory-gbps")
    if facts.n_gpus < 1:
        reasons = "; ".join(f"{u['what']}: {u['reason']}" for u in facts.unmeasured) or "no GPU"
        return _nothing_written(args, f"no GPU was measured ({reasons})", samples_path, facts.unmeasured)
    topo, ren = to_topology(facts, reference=reference, auto_reference=not args.no_reference)
    if topo["gpus_per_node"] > 1 and not topo.get("links") and not topo.get("switches"):
        return _nothing_written(args, "no link between two GPUs was measured", samples_path, facts.unmeasured)
    spec_from_dict(topo, path=str(out))  # what the synthesizer would refuse is never written
    write_json(out, topo)
    summary = _summary(topo, out, samples_path if doc is not None else None)
    if args.json:
        print(json.dumps(summary, indent=1))
    elif not args.quiet:
        _print_summary(summary)
    return 0


def _nothing_written(args, why: str, samples_path, unmeasured) -> int:
    """Exit 1 without a topology: the measurements cannot make one a synthesis could use."""
    print(f"taccl profile: no topology written: {why}; the samples in {samples_path} say what was and was not "
          f"measured", file=sys.stderr)
    if args.json:
        print(json.dumps({"topology": None, "samples": str(samples_path), "unmeasured": unmeasured}))
    return 1


def _summary(topo, out, samples_path) -> dict:
    m = topo.get("measurements", {})
    return {
        "topology": str(out),
        "samples": str(samples_path) if samples_path else None,
        "gpus": topo["gpus_per_node"],
        "link_types": {k: {"alpha_us": v["alpha_us"], "bw_GBps": v["bw_GBps"],
                           "fit_ok": v.get("fit", {}).get("ok"), "note": v.get("note", "")}
                       for k, v in topo["link_types"].items()},
        "switches": [s["gpus"] for s in topo.get("switches", [])],
        "links": len(topo.get("links", [])),
        "pcie_switches": topo.get("pcie_switches"),
        "nics": [{k: n.get(k) for k in ("name", "gpus", "pcie_switch", "numa_node")} for n in topo.get("nics", [])],
        "cuda_visible_devices": topo["cuda_visible_devices"],
        "renumbering": m.get("renumbering", {}).get("reason"),
        "calibration": m.get("calibration"),
        "unmeasured": m.get("unmeasured", []),
        "notes": m.get("notes", []),
    }


def _print_summary(s) -> None:
    print(f"topology written to {s['topology']} ({s['gpus']} GPUs)")
    for k, v in s["link_types"].items():
        ok = "" if v["fit_ok"] in (None, True) else "  [fit not trustworthy]"
        print(f"  {k:12s} alpha {v['alpha_us']:8.3f} us   bw {v['bw_GBps']:9.2f} GB/s   {v['note']}{ok}")
    if s["switches"]:
        print(f"  switch over GPUs {s['switches'][0]}")
    if s["links"]:
        print(f"  {s['links']} direct link entries")
    print(f"  PCIe switch groups: {s['pcie_switches'] if s['pcie_switches'] else 'unknown'}")
    for n in s["nics"]:
        print(f"  NIC {n['name']}: GPUs {n['gpus']}, PCIe switch {n['pcie_switch']}, nearest CPU (NUMA node) "
              f"{n['numa_node']}")
    print(f"  renumbering: {s['renumbering']}")
    c = s["calibration"]
    if c:
        print(f"  calibrated costs: derived from the DGX H100 fit for {c['generation'].capitalize()} GPUs (compute "
              f"capability {c['compute_capability'] / 10:.1f}, {c['sm_count']} SMs): docs/calibration.md")
    print(f"export CUDA_DEVICE_ORDER=PCI_BUS_ID CUDA_VISIBLE_DEVICES={s['cuda_visible_devices']}")
    for u in s["unmeasured"]:
        print(f"  not measured: {u['what']}: {u['reason']}")
    for note in s["notes"]:
        print(f"  note: {note}")
