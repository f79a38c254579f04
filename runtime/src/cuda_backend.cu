// CUDA backend: the interpreter core (core.h) compiled by nvcc with a device policy.
//
// One kernel launch per GPU per collective (cooperative launch, so every block is co-resident or the launch
// is refused). Ranks map to GPUs as rank % ndev; several ranks may share one GPU (their blocks share the
// grid). Connection FIFOs and their counters live on the receiver's GPU and the sender writes them through
// peer access. Per-block flags live on the block's GPU. A block that waits longer than the timeout sets a
// shared abort flag (host-mapped memory, visible to every GPU) and records what it waited for, so the host
// can report the same message as the host backend.
#include <cuda_runtime.h>

#include <chrono>
#include <sstream>
#include <stdexcept>

#include "plan.h"

namespace taccl {
namespace {

constexpr int kThreads = 256;

struct DevCtl {
  volatile int* abort;    // host-mapped, shared by all GPUs
  WaitInfo* waits;        // host-mapped, one per block (global index)
  int* waitActive;        // host-mapped, one per block
  const int* blockMap;    // this GPU's grid index -> global block index
  unsigned long long timeoutNs;
};

__device__ __forceinline__ unsigned long long globalTimer() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

struct DeviceBackend {
  DevCtl ctl;
  int g;

  __host__ __device__ int tid() const {
#ifdef __CUDA_ARCH__
    return threadIdx.x;
#else
    return 0;
#endif
  }
  __host__ __device__ int nthreads() const {
#ifdef __CUDA_ARCH__
    return blockDim.x;
#else
    return 1;
#endif
  }
  __host__ __device__ void beginWork() {
#ifdef __CUDA_ARCH__
    __syncthreads();
#endif
  }
  // Why the system fence: the data just written may be a peer GPU's FIFO slot, and the counter published
  // next must not overtake it over NVLink/PCIe.
  __host__ __device__ void endWork() {
#ifdef __CUDA_ARCH__
    __threadfence_system();
    __syncthreads();
#endif
  }
  // Volatile loads bypass L1, which is not coherent with other SMs' or GPUs' writes (a FIFO slot is reused
  // every nslots calls, and a dependency's data was written by another block).
  template <class T> __host__ __device__ static T load(const T* p) {
#ifdef __CUDA_ARCH__
    T v;
    if (sizeof(T) == 1) { uint8_t x = *(const volatile uint8_t*)p; memcpy(&v, &x, 1); }
    else if (sizeof(T) == 2) { uint16_t x = *(const volatile uint16_t*)p; memcpy(&v, &x, 2); }
    else if (sizeof(T) == 4) { uint32_t x = *(const volatile uint32_t*)p; memcpy(&v, &x, 4); }
    else { uint64_t x = *(const volatile uint64_t*)p; memcpy(&v, &x, 8); }
    return v;
#else
    return *p;
#endif
  }
  __host__ __device__ bool waitGE(uint64_t* p, uint64_t v, const WaitInfo& w) {
#ifdef __CUDA_ARCH__
    __shared__ int ok;
    if (threadIdx.x == 0) {
      ok = 1;
      if (*(volatile uint64_t*)p < v) {
        const unsigned long long start = globalTimer();
        unsigned spins = 0;
        while (*(volatile uint64_t*)p < v) {
          if ((++spins & 1023) == 0) {
            if (*ctl.abort) { ok = 0; break; }
            if (globalTimer() - start > ctl.timeoutNs) { *ctl.abort = 1; ok = 0; break; }
          }
        }
        if (!ok) {
          ctl.waits[g] = w;
          __threadfence_system();
          ctl.waitActive[g] = 1;
        }
      }
      __threadfence();
    }
    __syncthreads();
    const int r = ok;
    __syncthreads();
    return r != 0;
#else
    return false;
#endif
  }
  __host__ __device__ void publish(uint64_t* p, uint64_t v) {
#ifdef __CUDA_ARCH__
    if (threadIdx.x == 0) {
      __threadfence_system();
      *(volatile uint64_t*)p = v;
    }
#endif
  }
};

template <class T, template <class> class Op>
__global__ void __launch_bounds__(kThreads) interpreterKernel(LaunchArgs a, DevCtl ctl) {
  const int g = ctl.blockMap[blockIdx.x];
  DeviceBackend be{ctl, g};
  Interpreter<DeviceBackend, T, Op<T>>::runTb(be, a, g);
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
  void* mapped(size_t bytes) {
    void* p = nullptr;
    ck(cudaHostAlloc(&p, bytes, cudaHostAllocMapped | cudaHostAllocPortable), "cudaHostAlloc");
    host.push_back(p);
    memset(p, 0, bytes);
    return p;
  }
  ~DeviceAllocs() {
    for (auto& d : ptrs) {
      cudaSetDevice(d.first);
      cudaFree(d.second);
    }
    for (void* h : host) cudaFreeHost(h);
  }
};

template <class V>
V* toDevice(DeviceAllocs& al, int dev, const std::vector<V>& v) {
  V* p = (V*)al.alloc(dev, v.size() * sizeof(V));
  if (!v.empty()) ck(cudaMemcpy(p, v.data(), v.size() * sizeof(V), cudaMemcpyHostToDevice), "cudaMemcpy");
  return p;
}

}  // namespace

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
    if (dst != 0) {
      ck(cudaSetDevice(0), "cudaSetDevice");
      cudaError_t e = cudaDeviceEnablePeerAccess(dst, 0);
      if (e == cudaErrorPeerAccessAlreadyEnabled) cudaGetLastError();
      else ck(e, "cudaDeviceEnablePeerAccess");
    }
    ck(cudaSetDevice(0), "cudaSetDevice");
    cudaEvent_t e0, e1;
    ck(cudaEventCreate(&e0), "cudaEventCreate");
    ck(cudaEventCreate(&e1), "cudaEventCreate");
    ck(cudaMemcpy(b, a, (size_t)bytes, cudaMemcpyDefault), "cudaMemcpy");
    ck(cudaEventRecord(e0), "cudaEventRecord");
    for (int i = 0; i < iters; ++i) ck(cudaMemcpyAsync(b, a, (size_t)bytes, cudaMemcpyDefault), "cudaMemcpyAsync");
    ck(cudaEventRecord(e1), "cudaEventRecord");
    ck(cudaEventSynchronize(e1), "cudaEventSynchronize");
    float ms = 0;
    ck(cudaEventElapsedTime(&ms, e0, e1), "cudaEventElapsedTime");
    cudaEventDestroy(e0);
    cudaEventDestroy(e1);
    *us = ms * 1000.0 / iters;
    return true;
  } catch (const CudaFailure&) {
    return false;
  }
}

RunReport runCuda(const Plan& plan, const std::vector<char*>& userBufs, bool hostBuffers, const RunOptions& opt) {
  RunReport rep;
  try {
    KernelFn kernel = pickInstance<KernelOf>(plan.call.dtype, plan.call.op);
    if (!kernel) throw CudaFailure("unknown data type or reduction operator");
    int visible = 0;
    ck(cudaGetDeviceCount(&visible), "cudaGetDeviceCount");
    const int ndev = opt.cudaDevices > 0 && opt.cudaDevices < visible ? opt.cudaDevices : visible;
    const int R = plan.prog->ngpus;
    auto devOf = [&](int rank) { return rank % ndev; };
    for (int a = 0; a < ndev; ++a)
      for (int b = 0; b < ndev; ++b) {
        if (a == b) continue;
        int can = 0;
        ck(cudaDeviceCanAccessPeer(&can, a, b), "cudaDeviceCanAccessPeer");
        if (!can) throw CudaFailure("GPU " + std::to_string(a) + " cannot access GPU " + std::to_string(b) + " (peer access)");
        ck(cudaSetDevice(a), "cudaSetDevice");
        cudaError_t e = cudaDeviceEnablePeerAccess(b, 0);
        if (e == cudaErrorPeerAccessAlreadyEnabled) cudaGetLastError();
        else ck(e, "cudaDeviceEnablePeerAccess");
      }
    DeviceAllocs al;
    const int ntbs = (int)plan.tbs.size();
    const int nconns = (int)plan.conns.size();
    // Buffers: the user's device pointers, or staged copies of host buffers (in-place aliasing preserved by
    // staging one span that covers both).
    std::vector<char*> bufs = userBufs;
    struct Stage { char* host; char* dev; size_t bytes; };
    std::vector<Stage> stages;
    for (int r = 0; r < R; ++r) {
      const int dev = devOf(r);
      if (hostBuffers) {
        char* s = userBufs[r * 3 + BUF_I];
        char* o = userBufs[r * 3 + BUF_O];
        const size_t inB = (size_t)plan.inElems[r] * plan.typeSize, outB = (size_t)plan.outElems[r] * plan.typeSize;
        if (plan.call.inplace) {
          char* lo = s < o ? s : o;
          char* hi = s + inB > o + outB ? s + inB : o + outB;
          char* d = (char*)al.alloc(dev, hi - lo);
          stages.push_back({lo, d, (size_t)(hi - lo)});
          bufs[r * 3 + BUF_I] = d + (s - lo);
          bufs[r * 3 + BUF_O] = d + (o - lo);
        } else {
          char* di = (char*)al.alloc(dev, inB);
          char* dout = (char*)al.alloc(dev, outB);
          stages.push_back({s, di, inB});
          stages.push_back({o, dout, outB});
          bufs[r * 3 + BUF_I] = di;
          bufs[r * 3 + BUF_O] = dout;
        }
      }
      if (plan.scratchElems[r] > 0) bufs[r * 3 + BUF_S] = (char*)al.alloc(dev, (size_t)plan.scratchElems[r] * plan.typeSize);
    }
    for (auto& st : stages) ck(cudaMemcpy(st.dev, st.host, st.bytes, cudaMemcpyHostToDevice), "cudaMemcpy H2D");
    // Connections on the receiver's GPU.
    std::vector<Conn> conns(nconns);
    for (int c = 0; c < nconns; ++c) {
      const int dev = devOf(plan.conns[c].recvRank);
      uint64_t* ctr = (uint64_t*)al.alloc(dev, 2 * kCounterStride * sizeof(uint64_t));
      char* data = (char*)al.alloc(dev, (size_t)plan.nslots * plan.slotBytes);
      conns[c] = Conn{ctr, ctr + kCounterStride, data, plan.conns[c].sendRank, plan.conns[c].recvRank, plan.conns[c].chan, 0};
    }
    int* abortFlag = (int*)al.mapped(sizeof(int));
    WaitInfo* waits = (WaitInfo*)al.mapped(sizeof(WaitInfo) * (ntbs ? ntbs : 1));
    int* waitActive = (int*)al.mapped(sizeof(int) * (ntbs ? ntbs : 1));
    std::vector<cudaStream_t> streams(ndev, nullptr);
    struct PerDev { LaunchArgs a; DevCtl ctl; int grid; };
    std::vector<PerDev> per(ndev);
    for (int d = 0; d < ndev; ++d) {
      std::vector<int> map;
      for (int g = 0; g < ntbs; ++g)
        if (devOf(plan.tbs[g].rank) == d) map.push_back(g);
      per[d].grid = (int)map.size();
      if (map.empty()) continue;
      ck(cudaSetDevice(d), "cudaSetDevice");
      int perSM = 0, sms = 0, coop = 0;
      ck(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&perSM, kernel, kThreads, 0), "cudaOccupancy");
      ck(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, d), "cudaDeviceGetAttribute");
      ck(cudaDeviceGetAttribute(&coop, cudaDevAttrCooperativeLaunch, d), "cudaDeviceGetAttribute");
      if ((int64_t)perSM * sms < (int64_t)map.size())
        throw CudaFailure("GPU " + std::to_string(d) + " cannot hold " + std::to_string(map.size()) +
                          " co-resident thread blocks (" + std::to_string(perSM) + " per SM x " + std::to_string(sms) + " SMs)");
      LaunchArgs a{};
      a.steps = toDevice(al, d, plan.steps);
      a.tbs = toDevice(al, d, plan.tbs);
      a.ntbs = ntbs;
      a.conns = toDevice(al, d, conns);
      a.nslots = plan.nslots;
      a.slotBytes = plan.slotBytes;
      a.bufs = toDevice(al, d, bufs);
      a.flags = (uint64_t*)al.alloc(d, (size_t)ntbs * kCounterStride * sizeof(uint64_t));
      a.S = plan.S;
      a.C = plan.C;
      a.M = plan.M;
      DevCtl ctl{};
      int* dAbort = nullptr;
      ck(cudaHostGetDevicePointer((void**)&dAbort, abortFlag, 0), "cudaHostGetDevicePointer");
      ck(cudaHostGetDevicePointer((void**)&ctl.waits, waits, 0), "cudaHostGetDevicePointer");
      ck(cudaHostGetDevicePointer((void**)&ctl.waitActive, waitActive, 0), "cudaHostGetDevicePointer");
      ctl.abort = dAbort;
      ctl.blockMap = toDevice(al, d, map);
      ctl.timeoutNs = (unsigned long long)opt.timeoutMs * 1000000ull;
      per[d].a = a;
      per[d].ctl = ctl;
      ck(cudaStreamCreateWithFlags(&streams[d], cudaStreamNonBlocking), "cudaStreamCreate");
      if (!coop) throw CudaFailure("GPU " + std::to_string(d) + " does not support cooperative launch");
    }
    for (int d = 0; d < ndev; ++d) ck((cudaSetDevice(d), cudaDeviceSynchronize()), "cudaDeviceSynchronize");
    auto t0 = std::chrono::steady_clock::now();
    for (int d = 0; d < ndev; ++d) {
      if (!per[d].grid) continue;
      ck(cudaSetDevice(d), "cudaSetDevice");
      void* args[] = {&per[d].a, &per[d].ctl};
      ck(cudaLaunchCooperativeKernel((const void*)kernel, dim3(per[d].grid), dim3(kThreads), args, 0, streams[d]),
         "cudaLaunchCooperativeKernel");
    }
    for (int d = 0; d < ndev; ++d) {
      if (!streams[d]) continue;
      ck(cudaSetDevice(d), "cudaSetDevice");
      ck(cudaStreamSynchronize(streams[d]), "kernel");
    }
    auto t1 = std::chrono::steady_clock::now();
    rep.elapsedUs = std::chrono::duration<double, std::micro>(t1 - t0).count();
    for (int d = 0; d < ndev; ++d)
      if (streams[d]) { cudaSetDevice(d); cudaStreamDestroy(streams[d]); }
    if (*abortFlag) {
      std::ostringstream o;
      int n = 0;
      for (int g = 0; g < ntbs; ++g) n += waitActive[g] != 0;
      o << plan.prog->path << ": deadlock: the watchdog stopped the program after " << opt.timeoutMs
        << " ms without progress; " << n << " thread block" << (n == 1 ? "" : "s") << " wait:";
      for (int g = 0, shown = 0; g < ntbs && shown < 32; ++g)
        if (waitActive[g]) { o << "\n  " << describeWait(plan, g, waits[g]); shown++; }
      rep.outcome = Outcome::Deadlock;
      rep.message = o.str();
      return rep;
    }
    for (auto& st : stages) ck(cudaMemcpy(st.host, st.dev, st.bytes, cudaMemcpyDeviceToHost), "cudaMemcpy D2H");
  } catch (const CudaFailure& e) {
    rep.outcome = Outcome::Failed;
    rep.message = std::string("CUDA backend: ") + e.what();
  }
  return rep;
}

}  // namespace taccl
