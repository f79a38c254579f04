// The runtime object behind the C API handle: loaded programs, options, selection and dispatch.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "plan.h"
#include "program.h"

namespace taccl {

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
  const std::vector<std::unique_ptr<Program>>& programs() const { return programs_; }
  // First matching program or -1 (msccl-xml.md 2.2).
  // Rooted collectives (broadcast, reduce) match the program's root too.
  int select(Coll coll, int nranks, int64_t count, int dtype, bool inplace, int root = 0) const;
  // bufs: per rank send and recv pointers. Detects in-place from the pointers.
  RunReport runCall(int program, Coll coll, int dtype, int op, int nranks, int64_t count, void* const* send,
                    void* const* recv, int root, bool hostBuffers, int* chosen, int64_t* tiles);

 private:
  std::vector<std::unique_ptr<Program>> programs_;
  // the CUDA backend's state kept between calls (declared before nothing it depends on: freed first)
  struct FreeCudaCache {
    void operator()(CudaCache* c) const { freeCudaCache(c); }
  };
  std::unique_ptr<CudaCache, FreeCudaCache> cudaCache_;
};

bool detectInPlace(Coll coll, int nranks, int64_t count, size_t tsize, void* const* send, void* const* recv,
                   std::string* err);

}  // namespace taccl
