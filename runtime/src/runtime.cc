#include "runtime.h"

#include <sys/stat.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <set>
#include <sstream>

namespace taccl {

Runtime::Runtime() : set_(std::make_shared<ProgramSet>()) {
  history_.push_back(set_);
  if (const char* t = std::getenv("TACCL_RUNTIME_TIMEOUT_MS")) {
    long long v = std::atoll(t);
    if (v > 0) run.timeoutMs = v;
  }
  if (const char* t = std::getenv("TACCL_RUNTIME_DIRECT")) run.direct = std::atoi(t) != 0;
  if (const char* t = std::getenv("TACCL_RUNTIME_LL128")) run.ll128 = std::atoi(t) != 0;
  if (const char* t = std::getenv("TACCL_RUNTIME_HOLD")) run.hold = std::atoi(t) != 0;
  if (const char* t = std::getenv("TACCL_RUNTIME_COOPERATIVE")) run.cooperative = std::atoi(t) != 0;
  if (const char* t = std::getenv("TACCL_RUNTIME_TILE_BYTES")) {
    long long v = std::atoll(t);
    if (v > 0) tileBytes = v;
  }
}

std::vector<std::string> splitPathList(const std::string& list) {
  std::vector<std::string> out;
  for (size_t start = 0; start <= list.size();) {
    size_t end = list.find(':', start);
    if (end == std::string::npos) end = list.size();
    if (end > start) out.push_back(list.substr(start, end - start));
    start = end + 1;
  }
  return out;
}

std::shared_ptr<const Program> Runtime::load(const std::string& path) const {
  LoadOptions lo;
  lo.analysis = analysis;
  return std::make_shared<const Program>(loadProgramFile(path, lo));
}

void Runtime::append(std::vector<std::shared_ptr<const Program>> more) {
  std::lock_guard<std::mutex> lock(mu_);
  applyDue(nextCall_);
  auto set = std::make_shared<ProgramSet>(*set_);
  set->programs.insert(set->programs.end(), more.begin(), more.end());
  set->generation = ++generations_;
  set_ = set;
  history_.push_back(set_);
}

void Runtime::loadFile(const std::string& path) { append({load(path)}); }

int Runtime::loadFromEnv() {
  const char* env = std::getenv("MSCCL_XML_FILES");
  if (!env || !*env) env = std::getenv("TACCL_XML_FILES");
  if (!env || !*env) return 0;
  std::vector<std::shared_ptr<const Program>> loaded;
  for (const std::string& path : splitPathList(env)) loaded.push_back(load(path));
  const int n = (int)loaded.size();
  append(std::move(loaded));
  return n;
}

void Runtime::applyDue(int64_t call) {
  while (!pending_.empty() && pending_.begin()->first <= call) {
    set_ = pending_.begin()->second;
    pending_.erase(pending_.begin());
  }
}

std::shared_ptr<const ProgramSet> Runtime::programs() const {
  std::lock_guard<std::mutex> lock(mu_);
  auto set = set_;
  for (auto& [epoch, pending] : pending_)
    if (epoch <= nextCall_) set = pending;
  return set;
}

int64_t Runtime::nextCall() const {
  std::lock_guard<std::mutex> lock(mu_);
  return nextCall_;
}

namespace {

int selectIn(const ProgramSet& set, Coll coll, int nranks, int64_t count, int dtype, bool inplace, int root) {
  const size_t ts = typeSize(dtype);
  int64_t N = 0, nBytes = 0;
  if (count <= 0 || !ts || !callSize(coll, nranks, count, ts, &N, &nBytes)) return -1;
  for (size_t i = 0; i < set.programs.size(); ++i) {
    const Program& p = *set.programs[i];
    if (p.coll != coll || p.ngpus != nranks) continue;
    if (inplace ? !p.inplace : !p.outofplace) continue;
    if (rooted(coll) && p.root != root) continue;
    if (N % p.nchunks != 0) continue;
    if (nBytes < p.minBytes) continue;
    if (p.maxBytes != 0 && nBytes > p.maxBytes) continue;
    return (int)i;
  }
  return -1;
}

// The files a swap loads: a directory stands for its regular files in name order (as MSCCL_ALGO_DIR).
std::vector<std::string> expandPaths(const std::vector<std::string>& paths) {
  namespace fs = std::filesystem;
  std::vector<std::string> out;
  for (const std::string& p : paths) {
    std::error_code ec;
    if (!fs::is_directory(p, ec)) {
      out.push_back(p);
      continue;
    }
    std::vector<std::string> files;
    for (auto& e : fs::directory_iterator(p, ec))
      if (e.is_regular_file(ec)) files.push_back(e.path().string());
    if (ec) throw ProgramError(p + ": cannot list the directory: " + ec.message());
    std::sort(files.begin(), files.end());
    if (files.empty()) throw ProgramError(p + ": the directory holds no file");
    out.insert(out.end(), files.begin(), files.end());
  }
  return out;
}

}  // namespace

int Runtime::select(Coll coll, int nranks, int64_t count, int dtype, bool inplace, int root) const {
  return selectIn(*programs(), coll, nranks, count, dtype, inplace, root);
}

int64_t Runtime::swap(const std::vector<std::string>& paths, int64_t epoch) {
  // Load and prove every file before anything changes: a set that fails is refused whole.
  std::vector<std::shared_ptr<const Program>> loaded;
  for (const std::string& f : expandPaths(paths)) loaded.push_back(load(f));
  if (loaded.empty()) throw ProgramError("the new set names no file");
  for (auto& p : loaded)
    if (p->executorDialect != loaded[0]->executorDialect)
      throw ProgramError("the new set mixes XML dialects: " + loaded[0]->path + " is " +
                         (loaded[0]->executorDialect ? "executor" : "legacy") + ", " + p->path + " " +
                         (p->executorDialect ? "executor" : "legacy") +
                         " (their windows and call kinds read differently)");
  std::lock_guard<std::mutex> lock(mu_);
  if (epoch < 0)  // as soon as possible: the next call, or the one after the last set already waiting
    epoch = std::max(nextCall_, pending_.empty() ? 0 : pending_.rbegin()->first + 1);
  if (epoch < nextCall_)
    throw ProgramError("epoch " + std::to_string(epoch) + " has passed: the communicator's next call is number " +
                       std::to_string(nextCall_));
  if (pending_.count(epoch)) throw ProgramError("a set is already waiting for epoch " + std::to_string(epoch));
  // What the set replaces: the one serving the calls just before the epoch.
  auto before = set_;
  for (auto& [e, s] : pending_)
    if (e < epoch) before = s;
  // A set may hold programs for several rank counts, as a batch's directory for several node counts does: like
  // MSCCL_ALGO_DIR, a file serves only communicators of its ngpus. The counts that matter are the
  // communicator's, from its calls, else those the replaced set serves: the new set must hold a program for
  // one of them, and keep every collective the replaced set serves at those counts.
  std::set<int> counts;
  if (ranks_) counts.insert(ranks_);
  else
    for (auto& old : before->programs) counts.insert(old->ngpus);
  if (!counts.empty()) {
    bool fits = false;
    for (auto& p : loaded) fits |= counts.count(p->ngpus) > 0;
    if (!fits) {
      std::string which;
      for (int n : counts) which += (which.empty() ? "" : " or ") + std::to_string(n);
      throw ProgramError("the new set holds no program for " + which + " ranks, " +
                         (ranks_ ? "this communicator's" : "the counts the current set serves") + " (" +
                         loaded[0]->path + " is written for " + std::to_string(loaded[0]->ngpus) + ")");
    }
  }
  for (auto& old : before->programs) {
    if (!counts.count(old->ngpus)) continue;
    bool served = false;
    for (auto& p : loaded) served |= p->coll == old->coll && p->ngpus == old->ngpus;
    if (!served)
      throw ProgramError(std::string("the new set has no ") + collName(old->coll) + " program for " +
                         std::to_string(old->ngpus) + " ranks, which the current set serves: its calls would "
                         "silently go back to the default algorithm (include one)");
  }
  auto set = std::make_shared<ProgramSet>();
  set->programs = std::move(loaded);
  set->generation = ++generations_;
  pending_[epoch] = set;
  history_.push_back(set);
  return epoch;
}

namespace {

// What changes when a directory is rewritten: its inode (a batch swaps in a new directory), its modification
// time, and its files' names, sizes and times.
std::string dirStamp(const std::string& dir) {
  namespace fs = std::filesystem;
  std::error_code ec;
  std::ostringstream o;
  struct stat st;
  if (::stat(dir.c_str(), &st) != 0) return "";
  o << st.st_ino << ':' << st.st_mtim.tv_sec << '.' << st.st_mtim.tv_nsec;
  std::vector<std::string> entries;
  for (auto& e : fs::directory_iterator(dir, ec)) {
    struct stat fst;
    if (::stat(e.path().c_str(), &fst) == 0)
      entries.push_back(e.path().filename().string() + ':' + std::to_string(fst.st_size) + ':' +
                        std::to_string(fst.st_mtim.tv_sec) + '.' + std::to_string(fst.st_mtim.tv_nsec));
  }
  std::sort(entries.begin(), entries.end());
  for (auto& e : entries) o << '|' << e;
  return o.str();
}

}  // namespace

void Runtime::watch(const std::string& dir, int64_t everyMs) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    watchStop_ = true;
  }
  watchWake_.notify_all();
  if (watcher_.joinable()) watcher_.join();
  if (dir.empty()) return;
  if (everyMs <= 0) throw ProgramError("the watch interval must be positive");
  std::string stamp = dirStamp(dir);
  if (stamp.empty()) throw ProgramError(dir + ": cannot watch: no such directory");
  {
    std::lock_guard<std::mutex> lock(mu_);
    watchStop_ = false;
  }
  watcher_ = std::thread([this, dir, everyMs, stamp]() mutable {
    std::unique_lock<std::mutex> lock(mu_);
    while (!watchWake_.wait_for(lock, std::chrono::milliseconds(everyMs), [this] { return watchStop_; })) {
      lock.unlock();
      std::string now = dirStamp(dir);
      std::string error;
      bool swapped = false;
      if (!now.empty() && now != stamp) {
        stamp = now;
        try {
          swap({dir}, -1);
          swapped = true;
        } catch (const std::exception& e) {
          error = e.what();
        }
      }
      lock.lock();
      if (swapped) watchSwaps_++;
      if (!error.empty()) watchError_ = error;
    }
  });
}

std::pair<int64_t, std::string> Runtime::watchStatus() const {
  std::lock_guard<std::mutex> lock(mu_);
  return {watchSwaps_, watchError_};
}

Runtime::~Runtime() { watch("", 0); }

bool detectInPlace(Coll coll, int nranks, int64_t count, size_t ts, void* const* send, void* const* recv,
                   std::string* err) {
  int in = 0;
  for (int r = 0; r < nranks; ++r) {
    char* s = (char*)send[r];
    char* d = (char*)recv[r];
    bool ip;
    switch (coll) {
      case Coll::AllGather: ip = s == d + (int64_t)r * count * (int64_t)ts; break;
      case Coll::ReduceScatter: ip = d == s + (int64_t)r * count * (int64_t)ts; break;
      default: ip = s == d; break;
    }
    in += ip;
  }
  if (in != 0 && in != nranks) {
    *err = "some ranks call in-place and others out-of-place";
    return false;
  }
  return in == nranks;
}

RunReport Runtime::runCall(int program, Coll coll, int dtype, int op, int nranks, int64_t count, void* const* send,
                           void* const* recv, int root, bool hostBuffers, int* chosen, int64_t* tiles,
                           CallStamp* stamp) {
  RunReport rep;
  *chosen = -1;
  *tiles = 0;
  // The call's number and the set it runs on, taken together: a swap due at this number applies now, and
  // a later swap does not touch this call (it keeps its set alive to the end).
  std::shared_ptr<const ProgramSet> set;
  std::shared_ptr<CudaCache> cache;  // after `set`: released before the programs it was built for
  CallStamp st;
  {
    std::lock_guard<std::mutex> lock(mu_);
    st.call = nextCall_++;
    applyDue(st.call);
    set = set_;
    st.generation = set->generation;
    if (!ranks_ && nranks >= 1) ranks_ = nranks;
    if (backend == 1 && cudaCache && !cudaCache_) cudaCache_.reset(newCudaCache(), freeCudaCache);
    if (!cudaCache) cudaCache_.reset();  // turned off: freed now, or when the calls still on it return
    cache = backend == 1 ? cudaCache_ : nullptr;
  }
  if (stamp) *stamp = st;
  const auto& programs = set->programs;
  auto failed = [&](const std::string& m) {
    rep.outcome = Outcome::Failed;
    rep.message = m;
    return rep;
  };
  if (!typeSize(dtype)) return failed("unknown data type " + std::to_string(dtype));
  if (op < 0 || op > 3) return failed("unknown reduction operator " + std::to_string(op));
  if (nranks < 1 || nranks > kMaxRanks) return failed("nranks out of range");
  if (count <= 0) return failed("count must be positive");
  if (typeSize(dtype) && !callSize(coll, nranks, count, typeSize(dtype), nullptr, nullptr))
    return failed("count " + std::to_string(count) + ": the call's buffers would exceed 2^63 bytes");
  if (!send || !recv) return failed("null buffer arrays");
  for (int r = 0; r < nranks; ++r)
    if (!send[r] || !recv[r]) return failed("null buffer for rank " + std::to_string(r));
  std::string err;
  bool inplace = detectInPlace(coll, nranks, count, typeSize(dtype), send, recv, &err);
  if (!err.empty()) return failed(err);
  if (rooted(coll) && (root < 0 || root >= nranks)) return failed("root " + std::to_string(root) + " is not a rank");
  if (program < 0) {
    program = selectIn(*set, coll, nranks, count, dtype, inplace, root);
    if (program < 0) {
      rep.outcome = Outcome::NoMatch;
      std::ostringstream o;
      o << "no loaded program matches " << collName(coll) << " with " << nranks << " ranks, "
        << count * sizeMultiplier(coll, nranks) * (int64_t)typeSize(dtype) << " bytes, "
        << (inplace ? "in-place" : "out-of-place") << (rooted(coll) ? ", root " + std::to_string(root) : "");
      rep.message = o.str();
      return rep;
    }
  } else if (program >= (int)programs.size()) {
    return failed("no program with index " + std::to_string(program));
  } else if (rooted(coll) && programs[program]->root != root) {
    return failed(programs[program]->path + ": a " + collName(coll) + " program for root " +
                  std::to_string(programs[program]->root) + " cannot run a call with root " + std::to_string(root));
  }
  *chosen = program;
  CallSpec call;
  call.coll = coll;
  call.dtype = dtype;
  call.op = op;
  call.nranks = nranks;
  call.count = count;
  call.inplace = inplace;
  call.root = root;
  Plan plan;
  try {
    plan = makePlan(*programs[program], call, tileBytes);
  } catch (const ProgramError& e) {
    return failed(e.what());
  }
  *tiles = plan.iters;
  std::vector<char*> bufs((size_t)nranks * 3, nullptr);
  for (int r = 0; r < nranks; ++r) {
    bufs[r * 3 + BUF_I] = (char*)send[r];
    bufs[r * 3 + BUF_O] = (char*)recv[r];
  }
  if (backend == 1) return runCuda(plan, bufs, hostBuffers, run, cache.get());
  return runHost(plan, bufs, run);
}

}  // namespace taccl
