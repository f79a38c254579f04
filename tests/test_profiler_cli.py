"""`taccl profile`: analysis of saved samples, offline sources, the probe runner (with stand-in probes, since
no GPU is available here), and the real probe binary's no-GPU path when it has been built."""
import json
import os
import stat
import sys
from pathlib import Path

import pytest

from taccl.cli import main
from taccl.profiler.runner import REPO_PROBE, run_probes
from taccl.topology import load_spec

DATA = Path(__file__).parent / "data" / "profiler"


def test_analyze_saved_samples(tmp_path, capsys):
    out = tmp_path / "topo.json"
    assert main(["profile", "--analyze", str(DATA / "samples-ndv2-quick.json"), "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert "CUDA_VISIBLE_DEVICES=" in text and "nvlink_x2" in text
    spec = load_spec(str(out))
    assert spec.gpus_per_node == 8 and spec.pcie_switches == [[0, 1], [2, 3], [4, 5], [6, 7]]
    doc = json.loads(out.read_text())
    assert doc["nics"][0]["pcie_switch"] == 0 and doc["measurements"]["samples_file"].endswith("samples-ndv2-quick.json")


def test_analyze_json_summary_and_reference(tmp_path, capsys):
    out = tmp_path / "t.json"
    assert main(["profile", "--analyze", str(DATA / "samples-ndv2-quick.json"), "--out", str(out), "--json",
                 "--reference", "ndv2", "--name", "my-ndv2"]) == 0
    s = json.loads(capsys.readouterr().out)
    assert s["gpus"] == 8 and set(s["link_types"]) == {"nvlink_x1", "nvlink_x2", "ib"}
    assert json.loads(out.read_text())["name"] == "my-ndv2"


def test_offline_sources(tmp_path):
    out = tmp_path / "t.json"
    assert main(["profile", "--from-nvidia-smi", str(DATA / "nvidia-smi" / "dgx-h100-nv18.txt"), "--offline",
                 "--out", str(out), "-q"]) == 0
    assert load_spec(str(out)).switches
    assert main(["profile", "--from-nccl-xml", str(DATA / "nccl" / "azure-ndv2-topo.xml"), "--analyze",
                 str(DATA / "samples-ndv2-quick.json"), "--out", str(out), "-q"]) == 0
    assert load_spec(str(out)).links
    # a PCIe-only node (no NVLink): a topology a synthesis can use, at the rate given
    assert main(["profile", "--from-nvidia-smi", str(DATA / "nvidia-smi" / "l40s-8gpu-pcie.txt"), "--offline",
                 "--pcie-gbps", "48", "--out", str(out), "-q"]) == 0
    spec = load_spec(str(out))
    assert spec.protocols == ("Simple", "LL") and spec.link_types["pcie"].bw_GBps == 48.0


def test_the_compute_capability_given_or_read_sets_the_derived_costs(tmp_path, capsys):
    # these samples predate the probe's "sm" field: the topology is uncalibrated and says how to fix it
    out = tmp_path / "t.json"
    assert main(["profile", "--analyze", str(DATA / "samples-ndv2-quick.json"), "--out", str(out)]) == 0
    assert "not measured: calibrated costs" in capsys.readouterr().out
    note = load_spec(str(out)).calibration_note()
    assert "--compute-capability X.Y" in note and "samples-ndv2-quick.json" in note
    assert main(["profile", "--analyze", str(DATA / "samples-ndv2-quick.json"), "--out", str(out),
                 "--compute-capability", "7.0"]) == 0
    assert "derived from the DGX H100 fit for Volta GPUs" in capsys.readouterr().out
    spec = load_spec(str(out))
    assert spec.calibration_note() is None and spec.sm_count == 80
    # NCCL's topology dump says it (sm="80"); nvidia-smi's does not, the option does
    assert main(["profile", "--from-nccl-xml", str(DATA / "nccl" / "dgx-a100-dump.xml"), "--offline", "--out",
                 str(out), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["calibration"]["generation"] == "ampere"
    assert main(["profile", "--from-nvidia-smi", str(DATA / "nvidia-smi" / "dgx-h100-nv18.txt"), "--offline",
                 "--out", str(out), "--compute-capability", "90", "-q"]) == 0
    topo = json.loads(out.read_text())
    assert topo["measurements"]["calibration"]["generation"] == "hopper" and topo["runtime"]["sm_count"] == 132
    assert {u["what"] for u in topo["measurements"]["unmeasured"]} >= {"SM count", "memory bandwidth"}
    # the SM count and memory bandwidth given: no data sheet's (an H100 PCIe's 114 SMs and 2000 GB/s)
    assert main(["profile", "--from-nvidia-smi", str(DATA / "nvidia-smi" / "dgx-h100-nv18.txt"), "--offline",
                 "--out", str(out), "--compute-capability", "90", "--sm-count", "114", "--memory-gbps", "2000",
                 "-q"]) == 0
    spec = load_spec(str(out))
    assert spec.sm_count == 114 and spec.local_bw_GBps < load_spec("dgx-h100").local_bw_GBps
    assert not {u["what"] for u in json.loads(out.read_text())["measurements"]["unmeasured"]} & {"SM count",
                                                                                                 "memory bandwidth"}
    # no compute capability, so no costs: the SM count given still bounds the thread blocks (it was dropped)
    assert main(["profile", "--from-nvidia-smi", str(DATA / "nvidia-smi" / "dgx-h100-nv18.txt"), "--offline",
                 "--out", str(out), "--sm-count", "100", "-q"]) == 0
    spec = load_spec(str(out))
    assert spec.sm_count == 100 and spec.calibration_note() is not None
    for bad in ("9.05", "abc", "2", "9."):
        with pytest.raises(SystemExit) as exc:
            main(["profile", "--analyze", str(DATA / "samples-ndv2-quick.json"), "--out", str(tmp_path / "x.json"),
                  "--compute-capability", bad])
        assert exc.value.code == 2 and "expected a compute capability such as 9.0" in capsys.readouterr().err
    assert not (tmp_path / "x.json").exists()


@pytest.mark.parametrize("argv,msg", [
    (["--analyze", "missing.json"], "file not found"),
    (["--offline"], "--offline needs"),
    (["--probe", "/nonexistent/probe"], "does not exist"),
    (["--from-nvidia-smi", str(DATA / "nccl" / "azure-ndv2-topo.xml"), "--offline"], "not `nvidia-smi topo -m`"),
    (["--from-nvidia-smi", str(DATA / "nvidia-smi" / "dgx1-v100-hybrid-cube-mesh.txt"), "--offline", "--nvlink-gbps",
      "-5"], "--nvlink-gbps: must be a positive bandwidth"),
    (["--from-nvidia-smi", str(DATA / "nvidia-smi" / "l40s-8gpu-pcie.txt"), "--offline", "--pcie-gbps", "0"],
     "--pcie-gbps: must be a positive bandwidth"),
    (["--analyze", "{negative}"], "$.measurements[0].samples: expected samples as a list of [bytes, microseconds] "
                                  "pairs, both positive"),
    (["--from-nvidia-smi", str(DATA / "nvidia-smi" / "dgx-h100-nv18.txt"), "--offline", "--sm-count", "0"],
     "--sm-count: must be a number of SMs from 1 to 1024"),
    (["--from-nvidia-smi", str(DATA / "nvidia-smi" / "dgx-h100-nv18.txt"), "--offline", "--memory-gbps", "-1"],
     "--memory-gbps: must be a positive bandwidth"),
    (["--from-nvidia-smi", str(DATA / "nvidia-smi" / "dgx-h100-nv18.txt"), "--offline", "--memory-gbps", "2000"],
     "--memory-gbps: the memory bandwidth scales the costs derived for the GPUs' generation"),  # was ignored
    # PCIe cards of compute capability 8.9 have 58 to 142 SMs: a guess could give programs that hang
    (["--from-nvidia-smi", str(DATA / "nvidia-smi" / "l40s-8gpu-pcie.txt"), "--offline", "--compute-capability",
      "8.9"], "--sm-count: the GPUs' SM count is not known (no NVLink: a PCIe card"),
])
def test_bad_input_exit_2(argv, msg, tmp_path, capsys):
    doc = json.loads((DATA / "samples-ndv2-quick.json").read_text())
    for m in doc["measurements"]:
        m["samples"] = [[b, -t] for b, t in m.get("samples", [])]  # a clock that ran backwards
    (tmp_path / "negative.json").write_text(json.dumps(doc))
    argv = [a.replace("{negative}", str(tmp_path / "negative.json")) for a in argv]
    assert main(["profile", "--out", str(tmp_path / "t.json")] + argv) == 2
    assert msg in capsys.readouterr().err
    assert not (tmp_path / "t.json").exists()


def test_samples_without_a_link_between_gpus_write_no_topology(tmp_path, capsys):
    doc = json.loads((DATA / "samples-ndv2-quick.json").read_text())
    for m in doc["measurements"]:
        m.update({k: [] for k in ("samples", "times_us") if k in m})
    (tmp_path / "empty.json").write_text(json.dumps(doc))
    assert main(["profile", "--analyze", str(tmp_path / "empty.json"), "--out", str(tmp_path / "t.json")]) == 1
    assert "no link between two GPUs was measured" in capsys.readouterr().err
    assert not (tmp_path / "t.json").exists()


def test_no_gpu_samples_exit_1_with_reason(tmp_path, capsys):
    s = tmp_path / "s.json"
    s.write_text(json.dumps({"format": "taccl-profile-samples", "version": 1, "gpus": [], "measurements": [],
                             "skipped": [{"probe": "all", "what": "GPUs", "reason": "no CUDA-capable device"}]}))
    assert main(["profile", "--analyze", str(s), "--out", str(tmp_path / "t.json")]) == 1
    assert "no CUDA-capable device" in capsys.readouterr().err
    assert not (tmp_path / "t.json").exists()


FAKE = r'''#!{py}
import json, sys, time
sys.path.insert(0, {root!r})
from taccl.profiler.synth import generate
args = sys.argv[1:]
group = args[args.index("--groups") + 1]
out = args[args.index("--out") + 1]
if group == {hang!r}:
    time.sleep(60)
doc, _ = generate("h100", seed=1, reps=3, net=False)
keep = {{"none": (), "p2p": ("p2p", "p2p_concurrent"), "host": ("host", "host_concurrent"),
        "nic": ("nic_loopback", "host_nic_busy")}}[group]
doc["measurements"] = [m for m in doc["measurements"] if m["probe"] in keep]
json.dump(doc, open(out, "w"))
print("[1/1] fake " + group, file=sys.stderr)
'''


def fake_probe(tmp_path, hang="never"):
    p = tmp_path / "fake-probe"
    p.write_text(FAKE.format(py=sys.executable, root=str(Path(__file__).resolve().parents[1]), hang=hang))
    p.chmod(p.stat().st_mode | stat.S_IEXEC)
    return str(p)


def test_runner_merges_groups(tmp_path, capsys):
    out = tmp_path / "t.json"
    assert main(["profile", "--probe", fake_probe(tmp_path), "--quick", "--out", str(out)]) == 0
    err = capsys.readouterr().err
    assert "about" in err and "fake p2p" in err  # the estimate, then the probe's own progress lines
    samples = json.loads((tmp_path / "t.samples.json").read_text())
    assert {m["probe"] for m in samples["measurements"]} >= {"p2p", "host", "host_concurrent", "host_nic_busy"}
    spec = load_spec(str(out))
    assert spec.switches and len(spec.nics) == 8


def test_runner_kills_a_hung_group_and_keeps_the_rest(tmp_path):
    lines = []
    doc = run_probes(fake_probe(tmp_path, hang="host"), quick=True, timeout_s=1, report=lines.append,
                     group_limit_s=2)
    assert any(s["what"] == "probe group host" and "killed" in s["reason"] for s in doc["skipped"])
    assert doc["status"] == "partial"
    assert {m["probe"] for m in doc["measurements"]} == {"p2p", "p2p_concurrent", "nic_loopback", "host_nic_busy"}


@pytest.mark.skipif(not (REPO_PROBE.is_file() and os.access(REPO_PROBE, os.X_OK)),
                    reason="profiler/taccl-probe not built (make -C profiler NVCC=...)")
def test_real_probe_binary_without_gpu_exits_cleanly(tmp_path, capsys):
    import subprocess
    out = tmp_path / "s.json"
    r = subprocess.run([str(REPO_PROBE), "--quick", "--timeout", "10", "--out", str(out)], capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0
    doc = json.loads(out.read_text())
    assert doc["format"] == "taccl-profile-samples" and doc["status"] in ("complete", "partial")
    if not doc["gpus"]:  # the machine this test runs on has no GPU: every probe says why it was skipped
        assert any(s["what"] == "GPUs" for s in doc["skipped"])
        assert main(["profile", "--analyze", str(out), "--out", str(tmp_path / "t.json")]) == 1
