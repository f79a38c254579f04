"""Python binding of the C++ runtime (`runtime/`): run MSCCL XML programs and check their results.

Two layers, as the style guide asks: `_Lib` mirrors the C API one function at a time (ctypes releases the
GIL during every foreign call), and `Runtime` / `run_program` are the Pythonic wrappers. Buffers are numpy
arrays owned by the caller; the reference results are computed here from the collective's definition,
independently of any program.

The shared library is built by `make runtime` into `runtime/build/`; `TACCL_RUNTIME_LIB` overrides the path.
"""
from __future__ import annotations

import ctypes
import os
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from .errors import CheckFailed, UserError
from .targets import RANK_MULTIPLIED, ROOTED

__all__ = ["COLLS", "DTYPES", "OPS", "Runtime", "RunOutcome", "library_path", "reference", "make_inputs",
           "count_wrong", "run_program", "cuda_available"]

COLLS = ["allgather", "reducescatter", "allreduce", "alltoall", "broadcast", "reduce"]
DTYPES = ["int8", "uint8", "int32", "uint32", "int64", "uint64", "float16", "bfloat16", "float32", "float64"]
OPS = ["sum", "prod", "min", "max"]
# numpy storage of each type; bfloat16 is carried as raw uint16 bits.
_NP = {"int8": np.int8, "uint8": np.uint8, "int32": np.int32, "uint32": np.uint32, "int64": np.int64,
       "uint64": np.uint64, "float16": np.float16, "bfloat16": np.uint16, "float32": np.float32,
       "float64": np.float64}

_REPO = Path(__file__).resolve().parent.parent


def library_path(cuda: bool = False) -> Path:
    """Path of the runtime's shared library; raises UserError telling how to build it when missing."""
    env = os.environ.get("TACCL_RUNTIME_LIB")
    if env and not cuda:
        p = Path(env)
    else:
        p = _REPO / "runtime" / "build" / ("libtaccl_runtime_cuda.so" if cuda else "libtaccl_runtime.so")
    if not p.is_file():
        what = "the CUDA backend (needs nvcc)" if cuda else "the runtime library"
        raise UserError(f"{what} is not built: run `make runtime` in the repository root", path=str(p))
    return p


class _ProgramInfo(ctypes.Structure):
    _fields_ = [("path", ctypes.c_char_p), ("name", ctypes.c_char_p), ("coll", ctypes.c_int),
                ("proto", ctypes.c_int), ("ngpus", ctypes.c_int), ("nchannels", ctypes.c_int),
                ("nchunksperloop", ctypes.c_int), ("inplace", ctypes.c_int), ("outofplace", ctypes.c_int),
                ("minBytes", ctypes.c_int64), ("maxBytes", ctypes.c_int64), ("maxThreadBlocks", ctypes.c_int),
                ("receives", ctypes.c_int), ("directReceives", ctypes.c_int)]


class _RunResult(ctypes.Structure):
    _fields_ = [("outcome", ctypes.c_int), ("program", ctypes.c_int), ("elapsedUs", ctypes.c_double),
                ("tiles", ctypes.c_int64), ("call", ctypes.c_int64), ("generation", ctypes.c_int64)]


_LIBS: dict = {}


def _lib(cuda: bool = False):
    key = bool(cuda)
    if key in _LIBS:
        return _LIBS[key]
    lib = ctypes.CDLL(str(library_path(cuda)))
    H = ctypes.c_void_p
    sig = {
        "tacclCreate": (H, []),
        "tacclDestroy": (None, [H]),
        "tacclLastError": (ctypes.c_char_p, [H]),
        "tacclSetOption": (ctypes.c_int, [H, ctypes.c_char_p, ctypes.c_int64]),
        "tacclLoadFile": (ctypes.c_int, [H, ctypes.c_char_p]),
        "tacclLoadFromEnv": (ctypes.c_int, [H, ctypes.POINTER(ctypes.c_int)]),
        "tacclNumPrograms": (ctypes.c_int, [H]),
        "tacclGetProgramInfo": (ctypes.c_int, [H, ctypes.c_int, ctypes.POINTER(_ProgramInfo)]),
        "tacclSelect": (ctypes.c_int, [H, ctypes.c_int, ctypes.c_int, ctypes.c_int64, ctypes.c_int, ctypes.c_int,
                                       ctypes.POINTER(ctypes.c_int)]),
        "tacclRun": (ctypes.c_int, [H, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_int,
                                    ctypes.c_int64, ctypes.POINTER(ctypes.c_void_p), ctypes.POINTER(ctypes.c_void_p),
                                    ctypes.c_int, ctypes.POINTER(_RunResult)]),
        "tacclRunHostBuffers": (ctypes.c_int, [H, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_int,
                                               ctypes.c_int64, ctypes.POINTER(ctypes.c_void_p),
                                               ctypes.POINTER(ctypes.c_void_p), ctypes.c_int,
                                               ctypes.POINTER(_RunResult)]),
        "tacclSwap": (ctypes.c_int, [H, ctypes.c_char_p, ctypes.c_int64, ctypes.POINTER(ctypes.c_int64)]),
        "tacclNextCall": (ctypes.c_int64, [H]),
        "tacclWatch": (ctypes.c_int, [H, ctypes.c_char_p, ctypes.c_int64]),
        "tacclWatchStatus": (ctypes.c_int, [H, ctypes.POINTER(ctypes.c_int64)]),
        "tacclCudaAvailable": (ctypes.c_int, []),
        "tacclCheckFile": (ctypes.c_int, [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_size_t]),
    }
    for name, (res, args) in sig.items():
        fn = getattr(lib, name)
        fn.restype = res
        fn.argtypes = args
    _LIBS[key] = lib
    return lib


def cuda_available() -> bool:
    """True when the CUDA backend is built and a GPU is usable."""
    try:
        return bool(_lib(cuda=True).tacclCudaAvailable())
    except (UserError, OSError):
        return False


@dataclass
class ProgramInfo:
    path: str
    name: str
    coll: str
    proto: str
    ngpus: int
    nchannels: int
    nchunksperloop: int
    inplace: bool
    outofplace: bool
    min_bytes: int
    max_bytes: int
    max_thread_blocks: int
    receives: int = 0         # receiving steps, all ranks
    direct_receives: int = 0  # of which the sender writes straight into the destination


@dataclass
class RunOutcome:
    """What one collective did. `outputs[r]` is rank r's output buffer (a view into `buffers[r]`)."""
    status: str  # "done", "no_match", "deadlock", "failed"
    message: str
    elapsed_us: float
    tiles: int
    program: int
    outputs: list = field(default_factory=list)
    call: int = -1  # the call's sequence number on its runtime handle
    generation: int = -1  # the program set it ran on (see `Runtime.swap`)


class Runtime:
    """A runtime handle: load programs, set options, run collectives on numpy buffers.

    >>> with Runtime() as rt:                               # doctest: +SKIP
    ...     i = rt.load("ring.xml"); out = rt.run_raw("allreduce", "float32", "sum", inputs)
    """

    def __init__(self, *, backend: str = "host", timeout_ms: int | None = None, tile_bytes: int | None = None,
                 analysis: bool = True, direct: bool | None = None):
        if backend not in ("host", "cuda"):
            raise UserError(f"unknown backend {backend!r} (host or cuda)")
        self._cuda = backend == "cuda"
        self._lib = _lib(self._cuda)
        self._h = self._lib.tacclCreate()
        if not self._h:
            raise MemoryError("tacclCreate failed")
        if self._cuda:
            self._option("backend", 1)
        if timeout_ms is not None:
            self._option("timeout_ms", int(timeout_ms))
        if tile_bytes is not None:
            self._option("tile_bytes", int(tile_bytes))
        self._option("analysis", 1 if analysis else 0)
        if direct is not None:  # None: the library's default (on, unless TACCL_RUNTIME_DIRECT=0)
            self._option("direct", 1 if direct else 0)

    def close(self):
        if self._h:
            self._lib.tacclDestroy(self._h)
            self._h = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass

    def _error(self) -> str:
        return (self._lib.tacclLastError(self._h) or b"").decode(errors="replace")

    def _option(self, name: str, value: int):
        if self._lib.tacclSetOption(self._h, name.encode(), int(value)) != 0:
            raise UserError(self._error())

    def load(self, path) -> int:
        """Load and validate one XML file; returns its index. Raises UserError with a located message."""
        if os.path.isdir(path):  # the runtime reads a directory as an empty file
            raise UserError("is a directory, expected an XML file", path=str(path))
        if self._lib.tacclLoadFile(self._h, os.fsencode(str(path))) != 0:
            msg, p = self._error(), str(path)
            # The runtime's message already starts with "path:line: rank R tb T step S:".
            raise UserError(msg) if msg.startswith(p) else UserError(msg, path=p)
        return self._lib.tacclNumPrograms(self._h) - 1

    def load_from_env(self) -> int:
        """Load MSCCL_XML_FILES (or TACCL_XML_FILES); returns how many files were loaded."""
        n = ctypes.c_int(0)
        if self._lib.tacclLoadFromEnv(self._h, ctypes.byref(n)) < 0:
            raise UserError(self._error())
        return n.value

    def swap(self, paths, epoch: int | None = None) -> int:
        """Live reconfiguration: a new program set (files or directories, validated whole) for the calls
        numbered `epoch` on (None: as soon as possible); returns the epoch. Raises UserError, and the current
        set keeps serving, when the set is refused (see tacclSwap in taccl_runtime.h)."""
        paths = [paths] if isinstance(paths, (str, os.PathLike)) else list(paths)
        applied = ctypes.c_int64(-1)
        joined = b":".join(os.fsencode(str(p)) for p in paths)
        if self._lib.tacclSwap(self._h, joined, -1 if epoch is None else int(epoch), ctypes.byref(applied)) != 0:
            raise UserError(self._error())
        return applied.value

    def watch(self, directory, every_ms: int = 100) -> None:
        """Swap in `directory`'s files whenever it changes (a batch rewriting its MSCCL_ALGO_DIR), checked every
        `every_ms` by a thread of the runtime beside the running calls; None stops watching."""
        path = b"" if directory is None else os.fsencode(str(directory))
        if self._lib.tacclWatch(self._h, path, int(every_ms)) != 0:
            raise UserError(self._error())

    def watch_status(self) -> tuple:
        """(sets the watcher swapped in, the last refusal's message or "")."""
        n = ctypes.c_int64(0)
        st = self._lib.tacclWatchStatus(self._h, ctypes.byref(n))
        return n.value, self._error() if st == 1 else ""

    @property
    def next_call(self) -> int:
        """The sequence number the next call takes (the epochs of `swap`)."""
        return self._lib.tacclNextCall(self._h)

    def info(self, index: int) -> ProgramInfo:
        i = _ProgramInfo()
        if self._lib.tacclGetProgramInfo(self._h, index, ctypes.byref(i)) != 0:
            raise UserError(f"no program with index {index}")
        # the path in the file system's encoding (any bytes), the name as text (the XML may hold any bytes)
        return ProgramInfo(os.fsdecode(i.path), i.name.decode(errors="replace"), COLLS[i.coll],
                           ["Simple", "LL", "LL128"][i.proto],
                           i.ngpus, i.nchannels, i.nchunksperloop, bool(i.inplace), bool(i.outofplace),
                           i.minBytes, i.maxBytes, i.maxThreadBlocks, i.receives, i.directReceives)

    def select(self, coll: str, nranks: int, count: int, dtype: str, inplace: bool) -> int:
        idx = ctypes.c_int(-1)
        self._lib.tacclSelect(self._h, COLLS.index(coll), nranks, count, DTYPES.index(dtype), int(inplace),
                              ctypes.byref(idx))
        return idx.value

    def run_raw(self, coll: str, dtype: str, op: str, inputs: list, *, inplace: bool = False, program: int = -1,
                root: int = 0) -> RunOutcome:
        """Run one collective on host numpy inputs (one 1-D array per rank, numpy storage of `dtype`).

        Buffers are laid out as NCCL's in-place convention requires (msccl-xml.md 1.8), so in-place runs
        really alias input and output."""
        R = len(inputs)
        mult = R if coll in RANK_MULTIPLIED else 1
        in_n = inputs[0].size
        count = in_n if coll == "allgather" else in_n // mult
        out_n = count if coll == "reducescatter" else count * mult
        npt = _NP[dtype]
        bufs, send, recv = [], [], []
        for r, x in enumerate(inputs):
            x = np.ascontiguousarray(x, dtype=npt)
            if inplace:
                big = np.zeros(max(in_n, out_n), dtype=npt)
                if coll == "allgather":
                    big[r * count:(r + 1) * count] = x
                    s, o = big[r * count:], big
                elif coll == "reducescatter":
                    big[:in_n] = x
                    s, o = big, big[r * count:]
                else:
                    big[:in_n] = x
                    s, o = big, big
                bufs.append(big)
            else:
                s = x.copy()
                o = np.zeros(out_n, dtype=npt)
                bufs.append((s, o))
            send.append(s.ctypes.data)
            recv.append(o.ctypes.data)
        sarr = (ctypes.c_void_p * R)(*send)
        rarr = (ctypes.c_void_p * R)(*recv)
        res = _RunResult()
        st = self._lib.tacclRunHostBuffers(self._h, program, COLLS.index(coll), DTYPES.index(dtype), OPS.index(op), R,
                                           count, sarr, rarr, root, ctypes.byref(res))
        if st != 0:
            raise UserError(self._error())
        status = ["done", "no_match", "deadlock", "failed"][res.outcome]
        outputs = []
        for r in range(R):
            if inplace:
                big = bufs[r]
                start = r * count if coll == "reducescatter" else 0
                outputs.append(big[start:start + out_n].copy())
            else:
                outputs.append(bufs[r][1].copy())
        return RunOutcome(status, self._error() if status != "done" else "", res.elapsedUs, res.tiles, res.program,
                          outputs, res.call, res.generation)


# ---- reference semantics (independent of every program) -------------------------------------------------

def _bf16_to_f32(u16):
    return (u16.astype(np.uint32) << 16).view(np.float32)


def _f32_to_bf16(f):
    x = np.asarray(f, dtype=np.float32).view(np.uint32).astype(np.uint64)
    nan = (x & 0x7FFFFFFF) > 0x7F800000
    rounded = ((x + 0x7FFF + ((x >> 16) & 1)) >> 16).astype(np.uint16)
    return np.where(nan, ((x >> 16) | 0x40).astype(np.uint16), rounded)


def _combine(dtype, op, a, b):
    if dtype == "bfloat16":
        fa, fb = _bf16_to_f32(a), _bf16_to_f32(b)
        if op == "min":
            return np.where(fb < fa, b, a)
        if op == "max":
            return np.where(fa < fb, b, a)
        return _f32_to_bf16(fa + fb if op == "sum" else fa * fb)
    if dtype == "float16":
        fa, fb = a.astype(np.float32), b.astype(np.float32)
        if op in ("min", "max"):
            return np.minimum(a, b) if op == "min" else np.maximum(a, b)
        return (fa + fb if op == "sum" else fa * fb).astype(np.float16)
    with np.errstate(over="ignore"):
        if op == "sum":
            return (a + b).astype(a.dtype)
        if op == "prod":
            return (a * b).astype(a.dtype)
        return np.minimum(a, b) if op == "min" else np.maximum(a, b)


def reference(coll: str, dtype: str, op: str, inputs: list, root: int = 0) -> list:
    """Expected outputs of each rank (None where the collective defines none, e.g. reduce off the root)."""
    R = len(inputs)
    if coll == "allgather":
        full = np.concatenate(inputs)
        return [full.copy() for _ in range(R)]
    if coll == "alltoall":
        count = inputs[0].size // R
        return [np.concatenate([inputs[q][r * count:(r + 1) * count] for q in range(R)]) for r in range(R)]
    if coll == "broadcast":
        return [inputs[root].copy() for _ in range(R)]
    acc = inputs[0].copy()
    for q in range(1, R):
        acc = _combine(dtype, op, acc, inputs[q])
    if coll == "allreduce":
        return [acc.copy() for _ in range(R)]
    if coll == "reduce":
        return [acc.copy() if r == root else None for r in range(R)]
    count = acc.size // R
    return [acc[r * count:(r + 1) * count].copy() for r in range(R)]


def make_inputs(coll: str, dtype: str, op: str, nranks: int, count: int, seed: int = 0) -> list:
    """Random inputs whose reductions are exact in every type and every order: full-range integers (wrap
    around is associative), and for floats small integers (sum), +-1/+-2 (prod) or arbitrary values
    (min/max), so an exact comparison is a fair check whatever order a program reduces in."""
    rng = np.random.default_rng(seed)
    n = count if coll == "allgather" else count * (nranks if coll in RANK_MULTIPLIED else 1)
    out = []
    for _ in range(nranks):
        if dtype in ("float16", "bfloat16", "float32", "float64"):
            if op == "sum":
                v = rng.integers(-8, 9, n).astype(np.float64)
            elif op == "prod":
                v = rng.choice(np.array([-2.0, -1.0, 1.0, 2.0]), n)
            else:
                v = rng.standard_normal(n) * 100
            if dtype == "bfloat16":
                out.append(_f32_to_bf16(v.astype(np.float32)))
            else:
                out.append(v.astype(_NP[dtype]))
        else:
            info = np.iinfo(_NP[dtype])
            out.append(rng.integers(info.min, info.max, n, dtype=_NP[dtype], endpoint=True))
    return out


def count_for_size(coll: str, nranks: int, size: int, dtype: str, nchunks: int) -> int:
    """NCCL count for a `size` in bytes of the larger buffer; UserError when the program cannot take it."""
    tsize = np.dtype(_NP[dtype]).itemsize
    mult = nranks if coll in RANK_MULTIPLIED else 1
    if size <= 0 or size % tsize:
        raise UserError(f"size {size} is not a positive multiple of the {dtype} size ({tsize} bytes)")
    n = size // tsize
    unit = int(np.lcm(nchunks, mult))
    if n % unit:
        lo = (n // unit) * unit * tsize
        hi = lo + unit * tsize
        raise UserError(f"{size} bytes ({n} elements) are not divisible by nchunksperloop={nchunks}"
                        + (f" and ranks={mult}" if mult > 1 else "")
                        + (f"; nearest sizes that fit: {lo} or {hi} bytes" if lo else
                           f"; the smallest size that fits: {hi} bytes"))
    return n // mult


def run_program(path, *, ranks: int | None = None, size: int = 1 << 20, dtype: str = "float32", op: str = "sum",
                inplace: bool | None = None, check: bool = True, backend: str = "host", seed: int = 0,
                timeout_ms: int | None = None, tile_bytes: int | None = None, root: int = 0,
                analysis: bool = True) -> dict:
    """Load one XML file, run it once on random data and (optionally) compare with the reference.

    Returns a report dict. Raises UserError for a bad file or call, CheckFailed for a deadlock or a wrong
    result."""
    if dtype not in DTYPES:
        raise UserError(f"unknown dtype {dtype!r}; one of {', '.join(DTYPES)}")
    if op not in OPS:
        raise UserError(f"unknown op {op!r}; one of {', '.join(OPS)}")
    with Runtime(backend=backend, timeout_ms=timeout_ms, tile_bytes=tile_bytes, analysis=analysis) as rt:
        idx = rt.load(path)
        info = rt.info(idx)
        if ranks is not None and ranks != info.ngpus:
            raise UserError(f"the program is written for {info.ngpus} ranks, not {ranks}", path=str(path))
        if root and info.coll not in ROOTED:
            raise UserError(f"root {root} given, but {info.coll} has no root (broadcast, reduce, gather and "
                            f"scatter do)", path=str(path))
        R = info.ngpus
        if inplace is None:
            inplace = not info.outofplace
        if inplace and not info.inplace:
            raise UserError("the program is not for in-place calls (inplace=\"0\")", path=str(path))
        if not inplace and not info.outofplace:
            raise UserError("the program is only for in-place calls; pass --inplace", path=str(path))
        count = count_for_size(info.coll, R, size, dtype, info.nchunksperloop)
        _check_run_memory(R, size, path)
        try:  # the machine may have less free than it has (other processes, a ulimit)
            inputs = make_inputs(info.coll, dtype, op, R, count, seed)
            out = rt.run_raw(info.coll, dtype, op, inputs, inplace=inplace, program=idx, root=root)
            ref = reference(info.coll, dtype, op, inputs, root) if check and out.status == "done" else None
        except MemoryError:
            raise UserError(f"not enough memory for the buffers of a run of {size:,} bytes on {R} ranks (about "
                            f"{RUN_BUFFERS_PER_RANK * R * size:,} bytes): use a smaller --size", path=str(path)) from None
        report = {"file": str(path), "coll": info.coll, "proto": info.proto, "ranks": R, "bytes": size,
                  "count": count, "dtype": dtype, "op": op, "inplace": bool(inplace), "backend": backend,
                  "status": out.status, "elapsed_us": out.elapsed_us, "tiles": out.tiles, "checked": False,
                  "wrong": None}
        if out.status == "deadlock":
            raise CheckFailed(out.message)
        if out.status != "done":  # the runtime's message may name the file already
            raise UserError(out.message, path=None if out.message.startswith(str(path)) else str(path))
        if check:
            wrong, first = count_wrong(out.outputs, ref, dtype)
            report["checked"] = True
            report["wrong"] = wrong
            if wrong:
                raise CheckFailed(f"{path}: {wrong} wrong elements; first: {first}")
        return report


# a run holds every rank's input, output and scratch and the reference result: about this many buffers of the
# larger size per rank
RUN_BUFFERS_PER_RANK = 4


def _check_run_memory(ranks: int, size: int, path) -> None:
    """Refuse, before allocating, a run whose buffers would not fit in this machine's memory."""
    from .budget import gib, machine_memory_bytes

    limit = machine_memory_bytes()
    need = RUN_BUFFERS_PER_RANK * ranks * size
    if limit is not None and need > limit:
        raise UserError(f"a run of {size:,} bytes on {ranks} ranks holds about {gib(need)} of buffers, more than "
                        f"the {gib(limit)} of this machine's memory: use a smaller --size", path=str(path))


def count_wrong(outputs: list, ref: list, dtype: str) -> tuple:
    """(elements that differ from the reference, the first as "rank R element K: got X, expected Y" or
    None); ranks whose reference is None (no defined output) are skipped."""
    wrong, first = 0, None
    for r, (got, want) in enumerate(zip(outputs, ref)):
        if want is None:
            continue
        bad = np.flatnonzero(~_equal(got, want, dtype))
        if bad.size and first is None:
            k = int(bad[0])
            first = f"rank {r} element {k}: got {got[k].item()!r}, expected {want[k].item()!r}"
        wrong += int(bad.size)
    return wrong, first


def _equal(a, b, dtype):
    if dtype == "bfloat16":
        return _bf16_to_f32(a) == _bf16_to_f32(b)
    return a == b
