// Host backend: one std::thread per thread block, host memory for buffers, FIFOs as bounded ring buffers.
// A watchdog (the calling thread) stops the run when every live block has waited with no progress for
// timeoutMs, and names the waiting blocks.
#include <atomic>
#include <chrono>
#include <memory>
#include <sstream>
#include <thread>

#include "plan.h"

namespace taccl {
namespace {

// Each counter (a flag or a FIFO head/tail) owns a 64-byte line: word 0 is the value, the low half of
// word 1 is a sequence number that waiters block on (C++20 atomic wait on a 32-bit word is a futex on
// Linux). publish bumps it after the value; the watchdog bumps it to wake waiters for an abort.
struct HostShared {
  std::atomic<bool> abort{false};
  std::atomic<uint64_t> progress{0};
  std::atomic<int> waiting{0}, live{0};
  std::unique_ptr<std::atomic<int>[]> active;  // per block: 1 while it waits
  std::unique_ptr<WaitInfo[]> info;            // per block: what it waits for
};

inline uint32_t* seqWord(uint64_t* counter) { return reinterpret_cast<uint32_t*>(counter + 1); }

struct HostBackend {
  HostShared* sh;
  int g;
  static constexpr bool kLines = false;  // LL runs as Simple with LL's tiles and FIFO depth
  bool endWork(bool ok) { return ok; }
  void prefetch(const void*, int64_t) {}  // one thread's own tables: the CPU's caches do it
  template <class T> static T load(const T* p) { return *p; }
  template <class T, class Op> void move(const T* a, const T* b, T* d1, T* d2, int64_t n) {
    scalarMove<HostBackend, T, Op>(a, b, d1, d2, 0, n, 1);
  }

  bool waitGE(const uint64_t* p, uint64_t v, bool /*sys*/, const WaitInfo& w, uint64_t& seen) {
    std::atomic_ref<uint64_t> val(*const_cast<uint64_t*>(p));
    if ((seen = val.load(std::memory_order_acquire)) >= v) return true;
    for (int i = 0; i < 200; ++i) {  // short spin: the producer is often just behind
      if ((seen = val.load(std::memory_order_acquire)) >= v) return true;
      std::this_thread::yield();
    }
    std::atomic_ref<uint32_t> seq(*seqWord(const_cast<uint64_t*>(p)));
    sh->info[g] = w;
    sh->active[g].store(1, std::memory_order_release);
    sh->waiting.fetch_add(1);
    bool ok = true;
    for (;;) {
      uint32_t s = seq.load(std::memory_order_acquire);
      if ((seen = val.load(std::memory_order_acquire)) >= v) break;
      if (sh->abort.load(std::memory_order_acquire)) { ok = false; break; }
      seq.wait(s, std::memory_order_acquire);
    }
    sh->waiting.fetch_sub(1);
    if (ok) sh->active[g].store(0, std::memory_order_release);
    return ok;
  }

  void publish(uint64_t* p, uint64_t v) {
    std::atomic_ref<uint64_t>(*p).store(v, std::memory_order_release);
    std::atomic_ref<uint32_t> seq(*seqWord(p));
    seq.fetch_add(1, std::memory_order_acq_rel);
    seq.notify_all();
    sh->progress.fetch_add(1, std::memory_order_relaxed);
  }
  void post(uint64_t* p1, uint64_t v1, uint64_t* p2, uint64_t v2, bool /*sys*/) {
    if (p1) publish(p1, v1);
    if (p2) publish(p2, v2);
  }
};

template <class T, template <class> class Op>
void runBlock(HostShared* sh, const LaunchArgs* a, int g) {
  HostBackend be{sh, g};
  Interpreter<HostBackend, T, Op<T>>::runTb(be, *a, g);
  sh->live.fetch_sub(1);
}

using BlockFn = void (*)(HostShared*, const LaunchArgs*, int);

template <class T, template <class> class Op>
struct BlockFnOf {
  static constexpr BlockFn value = &runBlock<T, Op>;
};

}  // namespace

RunReport runHost(const Plan& plan, const std::vector<char*>& userBufs, const RunOptions& opt) {
  RunReport rep;
  BlockFn fn = pickInstance<BlockFnOf>(plan.call.dtype, plan.call.op);
  if (!fn) {
    rep.outcome = Outcome::Failed;
    rep.message = "unknown data type or reduction operator";
    return rep;
  }
  const int ntbs = (int)plan.tbs.size();
  const int nconns = (int)plan.conns.size();
  const int nranks = plan.prog->ngpus;
  // Counters: flags first, then head and tail of each connection.
  std::vector<uint64_t> counters((size_t)(ntbs + 2 * nconns) * kCounterStride + kCounterStride, 0);
  uint64_t* cbase = counters.data();
  while (reinterpret_cast<uintptr_t>(cbase) % 64) ++cbase;  // 64-byte lines
  std::vector<std::vector<char>> fifoData(nconns);
  std::vector<Conn> conns(nconns);
  for (int c = 0; c < nconns; ++c) {
    fifoData[c].assign((size_t)plan.nslots * plan.slotBytes + 64, 0);
    char* d = fifoData[c].data();
    while (reinterpret_cast<uintptr_t>(d) % 64) ++d;
    conns[c] = Conn{cbase + (size_t)(ntbs + 2 * c) * kCounterStride, cbase + (size_t)(ntbs + 2 * c + 1) * kCounterStride, d,
                    plan.conns[c].sendRank, plan.conns[c].recvRank, plan.conns[c].chan, 0};
  }
  std::vector<std::vector<char>> scratch(nranks);
  std::vector<char*> bufs = userBufs;
  for (int r = 0; r < nranks; ++r) {
    if (!bufs[r * 3 + BUF_S] && plan.scratchElems[r] > 0) {
      scratch[r].assign((size_t)plan.scratchElems[r] * plan.typeSize, 0);
      bufs[r * 3 + BUF_S] = scratch[r].data();
    }
  }
  LaunchArgs a{};
  a.steps = plan.steps.data();
  a.tbs = plan.tbs.data();
  a.ntbs = ntbs;
  a.conns = conns.data();
  a.nslots = plan.nslots;
  a.slotBytes = plan.slotBytes;
  a.bufs = bufs.data();
  a.flags = cbase;
  a.S = plan.S;
  a.C = plan.C;
  a.M = plan.M;
  a.direct = opt.direct;

  HostShared sh;
  sh.active.reset(new std::atomic<int>[ntbs]);
  sh.info.reset(new WaitInfo[ntbs]);
  for (int g = 0; g < ntbs; ++g) sh.active[g].store(0);
  sh.live.store(ntbs);

  auto t0 = std::chrono::steady_clock::now();
  std::vector<std::thread> threads;
  threads.reserve(ntbs);
  try {
    for (int g = 0; g < ntbs; ++g) threads.emplace_back(fn, &sh, &a, g);
  } catch (const std::system_error& e) {
    sh.abort.store(true);
    for (size_t c = 0; c < (size_t)(ntbs + 2 * nconns); ++c) {
      std::atomic_ref<uint32_t> seq(*seqWord(cbase + c * kCounterStride));
      seq.fetch_add(1);
      seq.notify_all();
    }
    for (auto& t : threads) t.join();
    rep.outcome = Outcome::Failed;
    rep.message = std::string("cannot start ") + std::to_string(ntbs) + " threads: " + e.what();
    return rep;
  }
  // Watchdog.
  uint64_t lastProgress = sh.progress.load();
  auto lastChange = std::chrono::steady_clock::now();
  bool aborted = false;
  while (sh.live.load() > 0) {
    std::this_thread::sleep_for(std::chrono::microseconds(aborted ? 1000 : 200));
    if (aborted) {
      for (size_t c = 0; c < (size_t)(ntbs + 2 * nconns); ++c) {
        std::atomic_ref<uint32_t> seq(*seqWord(cbase + c * kCounterStride));
        seq.fetch_add(1);
        seq.notify_all();
      }
      continue;
    }
    uint64_t pr = sh.progress.load();
    auto now = std::chrono::steady_clock::now();
    if (pr != lastProgress) {
      lastProgress = pr;
      lastChange = now;
      continue;
    }
    if (sh.waiting.load() == sh.live.load() &&
        std::chrono::duration_cast<std::chrono::milliseconds>(now - lastChange).count() >= opt.timeoutMs) {
      aborted = true;
      sh.abort.store(true);
    }
  }
  for (auto& t : threads) t.join();
  auto t1 = std::chrono::steady_clock::now();
  rep.elapsedUs = std::chrono::duration<double, std::micro>(t1 - t0).count();
  if (aborted) {
    std::ostringstream o;
    int n = 0;
    for (int g = 0; g < ntbs; ++g) n += sh.active[g].load();
    o << plan.prog->path << ": deadlock: the watchdog stopped the program after " << opt.timeoutMs
      << " ms without progress; " << n << " thread block" << (n == 1 ? "" : "s") << " wait:";
    int shown = 0;
    for (int g = 0; g < ntbs; ++g) {
      if (!sh.active[g].load()) continue;
      if (shown++ == 32) { o << "\n  ..."; break; }
      o << "\n  " << describeWait(plan, g, sh.info[g]);
    }
    rep.outcome = Outcome::Deadlock;
    rep.message = o.str();
  }
  return rep;
}

}  // namespace taccl
