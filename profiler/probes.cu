// taccl-probe: measure one node (GPU pairs, GPU-host, host-NIC, inter-node) and write raw samples as JSON.
//
// Output format: taccl-profile-samples version 1 (see taccl/profiler/samples.py). Every probe sweeps message
// sizes and records one [bytes, microseconds] sample per copy, timed with CUDA events around that single copy.
// Nothing here fits or infers; the Python analysis does that.
//
// Robustness rules: no GPU, one GPU, no peer access, no NIC, no NCCL are all normal outcomes that end with
// exit code 0 and a "skipped" entry saying why. A watchdog thread ends a probe that runs past --timeout: it
// writes what was measured so far (status "partial", the stuck probe named in "errors") and exits 0.
//
// UNTESTED ON A GPU: this file was compiled but never run on GPU hardware (see profiler/README.md).
#include <cuda_runtime.h>
#include <dlfcn.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sched.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <mutex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "probe_common.h"

#ifdef HAVE_VERBS
#include "verbs_probe.h"
#endif

namespace {

Output g_out;

// ---------------------------------------------------------------------------------------------------------
// Watchdog: one deadline at a time; on expiry the partial output is written and the process exits.
std::atomic<long long> g_deadline_ms{0};
std::mutex g_label_mu;
std::string g_label;
std::string g_out_path;
double g_timeout_s = 20.0;

long long now_ms() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

void arm(const std::string& label, double seconds = -1) {
  {
    std::lock_guard<std::mutex> lk(g_label_mu);
    g_label = label;
  }
  g_deadline_ms = now_ms() + (long long)(1000.0 * (seconds > 0 ? seconds : g_timeout_s));
}

void disarm() { g_deadline_ms = 0; }

void watchdog_loop() {
  for (;;) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    long long d = g_deadline_ms.load();
    if (d && now_ms() > d) {
      std::string label;
      {
        std::lock_guard<std::mutex> lk(g_label_mu);
        label = g_label;
      }
      g_out.add_error("timeout: probe '" + label + "' ran past " + fmt_num(g_timeout_s) +
                      " s; stopped, later probes not run");
      g_out.add_skip("watchdog", label, "timed out after " + fmt_num(g_timeout_s) + " s");
      g_out.status = "partial";
      g_out.write(g_out_path);
      fprintf(stderr, "taccl-probe: timeout in %s; partial results written\n", label.c_str());
      _exit(0);
    }
  }
}

// ---------------------------------------------------------------------------------------------------------
struct Options {
  bool quick = false;
  int reps = 5;
  std::vector<std::string> groups{"p2p", "host", "nic"};
  std::string peer;  // host:port, this side is rank 1
  int listen_port = 0;  // this side is rank 0
  size_t max_bytes = size_t(256) << 20;
  size_t big_bytes = size_t(64) << 20;
};

bool has_group(const Options& o, const char* g) {
  return std::find(o.groups.begin(), o.groups.end(), g) != o.groups.end();
}

std::vector<size_t> sweep_sizes(const Options& o) {
  std::vector<size_t> s;
  size_t lo = o.quick ? 4096 : 1024, step = o.quick ? 4 : 2;
  for (size_t x = lo; x <= o.max_bytes; x *= step) s.push_back(x);
  return s;
}

#define CK(call, what)                                                                  \
  do {                                                                                  \
    cudaError_t e_ = (call);                                                            \
    if (e_ != cudaSuccess) {                                                            \
      g_out.add_error(std::string(what) + ": " + #call + ": " + cudaGetErrorString(e_)); \
      return false;                                                                     \
    }                                                                                   \
  } while (0)

struct Gpu {
  void* a = nullptr;  // source buffer
  void* b = nullptr;  // destination buffer
  void* host = nullptr;  // pinned host buffer
  cudaStream_t s[2] = {nullptr, nullptr};
  cudaEvent_t e[4] = {};
  int sms = 0;
};
std::vector<Gpu> g_gpu;

// Holding a stream: a one-thread kernel spins until the host releases it (or 200 ms pass, so a lost release
// cannot hang the probe). Work queued behind it, events included, then starts at once when it ends, so an
// event pair times the operation and not the host's submission of it (the method nvbandwidth uses).
__device__ __forceinline__ unsigned long long global_ns() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}
__global__ void hold_kernel(const volatile int* release, unsigned long long max_ns) {
  const unsigned long long t0 = global_ns();
  while (!*release && global_ns() - t0 < max_ns) {}
}
// Keeps every SM busy for a while so that the clocks are up before the first sample.
__global__ void warm_kernel(unsigned long long ns) {
  const unsigned long long t0 = global_ns();
  while (global_ns() - t0 < ns) {}
}
int* g_release = nullptr;  // host-mapped, shared by every GPU (portable)
cudaError_t g_last_error = cudaSuccess;  // the first CUDA error of the current measurement

void hold(cudaStream_t st) {
  hold_kernel<<<1, 1, 0, st>>>(g_release, 200000000ull);
}
void release_holds() { *(volatile int*)g_release = 1; }
void arm_holds() { *(volatile int*)g_release = 0; }
std::string last_error_text() {
  cudaError_t e = g_last_error != cudaSuccess ? g_last_error : cudaGetLastError();
  g_last_error = cudaSuccess;
  return e != cudaSuccess ? cudaGetErrorString(e) : "unknown CUDA error";
}
bool note(cudaError_t e) {
  if (e != cudaSuccess && g_last_error == cudaSuccess) g_last_error = e;
  return e == cudaSuccess;
}

__global__ void copy_kernel(const uint4* __restrict__ src, uint4* __restrict__ dst, size_t n16) {
  size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
  size_t stride = (size_t)gridDim.x * blockDim.x;
  for (; i < n16; i += stride) dst[i] = src[i];
}

// Time one operation issued by `issue` on stream st of device dev, queued behind a hold; returns
// microseconds or -1 (the error is kept for last_error_text()).
template <class F>
double time_one(int dev, int si, F issue) {
  Gpu& g = g_gpu[dev];
  if (!note(cudaSetDevice(dev))) return -1;
  arm_holds();
  hold(g.s[si]);
  bool ok = note(cudaGetLastError()) && note(cudaEventRecord(g.e[2 * si], g.s[si])) && issue(g.s[si]) &&
            note(cudaEventRecord(g.e[2 * si + 1], g.s[si]));
  release_holds();
  if (!ok) return note(cudaGetLastError()), -1;
  if (!note(cudaEventSynchronize(g.e[2 * si + 1]))) return -1;
  float ms = 0;
  if (!note(cudaEventElapsedTime(&ms, g.e[2 * si], g.e[2 * si + 1]))) return -1;
  return ms * 1000.0;
}

bool p2p_issue(int src, int dst, size_t bytes, bool sm, cudaStream_t st) {
  if (!sm) return cudaMemcpyPeerAsync(g_gpu[dst].b, dst, g_gpu[src].a, src, bytes, st) == cudaSuccess;
  size_t n16 = bytes / 16;
  int threads = 512;
  int blocks = (int)std::min<size_t>((n16 + threads - 1) / threads, (size_t)std::max(1, g_gpu[src].sms * 2));
  copy_kernel<<<std::max(blocks, 1), threads, 0, st>>>((const uint4*)g_gpu[src].a, (uint4*)g_gpu[dst].b, n16);
  return cudaGetLastError() == cudaSuccess;
}

bool setup_gpus(int n, const Options& o) {
  g_gpu.resize(n);
  if (n > 0) {
    CK(cudaSetDevice(0), "setup");
    CK(cudaHostAlloc(&g_release, sizeof(int), cudaHostAllocMapped | cudaHostAllocPortable), "setup");
    *g_release = 1;
  }
  for (int d = 0; d < n; ++d) {
    CK(cudaSetDevice(d), "setup");
    cudaDeviceProp p;
    CK(cudaGetDeviceProperties(&p, d), "setup");
    g_gpu[d].sms = p.multiProcessorCount;
    CK(cudaMalloc(&g_gpu[d].a, o.max_bytes), "setup");
    CK(cudaMalloc(&g_gpu[d].b, o.max_bytes), "setup");
    CK(cudaMemset(g_gpu[d].a, 1, o.max_bytes), "setup");
    CK(cudaHostAlloc(&g_gpu[d].host, o.max_bytes, cudaHostAllocPortable), "setup");
    for (auto& s : g_gpu[d].s) CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "setup");
    for (auto& e : g_gpu[d].e) CK(cudaEventCreate(&e), "setup");
    warm_kernel<<<g_gpu[d].sms * 2, 128>>>(200000000ull);  // 200 ms: clocks up before the first sample
    CK(cudaGetLastError(), "setup");
  }
  for (int d = 0; d < n; ++d) {
    CK(cudaSetDevice(d), "setup");
    CK(cudaDeviceSynchronize(), "setup");
  }
  return true;
}

std::string samples_json(const std::vector<std::pair<size_t, double>>& v) {
  std::string s = "[";
  for (size_t i = 0; i < v.size(); ++i) s += (i ? "," : "") + std::string("[") + std::to_string(v[i].first) + "," + fmt_num(v[i].second) + "]";
  return s + "]";
}

// ---------------------------------------------------------------------------------------------------------
void probe_p2p(int n, const Options& o, const std::vector<std::vector<int>>& access, Progress& prog) {
  if (n < 2) {
    g_out.add_skip("p2p", "GPU-GPU copies", n == 0 ? "no GPU" : "only one GPU: no GPU pair to measure");
    return;
  }
  auto sizes = sweep_sizes(o);
  for (int eng = 0; eng < 2; ++eng) {
    const char* ename = eng ? "sm" : "ce";
    for (int s = 0; s < n; ++s)
      for (int d = 0; d < n; ++d) {
        if (s == d) continue;
        std::string what = std::string("p2p ") + ename + " " + std::to_string(s) + "->" + std::to_string(d);
        if (eng == 1 && !access[s][d]) {
          g_out.add_skip("p2p_sm", what, "no peer access (cudaDeviceCanAccessPeer = 0): kernels cannot reach the peer");
          continue;
        }
        prog.step(what);
        arm(what);
        std::vector<std::pair<size_t, double>> v;
        bool ok = true;
        for (size_t b : sizes) {
          time_one(s, 0, [&](cudaStream_t st) { return p2p_issue(s, d, b, eng, st); });  // warm-up
          for (int r = 0; r < o.reps && ok; ++r) {
            double t = time_one(s, 0, [&](cudaStream_t st) { return p2p_issue(s, d, b, eng, st); });
            if (t < 0) ok = false; else v.push_back({b, t});
          }
        }
        disarm();
        std::string rec = "{\"probe\":\"p2p\",\"engine\":\"" + std::string(ename) + "\",\"src\":" + std::to_string(s) +
                          ",\"dst\":" + std::to_string(d) + ",\"peer_access\":" + (access[s][d] ? "true" : "false");
        if (!ok) rec += ",\"status\":\"error\",\"reason\":" + jstr(last_error_text());
        g_out.add_measurement(rec + ",\"samples\":" + samples_json(v) + "}");
      }
  }
  // Two copies from one GPU at once: an NVSwitch port is shared, separate NVLinks are not.
  for (int eng = 0; eng < 2; ++eng) {
    const char* ename = eng ? "sm" : "ce";
    for (int s = 0; s < n; ++s) {
      if (o.quick && s > 0) break;
      std::vector<int> peers;
      for (int d = 0; d < n && peers.size() < 2; ++d)
        if (d != s && (eng == 0 || access[s][d])) peers.push_back(d);
      if (peers.size() < 2) continue;
      std::string what = std::string("p2p_concurrent ") + ename + " " + std::to_string(s);
      prog.step(what);
      arm(what);
      std::string times = "[";
      bool ok = true;
      for (int r = 0; r < o.reps && ok; ++r) {
        note(cudaSetDevice(s));
        Gpu& g = g_gpu[s];
        arm_holds();  // both copies queued behind holds, released together
        for (int k = 0; k < 2; ++k) {
          hold(g.s[k]);
          ok = ok && note(cudaEventRecord(g.e[2 * k], g.s[k]));
          // the second copy writes into the source GPU's own b-buffer of the peer: use distinct peers
          ok = ok && (p2p_issue(s, peers[k], o.big_bytes, eng, g.s[k]) || !note(cudaGetLastError()));
          ok = ok && note(cudaEventRecord(g.e[2 * k + 1], g.s[k]));
        }
        release_holds();
        float t0 = 0, t1 = 0;
        ok = ok && note(cudaEventSynchronize(g.e[1])) && note(cudaEventSynchronize(g.e[3])) &&
             note(cudaEventElapsedTime(&t0, g.e[0], g.e[1])) && note(cudaEventElapsedTime(&t1, g.e[2], g.e[3]));
        times += (r ? ",[" : "[") + fmt_num(t0 * 1000.0) + "," + fmt_num(t1 * 1000.0) + "]";
      }
      disarm();
      std::string rec = "{\"probe\":\"p2p_concurrent\",\"engine\":\"" + std::string(ename) + "\",\"transfers\":[[" +
                        std::to_string(s) + "," + std::to_string(peers[0]) + "],[" + std::to_string(s) + "," +
                        std::to_string(peers[1]) + "]],\"bytes\":" + std::to_string(o.big_bytes) +
                        ",\"times_us\":" + times + "]";
      if (!ok) rec += ",\"status\":\"error\",\"reason\":" + jstr(last_error_text());
      g_out.add_measurement(rec + "}");
    }
  }
}

bool host_issue(int g, bool d2h, size_t bytes, cudaStream_t st) {
  void* dev = g_gpu[g].a;
  return (d2h ? cudaMemcpyAsync(g_gpu[g].host, dev, bytes, cudaMemcpyDeviceToHost, st)
              : cudaMemcpyAsync(dev, g_gpu[g].host, bytes, cudaMemcpyHostToDevice, st)) == cudaSuccess;
}

// Pairs of GPUs copying to (or from) the host together; returns the JSON times list.
std::string concurrent_host(const std::vector<int>& gs, bool d2h, size_t bytes, int reps, bool* ok) {
  std::string times = "[";
  for (int r = 0; r < reps && *ok; ++r) {
    arm_holds();  // every GPU's copy queued behind a hold, released together
    for (int g : gs) {
      *ok = *ok && note(cudaSetDevice(g));
      hold(g_gpu[g].s[0]);
      *ok = *ok && note(cudaEventRecord(g_gpu[g].e[0], g_gpu[g].s[0]));
      *ok = *ok && (host_issue(g, d2h, bytes, g_gpu[g].s[0]) || !note(cudaGetLastError()));
      *ok = *ok && note(cudaEventRecord(g_gpu[g].e[1], g_gpu[g].s[0]));
    }
    release_holds();
    times += r ? ",[" : "[";
    for (size_t k = 0; k < gs.size(); ++k) {
      int g = gs[k];
      cudaSetDevice(g);
      float ms = 0;
      *ok = *ok && note(cudaEventSynchronize(g_gpu[g].e[1])) &&
            note(cudaEventElapsedTime(&ms, g_gpu[g].e[0], g_gpu[g].e[1]));
      times += (k ? "," : "") + fmt_num(ms * 1000.0);
    }
    times += "]";
  }
  return times + "]";
}

void probe_host(int n, const Options& o, Progress& prog) {
  if (n < 1) {
    g_out.add_skip("host", "GPU-host copies", "no GPU");
    return;
  }
  auto sizes = sweep_sizes(o);
  for (int dir = 0; dir < 2; ++dir) {
    const char* dn = dir ? "h2d" : "d2h";
    for (int g = 0; g < n; ++g) {
      std::string what = std::string("host ") + dn + " gpu " + std::to_string(g);
      prog.step(what);
      arm(what);
      std::vector<std::pair<size_t, double>> v;
      bool ok = true;
      for (size_t b : sizes) {
        time_one(g, 0, [&](cudaStream_t st) { return host_issue(g, !dir, b, st); });
        for (int r = 0; r < o.reps && ok; ++r) {
          double t = time_one(g, 0, [&](cudaStream_t st) { return host_issue(g, !dir, b, st); });
          if (t < 0) ok = false; else v.push_back({b, t});
        }
      }
      disarm();
      std::string rec = std::string("{\"probe\":\"host\",\"direction\":\"") + dn + "\",\"gpu\":" + std::to_string(g);
      if (!ok) rec += ",\"status\":\"error\",\"reason\":" + jstr(last_error_text());
      g_out.add_measurement(rec + ",\"samples\":" + samples_json(v) + "}");
    }
    if (n < 2) g_out.add_skip("host_concurrent", "PCIe switch groups", "only one GPU");
    for (int a = 0; a < n; ++a)
      for (int b = a + 1; b < n; ++b) {
        std::string what = std::string("host_concurrent ") + dn + " " + std::to_string(a) + "," + std::to_string(b);
        prog.step(what);
        arm(what);
        bool ok = true;
        std::string times = concurrent_host({a, b}, !dir, o.big_bytes, o.reps, &ok);
        disarm();
        std::string rec = std::string("{\"probe\":\"host_concurrent\",\"direction\":\"") + dn + "\",\"gpus\":[" +
                          std::to_string(a) + "," + std::to_string(b) + "],\"bytes\":" + std::to_string(o.big_bytes) +
                          ",\"times_us\":" + times;
        if (!ok) rec += ",\"status\":\"error\",\"reason\":" + jstr(last_error_text());
        g_out.add_measurement(rec + "}");
      }
  }
}

// GPU-to-host copies while something else (the NIC loopback) is running; used by the verbs probe.
[[maybe_unused]] std::string host_times_now(int g, size_t bytes, int reps, bool* ok) {
  std::string t = "[";
  for (int r = 0; r < reps && *ok; ++r) {
    double us = time_one(g, 0, [&](cudaStream_t st) { return host_issue(g, true, bytes, st); });
    if (us < 0) *ok = false;
    t += (r ? "," : "") + fmt_num(us);
  }
  return t + "]";
}

// ---------------------------------------------------------------------------------------------------------
// Inter-node ping-pong through NCCL, loaded at run time so the binary builds and runs without it.
typedef int ncclResult_t;
typedef void* ncclComm_t;
struct ncclUniqueId { char internal[128]; };
struct Nccl {
  void* h = nullptr;
  ncclResult_t (*GetUniqueId)(ncclUniqueId*);
  ncclResult_t (*CommInitRank)(ncclComm_t*, int, ncclUniqueId, int);
  ncclResult_t (*Send)(const void*, size_t, int, int, ncclComm_t, cudaStream_t);
  ncclResult_t (*Recv)(void*, size_t, int, int, ncclComm_t, cudaStream_t);
  ncclResult_t (*CommDestroy)(ncclComm_t);
  const char* (*GetErrorString)(ncclResult_t);
};

bool load_nccl(Nccl& n, std::string& why) {
  n.h = dlopen("libnccl.so.2", RTLD_NOW | RTLD_LOCAL);
  if (!n.h) n.h = dlopen("libnccl.so", RTLD_NOW | RTLD_LOCAL);
  if (!n.h) {
    const char* e = dlerror();
    why = std::string("NCCL not found: dlopen libnccl.so.2: ") + (e ? e : "unknown error");
    return false;
  }
  bool ok = true;
  auto sym = [&](const char* name) {
    void* p = dlsym(n.h, name);
    if (!p) ok = false;
    return p;
  };
  n.GetUniqueId = (decltype(n.GetUniqueId))sym("ncclGetUniqueId");
  n.CommInitRank = (decltype(n.CommInitRank))sym("ncclCommInitRank");
  n.Send = (decltype(n.Send))sym("ncclSend");
  n.Recv = (decltype(n.Recv))sym("ncclRecv");
  n.CommDestroy = (decltype(n.CommDestroy))sym("ncclCommDestroy");
  n.GetErrorString = (decltype(n.GetErrorString))sym("ncclGetErrorString");
  if (!ok) why = "libnccl.so.2 lacks ncclSend/ncclRecv (NCCL >= 2.7 needed)";
  return ok;
}

// Exchange the NCCL unique id over TCP: rank 0 listens, rank 1 connects.
bool exchange_id(const Options& o, ncclUniqueId* id, int rank, std::string& why) {
  if (rank == 0) {
    int ls = socket(AF_INET6, SOCK_STREAM, 0), one = 1, zero = 0;
    setsockopt(ls, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    setsockopt(ls, IPPROTO_IPV6, IPV6_V6ONLY, &zero, sizeof zero);
    sockaddr_in6 a{};
    a.sin6_family = AF_INET6;
    a.sin6_addr = in6addr_any;
    a.sin6_port = htons((uint16_t)o.listen_port);
    if (ls < 0 || bind(ls, (sockaddr*)&a, sizeof a) || listen(ls, 1)) {
      why = std::string("cannot listen on port ") + std::to_string(o.listen_port) + ": " + strerror(errno);
      return false;
    }
    fprintf(stderr, "taccl-probe: waiting for the peer on port %d\n", o.listen_port);
    int c = accept(ls, nullptr, nullptr);
    bool ok = c >= 0 && write(c, id, sizeof *id) == (ssize_t)sizeof *id;
    if (c >= 0) close(c);
    close(ls);
    if (!ok) why = "could not send the NCCL id to the peer";
    return ok;
  }
  std::string host = o.peer.substr(0, o.peer.rfind(':')), port = o.peer.substr(o.peer.rfind(':') + 1);
  addrinfo hints{}, *res = nullptr;
  hints.ai_socktype = SOCK_STREAM;
  if (getaddrinfo(host.c_str(), port.c_str(), &hints, &res) || !res) {
    why = "cannot resolve peer " + o.peer;
    return false;
  }
  int s = -1;
  for (int tries = 0; tries < 50 && s < 0; ++tries) {  // the listener may start a little later
    s = socket(res->ai_family, res->ai_socktype, res->ai_protocol);
    if (connect(s, res->ai_addr, res->ai_addrlen)) {
      close(s);
      s = -1;
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
    }
  }
  freeaddrinfo(res);
  if (s < 0) {
    why = "cannot connect to peer " + o.peer;
    return false;
  }
  size_t got = 0;
  while (got < sizeof *id) {
    ssize_t r = read(s, (char*)id + got, sizeof *id - got);
    if (r <= 0) break;
    got += (size_t)r;
  }
  close(s);
  if (got != sizeof *id) why = "short read of the NCCL id from the peer";
  return got == sizeof *id;
}

void probe_net(int n, const Options& o, Progress& prog) {
  if (o.peer.empty() && o.listen_port == 0) {
    g_out.add_skip("net", "inter-node alpha and bandwidth", "no peer node given (--listen PORT on one node, --peer HOST:PORT on the other)");
    return;
  }
  if (n < 1) {
    g_out.add_skip("net", "inter-node alpha and bandwidth", "no GPU");
    return;
  }
  Nccl nc;
  std::string why;
  if (!load_nccl(nc, why)) {
    g_out.add_skip("net", "inter-node alpha and bandwidth", why);
    return;
  }
  int rank = o.listen_port ? 0 : 1;
  ncclUniqueId id{};
  if (rank == 0 && nc.GetUniqueId(&id) != 0) {
    g_out.add_skip("net", "inter-node alpha and bandwidth", "ncclGetUniqueId failed");
    return;
  }
  prog.step("net: connecting");
  arm("net connect", std::max(g_timeout_s, 120.0));
  if (!exchange_id(o, &id, rank, why)) {
    disarm();
    g_out.add_skip("net", "inter-node alpha and bandwidth", why);
    return;
  }
  cudaSetDevice(0);
  ncclComm_t comm = nullptr;
  ncclResult_t r = nc.CommInitRank(&comm, 2, id, rank);
  disarm();
  if (r != 0) {
    g_out.add_skip("net", "inter-node alpha and bandwidth", std::string("ncclCommInitRank: ") + nc.GetErrorString(r));
    return;
  }
  std::vector<std::pair<size_t, double>> v;
  cudaStream_t st = g_gpu[0].s[0];
  bool ok = true;
  for (size_t b : sweep_sizes(o)) {
    prog.step("net ping-pong " + std::to_string(b) + " B");
    arm("net ping-pong");
    for (int k = -1; k < o.reps && ok; ++k) {
      auto t0 = std::chrono::steady_clock::now();
      if (rank == 0) {
        ok = nc.Send(g_gpu[0].a, b, 0 /*ncclInt8*/, 1, comm, st) == 0 && nc.Recv(g_gpu[0].b, b, 0, 1, comm, st) == 0;
      } else {
        ok = nc.Recv(g_gpu[0].b, b, 0, 0, comm, st) == 0 && nc.Send(g_gpu[0].a, b, 0, 0, comm, st) == 0;
      }
      ok = ok && cudaStreamSynchronize(st) == cudaSuccess;
      double us = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count();
      if (k >= 0 && ok) v.push_back({b, us / 2.0});  // one way = half the round trip
    }
    disarm();
  }
  nc.CommDestroy(comm);
  std::string rec = "{\"probe\":\"net\",\"peer\":" + jstr(o.peer.empty() ? "listen:" + std::to_string(o.listen_port) : o.peer) +
                    ",\"rank\":" + std::to_string(rank);
  if (!ok) rec += ",\"status\":\"error\",\"reason\":\"NCCL send/recv failed\"";
  g_out.add_measurement(rec + ",\"samples\":" + samples_json(v) + "}");
}

void usage() {
  fprintf(stderr,
          "usage: taccl-probe [--out FILE] [--quick] [--timeout SECONDS] [--reps N] [--groups p2p,host,nic,net]\n"
          "                   [--max-bytes N] [--listen PORT | --peer HOST:PORT]\n"
          "Writes taccl-profile-samples JSON (stdout by default). Analyse with: taccl profile --analyze FILE\n");
}

}  // namespace

int main(int argc, char** argv) {
  setenv("CUDA_DEVICE_ORDER", "PCI_BUS_ID", 0);  // stable numbering, what CUDA_VISIBLE_DEVICES indices refer to
  Options o;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) {
        usage();
        exit(2);
      }
      return argv[++i];
    };
    if (a == "--out") g_out_path = next();
    else if (a == "--quick") o.quick = true;
    else if (a == "--timeout") g_timeout_s = atof(next().c_str());
    else if (a == "--reps") o.reps = std::max(1, atoi(next().c_str()));
    else if (a == "--groups") o.groups = split(next(), ',');
    else if (a == "--max-bytes") o.max_bytes = (size_t)std::max(4096.0, atof(next().c_str()));
    else if (a == "--peer") { o.peer = next(); if (std::find(o.groups.begin(), o.groups.end(), "net") == o.groups.end()) o.groups.push_back("net"); }
    else if (a == "--listen") { o.listen_port = atoi(next().c_str()); if (std::find(o.groups.begin(), o.groups.end(), "net") == o.groups.end()) o.groups.push_back("net"); }
    else if (a == "-h" || a == "--help") { usage(); return 0; }
    else { fprintf(stderr, "taccl-probe: unknown argument %s\n", a.c_str()); usage(); return 2; }
  }
  if (o.quick) {
    o.reps = std::min(o.reps, 2);
    o.max_bytes = std::min(o.max_bytes, size_t(64) << 20);
  }
  o.big_bytes = std::min(o.big_bytes, o.max_bytes);
  if (g_timeout_s <= 0) g_timeout_s = 20;
  std::thread(watchdog_loop).detach();

  g_out.host_json = host_info_json();
  std::string env = "{";
  const char* cvd = getenv("CUDA_VISIBLE_DEVICES");
  env += "\"CUDA_DEVICE_ORDER\":" + jstr(getenv("CUDA_DEVICE_ORDER"));
  if (cvd) env += ",\"CUDA_VISIBLE_DEVICES\":" + jstr(cvd);
  g_out.env_json = env + "}";
  g_out.nics = sysfs_nics();

  arm("cuda init");
  int n = 0;
  cudaError_t e = cudaGetDeviceCount(&n);
  disarm();
  if (e != cudaSuccess || n == 0) {
    g_out.add_skip("all", "GPUs", std::string("no GPU: cudaGetDeviceCount: ") + (e != cudaSuccess ? cudaGetErrorString(e) : "0 devices"));
    n = 0;
  }
  int rt = 0;
  cudaRuntimeGetVersion(&rt);
  g_out.tool_json = "{\"name\":\"taccl-probe\",\"version\":\"1\",\"cuda_runtime\":" + std::to_string(rt) +
                    ",\"quick\":" + (o.quick ? "true" : "false") + ",\"reps\":" + std::to_string(o.reps) +
                    ",\"verbs\":" +
#ifdef HAVE_VERBS
                    "true" +
#else
                    "false" +
#endif
                    std::string(",\"untested_on_gpu\":true}");
  std::vector<std::vector<int>> access(n, std::vector<int>(n, 0));
  std::string gpus = "[";
  for (int d = 0; d < n; ++d) {
    cudaDeviceProp p;
    if (cudaGetDeviceProperties(&p, d) != cudaSuccess) continue;
    char bus[32];
    snprintf(bus, sizeof bus, "%04x:%02x:%02x.0", p.pciDomainID, p.pciBusID, p.pciDeviceID);
    std::string uuid = "GPU-";
    for (int k = 0; k < 16; ++k) {
      char h[3];
      snprintf(h, sizeof h, "%02x", (unsigned char)p.uuid.bytes[k]);
      uuid += h;
      if (k == 3 || k == 5 || k == 7 || k == 9) uuid += "-";
    }
    // peak memory bandwidth (double data rate: two transfers a clock), which scales one block's on-GPU copy
    // bandwidth in the calibrated costs (HBM against GDDR differs by 4x within one NCCL generation)
    int mem_khz = 0, bus_bits = 0;
    cudaDeviceGetAttribute(&mem_khz, cudaDevAttrMemoryClockRate, d);
    cudaDeviceGetAttribute(&bus_bits, cudaDevAttrGlobalMemoryBusWidth, d);
    double mem_gbps = 2.0 * mem_khz * 1e3 * (bus_bits / 8.0) / 1e9;
    char mem[32];
    snprintf(mem, sizeof mem, "%.1f", mem_gbps);
    gpus += std::string(d ? "," : "") + "{\"index\":" + std::to_string(d) + ",\"name\":" + jstr(p.name) +
            ",\"pci_bus_id\":" + jstr(bus) + ",\"uuid\":" + jstr(uuid) + ",\"numa_node\":" +
            std::to_string(pci_numa_node(bus)) + ",\"sm\":" + std::to_string(p.major * 10 + p.minor) +
            ",\"sms\":" + std::to_string(p.multiProcessorCount) + ",\"mem_GBps\":" + mem + "}";
    for (int q = 0; q < n; ++q) {
      int can = 0;
      if (q != d) cudaDeviceCanAccessPeer(&can, d, q);
      access[d][q] = can;
    }
  }
  g_out.gpus_json = gpus + "]";
  std::string pa = "[";
  for (int d = 0; d < n; ++d) {
    pa += d ? ",[" : "[";
    for (int q = 0; q < n; ++q) pa += std::string(q ? "," : "") + (access[d][q] ? "true" : "false");
    pa += "]";
  }
  g_out.peer_json = pa + "]";
  g_out.write(g_out_path);  // something on disk from the start

  bool need_gpu = has_group(o, "p2p") || has_group(o, "host") || has_group(o, "nic") || has_group(o, "net");
  if (n > 0 && need_gpu) {
    arm("allocate buffers", std::max(g_timeout_s, 60.0));
    bool ok = setup_gpus(n, o);
    disarm();
    if (!ok) {
      g_out.add_skip("all", "GPU probes", "buffer or stream setup failed (see errors)");
      n = 0;
    }
  }
  for (int d = 0; d < n; ++d)
    for (int q = 0; q < n; ++q)
      if (access[d][q]) {
        cudaSetDevice(d);
        cudaError_t pe = cudaDeviceEnablePeerAccess(q, 0);
        if (pe != cudaSuccess && pe != cudaErrorPeerAccessAlreadyEnabled) access[d][q] = 0;
        cudaGetLastError();
      }
  Progress prog(estimate_steps(n, o.quick, has_group(o, "p2p"), has_group(o, "host"), has_group(o, "nic"),
                               (int)g_out.nics.size()));
  if (has_group(o, "p2p")) probe_p2p(n, o, access, prog);
  if (has_group(o, "host")) probe_host(n, o, prog);
  if (has_group(o, "nic")) {
#ifdef HAVE_VERBS
    VerbsHooks hooks;
    hooks.arm = [](const std::string& l) { arm(l); };
    hooks.disarm = [] { disarm(); };
    hooks.host_times = host_times_now;
    run_verbs_probes(g_out, n, o.quick, o.reps, o.big_bytes, hooks, prog);
#else
    g_out.add_skip("nic_loopback", "host-NIC loopback latency and GPU-host bandwidth with the NIC busy",
                   g_out.nics.empty() ? "no NIC found (no RDMA device under /sys/class/infiniband)"
                                      : "taccl-probe was built without libibverbs headers (install libibverbs-dev and rebuild)");
#endif
  }
  if (has_group(o, "net")) probe_net(n, o, prog);
  g_out.status = g_out.errors.empty() ? "complete" : "partial";
  g_out.write(g_out_path);
  fprintf(stderr, "taccl-probe: done (%s)\n", g_out.status.c_str());
  return 0;
}
