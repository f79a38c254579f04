#include "plan.h"

#include <map>
#include <sstream>
#include <tuple>

namespace taccl {

int64_t sizeMultiplier(Coll c, int nranks) {
  return (c == Coll::AllGather || c == Coll::ReduceScatter || c == Coll::AllToAll) ? nranks : 1;
}

bool callSize(Coll c, int nranks, int64_t count, size_t typeSize, int64_t* elems, int64_t* bytes) {
  int64_t n = 0, b = 0;
  if (__builtin_mul_overflow(count, sizeMultiplier(c, nranks), &n) ||
      __builtin_mul_overflow(n, (int64_t)typeSize, &b))
    return false;
  if (elems) *elems = n;
  if (bytes) *bytes = b;
  return true;
}

size_t typeSize(int dtype) {
  static const size_t sizes[] = {1, 1, 4, 4, 8, 8, 2, 2, 4, 8};
  return dtype >= 0 && dtype < 10 ? sizes[dtype] : 0;
}

Plan makePlan(const Program& p, const CallSpec& call, int64_t tileBytesOverride) {
  Plan pl;
  pl.prog = &p;
  pl.call = call;
  pl.typeSize = typeSize(call.dtype);
  if (!pl.typeSize) throw ProgramError("unknown data type " + std::to_string(call.dtype));
  if (call.nranks != p.ngpus)
    throw ProgramError(p.path + ": written for " + std::to_string(p.ngpus) + " ranks, called with " + std::to_string(call.nranks));
  if (call.coll != p.coll)
    throw ProgramError(p.path + ": the program is for " + collName(p.coll) + ", not " + collName(call.coll));
  if (call.inplace ? !p.inplace : !p.outofplace)
    throw ProgramError(p.path + ": the program is not for " + (call.inplace ? "in-place" : "out-of-place") + " calls");
  if (call.count <= 0) throw ProgramError("count must be positive");
  if (!callSize(call.coll, call.nranks, call.count, pl.typeSize, &pl.N, nullptr))
    throw ProgramError("count " + std::to_string(call.count) + ": the call's buffers would exceed 2^63 bytes");
  if (pl.N % p.nchunks != 0)
    throw ProgramError(p.path + ": " + std::to_string(pl.N) + " elements are not divisible by nchunksperloop=" + std::to_string(p.nchunks));
  pl.S = pl.N / p.nchunks;
  int64_t tileBytes = tileBytesOverride > 0 ? tileBytesOverride : protoTileBytes(p.proto);
  pl.C = tileBytes / (int64_t)pl.typeSize;
  if (pl.C < 1) pl.C = 1;
  // maxAllowedCount: whole chunks per primitive call when a chunk fits in a tile.
  const int64_t chunkBytes = pl.S * (int64_t)pl.typeSize;
  int64_t m = tileBytes / chunkBytes;
  pl.M = (int)(m < 1 ? 1 : m > kMaxCount - 1 ? kMaxCount - 1 : m);
  pl.iters = (pl.S + pl.C - 1) / pl.C;
  if (pl.iters >= kMaxIter)
    throw ProgramError(p.path + ": " + std::to_string(pl.iters) + " tiles per chunk exceed the runtime's limit of 65535");
  pl.nslots = protoSlots(p.proto);
  int64_t callElems = (int64_t)pl.M * (pl.S < pl.C ? pl.S : pl.C);
  pl.slotBytes = (callElems * (int64_t)pl.typeSize + 63) / 64 * 64;

  std::map<std::tuple<int, int, int>, int> connIndex;  // (sendRank, chan, recvRank)
  for (int r = 0; r < p.ngpus; ++r)
    for (auto& tb : p.ranks[r].tbs)
      if (tb.send >= 0) {
        connIndex[{r, tb.chan, tb.send}] = (int)pl.conns.size();
        pl.conns.push_back({r, tb.send, tb.chan});
      }
  int flag = 0;
  for (int r = 0; r < p.ngpus; ++r) {
    const RankProgram& rp = p.ranks[r];
    const int flagBase = flag;
    for (auto& tb : rp.tbs) {
      TbLaunch t{};
      t.rank = r;
      t.tb = tb.id;
      t.sendPeer = tb.send;
      t.recvPeer = tb.recv;
      t.chan = tb.chan;
      t.sendConn = tb.send >= 0 ? connIndex[{r, tb.chan, tb.send}] : -1;
      auto it = tb.recv >= 0 ? connIndex.find({tb.recv, tb.chan, r}) : connIndex.end();
      t.recvConn = it != connIndex.end() ? it->second : -1;
      t.nsteps = (int)tb.steps.size();
      t.firstStep = (int)pl.steps.size();
      t.flag = flag++;
      t.flagBase = flagBase;
      pl.steps.insert(pl.steps.end(), tb.steps.begin(), tb.steps.end());
      pl.tbs.push_back(t);
    }
    const int64_t in = call.coll == Coll::AllGather ? pl.N / p.ngpus : pl.N;
    const int64_t out = call.coll == Coll::ReduceScatter ? pl.N / p.ngpus : pl.N;
    pl.inElems.push_back(in);
    pl.outElems.push_back(out);
    pl.scratchElems.push_back((int64_t)rp.sChunks * pl.S);
  }
  return pl;
}

std::string describeWait(const Plan& plan, int g, const WaitInfo& w) {
  const TbLaunch& t = plan.tbs[g];
  std::ostringstream o;
  o << "rank " << t.rank << " tb " << t.tb << " step " << w.step << " (tile " << w.iter << "): ";
  switch (w.kind) {
    case WAIT_DEP: o << "waits for tb " << w.target << " step " << w.pad << " of its rank (dependency)"; break;
    case WAIT_RECV: o << "waits for data from rank " << w.target << " on channel " << t.chan; break;
    case WAIT_SEND:
      o << "cannot send to rank " << w.target << " on channel " << t.chan << ": the FIFO is full (" << plan.nslots
        << " calls in flight, not yet received)";
      break;
    default: o << "waits"; break;
  }
  return o.str();
}

}  // namespace taccl
