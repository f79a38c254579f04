"""The runtime's native side: build it, run the C++ tests, the sanitizer build and the parser fuzzer."""
from __future__ import annotations

import os
import shutil
import subprocess
import tarfile
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
RT = ROOT / "runtime"
SHARED_XML = ROOT.parent / "shared" / "data" / "msccl-xml"

pytestmark = pytest.mark.skipif(shutil.which("g++") is None and shutil.which("c++") is None,
                                reason="no C++ compiler")


def _env():
    env = dict(os.environ)
    env["TACCL_SHARED_XML_DIR"] = str(SHARED_XML)
    env["TACCL_RUNTIME_TIMEOUT_MS"] = "2000"
    return env


def _make(*targets):
    jobs = str(min(4, os.cpu_count() or 1))
    r = subprocess.run(["make", "-C", str(RT), "-j", jobs, *targets], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-4000:]


def _seeds():
    return sorted(str(p) for p in (RT / "tests" / "data").glob("*.xml")) + sorted(str(p) for p in SHARED_XML.glob("*.xml"))


def test_cpp_unit_tests():
    _make()
    r = subprocess.run([str(RT / "build" / "taccl_runtime_tests")], cwd=RT, capture_output=True, text=True,
                       env=_env(), timeout=300)
    assert r.returncode == 0, r.stdout[-6000:] + r.stderr[-2000:]
    assert "PASSED" in r.stdout


def test_fuzz_parser_release_build():
    _make()
    r = subprocess.run([str(RT / "build" / "taccl_xml_fuzz"), "--iterations", "4000", "--seed", "7", "--run", *_seeds()],
                       cwd=RT, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "refused cleanly" in r.stdout


@pytest.mark.skipif(os.environ.get("TACCL_SKIP_ASAN") == "1", reason="TACCL_SKIP_ASAN=1")
def test_sanitizer_build_unit_tests_and_fuzz():
    """AddressSanitizer + UndefinedBehaviorSanitizer: the C++ tests and 3000 mutated files, some executed."""
    _make("asan")
    env = _env()
    env["ASAN_OPTIONS"] = "detect_leaks=1:abort_on_error=1"
    env["UBSAN_OPTIONS"] = "print_stacktrace=1:halt_on_error=1"
    r = subprocess.run([str(RT / "build-asan" / "taccl_runtime_tests"), "--gtest_filter=-HostRun.SharedPrograms"],
                       cwd=RT, capture_output=True, text=True, env=env, timeout=600)
    assert r.returncode == 0, r.stdout[-6000:] + r.stderr[-6000:]
    r = subprocess.run([str(RT / "build-asan" / "taccl_xml_fuzz"), "--iterations", "3000", "--seed", "11", "--run",
                        *_seeds()], cwd=RT, capture_output=True, text=True, env=env, timeout=600)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-6000:]
    assert "runtime error" not in r.stderr and "AddressSanitizer" not in r.stderr


def test_cuda_backend_compiles_when_nvcc_present():
    nvcc = shutil.which("nvcc") or ("/usr/local/cuda/bin/nvcc" if Path("/usr/local/cuda/bin/nvcc").exists() else None)
    if not nvcc:
        pytest.skip("nvcc not found")
    _make("cuda")
    assert (RT / "build" / "libtaccl_runtime_cuda.so").is_file()


def _cuda_binutil(name: str) -> str | None:
    """cuobjdump/nvdisasm from the CUDA toolkit, else from NVIDIA's PyPI wheels (a test dependency)."""
    found = shutil.which(name) or (f"/usr/local/cuda/bin/{name}" if Path(f"/usr/local/cuda/bin/{name}").exists() else None)
    if found:
        return found
    try:
        import nvidia
    except ImportError:
        return None
    for base in map(Path, nvidia.__path__):
        for p in sorted(base.glob(f"cu*/bin/{name}")):
            return str(p)
    return None


def test_cuda_kernel_code_moves_16_byte_packs_without_spills():
    """The compiled interpreter kernel: 128-bit global loads and stores in its data loops, no local memory
    (spills), and no more fences than its posts and abort paths need (a release fence per post, not one
    per thread per step)."""
    nvcc = shutil.which("nvcc") or ("/usr/local/cuda/bin/nvcc" if Path("/usr/local/cuda/bin/nvcc").exists() else None)
    cuobjdump, nvdisasm = _cuda_binutil("cuobjdump"), _cuda_binutil("nvdisasm")
    if not (nvcc and cuobjdump and nvdisasm):
        pytest.skip("needs nvcc, cuobjdump and nvdisasm")
    _make("cuda")
    obj = str(RT / "build" / "cuda" / "cuda_backend.o")
    env = dict(os.environ, NVDISASM_PATH=str(Path(nvdisasm).parent))
    res = subprocess.run([cuobjdump, "-res-usage", obj], capture_output=True, text=True, env=env, timeout=120)
    assert res.returncode == 0, res.stderr
    usage = [line for line in res.stdout.splitlines() if "REG:" in line]
    assert usage and all("LOCAL:0 " in line for line in usage), [u for u in usage if "LOCAL:0 " not in u][:3]
    sass = subprocess.run([cuobjdump, "-sass", obj], capture_output=True, text=True, env=env, timeout=300)
    assert sass.returncode == 0, sass.stderr[-2000:]
    kernels, arch, current = {}, "", None  # (arch, kernel) -> its SASS
    for line in sass.stdout.splitlines():
        if "arch = sm_" in line:
            arch, current = line.split("=")[1].strip(), None
        elif "Function : " in line:
            current = (arch, line.split("Function : ")[1].strip())
            kernels[current] = ""
        elif current:
            kernels[current] += line + "\n"
    checked = 0
    for (arch, name), code in kernels.items():
        if "interpreterKernel" not in name:
            continue
        fences = code.count("MEMBAR")
        assert fences <= 8, f"{arch} {name}: {fences} fences"
        if "interpreterKernelIfNS_5OpSum" in name or "interpreterKernelIN5taccl3f16ENS_5OpSum" in name:
            assert code.count("LDG.E.128") >= 2 and code.count("STG.E.128") >= 2, (arch, name)
            checked += 1
    assert checked >= 2, sorted(kernels)[:5]  # float and float16 sum, for every architecture built


def test_line_bandwidth_tool_builds_without_spills_and_runs_or_says_why_not():
    """`taccl_line_bw` (runtime/tools/line_bw.cu): every variant's kernel without local memory (a spill would
    time the stack, not the line code); bad options refused with exit 2; on a GPU a small run of each
    protocol right (exit 0, no WRONG or HUNG row) and a latency row each, without one exit 2 naming the
    reason."""
    nvcc = shutil.which("nvcc") or ("/usr/local/cuda/bin/nvcc" if Path("/usr/local/cuda/bin/nvcc").exists() else None)
    if not nvcc:
        pytest.skip("nvcc not found")
    _make("build/taccl_line_bw")
    tool = str(RT / "build" / "taccl_line_bw")
    cuobjdump = _cuda_binutil("cuobjdump")
    if cuobjdump:
        res = subprocess.run([cuobjdump, "-res-usage", tool], capture_output=True, text=True, timeout=120)
        assert res.returncode == 0, res.stderr
        usage = [line for line in res.stdout.splitlines() if "REG:" in line]
        assert len(usage) >= 122, len(usage)  # 4 Simple, 36 LL, 54 LL128 variants and 28 ping kernels, per architecture
        assert all("STACK:0 " in u and "LOCAL:0 " in u for u in usage), [u for u in usage if "STACK:0 " not in u][:3]
    r = subprocess.run([tool, "--threads", "100"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "multiple of 32" in r.stderr, r.stderr
    r = subprocess.run([tool, "--protos", "LL,ll128"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "'LL,ll128'" in r.stderr, r.stderr
    r = subprocess.run([tool, "--bytes", str(4 << 20), "--unrolls", "1,4", "--iters", "1", "--runtime-only"],
                       capture_output=True, text=True, timeout=120)
    if r.returncode == 2 and "no usable CUDA device" in r.stderr:
        return  # no GPU here: the reason said, nothing run
    assert r.returncode == 0, r.stdout + r.stderr
    rows = [line for line in r.stdout.splitlines() if line and not line.startswith(("#", "proto"))]
    assert {row.split()[0] for row in rows} == {"Simple", "LL", "LL128"}, rows  # 4 MiB: whole calls of each
    assert not any("WRONG" in row or "HUNG" in row or "skipped" in row for row in rows), rows
    r = subprocess.run([tool, "--pingpong", "100", "--iters", "1", "--runtime-only"], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    rows = [line.split() for line in r.stdout.splitlines() if line and not line.startswith(("#", "proto"))]
    assert [row[0] for row in rows] == ["Simple", "LL", "LL128"] and all(float(row[-1]) > 0 for row in rows), rows


def test_gpu_session_scripts_parse_and_refuse_unknown_options():
    """benchmarks/gpu_check.sh and gpu_prepare.sh are only run on (or for) a lent GPU: here they must at least
    parse, and gpu_prepare.sh must refuse an unknown option before touching anything."""
    for script in ("gpu_check.sh", "gpu_prepare.sh"):
        r = subprocess.run(["bash", "-n", str(ROOT / "benchmarks" / script)], capture_output=True, text=True)
        assert r.returncode == 0, (script, r.stderr)
    r = subprocess.run(["bash", str(ROOT / "benchmarks" / "gpu_prepare.sh"), "--bogus"], capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 2 and "unknown option '--bogus'" in r.stderr, r.stderr


def test_gpu_check_stops_its_stages_at_the_deadline_and_bundles_what_ran(tmp_path):
    """A device call killed at its limit returns none of gpu_check.sh's files: with DEADLINE_S the script cuts
    a stage's own limit to what is left, skips the stages that no longer fit and still packs $OUT (BUNDLE).
    Run on a stand-in tree whose sweep never ends."""
    (tmp_path / "benchmarks").mkdir()
    shutil.copy(ROOT / "benchmarks" / "gpu_check.sh", tmp_path / "benchmarks")
    (tmp_path / "benchmarks" / "runtime_sweep.py").write_text("import time\ntime.sleep(300)\n")
    prebuilt = tmp_path / "prebuilt"
    prebuilt.mkdir()
    for name in ("libtaccl_runtime_cuda.so", "taccl_bench_cuda", "cuda_backend.o", "taccl-probe"):
        (prebuilt / name).write_text("stand-in\n")
    for folder in ("runtime/build/cuda", "profiler", "programs"):
        (tmp_path / folder).mkdir(parents=True)
    env = {**os.environ, "DEADLINE_S": "32", "OUT": str(tmp_path / "out"), "BUNDLE": str(tmp_path / "out.tgz"),
           "PREBUILT": "prebuilt", "LATENCY": "1", "LINEBW": "1"}
    t0 = time.monotonic()
    subprocess.run(["bash", "benchmarks/gpu_check.sh", "programs"], cwd=tmp_path, env=env, capture_output=True,
                   text=True, timeout=120)
    took = time.monotonic() - t0
    summary = (tmp_path / "out" / "summary.txt").read_text()
    assert "exit 124" in summary and took < 25, (took, summary)  # the sweep stopped at 32 - 20 s, not its 240
    for stage in ("watchdog", "device buffers", "latency", "one connection's FIFO", "sweep: 16 MiB"):
        assert f"skipped, DEADLINE_S=32 reached: {stage}" in summary, summary
    with tarfile.open(tmp_path / "out.tgz") as bundle:
        assert "out/summary.txt" in bundle.getnames()
