// Linked into the host-only library: the CUDA backend is absent.
#include "plan.h"

namespace taccl {
bool cudaAvailable() { return false; }
bool cudaMemcpyUs(int64_t, int, double*) { return false; }
CudaCache* newCudaCache() { return nullptr; }
void freeCudaCache(CudaCache*) {}
RunReport runCuda(const Plan&, const std::vector<char*>&, bool, const RunOptions&, CudaCache*) {
  RunReport r;
  r.outcome = Outcome::Failed;
  r.message = "this library was built without the CUDA backend (no nvcc); rebuild with `make runtime` where nvcc exists";
  return r;
}
}  // namespace taccl
