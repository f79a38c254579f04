"""Collectives as chunk-level pre- and postconditions, with the buffer layout the lowering needs.

A collective on `num_ranks` ranks with chunk-up `k` has `num_chunks` chunks. The precondition says which
rank holds which chunk at the start, the postcondition where each chunk must be at the end. A *combining*
collective (ReduceScatter, AllReduce, Reduce) starts with one contribution of every chunk on every rank and
ends with the sum of all contributions at the postcondition ranks.

Chunk identities carry ranks (`label`), so a permutation of ranks (a symmetry of the topology) maps chunks
to chunks (`permute_chunk`); that is how the synthesizer builds symmetry orbits.

Buffer layout (chunk indices inside the MSCCL input/output buffers, see msccl-xml.md section 1.8) follows
the MSCCL conventions: AllGather rank r's input index i is chunk r*k+i, which is output index r*k+i; AllToAll
chunk (s, d, i) is input index d*k+i on s and output index s*k+i on d; ReduceScatter/AllReduce chunk c is
input index c on every rank and output index c (AllReduce) or c - r*k (ReduceScatter, on owner r).

A *one-shot* AllReduce (``form="one-shot"``) reduces every rank's whole buffer towards every rank: chunk
r*k+i is piece i of the buffer, summed at rank r (input index i on every rank, output index i on r), so the
buffers hold k chunks and a chunk is routed like a ReduceScatter's, with no sum sent back.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from .errors import UserError
from .fileio import is_count, load_json

NAMES = ("allgather", "alltoall", "reducescatter", "allreduce", "broadcast", "reduce", "gather", "scatter")
ALIASES = {"reduce_scatter": "reducescatter", "all_gather": "allgather", "all_reduce": "allreduce",
           "all_to_all": "alltoall", "ag": "allgather", "rs": "reducescatter", "ar": "allreduce", "a2a": "alltoall"}
# XML `coll` attribute per collective (executor dialect).
XML_NAMES = {"allgather": "allgather", "alltoall": "alltoall", "reducescatter": "reducescatter", "allreduce": "allreduce",
             "broadcast": "broadcast", "reduce": "reduce", "gather": "gather", "scatter": "scatter", "custom": "custom"}


@dataclass
class Collective:
    name: str
    num_ranks: int
    chunkup: int
    num_chunks: int
    precondition: frozenset  # {(chunk, rank)}
    postcondition: frozenset  # {(chunk, rank)}
    combining: bool = False
    root: int | None = None
    form: str = ""  # "one-shot": an AllReduce whose every rank sums the whole buffer itself; "exchange": a
    # phase's AllReduce between pairs of ranks that swap their partial sums (`taccl.phases`)
    labels: list = field(default_factory=list)  # chunk -> tuple identity over ranks
    input_index: dict = field(default_factory=dict)  # (chunk, rank) -> index in that rank's input buffer
    output_index: dict = field(default_factory=dict)  # (chunk, rank) -> index in that rank's output buffer
    input_chunks: int = 0  # chunks per input buffer (i_chunks)
    output_chunks: int = 0  # chunks per output buffer (o_chunks)
    # The rank positions inside each label, used to apply rank permutations.
    label_rank_slots: tuple = ()
    # AllReduce: the buffer holds the chunks of ranks r, r + local_blocks, r + 2 local_blocks, ... side by side
    # (`make_collective`); 0: in rank order
    local_blocks: int = 0

    def __post_init__(self):
        self._by_label = {lab: c for c, lab in enumerate(self.labels)}
        self._sources = None  # chunk -> sorted ranks holding it at the start, built on first use

    @property
    def xml_name(self) -> str:
        return XML_NAMES.get(self.name, "custom")

    def sources(self, chunk: int) -> list:
        if self._sources is None:  # one pass over the precondition, not one per chunk (128 GPUs: 33k chunks)
            by_chunk = {}
            for c, r in self.precondition:
                by_chunk.setdefault(c, []).append(r)
            self._sources = {c: sorted(rs) for c, rs in by_chunk.items()}
        return list(self._sources.get(chunk, ()))

    def permute_chunk(self, chunk: int, perm) -> int | None:
        """The chunk whose label is this chunk's label with ranks mapped by `perm`, or None."""
        lab = list(self.labels[chunk])
        for slot in self.label_rank_slots:
            lab[slot] = perm[lab[slot]]
        return self._by_label.get(tuple(lab))

    def nbytes_per_chunk(self, buffer_bytes: int) -> float:
        """Chunk size for a given input_size: the size of the largest buffer divided by its chunk count."""
        return buffer_bytes / self.buffer_chunks

    @property
    def buffer_chunks(self) -> int:
        """Chunk count of the buffer whose size `input_size` names (MSCCL: the largest buffer)."""
        return max(self.input_chunks, self.output_chunks)

    def dual(self) -> "Collective":
        """The non-combining collective whose routing a combining one is built from."""
        if self.name in ("reducescatter", "allreduce"):
            return make_collective("allgather", self.num_ranks, self.chunkup)
        if self.name == "reduce":
            return make_collective("broadcast", self.num_ranks, self.chunkup, root=self.root)
        return self


FORMS = {"allreduce": ("reduce-broadcast", "one-shot")}


# Contributions to a copy of a chunk, as the proofs track them: (origin ranks summed into it, those summed
# more than once), both bit masks over ranks (a Counter per copy made 1024-rank proofs take minutes)
def contribution(rank: int) -> tuple:
    return (1 << rank, 0)


def add_contributions(a: tuple, b: tuple) -> tuple:
    return (a[0] | b[0], a[1] | b[1] | (a[0] & b[0]))


def mask_of(ranks) -> int:
    """The mask of these ranks (a full sum's `summed` part: every contributor once)."""
    return sum(1 << r for r in ranks)


def ranks_in(mask: int) -> list:
    return [r for r in range(mask.bit_length()) if mask >> r & 1]


def canonical_name(name: str) -> str:
    """A collective's name in lower case with its aliases resolved ("AR" -> "allreduce"); not checked."""
    return ALIASES.get(str(name).lower(), str(name).lower())


def check_known(name: str, *, path: str | None = None, where: str | None = None) -> str:
    """The canonical name of a built-in collective; `UserError` (naming `path` and `where`) otherwise."""
    canon = canonical_name(name)
    if canon not in NAMES:
        raise UserError(f"unknown collective {name!r}; known: {', '.join(NAMES)} (or a JSON file with a custom one)",
                        path=path, where=where)
    return canon


def make_collective(name: str, num_ranks: int, chunkup: int = 1, *, root: int = 0, form: str = "",
                    local_blocks: int = 0) -> Collective:
    """A built-in collective. `local_blocks` (an AllReduce's, reduced and broadcast: any rank may sum any
    piece of its buffer) lays the buffer out by owner rank modulo `local_blocks` (the GPUs per node):
    the pieces that one GPU of every node sums in a node phase (`taccl.phases`) are then one contiguous
    block, so the transfers of a node phase between two GPUs can be sent as a few steps of many chunks
    instead of one step per chunk (`taccl.contiguity.coalesce`)."""
    name = check_known(name)
    if form and form not in FORMS.get(name, ()):
        raise UserError(f"a {name} has no form {form!r}" + (f"; known: {', '.join(FORMS[name])}" if name in FORMS else ""))
    form = "" if form == "reduce-broadcast" else form
    if num_ranks < 2:
        raise UserError(f"a collective needs at least 2 ranks, got {num_ranks}")
    if chunkup < 1:
        raise UserError(f"chunk-up must be at least 1, got {chunkup}")
    if name in ("broadcast", "reduce", "gather", "scatter") and not 0 <= root < num_ranks:
        raise UserError(f"root {root} is not a rank of this {num_ranks}-rank collective")
    R, k = num_ranks, chunkup
    pre, post, labels, inp, out = set(), set(), [], {}, {}
    combining, slots, ic, oc, rt = False, (0,), 0, 0, None
    if name in ("allgather", "reducescatter", "allreduce"):
        # chunk r*k+i: AllGather's piece i of rank r; for RS/AR the piece of the buffer owned by rank r.
        for r in range(R):
            for i in range(k):
                c = r * k + i
                labels.append((r, i))
                if name == "allgather":
                    pre.add((c, r)); inp[(c, r)] = i
                    for d in range(R):
                        post.add((c, d)); out[(c, d)] = c
                elif form == "one-shot":  # piece i of the buffer, summed at rank r
                    for s in range(R):
                        pre.add((c, s)); inp[(c, s)] = i
                    post.add((c, r)); out[(c, r)] = i
                else:
                    for s in range(R):
                        pre.add((c, s)); inp[(c, s)] = c
                    for d in (range(R) if name == "allreduce" else [r]):
                        post.add((c, d)); out[(c, d)] = c if name == "allreduce" else i
        combining = name != "allgather"
        if form == "one-shot":
            ic, oc = k, k
        else:
            ic, oc = (k, R * k) if name == "allgather" else (R * k, k if name == "reducescatter" else R * k)
    elif name == "alltoall":
        for s in range(R):
            for d in range(R):
                for i in range(k):
                    c = (s * R + d) * k + i
                    labels.append((s, d, i))
                    pre.add((c, s)); inp[(c, s)] = d * k + i
                    post.add((c, d)); out[(c, d)] = s * k + i
        slots, ic, oc = (0, 1), R * k, R * k
    elif name in ("broadcast", "reduce"):
        rt = root
        for i in range(k):
            labels.append((root, i))
            if name == "broadcast":
                pre.add((i, root)); inp[(i, root)] = i
                for d in range(R):
                    post.add((i, d)); out[(i, d)] = i
            else:
                for s in range(R):
                    pre.add((i, s)); inp[(i, s)] = i
                post.add((i, root)); out[(i, root)] = i
        combining, ic, oc = name == "reduce", k, k
    elif name == "gather":
        rt = root
        for s in range(R):
            for i in range(k):
                c = s * k + i
                labels.append((s, i, root))
                pre.add((c, s)); inp[(c, s)] = i
                post.add((c, root)); out[(c, root)] = c
        slots, ic, oc = (0, 2), k, R * k
    elif name == "scatter":
        rt = root
        for d in range(R):
            for i in range(k):
                c = d * k + i
                labels.append((d, i, root))
                pre.add((c, root)); inp[(c, root)] = c
                post.add((c, d)); out[(c, d)] = i
        slots, ic, oc = (0, 2), R * k, k
    if local_blocks:
        if name != "allreduce" or form or local_blocks < 2 or R % local_blocks:
            raise UserError(f"local_blocks {local_blocks} applies to an AllReduce (reduce-broadcast) whose "
                            f"{R} ranks it divides, not a {form + ' ' if form else ''}{name}")
        per = R // local_blocks
        # piece i of rank r = node * local_blocks + local goes to block `local`, place `node`
        position = [((r % local_blocks) * per + r // local_blocks) * k + i for r in range(R) for i in range(k)]
        inp = {key: position[key[0]] for key in inp}
        out = {key: position[key[0]] for key in out}
    return Collective(name=name, num_ranks=R, chunkup=k, num_chunks=len(labels), precondition=frozenset(pre),
                      postcondition=frozenset(post), combining=combining, root=rt, form=form, labels=labels,
                      input_index=inp, output_index=out, input_chunks=ic, output_chunks=oc, label_rank_slots=slots,
                      local_blocks=local_blocks)


MAX_CUSTOM_CHUNKS = 1 << 20  # the largest nchunksperloop runtime/src/program.cc reads (a custom program's = its chunks)


def load_custom_collective(path, num_ranks: int) -> Collective:
    """A user-defined non-combining collective from JSON.

    Format: {"name": "...", "num_ranks": R, "chunks": C,
             "precondition": [[chunk, rank], ...], "postcondition": [[chunk, rank], ...]}
    Each chunk sits at input index = its position among its rank's precondition chunks and output index = chunk.
    """
    doc = load_json(path)
    p = str(path)
    if not isinstance(doc, dict):
        raise UserError("expected a JSON object", path=p, where="$")
    for key in ("chunks", "precondition", "postcondition"):
        if key not in doc:
            raise UserError(f"missing required key {key!r}", path=p, where="$")
    R = doc.get("num_ranks", num_ranks)
    if not is_count(R):
        raise UserError(f"expected the number of ranks (an integer), got {R!r}", path=p, where="$.num_ranks")
    if R != num_ranks:
        raise UserError(f"collective is for {R} ranks but the topology has {num_ranks}", path=p, where="$.num_ranks")
    C = doc["chunks"]
    if not is_count(C, 1, MAX_CUSTOM_CHUNKS):
        raise UserError(f"expected a whole number of chunks from 1 to {MAX_CUSTOM_CHUNKS} (a custom program's "
                        f"nchunksperloop is its chunk count; taccl's runtime reads up to that), got {C!r}", path=p,
                        where="$.chunks")
    conds = {}
    for key in ("precondition", "postcondition"):
        pairs = set()
        if not isinstance(doc[key], list):
            raise UserError(f"expected a list of [chunk, rank] pairs, got {doc[key]!r}", path=p, where=f"$.{key}")
        for i, pr in enumerate(doc[key]):
            if not (isinstance(pr, list) and len(pr) == 2 and all(isinstance(x, int) for x in pr)):
                raise UserError("expected [chunk, rank]", path=p, where=f"$.{key}[{i}]")
            c, r = pr
            if not 0 <= c < C:
                raise UserError(f"chunk {c} outside 0..{C - 1}", path=p, where=f"$.{key}[{i}]")
            if not 0 <= r < R:
                raise UserError(f"rank {r} outside 0..{R - 1}", path=p, where=f"$.{key}[{i}]")
            pairs.add((c, r))
        conds[key] = frozenset(pairs)
    starts = {c for c, _ in conds["precondition"]}
    for c in sorted({c for c, _ in conds["postcondition"]} - starts)[:1]:
        needed = sorted(r for cc, r in conds["postcondition"] if cc == c)
        raise UserError(f"chunk {c} is needed on ranks {needed} but starts nowhere", path=p, where="$.precondition")
    if conds["postcondition"] <= conds["precondition"]:
        raise UserError("nothing moves between ranks: every [chunk, rank] of the postcondition is in the precondition "
                        "already (expected at least one chunk wanted on a rank it does not start on)", path=p,
                        where="$.postcondition")
    name = doc.get("name", "custom")
    # the checker and the runtimes read a built-in name as that collective, not as these conditions
    if not isinstance(name, str) or not name or canonical_name(name) in NAMES:
        raise UserError(f"expected a name of its own, got {name!r} (the built-in collectives' names "
                        f"{', '.join(NAMES)} mean those collectives)", path=p, where="$.name")
    return custom_collective(name, R, C, conds["precondition"], conds["postcondition"])


def custom_collective(name: str, num_ranks: int, chunks: int, precondition, postcondition) -> Collective:
    """A user-defined collective: each chunk's input index on a rank is its place among that rank's
    precondition chunks, its output index the chunk's id. Both buffers hold `chunks` chunks: legacy MSCCL,
    the one runtime that runs a `custom` collective, cuts each into nchunksperloop chunks (i_chunks =
    o_chunks = nchunksperloop), so a rank's input is as large as its output, its first chunks addressed."""
    inp, count = {}, {}
    for c, r in sorted(precondition):
        inp[(c, r)] = count.get(r, 0)
        count[r] = count.get(r, 0) + 1
    return Collective(name=name, num_ranks=num_ranks, chunkup=1, num_chunks=chunks,
                      precondition=frozenset(precondition), postcondition=frozenset(postcondition),
                      labels=[(c,) for c in range(chunks)], input_index=inp,
                      output_index={(c, r): c for c, r in postcondition}, input_chunks=chunks, output_chunks=chunks,
                      label_rank_slots=())
