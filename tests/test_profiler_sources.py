"""Offline sources: `nvidia-smi topo -m` texts and NCCL topology XML of common systems (see
tests/data/profiler/SOURCES.md), and refining them with measurements."""
import json
import re
from pathlib import Path

import pytest

from taccl.errors import UserError
from taccl.profiler import nccl_xml, nvsmi
from taccl.profiler.analyze import analyze
from taccl.profiler.samples import load_samples
from taccl.profiler.writer import facts_from_analysis, merge_facts, to_topology
from taccl.topology import DGX1_DOUBLE, DGX1_SINGLE, spec_from_dict

DATA = Path(__file__).parent / "data" / "profiler"


def topo_of(facts, **kw):
    doc, ren = to_topology(facts, **kw)
    spec_from_dict(json.loads(json.dumps(doc)))  # the synthesizer accepts it
    return doc, ren


def test_dgx1_wiring_pcie_pairs_and_nics():
    f = nvsmi.parse(DATA / "nvidia-smi" / "dgx1-v100-hybrid-cube-mesh.txt")
    by = {c["name"]: {tuple(sorted(p)) for p in c["pairs"]} for c in f.classes}
    assert by == {"nvlink_x2": set(DGX1_DOUBLE), "nvlink_x1": set(DGX1_SINGLE)}
    assert f.pcie_groups == [[0, 1], [2, 3], [4, 5], [6, 7]]
    assert [(n["name"], n["gpus_on_switch"], n["numa_node"]) for n in f.nics] == [
        ("mlx5_0", [0, 1], 0), ("mlx5_1", [2, 3], 0), ("mlx5_2", [4, 5], 1), ("mlx5_3", [6, 7], 1)]
    doc, _ = topo_of(f)
    assert doc["link_types"]["nvlink_x2"]["bw_GBps"] == 50.0 and "nominal" in doc["link_types"]["nvlink_x2"]["note"]
    assert [n["gpus"] for n in doc["nics"]] == [[0, 1], [2, 3], [4, 5], [6, 7]]


@pytest.mark.parametrize("name,k,n", [("dgx-h100-nv18.txt", 18, 8), ("h800-8gpu-nv8.txt", 8, 8),
                                      ("dgx2-16gpu-nv6.txt", 6, 16)])
def test_uniform_nvlink_is_a_switch(name, k, n):
    f = nvsmi.parse(DATA / "nvidia-smi" / name)
    (c,) = f.classes
    assert c["kind"] == "switch" and c["bw_GBps"] == k * 25.0 and f.n_gpus == n
    doc, _ = topo_of(f)
    assert doc["switches"][0]["gpus"] == list(range(n))


def test_h800_one_nic_per_gpu_and_storage_nic_left_out():
    f = nvsmi.parse(DATA / "nvidia-smi" / "h800-8gpu-nv8.txt")
    assert f.pcie_groups == [[g] for g in range(8)]
    near = {n["name"]: n["gpus_on_switch"] for n in f.nics}
    assert near["mlx5_2"] == [0] and near["mlx5_1"] == [4] and near["mlx5_0"] == []
    assert f.gpu_numa == [0] * 4 + [1] * 4
    doc, _ = topo_of(f)
    assert sorted(n["name"] for n in doc["nics"]) == [f"mlx5_{i}" for i in range(1, 9)]
    assert all(len(n["gpus"]) == 1 for n in doc["nics"])


def test_dgx2_nics_follow_pix_pairs():
    f = nvsmi.parse(DATA / "nvidia-smi" / "dgx2-16gpu-nv6.txt")
    assert f.pcie_groups[:2] == [[0, 1, 2, 3], [4, 5, 6, 7]]  # PXB: one uplink per four GPUs
    doc, _ = topo_of(f)
    nics = {n["name"]: n["gpus"] for n in doc["nics"]}
    assert nics["mlx5_0"] == [0, 1] and nics["mlx5_1"] == [2, 3]


def test_pcie_only_systems():
    # No NVLink and a PCIe relation for every GPU pair: one switch of link type "pcie" whose port is each GPU's
    # PCIe link at the nominal (or given) rate, as the probe's analysis makes it; no LL128 there
    f = nvsmi.parse(DATA / "nvidia-smi" / "rtx4090-8gpu-pcie.txt")
    (c,) = f.classes
    assert (c["name"], c["kind"], c["bw_GBps"], len(c["pairs"])) == ("pcie", "switch", 24.0, 56)
    assert "nominal" in c["note"] and not any(u["what"] == "GPU-GPU links" for u in f.unmeasured)
    assert [n["numa_node"] for n in f.nics] == [1, 1]
    doc, ren = topo_of(f)
    assert ren.order[0] == 6  # GPU6 is the one GPU next to the NICs (PHB); it becomes GPU 0
    assert [(s["gpus"], s["type"]) for s in doc["switches"]] == [(list(range(8)), "pcie")]
    assert doc["runtime"]["protocols"] == ["Simple", "LL"]
    k80 = nvsmi.parse(DATA / "nvidia-smi" / "k80-6gpu-pix-soc.txt", pcie_GBps=12.0)
    assert k80.pcie_groups == [[0, 1], [2, 3], [4, 5]] and k80.gpu_numa == [0, 0, 1, 1, 1, 1]
    assert [c["bw_GBps"] for c in k80.classes] == [12.0]
    topo_of(k80)
    l40s = nvsmi.parse(DATA / "nvidia-smi" / "l40s-8gpu-pcie.txt")
    assert l40s.pcie_groups is None and l40s.gpu_numa == [0] * 4 + [1] * 4
    l40s.compute_capability = 89
    # compute capability 8.9 spans GPUs of 58 to 142 SMs: no count is guessed (too many thread blocks hang)
    with pytest.raises(UserError, match="--sm-count: the GPUs' SM count is not known"):
        topo_of(l40s)
    l40s.sm_count, l40s.mem_bw_GBps = 142, 864.0
    doc, _ = topo_of(l40s)
    pcie = doc["link_types"]["pcie"]["protocols"]  # derived: NCCL's PCI per-step latencies, no LL128 allowed
    assert pcie["Simple"]["alpha_us"] > pcie["LL"]["alpha_us"] and doc["runtime"]["protocols"] == ["Simple", "LL"]
    assert doc["runtime"]["sm_count"] == 142 and doc["runtime"]["local_bw_GBps"] < 200  # GDDR6, not HBM
    assert not any(u["what"] in ("SM count", "memory bandwidth") for u in doc["measurements"]["unmeasured"])
    # a pair without a PCIe relation (N/A): no link is invented
    text = "        GPU0    GPU1    GPU2\nGPU0     X      PIX     N/A\nGPU1    PIX      X      PIX\nGPU2    N/A     PIX      X\n"
    f = nvsmi.parse_text(text, path="t.txt")
    assert f.classes == [] and any(u["what"] == "GPU-GPU links" for u in f.unmeasured)


@pytest.mark.parametrize("text,msg", [("hello", "no header"),
                                      ("        GPU0    GPU1\nGPU0     X      NV2\n", "rows missing"),
                                      ("        GPU0    GPU1\nGPU0     X      BOGUS\nGPU1 NV2 X\n",
                                       "column GPU1: 'BOGUS' is not a link kind"),
                                      ("        GPU0    GPU1\nGPU0     X\nGPU1 NV2 X\n", "has 1 cells, expected one"),
                                      ("        GPU0    GPU1\nGPU0     X      NV0\nGPU1 NV0 X\n",
                                       "'NV0' is not a link kind"),
                                      ("        GPU0    GPU0\nGPU0     X      NV2\n", "names GPU0 more than once"),
                                      ("        GPU0    GPU1\nGPU0     NV2      NV2\nGPU1 NV2 X\n",
                                       "column GPU0: 'NV2'; expected X exactly where a device meets itself"),
                                      ("        GPU0    GPU1\nGPU0     X      PIX\nGPU1 NV2 X\n",
                                       "row GPU0, column GPU1: 'PIX', but row GPU1, column GPU0: 'NV2'"),
                                      ("        GPU0    GPU1\nGPU0     X      NV2\nGPU1 NV2 X\nGPU1 NV2 X\n",
                                       "a second row for GPU1")])
def test_bad_nvidia_smi_text(text, msg):
    with pytest.raises(UserError, match=msg):
        nvsmi.parse_text(text, path="t.txt")


def test_nccl_dgx_a100_dump():
    f = nccl_xml.parse(DATA / "nccl" / "dgx-a100-dump.xml")
    (c,) = f.classes
    assert c["kind"] == "switch" and c["bw_GBps"] == 12 * 20.0  # 12 NVLinks x NCCL's SM80 20 GB/s
    assert f.pcie_groups == [[0, 1], [2, 3], [4, 5], [6, 7]] and f.gpu_numa == [3, 3, 1, 1, 7, 7, 5, 5]
    near = {n["name"]: (n["gpus_on_switch"], n["numa_node"], n["rate_Gbps"]) for n in f.nics}
    assert near["mlx5_0"] == ([0, 1], 3, 200.0) and near["mlx5_9"] == ([6, 7], 5, 200.0)
    assert near["mlx5_4"] == ([], 0, 200.0)  # storage NIC, not on any GPU's switch
    doc, _ = topo_of(f)
    assert doc["link_types"]["ib"]["bw_GBps"] == 25.0
    assert "mlx5_4" not in {n["name"] for n in doc["nics"]}


def test_nccl_azure_files():
    v4 = nccl_xml.parse(DATA / "nccl" / "azure-ndv4-topo.xml")
    assert v4.pcie_groups == [[0, 1], [2, 3], [4, 5], [6, 7]] and v4.gpu_numa == [0, 0, 1, 1, 2, 2, 3, 3]
    assert [n["gpus_on_switch"] for n in v4.nics][:2] == [[0, 1], [0, 1]]
    v2 = nccl_xml.parse(DATA / "nccl" / "azure-ndv2-topo.xml")
    assert v2.classes == [] and v2.nics[0]["numa_node"] == 0 and v2.gpu_numa == [0] * 4 + [1] * 4
    topo_of(v2)


def test_bad_nccl_xml():
    with pytest.raises(UserError, match="invalid XML"):
        nccl_xml.parse_text("<system>", path="x.xml")
    with pytest.raises(UserError, match="expected <system>"):
        nccl_xml.parse_text("<graphs/>", path="x.xml")
    dump = (DATA / "nccl" / "dgx-a100-dump.xml").read_text()
    for count in ("1.5", "", "-2", "0"):  # once a ValueError traceback (a fuzz found it)
        with pytest.raises(UserError, match=f'<nvlink count="{count}"> of GPU 0000:07:00.0: expected a whole number'):
            nccl_xml.parse_text(re.sub(r'(<nvlink[^>]*count=")\d+"', rf'\g<1>{count}"', dump, count=1), path="x.xml")


def test_refine_nccl_structure_with_measurements():
    """The Azure NDv2 file knows the NIC's socket but not the NVLinks; the samples know the NVLinks."""
    base = nccl_xml.parse(DATA / "nccl" / "azure-ndv2-topo.xml")
    doc = load_samples(DATA / "samples-ndv2-quick.json")
    doc["measurements"] = [m for m in doc["measurements"] if m["probe"] in ("p2p", "p2p_concurrent", "host")]
    doc["nics"] = []
    meas = facts_from_analysis(analyze(doc), doc)
    assert meas.pcie_groups is None and meas.nics == []
    merged = merge_facts(base, meas)
    assert merged.classes == meas.classes and merged.nics == base.nics
    out, _ = topo_of(merged)
    assert {"nvlink_x1", "nvlink_x2", "ib"} <= set(out["link_types"]) and out["nics"][0]["numa_node"] == 0
    assert "fit" in out["link_types"]["nvlink_x2"]
    with pytest.raises(UserError, match="GPUs"):
        merge_facts(nvsmi.parse(DATA / "nvidia-smi" / "k80-6gpu-pix-soc.txt"), meas)


def test_nccl_dump_of_a_pcie_only_node():
    # NCCL writes each GPU's <gpu> with the NVLinks it found: none means PCIe only, at the slowest GPU link
    # as NCCL rates it (x16 Gen4: 24 GB/s; one GPU here on x8). A hand-written file without <gpu> elements
    # says nothing about NVLink, and no link is invented (Azure's NDv2 file has NVLinks NCCL finds at run time).
    gpu = ('<pci busid="0000:{b}:00.0" class="0x030000" link_speed="16.0 GT/s PCIe" link_width="{w}">'
           '<gpu dev="{d}" sm="89" rank="{d}" gdr="1"/></pci>')
    cpu = '<cpu numaid="{n}" arch="x86_64">' + '<pci busid="0000:{n}0:00.0" class="0x060400">{g}</pci></cpu>'
    gpus = [gpu.format(b=f"{i + 1:02x}", w=8 if i == 3 else 16, d=i) for i in range(4)]
    text = ('<system version="1">' + cpu.format(n=0, g="".join(gpus[:2])) + cpu.format(n=1, g="".join(gpus[2:]))
            + '</system>')
    f = nccl_xml.parse_text(text, path="dump.xml")
    (c,) = f.classes
    assert (c["name"], c["kind"], c["bw_GBps"], len(c["pairs"])) == ("pcie", "switch", 12.0, 12)
    assert f.compute_capability == 89 and f.pcie_groups == [[0, 1], [2, 3]]
    with pytest.raises(UserError, match="--sm-count"):  # 8.9: from 58 SMs (L4) to 142 (L40S)
        topo_of(f)
    f.sm_count = 58
    doc, _ = topo_of(f)
    assert doc["runtime"]["sm_count"] == 58
    assert doc["runtime"]["protocols"] == ["Simple", "LL"] and "Simple" in doc["link_types"]["pcie"]["protocols"]
    azure = nccl_xml.parse(DATA / "nccl" / "azure-ndv2-topo.xml")
    assert azure.classes == [] and any(u["what"] == "GPU-GPU links" for u in azure.unmeasured)
