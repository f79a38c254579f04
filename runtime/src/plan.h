// A launch plan: one program bound to one call (type, count), flattened into the POD tables the
// interpreter core reads (LaunchArgs). Shared by both backends.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "core.h"
#include "program.h"

namespace taccl {

struct CallSpec {
  Coll coll = Coll::AllReduce;
  int dtype = 0, op = 0, nranks = 0;
  int64_t count = 0;  // NCCL count
  bool inplace = false;
  int root = 0;
};

struct ConnSpec { int sendRank, recvRank, chan; };

struct Plan {
  const Program* prog = nullptr;
  CallSpec call;
  size_t typeSize = 0;
  int64_t N = 0, S = 0, C = 0;  // elements: largest buffer, per chunk, per tile
  int M = 1;
  int64_t iters = 0;
  int nslots = 0;
  int64_t slotBytes = 0;
  std::vector<Step> steps;
  std::vector<TbLaunch> tbs;     // all ranks, rank-major
  std::vector<ConnSpec> conns;
  std::vector<int64_t> inElems, outElems, scratchElems;  // per rank
};

int64_t sizeMultiplier(Coll c, int nranks);
// The call's largest buffer, in elements and bytes (msccl-xml.md 1.8: N = count x sizeMultiplier); false when
// either exceeds int64 (a count no buffer can have).
bool callSize(Coll c, int nranks, int64_t count, size_t typeSize, int64_t* elems, int64_t* bytes);
// Tile size C (msccl-xml.md 1.8) with NCCL's default buffer sizes (inline: tools/line_bw.cu uses them too).
inline int64_t protoTileBytes(Proto p) {
  switch (p) {
    case Proto::Simple: return 2 << 20;  // (NCCL_BUFFSIZE / 8) * 4
    case Proto::LL: return 32 << 10;     // LL buffer / 8 / 2
    case Proto::LL128: return 576000;    // (LL128 buffer / 8) * 15 / 16
  }
  return 2 << 20;
}
// Calls in flight per connection: Simple uses 4 of NCCL_STEPS=8 slots per call, LL and LL128 one.
inline int protoSlots(Proto p) { return p == Proto::Simple ? 2 : 8; }
size_t typeSize(int dtype);

// Throws ProgramError when the call cannot run this program (divisibility, tile count).
Plan makePlan(const Program& p, const CallSpec& call, int64_t tileBytesOverride);

struct RunOptions {
  int64_t timeoutMs = 10000;
  int cudaDevices = 0;
  bool direct = true;  // run the loader's direct transfers (Step::direct)
  bool ll128 = false;  // CUDA: LL128 programs run NCCL's LL128 line protocol (else the Simple path with
                       // LL128's tiles); off: its blocks move a quarter of the Simple path's bytes
  bool hold = true;    // CUDA: each GPU's stream waits in a spin kernel until every launch of the call is
                       // queued, so the call's events time the GPU's work, not the host's submission
  bool cooperative = true;  // CUDA: cooperative launch (co-residency guaranteed); false: a plain launch
                            // (co-residency only checked by occupancy, as NCCL launches)
};

enum class Outcome { Done = 0, NoMatch = 1, Deadlock = 2, Failed = 3 };
struct RunReport {
  Outcome outcome = Outcome::Done;
  double elapsedUs = 0;
  std::string message;
};

// bufs[r*3 + BufKind]: input, output and scratch of each rank (scratch may be null: the backend allocates).
RunReport runHost(const Plan& plan, const std::vector<char*>& bufs, const RunOptions& opt);

// What the CUDA backend keeps between calls of one runtime handle (a communicator): per launch shape, the
// device tables, FIFOs, counters, scratch and staging buffers, streams and events, so that a repeated call
// only resets its counters. Null where the library has no CUDA backend.
struct CudaCache;
CudaCache* newCudaCache();
void freeCudaCache(CudaCache* cache);
// Device pointers; host == true means bufs are host memory to stage through the GPUs. `cache` may be null
// (everything is allocated for this call and released after it).
RunReport runCuda(const Plan& plan, const std::vector<char*>& bufs, bool hostBuffers, const RunOptions& opt,
                  CudaCache* cache);
bool cudaAvailable();
// Average us of a GPU0->GPU1 (or GPU0->GPU0) cudaMemcpy; false without CUDA.
bool cudaMemcpyUs(int64_t bytes, int iters, double* us);

// Human-readable description of a wait, used in watchdog messages of both backends.
std::string describeWait(const Plan& plan, int g, const WaitInfo& w);

}  // namespace taccl
