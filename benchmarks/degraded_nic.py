"""Live reconfiguration end to end (issue 13): a running job, a degraded NIC, the new program set live.

1. `taccl batch` synthesizes a SKU's windows (default: the NDv2 SKU's AllReduce, `sketches/skus/ndv2.yaml`)
   into OUTDIR, for a copy of its topology file.
2. A job starts: one host-backend communicator watching OUTDIR/msccl-algorithms (`Runtime.watch`), running
   collectives of several sizes back to back and checking every result.
3. A monitor edits the topology file: the NIC now delivers a fraction of its bandwidth (`--nic-share`).
4. `taccl batch` runs again on the same OUTDIR: the baselines' programs come from its cache (they depend on
   the topology's structure only), syntheses and simulations are redone for the degraded NIC, and the new
   files replace the directory at once.
5. The job's watcher swaps the new set in before one of its calls; the job never stops.

Prints the time from the degradation to the first call on the new set (re-synthesis and swap; issue 13's
target: at most 2 minutes), the job's calls and wrong results before and after, and per grid size the
simulated time, on the degraded topology, of the program the old set and the new set run there.

    python benchmarks/degraded_nic.py [--sku sketches/skus/ndv2.yaml] [--collective allreduce] [--workers 2]
                                      [--nic-share 0.5] [-o OUTDIR]
"""
from __future__ import annotations

import argparse
import json
import math
import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from taccl import runtime as trt  # noqa: E402
from taccl.batch import load_sku, plan, run_batch  # noqa: E402
from taccl.simulator import Simulator  # noqa: E402
from taccl.topology import Topology, load_spec  # noqa: E402
from taccl.units import format_size  # noqa: E402
from taccl.xmlio import read_program  # noqa: E402


def prepare(sku_path: Path, collective: str, work: Path) -> tuple:
    """A copy of the SKU for `collective` alone, on a copy of its topology file (which the monitor edits)."""
    doc = yaml.safe_load(sku_path.read_text())
    spec = load_spec(str(sku_path.parent / doc["topology"]) if (sku_path.parent / doc["topology"]).is_file()
                     else doc["topology"])
    topo_file = work / f"{spec.name}.json"
    topo_file.write_text(json.dumps(spec.raw, indent=1))
    doc["topology"] = str(topo_file)
    doc["collectives"] = [collective]
    doc["name"] = f"{doc.get('name', sku_path.stem)}-{collective}"
    cands = []
    for c in doc["candidates"]:
        if collective not in c.get("collectives", [collective]):
            continue
        c = dict(c, sketch=str((sku_path.parent / c["sketch"]).resolve()))
        c.pop("collectives", None)
        cands.append(c)
    doc["candidates"] = cands
    path = work / "sku.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path, topo_file


def degrade_nics(topo_file: Path, share: float) -> None:
    """What a monitor writes when every NIC delivers `share` of its bandwidth: the NICs' link types scaled."""
    doc = json.loads(topo_file.read_text())
    for tname in {nic["type"] for nic in doc.get("nics", [])}:
        t = doc["link_types"][tname]
        t["bw_GBps"] *= share
        for cost in t.get("protocols", {}).values():
            cost["bw_GBps"] *= share
            if "tb_bw_GBps" in cost:
                cost["tb_bw_GBps"] = min(cost["tb_bw_GBps"], cost["bw_GBps"])
        t["note"] = f"{t.get('note', '')}; degraded to {share:.0%} of its bandwidth (monitor)".lstrip("; ")
    topo_file.write_text(json.dumps(doc, indent=1))


class Job:
    """Collectives back to back on one watching communicator, every result checked, until stopped."""

    def __init__(self, algo_dir: Path, collective: str, ranks: int, counts: list):
        self.rt = trt.Runtime()
        self.rt.swap(algo_dir)
        self.rt.watch(algo_dir, 50)
        self.collective, self.ranks, self.counts = collective, ranks, counts
        self.calls, self.wrong, self.failed, self.generations = 0, 0, [], []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.loop)

    def loop(self):
        k = 0
        while not self.stop.is_set():
            count = self.counts[k % len(self.counts)]
            k += 1
            inputs = trt.make_inputs(self.collective, "float32", "sum", self.ranks, count, seed=k)
            out = self.rt.run_raw(self.collective, "float32", "sum", inputs)
            ref = trt.reference(self.collective, "float32", "sum", inputs)
            if out.status not in ("done", "no_match"):
                self.failed.append(out.message)
            elif out.status == "done":
                wrong, _ = trt.count_wrong(out.outputs, ref, "float32")
                self.wrong += wrong > 0
            self.calls += 1
            self.generations.append((time.monotonic(), out.generation))


def simulate_sets(old_sel: dict, old_dir: Path, new_sel: dict, new_dir: Path, topo: Topology, collective: str):
    """Per grid size: (size, old set's program and time, new set's program and time) on `topo`."""
    def program_at(sel, base, size):
        for g in sel["groups"]:
            if g["collective"] != collective:
                continue
            for w in g["windows"]:
                if size in w["sizes"]:
                    return (w["winner"] or "(runtime default)",
                            base / Path(w["file"]).name if w["file"] else None)
        return "(none)", None

    rows, sims = [], {}
    for size in new_sel["grid"]:
        row = [size]
        for sel, base in ((old_sel, old_dir), (new_sel, new_dir)):
            label, path = program_at(sel, base, size)
            if path is None:
                row += [label, None]
                continue
            if path not in sims:
                sims[path] = Simulator(read_program(str(path)), topo)
            row += [label, sims[path].run(size).time_us]
        rows.append(row)
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sku", default=str(ROOT / "sketches" / "skus" / "ndv2.yaml"))
    ap.add_argument("--collective", default="allreduce")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--nic-share", type=float, default=0.5, help="bandwidth the degraded NICs still deliver")
    ap.add_argument("-o", "--output", default=None, help="work directory (default: a temporary one)")
    args = ap.parse_args(argv)
    work = Path(args.output or tempfile.mkdtemp(prefix="taccl-degraded-"))
    work.mkdir(parents=True, exist_ok=True)
    sku_path, topo_file = prepare(Path(args.sku), args.collective, work)
    outdir = work / "out"
    t0 = time.monotonic()
    first = run_batch(sku_path, outdir, workers=args.workers)
    print(f"initial batch: {first.computed} jobs run in {time.monotonic() - t0:.0f} s; "
          f"{sum(len(v) for v in first.selection.files.values())} file(s)")
    algo_dir = outdir / "msccl-algorithms"
    old_dir = work / "old-set"
    shutil.copytree(algo_dir, old_dir)
    old_sel = json.loads((outdir / "selection.json").read_text())
    ranks = first.selection.groups[0].ranks
    counts = [256, 16384, 65536]  # elements a rank: 1 KiB to 256 KiB buffers
    job = Job(algo_dir, args.collective, ranks, counts)
    job.thread.start()
    time.sleep(1.0)
    before_calls, gen0 = job.calls, job.generations[-1][1] if job.generations else None

    cached_before = {p.stem for p in (outdir / "cache").glob("*/*.json")}
    t_degraded = time.monotonic()
    degrade_nics(topo_file, args.nic_share)
    second = run_batch(sku_path, outdir, workers=args.workers)
    t_batch = time.monotonic()
    keys = [k for t in plan(load_sku(sku_path)) for k in t.keys()]
    reused = sum(k in cached_before for k in keys)
    live = None
    while live is None and time.monotonic() - t_batch < 30:
        live = next((t for t, g in job.generations if g != gen0 and t >= t_degraded), None)
        time.sleep(0.01)
    time.sleep(0.5)
    job.stop.set()
    job.thread.join()
    swaps, refusal = job.rt.watch_status()
    job.rt.close()
    new_sel = json.loads((outdir / "selection.json").read_text())

    print(f"NICs degraded to {args.nic_share:.0%} of their bandwidth; batch again in {t_batch - t_degraded:.1f} s: "
          f"{reused} of its {len(keys)} results reused from the cache (the baselines' programs), the rest "
          f"recomputed (syntheses, lowerings, simulations)")
    if live is None:
        print(f"the job never ran on the new set (watcher: {swaps} swap(s); {refusal or 'no refusal'})")
        return 1
    print(f"new set live in the job {live - t_degraded:.1f} s after the degradation (re-synthesis and swap; "
          f"target 120 s)")
    print(f"job: {job.calls} calls ({before_calls} before the degradation), {job.wrong} wrong, "
          f"{len(job.failed)} failed; it never stopped")
    topo = Topology(load_spec(str(topo_file)), second.selection.groups[0].nodes)
    rows = simulate_sets(old_sel, old_dir, new_sel, algo_dir, topo, args.collective)
    print(f"\nsimulated on the degraded topology ({args.collective}, {ranks} ranks):")
    print(f"{'size':>10}  {'old set':<44} {'us':>10}  {'new set':<44} {'us':>10}  {'new/old':>7}")
    better = worse = 0
    ratios = []
    for size, old_label, old_us, new_label, new_us in rows:
        ratio = new_us / old_us if old_us and new_us else None
        better += ratio is not None and ratio < 1 - 1e-9
        worse += ratio is not None and ratio > 1 + 1e-9
        if ratio is not None:
            ratios.append(ratio)
        print(f"{format_size(size):>10}  {old_label[:44]:<44} {old_us or 0:>10.1f}  {new_label[:44]:<44} "
              f"{new_us or 0:>10.1f}  {'' if ratio is None else f'{ratio:7.3f}'}")
    geomean = math.exp(sum(map(math.log, ratios)) / len(ratios)) if ratios else 1.0
    print(f"# new set faster at {better} size(s), slower at {worse}, equal elsewhere; new/old geometric mean "
          f"{geomean:.3f}")
    return 0 if job.wrong == 0 and not job.failed else 1


if __name__ == "__main__":
    sys.exit(main())
