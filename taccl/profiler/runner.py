"""Drive the probe binary: one process per probe group, each under its own time limit, results merged.

The binary has its own per-probe watchdog; the per-group process limit here is the second line of defence
(a driver call that never returns, a machine that stalls): the group is killed, whatever it wrote is kept,
and the samples say which group was cut short and why. Nothing waits forever.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
import threading
from pathlib import Path

from ..errors import UserError
from .samples import check_samples, empty_samples

REPO_PROBE = Path(__file__).resolve().parents[2] / "profiler" / "taccl-probe"
GROUPS = ("p2p", "host", "nic")


def find_probe(explicit: str | None = None) -> str:
    cands = [explicit] if explicit else [os.environ.get("TACCL_PROBE"), str(REPO_PROBE), shutil.which("taccl-probe")]
    for cand in cands:
        if cand and Path(cand).is_file() and os.access(cand, os.X_OK):
            return str(cand)
    if explicit:
        raise UserError(f"probe binary {explicit!r} does not exist or is not executable")
    raise UserError("the probe binary taccl-probe is not built: run `make -C profiler NVCC=/path/to/nvcc` "
                    "(or pass --probe PATH); `taccl profile --analyze SAMPLES.json` works without it")


def estimate_seconds(n_gpus: int, n_nics: int, quick: bool, peer: bool) -> dict:
    """Rough wall-clock per group (seconds), for the progress line before probing starts."""
    per_sweep = 0.15 if quick else 0.8  # one size sweep of one copy path, all repetitions
    pair = 0.05 if quick else 0.25  # one concurrent measurement at the big size
    est = {
        "p2p": 2 * n_gpus * max(0, n_gpus - 1) * per_sweep + 2 * (1 if quick else n_gpus) * pair,
        "host": 2 * n_gpus * per_sweep + n_gpus * max(0, n_gpus - 1) * pair,
        "nic": n_nics * (2 * per_sweep + n_gpus * pair),
    }
    if peer:
        est["net"] = 20.0 if quick else 60.0
    return {k: round(v + 2.0, 1) for k, v in est.items()}  # + start-up and allocation


def _run_one(cmd, out_path: Path, limit_s: float, report) -> tuple[dict | None, str | None]:
    """Run one probe process, streaming its progress lines; (samples or None, problem or None)."""
    try:
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    except OSError as exc:
        return None, f"cannot start {cmd[0]}: {exc}"

    def pump():
        for line in proc.stderr:
            report(line.rstrip())

    t = threading.Thread(target=pump, daemon=True)
    t.start()
    problem = None
    try:
        rc = proc.wait(timeout=limit_s)
        if rc != 0:
            problem = f"probe exited with code {rc}"
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        problem = f"killed after {limit_s:.0f} s (process time limit)"
    t.join(timeout=2)
    doc = None
    if out_path.is_file():
        try:
            doc = check_samples(json.loads(out_path.read_text()), path=str(out_path))
        except (UserError, json.JSONDecodeError) as exc:
            problem = (problem + "; " if problem else "") + f"unreadable output: {exc}"
    elif problem is None:
        problem = "the probe wrote no output"
    return doc, problem


def merge_samples(docs: list) -> dict:
    """Metadata from the first document that has GPUs; measurements, skips and errors from all."""
    out = empty_samples()
    meta = next((d for d in docs if d.get("gpus")), docs[0] if docs else {})
    for k in ("tool", "host", "env", "gpus", "peer_access", "nics"):
        if k in meta:
            out[k] = meta[k]
    for d in docs:
        out["measurements"] += d.get("measurements", [])
        out["errors"] += d.get("errors", [])
        for s in d.get("skipped", []):
            if s not in out["skipped"]:
                out["skipped"].append(s)
    out["status"] = "complete" if docs and all(d.get("status") == "complete" for d in docs) else "partial"
    return out


def run_probes(probe: str, *, quick: bool, timeout_s: float, peer: str | None = None, listen: int | None = None,
               report=print, group_limit_s: float | None = None) -> dict:
    """Run the metadata pass, then each probe group; returns the merged samples document."""
    with tempfile.TemporaryDirectory(prefix="taccl-profile-") as tmp:
        tmp = Path(tmp)
        common = ["--timeout", str(timeout_s)] + (["--quick"] if quick else [])
        info, problem = _run_one([probe, "--groups", "none", "--out", str(tmp / "info.json")] + common,
                                 tmp / "info.json", max(60.0, timeout_s * 3), report)
        if info is None:
            doc = empty_samples()
            doc["errors"].append(f"probe metadata pass failed: {problem}")
            doc["skipped"].append({"probe": "all", "what": "every probe", "reason": problem})
            return doc
        n, nnics = len(info["gpus"]), len(info["nics"])
        est = estimate_seconds(n, nnics, quick, bool(peer or listen))
        report(f"profiling {n} GPU(s), {nnics} NIC(s){' (quick)' if quick else ''}: about "
               f"{sum(est.values()):.0f} s ({', '.join(f'{k} ~{v:.0f} s' for k, v in est.items())})")
        docs = [info]
        for group in list(GROUPS) + (["net"] if (peer or listen) else []):
            cmd = [probe, "--groups", group, "--out", str(tmp / f"{group}.json")] + common
            if group == "net":
                cmd += ["--peer", peer] if peer else ["--listen", str(listen)]
            # Generous: the estimate can be far off on an unknown machine; the binary's watchdog acts first.
            limit = group_limit_s or max(60.0, 4 * est.get(group, 30.0) + 2 * timeout_s)
            report(f"probe group {group}: limit {limit:.0f} s")
            d, problem = _run_one(cmd, tmp / f"{group}.json", limit, report)
            if d is not None:
                docs.append(d)
            if problem:
                extra = empty_samples()
                extra["skipped"].append({"probe": group, "what": f"probe group {group}", "reason": problem})
                extra["errors"].append(f"group {group}: {problem}")
                docs.append(extra)
        return merge_samples(docs)
