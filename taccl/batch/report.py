"""The batch report: `OUTDIR/report.md` with one PNG per (collective, node count) under `OUTDIR/plots/`.

Each plot shows algorithm bandwidth against message size for every candidate sketch and every baseline (each
the best of its variants at that size; synthesized solid, baselines dashed), the selected program per size
(thick band) and the lower bound's bandwidth (size / bound: no algorithm can be above it); below it, the
selected program's speedup over the best baseline. The Markdown gives, per group, the windows with their winner and speedup over
the best baseline, every failed job with its reason, the synthesis cost, and how to point a runtime at
the files.
"""
from __future__ import annotations

import re
from pathlib import Path

from ..fileio import atomic_write
from ..targets import get_target
from ..units import format_size
from .selection import TARGET_SPEEDUP, TARGET_VS_OPTIMUM, TIE_TOLERANCE, Group, Selection

PLOT_DIR = "plots"


def _x(w) -> str:
    lo, hi = w.speedup_range
    if lo is None:
        return "-"
    return f"{lo:.2f}x" if abs(hi - lo) < 0.005 else f"{lo:.2f}x - {hi:.2f}x"


def _span(w) -> str:
    hi = "inf" if w.max_bytes == 0 else format_size(w.max_bytes)
    return f"{format_size(w.min_bytes)} - {hi}"


def _grid(w) -> str:
    a, b = format_size(w.sizes[0]), format_size(w.sizes[-1])
    return a if a == b else f"{a} - {b}"


def _envelopes(g: Group) -> dict:
    """source (candidate sketch or baseline) -> (kind, best time per size over its variants)."""
    out = {}
    for c in g.contenders:
        if c.status != "ok":
            continue
        kind, best = out.get(c.source, (c.kind, [float("inf")] * len(g.sizes)))
        out[c.source] = (kind, [min(best[i], c.time_at(i)) for i in range(len(best))])
    return out


def plot_group(g: Group, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax, sx) = plt.subplots(2, 1, figsize=(9, 7.5), sharex=True, gridspec_kw={"height_ratios": [3, 1.3]})
    gb = [s / 1000.0 for s in g.sizes]  # bytes per us = GB/s x 1000
    for source, (kind, times) in sorted(_envelopes(g).items(), key=lambda kv: (kv[1][0], kv[0])):
        style = "-" if kind == "synthesized" else "--"
        algbw = [b / t if t < float("inf") else float("nan") for b, t in zip(gb, times)]  # nan: never selected
        ax.plot(g.sizes, algbw, style, linewidth=1.2, marker="." if kind == "synthesized" else None,
                label=f"{source} (best variant)" if kind == "synthesized" else f"{source} (baseline, best protocol)")
    by_label = {c.label: c for c in g.contenders if c.status == "ok"}
    sel_x, sel_y, sp_x, sp_y = [], [], [], []
    for w in g.windows:
        if not w.winner:
            continue
        for k, s in enumerate(w.sizes):
            i = g.sizes.index(s)
            sel_x.append(s)
            sel_y.append(gb[i] / by_label[w.winner].time_us[i])
            if w.speedup[k] is not None:
                sp_x.append(s)
                sp_y.append(w.speedup[k])
    if sel_x:
        ax.plot(sel_x, sel_y, "-", color="tab:green", linewidth=7, alpha=0.25, label="selected", zorder=0)
    bound = [b / t if t else None for b, t in zip(gb, g.lower_bound_us)]
    if any(b is not None for b in bound):
        ax.plot(g.sizes, bound, ":", color="black", linewidth=1.5, label="lower bound (size / bound)")
    ax.set_yscale("log")
    ax.set_ylabel("algorithm bandwidth (GB/s)")
    ax.set_title(f"{g.collective}, {g.nodes} node(s), {g.ranks} GPUs")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7, loc="upper left")
    sx.axhline(1.0, color="gray", linewidth=1)
    if sp_x:
        sx.plot(sp_x, sp_y, "-o", color="tab:green", markersize=3)
    sx.set_ylabel("selected vs best\nbaseline (x)")
    sx.grid(True, which="both", alpha=0.3)
    sx.set_xscale("log", base=2)
    ticks = g.sizes[::max(1, len(g.sizes) // 10)]
    sx.set_xticks(ticks)
    sx.set_xticklabels([format_size(s) for s in ticks], rotation=45, ha="right")
    sx.set_xlabel("message size (bytes of the full buffer)")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp.png")
    fig.savefig(tmp, dpi=110)
    plt.close(fig)
    tmp.replace(path)


_PLOT_FILE = re.compile(r"[a-z]+-[0-9]+r\.png")  # the names `plot_name` gives


def plot_name(g: Group) -> str:
    return f"{PLOT_DIR}/{g.collective}-{g.ranks}r.png"


def render(selection: Selection, sku, *, plots: bool, wall_s: float | None = None) -> str:
    out = [f"# Batch synthesis report: {selection.sku}, for {selection.target}", ""]
    stall = f" (or once the best solution stalls for {sku.stall_s:g} s)" if sku.stall_s else ""
    out.append(f"Topology `{selection.topology}`, node counts {', '.join(map(str, sku.nodes))}, collectives "
               f"{', '.join(sku.collectives)}; sizes {format_size(selection.grid[0])} to {format_size(selection.grid[-1])} "
               f"({len(selection.grid)} points). Solver {sku.solver}, {sku.time_limit_s:g} s per MILP stage{stall}. "
               f"taccl {selection.tool}." + (f" Batch wall time {wall_s:.0f} s." if wall_s is not None else ""))
    out += ["", f"Made by `taccl batch {sku.path}`; a rerun reuses every cached result and recomputes only what "
            f"changed.", ""]
    note = sku.spec.calibration_note()
    out += [("Times are the calibrated simulator's (docs/calibration.md). " if note is None else
             f"**Caution**: {note}. ") +
            "Speedup is the best baseline's time divided by the selected program's, per grid size in the window.", ""]
    protocols = sku.spec.protocol_note()
    if protocols:
        out += [f"Protocols: {protocols}.", ""]
    out += ["## At a glance", "", "| collective | nodes | GPUs | synthesized wins | speedup over best baseline | "
            "x optimum | baseline wins | failed jobs | sizes missing the target |", "|---|---|---|---|---|---|---|---|---|"]
    for g in selection.groups:
        syn = [w for w in g.windows if w.kind == "synthesized"]
        base = [w for w in g.windows if w.kind == "baseline"]
        sp = [s for w in syn for s in w.speedup if s is not None]
        vb = [v for w in g.windows for v in w.vs_bound if v is not None]
        miss = ", ".join(format_size(size) for size, _ in g.shortfalls) or "none"
        out.append(f"| {g.collective} | {g.nodes} | {g.ranks} | {', '.join(_grid(w) for w in syn) or 'none'} | "
                   f"{f'{min(sp):.2f}x - {max(sp):.2f}x' if sp else '-'} | "
                   f"{f'{min(vb):.2f} - {max(vb):.2f}' if vb else '-'} | {', '.join(_grid(w) for w in base) or 'none'} | "
                   f"{len(g.failed_jobs) + len(g.failed_baselines)} | {miss} |")
    out += ["", f"The target (`taccl.batch.selection`): at every size the best synthesized program is no slower than "
            f"the best baseline (within {TIE_TOLERANCE:.1%}: a tie) and either {TARGET_SPEEDUP}x faster than it or within {TARGET_VS_OPTIMUM}x of the "
            f"optimum, the lower bound (for AllReduce the reduce-scatter plus all-gather optimum: its provable bound "
            f"would need reduction in the network)."]
    for g in selection.groups:
        out += ["", f"## {g.collective}, {g.nodes} node(s), {g.ranks} GPUs", ""]
        if plots:
            out += [f"![{g.collective} x{g.nodes}]({plot_name(g)})", ""]
        out += ["| window | bytes (minBytes - maxBytes) | grid sizes | winner | kind | best baseline | speedup | "
                "x optimum | file | in-place |", "|---|---|---|---|---|---|---|---|---|---|"]
        for w in g.windows:
            base = ", ".join(sorted({b for b in w.best_baseline if b})) or "-"
            vb = [v for v in w.vs_bound if v is not None]
            out.append(f"| {w.index} | {_span(w)} | {_grid(w)} | {w.winner or '-'} | {w.kind} | {base} | {_x(w)} | "
                       f"{f'{min(vb):.2f} - {max(vb):.2f}' if vb else '-'} | "
                       f"{f'`{w.file}`' if w.file else '(runtime default)'} | {'yes' if w.inplace else 'no'} |")
        if g.shortfalls:
            out += ["", "Sizes where the best synthesized program misses the target:", ""]
            out += [f"- {format_size(size)}: {why}" for size, why in g.shortfalls]
        notes = [f"- window {w.index}: {w.note}" for w in g.windows if w.note]
        failed = [f"- {label}: {reason}" for label, reason in g.failed_jobs]
        bad = [f"- {c.label}: {c.reason}" for c in g.contenders if c.status != "ok" and
               not c.reason.startswith("synthesis failed")]
        if notes:
            out += ["", *notes]
        if failed:
            out += ["", "Failed syntheses (their sizes fell back to the best remaining program):", "", *failed]
        if g.failed_baselines:
            out += ["", "Failed baselines (no program of them could be built and simulated):", "",
                    *[f"- {label}: {reason}" for label, reason in g.failed_baselines]]
        if bad:
            out += ["", "Programs that could not be lowered or simulated:", "", *bad]
    out += _cost(selection)
    out += ["", "## Using the programs", ""]
    if selection.files:
        out += [f"Every file has its size window set and was proven by the checker, for {selection.target} "
                f"(docs/targets.md), before it was written.", ""]
        if selection.target == "msccl-legacy":
            out += ["- legacy MSCCL: `MSCCL_XML_FILES`, one list per GPU count (at most 4 files each; out-of-place "
                    "calls):", ""]
        else:
            out += [f"- {selection.target}: `MSCCL_ALGO_DIR=<this directory>/msccl-algorithms` (the directory serves "
                    "every node count: a file applies only to communicators of its `ngpus`)"
                    + "".join(f"; also `{setting}`: {why}" for setting, why in get_target(selection.target).env)
                    + ".",
                    "- taccl's runtime: `MSCCL_XML_FILES`, one list per GPU count:", ""]
        for ranks, files in selection.files.items():
            out.append(f"  - {ranks} GPUs: `{':'.join(files)}`")
    else:
        out.append("No XML was written: the runtime's own algorithms serve every size.")
    return "\n".join(out) + "\n"


def _cost(selection: Selection) -> list:
    syn = [j for j in selection.jobs if j.kind == "synthesis"]
    out = ["", "## Synthesis cost", "",
           f"{len(syn)} syntheses, {sum(j.cached for j in syn)} answered by the cache; "
           f"{sum(j.time_s for j in syn):.1f} s of synthesis in all (when computed).", "",
           "| job | collective | nodes | status | time (s) | predicted (us) | lower bound (us) | ratio | cached |",
           "|---|---|---|---|---|---|---|---|---|"]
    for j in syn:
        ratio = f"{j.predicted_us / j.lower_bound_us:.2f}" if j.predicted_us and j.lower_bound_us else "-"
        pred = f"{j.predicted_us:.2f}" if j.predicted_us is not None else "-"
        lb = f"{j.lower_bound_us:.2f}" if j.lower_bound_us is not None else "-"
        status = j.status if j.status == "ok" else f"failed: {j.reason.splitlines()[0] if j.reason else ''}"
        out.append(f"| {j.label} | {j.collective} | {j.nodes} | {status} | {j.time_s:.1f} | {pred} | {lb} | {ratio} | "
                   f"{'yes' if j.cached else 'no'} |")
    return out


def write_report(selection: Selection, outdir, sku, *, plots: bool = True, wall_s: float | None = None) -> Path:
    outdir = Path(outdir)
    groups = selection.groups if plots else []
    for g in groups:
        plot_group(g, outdir / plot_name(g))
    wanted = {plot_name(g) for g in groups}
    # an earlier run's plot of a group this report no longer shows (or any, with --no-plots) would pass for this one's
    for old in (outdir / PLOT_DIR).glob("*.png"):
        if _PLOT_FILE.fullmatch(old.name) and f"{PLOT_DIR}/{old.name}" not in wanted:
            old.unlink()
    return atomic_write(outdir / "report.md", render(selection, sku, plots=plots, wall_s=wall_s))
