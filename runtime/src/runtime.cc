#include "runtime.h"

#include <cstdlib>
#include <sstream>

namespace taccl {

Runtime::Runtime() {
  if (const char* t = std::getenv("TACCL_RUNTIME_TIMEOUT_MS")) {
    long long v = std::atoll(t);
    if (v > 0) run.timeoutMs = v;
  }
  if (const char* t = std::getenv("TACCL_RUNTIME_DIRECT")) run.direct = std::atoi(t) != 0;
  if (const char* t = std::getenv("TACCL_RUNTIME_TILE_BYTES")) {
    long long v = std::atoll(t);
    if (v > 0) tileBytes = v;
  }
}

void Runtime::loadFile(const std::string& path) {
  LoadOptions lo;
  lo.analysis = analysis;
  programs_.push_back(std::make_unique<Program>(loadProgramFile(path, lo)));
}

int Runtime::loadFromEnv() {
  const char* env = std::getenv("MSCCL_XML_FILES");
  if (!env || !*env) env = std::getenv("TACCL_XML_FILES");
  if (!env || !*env) return 0;
  std::vector<std::unique_ptr<Program>> loaded;
  std::string list(env);
  size_t start = 0;
  LoadOptions lo;
  lo.analysis = analysis;
  while (start <= list.size()) {
    size_t end = list.find(':', start);
    if (end == std::string::npos) end = list.size();
    std::string path = list.substr(start, end - start);
    if (!path.empty()) loaded.push_back(std::make_unique<Program>(loadProgramFile(path, lo)));
    start = end + 1;
  }
  int n = (int)loaded.size();
  for (auto& p : loaded) programs_.push_back(std::move(p));
  return n;
}

bool rooted(Coll c) { return c == Coll::Broadcast || c == Coll::Reduce; }

int Runtime::select(Coll coll, int nranks, int64_t count, int dtype, bool inplace, int root) const {
  const size_t ts = typeSize(dtype);
  if (count <= 0 || !ts) return -1;
  const int64_t N = count * sizeMultiplier(coll, nranks);
  const int64_t nBytes = N * (int64_t)ts;
  for (size_t i = 0; i < programs_.size(); ++i) {
    const Program& p = *programs_[i];
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
                           void* const* recv, int root, bool hostBuffers, int* chosen, int64_t* tiles) {
  RunReport rep;
  *chosen = -1;
  *tiles = 0;
  auto failed = [&](const std::string& m) {
    rep.outcome = Outcome::Failed;
    rep.message = m;
    return rep;
  };
  if (!typeSize(dtype)) return failed("unknown data type " + std::to_string(dtype));
  if (op < 0 || op > 3) return failed("unknown reduction operator " + std::to_string(op));
  if (nranks < 1 || nranks > kMaxRanks) return failed("nranks out of range");
  if (count <= 0) return failed("count must be positive");
  if (!send || !recv) return failed("null buffer arrays");
  for (int r = 0; r < nranks; ++r)
    if (!send[r] || !recv[r]) return failed("null buffer for rank " + std::to_string(r));
  std::string err;
  bool inplace = detectInPlace(coll, nranks, count, typeSize(dtype), send, recv, &err);
  if (!err.empty()) return failed(err);
  if (rooted(coll) && (root < 0 || root >= nranks)) return failed("root " + std::to_string(root) + " is not a rank");
  if (program < 0) {
    program = select(coll, nranks, count, dtype, inplace, root);
    if (program < 0) {
      rep.outcome = Outcome::NoMatch;
      std::ostringstream o;
      o << "no loaded program matches " << collName(coll) << " with " << nranks << " ranks, "
        << count * sizeMultiplier(coll, nranks) * (int64_t)typeSize(dtype) << " bytes, "
        << (inplace ? "in-place" : "out-of-place") << (rooted(coll) ? ", root " + std::to_string(root) : "");
      rep.message = o.str();
      return rep;
    }
  } else if (program >= (int)programs_.size()) {
    return failed("no program with index " + std::to_string(program));
  } else if (rooted(coll) && programs_[program]->root != root) {
    return failed(programs_[program]->path + ": a " + collName(coll) + " program for root " +
                  std::to_string(programs_[program]->root) + " cannot run a call with root " + std::to_string(root));
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
    plan = makePlan(*programs_[program], call, tileBytes);
  } catch (const ProgramError& e) {
    return failed(e.what());
  }
  *tiles = plan.iters;
  std::vector<char*> bufs((size_t)nranks * 3, nullptr);
  for (int r = 0; r < nranks; ++r) {
    bufs[r * 3 + BUF_I] = (char*)send[r];
    bufs[r * 3 + BUF_O] = (char*)recv[r];
  }
  if (backend == 1) {
    if (cudaCache && !cudaCache_) cudaCache_.reset(newCudaCache());
    if (!cudaCache) cudaCache_.reset();
    return runCuda(plan, bufs, hostBuffers, run, cudaCache_.get());
  }
  return runHost(plan, bufs, run);
}

}  // namespace taccl
