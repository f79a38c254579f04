"""Reading user files with precise errors, and writing files atomically.

Every reader reports the file and the place (JSON path, line) of a problem as a `UserError`.
Every writer goes through `atomic_write`, so a crash never leaves a half-written file behind.
"""
from __future__ import annotations

import json
import os
import tempfile
from functools import lru_cache
from pathlib import Path

from .errors import TacclError, UserError

SCHEMA_DIR = Path(__file__).parent / "schemas"


def read_text(path) -> str:
    try:
        return Path(path).read_text()
    except FileNotFoundError:
        raise UserError("file not found", path=str(path)) from None
    except IsADirectoryError:
        raise UserError("is a directory, expected a file", path=str(path)) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise UserError(f"cannot read: {exc}", path=str(path)) from None


def load_json(path):
    """Parse a JSON file; a syntax error names its line and column."""
    text = read_text(path)
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise UserError(f"invalid JSON: {exc.msg}", path=str(path), where=f"line {exc.lineno} column {exc.colno}") from None


def json_path(parts) -> str:
    """['a', 0, 'b'] -> '$.a[0].b', the place reported in errors."""
    out = "$"
    for p in parts:
        out += f"[{p}]" if isinstance(p, int) else f".{p}"
    return out


@lru_cache(maxsize=None)
def load_schema(name: str) -> dict:
    return json.loads((SCHEMA_DIR / name).read_text())


def validate(doc, schema_name: str, *, path: str | None = None) -> None:
    """Validate `doc` against `taccl/schemas/<schema_name>`; report the first (deepest) problem."""
    try:
        import jsonschema
    except ImportError as exc:  # a broken install, not bad input: say what to install
        raise TacclError("the Python package jsonschema is missing (a dependency of taccl): "
                         "pip install jsonschema") from exc

    schema = load_schema(schema_name)
    validator = jsonschema.Draft202012Validator(schema)
    errors = sorted(validator.iter_errors(doc), key=lambda e: (len(e.absolute_path), list(map(str, e.absolute_path))))
    if errors:
        err = jsonschema.exceptions.best_match(errors)
        raise UserError(f"{err.message} (schema {schema_name})", path=path, where=json_path(err.absolute_path))


def _umask() -> int:
    """The process's umask, read without changing it where Linux shows it (os.umask can only set it)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def atomic_write(path, data, *, mode: str = "w") -> Path:
    """Write `data` to `path` via a temporary file in the same directory and a rename. The file gets the
    permissions any tool's new file gets (0666 less the umask; mkstemp's are 0600), or keeps those of the
    file it replaces."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        perms = path.stat().st_mode & 0o7777
    except OSError:
        perms = 0o666 & ~_umask()
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        os.fchmod(fd, perms)
        with os.fdopen(fd, mode) as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise
    return path


# above this many characters compact: indenting turns off json's C encoder (a 1024-GPU algorithm: 15 s, not 2)
INDENT_MAX_CHARS = 10_000_000


def write_json(path, doc) -> Path:
    text = json.dumps(doc, separators=(",", ":"))
    if len(text) <= INDENT_MAX_CHARS:
        text = json.dumps(doc, indent=1)
    return atomic_write(path, text + "\n")
