// The interpreter core, written once and compiled twice: by the host compiler for the host backend
// (host_backend.cc) and by nvcc for the CUDA backend (cuda_backend.cu).
//
// It implements msccl-xml.md section 3 / 1.8 / 1.9:
//   for each tile (gridOffset = 0, C, 2C, ... < S):
//     for each step of the thread block, in document order:
//       wait for its dependency (flag of block depid >= (tile, deps));
//       in calls of up to M whole chunks: wait for the FIFO(s), move/reduce, post the FIFO(s);
//       if hasdep: publish (tile, step) in this block's flag.
//
// A backend B is a policy type supplying:
//   bool waitGE(const uint64_t* p, uint64_t v, bool sys, const WaitInfo&, uint64_t& seen)
//        block until *p >= v and store the value read in `seen` (every thread of the block gets it);
//        false = aborted. `sys`: the writer may be on another GPU (else it is on this one, and a backend
//        may use a narrower scope)
//   void post(uint64_t* p1, uint64_t v1, uint64_t* p2, uint64_t v2, bool sys)
//        after every thread's writes, release-store v1 to p1 and v2 to p2 (either may be null); one
//        release covers both
//   bool endWork(bool ok)                        barrier after the data loop, before a post; returns
//                                                whether `ok` held in every thread of the block
//   static constexpr bool kLines                 the backend implements line protocols (LaunchArgs.lines):
//   bool moveLines<T, Op>(kind, a, aLines, b, d1, d2, n, inFlag, outFlag, const WaitInfo&)
//        move() where a (when aLines) and d2 are FIFO slots of flagged lines: kind 1, LL: 16-byte lines of 8
//        payload bytes and their call's flag twice; kind 2, LL128: 128-byte lines of 120 payload bytes and
//        the flag, written by 8 threads of one warp at once. A line is read once its flag says it is there
//        (no head counter, no fence); false = aborted while waiting
//   void postRelaxed(uint64_t* p, uint64_t v, bool sys)   a credit store that needs no release
//   void prefetch(const void* p, int64_t bytes)   a hint: bring the block's own tables (its steps, its
//        connections) close before it runs them; may do nothing
//   template <class T, class Op> void move(const T* a, const T* b, T* d1, T* d2, int64_t n)
//        x = a[i] (b null) or Op(a[i], b[i]); write x to d1[i] and/or d2[i] (either may be null).
//        Its loads must see other blocks' published writes (they may sit in another SM's or GPU's cache)
#pragma once
#include <stdint.h>

#include "types.h"

namespace taccl {

enum class Proto : int { Simple = 0, LL = 1, LL128 = 2 };

enum StepType : uint8_t {
  ST_SEND = 0, ST_RECV = 1, ST_RCS = 2, ST_RRS = 3, ST_RRC = 4, ST_RRCS = 5, ST_CPY = 6, ST_RE = 7, ST_NOP = 8
};
enum BufKind : uint8_t { BUF_I = 0, BUF_O = 1, BUF_S = 2 };

// Hard limits (msccl-xml.md 1.10). We take the legacy runtime's 256 steps (the executor's default build
// has 64; the loader warns about that in the program info, it does not refuse).
constexpr int kMaxSteps = 256;
constexpr int kMaxCount = 72;        // cnt < 72
constexpr int kMaxTbs = 1024;        // per rank
constexpr int kMaxChannels = 32;
constexpr int kMaxTbsPerChannel = 32;
constexpr int kMaxDepTarget = 127;   // stored as int8 by the runtimes
constexpr int kMaxOffset = 32767;    // int16
constexpr int64_t kMaxIter = 65536;  // tiles per chunk
constexpr int kMaxRanks = 256;       // our own cap: one process holds every rank

TACCL_HD bool stepRecvs(int t) { return t == ST_RECV || t == ST_RCS || t == ST_RRS || t == ST_RRC || t == ST_RRCS; }
TACCL_HD bool stepSends(int t) { return t == ST_SEND || t == ST_RCS || t == ST_RRS || t == ST_RRCS; }
TACCL_HD bool stepReadsSrc(int t) { return t == ST_SEND || t == ST_RRS || t == ST_RRC || t == ST_RRCS || t == ST_CPY || t == ST_RE; }
TACCL_HD bool stepWritesDst(int t) { return t == ST_RECV || t == ST_RCS || t == ST_RRC || t == ST_RRCS || t == ST_CPY || t == ST_RE; }
TACCL_HD bool stepReduces(int t) { return t == ST_RRS || t == ST_RRC || t == ST_RRCS || t == ST_RE; }

struct Step {
  uint8_t type, srcbuf, dstbuf, cnt;
  int16_t srcoff, dstoff;
  int16_t depid, deps;
  uint8_t hasdep;
  uint8_t direct;   // DIRECT_* bits, set by the loader's analysis (analyzeProgram)
  int16_t peeroff;  // with DIRECT_SEND: the first chunk of the receiver's destination
};

// Direct transfers (NCCL's P2P "direct" mode): where the loader proves it safe, a send writes straight into
// the buffer the matching receive would have copied into, instead of a FIFO slot, and that receive finds its
// data in place (one memory pass less per hop). The FIFO counters run as for any call, so ordering,
// credits and the watchdog are unchanged.
enum DirectBits : uint8_t {
  DIRECT_RECV = 1,  // a recv / rcs whose data the sender writes into its destination
  DIRECT_SEND = 2,  // a send-type step whose receiver is DIRECT_RECV; the receiver's dstbuf in bits 2-3
};
TACCL_HD int directPeerBuf(const Step& st) { return (st.direct >> 2) & 3; }

// One connection (channel, sender rank -> receiver rank): a FIFO of nslots calls. Exactly one thread block
// sends on it and one receives from it (rule 1), so the counters have a single writer each.
// Each side polls only a counter in its own memory: head and data live with the receiver, tail with the
// sender; the other side writes them.
struct Conn {
  uint64_t* head;  // calls written by the sender
  uint64_t* tail;  // calls consumed by the receiver
  char* data;      // nslots * slotBytes, lives with the receiver
  int sendRank, recvRank, chan;
  int local;       // both ends on one GPU: ordering at GPU scope is enough
};

// A block's view of its (at most one) receive and one send connection: calls done, and the last value
// seen of the other side's counter, so that a wait reads remote-written memory only when it must.
struct ConnState {
  uint64_t rcnt = 0, scnt = 0;          // calls received / sent so far
  uint64_t headSeen = 0, tailSeen = 0;  // last values read of the receive head and the send tail
};

struct TbLaunch {
  int rank, tb;
  int sendConn, recvConn;  // -1 when unused
  int sendPeer, recvPeer, chan;
  int nsteps, firstStep;
  int flag;      // this block's flag index
  int flagBase;  // flag index of tb 0 of this rank
};

enum WaitKind : int { WAIT_NONE = 0, WAIT_DEP = 1, WAIT_RECV = 2, WAIT_SEND = 3 };
struct WaitInfo {
  int kind, step, target, pad;  // target: tb id (dep), peer rank (recv/send)
  int64_t iter;
  uint64_t want;
};

// Flags and FIFO counters are padded to their own 64-byte line (flag state stays small and named).
constexpr int kCounterStride = 8;

struct LaunchArgs {
  const Step* steps;
  const TbLaunch* tbs;
  int ntbs;
  Conn* conns;
  int nslots;
  int64_t slotBytes;
  char* const* bufs;   // [rank * 3 + BufKind]
  uint64_t* flags;     // [flag * kCounterStride]
  int64_t S;           // elements per chunk
  int64_t C;           // tile elements
  int M;               // max chunks per call
  int lines;           // on a backend with kLines: FIFO slots hold flagged lines, 1 LL (slotBytes 2x the
                       // payload), 2 LL128 (128 bytes per 120); 0 none
  int direct;          // run the steps' DIRECT_* marks (never together with lines)
  uint32_t epoch;      // LL lines: call k of a connection carries flag epoch + k (k = 1, 2, ...), so lines
                       // left in a reused FIFO by an earlier run never match
};

// The element loop of a primitive (the host backend's whole move; the CUDA backend's unaligned heads and
// tails): x = a[i] or Op(a[i], b[i]), written to d1 and/or d2.
template <class B, class T, class Op>
TACCL_HD void scalarMove(const T* a, const T* b, T* d1, T* d2, int64_t first, int64_t n, int64_t stride) {
  for (int64_t i = first; i < n; i += stride) {
    const T x = b ? Op::apply(B::load(a + i), B::load(b + i)) : B::load(a + i);
    if (d1) d1[i] = x;
    if (d2) d2[i] = x;
  }
}

template <class B, class T, class Op>
struct Interpreter {
  // One primitive call: wait for the FIFOs, move or reduce n elements, post the FIFOs.
  // `remote`: a direct send's destination in the receiver's buffer (else the send fills a FIFO slot);
  // `directIn`: this receive's data was written into dst by its sender.
  TACCL_HD static bool genericOp(B& be, const LaunchArgs& a, const TbLaunch& tb, int type, ConnState& cs,
                                 const T* src, T* dst, T* remote, bool directIn, int64_t n, int step, int64_t iter) {
    const bool doRecv = stepRecvs(type), doSend = stepSends(type);
    const T* in = nullptr;
    T* out = nullptr;
    Conn* rc = doRecv ? &a.conns[tb.recvConn] : nullptr;
    Conn* sc = doSend ? &a.conns[tb.sendConn] : nullptr;
    bool lines = false;
    if constexpr (B::kLines) lines = a.lines != 0;
    if (doRecv) {
      if (!lines && cs.headSeen < cs.rcnt + 1) {
        WaitInfo w{WAIT_RECV, step, tb.recvPeer, 0, iter, cs.rcnt + 1};
        if (!be.waitGE(rc->head, cs.rcnt + 1, !rc->local, w, cs.headSeen)) return false;
      }
      in = directIn ? dst : (const T*)(rc->data + (int64_t)(cs.rcnt % (uint64_t)a.nslots) * a.slotBytes);
    }
    if (doSend) {
      // The FIFO holds nslots calls: call number scnt may be written once call scnt - nslots was consumed.
      if (cs.scnt >= (uint64_t)a.nslots && cs.tailSeen < cs.scnt - a.nslots + 1) {
        WaitInfo w{WAIT_SEND, step, tb.sendPeer, 0, iter, cs.scnt - a.nslots + 1};
        if (!be.waitGE(sc->tail, cs.scnt - a.nslots + 1, !sc->local, w, cs.tailSeen)) return false;
      }
      out = remote ? remote : (T*)(sc->data + (int64_t)(cs.scnt % (uint64_t)a.nslots) * a.slotBytes);
    }
    // The primitive as one move: source a (and b for a reduction), destinations d1 (the step's dst) and d2
    // (the send slot).
    const T* ma = in;
    const T* mb = stepReduces(type) ? src : nullptr;
    if (type == ST_SEND || type == ST_CPY) ma = src;
    else if (type == ST_RE) ma = dst;
    T* d1 = stepWritesDst(type) && !directIn ? dst : nullptr;  // a direct receive's data is already there
    if constexpr (B::kLines) {
      if (lines) {
        // LL: the lines carry their own flags, so the sender posts nothing and the receiver only returns
        // the slot (a credit: its reads are done, no data of its own to order).
        WaitInfo w{WAIT_RECV, step, doRecv ? tb.recvPeer : -1, 0, iter, cs.rcnt + 1};
        const bool ok = be.template moveLines<T, Op>(a.lines, ma, doRecv, mb, d1, out, n,
                                                     a.epoch + (uint32_t)(cs.rcnt + 1),
                                                     a.epoch + (uint32_t)(cs.scnt + 1), w);
        if (!be.endWork(ok)) return false;
        if (doRecv) be.postRelaxed(rc->tail, ++cs.rcnt, !rc->local);
        if (doSend) ++cs.scnt;
        return true;
      }
    }
    if (d1 || out) be.template move<T, Op>(ma, mb, d1, out, n);
    be.endWork(true);
    const bool sys = (doRecv && !rc->local) || (doSend && !sc->local);
    be.post(doRecv ? rc->tail : nullptr, doRecv ? ++cs.rcnt : 0, doSend ? sc->head : nullptr, doSend ? ++cs.scnt : 0, sys);
    return true;
  }

  // Run thread block g (index into a.tbs) to completion. Returns false when the backend aborted a wait.
  TACCL_HD static bool runTb(B& be, const LaunchArgs& a, int g) {
    const TbLaunch tb = a.tbs[g];
    // A step's descriptor is read when the step starts, on the path from one hop to the next; a small call
    // has one tile, so the first read of each line of them (8 steps) and of each connection would miss.
    be.prefetch(a.steps + tb.firstStep, (int64_t)tb.nsteps * (int64_t)sizeof(Step));
    if (tb.recvConn >= 0) be.prefetch(&a.conns[tb.recvConn], sizeof(Conn));
    if (tb.sendConn >= 0) be.prefetch(&a.conns[tb.sendConn], sizeof(Conn));
    T* bufs[3];
    for (int k = 0; k < 3; ++k) bufs[k] = (T*)a.bufs[tb.rank * 3 + k];
    ConnState cs;
    int64_t iter = 0;
    for (int64_t gridOffset = 0; gridOffset < a.S; gridOffset += a.C, ++iter) {
      const int64_t nelem = a.S - gridOffset < a.C ? a.S - gridOffset : a.C;
      for (int s = 0; s < tb.nsteps; ++s) {
        const Step st = a.steps[tb.firstStep + s];
        if (st.depid >= 0) {
          const uint64_t want = (uint64_t)iter * kMaxSteps + (uint64_t)st.deps + 1;
          WaitInfo w{WAIT_DEP, s, st.depid, st.deps, iter, want};
          uint64_t seen;
          if (!be.waitGE(&a.flags[(int64_t)(tb.flagBase + st.depid) * kCounterStride], want, false, w, seen)) return false;
        }
        if (st.type != ST_NOP) {
          const int direct = a.direct ? st.direct : 0;
          T* peer = direct & DIRECT_SEND ? (T*)a.bufs[tb.sendPeer * 3 + directPeerBuf(st)] : nullptr;
          for (int c = 0; c < st.cnt; c += a.M) {
            const int k = st.cnt - c < a.M ? st.cnt - c : a.M;
            const T* src = stepReadsSrc(st.type) ? bufs[st.srcbuf] + (int64_t)(st.srcoff + c) * a.S + gridOffset : nullptr;
            T* dst = stepWritesDst(st.type) ? bufs[st.dstbuf] + (int64_t)(st.dstoff + c) * a.S + gridOffset : nullptr;
            T* remote = peer ? peer + (int64_t)(st.peeroff + c) * a.S + gridOffset : nullptr;
            if (!genericOp(be, a, tb, st.type, cs, src, dst, remote, (direct & DIRECT_RECV) != 0, (int64_t)k * nelem, s,
                           iter))
              return false;
          }
        }
        if (st.hasdep)
          be.post(&a.flags[(int64_t)tb.flag * kCounterStride], (uint64_t)iter * kMaxSteps + s + 1, nullptr, 0, false);
      }
    }
    return true;
  }
};

}  // namespace taccl
