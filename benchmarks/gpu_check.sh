#!/usr/bin/env bash
# One command for a lent GPU machine (issue 14 part 3): build the CUDA backend from a clean tree (or take a
# prebuilt one), inspect the compiled kernel, run the correctness sweep on the GPU, stop a deadlocking
# program, time the runtime against cudaMemcpy and run the profiler. Every stage has its own time limit and
# its log goes to $OUT (default ./gpu-check-out), so a stage that hangs still leaves what ran.
#
#   benchmarks/gpu_check.sh [PROGRAM_DIR...]          (default: gpu-inputs/*)
#
# The program directories are made here beforehand (benchmarks/gpu_prepare.sh makes all of them, and the
# prebuilt binaries and wheels) and carried to the GPU machine, e.g.:
# gpu-inputs/shared = ../shared/data/msccl-xml/*.xml; gpu-inputs/baselines = `taccl baseline
# ring|double-binary-tree|hierarchical -t dgx-h100 -n 1|2 --proto P [--instances N]`; gpu-inputs/ndv2 = the
# msccl-algorithms/ that `taccl batch sketches/skus/ndv2.yaml` writes.
#
# Environment: PREBUILT=DIR takes libtaccl_runtime_cuda.so, taccl_bench_cuda, cuda_backend.o, taccl-probe and
# (when there) taccl_line_bw from DIR (built elsewhere from a clean tree with the same nvcc) instead of
# building here; SWEEP=0 skips the sweeps; ITERS runs per case (default 2); LARGE="FILES" sweeps them at 256
# MiB and 1 GiB; BENCH="FILES" runs taccl_bench on them (BENCH_MAX bytes, BENCH_CHECK=0|1) with direct
# transfers on and off (DIRECT_AB=0: on only) and cudaMemcpy; CALLS="FILES" times whole calls on device
# buffers with the backend's state kept and rebuilt (benchmarks/runtime_calls.py); LL128=1 sweeps the LL128
# programs with the LL128 line protocol on (TACCL_RUNTIME_LL128=1, off by default) and benches the FILES of
# LL128_BENCH with it off and on; PROFILE=1 runs `taccl profile --quick`; LATENCY=1 takes a small call's time
# apart (benchmarks/runtime_latency.py); LINEBW=1 times one connection's FIFO per protocol and line variant
# without the interpreter, and one line's round trips (runtime/tools/line_bw.cu; LINEBW_ARGS adds options to
# the first); SMALL_S, MEDIUM_S, LARGE_S, BENCH_S, LATENCY_S, LINEBW_S are the stages' time limits in seconds.
# DEADLINE_S=N bounds the whole run: each stage's limit is cut to what is left of N (less 20 s to finish) and a
# stage with less than 10 s left is skipped and said so, so that a run inside a device call's limit (a call
# killed at its limit returns none of the files) still ends with its files; BUNDLE=FILE.tgz packs $OUT into
# one file (outside $OUT) at the end, however the script ends (the device tool returns at most 8 files).
set -uo pipefail
OUT=${OUT:-gpu-check-out}
mkdir -p "$OUT"
DIRS=("$@")
[ ${#DIRS[@]} -eq 0 ] && DIRS=(gpu-inputs/*)
SWEEP_CMD="python3 benchmarks/runtime_sweep.py --backend cuda"
START=$SECONDS
log() { echo "== $* ($(date +%T))" | tee -a "$OUT/summary.txt"; }
# A stage's time limit: WANT seconds, cut to what DEADLINE_S leaves (at least 1: `timeout 0` never stops).
limit() {
  local want=$1 left
  if [ -n "${DEADLINE_S:-}" ]; then
    left=$((DEADLINE_S - (SECONDS - START) - 20))
    [ "$left" -lt "$want" ] && want=$left
  fi
  [ "$want" -lt 1 ] && want=1
  echo "$want"
}
# Log a stage's start; false (the stage is skipped, and the summary says so) when the deadline leaves < 10 s.
stage() {
  if [ -n "${DEADLINE_S:-}" ] && [ $((DEADLINE_S - (SECONDS - START) - 20)) -lt 10 ]; then
    log "skipped, DEADLINE_S=$DEADLINE_S reached: $*"
    return 1
  fi
  log "$*"
}
bundle() { if [ -n "${BUNDLE:-}" ]; then tar czf "$BUNDLE" -C "$(dirname "$OUT")" "$(basename "$OUT")"; fi; }
trap bundle EXIT
# Run a sweep under a time limit; its table goes to $OUT/NAME.txt and its last line to the summary.
sweep() {
  local name=$1 limit=$2
  shift 2
  timeout "$(limit "$limit")" $SWEEP_CMD "$@" > "$OUT/$name.txt" 2>&1
  echo "exit $?" | tee -a "$OUT/summary.txt"
  tail -1 "$OUT/$name.txt" | tee -a "$OUT/summary.txt"
}

{
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv
  nvcc --version | tail -2
} > "$OUT/machine.txt" 2>&1
cat "$OUT/machine.txt"

if [ -n "${PREBUILT:-}" ]; then
  log "prebuilt binaries from $PREBUILT"
  mkdir -p runtime/build/cuda
  cp "$PREBUILT"/libtaccl_runtime_cuda.so "$PREBUILT"/taccl_bench_cuda runtime/build/ &&
    cp "$PREBUILT"/cuda_backend.o runtime/build/cuda/ && cp "$PREBUILT"/taccl-probe profiler/ ||
    { echo "missing prebuilt files"; exit 1; }
  [ -f "$PREBUILT"/taccl_line_bw ] && cp "$PREBUILT"/taccl_line_bw runtime/build/
else
  log build
  make -C runtime clean > /dev/null
  CUDA_ARCHS=${CUDA_ARCHS:-90} timeout "$(limit 300)" make -C runtime -j16 build/libtaccl_runtime_cuda.so \
    build/taccl_bench_cuda build/taccl_line_bw > "$OUT/build.log" 2>&1 || { tail -30 "$OUT/build.log"; exit 1; }
  make -C profiler NVCC="$(command -v nvcc)" > "$OUT/profiler-build.log" 2>&1
fi

# What the data loop compiled to: 128-bit global loads and stores, fences, local memory.
if command -v cuobjdump > /dev/null; then
  cuobjdump -sass runtime/build/cuda/cuda_backend.o > "$OUT/sass-all.txt" 2>&1
  awk '/Function : /{p = ($0 ~ /interpreterKernelIfNS_5OpSum/)} p' "$OUT/sass-all.txt" > "$OUT/sass-float-sum.txt"
  rm "$OUT/sass-all.txt"
  echo "float/sum kernel SASS: $(grep -c 'LDG.E.128' "$OUT/sass-float-sum.txt") LDG.E.128," \
    "$(grep -c 'STG.E.128' "$OUT/sass-float-sum.txt") STG.E.128, $(grep -c 'MEMBAR' "$OUT/sass-float-sum.txt") MEMBAR," \
    "$(grep -cE 'LDL|STL' "$OUT/sass-float-sum.txt") local loads/stores" | tee -a "$OUT/summary.txt"
fi

if [ "${SWEEP:-1}" = 1 ] &&
  stage "sweep: 1 KiB, 64 KiB, 1 MiB; float32, float16, bfloat16; in and out of place; ${ITERS:-2} random inputs each"; then
  sweep sweep-small "${SMALL_S:-240}" --sizes 1KiB,64KiB,1MiB --dtypes float32,float16,bfloat16 --iters "${ITERS:-2}" \
    "${DIRS[@]}"
fi

if [ -n "${LL128:-}" ] && stage "LL128 line protocol: sweep of the LL128 programs with it on"; then
  mapfile -t ll128 < <(grep -l 'proto="LL128"' $(for d in "${DIRS[@]}"; do echo "$d"/*.xml; done) 2>/dev/null)
  TACCL_RUNTIME_LL128=1 sweep sweep-ll128 "${SMALL_S:-240}" --sizes 1KiB,64KiB,1MiB --dtypes float32,bfloat16 \
    --iters 2 "${ll128[@]}"
  for f in ${LL128_BENCH:-}; do
    for on in 0 1; do
      echo "# TACCL_RUNTIME_LL128=$on" >> "$OUT/bench-ll128.txt"
      TACCL_RUNTIME_LL128=$on timeout "$(limit "${BENCH_S:-60}")" runtime/build/taccl_bench_cuda -x "$f" -B cuda -b 1024 \
        -e "${BENCH_MAX:-268435456}" -f 4 -w 2 -n 5 -c 1 >> "$OUT/bench-ll128.txt" 2>&1
    done
  done
fi

# A program that deadlocks (both ranks fill their FIFO before receiving) must be stopped by the watchdog with
# the waiting blocks named, not hang the GPU.
if stage "watchdog"; then
( time timeout "$(limit 60)" python3 -m taccl.cli run runtime/tests/data/bad_fifo_deadlock.xml --backend cuda --size 96 \
    --dtype int32 --timeout-ms 300 ) > "$OUT/watchdog.txt" 2>&1
echo "exit $? (1 expected: deadlock)" | tee -a "$OUT/summary.txt"
grep -E "deadlock|real" "$OUT/watchdog.txt" | head -3 | tee -a "$OUT/summary.txt"
fi

# The device-buffer entry point (tacclRun) with the caller's own GPU buffers (CuPy), and a host pointer passed
# as a device buffer, which must be refused with a message rather than fault the process.
if stage "device buffers"; then
timeout "$(limit 60)" python3 - > "$OUT/device-buffers.txt" 2>&1 <<'PY'
import ctypes
import glob
import cupy as cp
from taccl import runtime as trt
lib = trt._lib(cuda=True)
R, count = 8, 1 << 16
with trt.Runtime(backend="cuda") as rt:
    idx = rt.load(sorted(glob.glob("gpu-inputs/baselines/ring-allreduce-n1-Simple.xml"))[0])
    inputs = trt.make_inputs("allreduce", "float32", "sum", R, count, seed=3)
    ref = trt.reference("allreduce", "float32", "sum", inputs)
    send = [cp.asarray(x) for x in inputs]
    recv = [cp.zeros(count, cp.float32) for _ in range(R)]
    arr = lambda ptrs: (ctypes.c_void_p * R)(*ptrs)
    res = trt._RunResult()
    st = lib.tacclRun(rt._h, idx, 2, 8, 0, R, count, arr([a.data.ptr for a in send]), arr([a.data.ptr for a in recv]),
                      0, ctypes.byref(res))
    wrong = sum(int((cp.asnumpy(recv[r]) != ref[r]).sum()) for r in range(R))
    print(f"device buffers: status {st} outcome {res.outcome} wrong elements {wrong} time {res.elapsedUs:.1f} us")
    st = lib.tacclRun(rt._h, idx, 2, 8, 0, R, count, arr([x.ctypes.data for x in inputs]),
                      arr([a.data.ptr for a in recv]), 0, ctypes.byref(res))
    print(f"host pointer as a device buffer: status {st} outcome {res.outcome}: {rt._error()}")
PY
cat "$OUT/device-buffers.txt" | tee -a "$OUT/summary.txt"
fi

# The kept state freed once cuda_cache is turned off (device memory back to where it was before the handle's
# first call), and a live swap of the handle's program set between two calls.
if stage "cuda_cache off frees the kept state; live swap"; then
timeout "$(limit 60)" python3 - > "$OUT/cache-swap.txt" 2>&1 <<'PY'
import glob
import cupy as cp
from taccl import runtime as trt
free = lambda: cp.cuda.runtime.memGetInfo()[0] >> 20
first, second = (sorted(glob.glob(f"gpu-inputs/baselines/{n}"))[0] for n in
                 ("ring-allgather-n1-LL.xml", "ring-allgather-n1-Simple-i8.xml"))
with trt.Runtime(backend="cuda") as rt:
    before = free()
    idx = rt.load(first)
    inputs = trt.make_inputs("allgather", "float32", "sum", 8, 1 << 20, seed=5)
    out = rt.run_raw("allgather", "float32", "sum", inputs, program=idx)
    kept = free()
    rt._option("cuda_cache", 0)
    rt.run_raw("allgather", "float32", "sum", inputs, program=idx)
    after = free()
    print(f"free device memory: {before} MiB before, {kept} MiB with the state kept, {after} MiB after a call "
          f"with cuda_cache off ({'freed' if before - after <= 8 else 'NOT freed'})")
    rt._option("cuda_cache", 1)
    rt.swap([second])
    out2 = rt.run_raw("allgather", "float32", "sum", inputs)
    ref = trt.reference("allgather", "float32", "sum", inputs)
    print(f"live swap: call {out.call} on generation {out.generation}, call {out2.call} on generation "
          f"{out2.generation}, status {out2.status}, wrong elements {trt.count_wrong(out2.outputs, ref, 'float32')[0]}")
PY
cat "$OUT/cache-swap.txt" | tee -a "$OUT/summary.txt"
fi

if [ -n "${LATENCY:-}" ] &&
  stage "latency: rings of 2-16 ranks at 1 KiB, a call's cost and a hop's (benchmarks/runtime_latency.py)"; then
  timeout "$(limit "${LATENCY_S:-150}")" python3 benchmarks/runtime_latency.py --backend cuda > "$OUT/latency.txt" 2>&1
  echo "exit $?" | tee -a "$OUT/summary.txt"
  cat "$OUT/latency.txt" | tee -a "$OUT/summary.txt"
fi

if [ -n "${LINEBW:-}" ] &&
  stage "one connection's FIFO without the interpreter: protocols and line variants (taccl_line_bw)"; then
  timeout "$(limit "${LINEBW_S:-180}")" runtime/build/taccl_line_bw ${LINEBW_ARGS:-} > "$OUT/line-bw.txt" 2>&1
  echo "exit $?" | tee -a "$OUT/summary.txt"
  sort -k10 -n -r "$OUT/line-bw.txt" | grep -v '^#' | head -5 | tee -a "$OUT/summary.txt"
  timeout "$(limit 60)" runtime/build/taccl_line_bw --pingpong 10000 > "$OUT/line-latency.txt" 2>&1
  echo "exit $?" | tee -a "$OUT/summary.txt"
  sort -k5 -n "$OUT/line-latency.txt" | grep -v '^#' | head -5 | tee -a "$OUT/summary.txt"
fi

if [ "${SWEEP:-1}" = 1 ] && stage "sweep: 16 MiB float32"; then
  sweep sweep-16m "${MEDIUM_S:-150}" --sizes 16MiB --dtypes float32 --iters 1 --only-outofplace "${DIRS[@]}"
fi

if [ -n "${LARGE:-}" ] && stage "sweep: 256 MiB, 1 GiB float32 on $LARGE"; then
  sweep sweep-large "${LARGE_S:-150}" --sizes 256MiB,1GiB --dtypes float32 --iters 1 --only-outofplace $LARGE
fi

if [ -n "${BENCH:-}" ] && stage "taccl_bench on $BENCH"; then
  modes="1 0"
  [ "${DIRECT_AB:-1}" = 0 ] && modes=1
  for f in $BENCH; do
    for direct in $modes; do
      echo "# TACCL_RUNTIME_DIRECT=$direct" >> "$OUT/bench.txt"
      TACCL_RUNTIME_DIRECT=$direct timeout "$(limit "${BENCH_S:-60}")" runtime/build/taccl_bench_cuda -x "$f" -B cuda -b 1024 \
        -e "${BENCH_MAX:-268435456}" -f 4 -w 2 -n 5 -c "${BENCH_CHECK:-1}" >> "$OUT/bench.txt" 2>&1
    done
  done
  python3 - <<'PY' >> "$OUT/bench.txt" 2>&1
import ctypes
from taccl import runtime as trt
lib = trt._lib(cuda=True)
lib.tacclCudaMemcpyUs.restype = ctypes.c_int
lib.tacclCudaMemcpyUs.argtypes = [ctypes.c_int64, ctypes.c_int, ctypes.POINTER(ctypes.c_double)]
for size in (1 << 10, 1 << 20, 1 << 28, 1 << 30):
    us = ctypes.c_double()
    if lib.tacclCudaMemcpyUs(size, 10, ctypes.byref(us)) == 0:
        print(f"cudaMemcpy device to device {size:>12} B {us.value:10.1f} us {size / 1e3 / us.value:9.1f} GB/s")
PY
  grep cudaMemcpy "$OUT/bench.txt" | tee -a "$OUT/summary.txt"
fi

if [ -n "${CALLS:-}" ] && stage "whole calls on device buffers: $CALLS"; then
  timeout "$(limit "${CALLS_S:-90}")" python3 benchmarks/runtime_calls.py $CALLS > "$OUT/calls.txt" 2>&1
  cat "$OUT/calls.txt" | tee -a "$OUT/summary.txt"
fi

if [ -n "${PROFILE:-}" ] && stage "taccl profile --quick"; then
  ( time timeout "$(limit 120)" python3 -m taccl.cli profile --quick --out "$OUT/profiled-topology.json" ) > "$OUT/profile.txt" 2>&1
  tail -25 "$OUT/profile.txt"
fi
log done
