// The C API: each function casts the handle and forwards to Runtime, inside try/catch so no C++ exception
// crosses extern "C".
#include <cstring>
#include <map>
#include <mutex>
#include <new>
#include <thread>

#include "../include/taccl_runtime.h"
#include "runtime.h"

struct tacclRuntime {
  taccl::Runtime rt;
  // the last message per thread: a swap from one thread and calls from others each read their own
  std::mutex errorMu;
  std::map<std::thread::id, std::string> errors;
  void setMessage(const std::string& m) {
    std::lock_guard<std::mutex> lock(errorMu);
    errors[std::this_thread::get_id()] = m;
  }
};

namespace {

tacclStatus setError(tacclRuntime* h, const std::string& m) {
  if (h) h->setMessage(m);
  return TACCL_ERROR;
}

template <class F>
tacclStatus guarded(tacclRuntime* h, F&& f) {
  if (!h) return TACCL_ERROR;
  try {
    h->setMessage("");
    return f();
  } catch (const taccl::ProgramError& e) {
    return setError(h, e.what());
  } catch (const std::bad_alloc&) {
    return setError(h, "out of memory");
  } catch (const std::exception& e) {
    return setError(h, std::string("internal error: ") + e.what());
  } catch (...) {
    return setError(h, "internal error");
  }
}

}  // namespace

extern "C" {

tacclRuntime* tacclCreate(void) {
  try {
    return new tacclRuntime();
  } catch (...) {
    return nullptr;
  }
}

void tacclDestroy(tacclRuntime* h) { delete h; }

const char* tacclLastError(const tacclRuntime* h) {
  if (!h) return "null handle";
  static thread_local std::string copy;  // stable for the caller until its next call on the handle
  auto* m = const_cast<tacclRuntime*>(h);
  std::lock_guard<std::mutex> lock(m->errorMu);
  auto it = m->errors.find(std::this_thread::get_id());
  copy = it == m->errors.end() ? "" : it->second;
  return copy.c_str();
}

tacclStatus tacclSetOption(tacclRuntime* h, const char* name, int64_t value) {
  return guarded(h, [&]() -> tacclStatus {
    if (!name) return setError(h, "null option name");
    std::string n(name);
    if (n == "backend") {
      if (value != 0 && value != 1) return setError(h, "backend must be 0 (host) or 1 (cuda)");
      if (value == 1 && !taccl::cudaAvailable())
        return setError(h, "the CUDA backend is unavailable (library built without nvcc, or no usable GPU)");
      h->rt.backend = (int)value;
    } else if (n == "timeout_ms") {
      if (value <= 0) return setError(h, "timeout_ms must be positive");
      h->rt.run.timeoutMs = value;
    } else if (n == "tile_bytes") {
      if (value < 0) return setError(h, "tile_bytes must be >= 0");
      h->rt.tileBytes = value;
    } else if (n == "analysis") {
      h->rt.analysis = value != 0;
    } else if (n == "cuda_cache") {
      h->rt.cudaCache = value != 0;
    } else if (n == "ll128") {
      h->rt.run.ll128 = value != 0;
    } else if (n == "direct") {
      h->rt.run.direct = value != 0;
    } else if (n == "cuda_hold") {
      h->rt.run.hold = value != 0;
    } else if (n == "cuda_cooperative") {
      h->rt.run.cooperative = value != 0;
    } else if (n == "cuda_devices") {
      if (value < 0) return setError(h, "cuda_devices must be >= 0");
      h->rt.run.cudaDevices = (int)value;
    } else {
      return setError(h, "unknown option '" + n + "'");
    }
    return TACCL_OK;
  });
}

tacclStatus tacclLoadFile(tacclRuntime* h, const char* path) {
  return guarded(h, [&]() -> tacclStatus {
    if (!path) return setError(h, "null path");
    h->rt.loadFile(path);
    return TACCL_OK;
  });
}

tacclStatus tacclLoadFromEnv(tacclRuntime* h, int* nloaded) {
  return guarded(h, [&]() -> tacclStatus {
    int n = h->rt.loadFromEnv();
    if (nloaded) *nloaded = n;
    return n == 0 ? TACCL_WARNING : TACCL_OK;
  });
}

tacclStatus tacclSwap(tacclRuntime* h, const char* paths, int64_t epoch, int64_t* applied) {
  return guarded(h, [&]() -> tacclStatus {
    if (!paths || !*paths) return setError(h, "no file given for the new set");
    const int64_t e = h->rt.swap(taccl::splitPathList(paths), epoch);
    if (applied) *applied = e;
    return TACCL_OK;
  });
}

int64_t tacclNextCall(const tacclRuntime* h) { return h ? h->rt.nextCall() : -1; }

tacclStatus tacclWatch(tacclRuntime* h, const char* dir, int64_t everyMs) {
  return guarded(h, [&]() -> tacclStatus {
    h->rt.watch(dir ? dir : "", everyMs);
    return TACCL_OK;
  });
}

tacclStatus tacclWatchStatus(tacclRuntime* h, int64_t* swaps) {
  return guarded(h, [&]() -> tacclStatus {
    auto [n, error] = h->rt.watchStatus();
    if (swaps) *swaps = n;
    if (error.empty()) return TACCL_OK;
    h->setMessage(error);
    return TACCL_WARNING;
  });
}

int tacclNumPrograms(const tacclRuntime* h) { return h ? (int)h->rt.programs()->programs.size() : 0; }

tacclStatus tacclGetProgramInfo(const tacclRuntime* h, int index, tacclProgramInfo* info) {
  if (!h || !info) return TACCL_ERROR;
  auto set = h->rt.programs();  // its strings stay valid: the handle keeps every set it had
  if (index < 0 || index >= (int)set->programs.size()) return TACCL_ERROR;
  const taccl::Program& p = *set->programs[index];
  info->path = p.path.c_str();
  info->name = p.name.c_str();
  info->coll = (int)p.coll;
  info->proto = (int)p.proto;
  info->ngpus = p.ngpus;
  info->nchannels = p.nchannels;
  info->nchunksperloop = p.nchunks;
  info->inplace = p.inplace;
  info->outofplace = p.outofplace;
  info->minBytes = p.minBytes;
  info->maxBytes = p.maxBytes;
  info->maxThreadBlocks = p.maxTbs();
  info->receives = info->directReceives = 0;
  for (auto& r : p.ranks)
    for (auto& tb : r.tbs)
      for (auto& st : tb.steps)
        if (st.type != taccl::ST_NOP && taccl::stepRecvs(st.type)) {
          info->receives++;
          info->directReceives += (st.direct & taccl::DIRECT_RECV) != 0;
        }
  return TACCL_OK;
}

tacclStatus tacclSelect(const tacclRuntime* h, int coll, int nranks, int64_t count, int dtype, int inplace, int* index) {
  if (!h || !index || coll < 0 || coll > 5) return TACCL_ERROR;
  try {
    *index = h->rt.select((taccl::Coll)coll, nranks, count, dtype, inplace != 0);
  } catch (...) {
    return TACCL_ERROR;
  }
  return TACCL_OK;
}

static tacclStatus runImpl(tacclRuntime* h, int program, int coll, int dtype, int op, int nranks, int64_t count,
                           void* const* sendbufs, void* const* recvbufs, int root, tacclRunResult* result, bool host) {
  return guarded(h, [&]() -> tacclStatus {
    if (!result) return setError(h, "null result");
    result->outcome = TACCL_RUN_FAILED;
    result->program = -1;
    result->elapsedUs = 0;
    result->tiles = 0;
    result->call = result->generation = -1;
    if (coll < 0 || coll > 5) return setError(h, "unknown collective " + std::to_string(coll));
    int chosen = -1;
    int64_t tiles = 0;
    taccl::CallStamp stamp;
    taccl::RunReport rep = h->rt.runCall(program, (taccl::Coll)coll, dtype, op, nranks, count, sendbufs, recvbufs,
                                         root, host, &chosen, &tiles, &stamp);
    result->outcome = (int)rep.outcome;
    result->program = chosen;
    result->elapsedUs = rep.elapsedUs;
    result->tiles = tiles;
    result->call = stamp.call;
    result->generation = stamp.generation;
    h->setMessage(rep.message);
    return TACCL_OK;
  });
}

tacclStatus tacclRun(tacclRuntime* h, int program, int coll, int dtype, int op, int nranks, int64_t count,
                     void* const* sendbufs, void* const* recvbufs, int root, tacclRunResult* result) {
  return runImpl(h, program, coll, dtype, op, nranks, count, sendbufs, recvbufs, root, result, false);
}

tacclStatus tacclRunHostBuffers(tacclRuntime* h, int program, int coll, int dtype, int op, int nranks, int64_t count,
                                void* const* sendbufs, void* const* recvbufs, int root, tacclRunResult* result) {
  return runImpl(h, program, coll, dtype, op, nranks, count, sendbufs, recvbufs, root, result, true);
}

int tacclCudaAvailable(void) {
  try {
    return taccl::cudaAvailable() ? 1 : 0;
  } catch (...) {
    return 0;
  }
}

tacclStatus tacclCudaMemcpyUs(int64_t bytes, int iters, double* us) {
  if (!us || bytes <= 0 || iters <= 0) return TACCL_ERROR;
  try {
    return taccl::cudaMemcpyUs(bytes, iters, us) ? TACCL_OK : TACCL_ERROR;
  } catch (...) {
    return TACCL_ERROR;
  }
}

tacclStatus tacclCheckFile(const char* path, char* err, size_t errlen) {
  std::string msg;
  try {
    if (!path) msg = "null path";
    else taccl::loadProgramFile(path);
  } catch (const std::exception& e) {
    msg = e.what();
  } catch (...) {
    msg = "internal error";
  }
  if (err && errlen) {
    size_t n = msg.size() < errlen - 1 ? msg.size() : errlen - 1;
    std::memcpy(err, msg.data(), n);
    err[n] = '\0';
  }
  return msg.empty() ? TACCL_OK : TACCL_ERROR;
}

size_t tacclTypeSize(int dtype) { return taccl::typeSize(dtype); }

const char* tacclCollName(int coll) {
  if (coll < 0 || coll > 5) return "?";
  return taccl::collName((taccl::Coll)coll);
}

}  // extern "C"
