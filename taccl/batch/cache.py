"""The batch's result store: one JSON file per result key, written atomically.

    OUTDIR/cache/<key[:2]>/<key>.json

A record is either there whole or not at all (written to a temporary file, then renamed), so a batch
killed at any moment loses only the results being computed. A file that does not parse (a disk that filled
up, a hand edit) counts as missing and is recomputed. `lock()` keeps two batches from sharing an OUTDIR.
"""
from __future__ import annotations

import fcntl
import json
import os
from pathlib import Path

from ..errors import UserError
from ..fileio import atomic_write


class Store:
    def __init__(self, root):
        self.root = Path(root)

    def path(self, key: str) -> Path:
        return self.root / key[:2] / f"{key}.json"

    def get(self, key: str) -> dict | None:
        try:
            with open(self.path(key)) as fh:
                record = json.load(fh)
        except (OSError, ValueError):
            return None
        return record if isinstance(record, dict) and record.get("key") == key else None

    def has(self, key: str) -> bool:
        return self.get(key) is not None

    def put(self, record: dict) -> None:
        atomic_write(self.path(record["key"]), json.dumps(record, separators=(",", ":")) + "\n")

    def prune(self, keep: set) -> int:
        """Delete every record whose key is not in `keep` (results of older inputs or taccl versions)."""
        n = 0
        if self.root.is_dir():
            for p in self.root.glob("*/*.json"):
                if p.stem not in keep:
                    p.unlink(missing_ok=True)
                    n += 1
        return n

    def remove_temporaries(self) -> int:
        """Temporary files of writes that a kill interrupted (atomic_write names them .<name>.*.tmp)."""
        n = 0
        if self.root.is_dir():
            for p in self.root.glob("*/.*.tmp"):
                p.unlink(missing_ok=True)
                n += 1
        return n


class OutdirLock:
    """An advisory lock on OUTDIR for the batch's lifetime; released by the OS if the process dies."""

    def __init__(self, outdir: Path):
        self.path = Path(outdir) / ".lock"
        self.fh = None

    def __enter__(self):
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self.fh = open(self.path, "a+")
        except OSError as exc:
            raise UserError(f"cannot use it as the output directory: {exc.strerror}",
                            path=str(self.path.parent)) from None
        try:
            fcntl.flock(self.fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            self.fh.close()
            raise UserError("another `taccl batch` is using this output directory; wait for it or choose another "
                            "with -o", path=str(self.path.parent)) from None
        self.fh.seek(0)
        self.fh.truncate()
        self.fh.write(f"{os.getpid()}\n")
        self.fh.flush()
        return self

    def __exit__(self, *exc):
        fcntl.flock(self.fh, fcntl.LOCK_UN)
        self.fh.close()
