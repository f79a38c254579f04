// The runtime object behind the C API handle: a communicator's programs, options, selection and dispatch.
#pragma once
#include <condition_variable>
#include <map>
#include <memory>
#include <mutex>
#include <thread>
#include <string>
#include <vector>

#include "plan.h"
#include "program.h"

namespace taccl {

// The programs a communicator selects from. A set in use is never edited: loading makes a new set, and a
// swap replaces the whole set at one call (its epoch), so no call ever sees programs of two sets.
struct ProgramSet {
  std::vector<std::shared_ptr<const Program>> programs;
  int64_t generation = 0;  // 0 for the first set, +1 for each set made since
};

// What a call ran on: its sequence number and the generation of the set it used.
struct CallStamp {
  int64_t call = -1, generation = -1;
};

class Runtime {
 public:
  int backend = 0;  // 0 host, 1 cuda
  RunOptions run;
  int64_t tileBytes = 0;
  bool analysis = true;
  bool cudaCache = true;  // keep the CUDA backend's per-shape state between calls

  Runtime();
  void loadFile(const std::string& path);        // throws ProgramError
  int loadFromEnv();                             // throws ProgramError; all or nothing
  // The set the next call would use (pending swaps whose epoch has come included).
  std::shared_ptr<const ProgramSet> programs() const;
  // First matching program or -1 (msccl-xml.md 2.2). Rooted collectives (broadcast, reduce) match the
  // program's root too.
  int select(Coll coll, int nranks, int64_t count, int dtype, bool inplace, int root = 0) const;
  // Live reconfiguration: load `paths` (files, or directories: their files in name order) into a new set,
  // validated whole, that serves every call numbered >= `epoch` (-1: as soon as possible, the next call or
  // the one after the last set already waiting). Calls already
  // running, and those before the epoch, keep the set they started with. Refused (ProgramError, the
  // current set keeps serving) when a file fails to load or prove, the set mixes XML dialects, a program is
  // for another rank count than the communicator's, it drops a collective the current set serves, or the
  // epoch has passed or already has a set. Returns the epoch.
  int64_t swap(const std::vector<std::string>& paths, int64_t epoch);
  int64_t nextCall() const;
  // Watch `dir` (an MSCCL_ALGO_DIR that a batch rewrites by replacing it whole): a thread checks it every
  // `everyMs` and swaps in its files, as soon as possible, when it changes; a set that is refused is
  // reported by watchStatus() and the current one keeps serving. An empty dir stops watching.
  void watch(const std::string& dir, int64_t everyMs);
  // The watcher's last outcome: the number of sets it swapped in, and the last refusal ("" if none).
  std::pair<int64_t, std::string> watchStatus() const;
  ~Runtime();
  // bufs: per rank send and recv pointers. Detects in-place from the pointers.
  RunReport runCall(int program, Coll coll, int dtype, int op, int nranks, int64_t count, void* const* send,
                    void* const* recv, int root, bool hostBuffers, int* chosen, int64_t* tiles,
                    CallStamp* stamp = nullptr);

 private:
  std::shared_ptr<const Program> load(const std::string& path) const;
  void append(std::vector<std::shared_ptr<const Program>> more);
  void applyDue(int64_t call);  // under mu_: make current the last pending set whose epoch has come

  mutable std::mutex mu_;
  std::shared_ptr<const ProgramSet> set_;
  std::map<int64_t, std::shared_ptr<const ProgramSet>> pending_;  // epoch -> set
  std::vector<std::shared_ptr<const ProgramSet>> history_;  // every set: tacclProgramInfo's strings live on
  int64_t nextCall_ = 0, generations_ = 0;
  int ranks_ = 0;  // the communicator's rank count, from its first call (0: no call yet)
  // the directory watcher (watch())
  std::thread watcher_;
  std::condition_variable watchWake_;
  bool watchStop_ = false;
  int64_t watchSwaps_ = 0;
  std::string watchError_;
  // the CUDA backend's state kept between calls (freed before the programs it was built for); shared with
  // the calls running on it, so that turning `cudaCache` off frees it once the last of them returns
  std::shared_ptr<CudaCache> cudaCache_;
};

// The paths of a colon-separated list (MSCCL_XML_FILES, tacclSwap), empty entries skipped.
std::vector<std::string> splitPathList(const std::string& list);

bool detectInPlace(Coll coll, int nranks, int64_t count, size_t tsize, void* const* send, void* const* recv,
                   std::string* err);

}  // namespace taccl
