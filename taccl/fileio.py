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


def read_text(path, *, errors: str = "strict") -> str:
    """The file as UTF-8 text (`errors` as for `bytes.decode`); a failure is a UserError naming the file."""
    try:
        return Path(path).read_text(encoding="utf-8", errors=errors)
    except FileNotFoundError:
        raise UserError("file not found", path=str(path)) from None
    except IsADirectoryError:
        raise UserError("is a directory, expected a file", path=str(path)) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise UserError(f"cannot read: {exc}", path=str(path)) from None


def is_count(value, low: int | None = None, high: int | None = None) -> bool:
    """Whether a parsed field is a whole number, from `low` to `high` where given (JSON's true and false are
    not)."""
    return (isinstance(value, int) and not isinstance(value, bool) and (low is None or value >= low)
            and (high is None or value <= high))


class _NotJsonNumber(ValueError):
    pass


def _refuse_constant(name: str):
    raise _NotJsonNumber(name)


def load_json(path):
    """Parse a JSON file; a syntax error names its line and column. NaN and Infinity, which Python's parser
    takes but JSON has not, are refused too: a NaN bandwidth would pass every range check of the schema."""
    text = read_text(path)
    try:
        return json.loads(text, parse_constant=_refuse_constant)
    except _NotJsonNumber as exc:
        at = text.find(str(exc))
        line = text.count("\n", 0, at) + 1
        column = at - (text.rfind("\n", 0, at) + 1) + 1
        raise UserError(f"invalid JSON: {exc} is not a JSON number", path=str(path),
                        where=f"line {line} column {column}") from None
    except json.JSONDecodeError as exc:
        raise UserError(f"invalid JSON: {exc.msg}", path=str(path), where=f"line {exc.lineno} column {exc.colno}") from None
    except RecursionError:
        raise UserError("invalid input: JSON nested deeper than Python's parser follows", path=str(path)) from None


def json_path(parts) -> str:
    """['a', 0, 'b'] -> '$.a[0].b', the place reported in errors."""
    out = "$"
    for p in parts:
        out += f"[{p}]" if isinstance(p, int) else f".{p}"
    return out


@lru_cache(maxsize=None)
def load_schema(name: str) -> dict:
    return json.loads((SCHEMA_DIR / name).read_text())


# a schema error's message at most (it quotes the offending value)
MESSAGE_MAX_CHARS = 500


def shortened(message: str) -> str:
    """A schema error's message cut to `MESSAGE_MAX_CHARS`: it quotes the value whole, and a YAML alias can
    expand to megabytes."""
    if len(message) <= MESSAGE_MAX_CHARS:
        return message
    return message[:MESSAGE_MAX_CHARS] + f"... ({len(message)} characters)"


def strict_validator(cls):
    """The jsonschema validator class `cls` with "integer" meaning a whole number written as one: JSON Schema lets
    2.0 pass as an integer, and code that counts with it (`range(2.0)`) then fails with a traceback."""
    import jsonschema

    def whole(_, instance) -> bool:
        return isinstance(instance, int) and not isinstance(instance, bool)

    return jsonschema.validators.extend(cls, type_checker=cls.TYPE_CHECKER.redefine("integer", whole))


def validate(doc, schema_name: str, *, path: str | None = None) -> None:
    """Validate `doc` against `taccl/schemas/<schema_name>`; report the first (deepest) problem."""
    try:
        import jsonschema
    except ImportError as exc:  # a broken install, not bad input: say what to install
        raise TacclError("the Python package jsonschema is missing (a dependency of taccl): "
                         "pip install jsonschema") from exc

    schema = load_schema(schema_name)
    validator = strict_validator(jsonschema.Draft202012Validator)(schema)
    errors = sorted(validator.iter_errors(doc), key=lambda e: (len(e.absolute_path), list(map(str, e.absolute_path))))
    if errors:
        err = jsonschema.exceptions.best_match(errors)
        raise UserError(f"{shortened(err.message)} (schema {schema_name})", path=path,
                        where=json_path(err.absolute_path))


def check_output_dir(path, *, where: str = "-o") -> Path:
    """Refuse, before any work, an output directory that cannot be made or written: a file, one under a file,
    a read-only place, a name the file system cannot hold."""
    if not os.fspath(path):
        raise UserError("an empty directory name, expected a directory", where=where)
    path = Path(path)
    _check_writable_dir(path, path, where)
    return path


def check_output_file(path, *, where: str = "-o") -> Path:
    """`check_output_dir` for the file's directory, and the file itself not a directory (a device or a FIFO is
    written to, not replaced: `atomic_write`)."""
    raw = os.fspath(path)
    if not raw:
        raise UserError("an empty file name, expected a file name", where=where)
    path = Path(raw)
    if path.is_dir() or raw.endswith(os.sep):
        raise UserError("is a directory, expected a file name", path=raw, where=where)
    _check_writable_dir(path.parent, path, where)
    return path


def _check_writable_dir(directory: Path, target: Path, where: str) -> None:
    """That `directory` exists or can be made, and can be written in; errors name `target`."""
    _check_path_length(target, where)
    probe = directory
    while not probe.exists():  # the deepest part that exists must be a directory we may write in
        if probe.is_symlink():
            raise UserError(f"cannot be made: {probe} is a broken symbolic link", path=str(target), where=where)
        if probe.parent == probe:
            break
        probe = probe.parent
    if probe.exists() and not probe.is_dir():
        what = "is a file" if probe == target else f"cannot be made: {probe} is a file"
        raise UserError(f"{what}, expected a directory", path=str(target), where=where)
    if probe.exists() and not os.access(probe, os.W_OK | os.X_OK):
        raise UserError(f"cannot write in {probe}: permission denied", path=str(target), where=where)


def check_output_name(name: str, *, where: str = "--name", suffix: str = "", path: str | None = None) -> str:
    """A file name (not a path) that the file system can hold, `suffix` included (`path`: the file that gave
    it, if not the command line)."""
    if not name or name in (".", "..") or "/" in name or "\\" in name or "\0" in name:
        raise UserError(f"{name!r} is not a file name (no directories, '/', '..' or NUL)", path=path, where=where)
    if len((name + suffix).encode(errors="surrogateescape")) > _NAME_MAX:
        raise UserError(f"{name + suffix!r} is longer than the file system's {_NAME_MAX} bytes a name", path=path,
                        where=where)
    return name


_NAME_MAX = 255  # bytes in one path component on Linux file systems (ext4, xfs, tmpfs)


def _check_path_length(path: Path, where: str) -> None:
    for part in path.parts:
        if len(part.encode(errors="surrogateescape")) > _NAME_MAX:
            raise UserError(f"a part of the path is longer than the file system's {_NAME_MAX} bytes a name",
                            path=str(path), where=where)


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
    file it replaces. An existing path that is not a regular file (/dev/null, a FIFO) is written to as it is:
    a rename would replace the device node."""
    path = Path(path)
    if path.exists() and not path.is_file() and not path.is_dir():
        try:
            with open(path, mode) as fh:
                fh.write(data)
        except OSError as exc:
            raise UserError(f"cannot write: {exc.strerror or exc}", path=str(path)) from None
        return path
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        perms = path.stat().st_mode & 0o7777 if path.exists() else 0o666 & ~_umask()
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    except OSError as exc:  # a file in the way, no permission, a name too long: the user's to mend
        raise UserError(f"cannot write: {exc.strerror or exc}", path=str(path)) from None
    try:
        os.fchmod(fd, perms)
        with os.fdopen(fd, mode) as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException as exc:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        if isinstance(exc, OSError):  # a full disk, a quota: nothing half-written is left
            raise UserError(f"cannot write: {exc.strerror or exc}", path=str(path)) from None
        raise
    return path


# above this many characters compact: indenting turns off json's C encoder (a 1024-GPU algorithm: 15 s, not 2)
INDENT_MAX_CHARS = 10_000_000


def write_json(path, doc) -> Path:
    text = json.dumps(doc, separators=(",", ":"))
    if len(text) <= INDENT_MAX_CHARS:
        text = json.dumps(doc, indent=1)
    return atomic_write(path, text + "\n")
