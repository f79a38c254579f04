/* taccl runtime: an interpreter for MSCCL XML programs (see ../README.md).
 *
 * Two tiers, as in HiGHS:
 *   - one-shot:  tacclCheckFile() validates one file;
 *   - handle:    tacclCreate() ... tacclDestroy(h). Every handle made by tacclCreate must be given back
 *                to tacclDestroy exactly once.
 *
 * Every call returns a call status (TACCL_OK, TACCL_WARNING or TACCL_ERROR). What happened to a collective
 * is a separate answer, tacclRunResult.outcome. On TACCL_ERROR the message is available from
 * tacclLastError(h) (or the caller's buffer for the one-shot calls).
 *
 * The caller owns every buffer. No C++ exception crosses this interface.
 */
#ifndef TACCL_RUNTIME_H
#define TACCL_RUNTIME_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum { TACCL_ERROR = -1, TACCL_OK = 0, TACCL_WARNING = 1 } tacclStatus;

typedef enum {
  TACCL_ALLGATHER = 0,
  TACCL_REDUCESCATTER = 1,
  TACCL_ALLREDUCE = 2,
  TACCL_ALLTOALL = 3,
  TACCL_BROADCAST = 4,
  TACCL_REDUCE = 5
} tacclColl;

typedef enum {
  TACCL_INT8 = 0, TACCL_UINT8 = 1, TACCL_INT32 = 2, TACCL_UINT32 = 3, TACCL_INT64 = 4, TACCL_UINT64 = 5,
  TACCL_FLOAT16 = 6, TACCL_BFLOAT16 = 7, TACCL_FLOAT32 = 8, TACCL_FLOAT64 = 9
} tacclDataType;

typedef enum { TACCL_SUM = 0, TACCL_PROD = 1, TACCL_MIN = 2, TACCL_MAX = 3 } tacclRedOp;

typedef enum { TACCL_BACKEND_HOST = 0, TACCL_BACKEND_CUDA = 1 } tacclBackend;

typedef enum {
  TACCL_RUN_DONE = 0,      /* the program ran to completion */
  TACCL_RUN_NO_MATCH = 1,  /* no loaded program matches the call (the caller should fall back) */
  TACCL_RUN_DEADLOCK = 2,  /* the watchdog stopped the program; tacclLastError names the waiting blocks */
  TACCL_RUN_FAILED = 3     /* refused before running (bad arguments, backend unavailable); see tacclLastError */
} tacclOutcome;

/* Summary of one loaded program. Strings point into the handle and live until tacclDestroy. */
typedef struct {
  const char* path;
  const char* name;
  int coll;           /* tacclColl */
  int proto;          /* 0 Simple, 1 LL, 2 LL128 */
  int ngpus;
  int nchannels;
  int nchunksperloop;
  int inplace;        /* usable for in-place calls */
  int outofplace;     /* usable for out-of-place calls */
  int64_t minBytes;
  int64_t maxBytes;   /* 0: unbounded; otherwise inclusive */
  int maxThreadBlocks;/* largest tb count on one rank */
  int receives;       /* receiving steps, all ranks */
  int directReceives; /* of which the sender writes straight into the destination (option "direct") */
} tacclProgramInfo;

typedef struct {
  int outcome;        /* tacclOutcome */
  int program;        /* index of the program that ran, -1 if none */
  double elapsedUs;   /* wall time of the collective itself (host) or of the kernels (CUDA) */
  int64_t tiles;      /* tile iterations per chunk */
  int64_t call;       /* this call's sequence number on the handle (0, 1, 2, ...): the epochs of tacclSwap */
  int64_t generation; /* which program set the call ran on (0: the first; +1 per set loaded or swapped in) */
} tacclRunResult;

typedef struct tacclRuntime tacclRuntime;

/* Handle lifetime. tacclCreate returns NULL only when out of memory. */
tacclRuntime* tacclCreate(void);
void tacclDestroy(tacclRuntime* h);

/* Last error message of this handle in the calling thread ("" if none). Valid until the thread's next call
 * on the handle. */
const char* tacclLastError(const tacclRuntime* h);

/* Options (name, value):
 *   "backend"      tacclBackend (default host)
 *   "timeout_ms"   watchdog: abort after this long without progress (default 10000; env TACCL_RUNTIME_TIMEOUT_MS)
 *   "tile_bytes"   override the protocol tile size C in bytes, 0 = protocol default (env TACCL_RUNTIME_TILE_BYTES)
 *   "analysis"     1 (default): refuse programs with a dependency cycle or a data race at load time; 0: skip
 *                  (and with it the direct transfers, which the same analysis proves safe)
 *   "cuda_cache"   1 (default): the CUDA backend keeps its device tables, FIFOs, scratch and streams between
 *                  calls of the same shape (up to 8 shapes); 0: allocate and release them in every call
 *   "ll128"        CUDA backend: 1 runs LL128 programs with NCCL's LL128 line protocol (128-byte lines of 120
 *                  payload bytes and a flag, no fence): a few us less a call up to a few KiB a connection,
 *                  a quarter of the Simple path's bandwidth per block; 0 (default): the Simple path with
 *                  LL128's tiles (env TACCL_RUNTIME_LL128)
 *   "direct"       1 (default): a send writes straight into its receiver's buffer where the load-time analysis
 *                  proved it safe (not with the CUDA backend's LL lines); 0: every transfer through the FIFO
 *                  (env TACCL_RUNTIME_DIRECT)
 *   "cuda_hold"    1 (default): each GPU's stream is held by a spin kernel until the call's launches are all
 *                  queued, so the reported time is the GPU's (dispatch and kernel), as nccl-tests' back-to-back
 *                  calls measure it; 0: the events also time the host's submission of the launch (env
 *                  TACCL_RUNTIME_HOLD; never with CUDA_LAUNCH_BLOCKING=1)
 *   "cuda_cooperative" 1 (default): cooperative launch, which guarantees every block is co-resident; 0: a
 *                  plain launch, co-residency checked by occupancy only, as NCCL launches (another kernel
 *                  holding SMs can then stall the call until the watchdog; env TACCL_RUNTIME_COOPERATIVE)
 *   "cuda_devices" number of GPUs to spread ranks over, 0 = all visible (ranks map to GPU rank % n) */
tacclStatus tacclSetOption(tacclRuntime* h, const char* name, int64_t value);

/* Load and validate one file. On error nothing is loaded and the message names file, line, rank, tb, step. */
tacclStatus tacclLoadFile(tacclRuntime* h, const char* path);
/* Live reconfiguration. A handle is one communicator: every call takes the next sequence number, and a
 * program set serves calls from its epoch on. tacclSwap loads `paths` (colon-separated files or
 * directories, a directory standing for its files in name order) into a new set, validated whole, for the
 * calls numbered >= epoch (-1: as soon as possible: the next call, or the one after the last set already
 * waiting); *applied (may be NULL) gets the epoch. Calls already
 * running, and those before the epoch, finish on the set they started with; no call mixes two sets. On
 * TACCL_ERROR nothing changes and the current set keeps serving: a file fails to load or prove, the set
 * mixes the legacy and executor dialects, no program is for the communicator's rank count (from its calls,
 * else the counts the current set serves; programs for other counts, as a batch writes for several node
 * counts, are kept and serve no call of it), the set lacks a collective the current set serves at that
 * count, or the epoch has passed or already has a set.
 * Safe to call while other threads run collectives on the same handle. */
tacclStatus tacclSwap(tacclRuntime* h, const char* paths, int64_t epoch, int64_t* applied);
/* The sequence number the next call will take. */
int64_t tacclNextCall(const tacclRuntime* h);
/* Watch a directory (an MSCCL_ALGO_DIR that `taccl batch` rewrites): a thread of the handle checks it every
 * everyMs milliseconds and, when it changed, swaps its files in as tacclSwap(h, dir, -1) would, beside the
 * running calls. dir NULL or "" stops watching. */
tacclStatus tacclWatch(tacclRuntime* h, const char* dir, int64_t everyMs);
/* *swaps (may be NULL): sets the watcher swapped in so far. TACCL_WARNING when the last changed directory
 * was refused (the message in tacclLastError; the set before it keeps serving). */
tacclStatus tacclWatchStatus(tacclRuntime* h, int64_t* swaps);
/* Load every file of MSCCL_XML_FILES (colon-separated), or TACCL_XML_FILES when the former is unset.
 * All or nothing: if one file fails, none is kept. *nloaded may be NULL. */
tacclStatus tacclLoadFromEnv(tacclRuntime* h, int* nloaded);
int tacclNumPrograms(const tacclRuntime* h);
tacclStatus tacclGetProgramInfo(const tacclRuntime* h, int index, tacclProgramInfo* info);

/* Selection as the MSCCL executor does it: first program (in load order) whose coll, ngpus, in-place flag
 * and size window match and for which count*mult is divisible by nchunksperloop. nbytes is the size of the
 * larger buffer. *index = -1 when nothing matches (TACCL_OK is still returned). Broadcast and reduce: programs
 * for root 0 (tacclRun selects by the call's root). */
tacclStatus tacclSelect(const tacclRuntime* h, int coll, int nranks, int64_t count, int dtype, int inplace,
                        int* index);

/* Run a collective over nranks ranks held by this process.
 *   count: NCCL's count: per-rank elements for allgather/reducescatter, per-peer for alltoall, else total;
 *     at least 1 (NCCL returns at once for 0; here it is an error, so that nothing passes for a run).
 *   sendbufs[r], recvbufs[r]: the rank's buffers. With the host backend they are host memory; with the CUDA
 *     backend they are device memory on the GPU that rank r maps to (see "cuda_devices").
 *   In-place is detected from the pointers as NCCL does (allreduce/alltoall/broadcast/reduce: send == recv;
 *   allgather: send == recv + r*count; reducescatter: recv == send + r*count), and must agree on all ranks.
 *   program: an index to force that program (refused if it does not fit the call), or -1 to select.
 *   root: for broadcast and reduce, the call's root: only a program written for that root (its root
 *     attribute, 0 when absent) is selected or run (the MSCCL runtimes ignore root).
 * The call status is TACCL_OK whenever result->outcome was set; result may not be NULL. */
tacclStatus tacclRun(tacclRuntime* h, int program, int coll, int dtype, int op, int nranks, int64_t count,
                     void* const* sendbufs, void* const* recvbufs, int root, tacclRunResult* result);

/* Like tacclRun but the buffers are always host memory: with the CUDA backend the runtime stages them to
 * the GPUs and back, and result->elapsedUs times the kernels only. */
tacclStatus tacclRunHostBuffers(tacclRuntime* h, int program, int coll, int dtype, int op, int nranks,
                                int64_t count, void* const* sendbufs, void* const* recvbufs, int root,
                                tacclRunResult* result);

/* 1 if the library was built with the CUDA backend and a GPU is usable, else 0. */
int tacclCudaAvailable(void);

/* Reference for benchmarks: average microseconds of one cudaMemcpy of `bytes` from GPU 0 to GPU 1 (or within
 * GPU 0 when only one is visible), over `iters` copies after one warm-up. TACCL_ERROR without the CUDA backend. */
tacclStatus tacclCudaMemcpyUs(int64_t bytes, int iters, double* us);

/* One-shot: parse and validate one file (with the race/deadlock analysis). Writes the message (truncated to
 * errlen, always NUL-terminated when errlen > 0) on error; err may be NULL. */
tacclStatus tacclCheckFile(const char* path, char* err, size_t errlen);

/* Sizes and names. */
size_t tacclTypeSize(int dtype);
const char* tacclCollName(int coll);

#ifdef __cplusplus
}
#endif
#endif
