"""The runtimes an XML program is written for, and what each refuses or reads otherwise.

=================  ==========  ==================================================================================
target             dialect     limits and meanings beyond the dialect's (`../shared/docs/msccl-xml.md`)
=================  ==========  ==================================================================================
msccl-executor     executor    the reference: what `taccl.checker` checks by default
rccl               executor    ROCm's NCCL, which ships the MSCCL executor: since ROCm 6.1 a program with a fused
                               step (rcs, rrs, rrcs, rrc) returns an error at its first call, and a rank may
                               have at most 64 thread blocks
msccl-legacy       legacy      the first MSCCL (`MSCCL_XML_FILES`); the checker's legacy dialect
=================  ==========  ==================================================================================

A program lowered for RCCL sends and receives with plain steps: a received partial sum lands in scratch and a
local reduction (``re``) adds it, where the executor's programs fuse the two (``rrc``), and a relay receives
then sends. `taccl solve / lower / baseline --target rccl` lower so, and `taccl check --target rccl` refuses
what RCCL would.
"""
from __future__ import annotations

from dataclasses import dataclass

from .errors import UserError
from .program import Program, StepType

__all__ = ["Target", "TARGETS", "DEFAULT_TARGET", "get_target", "target_problems"]


@dataclass(frozen=True)
class Target:
    name: str
    dialect: str  # the XML dialect written and read (`taccl.xmlio.DIALECTS`)
    fused_steps: bool = True  # whether the runtime runs rcs, rrs, rrcs and rrc
    max_tbs: int | None = None  # thread blocks a rank may have (None: the dialect's)


# the step types that receive and then reduce, copy or send in one step
FUSED_STEPS = frozenset({StepType.RECV_COPY_SEND, StepType.RECV_REDUCE_SEND, StepType.RECV_REDUCE_COPY_SEND,
                         StepType.RECV_REDUCE_COPY})

TARGETS = {t.name: t for t in (
    Target("msccl-executor", "executor"),
    Target("rccl", "executor", fused_steps=False, max_tbs=64),  # RCCL's MSCCL_MAX_NUM_THREAD_BLOCKS
    Target("msccl-legacy", "legacy"),
)}
DEFAULT_TARGET = "msccl-executor"


def get_target(name: str, *, where: str = "--target") -> Target:
    try:
        return TARGETS[name]
    except KeyError:
        raise UserError(f"unknown target {name!r}; known: {', '.join(TARGETS)}", where=where) from None


def target_problems(program: Program, target: Target) -> list:
    """What `target` refuses in `program` beyond its dialect's rules: [(rank, message)], empty when none."""
    out = []
    for g in program.gpus:
        if target.max_tbs is not None and len(g.threadblocks) > target.max_tbs:
            out.append((g.id, f"{len(g.threadblocks)} thread blocks, {target.name} allows {target.max_tbs} a rank"))
        if not target.fused_steps:
            fused = sorted({str(st.type) for tb in g.threadblocks for st in tb.steps
                            if StepType(st.type) in FUSED_STEPS})
            if fused:
                out.append((g.id, f"fused step(s) {', '.join(fused)}, which {target.name} refuses at the first "
                                  f"call (lower with --target {target.name})"))
    return out
