"""Reading and writing MSCCL XML programs (``shared/docs/msccl-xml.md``).

Two dialects:

- ``executor`` (default for writing): the MSCCL executor / RCCL attribute set. ``<algo>`` carries
  ``outofplace``, ``minBytes``, ``maxBytes`` (all required there); the ReduceScatter collective is spelled
  ``reducescatter``; ``maxBytes`` is inclusive and ``0`` means unbounded.
- ``legacy``: the first MSCCL runtime (``microsoft/msccl``). No ``outofplace``; ``inplace`` alone says which
  calls the program serves; ``reduce_scatter``; ``maxBytes`` exclusive, default 2**27.

The writer emits exactly what both runtimes' hand-written tokenizer accepts (section 1.1): no XML
declaration, spaces and LF only, one start tag per line, single spaces between attributes, double-quoted
values, ``<step .../>`` elements.

The reader emulates that tokenizer on the raw text (a file it accepts is one the runtimes' parser accepts)
and is strict about what the runtimes' loaders reject: missing or non-integer attributes, unknown step
types, buffers or protocols, unknown collectives for the dialect. A problem raises `UserError` naming the
file, the line and the rank / thread block / step. Everything the model can represent (offsets out of
range, bad dependencies, unmatched sends, ...) is left to `taccl.checker`, so ``read`` followed by
``check_program`` is the complete acceptance test. Elements the runtimes skip (TACCL's ``<copy>``, say) are
skipped here too and reported as notes.

Public API
----------
``parse_xml(text, *, path=None, dialect=None) -> ParseResult``
``read_xml(path, *, dialect=None) -> ParseResult``
``read_program(path, *, dialect=None) -> Program``
``program_to_xml(program, *, dialect="executor") -> str``
``write_program(program, path, *, dialect="executor") -> Path``
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

from .errors import UserError
from .fileio import atomic_write, read_text
from .program import Buf, Gpu, Program, Proto, Step, StepType, Threadblock

__all__ = [
    "DIALECTS",
    "EXECUTOR_COLLECTIVES",
    "LEGACY_COLLECTIVES",
    "Note",
    "ParseResult",
    "parse_xml",
    "read_xml",
    "read_program",
    "program_to_xml",
    "write_program",
    "LEGACY_DEFAULT_MAX_BYTES",
]

DIALECTS = ("executor", "legacy")
EXECUTOR_COLLECTIVES = frozenset(
    {"allreduce", "allgather", "reduce", "broadcast", "alltoall", "reducescatter", "send", "recv", "gather",
     "scatter", "alltoallv"}
)
LEGACY_COLLECTIVES = frozenset({"allreduce", "allgather", "reduce", "broadcast", "alltoall", "reduce_scatter", "custom"})
LEGACY_DEFAULT_MAX_BYTES = 1 << 27  # exclusive
INT64_MAX = (1 << 63) - 1
MAX_ATTRS = 16  # the tokenizer keeps 16 attributes per element, ignores the rest
MAX_STR_LEN = 255

_STEP_ATTRS = ("s", "type", "srcbuf", "srcoff", "dstbuf", "dstoff", "cnt", "depid", "deps", "hasdep")
_TB_ATTRS = ("id", "send", "recv", "chan")
_GPU_ATTRS = ("id", "i_chunks", "o_chunks", "s_chunks")
_ALGO_KNOWN = ("name", "proto", "nchannels", "nchunksperloop", "ngpus", "coll", "inplace", "outofplace", "minBytes",
               "maxBytes", "root")
_ALGO_REQUIRED = {
    "legacy": ("name", "proto", "nchannels", "nchunksperloop", "ngpus", "coll", "inplace"),
    "executor": ("proto", "nchannels", "nchunksperloop", "ngpus", "coll", "inplace", "outofplace", "minBytes",
                 "maxBytes"),
}


@dataclass
class Note:
    """Something the runtimes accept but a reader should know (ignored element or attribute)."""

    line: int
    message: str

    def __str__(self) -> str:
        return f"line {self.line}: {self.message}"


@dataclass
class ParseResult:
    program: Program
    dialect: str
    notes: list[Note] = field(default_factory=list)
    path: str | None = None


# --------------------------------------------------------------------------------------------------------
# Lexical layer: the runtimes' tokenizer (NCCL xml.cc), fast path by regular expression.

_NAME = r"[A-Za-z_][A-Za-z0-9_.:-]*"
_TOKEN = re.compile(
    r"(?P<ws>[ \n\r]+)"
    r"|(?P<comment><!--.*?-->)"
    r"|</(?P<close>" + _NAME + r")>"
    r"|<(?P<open>" + _NAME + r")(?P<attrs>(?: " + _NAME + r'="[^"\n\r\t]*")*)(?P<single>/?)>',
    re.S,
)
_ATTR = re.compile(r" (" + _NAME + r')="([^"]*)"')
_INT = re.compile(r"[+-]?(?:0[xX][0-9a-fA-F]+|0|[1-9][0-9]*)\Z")
# The canonical step form (what our writer and msccl-tools emit), parsed in one match; anything else takes the
# general path with its precise errors.
_D = r'(-?(?:0|[1-9][0-9]{0,9}))'
_FAST_STEP = re.compile(
    r' s="' + _D + r'" type="(s|r|rcs|rrs|rrc|rrcs|cpy|re|nop)" srcbuf="([ios])" srcoff="' + _D + r'" dstbuf="([ios])" '
    r'dstoff="' + _D + r'" cnt="' + _D + r'" depid="' + _D + r'" deps="' + _D + r'" hasdep="([01])"'
)
_STEP_TYPES = {t.value: t for t in StepType}
_BUFS = {b.value: b for b in Buf}


def _diagnose(text: str, pos: int) -> str:
    """Why the tokenizer rejects the text at `pos` (a place where no token matched)."""
    c = text[pos]
    if c == "\t":
        return "tab character between elements (the MSCCL parser accepts only space, LF and CR there)"
    if c != "<":
        shown = text[pos:pos + 20].split("\n")[0]
        return f"expected '<', found text {shown!r} (no character data is allowed between elements)"
    if text.startswith("<?", pos):
        return "XML declaration or processing instruction '<?...?>' is not accepted by the MSCCL parser"
    if text.startswith("<!--", pos):
        return "unterminated comment"
    end = pos + 1
    # Walk the tag as the runtimes' tokenizer does.
    m = re.compile(_NAME).match(text, end)
    if text.startswith("</", pos):
        m = re.compile(_NAME).match(text, pos + 2)
        if not m:
            return "closing tag without a valid element name"
        nxt = text[m.end():m.end() + 1]
        return f"closing tag </{m.group(0)}> must end with '>' right after the name, found {nxt!r}"
    if not m:
        return f"start tag without a valid element name at {text[pos:pos + 20]!r}"
    name = m.group(0)
    i = m.end()
    nattr = 0
    while True:
        c = text[i:i + 1]
        if c == ">":
            return f"<{name}>: malformed start tag"  # unreachable in practice
        if c == "/":
            if text[i + 1:i + 2] != ">":
                return f"<{name}>: '/' must be followed directly by '>'"
            return f"<{name}>: malformed start tag"
        if c in ("\n", "\r"):
            return f"<{name}>: a start tag must sit on one line (line break inside the tag)"
        if c == "\t":
            return f"<{name}>: tab inside a start tag (attributes are separated by a single space)"
        if c == "":
            return f"<{name}>: unexpected end of file inside a start tag"
        if c != " ":
            return f"<{name}>: unexpected character {c!r} after {'the name' if nattr == 0 else 'an attribute value'}"
        i += 1
        c = text[i:i + 1]
        if c == " ":
            return f"<{name}>: attributes must be separated by a single space"
        if c in (">", "/"):
            return f"<{name}>: space before {'/>' if c == '/' else '>'} is not accepted"
        km = re.compile(_NAME).match(text, i)
        if not km:
            return f"<{name}>: invalid attribute name at {text[i:i + 15]!r}"
        key = km.group(0)
        i = km.end()
        c = text[i:i + 1]
        if c == " " and text[i + 1:i + 2] == "=":
            return f"<{name}>: no spaces are allowed around '=' (attribute {key})"
        if c != "=":
            return f"<{name}>: attribute {key} has no '=\"value\"'"
        i += 1
        c = text[i:i + 1]
        if c == " ":
            return f"<{name}>: no spaces are allowed around '=' (attribute {key})"
        if c == "'":
            return f"<{name}>: attribute {key}: values must be in double quotes, not single quotes"
        if c != '"':
            return f"<{name}>: attribute {key}: value must be in double quotes"
        j = text.find('"', i + 1)
        if j < 0:
            return f"<{name}>: attribute {key}: unterminated value"
        value = text[i + 1:j]
        if "\n" in value or "\r" in value:
            return f"<{name}>: attribute {key}: line break inside a value (a start tag must sit on one line)"
        if "\t" in value:
            return f"<{name}>: attribute {key}: tab inside a value"
        i = j + 1
        nattr += 1
        c = text[i:i + 1]
        if c in ("\n", "\r"):
            return f"<{name}>: line break after attribute {key} (only ' ', '/' or '>' may follow a value)"
        if c == "":
            return f"<{name}>: unexpected end of file after attribute {key}"
        if c not in (" ", "/", ">"):
            return f"<{name}>: unexpected character {c!r} after attribute {key} (only ' ', '/' or '>' may follow)"


# --------------------------------------------------------------------------------------------------------
# Reader


class _Reader:
    def __init__(self, text: str, path: str | None, dialect: str | None):
        if dialect is not None and dialect not in DIALECTS:
            raise UserError(f"unknown dialect {dialect!r}, expected one of {', '.join(DIALECTS)}")
        self.text = text
        self.path = path
        self.want_dialect = dialect
        self.dialect = dialect or "executor"
        self.notes: list[Note] = []
        self.dropped_at: set = set()  # lines of elements with attributes past MAX_ATTRS
        self.line = 1
        self._line_pos = 0
        self.gpu: Gpu | None = None
        self.tb: Threadblock | None = None

    # -- helpers ------------------------------------------------------------------------------------------
    def where(self, line: int | None = None, extra: str = "") -> str:
        parts = [f"line {line if line is not None else self.line}"]
        ctx = []
        if self.gpu is not None:
            ctx.append(f"rank {self.gpu.id}")
        if self.tb is not None:
            ctx.append(f"tb {self.tb.id}")
        if extra:
            ctx.append(extra)
        if ctx:
            parts.append("(" + ", ".join(ctx) + ")")
        return " ".join(parts)

    def fail(self, msg: str, line: int | None = None, extra: str = "") -> UserError:
        return UserError(msg, path=self.path, where=self.where(line, extra))

    def attrs(self, elem: str, raw: str, line: int) -> dict[str, str]:
        pairs = _ATTR.findall(raw)
        if len(pairs) > MAX_ATTRS:
            dropped = [k for k, _ in pairs[MAX_ATTRS:]]
            self.notes.append(Note(line, f"<{elem}> has {len(pairs)} attributes; the runtimes keep the first "
                                         f"{MAX_ATTRS} and ignore {', '.join(dropped)}"))
            pairs = pairs[:MAX_ATTRS]
            self.dropped_at.add(line)
        out: dict[str, str] = {}
        for k, v in pairs:
            if len(k) > MAX_STR_LEN or len(v) > MAX_STR_LEN:
                raise self.fail(f"<{elem}> attribute {k[:40]}: keys and values may be at most {MAX_STR_LEN} "
                                f"characters", line)
            if k in out:
                self.notes.append(Note(line, f"<{elem}> repeats attribute {k}; the runtimes use the first"))
                continue
            out[k] = v
        return out

    def missing(self, elem: str, key: str, line: int, extra: str = "", hint: str = "") -> UserError:
        if line in self.dropped_at:
            hint += f" (it has more than {MAX_ATTRS} attributes: the runtimes read the first {MAX_ATTRS} only)"
        return self.fail(f"<{elem}> is missing required attribute {key}{hint}", line, extra)

    def integer(self, elem: str, attrs: dict[str, str], key: str, line: int, extra: str = "") -> int:
        if key not in attrs:
            raise self.missing(elem, key, line, extra)
        v = attrs[key]
        if not _INT.match(v):
            if re.fullmatch(r"[+-]?0[0-7]+", v):
                raise self.fail(f"<{elem}> {key}=\"{v}\": a leading zero makes the runtimes read this as octal "
                                f"({int(v, 8)}); write it without the leading zero", line, extra)
            raise self.fail(f"<{elem}> {key}=\"{v}\" is not an integer", line, extra)
        return int(v, 0)

    # -- elements -----------------------------------------------------------------------------------------
    def algo(self, a: dict[str, str], line: int) -> Program:
        coll = a.get("coll")
        if self.want_dialect is None:
            if coll in EXECUTOR_COLLECTIVES - LEGACY_COLLECTIVES:
                self.dialect = "executor"
            elif coll in LEGACY_COLLECTIVES - EXECUTOR_COLLECTIVES:
                self.dialect = "legacy"
            else:
                self.dialect = "executor" if "outofplace" in a else "legacy"
        d = self.dialect
        for key in _ALGO_REQUIRED[d]:
            if key not in a:
                hint = ""
                if d == "executor" and key in ("outofplace", "minBytes", "maxBytes"):
                    hint = " (the MSCCL executor requires it; read with dialect 'legacy' for the first runtime)"
                raise self.missing("algo", key, line, hint=hint)
        if coll is None:
            raise self.missing("algo", "coll", line)
        allowed = EXECUTOR_COLLECTIVES if d == "executor" else LEGACY_COLLECTIVES
        if coll not in allowed:
            hint = ""
            if coll == "reduce_scatter":
                hint = " (the executor spells it reducescatter)"
            elif coll == "reducescatter":
                hint = " (the legacy runtime spells it reduce_scatter)"
            raise self.fail(f"<algo> coll=\"{coll}\" is not a collective the {d} runtime knows; expected one of "
                            f"{', '.join(sorted(allowed))}{hint}", line)
        try:
            proto = Proto(a["proto"])
        except ValueError:
            raise self.fail(f"<algo> proto=\"{a['proto']}\" must be Simple, LL or LL128", line) from None
        ints = {k: self.integer("algo", a, k, line) for k in ("nchannels", "nchunksperloop", "ngpus", "inplace")}
        if d == "executor":
            outofplace = self.integer("algo", a, "outofplace", line) != 0
            inplace = ints["inplace"] != 0
            min_b = self.integer("algo", a, "minBytes", line)
            max_b = self.integer("algo", a, "maxBytes", line)
        else:
            inplace = ints["inplace"] != 0
            outofplace = not inplace
            min_b = self.integer("algo", a, "minBytes", line) if "minBytes" in a else 0
            if "maxBytes" in a:
                legacy_max = self.integer("algo", a, "maxBytes", line)
                if legacy_max <= 0:
                    raise self.fail(f"<algo> maxBytes=\"{a['maxBytes']}\": the legacy window [minBytes, maxBytes) "
                                    f"is empty", line)
                max_b = legacy_max - 1
            else:
                max_b = LEGACY_DEFAULT_MAX_BYTES - 1
            if "outofplace" in a:
                self.notes.append(Note(line, "outofplace is not read by the legacy runtime; inplace decides"))
        if min_b < 0 or max_b < 0:
            raise self.fail("<algo> minBytes and maxBytes may not be negative", line)
        if max_b != 0 and min_b > max_b:
            raise self.fail(f"<algo> minBytes ({min_b}) is larger than maxBytes", line)
        root = self.integer("algo", a, "root", line) if "root" in a else None
        extra = {k: v for k, v in a.items() if k not in _ALGO_KNOWN}
        return Program(
            name=a.get("name", ""),
            collective="reducescatter" if coll == "reduce_scatter" else coll,
            proto=proto,
            nchannels=ints["nchannels"],
            nchunksperloop=ints["nchunksperloop"],
            ngpus=ints["ngpus"],
            inplace=inplace,
            outofplace=outofplace,
            min_bytes=min_b,
            max_bytes=max_b,
            extra=extra,
            root=root,
        )

    def gpu_elem(self, a: dict[str, str], line: int) -> Gpu:
        v = {k: self.integer("gpu", a, k, line) for k in _GPU_ATTRS}
        return Gpu(id=v["id"], i_chunks=v["i_chunks"], o_chunks=v["o_chunks"], s_chunks=v["s_chunks"], line=line)

    def tb_elem(self, a: dict[str, str], line: int) -> Threadblock:
        v = {k: self.integer("tb", a, k, line) for k in _TB_ATTRS}
        return Threadblock(id=v["id"], send=v["send"], recv=v["recv"], chan=v["chan"], line=line)

    def step_elem(self, a: dict[str, str], line: int) -> Step:
        index = len(self.tb.steps)
        extra = f"step {a.get('s', '#' + str(index))}"
        for key in _STEP_ATTRS:
            if key not in a:
                raise self.fail(f"<step> is missing required attribute {key} (all ten are required, even on nop)",
                                line, extra)
        try:
            stype = StepType(a["type"])
        except ValueError:
            raise self.fail(f"<step> type=\"{a['type']}\" is not an instruction the runtimes execute; expected one of "
                            f"{', '.join(t.value for t in StepType)}", line, extra) from None
        bufs = []
        for key in ("srcbuf", "dstbuf"):
            try:
                bufs.append(Buf(a[key]))
            except ValueError:
                raise self.fail(f"<step> {key}=\"{a[key]}\" must be i, o or s (even when unused)", line, extra) from None
        n = {k: self.integer("step", a, k, line, extra) for k in ("s", "srcoff", "dstoff", "cnt", "depid", "deps",
                                                                  "hasdep")}
        if n["hasdep"] not in (0, 1):
            raise self.fail(f"<step> hasdep=\"{a['hasdep']}\" must be 0 or 1", line, extra)
        return Step(s=n["s"], type=stype, srcbuf=bufs[0], srcoff=n["srcoff"], dstbuf=bufs[1], dstoff=n["dstoff"],
                    cnt=n["cnt"], depid=n["depid"], deps=n["deps"], hasdep=bool(n["hasdep"]), line=line)

    # -- driver -------------------------------------------------------------------------------------------
    def run(self) -> ParseResult:
        text = self.text
        pos = 0
        n = len(text)
        match = _TOKEN.match
        program: Program | None = None
        done = False  # </algo> seen
        stack: list[str] = []  # open element names
        skip_depth = 0  # > 0 while inside an element the runtimes skip
        last_line_pos = 0
        line = 1
        while pos < n:
            m = match(text, pos)
            if m is None:
                line += text.count("\n", last_line_pos, pos)
                last_line_pos = pos
                raise self.fail(_diagnose(text, pos), line)
            kind = m.lastgroup
            start = pos
            pos = m.end()
            if kind == "ws" or kind == "comment":
                continue
            line += text.count("\n", last_line_pos, start)
            last_line_pos = start
            self.line = line
            if kind == "close":
                name = m.group("close")
                if not stack:
                    raise self.fail(f"closing tag </{name}> without a matching start tag", line)
                if stack[-1] != name:
                    raise self.fail(f"closing tag </{name}> does not match <{stack[-1]}>", line)
                stack.pop()
                if skip_depth:
                    skip_depth -= 1
                elif name == "tb":
                    self.tb = None
                elif name == "gpu":
                    self.gpu = None
                elif name == "algo":
                    done = True
                continue
            # start tag (open or single)
            name = m.group("open")
            single = m.group("single") == "/"
            if skip_depth:
                if not single:
                    stack.append(name)
                    skip_depth += 1
                continue
            depth = len(stack)
            if depth == 0:
                if done or program is not None:
                    raise self.fail(f"unexpected element <{name}> after </algo> (a file holds one <algo>)", line)
                if name != "algo":
                    raise self.fail(f"the first element must be <algo>, found <{name}>", line)
                program = self.algo(self.attrs(name, m.group("attrs"), line), line)
                if single:
                    done = True
                else:
                    stack.append(name)
                continue
            parent = stack[-1]
            expected = {"algo": "gpu", "gpu": "tb", "tb": "step"}.get(parent)
            if name != expected:
                self.notes.append(Note(line, f"<{name}> inside <{parent}> is ignored by the runtimes"))
                if not single:
                    stack.append(name)
                    skip_depth = 1
                continue
            if name == "step":
                fm = _FAST_STEP.fullmatch(m.group("attrs"))
                if fm is not None:
                    s_, t_, sb, so, db, do, cn, di, ds, hd = fm.groups()
                    self.tb.steps.append(Step(s=int(s_), type=_STEP_TYPES[t_], srcbuf=_BUFS[sb], srcoff=int(so),
                                              dstbuf=_BUFS[db], dstoff=int(do), cnt=int(cn), depid=int(di),
                                              deps=int(ds), hasdep=hd == "1", line=line))
                    if not single:
                        stack.append(name)
                        skip_depth = 1
                    continue
            a = self.attrs(name, m.group("attrs"), line)
            if name == "gpu":
                self.gpu = self.gpu_elem(a, line)
                program.gpus.append(self.gpu)
                if single:
                    self.gpu = None
            elif name == "tb":
                self.tb = self.tb_elem(a, line)
                self.gpu.threadblocks.append(self.tb)
                if single:
                    self.tb = None
            else:
                self.tb.steps.append(self.step_elem(a, line))
                if not single:
                    # children of <step> are skipped by the runtimes
                    stack.append(name)
                    skip_depth = 1
                    # closing </step> ends the skip: treat the step itself as the skipped element
                continue
            if not single:
                stack.append(name)
        if program is None:
            raise self.fail("no <algo> element found", line)
        if stack:
            raise self.fail(f"unexpected end of file: <{stack[-1]}> is not closed", line)
        return ParseResult(program=program, dialect=self.dialect, notes=self.notes, path=self.path)


def parse_xml(text: str, *, path: str | None = None, dialect: str | None = None) -> ParseResult:
    """Parse MSCCL XML text. ``dialect`` None detects it (``outofplace`` present means executor).

    Raises `UserError` for anything the runtimes' parser or loader rejects that the model cannot hold.
    """
    return _Reader(text, path, dialect).run()


def read_xml(path, *, dialect: str | None = None) -> ParseResult:
    # the runtimes read bytes: a stray non-UTF-8 byte in a value (a name) is no error there, nor here
    return parse_xml(read_text(path, errors="replace"), path=str(path), dialect=dialect)


def read_program(path, *, dialect: str | None = None) -> Program:
    return read_xml(path, dialect=dialect).program


# --------------------------------------------------------------------------------------------------------
# Writer

_BAD_VALUE = re.compile(r'["\n\r\t<>&]')


def _value(v, what: str) -> str:
    s = str(v)
    if _BAD_VALUE.search(s) or len(s) > MAX_STR_LEN:
        raise UserError(f"{what}={s[:40]!r} cannot be written: values may not contain quotes, tabs, line breaks, "
                        f"'<', '>' or '&' and may be at most {MAX_STR_LEN} characters")
    return s


def _tag(name: str, pairs: list[tuple[str, object]], close: str) -> str:
    return "<" + name + "".join(f' {k}="{v}"' for k, v in pairs) + close


# each enum's XML spellings by member (a str enum's member hashes and compares as its spelling, so the raw
# spelling finds itself too): a dict lookup where Enum(x).value takes a microsecond, 10^5 times a program
_SPELLINGS = {E: {m: m.value for m in E} for E in (StepType, Buf)}


def _spelling(enum, x) -> str:
    """`enum(x).value`, fast (anything not a member or its spelling: the enum's own error)."""
    return _SPELLINGS[enum].get(x) or enum(x).value


def program_to_xml(program: Program, *, dialect: str = "executor") -> str:
    """The program as MSCCL XML text in `dialect` (``executor`` or ``legacy``). Pure: no pruning, no nops."""
    if dialect not in DIALECTS:
        raise UserError(f"unknown dialect {dialect!r}, expected one of {', '.join(DIALECTS)}")
    p = program
    coll = p.collective
    if dialect == "legacy":
        if coll == "reducescatter":
            coll = "reduce_scatter"
        if coll not in LEGACY_COLLECTIVES:
            raise UserError(f"collective {p.collective!r} cannot be written in the legacy dialect")
        if p.inplace == p.outofplace:
            raise UserError("the legacy dialect serves either in-place or out-of-place calls, not "
                            f"{'both' if p.inplace else 'neither'}: set exactly one of inplace/outofplace")
    else:
        if coll not in EXECUTOR_COLLECTIVES:
            raise UserError(f"collective {p.collective!r} cannot be written in the executor dialect")
    pairs: list[tuple[str, object]] = [
        ("name", _value(p.name, "name")),
        ("proto", Proto(p.proto).value),
        ("nchannels", int(p.nchannels)),
        ("nchunksperloop", int(p.nchunksperloop)),
        ("ngpus", int(p.ngpus)),
        ("coll", coll),
        ("inplace", int(bool(p.inplace))),
    ]
    if dialect == "executor":
        pairs += [("outofplace", int(bool(p.outofplace))), ("minBytes", int(p.min_bytes)),
                  ("maxBytes", int(p.max_bytes))]
    else:
        if p.min_bytes:
            pairs.append(("minBytes", int(p.min_bytes)))
        legacy_max = INT64_MAX if p.max_bytes == 0 else int(p.max_bytes) + 1
        if legacy_max != LEGACY_DEFAULT_MAX_BYTES:
            pairs.append(("maxBytes", legacy_max))
    if p.root is not None:
        pairs.append(("root", int(p.root)))
    for k, v in p.extra.items():
        if k in _ALGO_KNOWN or not re.fullmatch(_NAME, k):
            raise UserError(f"extra <algo> attribute {k!r} cannot be written (reserved or not a valid name)")
        pairs.append((k, _value(v, k)))
    if len(pairs) > MAX_ATTRS:
        raise UserError(f"<algo> would have {len(pairs)} attributes; the runtimes read only {MAX_ATTRS}")
    out = [_tag("algo", pairs, ">")]
    for g in p.gpus:
        out.append("  " + _tag("gpu", [("id", g.id), ("i_chunks", g.i_chunks), ("o_chunks", g.o_chunks),
                                       ("s_chunks", g.s_chunks)], ">"))
        for tb in g.threadblocks:
            out.append(f'    <tb id="{int(tb.id)}" send="{int(tb.send)}" recv="{int(tb.recv)}" chan="{int(tb.chan)}">')
            for st in tb.steps:
                out.append(
                    f'      <step s="{int(st.s)}" type="{_spelling(StepType, st.type)}" '
                    f'srcbuf="{_spelling(Buf, st.srcbuf)}" srcoff="{int(st.srcoff)}" '
                    f'dstbuf="{_spelling(Buf, st.dstbuf)}" dstoff="{int(st.dstoff)}" '
                    f'cnt="{int(st.cnt)}" depid="{int(st.depid)}" deps="{int(st.deps)}" '
                    f'hasdep="{int(bool(st.hasdep))}"/>'
                )
            out.append("    </tb>")
        out.append("  </gpu>")
    out.append("</algo>")
    return "\n".join(out) + "\n"


def write_program(program: Program, path, *, dialect: str = "executor") -> Path:
    """Write the program atomically. Checking is the caller's job (`taccl.checker.check_program`)."""
    return atomic_write(path, program_to_xml(program, dialect=dialect))
