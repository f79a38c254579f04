"""The runtime's native side: build it, run the C++ tests, the sanitizer build and the parser fuzzer."""
from __future__ import annotations

import os
import shutil
import subprocess
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
