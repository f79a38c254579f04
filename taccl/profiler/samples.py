"""The raw-samples file written by the probe binary (`profiler/taccl-probe`) and read by the analysis.

Format `taccl-profile-samples`, version 1 (one JSON object; every field but `format` may be missing):

    {
      "format": "taccl-profile-samples", "version": 1,
      "tool": {"name": "taccl-probe", "version": "...", "cuda_runtime": 13000},
      "host": {"hostname": "...", "numa_nodes": [{"id": 0, "cpus": "0-19"}]},
      "env": {"CUDA_VISIBLE_DEVICES": "...", "CUDA_DEVICE_ORDER": "PCI_BUS_ID"},
      "gpus": [{"index": 0, "name": "...", "pci_bus_id": "0000:07:00.0", "uuid": "GPU-...", "numa_node": 0, "sm": 80, "sms": 108,
                "mem_GBps": 2039.0}],
      "peer_access": [[false, true, ...], ...],           # cudaDeviceCanAccessPeer, row = src
      "nics": [{"name": "mlx5_0", "pci_bus_id": "...", "numa_node": 0, "rate_Gbps": 200}],
      "measurements": [ ... see below ... ],
      "skipped": [{"probe": "p2p_sm", "what": "0->3", "reason": "no peer access"}],
      "status": "complete" | "partial", "errors": ["..."]
    }

Measurements (times in microseconds, sizes in bytes; every record may carry "status" and "reason"):

    {"probe": "p2p", "engine": "ce"|"sm", "src": 0, "dst": 1, "samples": [[bytes, us], ...]}
    {"probe": "p2p_concurrent", "engine": "ce", "transfers": [[0, 1], [0, 2]], "bytes": N,
     "times_us": [[t_first, t_second], ...]}                  # both transfers started together
    {"probe": "host", "direction": "d2h"|"h2d", "gpu": 0, "samples": [[bytes, us], ...]}
    {"probe": "host_concurrent", "direction": "d2h"|"h2d", "gpus": [0, 1], "bytes": N, "times_us": [[t0, t1], ...]}
    {"probe": "nic_loopback", "nic": "mlx5_0", "numa_node": 0, "samples": [[bytes, us], ...]}
    {"probe": "host_nic_busy", "nic": "mlx5_0", "direction": "d2h", "gpu": 0, "bytes": N, "times_us": [us, ...]}
    {"probe": "net", "peer": "host:port", "samples": [[bytes, one_way_us], ...]}   # half the ping-pong
"""
from __future__ import annotations

from ..errors import UserError
from ..fileio import load_json

FORMAT = "taccl-profile-samples"
VERSION = 1
PROBES = ("p2p", "p2p_concurrent", "host", "host_concurrent", "nic_loopback", "host_nic_busy", "net")
# what each probe's record must hold: the fields that say what was measured (always), and its data (where it
# holds data, `ok`); the analysis reads them without looking again
_IDENTITY = {"p2p": ("engine", "src", "dst"), "p2p_concurrent": ("engine", "transfers"), "host": ("direction", "gpu"),
             "host_concurrent": ("direction", "gpus"), "nic_loopback": ("nic", "numa_node"),
             "host_nic_busy": ("nic", "direction", "gpu"), "net": ()}
_DATA = {"p2p": ("samples",), "p2p_concurrent": ("bytes", "times_us"), "host": ("samples",),
         "host_concurrent": ("bytes", "times_us"), "nic_loopback": ("samples",),
         "host_nic_busy": ("bytes", "times_us"), "net": ("samples",)}
_CHOICES = {"engine": ("ce", "sm"), "direction": ("d2h", "h2d")}


def empty_samples() -> dict:
    return {"format": FORMAT, "version": VERSION, "gpus": [], "nics": [], "measurements": [], "skipped": [],
            "status": "partial", "errors": []}


def _positive(v) -> bool:
    """A size or a time: a finite number above zero (a clock that ran backwards is a broken probe)."""
    return isinstance(v, (int, float)) and not isinstance(v, bool) and 0 < v < float("inf")


def check_samples(doc, *, path: str | None = None) -> dict:
    """Validate a samples document; returns it with defaults filled in. Bad input raises `UserError`."""
    if not isinstance(doc, dict):
        raise UserError("expected a JSON object (a taccl-profile-samples file)", path=path, where="$")
    if doc.get("format") != FORMAT:
        raise UserError(f"not a profiler samples file: expected \"format\": \"{FORMAT}\", got {doc.get('format')!r}",
                        path=path, where="$.format")
    if doc.get("version", VERSION) != VERSION:
        raise UserError(f"unsupported samples version {doc.get('version')!r}; this taccl reads version {VERSION}",
                        path=path, where="$.version")
    for key in ("gpus", "measurements"):
        if key not in doc:
            raise UserError("missing; expected a list", path=path, where=f"$.{key}")
    out = empty_samples()
    out.update(doc)
    for key in ("gpus", "nics", "measurements", "skipped", "errors"):
        if not isinstance(out[key], list):
            raise UserError(f"expected a list, got {type(out[key]).__name__}", path=path, where=f"$.{key}")
    for key in ("tool", "host", "env"):
        if out.get(key) is not None and not isinstance(out[key], dict):
            raise UserError(f"expected an object, got {type(out[key]).__name__}", path=path, where=f"$.{key}")
    if not isinstance(out["status"], str):
        raise UserError(f"expected a string, got {out['status']!r}", path=path, where="$.status")
    for i, g in enumerate(out["gpus"]):
        if not isinstance(g, dict) or g.get("index") != i:
            raise UserError(f"expected GPU records with \"index\": {i} in order", path=path, where=f"$.gpus[{i}]")
        _check_fields(g, (("numa_node", int), ("pci_bus_id", str), ("name", str)), path, f"$.gpus[{i}]")
    for i, nic in enumerate(out["nics"]):
        if not isinstance(nic, dict) or not isinstance(nic.get("name"), str):
            raise UserError("expected a NIC record with its \"name\"", path=path, where=f"$.nics[{i}]")
        _check_fields(nic, (("numa_node", int), ("rate_Gbps", (int, float))), path, f"$.nics[{i}]")
    n = len(out["gpus"])
    for i, m in enumerate(out["measurements"]):
        where = f"$.measurements[{i}]"
        if not isinstance(m, dict):
            raise UserError(f"expected a measurement (an object), got {m!r}", path=path, where=where)
        if m.get("probe") not in PROBES:
            raise UserError(f"unknown probe {m.get('probe')!r}; known: {list(PROBES)}", path=path, where=where)
        for key in ("src", "dst", "gpu"):
            if key in m and not (isinstance(m[key], int) and 0 <= m[key] < n):
                raise UserError(f"GPU index {m[key]!r} is not one of the {n} GPUs listed in $.gpus", path=path,
                                where=f"{where}.{key}")
        for key in ("transfers", "gpus"):
            for v in _flatten(m.get(key, [])):
                if not (isinstance(v, int) and 0 <= v < n):
                    raise UserError(f"GPU index {v!r} is not one of the {n} GPUs listed in $.gpus", path=path,
                                    where=f"{where}.{key}")
        samples = m.get("samples", [])
        if not isinstance(samples, list) or not all(
                isinstance(s, list) and len(s) == 2 and _positive(s[0]) and _positive(s[1]) for s in samples):
            raise UserError("expected samples as a list of [bytes, microseconds] pairs, both positive", path=path,
                            where=f"{where}.samples")
        times = m.get("times_us", [])
        if not isinstance(times, list) or not all(_positive(t) or (isinstance(t, list) and all(_positive(u) for u in t))
                                                  for t in times):
            raise UserError("expected times_us as a list of positive numbers (or of lists of them)", path=path,
                            where=f"{where}.times_us")
        for key in _IDENTITY[m["probe"]] + (_DATA[m["probe"]] if ok(m) else ()):
            if m.get(key) is None:
                says = ", ".join(_IDENTITY[m["probe"]]) or "its peer"
                raise UserError(f"missing: a {m['probe']} record names {says} and holds "
                                f"{' and '.join(_DATA[m['probe']])}", path=path, where=f"{where}.{key}")
            if key in _CHOICES and m[key] not in _CHOICES[key]:
                raise UserError(f"expected one of {', '.join(_CHOICES[key])}, got {m[key]!r}", path=path,
                                where=f"{where}.{key}")
        _check_fields(m, (("nic", str), ("numa_node", int)), path, where)
        if "bytes" in m and not _positive(m["bytes"]):
            raise UserError(f"expected a positive number of bytes, got {m['bytes']!r}", path=path,
                            where=f"{where}.bytes")
    return out


def _check_fields(record: dict, fields, path, where) -> None:
    """Each of `fields` ((key, type)) that `record` holds is of its type or null (JSON's true and false are not
    numbers)."""
    for key, kind in fields:
        v = record.get(key)
        if v is not None and (isinstance(v, bool) or not isinstance(v, kind)):
            what = "a string" if kind is str else "an integer" if kind is int else "a number"
            raise UserError(f"expected {what} or null, got {v!r}", path=path, where=f"{where}.{key}")


def _flatten(v):
    if isinstance(v, list):
        for x in v:
            yield from _flatten(x)
    else:
        yield v


def load_samples(path) -> dict:
    return check_samples(load_json(path), path=str(path))


def ok(m: dict) -> bool:
    """A measurement that holds data (not skipped, timed out or failed)."""
    return m.get("status", "ok") == "ok"
