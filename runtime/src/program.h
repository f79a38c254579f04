// The program model: an MSCCL XML file read into plain structs, validated against every rule of
// msccl-xml.md (sections 1.2-1.10 and "Rules a generator must respect") before anything may run it.
#pragma once
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "core.h"

namespace taccl {

enum class Coll : int { AllGather = 0, ReduceScatter = 1, AllReduce = 2, AllToAll = 3, Broadcast = 4, Reduce = 5 };
const char* collName(Coll c);
// Broadcast and Reduce: the collectives whose calls name a root.
inline bool rooted(Coll c) { return c == Coll::Broadcast || c == Coll::Reduce; }

// A refused file or call. The message is complete (file, line, rank, tb, step as known).
struct ProgramError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

struct TbProgram {
  int id = 0, send = -1, recv = -1, chan = 0;
  std::vector<Step> steps;  // document order, nops included (they carry one dependency each)
  std::vector<int> lines;   // source line of each step
  int line = 0;
};

struct RankProgram {
  int id = 0;
  int iChunks = 0, oChunks = 0, sChunks = 0;
  std::vector<TbProgram> tbs;
  int line = 0;
};

struct Program {
  std::string path, name;
  Coll coll = Coll::AllReduce;
  Proto proto = Proto::Simple;
  int nchannels = 1, nchunks = 1, ngpus = 1;
  bool inplace = false, outofplace = true;
  int root = 0;  // broadcast and reduce: the root the program is written for (attribute root, default 0)
  bool executorDialect = true;  // the file has outofplace (the executor's dialect), else the legacy one
  uint64_t uid = 0;  // unique in the process: caches key by it, never by an address a new program may reuse
  int64_t minBytes = 0, maxBytes = 0;  // maxBytes 0 = unbounded, else inclusive
  std::vector<RankProgram> ranks;      // indexed by rank id

  // Chunks each buffer of a rank actually has for this collective (the runtime's buffer sizes), for
  // bounds checks: input/output in units of chunks, scratch from s_chunks.
  int inputChunks() const;
  int outputChunks() const;
  int maxTbs() const;
};

struct LoadOptions {
  bool analysis = true;  // happens-before analysis: refuse dependency cycles and data races
};

// Parse and validate. Throws ProgramError with a located message.
Program loadProgramFile(const std::string& path, const LoadOptions& opt = {});
Program loadProgramText(const std::string& text, const std::string& path, const LoadOptions& opt = {});

// Happens-before analysis on the chunk level for one tile iteration (all iterations are alike and touch
// disjoint memory). Throws ProgramError naming a cycle (certain deadlock) or an unordered pair of steps in
// different thread blocks of one rank that touch the same chunk, one of them writing. Marks the receives
// whose sender may write straight into their destination (Step::direct): every other access of the
// receiving rank to those chunks happens before the send or after the receive.
void analyzeProgram(Program& p);

}  // namespace taccl
