"""Analysis of generated probe samples (noise and outliers) for NDv2-like, DGX A100-like and H100-like nodes:
link costs, switch groups, NIC placement, nearest CPU, renumbering, and the topology file written."""
import copy
import json
from pathlib import Path

import pytest

from taccl.errors import UserError
from taccl.profiler.analyze import analyze
from taccl.profiler.samples import check_samples, empty_samples
from taccl.profiler.synth import generate
from taccl.profiler.writer import facts_from_analysis, to_topology
from taccl.topology import DGX1_DOUBLE, DGX1_SINGLE, Topology, load_spec, spec_from_dict

ROOT = Path(__file__).resolve().parent.parent


def run(doc, **kw):
    doc = check_samples(json.loads(json.dumps(doc)))
    an = analyze(doc)
    topo, ren = to_topology(facts_from_analysis(an, doc), **kw)
    return an, topo, ren


@pytest.fixture(scope="module", params=["ndv2", "dgx-a100", "h100"])
def layout(request):
    doc, truth = generate(request.param, seed=11)
    an, topo, ren = run(doc)
    return request.param, doc, truth, an, topo, ren


def within(a, b, tol=0.05):
    return abs(a / b - 1) < tol


def test_link_costs_recovered(layout):
    name, _, truth, an, topo, _ = layout
    sm = 0.97  # the generator's SM-copy efficiency; the analysis prefers SM copies
    if truth["fabric"] == "switch":
        (cls,) = an.direct_classes
        assert cls.kind == "switch" and "keep only" in an.switch_evidence
        assert within(cls.fit.bw_GBps, truth["sw"][0] * sm) and within(cls.fit.alpha_us, truth["sw"][1])
        assert topo["switches"][0]["gpus"] == list(range(8))
    else:
        by_bw = sorted(an.direct_classes, key=lambda c: c.fit.bw_GBps)
        assert [len(c.members) for c in by_bw] == [16, 16]
        for cls, k in zip(by_bw, (1, 2)):
            assert within(cls.fit.bw_GBps, truth["nv"][k] * sm) and within(cls.fit.alpha_us, truth["nv_alpha"])
            assert {tuple(sorted(p)) for p in cls.members} == {tuple(sorted(e)) for e, m in truth["edges"].items() if m == k}
        assert [c.kind for c in an.classes if c.kind == "pcie"] == ["pcie"]  # non-NVLink pairs kept out
    assert within(an.net_fit.alpha_us, truth["net"][0]) and within(an.net_fit.bw_GBps, truth["net"][1])
    for (d, g), f in an.host_fits.items():
        assert within(f.bw_GBps, truth["host"][0]) and within(f.alpha_us, truth["host"][1])


def test_pcie_groups_and_nic_placement(layout):
    _, doc, truth, an, topo, ren = layout
    assert an.pcie_groups == truth["pcie_groups"]
    assert [sorted(n.gpus_on_switch) for n in an.nics] == truth["nic_gpus"]
    assert [n.numa_node for n in an.nics] == truth["nic_numa"]
    assert all("loopback latency" in n.numa_evidence for n in an.nics)
    # In the file, each NIC points at the PCIe switch that holds its GPUs, in the new numbering.
    inv = ren.inverse()
    for nic, gpus in zip(topo["nics"], truth["nic_gpus"]):
        assert sorted(inv[g] for g in gpus) == topo["pcie_switches"][nic["pcie_switch"]]


def test_topology_file_loads_and_records_fit_quality(layout, tmp_path):
    name, _, _, an, topo, _ = layout
    path = tmp_path / "t.json"
    path.write_text(json.dumps(topo))
    spec = load_spec(str(path))
    assert spec.gpus_per_node == 8 and spec.nics
    Topology(spec, nodes=2)
    for t in topo["link_types"].values():
        assert t["fit"]["ok"] and t["fit"]["n_outliers"] >= 0 and "rel_residual_median" in t["fit"]
    m = topo["measurements"]
    assert m["pair_fits"] and m["host_fits"] and m["pcie_evidence"] and m["renumbering"]["order"]
    assert m["unmeasured"] == []


@pytest.mark.parametrize("seed", [0, 2, 5])
def test_ndv2_renumbering_matches_canonical_wiring_and_puts_nic_next_to_gpu0(seed):
    doc, truth = generate("ndv2", seed=seed)
    an, topo, ren = run(doc)
    order = ren.order
    assert topo["cuda_visible_devices"] == ",".join(map(str, order))
    assert ren.nic_next_to_gpu0 and order[0] in truth["nic_gpus"][0]
    # Relabelled measured graph == the canonical DGX-1 / NDv2 wiring with the same multiplicities.
    inv = ren.inverse()
    relabelled = {(min(inv[a], inv[b]), max(inv[a], inv[b])): k for (a, b), k in truth["edges"].items()}
    assert relabelled == {**{e: 2 for e in DGX1_DOUBLE}, **{e: 1 for e in DGX1_SINGLE}}
    # ... and that is what the written file says.
    doubles = {(l["src"], l["dst"]) for l in topo["links"] if l["type"] == "nvlink_x2"}
    assert doubles == set(DGX1_DOUBLE)
    assert topo["nics"][0]["pcie_switch"] == 0 and 0 in topo["pcie_switches"][0]
    assert ren.reference in ("ndv2", "dgx1")


def test_renumbering_without_builtin_reference_is_an_automorphism():
    doc, truth = generate("ndv2", seed=3, permute=False, nic_group=2)
    an, topo, ren = run(doc, auto_reference=False)
    assert ren.reference is None and ren.order[0] in (4, 5) and ren.nic_next_to_gpu0
    inv = ren.inverse()
    edges = {(min(inv[a], inv[b]), max(inv[a], inv[b])): k for (a, b), k in truth["edges"].items()}
    assert edges == {(min(a, b), max(a, b)): k for (a, b), k in truth["edges"].items()}


def test_full_mesh_is_not_taken_for_a_switch():
    doc, _ = generate("h100", seed=4, reps=3)
    for m in doc["measurements"]:
        if m["probe"] == "p2p_concurrent":  # same-source copies keep their bandwidth: separate links
            m["times_us"] = [[t / 2 for t in row] for row in m["times_us"]]
    an, topo, _ = run(doc)
    assert "switches" not in topo and len(topo["links"]) == 28 and "full mesh" in an.switch_evidence


# ---- degraded inputs: still produce what can be measured, and say what could not -----------------------------

def reasons(topo):
    return {u["what"]: u["reason"] for u in topo["measurements"]["unmeasured"]}


def test_no_nic_and_no_peer_node():
    doc, _ = generate("dgx-a100", seed=2, net=False, reps=3)
    doc["nics"] = []
    doc["measurements"] = [m for m in doc["measurements"] if m["probe"] not in ("nic_loopback", "host_nic_busy")]
    _, topo, _ = run(doc)
    assert "nics" not in topo and topo["max_nodes"] == 1
    assert "no NIC" in reasons(topo)["NIC"]
    load_spec_from(topo)


def test_nic_without_net_measurement_gets_nominal_cost():
    doc, _ = generate("h100", seed=2, net=False, reps=3)
    _, topo, _ = run(doc)
    assert topo["link_types"]["ib"]["bw_GBps"] == 50.0 and "nominal" in topo["link_types"]["ib"]["note"]
    assert "--peer" in reasons(topo)["inter-node alpha and bandwidth"]


def test_one_gpu():
    doc = empty_samples()
    doc.update(gpus=[{"index": 0, "name": "x"}], skipped=[{"probe": "p2p", "what": "GPU-GPU copies",
                                                           "reason": "only one GPU"}], status="complete")
    gen, _ = generate("h100", seed=1, net=False, reps=3)
    doc["measurements"] = [m for m in gen["measurements"] if m["probe"] == "host" and m["gpu"] == 0]
    _, topo, _ = run(doc)
    assert topo["gpus_per_node"] == 1 and reasons(topo)["GPU-GPU copies"] == "only one GPU"
    load_spec_from(topo)


def test_no_gpu_gives_a_clear_error():
    doc = empty_samples()
    doc["skipped"] = [{"probe": "all", "what": "GPUs", "reason": "cudaGetDeviceCount: no CUDA-capable device"}]
    an = analyze(check_samples(doc))
    assert any("no CUDA-capable device" in u["reason"] for u in an.unmeasured)
    with pytest.raises(UserError, match="no GPU"):
        to_topology(facts_from_analysis(an, doc))


def test_no_peer_access_and_timeouts_are_marked():
    doc, _ = generate("dgx-a100", seed=5, net=False, reps=3)
    for m in doc["measurements"]:
        if m["probe"] == "p2p" and m["src"] == 3:
            m.update(status="timeout", reason="watchdog: 10 s", samples=[])
    doc["skipped"].append({"probe": "p2p_sm", "what": "p2p sm 3->*", "reason": "no peer access"})
    an, topo, _ = run(doc)
    r = reasons(topo)
    assert r["p2p sm 3->*"] == "no peer access"
    assert any(k.startswith("p2p engine=sm src=3") and v.startswith("timeout") for k, v in r.items())
    # the switch still covers all GPUs (pairs measured into GPU 3 keep it in)
    assert topo["switches"][0]["gpus"] == list(range(8))


def test_samples_that_do_not_fit_a_line_are_reported():
    doc, _ = generate("h100", seed=6, net=False, reps=3)
    for m in doc["measurements"]:
        if m["probe"] == "host" and m["gpu"] == 2 and m["direction"] == "d2h":
            m["samples"] = [[s, 1 + (s / 1e6) ** 2] for s, _ in m["samples"]]
    an, topo, _ = run(doc)
    assert "do not fit" in reasons(topo)["host d2h gpu=2"]


@pytest.mark.parametrize("mutate,msg", [
    (lambda d: d.update(format="other"), "not a profiler samples file"),
    (lambda d: d["measurements"].append({"probe": "warp"}), "unknown probe"),
    (lambda d: d["measurements"].append({"probe": "p2p", "src": 9, "dst": 0}), "GPU index 9"),
    (lambda d: d["measurements"].append({"probe": "host", "gpu": 0, "samples": [[1, 2, 3]]}), "pairs"),
    (lambda d: d.update(env=3), r"\$\.env: expected an object, got int"),  # once a traceback (a fuzz found it)
    # what a new user's edits found: tracebacks in the analysis (KeyError, ValueError, TypeError), or a
    # record dropped without a word
    (lambda d: first(d, "p2p").pop("src"), r"\.src: missing: a p2p record names engine, src, dst"),
    (lambda d: first(d, "host").pop("gpu"), r"\.gpu: missing: a host record names direction, gpu"),
    (lambda d: first(d, "p2p_concurrent").update(bytes="bad"), r"\.bytes: expected a positive number of bytes"),
    (lambda d: first(d, "p2p").update(engine="dma"), r"\.engine: expected one of ce, sm, got 'dma'"),
    (lambda d: first(d, "nic_loopback").update(numa_node="x"), r"\.numa_node: expected an integer or null"),
    (lambda d: first(d, "nic_loopback").pop("numa_node"), r"\.numa_node: missing"),
    (lambda d: d["nics"][0].update(rate_Gbps="fast"), r"\$\.nics\[0\]\.rate_Gbps: expected a number or null"),
    (lambda d: d["gpus"][0].update(numa_node="0"), r"\$\.gpus\[0\]\.numa_node: expected an integer or null"),
    (lambda d: d["measurements"].append([1, 2]), r"expected a measurement \(an object\), got \[1, 2\]"),
    (lambda d: d.pop("gpus"), r"\$\.gpus: missing; expected a list"),
    (lambda d: d.update(status=7), r"\$\.status: expected a string, got 7"),
])
def test_bad_samples_file(mutate, msg):
    doc, _ = generate("h100", seed=0, net=False, reps=1)
    doc = copy.deepcopy(doc)
    mutate(doc)
    with pytest.raises(UserError, match=msg):
        check_samples(doc, path="s.json")


def first(doc, probe) -> dict:
    """The first measurement of `probe` in a samples document."""
    return next(m for m in doc["measurements"] if m["probe"] == probe)


def load_spec_from(topo):
    from taccl.topology import spec_from_dict
    return spec_from_dict(json.loads(json.dumps(topo)))


@pytest.mark.parametrize("name,builtin", [("ndv2", "ndv2"), ("h100", "dgx-h100")])
def test_a_profiled_node_gets_calibrated_costs_for_its_gpu_generation(name, builtin):
    """The probe records each GPU's compute capability; the topology gets the costs derived for that
    generation (taccl/costs.py), so a ring on the profiled node is graded like one on the built-in file of the
    same machine, where it was several times too fast below 1 MiB without them."""
    from taccl.baselines import build
    from taccl.costs import Derivation, generation
    from taccl.simulator import simulate

    doc, _ = generate(name, seed=5)
    _, topo, _ = run(doc)
    spec = spec_from_dict(topo)
    assert spec.calibration_note() is None
    gen = generation(doc["gpus"][0]["sm"])
    assert topo["measurements"]["calibration"]["generation"] == gen
    assert topo["runtime"] == Derivation().runtime(gen, doc["gpus"][0]["sms"])
    for t in topo["link_types"].values():
        if t.get("fit", {}).get("engine"):  # a measured GPU link: Simple and LL128 scale with its bandwidth
            assert t["protocols"]["Simple"] == Derivation().nvlink(t["bw_GBps"], gen)["Simple"]
    for size in (1 << 10, 1 << 20, 64 << 20):
        times = []
        for s in (spec, load_spec(builtin)):  # the built-in file: nominal bandwidths, the same derivation
            t = Topology(s, 2)
            times.append(simulate(build("ring", t, "allgather"), t, size).time_us)
        assert within(times[0], times[1], 0.10), (size, times)


def test_without_the_compute_capability_the_gap_is_said():
    doc, _ = generate("h100", seed=5)
    for g in doc["gpus"]:
        del g["sm"]
    _, topo, _ = run(doc)
    # no costs; the SM count the probe read still bounds a program's thread blocks a rank
    assert spec_from_dict(topo).calibration_note() is not None and topo["runtime"] == {"sm_count": 132}
    (gap,) = [u for u in topo["measurements"]["unmeasured"] if u["what"] == "calibrated costs"]
    assert "--compute-capability" in gap["reason"]


def test_nccl_generations():
    from taccl.costs import generation

    assert [generation(cc) for cc in (60, 70, 75, 80, 86, 89, 90, 100, 120)] == \
        ["volta", "volta", "volta", "ampere", "ampere", "ampere", "hopper", "blackwell", "blackwell"]


def test_a_pcie_only_node_gets_a_pcie_switch_and_no_ll128(tmp_path):
    """A node without NVLink (every GPU pair over PCIe) was written as no topology at all, after a traceback in
    the link naming; now its GPUs share a switch of link type "pcie" (each GPU's PCIe link is its port), with
    NCCL's PCIe per-step latencies, and LL128, which NCCL does not enable off NVLink, is refused everywhere."""
    from taccl.baselines import build
    from taccl.costs import PCIE_LATENCY, Derivation, generation
    from taccl.sketch import load_sketch
    from taccl.synthesize import SynthesisOptions, synthesize

    doc, truth = generate("pcie", seed=2)
    _, topo, _ = run(doc)
    assert topo["switches"] == [{"name": "pcie", "gpus": list(range(8)), "type": "pcie"}]
    assert "links" not in topo and topo["runtime"]["protocols"] == ["Simple", "LL"]
    lt = topo["link_types"]["pcie"]
    assert within(lt["bw_GBps"], truth["sw"][0] * 0.97, 0.05)  # the SM copies' rate
    nvlink = Derivation().nvlink(lt["bw_GBps"], generation(89))
    for p, factor in PCIE_LATENCY.items():
        assert within(lt["protocols"][p]["alpha_us"], nvlink[p]["alpha_us"] * factor, 0.01)
    assert lt["protocols"]["LL"]["bw_GBps"] <= lt["bw_GBps"] / 2
    spec = spec_from_dict(topo)
    assert spec.protocols == ("Simple", "LL") and spec.calibration_note() is None
    # one block's on-GPU bandwidth follows the GPUs' memory (GDDR6, 864 GB/s), not the generation's HBM
    assert within(topo["runtime"]["local_bw_GBps"],
                  Derivation().runtime("hopper")["local_bw_GBps"] * 864 / 3352, 0.001)
    assert "LL128" in spec.protocol_note()
    t = Topology(spec, 1)
    sk = load_sketch(ROOT / "sketches" / "ndv2-single.json")
    path = tmp_path / "pcie.json"
    path.write_text(json.dumps(topo))
    algo = synthesize(sk, topology=str(path), options=SynthesisOptions(proto="LL", time_limit_s=10))
    assert algo.protocol == "LL"
    build("ring", t, "allgather", proto="Simple")
    with pytest.raises(UserError, match="LL128 is not used on topology"):
        synthesize(sk, topology=str(path), options=SynthesisOptions(proto="LL128", time_limit_s=10))
    with pytest.raises(UserError, match="LL128 is not used on topology"):
        build("ring", t, "allgather", proto="LL128")
    # without the compute capability (no costs derived) LL128 is still refused
    for g in doc["gpus"]:
        del g["sm"]
    _, topo, _ = run(doc)
    assert topo["runtime"] == {"protocols": ["Simple", "LL"], "sm_count": 142}  # the SMs bound blocks all the same
    assert spec_from_dict(topo).protocols == ("Simple", "LL")


def test_a_batch_on_a_pcie_node_makes_nothing_in_ll128(tmp_path):
    """A SKU that lists LL128 (the default lists every protocol) plans no synthesis and no baseline in it on a
    machine whose runtime.protocols leave it out (its report's line comes from `protocol_note`, checked above);
    a protocol the schema does not know is a clear error."""
    from taccl.batch import load_sku, plan
    from taccl.cli import main

    doc, _ = generate("pcie", seed=2)
    _, topo, _ = run(doc)
    (tmp_path / "pcie.json").write_text(json.dumps(topo))
    (tmp_path / "sku.yaml").write_text(
        "name: pcie-box\ntopology: pcie.json\nnodes: [1]\ncollectives: [allgather]\nsizes: [1KiB, 1MiB]\n"
        f"candidates:\n  - sketch: {ROOT / 'sketches' / 'ndv2-single.json'}\n"
        "    variants: {protocol: [Simple, LL128, LL]}\n")
    sku = load_sku(tmp_path / "sku.yaml")
    protos = {p.proto for task in plan(sku) for p in task.programs}
    assert protos == {"Simple", "LL"}
    topo["runtime"]["protocols"] = ["Simple", "LL64"]
    (tmp_path / "bad.json").write_text(json.dumps(topo))
    assert main(["baseline", "ring", "-t", str(tmp_path / "bad.json"), "-o", str(tmp_path / "r.xml")]) == 2
    assert not (tmp_path / "r.xml").exists()


def test_bounds_take_only_the_protocols_a_machine_allows():
    """The optimum a program is held against is over the protocols the machine allows: with only Simple, a
    1 KiB AllGather's bound is Simple's, not LL's (several times smaller)."""
    from taccl.bounds import allreduce_optimum, lower_bound, lower_bounds

    doc = json.loads((ROOT / "topologies" / "dgx-h100.json").read_text())
    full = Topology(spec_from_dict(doc), 1)
    doc["runtime"]["protocols"] = ["Simple"]
    simple_only = Topology(spec_from_dict(doc), 1)
    assert lower_bounds(full, "allgather", 1024)["proto"] == "LL"
    assert lower_bound(simple_only, "allgather", 1024) == lower_bound(full, "allgather", 1024, proto="Simple")
    assert allreduce_optimum(simple_only, 1024) == allreduce_optimum(full, 1024, proto="Simple")
    assert allreduce_optimum(simple_only, 1024) > 1.5 * allreduce_optimum(full, 1024)
