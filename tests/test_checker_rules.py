"""Checker: every rule has a failing example (small programs built in Python, then mutated)."""
import copy

import pytest

from taccl.checker import RULES, check_program
from taccl.program import Buf, Gpu, Program, Proto, Step, StepType, Threadblock, nop_step

S, R, RCS, RRC, CPY, NOP = (StepType.SEND, StepType.RECV, StepType.RECV_COPY_SEND, StepType.RECV_REDUCE_COPY,
                            StepType.COPY, StepType.NOP)
I, O = Buf.INPUT, Buf.OUTPUT


def st(s, t, sb=I, so=-1, db=O, do=-1, cnt=1, depid=-1, deps=-1, hasdep=False):
    return Step(s=s, type=t, srcbuf=sb, srcoff=so, dstbuf=db, dstoff=do, cnt=cnt, depid=depid, deps=deps,
                hasdep=hasdep)


def ring_allgather(n=4, proto=Proto.SIMPLE) -> Program:
    """Out-of-place ring AllGather: copy own chunk to the output, send it, forward n-2 chunks, receive the last."""
    gpus = []
    for r in range(n):
        steps = [st(0, CPY, I, 0, O, r), st(1, S, O, r, O, r)]
        for k in range(1, n - 1):
            c = (r - k) % n
            steps.append(st(len(steps), RCS, O, c, O, c))
        c = (r - (n - 1)) % n
        steps.append(st(len(steps), R, O, c, O, c))
        gpus.append(Gpu(id=r, i_chunks=1, o_chunks=n, threadblocks=[
            Threadblock(id=0, send=(r + 1) % n, recv=(r - 1) % n, chan=0, steps=steps)]))
    return Program(name="ring", collective="allgather", proto=proto, nchannels=1, nchunksperloop=n, ngpus=n,
                   gpus=gpus)


def found(report, rule, severity="error"):
    return [f for f in report.findings if f.rule == rule and f.severity == severity]


def assert_only(report, rule, severity="error"):
    hits = found(report, rule, severity)
    assert hits, f"expected [{rule}] {severity}, got: " + "\n".join(map(str, report.findings))
    return hits[0]


def test_base_program_is_proven():
    rep = check_program(ring_allgather())
    assert rep.ok and rep.proven and rep.modes == ["outofplace"], [str(f) for f in rep.findings]
    assert rep.rules() == {"deadlock-rendezvous"}  # every rank sends first: fine with FIFOs only


def mutate(fn, **kw):
    p = ring_allgather(**kw)
    fn(p)
    return p


def tb0(p, r=0):
    return p.gpus[r].threadblocks[0]


CASES = {
    "algo.ranks": (lambda p: p.gpus.pop(2), "no <gpu> for rank(s) 2"),
    "algo.nchannels": (lambda p: setattr(p, "nchannels", 33), "nchannels=33"),
    "algo.nchunksperloop": (lambda p: setattr(p, "nchunksperloop", 6), "multiple of ngpus"),
    "algo.window": (lambda p: (setattr(p, "min_bytes", 10), setattr(p, "max_bytes", 5)), "size window"),
    "algo.collective": (lambda p: setattr(p, "collective", "allgatherv"), "not known to the executor runtime"),
    "gpu.chunks": (lambda p: setattr(p.gpus[1], "i_chunks", 2), "i_chunks=2"),
    "tb.id": (lambda p: setattr(tb0(p, 1), "id", 1), "ids must be 0..0"),
    # an id of 10^11 once made the checker list every id below it (out of memory; a fuzz found it)
    "tb.id.huge": (lambda p: setattr(tb0(p, 1), "id", 10 ** 11), "ids must be 0..0; missing [0]"),
    "tb.peer": (lambda p: setattr(tb0(p, 1), "send", 1), "is the rank itself"),
    "tb.chan": (lambda p: setattr(tb0(p, 1), "chan", 1), "chan=1 must be in 0..nchannels-1=0"),
    "tb.connection": (lambda p: p.gpus[1].threadblocks.append(Threadblock(id=1, send=2, recv=-1, chan=0, steps=[
        st(0, S, I, 0, I, 0)])), "one connection"),
    "step.index": (lambda p: setattr(tb0(p, 1).steps[2], "s", 5), "s=5 but this is step 2"),
    "step.cnt": (lambda p: setattr(tb0(p, 1).steps[0], "cnt", 72), "cnt=72"),
    "step.offset": (lambda p: setattr(tb0(p, 1).steps[1], "srcoff", 4), "o has 4 chunk(s)"),
    "limit.offset": (lambda p: setattr(tb0(p, 1).steps[1], "dstoff", 40000), "exceeds 32767"),
    "step.peer": (lambda p: setattr(tb0(p, 1), "send", -1), "sends but the tb has send=-1"),
    "dep.pair": (lambda p: setattr(tb0(p, 1).steps[1], "depid", 0), "both -1 or both >= 0"),
    "match.count": (lambda p: tb0(p, 1).steps.append(st(4, S, O, 0, O, 0)), "has no matching receive"),
    "match.cnt": (lambda p: (setattr(tb0(p, 1).steps[1], "cnt", 2), setattr(tb0(p, 1).steps[1], "srcoff", 0)),
                  "has cnt=1 but its matching send"),
    "match.peer": (lambda p: setattr(tb0(p, 2), "recv", -1) or setattr(tb0(p, 2), "steps", [
        st(i, S, O, 0, O, 0) for i in range(3)]), "has no tb receiving from rank 1"),
    "limit.steps": (lambda p: tb0(p, 0).steps.extend(st(i, CPY, I, 0, O, 0) for i in range(4, 70)),
                    "more than MSCCL_MAX_NUM_STEPS=64"),
}


@pytest.mark.parametrize("rule", sorted(CASES))
def test_rule_violation_is_reported(rule):
    fn, text = CASES[rule]
    rep = check_program(mutate(fn))
    f = assert_only(rep, rule.removesuffix(".huge"))
    assert text in f.message, str(f)
    assert not rep.ok and not rep.proven


def test_located_findings_carry_rank_tb_step():
    p = ring_allgather()
    tb0(p, 1).steps[2].s = 7
    f = assert_only(check_program(p), "step.index")
    assert (f.rank, f.tb, f.step) == (1, 0, 2)


def local_dep_program():
    """Rank 0 receives chunk 1 on tb 0 (step 4), and tb 1 (local) copies it to the scratch after a dependency."""
    p = ring_allgather()
    tb0(p, 0).steps[-1].hasdep = True
    p.gpus[0].s_chunks = 1
    p.gpus[0].threadblocks.append(Threadblock(id=1, steps=[st(0, CPY, O, 1, Buf.SCRATCH, 0, depid=0, deps=4)]))
    return p


def test_dependency_program_is_proven():
    rep = check_program(local_dep_program())
    assert rep.ok and rep.proven, [str(f) for f in rep.findings]


DEP_CASES = {
    "dep.target": (lambda t: setattr(t.steps[0], "depid", 5), "has no such thread block"),
    "dep.hasdep": (lambda t: None, "never publishes"),
    "limit.depid": (lambda t: setattr(t.steps[0], "depid", 200), "exceeds 127"),
    "dep.self": (lambda t: (setattr(t.steps[0], "depid", 1), setattr(t.steps[0], "deps", 0)), "own tb"),
}


@pytest.mark.parametrize("rule", sorted(DEP_CASES))
def test_dependency_rules(rule):
    p = local_dep_program()
    if rule == "dep.hasdep":
        tb0(p, 0).steps[-1].hasdep = False
    DEP_CASES[rule][0](p.gpus[0].threadblocks[1])
    f = assert_only(check_program(p), rule)
    assert DEP_CASES[rule][1] in f.message and (f.rank, f.tb, f.step) == (0, 1, 0)


def test_dependency_deps_out_of_range():
    p = local_dep_program()
    p.gpus[0].threadblocks[1].steps[0].deps = 9
    assert "has only 5 step(s)" in assert_only(check_program(p), "dep.target").message


def test_a_dependency_on_an_earlier_step_of_its_own_tb_needs_hasdep_too():
    # the runtime waits for the flag, which a step with hasdep=0 never publishes (the check skipped own-tb ones)
    p = local_dep_program()
    t = p.gpus[0].threadblocks[1]
    p.gpus[0].s_chunks = 2
    t.steps.append(st(1, CPY, Buf.SCRATCH, 0, Buf.SCRATCH, 1, depid=1, deps=0))
    assert "tb 1 step 0, which has hasdep=0" in assert_only(check_program(p), "dep.hasdep").message
    t.steps[0].hasdep = True
    assert check_program(p).ok


def test_a_cycle_of_dependencies_alone_is_named_as_such():
    # it was reported as a deadlock "with Simple FIFOs", which play no part in it
    p = local_dep_program()
    t0, t1 = tb0(p, 0), p.gpus[0].threadblocks[1]
    t1.steps[0].hasdep = True
    t0.steps[-1].depid, t0.steps[-1].deps = 1, 0
    f = assert_only(check_program(p), "deadlock")
    assert f.message.startswith("dependency cycle of 2 thread block(s): rank 0 tb 0 step 4"), f.message


def test_nop_rules():
    p = local_dep_program()
    t = p.gpus[0].threadblocks[1]
    t.steps.insert(0, nop_step(0, 0, 1))
    t.steps[1].s = 1
    tb0(p, 0).steps[1].hasdep = True
    assert check_program(p).ok
    t.steps[1].depid, t.steps[1].deps = -1, -1
    assert "must be carried by the real step" in assert_only(check_program(p), "dep.nop").message
    t.steps[0].depid = t.steps[0].deps = -1
    assert "nop without a dependency" in assert_only(check_program(p), "dep.nop").message
    p = local_dep_program()
    p.gpus[0].threadblocks[1].steps.append(nop_step(1, 0, 4))
    assert "no real step after them" in assert_only(check_program(p), "dep.nop").message
    p.gpus[0].threadblocks[1].steps[1].hasdep = True
    assert any("publishes nothing" in f.message for f in found(check_program(p), "dep.nop"))


def test_nop_target_is_rejected():
    p = local_dep_program()
    p.gpus[0].threadblocks.append(Threadblock(id=2, steps=[nop_step(0, 0, 4), st(1, CPY, O, 2, O, 2, depid=0,
                                                                               deps=3)]))
    p.gpus[0].threadblocks[1].steps[0].deps = 0
    p.gpus[0].threadblocks[1].steps[0].depid = 2
    assert "a nop" in assert_only(check_program(p), "dep.target").message


def test_selectable_and_legacy_rules():
    p = ring_allgather()
    p.inplace = p.outofplace = False
    assert_only(check_program(p), "algo.selectable")  # the runtime refuses it too
    p.inplace = p.outofplace = True
    assert "not both" in assert_only(check_program(p, dialect="legacy"), "algo.selectable").message
    p.inplace, p.outofplace = False, True
    p.collective = "gather"
    assert_only(check_program(p, dialect="legacy"), "algo.collective")


def test_limits_with_overrides():
    p = ring_allgather()
    assert_only(check_program(p, max_threadblocks=0), "limit.threadblocks")
    assert_only(check_program(p, sm_count=0), "limit.coresidency", "warning")
    assert check_program(p, max_steps=3).rules("error") == {"limit.steps"}


def test_node_and_channel_limits():
    p = ring_allgather(n=2)
    g = p.gpus[0]
    g.s_chunks = 1
    for k in range(1, 70):
        g.threadblocks.append(Threadblock(id=k, steps=[st(i, CPY, I, 0, Buf.SCRATCH, 0) for i in range(60)]))
    rep = check_program(p, rendezvous=False)
    assert "MAX_NODES=4096" in assert_only(rep, "limit.nodes").message
    # a runtime built with a larger MAX_NODES loads it
    assert "limit.nodes" not in check_program(p, rendezvous=False, max_nodes=5000).rules("error")
    p = ring_allgather(n=2)
    p.ngpus = 35
    p.gpus[0].threadblocks = [Threadblock(id=k, send=k + 1, chan=0) for k in range(33)]
    assert "33 sending thread blocks" in assert_only(check_program(p), "limit.channel-tbs").message


def test_unused_peer_is_info():
    p = ring_allgather()
    p.gpus[0].threadblocks.append(Threadblock(id=1, send=2, chan=0))
    rep = check_program(p)
    assert rep.ok and found(rep, "tb.unused-peer", "info")


def test_every_rule_is_documented():
    import pathlib
    doc = pathlib.Path(__file__).resolve().parents[1] / "docs" / "checker.md"
    text = doc.read_text()
    for rule in RULES:
        assert f"`{rule}`" in text, rule


def test_findings_are_capped():
    p = ring_allgather()
    for g in p.gpus:
        for i, s in enumerate(g.threadblocks[0].steps):
            s.s = i + 1
    rep = check_program(p, max_findings_per_rule=2)
    assert len(found(rep, "step.index")) == 2 and rep.suppressed["step.index"] == 18 and not rep.ok


def test_report_serialises():
    rep = check_program(copy.deepcopy(ring_allgather()))
    d = rep.to_dict()
    assert d["ok"] and d["proven"] and d["collective"] == "allgather"


def test_claims_of_billions_of_ranks_or_chunks_are_refused_without_allocating_them():
    import resource
    import time

    huge_ranks = ring_allgather()
    huge_ranks.ngpus = 2_000_000_000
    huge_chunks = ring_allgather()
    huge_chunks.gpus[1].o_chunks = 2_000_000_000
    t0, rss0 = time.monotonic(), resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    ranks, chunks = check_program(huge_ranks), check_program(huge_chunks)
    assert time.monotonic() - t0 < 5 and resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss0 < 200_000  # KiB
    assert any("no <gpu> for rank(s) 4, 5, 6" in f.message for f in found(ranks, "algo.ranks"))
    assert any("more than the 134,217,728 the proof can replay" in f.message for f in found(chunks, "gpu.chunks"))
    assert not ranks.ok and not chunks.ok


def test_no_chunks_a_loop_is_one_error_not_one_per_buffer():
    # the buffers' chunk counts follow from nchunksperloop: with 0 every rank's were reported "must be 0"
    p = mutate(lambda p: setattr(p, "nchunksperloop", 0))
    rep = check_program(p)
    assert [f.rule for f in rep.findings if f.severity == "error"] == ["algo.nchunksperloop"]
