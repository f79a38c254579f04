#!/usr/bin/env bash
# Everything `benchmarks/gpu_check.sh` needs on a lent GPU machine, made here beforehand, so that the device
# minutes go to running (issue 14 part 3). Writes (git-ignored through .git/info/exclude, which it updates):
#
#   gpu-inputs/prebuilt/   libtaccl_runtime_cuda.so, taccl_bench_cuda, cuda_backend.o, taccl_line_bw and
#                          taccl-probe from a clean build (the device machine has the same nvcc)
#   gpu-inputs/shared/     the MSCCL files of ../shared/data/msccl-xml/
#   gpu-inputs/baselines/  DGX H100 ring, double binary tree and hierarchical programs, 1 and 2 nodes, in
#                          Simple, LL and LL128, and the multi-channel rings the bandwidth checks use
#   gpu-inputs/ndv2/       the files `taccl batch sketches/skus/ndv2.yaml` writes (2 nodes, 16 ranks)
#   gpu-inputs/h100/       the files of `sketches/skus/dgx-h100.yaml` at 2 nodes (16 ranks)
#   .whl/                  the wheels the device machine's Python lacks (it reaches no network)
#
#   benchmarks/gpu_prepare.sh [--skip-build] [--skip-batches]
#
# Then one `run` of the device tool, with `carry: ["gpu-inputs", ".whl"]` (about 54 MiB of the 64 it carries)
# and `timeout_s: 480`, which leaves room to rerun a part of it: the run stops its stages at DEADLINE_S and
# packs what they wrote into one file under the device's $OUT (a call killed at its limit would return none;
# BUNDLE is set before OUT, which names gpu_check's own folder), e.g.:
#
#   pip install -q --no-index --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD &&
#   BUNDLE=$OUT/gpu-check.tgz OUT=/tmp/gc DEADLINE_S=420 PREBUILT=gpu-inputs/prebuilt ITERS=1 LL128=1 LATENCY=1 \
#     LINEBW=1 bash benchmarks/gpu_check.sh gpu-inputs/shared gpu-inputs/baselines gpu-inputs/ndv2 gpu-inputs/h100
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=1
BATCHES=1
for arg in "$@"; do
  case "$arg" in
    --skip-build) BUILD=0 ;;
    --skip-batches) BATCHES=0 ;;
    *) echo "gpu_prepare.sh: unknown option '$arg' (expected --skip-build, --skip-batches)" >&2; exit 2 ;;
  esac
done
for ignored in /gpu-inputs/ /.whl/; do
  grep -qxF "$ignored" .git/info/exclude 2>/dev/null || echo "$ignored" >> .git/info/exclude
done
mkdir -p gpu-inputs/prebuilt gpu-inputs/shared gpu-inputs/baselines gpu-inputs/ndv2 gpu-inputs/h100 .whl

if [ "$BUILD" = 1 ]; then
  NVCC_PATH=$(command -v nvcc || ls /usr/local/cuda/bin/nvcc 2>/dev/null || true)
  [ -n "$NVCC_PATH" ] || { echo "gpu_prepare.sh: no nvcc here: the CUDA binaries cannot be built" >&2; exit 2; }
  echo "== clean build of the CUDA backend, the tools and the profiler's probes"
  make -C runtime clean > /dev/null
  make -C runtime -j2 build/libtaccl_runtime_cuda.so build/taccl_bench_cuda build/taccl_line_bw > /dev/null
  make -C profiler NVCC="$NVCC_PATH" > /dev/null
  cp runtime/build/libtaccl_runtime_cuda.so runtime/build/taccl_bench_cuda runtime/build/cuda/cuda_backend.o \
    runtime/build/taccl_line_bw profiler/taccl-probe gpu-inputs/prebuilt/
  make -C runtime -j2 > /dev/null  # the rest of the default build (host library, tests), which clean removed
fi

echo "== shared MSCCL files"
if ls ../shared/data/msccl-xml/*.xml > /dev/null 2>&1; then
  cp ../shared/data/msccl-xml/*.xml gpu-inputs/shared/
else
  echo "   ../shared/data/msccl-xml/ not found: gpu-inputs/shared/ left as it is"
fi

echo "== DGX H100 baselines"
baseline() {  # name kind collective nodes proto [instances]
  local extra=()
  [ -n "${6:-}" ] && extra=(--instances "$6")
  python3 -m taccl.cli baseline "$2" -t dgx-h100 -n "$4" -c "$3" --proto "$5" "${extra[@]}" \
    -o "gpu-inputs/baselines/$1.xml" --quiet
}
for n in 1 2; do
  for p in Simple LL LL128; do
    baseline "ring-allgather-n$n-$p" ring allgather "$n" "$p"
    baseline "ring-reducescatter-n$n-$p" ring reducescatter "$n" "$p"
    baseline "ring-allreduce-n$n-$p" ring allreduce "$n" "$p"
    baseline "dbt-allreduce-n$n-$p" double-binary-tree allreduce "$n" "$p"
    baseline "hier-allreduce-n$n-$p" hierarchical allreduce "$n" "$p"
  done
done
baseline ring-allgather-n1-Simple-i8 ring allgather 1 Simple 8
baseline ring-allgather-n1-Simple-i16 ring allgather 1 Simple 16
baseline ring-allgather-n1-LL128-i8 ring allgather 1 LL128 8
baseline ring-reducescatter-n1-Simple-i8 ring reducescatter 1 Simple 8
baseline ring-allreduce-n1-Simple-i8 ring allreduce 1 Simple 8

if [ "$BATCHES" = 1 ]; then
  work=$(mktemp -d)
  trap 'rm -rf "$work"' EXIT
  echo "== the NDv2 SKU's files (about a minute)"
  python3 -m taccl.cli batch sketches/skus/ndv2.yaml -o "$work/ndv2" --no-plots -q
  rm -f gpu-inputs/ndv2/*.xml
  cp "$work"/ndv2/msccl-algorithms/*.xml gpu-inputs/ndv2/
  echo "== the DGX H100 SKU's files at 2 nodes (about a minute)"
  python3 - "$work/h100-n2.yaml" <<'PY'
import sys
from pathlib import Path
import yaml
src = Path("sketches/skus/dgx-h100.yaml")
sku = yaml.safe_load(src.read_text())
sku["nodes"], sku["name"] = [2], "dgx-h100-n2"
kept = []
for c in sku["candidates"]:
    if 2 not in c.get("nodes", [2]):
        continue
    c.pop("nodes", None)
    c["sketch"] = str((src.parent / c["sketch"]).resolve())
    kept.append(c)
sku["candidates"] = kept
Path(sys.argv[1]).write_text(yaml.safe_dump(sku, sort_keys=False))
PY
  python3 -m taccl.cli batch "$work/h100-n2.yaml" -o "$work/h100" --no-plots -q
  rm -f gpu-inputs/h100/*.xml
  cp "$work"/h100/msccl-algorithms/*.xml gpu-inputs/h100/
fi

echo "== wheels for the device machine's Python (3.12)"
pip download -q --only-binary=:all: --python-version 3.12 --platform manylinux2014_x86_64 -d .whl jsonschema

echo "gpu-inputs: $(ls gpu-inputs/shared | wc -l) shared, $(ls gpu-inputs/baselines | wc -l) baselines," \
  "$(ls gpu-inputs/ndv2 | wc -l) NDv2, $(ls gpu-inputs/h100 | wc -l) DGX H100 files; prebuilt:" \
  "$(ls gpu-inputs/prebuilt | tr '\n' ' ')"
echo "to carry: $(du -sch gpu-inputs .whl | tail -1 | cut -f1)"
