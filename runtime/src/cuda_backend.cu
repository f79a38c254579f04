// CUDA backend: the interpreter core (core.h) compiled by nvcc with a device policy.
//
// One kernel launch per GPU per collective (cooperative launch, so every block is co-resident or the launch
// is refused). Ranks map to GPUs as rank % ndev; several ranks may share one GPU (their blocks share the
// grid). Connection FIFOs and their counters live on the receiver's GPU and the sender writes them through
// peer access. Per-block flags live on the block's GPU. A block that has waited through the timeout with no
// progress (no post on its GPU, no change of what it polls) sets a shared abort flag (host-mapped memory,
// visible to every GPU) and records what it waited for, so the host can report the same message as the
// host backend.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <array>
#include <cstdlib>
#include <cstring>
#include <list>
#include <memory>
#include <mutex>
#include <set>
#include <sstream>
#include <stdexcept>

#include "launch_pool.h"
#include "plan.h"

namespace taccl {
namespace {

// Threads of a block: the most of these that lets every block of the grid be co-resident (cooperative
// launch). More threads keep more bytes in flight per connection.
constexpr int kMaxThreads = 512;
constexpr int kThreadChoices[] = {512, 256, 128};

struct DevCtl {
  volatile int* abort;    // host-mapped, shared by all GPUs
  WaitInfo* waits;        // host-mapped, one per block (global index)
  int* waitActive;        // host-mapped, one per block
  const int* blockMap;    // this GPU's grid index -> global block index
  unsigned long long* progress;  // this GPU's posts so far (device memory): the watchdog's sign of life
  unsigned long long timeoutNs;
};

// The watchdog's state in one wait. A wait gives up only after the timeout without progress *and* after
// kMinIdleChecks checks without progress: a kernel that is not running (time-slicing, MPS, a debugger)
// makes no checks, so a long pause of the whole GPU is not taken for a deadlock.
constexpr unsigned kMinIdleChecks = 256;  // each check is 1024 polls: about 0.1-0.5 s of spinning
struct WaitClock {
  unsigned spins = 0, idle = 0;
  unsigned long long start = 0, seen = 0;
};

__device__ __forceinline__ unsigned long long globalTimer() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

// Counters: a FIFO head or tail may be written by another GPU (system scope, unless both ends of the
// connection share a GPU); dependency flags are written and read by blocks of one rank, on one GPU.
__device__ __forceinline__ uint64_t loadAcquire(const uint64_t* p, bool sys) {
  uint64_t v;
  if (sys) asm volatile("ld.acquire.sys.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
  else asm volatile("ld.acquire.gpu.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
  return v;
}
// The counter store of a post: relaxed, after the posting thread's release fence (which follows the block
// barrier that orders every thread's data writes before it).
__device__ __forceinline__ void storeRelaxed(uint64_t* p, uint64_t v, bool sys) {
  if (sys) asm volatile("st.relaxed.sys.global.u64 [%0], %1;" :: "l"(p), "l"(v) : "memory");
  else asm volatile("st.relaxed.gpu.global.u64 [%0], %1;" :: "l"(p), "l"(v) : "memory");
}

// Data loads bypass L1, which is not coherent with other SMs' or GPUs' writes (a FIFO slot is reused every
// nslots calls, and a dependency's data was written by another block).
__device__ __forceinline__ uint4 loadPack(const uint4* p) {
  uint4 v;
  asm volatile("ld.volatile.global.v4.u32 {%0,%1,%2,%3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p) : "memory");
  return v;
}
__device__ __forceinline__ void storePack(uint4* p, uint4 v) {
  asm volatile("st.global.v4.u32 [%0], {%1,%2,%3,%4};" :: "l"(p), "r"(v.x), "r"(v.y), "r"(v.z), "r"(v.w) : "memory");
}
struct DeviceLoads {  // the scalar load scalarMove uses on the GPU
  template <class T> __device__ static T load(const T* p) {
    T v;
    if (sizeof(T) == 1) { uint8_t x = *(const volatile uint8_t*)p; memcpy(&v, &x, 1); }
    else if (sizeof(T) == 2) { uint16_t x = *(const volatile uint16_t*)p; memcpy(&v, &x, 2); }
    else if (sizeof(T) == 4) { uint32_t x = *(const volatile uint32_t*)p; memcpy(&v, &x, 4); }
    else { uint64_t x = *(const volatile uint64_t*)p; memcpy(&v, &x, 8); }
    return v;
  }
};

// Op over the elements packed in two words (a 16-byte pack, an 8-byte LL payload), one element at a time.
template <class T, class Op, class W> __device__ __forceinline__ W reduceWord(W x, W y) {
  constexpr int E = sizeof(W) / sizeof(T);
  T a[E], b[E];
  memcpy(a, &x, sizeof(W));
  memcpy(b, &y, sizeof(W));
#pragma unroll
  for (int e = 0; e < E; ++e) a[e] = Op::apply(a[e], b[e]);
  memcpy(&x, a, sizeof(W));
  return x;
}

// Op over two 16-byte packs. float16/bfloat16 sum and product use the native paired instructions: one
// rounding of the exact result, which is what the host computes (float, then one rounding: exact, as float
// has more than twice the significand bits plus two).
template <class T, class Op> struct PackOp {
  __device__ static uint4 apply(uint4 x, uint4 y) { return reduceWord<T, Op>(x, y); }
};
#define TACCL_HALF2_PACK(T, OP, H2, FN)                             \
  template <> struct PackOp<T, OP<T>> {                             \
    __device__ static uint4 apply(uint4 x, uint4 y) {               \
      H2 a[4], b[4];                                                \
      memcpy(a, &x, 16);                                            \
      memcpy(b, &y, 16);                                            \
      _Pragma("unroll") for (int e = 0; e < 4; ++e) a[e] = FN(a[e], b[e]); \
      memcpy(&x, a, 16);                                            \
      return x;                                                     \
    }                                                               \
  };
TACCL_HALF2_PACK(f16, OpSum, __half2, __hadd2)
TACCL_HALF2_PACK(f16, OpProd, __half2, __hmul2)
TACCL_HALF2_PACK(bf16, OpSum, __nv_bfloat162, __hadd2)
TACCL_HALF2_PACK(bf16, OpProd, __nv_bfloat162, __hmul2)
#undef TACCL_HALF2_PACK
// 8-bit integers: four lanes per 32-bit word with the SIMD video instructions (sums wrap, as on the host).
#define TACCL_BYTE4_PACK(T, OP, FN)                                                   \
  template <> struct PackOp<T, OP<T>> {                                               \
    __device__ static uint4 apply(uint4 x, uint4 y) {                                 \
      return make_uint4(FN(x.x, y.x), FN(x.y, y.y), FN(x.z, y.z), FN(x.w, y.w));      \
    }                                                                                 \
  };
TACCL_BYTE4_PACK(int8_t, OpSum, __vadd4)
TACCL_BYTE4_PACK(uint8_t, OpSum, __vadd4)
TACCL_BYTE4_PACK(int8_t, OpMin, __vmins4)
TACCL_BYTE4_PACK(int8_t, OpMax, __vmaxs4)
TACCL_BYTE4_PACK(uint8_t, OpMin, __vminu4)
TACCL_BYTE4_PACK(uint8_t, OpMax, __vmaxu4)
#undef TACCL_BYTE4_PACK

// The data loop of one primitive: 16-byte packs, four loads in flight per thread (four packs of a copy, two
// pairs of a reduction), issued before any store. Pointers that share their offset modulo 16 start with a
// scalar head up to the first aligned pack and end with a scalar tail; other pointers take the scalar loop.
template <class T, class Op, bool Reduce, bool D1, bool D2>
__device__ __forceinline__ void movePacks(const T* a, const T* b, T* d1, T* d2, int64_t n) {
  const int tid = threadIdx.x, nt = blockDim.x;
  const uintptr_t mis = (uintptr_t)a & 15;
  if ((Reduce && ((uintptr_t)b & 15) != mis) || (D1 && ((uintptr_t)d1 & 15) != mis) ||
      (D2 && ((uintptr_t)d2 & 15) != mis)) {
    scalarMove<DeviceLoads, T, Op>(a, b, d1, d2, tid, n, nt);
    return;
  }
  constexpr int E = 16 / sizeof(T);
  int64_t head = (int64_t)((16 - mis) % 16 / sizeof(T));  // elements before the first aligned pack
  if (head > n) head = n;
  const int64_t npacks = (n - head) / E;
  const int64_t tailStart = head + npacks * E;
  scalarMove<DeviceLoads, T, Op>(a, b, d1, d2, tid, head, nt);
  scalarMove<DeviceLoads, T, Op>(a + tailStart, b ? b + tailStart : nullptr, D1 ? d1 + tailStart : nullptr,
                                 D2 ? d2 + tailStart : nullptr, tid, n - tailStart, nt);
  const uint4* pa = (const uint4*)(a + head);
  const uint4* pb = Reduce ? (const uint4*)(b + head) : nullptr;
  uint4* p1 = D1 ? (uint4*)(d1 + head) : nullptr;
  uint4* p2 = D2 ? (uint4*)(d2 + head) : nullptr;
  constexpr int kUnroll = Reduce ? 2 : 4;
  int64_t p = tid;
  for (; p + (int64_t)(kUnroll - 1) * nt < npacks; p += (int64_t)kUnroll * nt) {
    uint4 x[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) x[u] = loadPack(pa + p + u * nt);
    if (Reduce) {
      uint4 y[kUnroll];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) y[u] = loadPack(pb + p + u * nt);
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) x[u] = PackOp<T, Op>::apply(x[u], y[u]);
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      if (D1) storePack(p1 + p + u * nt, x[u]);
      if (D2) storePack(p2 + p + u * nt, x[u]);
    }
  }
  for (; p < npacks; p += nt) {
    uint4 x = loadPack(pa + p);
    if (Reduce) x = PackOp<T, Op>::apply(x, loadPack(pb + p));
    if (D1) storePack(p1 + p, x);
    if (D2) storePack(p2 + p, x);
  }
}

// LL lines: 16 bytes = {payload bytes 0-3, flag, payload bytes 4-7, flag}, written by one 16-byte store. The
// flag is repeated so that a reader that sees both halves with the call's flag has the whole payload.
__device__ __forceinline__ void storeLine(uint4* p, uint64_t x, uint32_t flag) {
  asm volatile("st.volatile.global.v4.u32 [%0], {%1,%2,%3,%4};" ::"l"(p), "r"((uint32_t)x), "r"(flag),
               "r"((uint32_t)(x >> 32)), "r"(flag) : "memory");
}
// Up to 8 payload bytes of a plain buffer: one 8-byte load when aligned and whole, else byte by byte (a
// misaligned pointer or the last, partial line).
__device__ __forceinline__ uint64_t loadPayload(const char* p, int bytes) {
  if (bytes == 8 && ((uintptr_t)p & 7) == 0) return *(const volatile uint64_t*)p;
  uint64_t x = 0;
  for (int i = 0; i < bytes; ++i) x |= (uint64_t)*(const volatile uint8_t*)(p + i) << (8 * i);
  return x;
}
__device__ __forceinline__ void storePayload(char* p, uint64_t x, int bytes) {
  if (bytes == 8 && ((uintptr_t)p & 7) == 0) { *(uint64_t*)p = x; return; }
  for (int i = 0; i < bytes; ++i) p[i] = (char)(x >> (8 * i));
}
struct DeviceBackend {
  DevCtl ctl;
  int g;

  static constexpr bool kLines = true;

  // Called on every spin of a wait with the value it polled; every 1024 spins it checks whether the wait
  // must stop: another block aborted the run, or nothing progressed through the timeout (then it aborts
  // the run). Progress is any post on this GPU or a change of the polled value (another GPU's post). A
  // stopping wait records what it waited for, so the host's message names every waiting block.
  __device__ bool keepWaiting(WaitClock& c, uint64_t polled, const WaitInfo& w) {
    if ((++c.spins & 1023) != 0) return true;
    const unsigned long long now = globalTimer();
    // both counters only grow, so their sum changes exactly when one of them does
    const unsigned long long mark = *(volatile unsigned long long*)ctl.progress + polled;
    if (!c.start || mark != c.seen) {
      c.start = now;
      c.seen = mark;
      c.idle = 0;
    } else {
      c.idle++;
    }
    if (!*ctl.abort && (now - c.start <= ctl.timeoutNs || c.idle < kMinIdleChecks)) return true;
    *ctl.abort = 1;
    ctl.waits[g] = w;
    __threadfence_system();
    ctl.waitActive[g] = 1;
    return false;
  }

  __device__ bool endWork(bool ok) { return __syncthreads_and(ok) != 0; }

  // Into this SM's L1, one 128-byte line per thread: the tables are read with plain (L1-cached) loads.
  __device__ void prefetch(const void* p, int64_t bytes) {
    const uintptr_t first = (uintptr_t)p & ~(uintptr_t)127, end = (uintptr_t)p + (uintptr_t)bytes;
    for (uintptr_t line = first + (uintptr_t)threadIdx.x * 128; line < end; line += (uintptr_t)blockDim.x * 128)
      asm volatile("prefetch.global.L1 [%0];" ::"l"(line));
  }

  // Wait (this thread alone) until a line carries `flag`; false when the run was aborted or timed out.
  __device__ bool readLine(const uint4* p, uint32_t flag, const WaitInfo& w, uint64_t& x) {
    uint4 v;
    WaitClock clock;
    while (v = loadPack(p), v.y != flag || v.w != flag)
      if (!keepWaiting(clock, 0, w)) return false;
    x = (uint64_t)v.x | ((uint64_t)v.z << 32);
    return true;
  }

  // move() with flagged lines (kind 1 LL, 2 LL128); a is a FIFO slot of lines when aLines, d2 always is.
  template <class T, class Op>
  __device__ bool moveLines(int kind, const T* a, bool aLines, const T* b, T* d1, T* d2, int64_t n,
                            uint32_t inFlag, uint32_t outFlag, const WaitInfo& w) {
    if (kind == 2) return moveLines128<T, Op>(a, aLines, b, d1, d2, n, inFlag, outFlag, w);
    // LL: each thread takes whole lines (8 payload bytes, whole elements since 8 is a multiple of every
    // element size)
    const int64_t bytes = n * (int64_t)sizeof(T);
    const int64_t nlines = (bytes + 7) / 8;
    for (int64_t k = threadIdx.x; k < nlines; k += blockDim.x) {
      const int64_t off = k * 8;
      const int valid = bytes - off < 8 ? (int)(bytes - off) : 8;
      uint64_t x;
      if (aLines) {
        if (!readLine((const uint4*)a + k, inFlag, w, x)) return false;
      } else {
        x = loadPayload((const char*)a + off, valid);
      }
      if (b) x = reduceWord<T, Op>(x, loadPayload((const char*)b + off, valid));
      if (d1) storePayload((char*)d1 + off, x, valid);
      if (d2) storeLine((uint4*)d2 + k, x, outFlag);
    }
    return true;
  }

  // LL128 (NCCL's layout): a 128-byte line is 15 payload words and a flag word, written by 8 consecutive
  // threads of a warp with one 16-byte store each (thread j holds words 2j and 2j+1, thread 7 the flag).
  // Stores of one warp instruction to one 128-byte line reach memory together, so once a reader has seen
  // the flag it reads the payload: no fence, no head counter. That needs one store instruction: the warp is
  // made converged before its stores (the partial words before them diverge), else the flag's thread could
  // store ahead of the payload's (a GPU sweep caught that). And the reader takes the payload from a second
  // load after its flags matched (as NCCL does), not from the load that saw them: the lanes of one load may
  // read the line's sectors at different moments of the write. A warp takes 4 lines a round, kLines128Unroll
  // rounds at once, all loaded before any is stored; the loop and its votes are warp-uniform (lanes without
  // a line vote too). One round: four on one H200 moved 10% more at 16-64 MiB but forwarded a ring's data
  // four times coarser (8-rank ring AllGather 1 KiB +5 us, one channel at 256 KiB +9 us).
  static constexpr int kLines128Unroll = 1;
  template <class T, class Op>
  __device__ bool moveLines128(const T* a, bool aLines, const T* b, T* d1, T* d2, int64_t n, uint32_t inFlag,
                               uint32_t outFlag, const WaitInfo& w) {
    constexpr unsigned kFull = 0xffffffffu;
    constexpr int U = kLines128Unroll;
    const int64_t bytes = n * (int64_t)sizeof(T);
    const int64_t nlines = (bytes + 119) / 120;
    const int lane = threadIdx.x & 31, j = lane & 7;
    const int64_t warps = blockDim.x >> 5;
    for (int64_t base = (threadIdx.x >> 5) * 4 * U; base < nlines; base += warps * 4 * U) {
      int64_t k[U], off[U];
      int v0[U], v1[U];
      bool have[U];
      uint64_t x0[U], x1[U];
#pragma unroll
      for (int u = 0; u < U; ++u) {
        k[u] = base + 4 * u + (lane >> 3);
        have[u] = k[u] < nlines;
        off[u] = k[u] * 120 + 16 * j;  // this thread's first payload byte
        const int64_t left = bytes - off[u];
        v0[u] = !have[u] || left <= 0 ? 0 : left < 8 ? (int)left : 8;                    // bytes of word 2j
        v1[u] = j == 7 || !have[u] || left <= 8 ? 0 : left < 16 ? (int)(left - 8) : 8;  // of word 2j+1
        x0[u] = x1[u] = 0;
      }
      if (aLines) {
        WaitClock clock;
        for (;;) {
          bool stale = false;  // only the flag's lanes poll
#pragma unroll
          for (int u = 0; u < U; ++u)
            if (have[u] && j == 7) {
              const uint4 v = loadPack((const uint4*)((const char*)a + k[u] * 128) + j);
              stale |= ((uint64_t)v.z | ((uint64_t)v.w << 32)) != (uint64_t)inFlag;
            }
          if (!__any_sync(kFull, stale)) break;
          if (__any_sync(kFull, !keepWaiting(clock, 0, w))) return false;
        }
#pragma unroll
        for (int u = 0; u < U; ++u) {
          if (!have[u]) continue;
          const uint4 v = loadPack((const uint4*)((const char*)a + k[u] * 128) + j);
          x0[u] = (uint64_t)v.x | ((uint64_t)v.y << 32);
          x1[u] = (uint64_t)v.z | ((uint64_t)v.w << 32);
        }
      } else {
#pragma unroll
        for (int u = 0; u < U; ++u) {
          if (v0[u]) x0[u] = loadPayload((const char*)a + off[u], v0[u]);
          if (v1[u]) x1[u] = loadPayload((const char*)a + off[u] + 8, v1[u]);
        }
      }
      if (b) {
#pragma unroll
        for (int u = 0; u < U; ++u) {
          if (v0[u]) x0[u] = reduceWord<T, Op>(x0[u], loadPayload((const char*)b + off[u], v0[u]));
          if (v1[u]) x1[u] = reduceWord<T, Op>(x1[u], loadPayload((const char*)b + off[u] + 8, v1[u]));
        }
      }
      if (d1) {
#pragma unroll
        for (int u = 0; u < U; ++u) {
          if (v0[u]) storePayload((char*)d1 + off[u], x0[u], v0[u]);
          if (v1[u]) storePayload((char*)d1 + off[u] + 8, x1[u], v1[u]);
        }
      }
      if (!d2) continue;
      __syncwarp();
#pragma unroll
      for (int u = 0; u < U; ++u)
        if (have[u])
          asm volatile("st.volatile.global.v2.u64 [%0], {%1,%2};" ::"l"((uint4*)((char*)d2 + k[u] * 128) + j),
                       "l"(x0[u]), "l"(j == 7 ? (uint64_t)outFlag : x1[u]) : "memory");
    }
    return true;
  }

  __device__ void countProgress() {
    asm volatile("red.relaxed.gpu.global.add.u64 [%0], 1;" ::"l"(ctl.progress) : "memory");
  }
  __device__ void postRelaxed(uint64_t* p, uint64_t v, bool sys) {
    if (threadIdx.x != 0) return;
    storeRelaxed(p, v, sys);
    countProgress();
  }

  template <class T, class Op>
  __device__ void move(const T* a, const T* b, T* d1, T* d2, int64_t n) {
    if (b) {
      if (d1 && d2) movePacks<T, Op, true, true, true>(a, b, d1, d2, n);
      else if (d1) movePacks<T, Op, true, true, false>(a, b, d1, d2, n);
      else movePacks<T, Op, true, false, true>(a, b, d1, d2, n);
    } else {
      if (d1 && d2) movePacks<T, Op, false, true, true>(a, b, d1, d2, n);
      else if (d1) movePacks<T, Op, false, true, false>(a, b, d1, d2, n);
      else movePacks<T, Op, false, false, true>(a, b, d1, d2, n);
    }
  }

  // Thread 0 polls with acquire loads; the block barrier hands the value (and the ordering) to the rest.
  __device__ bool waitGE(const uint64_t* p, uint64_t v, bool sys, const WaitInfo& w, uint64_t& seen) {
    __shared__ int ok;
    __shared__ uint64_t value;
    if (threadIdx.x == 0) {
      ok = 1;
      WaitClock clock;
      uint64_t x;
      while ((x = loadAcquire(p, sys)) < v)
        if (!keepWaiting(clock, x, w)) { ok = 0; break; }
      value = x;
    }
    __syncthreads();
    const int r = ok;
    seen = value;
    __syncthreads();  // the shared words are rewritten by the next wait
    return r != 0;
  }
  __device__ void post(uint64_t* p1, uint64_t v1, uint64_t* p2, uint64_t v2, bool sys) {
    if (threadIdx.x != 0) return;
    if (sys) asm volatile("fence.acq_rel.sys;" ::: "memory");
    else asm volatile("fence.acq_rel.gpu;" ::: "memory");
    if (p1) storeRelaxed(p1, v1, sys);
    if (p2) storeRelaxed(p2, v2, sys);
    countProgress();
  }
};

template <class T, template <class> class Op>
__global__ void __launch_bounds__(kMaxThreads, 2) interpreterKernel(LaunchArgs a, DevCtl ctl) {
  const int g = ctl.blockMap[blockIdx.x];
  DeviceBackend be{ctl, g};
  Interpreter<DeviceBackend, T, Op<T>>::runTb(be, a, g);
}

// Holds its stream until the host has queued the whole call (release set) or the limit passed, so that the
// call's events time the GPU's work rather than the host's submission of the launch (nvbandwidth's method;
// nccl-tests' back-to-back calls hide the submission the same way).
__global__ void holdKernel(const volatile int* release, unsigned long long limitNs) {
  const unsigned long long t0 = globalTimer();
  while (!*release && globalTimer() - t0 < limitNs) {
  }
}

// A launch that blocks until its kernel ends would wait for the hold's release, set only after every launch.
bool launchesBlock() {
  static const bool blocking = [] {
    const char* t = std::getenv("CUDA_LAUNCH_BLOCKING");
    return t && std::atoi(t) != 0;
  }();
  return blocking;
}

using KernelFn = void (*)(LaunchArgs, DevCtl);

template <class T, template <class> class Op>
struct KernelOf {
  static constexpr KernelFn value = &interpreterKernel<T, Op>;
};

struct CudaFailure : std::runtime_error {
  using std::runtime_error::runtime_error;
};

void ck(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw CudaFailure(std::string(what) + ": " + cudaGetErrorString(e));
}

// Device allocations released on every exit path.
struct DeviceAllocs {
  std::vector<std::pair<int, void*>> ptrs;
  std::vector<void*> host;
  void* alloc(int dev, size_t bytes) {
    ck(cudaSetDevice(dev), "cudaSetDevice");
    void* p = nullptr;
    ck(cudaMalloc(&p, bytes ? bytes : 1), "cudaMalloc");
    ptrs.push_back({dev, p});
    ck(cudaMemset(p, 0, bytes ? bytes : 1), "cudaMemset");
    return p;
  }
  void release(void* p) {
    for (auto it = ptrs.begin(); it != ptrs.end(); ++it)
      if (it->second == p) {
        cudaSetDevice(it->first);
        cudaFree(p);
        ptrs.erase(it);
        return;
      }
  }
  void* mapped(size_t bytes) {
    void* p = nullptr;
    ck(cudaHostAlloc(&p, bytes, cudaHostAllocMapped | cudaHostAllocPortable), "cudaHostAlloc");
    host.push_back(p);
    memset(p, 0, bytes);
    return p;
  }
  // Streams and events, destroyed on every exit path too.
  std::vector<std::pair<int, cudaStream_t>> streams;
  std::vector<std::pair<int, cudaEvent_t>> events;
  cudaStream_t stream(int dev) {
    cudaStream_t st = nullptr;
    ck(cudaSetDevice(dev), "cudaSetDevice");
    ck(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking), "cudaStreamCreate");
    streams.push_back({dev, st});
    return st;
  }
  cudaEvent_t event(int dev) {
    cudaEvent_t ev = nullptr;
    ck(cudaSetDevice(dev), "cudaSetDevice");
    ck(cudaEventCreate(&ev), "cudaEventCreate");
    events.push_back({dev, ev});
    return ev;
  }
  ~DeviceAllocs() {
    for (auto& e : events) {
      cudaSetDevice(e.first);
      cudaEventDestroy(e.second);
    }
    for (auto& st : streams) {
      cudaSetDevice(st.first);
      cudaStreamSynchronize(st.second);  // nothing may still run on memory freed below
      cudaStreamDestroy(st.second);
    }
    for (auto& d : ptrs) {
      cudaSetDevice(d.first);
      cudaFree(d.second);
    }
    for (void* h : host) cudaFreeHost(h);
  }
};

// Lets GPU a's kernels and copies reach GPU b's memory (already enabled is fine).
void enablePeerAccess(int a, int b) {
  ck(cudaSetDevice(a), "cudaSetDevice");
  cudaError_t e = cudaDeviceEnablePeerAccess(b, 0);
  if (e == cudaErrorPeerAccessAlreadyEnabled) cudaGetLastError();
  else ck(e, "cudaDeviceEnablePeerAccess");
}

template <class V>
V* toDevice(DeviceAllocs& al, int dev, const std::vector<V>& v) {
  V* p = (V*)al.alloc(dev, v.size() * sizeof(V));
  if (!v.empty()) ck(cudaMemcpy(p, v.data(), v.size() * sizeof(V), cudaMemcpyHostToDevice), "cudaMemcpy");
  return p;
}


// The part of a launch that does not change from one call of the same shape to the next: device tables,
// FIFOs, counters, scratch, streams and events. Built once per shape and kept in the handle's CudaCache.
struct PerDev {
  LaunchArgs a{};
  DevCtl ctl{};
  int grid = 0, threads = 0;
  cudaStream_t stream = nullptr;
  cudaEvent_t start = nullptr, stop = nullptr;
  const int* hold = nullptr;  // device view of CudaState::holdRelease
  cudaError_t launch = cudaSuccess;
  char* counters = nullptr;   // flags, progress, and the FIFO heads and tails that live here: zeroed per call
  size_t counterBytes = 0;
  char** bufTable = nullptr;  // device copy of a.bufs
};

struct LaunchShape {
  uint64_t prog;  // Program::uid
  int64_t S, C;
  int M, dtype, op, ndev, lines, direct;
  size_t typeSize;
  int64_t timeoutMs;
  bool operator==(const LaunchShape& o) const {
    return prog == o.prog && S == o.S && C == o.C && M == o.M && dtype == o.dtype && op == o.op && ndev == o.ndev &&
           lines == o.lines && direct == o.direct && typeSize == o.typeSize && timeoutMs == o.timeoutMs;
  }
};

struct CudaState {
  LaunchShape shape{};
  DeviceAllocs al;
  KernelFn kernel = nullptr;
  int ndev = 0, ntbs = 0, R = 0;
  std::vector<PerDev> per;
  std::vector<int> active;  // devices with blocks
  int* abortFlag = nullptr;
  int* holdRelease = nullptr;     // host-mapped: set once every GPU's launch of a call is queued
  WaitInfo* waits = nullptr;
  int* waitActive = nullptr;
  std::vector<char*> scratch;     // per rank, device
  std::vector<Conn> conns;
  std::vector<std::pair<char*, size_t>> lineData;  // LL FIFOs, zeroed when the epoch wraps
  uint64_t callsPerRun = 0;       // most calls one connection makes in a run (LL epochs)
  uint32_t epoch = 0;
  std::vector<char*> uploaded;    // the buffer table the devices hold
  // staging of host buffers: per rank, [in, out] (in place: one span in [0])
  std::vector<std::array<std::pair<char*, size_t>, 2>> staging;

  int devOf(int rank) const { return rank % ndev; }

  // A device buffer of at least `bytes` for rank r's staging slot k, kept for the next call.
  char* stagingBuffer(int r, int k, size_t bytes) {
    auto& slot = staging[r][k];
    if (slot.second < bytes) {
      if (slot.first) al.release(slot.first);
      slot.first = (char*)al.alloc(devOf(r), bytes);
      slot.second = bytes;
    }
    return slot.first;
  }
};

// A FIFO slot's bytes for `payload` bytes of data: LL doubles them (8 of 16), LL128 takes 128 per 120.
int64_t lineSlotBytes(int64_t payload, int lines) {
  if (lines == 1) return 2 * payload;
  if (lines == 2) return (payload + 119) / 120 * 128;
  return payload;
}

// Calls connection c makes per run: its sending block's send-type calls per tile, times the tiles.
uint64_t callsOf(const Plan& plan, int c) {
  for (const TbLaunch& t : plan.tbs)
    if (t.sendConn == c) {
      uint64_t perTile = 0;
      for (int s = 0; s < t.nsteps; ++s) {
        const Step& st = plan.steps[t.firstStep + s];
        if (st.type != ST_NOP && stepSends(st.type)) perTile += (st.cnt + plan.M - 1) / plan.M;
      }
      return perTile * (uint64_t)plan.iters;
    }
  return 0;
}

std::unique_ptr<CudaState> buildState(const Plan& plan, const LaunchShape& shape, KernelFn kernel,
                                      const RunOptions& opt) {
  auto st = std::make_unique<CudaState>();
  CudaState& S = *st;
  S.shape = shape;
  S.kernel = kernel;
  S.ndev = shape.ndev;
  S.R = plan.prog->ngpus;
  S.ntbs = (int)plan.tbs.size();
  const int nconns = (int)plan.conns.size(), ntbs = S.ntbs, lines = shape.lines;
  DeviceAllocs& al = S.al;
  // Peer access for the GPU pairs the program's connections join, both ways (the sender writes the data
  // and head on the receiver's GPU, the receiver the tail on the sender's), and for no other pair.
  std::set<std::pair<int, int>> pairs;
  for (auto& c : plan.conns) {
    const int a = S.devOf(c.sendRank), b = S.devOf(c.recvRank);
    if (a != b) pairs.insert({a, b}), pairs.insert({b, a});
  }
  for (auto [a, b] : pairs) {
    int can = 0;
    ck(cudaDeviceCanAccessPeer(&can, a, b), "cudaDeviceCanAccessPeer");
    if (!can)
      throw CudaFailure("GPU " + std::to_string(a) + " cannot access GPU " + std::to_string(b) +
                        " (peer access), which connections between their ranks need");
    enablePeerAccess(a, b);
  }
  S.scratch.assign(S.R, nullptr);
  S.staging.resize(S.R);
  for (int r = 0; r < S.R; ++r)
    if (plan.scratchElems[r] > 0) S.scratch[r] = (char*)al.alloc(S.devOf(r), (size_t)plan.scratchElems[r] * plan.typeSize);
  // Counters: per device one block that a single memset clears before each call: the flags of every block
  // (indexed globally), the progress counter, then the heads of connections received here and the tails of
  // connections sent from here.
  std::vector<size_t> counterWords(S.ndev, (size_t)(ntbs + 1) * kCounterStride);
  std::vector<size_t> headAt(nconns), tailAt(nconns);
  for (int c = 0; c < nconns; ++c) {
    const int recvDev = S.devOf(plan.conns[c].recvRank), sendDev = S.devOf(plan.conns[c].sendRank);
    headAt[c] = counterWords[recvDev];
    counterWords[recvDev] += kCounterStride;
    tailAt[c] = counterWords[sendDev];
    counterWords[sendDev] += kCounterStride;
  }
  S.per.resize(S.ndev);
  for (int d = 0; d < S.ndev; ++d) {
    S.per[d].counterBytes = counterWords[d] * sizeof(uint64_t);
    S.per[d].counters = (char*)al.alloc(d, S.per[d].counterBytes);
  }
  S.conns.resize(nconns);
  for (int c = 0; c < nconns; ++c) {
    const int recvDev = S.devOf(plan.conns[c].recvRank), sendDev = S.devOf(plan.conns[c].sendRank);
    uint64_t* head = (uint64_t*)S.per[recvDev].counters + headAt[c];
    uint64_t* tail = (uint64_t*)S.per[sendDev].counters + tailAt[c];
    const size_t dataBytes = (size_t)plan.nslots * lineSlotBytes(plan.slotBytes, lines);
    char* data = (char*)al.alloc(recvDev, dataBytes);
    if (lines) S.lineData.push_back({data, dataBytes});
    S.conns[c] = Conn{head, tail, data, plan.conns[c].sendRank, plan.conns[c].recvRank, plan.conns[c].chan,
                      recvDev == sendDev};
    S.callsPerRun = std::max(S.callsPerRun, callsOf(plan, c));
  }
  if (lines && S.callsPerRun >= 0xffffffffull)
    throw CudaFailure("an LL run of " + std::to_string(S.callsPerRun) + " calls on one connection overflows its 32-bit line flags");
  S.abortFlag = (int*)al.mapped(sizeof(int));
  S.holdRelease = (int*)al.mapped(sizeof(int));
  S.waits = (WaitInfo*)al.mapped(sizeof(WaitInfo) * (ntbs ? ntbs : 1));
  S.waitActive = (int*)al.mapped(sizeof(int) * (ntbs ? ntbs : 1));
  for (int d = 0; d < S.ndev; ++d) {
    PerDev& pd = S.per[d];
    std::vector<int> map;
    for (int g = 0; g < ntbs; ++g)
      if (S.devOf(plan.tbs[g].rank) == d) map.push_back(g);
    pd.grid = (int)map.size();
    if (map.empty()) continue;
    S.active.push_back(d);
    ck(cudaSetDevice(d), "cudaSetDevice");
    int perSM = 0, sms = 0, coop = 0;
    ck(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, d), "cudaDeviceGetAttribute");
    ck(cudaDeviceGetAttribute(&coop, cudaDevAttrCooperativeLaunch, d), "cudaDeviceGetAttribute");
    if (!coop) throw CudaFailure("GPU " + std::to_string(d) + " does not support cooperative launch");
    for (int threads : kThreadChoices) {
      ck(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&perSM, kernel, threads, 0), "cudaOccupancy");
      pd.threads = threads;
      if ((int64_t)perSM * sms >= (int64_t)map.size()) break;
    }
    if ((int64_t)perSM * sms < (int64_t)map.size())
      throw CudaFailure("GPU " + std::to_string(d) + " cannot hold " + std::to_string(map.size()) +
                        " co-resident thread blocks (" + std::to_string(perSM) + " per SM of " +
                        std::to_string(pd.threads) + " threads x " + std::to_string(sms) + " SMs)");
    LaunchArgs& a = pd.a;
    a.steps = toDevice(al, d, plan.steps);
    a.tbs = toDevice(al, d, plan.tbs);
    a.ntbs = ntbs;
    a.conns = toDevice(al, d, S.conns);
    a.nslots = plan.nslots;
    a.slotBytes = lineSlotBytes(plan.slotBytes, lines);
    a.lines = lines;
    a.direct = shape.direct;
    pd.bufTable = (char**)al.alloc(d, sizeof(char*) * 3 * S.R);
    a.bufs = pd.bufTable;
    a.flags = (uint64_t*)pd.counters;
    a.S = plan.S;
    a.C = plan.C;
    a.M = plan.M;
    DevCtl& ctl = pd.ctl;
    int* dAbort = nullptr;
    ck(cudaHostGetDevicePointer((void**)&dAbort, S.abortFlag, 0), "cudaHostGetDevicePointer");
    ck(cudaHostGetDevicePointer((void**)&ctl.waits, S.waits, 0), "cudaHostGetDevicePointer");
    ck(cudaHostGetDevicePointer((void**)&ctl.waitActive, S.waitActive, 0), "cudaHostGetDevicePointer");
    ctl.abort = dAbort;
    ck(cudaHostGetDevicePointer((void**)&pd.hold, S.holdRelease, 0), "cudaHostGetDevicePointer");
    ctl.blockMap = toDevice(al, d, map);
    ctl.progress = (unsigned long long*)((uint64_t*)pd.counters + (size_t)ntbs * kCounterStride);
    ctl.timeoutNs = (unsigned long long)opt.timeoutMs * 1000000ull;
    pd.stream = al.stream(d);
    pd.start = al.event(d);
    pd.stop = al.event(d);
  }
  return st;
}

// One run on a prepared state. Throws CudaFailure; a deadlock is reported in the RunReport.
// `pool`: the handle's launcher threads, one per visible GPU (null: threads made for this call).
RunReport runOnState(CudaState& S, const Plan& plan, const std::vector<char*>& userBufs, bool hostBuffers,
                     const RunOptions& opt, LaunchPool* pool) {
  RunReport rep;
  const int R = S.R, ntbs = S.ntbs;
  // Buffers: the user's device pointers, or staged copies of host buffers (in-place aliasing preserved by
  // staging one span that covers both).
  std::vector<char*> bufs = userBufs;
  struct Stage { char* host; char* dev; size_t bytes; };
  std::vector<Stage> stages;
  for (int r = 0; r < R; ++r) {
    if (hostBuffers) {
      char* s = userBufs[r * 3 + BUF_I];
      char* o = userBufs[r * 3 + BUF_O];
      const size_t inB = (size_t)plan.inElems[r] * plan.typeSize, outB = (size_t)plan.outElems[r] * plan.typeSize;
      if (plan.call.inplace) {
        char* lo = s < o ? s : o;
        char* hi = s + inB > o + outB ? s + inB : o + outB;
        char* d = S.stagingBuffer(r, 0, hi - lo);
        stages.push_back({lo, d, (size_t)(hi - lo)});
        bufs[r * 3 + BUF_I] = d + (s - lo);
        bufs[r * 3 + BUF_O] = d + (o - lo);
      } else {
        char* di = S.stagingBuffer(r, 0, inB);
        char* dout = S.stagingBuffer(r, 1, outB);
        stages.push_back({s, di, inB});
        stages.push_back({o, dout, outB});
        bufs[r * 3 + BUF_I] = di;
        bufs[r * 3 + BUF_O] = dout;
      }
    }
    bufs[r * 3 + BUF_S] = S.scratch[r];
  }
  for (auto& st : stages) ck(cudaMemcpy(st.dev, st.host, st.bytes, cudaMemcpyHostToDevice), "cudaMemcpy H2D");
  // LL line flags continue from the last run's, so that lines it left in the FIFOs never match; when the
  // 32-bit flags would wrap, the FIFOs are cleared and the flags start again.
  if (!S.lineData.empty() && (uint64_t)S.epoch + S.callsPerRun >= 0xffffffffull) {
    for (auto& [p, n] : S.lineData) ck(cudaMemset(p, 0, n), "cudaMemset");
    S.epoch = 0;
  }
  *(volatile int*)S.abortFlag = 0;
  memset(S.waitActive, 0, sizeof(int) * (ntbs ? ntbs : 1));
  for (int d : S.active) {
    PerDev& pd = S.per[d];
    ck(cudaSetDevice(d), "cudaSetDevice");
    // the caller's work on its buffers (any stream) and the staging copies are done before the kernel reads
    ck(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
    if (S.uploaded != bufs)
      ck(cudaMemcpy(pd.bufTable, bufs.data(), sizeof(char*) * bufs.size(), cudaMemcpyHostToDevice), "cudaMemcpy");
    ck(cudaMemsetAsync(pd.counters, 0, pd.counterBytes, pd.stream), "cudaMemsetAsync");
    pd.a.epoch = S.epoch;
    pd.launch = cudaSuccess;
  }
  S.uploaded = bufs;
  S.epoch += (uint32_t)(S.callsPerRun + 1);
  // Each GPU's kernel is launched by its own host thread: the kernels wait for each other, so a launch
  // that blocks until its kernel ends (CUDA_LAUNCH_BLOCKING=1, a serialising tool) must not hold back
  // the next GPU's launch. A failed launch sets the abort flag, so the kernels already running stop at
  // their next wait instead of spinning until the watchdog.
  const bool hold = opt.hold && !launchesBlock();
  *(volatile int*)S.holdRelease = 0;
  auto launch = [&](int d) {
    PerDev& pd = S.per[d];
    void* args[] = {&pd.a, &pd.ctl};
    cudaError_t e = cudaSetDevice(d);
    if (e == cudaSuccess && hold) {
      holdKernel<<<1, 1, 0, pd.stream>>>(pd.hold, (unsigned long long)opt.timeoutMs * 1000000ull);
      e = cudaGetLastError();
    }
    if (e == cudaSuccess) e = cudaEventRecord(pd.start, pd.stream);
    if (e == cudaSuccess)
      e = opt.cooperative
              ? cudaLaunchCooperativeKernel((const void*)S.kernel, dim3(pd.grid), dim3(pd.threads), args, 0, pd.stream)
              : cudaLaunchKernel((const void*)S.kernel, dim3(pd.grid), dim3(pd.threads), args, 0, pd.stream);
    if (e == cudaSuccess) e = cudaEventRecord(pd.stop, pd.stream);
    if (e != cudaSuccess) {
      pd.launch = e;
      *(volatile int*)S.abortFlag = 1;
    }
  };
  const int nactive = (int)S.active.size();
  std::unique_ptr<LaunchPool> own;  // without the handle's: this call's (threads for GPUs 1.., none for one)
  if (!pool) pool = (own = std::make_unique<LaunchPool>(nactive)).get();
  pool->run(nactive, [&](int i) { launch(S.active[i]); });
  *(volatile int*)S.holdRelease = 1;  // every launch is queued (or failed): the GPUs start
  // The call's time: the longest kernel, timed by CUDA events on its GPU.
  rep.elapsedUs = 0;
  std::string failure;
  for (int d : S.active) {
    PerDev& pd = S.per[d];
    ck(cudaSetDevice(d), "cudaSetDevice");
    cudaError_t e = pd.launch != cudaSuccess ? pd.launch : cudaStreamSynchronize(pd.stream);
    if (e != cudaSuccess) {
      if (failure.empty())
        failure = "GPU " + std::to_string(d) + (pd.launch != cudaSuccess ? " launch: " : " kernel: ") +
                  cudaGetErrorString(e);
      continue;
    }
    float ms = 0;
    ck(cudaEventElapsedTime(&ms, pd.start, pd.stop), "cudaEventElapsedTime");
    rep.elapsedUs = std::max(rep.elapsedUs, ms * 1000.0);
  }
  if (!failure.empty()) throw CudaFailure(failure);
  if (*S.abortFlag) {
    std::ostringstream o;
    int n = 0;
    for (int g = 0; g < ntbs; ++g) n += S.waitActive[g] != 0;
    o << plan.prog->path << ": deadlock: the watchdog stopped the program after " << opt.timeoutMs
      << " ms without progress; " << n << " thread block" << (n == 1 ? "" : "s") << " wait:";
    for (int g = 0, shown = 0; g < ntbs && shown < 32; ++g)
      if (S.waitActive[g]) { o << "\n  " << describeWait(plan, g, S.waits[g]); shown++; }
    rep.outcome = Outcome::Deadlock;
    rep.message = o.str();
    return rep;
  }
  for (auto& st : stages) ck(cudaMemcpy(st.host, st.dev, st.bytes, cudaMemcpyDeviceToHost), "cudaMemcpy D2H");
  return rep;
}

}  // namespace

struct CudaCache {
  std::mutex mu;
  std::list<std::unique_ptr<CudaState>> states;  // most recently used first
  // Launch shapes kept: a job cycles through a few sizes and collectives; each state holds its FIFOs.
  static constexpr size_t kMaxStates = 8;
  std::unique_ptr<LaunchPool> launchers;  // one thread per GPU, made by the first call on several GPUs
};

CudaCache* newCudaCache() { return new CudaCache(); }
void freeCudaCache(CudaCache* cache) { delete cache; }

bool cudaAvailable() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
}

bool cudaMemcpyUs(int64_t bytes, int iters, double* us) {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess || n < 1) return false;
  const int dst = n > 1 ? 1 : 0;
  try {
    DeviceAllocs al;
    void* a = al.alloc(0, (size_t)bytes);
    void* b = al.alloc(dst, (size_t)bytes);
    if (dst != 0) enablePeerAccess(0, dst);
    cudaEvent_t e0 = al.event(0), e1 = al.event(0);  // leaves device 0 current
    ck(cudaMemcpy(b, a, (size_t)bytes, cudaMemcpyDefault), "cudaMemcpy");
    ck(cudaEventRecord(e0), "cudaEventRecord");
    for (int i = 0; i < iters; ++i) ck(cudaMemcpyAsync(b, a, (size_t)bytes, cudaMemcpyDefault), "cudaMemcpyAsync");
    ck(cudaEventRecord(e1), "cudaEventRecord");
    ck(cudaEventSynchronize(e1), "cudaEventSynchronize");
    float ms = 0;
    ck(cudaEventElapsedTime(&ms, e0, e1), "cudaEventElapsedTime");
    *us = ms * 1000.0 / iters;
    return true;
  } catch (const CudaFailure&) {
    return false;
  }
}

RunReport runCuda(const Plan& plan, const std::vector<char*>& userBufs, bool hostBuffers, const RunOptions& opt,
                  CudaCache* cache) {
  RunReport rep;
  std::unique_ptr<CudaState> own;  // the state of a call without a cache
  CudaState* state = nullptr;
  std::unique_lock<std::mutex> lock;
  if (cache) lock = std::unique_lock<std::mutex>(cache->mu);
  try {
    KernelFn kernel = pickInstance<KernelOf>(plan.call.dtype, plan.call.op);
    if (!kernel) throw CudaFailure("unknown data type or reduction operator");
    int visible = 0;
    ck(cudaGetDeviceCount(&visible), "cudaGetDeviceCount");
    const int ndev = opt.cudaDevices > 0 && opt.cudaDevices < visible ? opt.cudaDevices : visible;
    const int R = plan.prog->ngpus;
    // The caller's device buffers must be device memory of the rank's GPU: a wrong pointer would fault and
    // end the CUDA context of the whole process.
    if (!hostBuffers)
      for (int r = 0; r < R; ++r)
        for (int k : {BUF_I, BUF_O}) {
          const char* what = k == BUF_I ? "send" : "receive";
          cudaPointerAttributes at{};
          if (cudaPointerGetAttributes(&at, userBufs[r * 3 + k]) != cudaSuccess) {
            cudaGetLastError();
            at.type = cudaMemoryTypeUnregistered;
          }
          if (at.type == cudaMemoryTypeManaged) continue;
          if (at.type != cudaMemoryTypeDevice)
            throw CudaFailure("rank " + std::to_string(r) + "'s " + what + " buffer is not device memory");
          if (at.device != r % ndev)
            throw CudaFailure("rank " + std::to_string(r) + "'s " + what + " buffer is on GPU " +
                              std::to_string(at.device) + ", but rank " + std::to_string(r) + " runs on GPU " +
                              std::to_string(r % ndev));
        }
    // LL runs its line protocol: every 8 payload bytes travel with their call's flag in one 16-byte store;
    // LL128 its own (120 bytes a 128-byte line) when the ll128 option is on (off by default: its blocks move
    // a quarter of the Simple path's bytes).
    const int lines = plan.prog->proto == Proto::LL ? 1 : plan.prog->proto == Proto::LL128 && opt.ll128 ? 2 : 0;
    const LaunchShape shape{plan.prog->uid, plan.S, plan.C, plan.M, plan.call.dtype, plan.call.op, ndev, lines,
                            opt.direct && !lines,  // LL lines carry their flags in the FIFO slot
                            plan.typeSize, opt.timeoutMs};
    if (cache) {
      auto& list = cache->states;
      for (auto it = list.begin(); it != list.end(); ++it)
        if ((*it)->shape == shape) {
          list.splice(list.begin(), list, it);
          state = list.front().get();
          break;
        }
      if (!state) {
        if (list.size() >= CudaCache::kMaxStates) list.pop_back();
        std::unique_ptr<CudaState> built;
        try {
          built = buildState(plan, shape, kernel, opt);
        } catch (const CudaFailure&) {
          // out of device memory, maybe for the states kept: release them and try once more
          cudaGetLastError();
          list.clear();
          built = buildState(plan, shape, kernel, opt);
        }
        list.push_front(std::move(built));
        state = list.front().get();
      }
    } else {
      own = buildState(plan, shape, kernel, opt);
      state = own.get();
    }
    LaunchPool* pool = nullptr;
    if (cache && ndev > 1) {
      if (!cache->launchers || cache->launchers->size() < ndev) cache->launchers = std::make_unique<LaunchPool>(ndev);
      pool = cache->launchers.get();
    }
    rep = runOnState(*state, plan, userBufs, hostBuffers, opt, pool);
    if (rep.outcome != Outcome::Done && cache) cache->states.remove_if([&](auto& s) { return s.get() == state; });
  } catch (const CudaFailure& e) {
    // a failed run may have left its state half-done: never reuse it
    if (cache && state) cache->states.remove_if([&](auto& s) { return s.get() == state; });
    rep.outcome = Outcome::Failed;
    rep.message = std::string("CUDA backend: ") + e.what();
  }
  return rep;
}

}  // namespace taccl
