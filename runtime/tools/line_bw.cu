// taccl_line_bw: what one thread block moves through one connection's FIFO, per protocol and per variant of
// the line code, on one GPU, with the interpreter taken out (issue 14).
//
// The runtime's LL and LL128 line paths both stopped near 10-12 GB/s of wire bytes per block on an H200 while
// its Simple path moved about 38 GB/s (benchmarks/results/gpu-2-2026-11-27/). Here a producer block fills
// FIFO slots from a source buffer and a consumer block drains them into a destination buffer with the
// runtime's slot credits (the consumer's thread 0 posts a tail after a block barrier, the producer's thread 0
// polls it once the FIFO is full), as one connection of the runtime does, and each variant is timed:
//
//   U       lines (Simple: 16-byte packs) each thread has in flight per round: 1, 2, 4, 8 (LL128: up to 4, each
//           round 4 lines a warp, 16 at 4 as NCCL)
//   store   the line stores' qualifier: volatile (the runtime's), relaxed.sys, weak (plain st.global)
//   load    the polls' and source loads' qualifier: volatile (the runtime's), relaxed.sys, weak (ld.global.cg)
//   reread  LL128: the payload taken from a second load once the flag lanes saw the flag (the runtime's, and
//           recent NCCL's) or from the load that saw it (older NCCL's)
//
// and, on the options, the threads per block, the payload per call (slot), the slots per FIFO and the number
// of connections (producer/consumer pairs) running at once. Every run checks the destination byte for byte:
// a variant whose line protocol is wrong shows wrong bytes. Times are CUDA events around the launch, the
// median of --iters runs after one warm-up. With --pingpong N it measures latency instead: two blocks bounce
// one line N times per protocol and qualifiers, the floor under the runtime's 1.7 us LL hop (NCCL: 0.75 us
// a hop over NVLink). Exit status: 0, 1 when any run was wrong or hung, 2 on bad options or without a usable
// GPU.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "plan.h"  // the runtime's tile sizes and FIFO depths

namespace {

enum Proto { kSimple = 0, kLL = 1, kLL128 = 2 };  // taccl::Proto's values
enum Qual { kVolatile = 0, kRelaxed = 1, kWeak = 2 };
constexpr int kMaxThreads = 640;  // NCCL's LL128 block; also bounds the registers a thread may take
const char* const kProtoNames[] = {"Simple", "LL", "LL128"};
const char* const kQualNames[] = {"volatile", "relaxed", "weak"};

struct Args {
  const char* src;
  char* dst;
  char* fifo;
  unsigned long long* ctl;  // per pair: head at [16p], tail at [16p + 8] (their own 64-byte lines)
  int* hung;
  long long bytes;          // payload per pair (whole calls)
  long long stride;         // a pair's share of the source and destination buffers
  long long slotPayload;    // payload bytes per call
  long long slotWire;       // FIFO bytes per slot
  int nslots;
  unsigned long long timeoutNs;
};

__device__ __forceinline__ unsigned long long globalTimer() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

template <int Q> __device__ __forceinline__ uint4 load16(const void* p) {
  uint4 v;
  if (Q == kVolatile)
    asm volatile("ld.volatile.global.v4.u32 {%0,%1,%2,%3}, [%4];" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p) : "memory");
  else if (Q == kRelaxed)
    asm volatile("ld.relaxed.sys.global.v4.u32 {%0,%1,%2,%3}, [%4];" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p) : "memory");
  else
    asm volatile("ld.global.cg.v4.u32 {%0,%1,%2,%3}, [%4];" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p) : "memory");
  return v;
}
template <int Q> __device__ __forceinline__ uint64_t load8(const void* p) {
  uint64_t v;
  if (Q == kVolatile) asm volatile("ld.volatile.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
  else if (Q == kRelaxed) asm volatile("ld.relaxed.sys.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
  else asm volatile("ld.global.cg.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
  return v;
}
template <int Q> __device__ __forceinline__ void store16(void* p, uint4 v) {
  if (Q == kVolatile)
    asm volatile("st.volatile.global.v4.u32 [%0], {%1,%2,%3,%4};" ::"l"(p), "r"(v.x), "r"(v.y), "r"(v.z), "r"(v.w) : "memory");
  else if (Q == kRelaxed)
    asm volatile("st.relaxed.sys.global.v4.u32 [%0], {%1,%2,%3,%4};" ::"l"(p), "r"(v.x), "r"(v.y), "r"(v.z), "r"(v.w) : "memory");
  else
    asm volatile("st.global.v4.u32 [%0], {%1,%2,%3,%4};" ::"l"(p), "r"(v.x), "r"(v.y), "r"(v.z), "r"(v.w) : "memory");
}
__device__ __forceinline__ void store8(void* p, uint64_t v) {
  asm volatile("st.global.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
}
__device__ __forceinline__ uint64_t loadAcquire(const unsigned long long* p) {
  uint64_t v;
  asm volatile("ld.acquire.sys.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
  return v;
}
__device__ __forceinline__ void storeRelaxed(unsigned long long* p, uint64_t v) {
  asm volatile("st.relaxed.sys.global.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
}

// A spin's timeout: every 1024 polls, past the limit the run is marked hung and every waiter gives up.
struct Spin {
  unsigned n = 0;
  unsigned long long start = 0;
  __device__ __forceinline__ bool keep(const Args& a) {
    if ((++n & 1023) != 0) return true;
    const unsigned long long now = globalTimer();
    if (!start) start = now;
    if (*(volatile int*)a.hung) return false;
    if (now - start < a.timeoutNs) return true;
    *(volatile int*)a.hung = 1;
    return false;
  }
};

// Thread 0 waits until the counter reaches v; the barrier hands the result to the block.
__device__ __forceinline__ bool blockWait(const Args& a, const unsigned long long* p, uint64_t v) {
  __shared__ int ok;
  if (threadIdx.x == 0) {
    ok = 1;
    Spin s;
    while (loadAcquire(p) < v)
      if (!s.keep(a)) { ok = 0; break; }
  }
  __syncthreads();
  const int r = ok;
  __syncthreads();
  return r != 0;
}

// LL: a 16-byte line {payload 0-3, flag, payload 4-7, flag}; thread t takes lines t, t + nt, ... U at a time.
template <int U, int SQ, int LQ>
__device__ __forceinline__ bool llProduce(const Args& a, const char* src, char* slot, long long n, uint32_t flag) {
  const long long nlines = n / 8, nt = blockDim.x;
  for (long long base = threadIdx.x; base < nlines; base += nt * U) {
    uint64_t x[U];
#pragma unroll
    for (int u = 0; u < U; ++u)
      if (base + u * nt < nlines) x[u] = load8<LQ>(src + (base + u * nt) * 8);
#pragma unroll
    for (int u = 0; u < U; ++u)
      if (base + u * nt < nlines)
        store16<SQ>(slot + (base + u * nt) * 16, make_uint4((uint32_t)x[u], flag, (uint32_t)(x[u] >> 32), flag));
  }
  return true;
}
template <int U, int LQ>
__device__ __forceinline__ bool llConsume(const Args& a, const char* slot, char* dst, long long n, uint32_t flag) {
  const long long nlines = n / 8, nt = blockDim.x;
  for (long long base = threadIdx.x; base < nlines; base += nt * U) {
    uint4 v[U];
#pragma unroll
    for (int u = 0; u < U; ++u) v[u] = make_uint4(0, 0, 0, 0);  // no flag is 0: every line is loaded
    Spin s;
    for (;;) {  // load the lines not yet seen with the flag, all U in flight
      bool stale = false;
#pragma unroll
      for (int u = 0; u < U; ++u)
        if (base + u * nt < nlines && (v[u].y != flag || v[u].w != flag)) {
          v[u] = load16<LQ>(slot + (base + u * nt) * 16);
          stale |= v[u].y != flag || v[u].w != flag;
        }
      if (!stale) break;
      if (!s.keep(a)) return false;
    }
#pragma unroll
    for (int u = 0; u < U; ++u)
      if (base + u * nt < nlines) store8(dst + (base + u * nt) * 8, (uint64_t)v[u].x | ((uint64_t)v[u].z << 32));
  }
  return true;
}

// LL128 (the runtime's layout): a 128-byte line is 15 payload words and a flag word, stored by 8 lanes of a
// warp with one 16-byte store each (lane j: words 2j and 2j+1; lane 7: word 14 and the flag); a warp takes 4
// lines a round, U rounds at once.
template <int U, int SQ, int LQ>
__device__ __forceinline__ bool ll128Produce(const Args& a, const char* src, char* slot, long long n, uint32_t flag) {
  const long long nlines = n / 120, warps = blockDim.x / 32;
  const int lane = threadIdx.x & 31, j = lane & 7;
  for (long long base = (threadIdx.x / 32) * 4 * U; base < nlines; base += warps * 4 * U) {
    uint64_t x0[U], x1[U];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const long long k = base + 4 * u + (lane >> 3);
      if (k >= nlines) continue;
      x0[u] = load8<LQ>(src + k * 120 + 16 * j);
      x1[u] = j == 7 ? (uint64_t)flag : load8<LQ>(src + k * 120 + 16 * j + 8);
    }
    __syncwarp();
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const long long k = base + 4 * u + (lane >> 3);
      if (k < nlines)
        store16<SQ>(slot + k * 128 + 16 * j, make_uint4((uint32_t)x0[u], (uint32_t)(x0[u] >> 32), (uint32_t)x1[u],
                                                         (uint32_t)(x1[u] >> 32)));
    }
  }
  return true;
}
template <int U, int LQ, bool Reread>
__device__ __forceinline__ bool ll128Consume(const Args& a, const char* slot, char* dst, long long n, uint32_t flag) {
  const long long nlines = n / 120, warps = blockDim.x / 32;
  const int lane = threadIdx.x & 31, j = lane & 7;
  for (long long base = (threadIdx.x / 32) * 4 * U; base < nlines; base += warps * 4 * U) {
    uint4 v[U];
    Spin s;
    for (;;) {  // every lane loads, the flag lanes check; with Reread only the flag lanes poll (the runtime's)
      bool stale = false;
#pragma unroll
      for (int u = 0; u < U; ++u) {
        const long long k = base + 4 * u + (lane >> 3);
        if (k < nlines && (!Reread || j == 7)) {
          v[u] = load16<LQ>(slot + k * 128 + 16 * j);
          stale |= j == 7 && (v[u].z != flag || v[u].w != 0);
        }
      }
      if (!__any_sync(0xffffffffu, stale)) break;
      if (__any_sync(0xffffffffu, !s.keep(a))) return false;
    }
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const long long k = base + 4 * u + (lane >> 3);
      if (Reread && k < nlines) v[u] = load16<LQ>(slot + k * 128 + 16 * j);
    }
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const long long k = base + 4 * u + (lane >> 3);
      if (k >= nlines) continue;
      store8(dst + k * 120 + 16 * j, (uint64_t)v[u].x | ((uint64_t)v[u].y << 32));
      if (j != 7) store8(dst + k * 120 + 16 * j + 8, (uint64_t)v[u].z | ((uint64_t)v[u].w << 32));
    }
  }
  return true;
}

// Simple: 16-byte packs, U loads in flight per thread before their stores; the producer publishes a slot
// with a release fence and a head counter, the consumer waits for it.
template <int U>
__device__ __forceinline__ void copyPacks(const char* from, char* to, long long n) {
  const long long npacks = n / 16, nt = blockDim.x;
  for (long long base = threadIdx.x; base < npacks; base += nt * U) {
    uint4 x[U];
#pragma unroll
    for (int u = 0; u < U; ++u)
      if (base + u * nt < npacks) x[u] = load16<kVolatile>(from + (base + u * nt) * 16);
#pragma unroll
    for (int u = 0; u < U; ++u)
      if (base + u * nt < npacks) store16<kWeak>(to + (base + u * nt) * 16, x[u]);
  }
}

// Block 2p produces and block 2p + 1 consumes connection p.
template <int P, int U, int SQ, int LQ, bool Reread>
__global__ void __launch_bounds__(kMaxThreads, 1) connectionKernel(Args a) {
  const int pair = blockIdx.x / 2;
  const bool producer = (blockIdx.x & 1) == 0;
  const char* src = a.src + pair * a.stride;
  char* dst = a.dst + pair * a.stride;
  char* fifo = a.fifo + pair * a.slotWire * a.nslots;
  unsigned long long* head = a.ctl + 16 * pair;
  unsigned long long* tail = head + 8;
  const long long calls = a.bytes / a.slotPayload;
  for (long long c = 0; c < calls; ++c) {
    char* slot = fifo + (c % a.nslots) * a.slotWire;
    const long long off = c * a.slotPayload;
    const uint32_t flag = (uint32_t)(c + 1);
    if (producer) {
      if (c >= a.nslots && !blockWait(a, tail, c - a.nslots + 1)) return;
      if (P == kSimple) {
        copyPacks<U>(src + off, slot, a.slotPayload);
        __syncthreads();
        if (threadIdx.x == 0) {
          asm volatile("fence.acq_rel.sys;" ::: "memory");
          storeRelaxed(head, c + 1);
        }
      } else if (P == kLL) {
        llProduce<U, SQ, LQ>(a, src + off, slot, a.slotPayload, flag);
      } else {
        ll128Produce<U, SQ, LQ>(a, src + off, slot, a.slotPayload, flag);
      }
    } else {
      bool ok = true;
      if (P == kSimple) {
        ok = blockWait(a, head, c + 1);
        if (ok) copyPacks<U>(slot, dst + off, a.slotPayload);
      } else if (P == kLL) {
        ok = llConsume<U, LQ>(a, slot, dst + off, a.slotPayload, flag);
      } else {
        ok = ll128Consume<U, LQ, Reread>(a, slot, dst + off, a.slotPayload, flag);
      }
      if (!__syncthreads_and(ok)) return;
      if (threadIdx.x == 0) storeRelaxed(tail, c + 1);  // the slot's reads are done: a credit
    }
  }
}

// Latency (--pingpong N): blocks 0 and 1, one warp each, bounce one line N times (block 0 pings, block 1
// answers), each protocol's way: LL a 16-byte line from one lane; LL128 a 128-byte line from 8 lanes, its
// flag lane polling (with Reread the payload loaded again after); Simple 16 bytes of data, a release fence and
// a flag, the flag polled with acquire loads and the data read after. Block 0 times the N round trips.
template <int P, int SQ, int LQ, bool Reread>
__global__ void __launch_bounds__(32) pingKernel(Args a, int rounds) {
  const int me = blockIdx.x, lane = threadIdx.x;
  char* inbox = a.fifo + me * 256;
  char* outbox = a.fifo + (1 - me) * 256;
  unsigned long long* inFlag = a.ctl + 8 * me;
  unsigned long long* outFlag = a.ctl + 8 * (1 - me);
  uint4 got = make_uint4(0, 0, 0, 0);
  const unsigned long long t0 = globalTimer();
  for (int k = 0; k < rounds; ++k) {
    const uint32_t flag = (uint32_t)k + 1;
    for (int turn = 0; turn < 2; ++turn) {
      if (turn == me) {  // send: what came in, with this round's flag
        if (P == kLL && lane == 0) store16<SQ>(outbox, make_uint4(got.x, flag, got.z, flag));
        if (P == kLL128 && lane < 8) {
          __syncwarp(0xffu);
          store16<SQ>(outbox + 16 * lane, lane == 7 ? make_uint4(got.x, got.y, flag, 0) : got);
        }
        if (P == kSimple && lane == 0) {
          store16<kWeak>(outbox, got);
          asm volatile("fence.acq_rel.sys;" ::: "memory");
          storeRelaxed(outFlag, flag);
        }
      } else {  // receive
        Spin sp;
        bool ok = true;
        if (P == kLL && lane == 0)
          while (got = load16<LQ>(inbox), got.y != flag || got.w != flag)
            if (!sp.keep(a)) { ok = false; break; }
        if (P == kLL128 && lane < 8) {
          for (;;) {
            if (!Reread || lane == 7) got = load16<LQ>(inbox + 16 * lane);
            if (!__any_sync(0xffu, lane == 7 && got.z != flag)) break;
            if (__any_sync(0xffu, !sp.keep(a))) { ok = false; break; }
          }
          if (Reread) got = load16<LQ>(inbox + 16 * lane);
        }
        if (P == kSimple && lane == 0) {
          while (loadAcquire(inFlag) < flag)
            if (!sp.keep(a)) { ok = false; break; }
          got = load16<kVolatile>(inbox);
        }
        if (!__any_sync(0xffffffffu, !ok)) continue;
        return;
      }
    }
  }
  if (me == 0 && lane == 0) a.ctl[16] = globalTimer() - t0;
}

using KernelFn = void (*)(Args);

struct Variant {
  int proto, u, store, load;
  bool reread;
  KernelFn fn;
  void (*ping)(Args, int);  // the same protocol and qualifiers bouncing one line (U = 1 only)
};

template <int P, int U, int SQ, int LQ, bool R>
void add(std::vector<Variant>& out) {
  void (*ping)(Args, int) = nullptr;
  if constexpr (U == 1) ping = pingKernel<P, SQ, LQ, R>;
  out.push_back({P, U, SQ, LQ, R, connectionKernel<P, U, SQ, LQ, R>, ping});
}
template <int P, int U, int SQ, int LQ>
void addReread(std::vector<Variant>& out) {
  add<P, U, SQ, LQ, false>(out);
  if constexpr (P == kLL128) add<P, U, SQ, LQ, true>(out);
}
template <int P, int U, int SQ>
void addLoads(std::vector<Variant>& out) {
  addReread<P, U, SQ, kVolatile>(out);
  addReread<P, U, SQ, kRelaxed>(out);
  addReread<P, U, SQ, kWeak>(out);
}
template <int P, int U>
void addStores(std::vector<Variant>& out) {
  addLoads<P, U, kVolatile>(out);
  addLoads<P, U, kRelaxed>(out);
  addLoads<P, U, kWeak>(out);
}
template <int P>
void addUnrolls(std::vector<Variant>& out) {
  if constexpr (P == kSimple) {  // the runtime's qualifiers only: volatile loads, weak stores, a head counter
    add<P, 1, kWeak, kVolatile, false>(out);
    add<P, 2, kWeak, kVolatile, false>(out);
    add<P, 4, kWeak, kVolatile, false>(out);
    add<P, 8, kWeak, kVolatile, false>(out);
  } else {
    addStores<P, 1>(out);
    addStores<P, 2>(out);
    addStores<P, 4>(out);
    // LL128 at 8 rounds: 8 lines of 16 bytes a thread, past the registers a 640-thread block may take (spills)
    if constexpr (P == kLL) addStores<P, 8>(out);
  }
}

std::vector<Variant> allVariants() {
  std::vector<Variant> v;
  addUnrolls<kSimple>(v);
  addUnrolls<kLL>(v);
  addUnrolls<kLL128>(v);
  return v;
}

struct Options {
  long long bytes = 64ll << 20;  // payload per connection
  long long slot = 0;            // 0: the protocol's tile (Simple 2 MiB... see protoSlot)
  int nslots = 0;                // 0: the runtime's (Simple 2, LL/LL128 8)
  int threads = 512;
  int pairs = 1;
  int iters = 3;
  std::string protos = "Simple,LL,LL128";
  std::string unrolls = "1,2,4,8";
  bool runtimeOnly = false;  // only the runtime's qualifiers (volatile stores and loads, LL128 reread)
  double timeoutS = 2.0;
  int pingpong = 0;  // > 0: round trips of one line per variant instead of bandwidth
};

// The runtime's payload per call (its tile: NCCL's buffer sizes) and FIFO depth.
long long protoSlot(int p) { return taccl::protoTileBytes((taccl::Proto)p); }
int protoSlots(int p) { return taccl::protoSlots((taccl::Proto)p); }
long long protoUnit(int p) { return p == kSimple ? 16 : p == kLL ? 8 : 120; }
long long wireBytes(int p, long long payload) { return p == kLL ? payload * 2 : p == kLL128 ? payload / 120 * 128 : payload; }
long long slotWire(int p, long long payload) { return (wireBytes(p, payload) + 127) / 128 * 128; }

// The items of a comma-separated list.
std::vector<std::string> items(const std::string& list) {
  std::vector<std::string> out;
  size_t start = 0;
  while (start <= list.size()) {
    size_t end = list.find(',', start);
    if (end == std::string::npos) end = list.size();
    out.push_back(list.substr(start, end - start));
    start = end + 1;
  }
  return out;
}

bool contains(const std::string& list, const std::string& item) {
  const auto all = items(list);
  return std::find(all.begin(), all.end(), item) != all.end();
}

// Whether every item of the comma-separated `list` is one of `allowed`'s.
bool listOf(const std::string& list, const std::string& allowed) {
  for (const std::string& item : items(list))
    if (!contains(allowed, item)) return false;
  return true;
}

void usage() {
  std::fprintf(stderr,
               "usage: taccl_line_bw [--bytes N] [--slot N] [--slots N] [--threads N] [--pairs N] [--iters N]\n"
               "                     [--protos Simple,LL,LL128] [--unrolls 1,2,4,8] [--runtime-only] [--timeout S]\n"
               "                     [--pingpong N]\n"
               "  --bytes    payload per connection (default 64 MiB; rounded down to whole calls)\n"
               "  --slot     payload per call (default: the runtime's tile, Simple 2 MiB, LL 32 KiB, LL128 576000)\n"
               "  --slots    slots per FIFO (default: the runtime's, Simple 2, LL and LL128 8)\n"
               "  --pairs    connections at once, each a producer and a consumer block (default 1)\n"
               "  --runtime-only  only the runtime's qualifiers (volatile line stores and polls, LL128 reread)\n"
               "  --pingpong N    latency instead: two blocks bounce one line N times per variant (one-way time)\n");
}

bool parse(int argc, char** argv, Options& o) {
  for (int i = 1; i < argc; ++i) {
    std::string k = argv[i];
    auto next = [&](const char* what) -> const char* {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "taccl_line_bw: %s needs a value\n", what);
        return nullptr;
      }
      return argv[++i];
    };
    auto number = [&](const char* what, long long lo, long long& out) {
      const char* v = next(what);
      if (!v) return false;
      char* end = nullptr;
      out = std::strtoll(v, &end, 10);
      if (!*v || *end || out < lo) {
        std::fprintf(stderr, "taccl_line_bw: %s must be an integer of at least %lld, got '%s'\n", what, lo, v);
        return false;
      }
      return true;
    };
    long long x = 0;
    if (k == "--bytes") { if (!number("--bytes", 1, o.bytes)) return false; }
    else if (k == "--slot") { if (!number("--slot", 1, o.slot)) return false; }
    else if (k == "--slots") { if (!number("--slots", 1, x)) return false; o.nslots = (int)x; }
    else if (k == "--threads") {
      if (!number("--threads", 32, x)) return false;
      if (x % 32 || x > kMaxThreads) {
        std::fprintf(stderr, "taccl_line_bw: --threads must be a multiple of 32 up to %d\n", kMaxThreads);
        return false;
      }
      o.threads = (int)x;
    }
    else if (k == "--pairs") { if (!number("--pairs", 1, x)) return false; o.pairs = (int)x; }
    else if (k == "--iters") { if (!number("--iters", 1, x)) return false; o.iters = (int)x; }
    else if (k == "--protos" || k == "--unrolls") {
      const char* v = next(k.c_str());
      if (!v) return false;
      const bool protos = k == "--protos";
      if (!listOf(v, protos ? "Simple,LL,LL128" : "1,2,4,8")) {
        std::fprintf(stderr, "taccl_line_bw: %s takes a comma-separated list of %s, got '%s'\n", k.c_str(),
                     protos ? "Simple, LL, LL128" : "1, 2, 4, 8", v);
        return false;
      }
      (protos ? o.protos : o.unrolls) = v;
    }
    else if (k == "--runtime-only") o.runtimeOnly = true;
    else if (k == "--pingpong") { if (!number("--pingpong", 1, x)) return false; o.pingpong = (int)x; }
    else if (k == "--timeout") {
      const char* v = next("--timeout");
      if (!v) return false;
      char* end = nullptr;
      o.timeoutS = std::strtod(v, &end);
      if (!*v || *end || !(o.timeoutS > 0)) {
        std::fprintf(stderr, "taccl_line_bw: --timeout must be a positive number of seconds, got '%s'\n", v);
        return false;
      }
    }
    else if (k == "-h" || k == "--help") { usage(); std::exit(0); }
    else {
      std::fprintf(stderr, "taccl_line_bw: unknown option '%s'\n", k.c_str());
      usage();
      return false;
    }
  }
  return true;
}

// Whether the options ask for this variant.
bool selected(const Variant& v, const Options& o) {
  if (!contains(o.protos, kProtoNames[v.proto]) || !contains(o.unrolls, std::to_string(v.u))) return false;
  return !(o.runtimeOnly && v.proto != kSimple &&
           (v.store != kVolatile || v.load != kVolatile || (v.proto == kLL128 && !v.reread)));
}

#define CK(call)                                                                                   \
  do {                                                                                             \
    cudaError_t e_ = (call);                                                                       \
    if (e_ != cudaSuccess) {                                                                       \
      std::fprintf(stderr, "taccl_line_bw: %s: %s\n", #call, cudaGetErrorString(e_));             \
      std::exit(2);                                                                                \
    }                                                                                              \
  } while (0)

// The one-way time of one line per selected variant (U = 1 rows), median of --iters runs after one warm-up.
int pingTable(const Options& o, const cudaDeviceProp& prop) {
  std::printf("# %s: two blocks bounce one line %d times; one-way time = round trips / 2, median of %d\n", prop.name,
              o.pingpong, o.iters);
  std::printf("%-7s %-9s %-9s %-6s %12s\n", "proto", "store", "load", "reread", "one-way_ns");
  char* fifo;
  unsigned long long* ctl;
  int* hung;
  CK(cudaMalloc(&fifo, 512));
  CK(cudaMalloc(&ctl, sizeof(unsigned long long) * 32));
  CK(cudaMallocManaged(&hung, sizeof(int)));
  int bad = 0;
  for (const Variant& v : allVariants()) {
    if (!v.ping || !selected(v, o)) continue;
    Args a{};
    a.fifo = fifo;
    a.ctl = ctl;
    a.hung = hung;
    a.timeoutNs = (unsigned long long)(o.timeoutS * 1e9);
    int rounds = o.pingpong;
    std::vector<double> ns;
    bool hungRun = false;
    for (int it = 0; it <= o.iters && !hungRun; ++it) {
      CK(cudaMemset(fifo, 0, 512));
      CK(cudaMemset(ctl, 0, sizeof(unsigned long long) * 32));
      *hung = 0;
      CK(cudaDeviceSynchronize());
      void* params[] = {&a, &rounds};
      CK(cudaLaunchCooperativeKernel((const void*)v.ping, dim3(2), dim3(32), params, 0, nullptr));
      CK(cudaDeviceSynchronize());
      unsigned long long total = 0;
      CK(cudaMemcpy(&total, ctl + 16, sizeof(total), cudaMemcpyDeviceToHost));
      hungRun = *hung != 0;
      if (it) ns.push_back(total / (2.0 * rounds));
    }
    std::printf("%-7s %-9s %-9s %-6s ", kProtoNames[v.proto], v.proto == kSimple ? "-" : kQualNames[v.store],
                v.proto == kSimple ? "-" : kQualNames[v.load], v.proto == kLL128 ? (v.reread ? "yes" : "no") : "-");
    if (hungRun) {
      std::printf("%12s\n", "HUNG");
      bad = 1;
      continue;
    }
    std::sort(ns.begin(), ns.end());
    std::printf("%12.0f\n", ns[ns.size() / 2]);
  }
  return bad;
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  if (!parse(argc, argv, o)) return 2;
  int ndev = 0;
  cudaError_t e = cudaGetDeviceCount(&ndev);
  if (e != cudaSuccess || ndev == 0) {
    std::fprintf(stderr, "taccl_line_bw: no usable CUDA device (%s)\n",
                 e != cudaSuccess ? cudaGetErrorString(e) : "none found");
    return 2;
  }
  cudaDeviceProp prop;
  CK(cudaGetDeviceProperties(&prop, 0));
  int coop = 0;
  CK(cudaDeviceGetAttribute(&coop, cudaDevAttrCooperativeLaunch, 0));
  if (!coop) {
    std::fprintf(stderr, "taccl_line_bw: %s has no cooperative launch (the blocks must be co-resident)\n", prop.name);
    return 2;
  }
  if (o.pingpong) return pingTable(o, prop);
  std::printf("# %s, %d SMs; %d thread(s) a block, %d connection(s) at once, median of %d after one warm-up\n",
              prop.name, prop.multiProcessorCount, o.threads, o.pairs, o.iters);
  std::printf("%-7s %2s %-9s %-9s %-6s %10s %5s %12s %10s %10s %6s\n", "proto", "U", "store", "load", "reread",
              "slot", "slots", "bytes", "time_us", "GB/s", "wire");

  // The largest protocol's FIFO, shared by every variant.
  long long maxWire = 0;
  for (int p = 0; p < 3; ++p)
    maxWire = std::max(maxWire, slotWire(p, o.slot ? o.slot : protoSlot(p)) * (o.nslots ? o.nslots : protoSlots(p)));
  const long long stride = (o.bytes + 127) / 128 * 128;  // each connection's buffers start 128-byte aligned
  std::vector<char> host((size_t)(stride * o.pairs)), back(host.size());
  std::mt19937_64 rng(1);
  for (size_t i = 0; i + 8 <= host.size(); i += 8) {
    const uint64_t x = rng();
    std::memcpy(&host[i], &x, 8);
  }
  char *src, *dst, *fifo;
  unsigned long long* ctl;
  int* hung;
  CK(cudaMalloc(&src, host.size()));
  CK(cudaMalloc(&dst, host.size()));
  CK(cudaMalloc(&fifo, (size_t)maxWire * o.pairs));
  CK(cudaMalloc(&ctl, sizeof(unsigned long long) * 16 * (o.pairs + 1)));  // + the ping's time
  CK(cudaMallocManaged(&hung, sizeof(int)));
  CK(cudaMemcpy(src, host.data(), host.size(), cudaMemcpyHostToDevice));
  cudaEvent_t t0, t1;
  CK(cudaEventCreate(&t0));
  CK(cudaEventCreate(&t1));

  int bad = 0;
  for (const Variant& v : allVariants()) {
    if (!selected(v, o)) continue;
    const long long slot = o.slot ? o.slot : protoSlot(v.proto);
    if (slot % protoUnit(v.proto)) {
      std::printf("%-7s skipped: --slot %lld is not a multiple of %lld payload bytes\n", kProtoNames[v.proto], slot,
                  protoUnit(v.proto));
      continue;
    }
    Args a{};
    a.src = src;
    a.dst = dst;
    a.fifo = fifo;
    a.ctl = ctl;
    a.hung = hung;
    a.slotPayload = slot;
    a.slotWire = slotWire(v.proto, slot);
    a.nslots = o.nslots ? o.nslots : protoSlots(v.proto);
    a.bytes = o.bytes / slot * slot;
    a.stride = stride;
    a.timeoutNs = (unsigned long long)(o.timeoutS * 1e9);
    if (a.bytes == 0) {
      std::printf("%-7s skipped: --bytes is less than one call (%lld)\n", kProtoNames[v.proto], slot);
      continue;
    }
    int perSM = 0;
    CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&perSM, (const void*)v.fn, o.threads, 0));
    if (perSM * prop.multiProcessorCount < 2 * o.pairs) {
      std::fprintf(stderr, "taccl_line_bw: %d blocks of %d threads cannot all be resident (%d per SM x %d SMs)\n",
                   2 * o.pairs, o.threads, perSM, prop.multiProcessorCount);
      return 2;
    }
    std::vector<float> times;
    bool wrong = false, hungRun = false;
    for (int it = 0; it <= o.iters; ++it) {
      CK(cudaMemset(fifo, 0, (size_t)a.slotWire * a.nslots * o.pairs));
      CK(cudaMemset(ctl, 0, sizeof(unsigned long long) * 16 * o.pairs));
      CK(cudaMemset(dst, 0, host.size()));
      *hung = 0;
      CK(cudaDeviceSynchronize());
      void* params[] = {&a};
      CK(cudaEventRecord(t0));
      CK(cudaLaunchCooperativeKernel((const void*)v.fn, dim3(2 * o.pairs), dim3(o.threads), params, 0, nullptr));
      CK(cudaEventRecord(t1));
      CK(cudaEventSynchronize(t1));
      CK(cudaGetLastError());
      float ms = 0;
      CK(cudaEventElapsedTime(&ms, t0, t1));
      if (*hung) { hungRun = true; break; }
      if (it) times.push_back(ms * 1000.0f);
      CK(cudaMemcpy(back.data(), dst, host.size(), cudaMemcpyDeviceToHost));
      for (int p = 0; p < o.pairs && !wrong; ++p)
        wrong = std::memcmp(back.data() + p * stride, host.data() + p * stride, (size_t)a.bytes) != 0;
      if (wrong) break;
    }
    const char* reread = v.proto == kLL128 ? (v.reread ? "yes" : "no") : "-";
    std::printf("%-7s %2d %-9s %-9s %-6s %10lld %5d %12lld ", kProtoNames[v.proto], v.u, kQualNames[v.store],
                kQualNames[v.load], reread, slot, a.nslots, a.bytes);
    if (hungRun || wrong) {
      std::printf("%10s\n", hungRun ? "HUNG" : "WRONG");
      bad = 1;
      continue;
    }
    std::sort(times.begin(), times.end());
    const double us = times[times.size() / 2];
    const double gbs = a.bytes * (double)o.pairs / us / 1e3;
    std::printf("%10.1f %10.2f %6.2f\n", us, gbs, gbs * wireBytes(v.proto, slot) / slot);
  }
  return bad;
}
