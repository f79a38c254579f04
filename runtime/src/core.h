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
//   int tid(), nthreads()                 threads of one block cooperating on a call (host: 0, 1)
//   bool waitGE(uint64_t* p, uint64_t v, const WaitInfo&)  block until *p >= v; false = aborted
//   void publish(uint64_t* p, uint64_t v)  release-store v, after every thread's data writes
//   void beginWork(), endWork()            barriers around the data loop
//   template <class T> static T load(const T* p)  a load that sees other blocks' published writes
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
  uint8_t hasdep, pad;
};

// One connection (channel, sender rank -> receiver rank): a FIFO of nslots calls. Exactly one thread block
// sends on it and one receives from it (rule 1), so the counters have a single writer each.
struct Conn {
  uint64_t* head;  // calls written by the sender
  uint64_t* tail;  // calls consumed by the receiver
  char* data;      // nslots * slotBytes, lives with the receiver
  int sendRank, recvRank, chan, pad;
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
};

template <class B, class T, class Op>
struct Interpreter {
  // One primitive call: wait for the FIFOs, move or reduce n elements, post the FIFOs.
  TACCL_HD static bool genericOp(B& be, const LaunchArgs& a, const TbLaunch& tb, int type, uint64_t& rcnt,
                                 uint64_t& scnt, const T* src, T* dst, int64_t n, int step, int64_t iter) {
    const bool doRecv = stepRecvs(type), doSend = stepSends(type);
    const T* in = nullptr;
    T* out = nullptr;
    Conn* rc = doRecv ? &a.conns[tb.recvConn] : nullptr;
    Conn* sc = doSend ? &a.conns[tb.sendConn] : nullptr;
    if (doRecv) {
      WaitInfo w{WAIT_RECV, step, tb.recvPeer, 0, iter, rcnt + 1};
      if (!be.waitGE(rc->head, rcnt + 1, w)) return false;
      in = (const T*)(rc->data + (int64_t)(rcnt % (uint64_t)a.nslots) * a.slotBytes);
    }
    if (doSend) {
      // The FIFO holds nslots calls: call number scnt may be written once call scnt - nslots was consumed.
      if (scnt >= (uint64_t)a.nslots) {
        WaitInfo w{WAIT_SEND, step, tb.sendPeer, 0, iter, scnt - a.nslots + 1};
        if (!be.waitGE(sc->tail, scnt - a.nslots + 1, w)) return false;
      }
      out = (T*)(sc->data + (int64_t)(scnt % (uint64_t)a.nslots) * a.slotBytes);
    }
    be.beginWork();
    for (int64_t i = be.tid(); i < n; i += be.nthreads()) {
      T x;
      switch (type) {
        case ST_SEND: case ST_CPY: x = B::load(src + i); break;
        case ST_RECV: case ST_RCS: x = B::load(in + i); break;
        case ST_RE: x = Op::apply(B::load(dst + i), B::load(src + i)); break;
        default: x = Op::apply(B::load(in + i), B::load(src + i)); break;  // rrs, rrc, rrcs
      }
      if (stepWritesDst(type)) dst[i] = x;
      if (doSend) out[i] = x;
    }
    be.endWork();
    if (doRecv) be.publish(rc->tail, ++rcnt);
    if (doSend) be.publish(sc->head, ++scnt);
    return true;
  }

  // Run thread block g (index into a.tbs) to completion. Returns false when the backend aborted a wait.
  TACCL_HD static bool runTb(B& be, const LaunchArgs& a, int g) {
    const TbLaunch tb = a.tbs[g];
    T* bufs[3];
    for (int k = 0; k < 3; ++k) bufs[k] = (T*)a.bufs[tb.rank * 3 + k];
    uint64_t rcnt = 0, scnt = 0;
    int64_t iter = 0;
    for (int64_t gridOffset = 0; gridOffset < a.S; gridOffset += a.C, ++iter) {
      const int64_t nelem = a.S - gridOffset < a.C ? a.S - gridOffset : a.C;
      for (int s = 0; s < tb.nsteps; ++s) {
        const Step st = a.steps[tb.firstStep + s];
        if (st.depid >= 0) {
          const uint64_t want = (uint64_t)iter * kMaxSteps + (uint64_t)st.deps + 1;
          WaitInfo w{WAIT_DEP, s, st.depid, st.deps, iter, want};
          if (!be.waitGE(&a.flags[(int64_t)(tb.flagBase + st.depid) * kCounterStride], want, w)) return false;
        }
        if (st.type != ST_NOP) {
          for (int c = 0; c < st.cnt; c += a.M) {
            const int k = st.cnt - c < a.M ? st.cnt - c : a.M;
            const T* src = stepReadsSrc(st.type) ? bufs[st.srcbuf] + (int64_t)(st.srcoff + c) * a.S + gridOffset : nullptr;
            T* dst = stepWritesDst(st.type) ? bufs[st.dstbuf] + (int64_t)(st.dstoff + c) * a.S + gridOffset : nullptr;
            if (!genericOp(be, a, tb, st.type, rcnt, scnt, src, dst, (int64_t)k * nelem, s, iter)) return false;
          }
        }
        if (st.hasdep) be.publish(&a.flags[(int64_t)tb.flag * kCounterStride], (uint64_t)iter * kMaxSteps + s + 1);
      }
    }
    return true;
  }
};

}  // namespace taccl
