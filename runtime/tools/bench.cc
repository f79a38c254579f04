// taccl_bench: nccl-tests-style benchmark of the runtime on one XML program.
//
//   taccl_bench -x FILE.xml [-b MINBYTES] [-e MAXBYTES] [-f FACTOR] [-w WARMUP] [-n ITERS] [-c 0|1]
//               [-d int8|uint8|int32|uint32|int64|uint64|float16|bfloat16|float32|float64] [-o sum|prod|min|max]
//               [-B host|cuda] [-t TIMEOUT_MS]
//
// Sizes are the bytes of the larger buffer (as MSCCL's selection window), read as nccl-tests reads them: a
// K, M or G after the number multiplies by a power of 1024 (1M = 1048576). Sizes that the program cannot run
// (divisibility) are skipped. Columns follow nccl-tests: out-of-place then in-place, each with time (us),
// algbw and busbw (GB/s) and #wrong (-1 = not checked). The exit code is 1 when any check fails.
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#include "taccl_runtime.h"
#include "types.h"

namespace {

const char* kTypes[] = {"int8", "uint8", "int32", "uint32", "int64", "uint64", "float16", "bfloat16", "float32", "float64"};
const char* kOps[] = {"sum", "prod", "min", "max"};

// Bytes of a size such as 4096, 64K, 1M or 1G (only the unit's first letter counts, as in nccl-tests:
// 1MB and 1MiB are 1M too); -1 when it is not one.
int64_t parseSize(const char* text) {
  char* end = nullptr;
  double v = std::strtod(text, &end);
  if (end == text || !(v >= 0)) return -1;
  double scale = 1;
  switch (*end) {
    case 'K': case 'k': scale = 1024.0; break;
    case 'M': case 'm': scale = 1024.0 * 1024; break;
    case 'G': case 'g': scale = 1024.0 * 1024 * 1024; break;
    case '\0': break;
    default: return -1;
  }
  v *= scale;
  if (v != std::floor(v) || v > 9.0e18) return -1;
  return (int64_t)v;
}

void store(int dt, void* base, int64_t i, double v) {
  switch (dt) {
    case 0: ((int8_t*)base)[i] = (int8_t)v; break;
    case 1: ((uint8_t*)base)[i] = (uint8_t)v; break;
    case 2: ((int32_t*)base)[i] = (int32_t)v; break;
    case 3: ((uint32_t*)base)[i] = (uint32_t)v; break;
    case 4: ((int64_t*)base)[i] = (int64_t)v; break;
    case 5: ((uint64_t*)base)[i] = (uint64_t)v; break;
    case 6: ((taccl::f16*)base)[i] = taccl::toF16((float)v); break;
    case 7: ((taccl::bf16*)base)[i] = taccl::toBF16((float)v); break;
    case 8: ((float*)base)[i] = (float)v; break;
    case 9: ((double*)base)[i] = v; break;
  }
}
double loadv(int dt, const void* base, int64_t i) {
  switch (dt) {
    case 0: return ((const int8_t*)base)[i];
    case 1: return ((const uint8_t*)base)[i];
    case 2: return ((const int32_t*)base)[i];
    case 3: return ((const uint32_t*)base)[i];
    case 4: return (double)((const int64_t*)base)[i];
    case 5: return (double)((const uint64_t*)base)[i];
    case 6: return taccl::toFloat(((const taccl::f16*)base)[i]);
    case 7: return taccl::toFloat(((const taccl::bf16*)base)[i]);
    case 8: return ((const float*)base)[i];
    default: return ((const double*)base)[i];
  }
}
// Small values keep every reduction exact in every type: sums stay below 128, products are powers of two.
double value(int op, int r, int64_t k) {
  if (op == 1) return (double)(1 + ((r + k) % 2));
  return (double)((r * 3 + k) % 13);
}
double combine(int op, double a, double b) {
  switch (op) {
    case 0: return a + b;
    case 1: return a * b;
    case 2: return a < b ? a : b;
    default: return a > b ? a : b;
  }
}

double busFactor(int coll, int n) {
  switch (coll) {
    case TACCL_ALLREDUCE: return 2.0 * (n - 1) / n;
    case TACCL_ALLGATHER: case TACCL_REDUCESCATTER: case TACCL_ALLTOALL: return (double)(n - 1) / n;
    default: return 1.0;
  }
}

struct Case {
  double us = 0;
  long wrong = -1;
  bool ran = false;
  std::string error;
};

Case runCase(tacclRuntime* h, const tacclProgramInfo& info, int dt, int op, int64_t count, bool inplace, int warm,
             int iters, bool check) {
  Case c;
  const int R = info.ngpus, coll = info.coll;
  const size_t ts = tacclTypeSize(dt);
  const int64_t mult = (coll == TACCL_ALLGATHER || coll == TACCL_REDUCESCATTER || coll == TACCL_ALLTOALL) ? R : 1;
  const int64_t inN = coll == TACCL_ALLGATHER ? count : count * mult;
  const int64_t outN = coll == TACCL_REDUCESCATTER ? count : count * mult;
  const int64_t big = inN > outN ? inN : outN;
  std::vector<std::vector<char>> mem;
  try {  // each rank's send and receive buffers, on the host
    int64_t bytes = 0;
    if (__builtin_mul_overflow(big, 2 * (int64_t)ts, &bytes)) throw std::length_error("size");
    mem.assign(R, std::vector<char>((size_t)bytes));
  } catch (const std::exception&) {
    c.error = "cannot allocate the host buffers of " + std::to_string(R) + " ranks for " + std::to_string(count) +
              " elements each (twice the largest buffer a rank)";
    return c;
  }
  std::vector<void*> send(R), recv(R);
  auto fill = [&]() {
    for (int r = 0; r < R; ++r) {
      char* b = mem[r].data();
      if (!inplace) { send[r] = b + big * ts; recv[r] = b; }
      else if (coll == TACCL_ALLGATHER) { recv[r] = b; send[r] = b + r * count * ts; }
      else if (coll == TACCL_REDUCESCATTER) { send[r] = b; recv[r] = b + r * count * ts; }
      else { send[r] = recv[r] = b; }
      for (int64_t k = 0; k < inN; ++k) store(dt, send[r], k, value(op, r, k));
    }
  };
  tacclRunResult res;
  for (int i = 0; i < warm + iters + (check ? 1 : 0); ++i) {
    bool last = check && i == warm + iters;
    if (last || i == 0) fill();
    if (tacclRunHostBuffers(h, 0, coll, dt, op, R, count, send.data(), recv.data(), 0, &res) != TACCL_OK ||
        res.outcome != TACCL_RUN_DONE) {
      c.error = tacclLastError(h);
      return c;
    }
    if (i >= warm && i < warm + iters) c.us += res.elapsedUs;
  }
  c.ran = true;
  c.us /= iters > 0 ? iters : 1;
  if (!check) return c;
  c.wrong = 0;
  for (int r = 0; r < R; ++r) {
    if (coll == TACCL_REDUCE && r != 0) continue;
    for (int64_t k = 0; k < outN; ++k) {
      double want;
      switch (coll) {
        case TACCL_ALLGATHER: want = value(op, (int)(k / count), k % count); break;
        case TACCL_ALLTOALL: want = value(op, (int)(k / count), r * count + k % count); break;
        case TACCL_BROADCAST: want = value(op, 0, k); break;
        default: {
          int64_t kk = coll == TACCL_REDUCESCATTER ? r * count + k : k;
          want = value(op, 0, kk);
          for (int q = 1; q < R; ++q) want = combine(op, want, value(op, q, kk));
          std::vector<char> tmp(ts);
          store(dt, tmp.data(), 0, want);  // the exact value wrapped or rounded to the type
          want = loadv(dt, tmp.data(), 0);
        }
      }
      if (loadv(dt, recv[r], k) != want) c.wrong++;
    }
  }
  return c;
}

}  // namespace

int main(int argc, char** argv) {
  std::setvbuf(stdout, nullptr, _IOLBF, 0);  // a row per line even into a pipe, so a killed run keeps its rows
  const char* xml = nullptr;
  int64_t minb = 1 << 10, maxb = 1 << 20;
  int factor = 2, warm = 2, iters = 5, dt = TACCL_FLOAT32, op = TACCL_SUM, backend = 0;
  bool check = true;
  int64_t timeout = 10000;
  const char* usage = "usage: taccl_bench -x FILE.xml [-b MIN] [-e MAX] [-f FACTOR] [-w WARMUP] [-n ITERS] [-c 0|1] "
                      "[-d TYPE] [-o OP] [-B host|cuda] [-t TIMEOUT_MS]\n";
  auto bad = [&](const std::string& what) {
    std::fprintf(stderr, "taccl_bench: %s\n%s", what.c_str(), usage);
    std::exit(2);
  };
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "-h" || a == "--help") {
      std::printf("%s", usage);
      return 0;
    }
    const char* v = i + 1 < argc ? argv[i + 1] : nullptr;
    auto need = [&]() { if (!v) { std::fprintf(stderr, "taccl_bench: %s needs a value\n", a.c_str()); std::exit(2); } ++i; return v; };
    if (a == "-x") xml = need();
    else if (a == "-b") minb = parseSize(need());
    else if (a == "-e") maxb = parseSize(need());
    else if (a == "-f") factor = std::atoi(need());
    else if (a == "-w") warm = std::atoi(need());
    else if (a == "-n") iters = std::atoi(need());
    else if (a == "-c") check = std::atoi(need()) != 0;
    else if (a == "-t") timeout = std::atoll(need());
    else if (a == "-B") {
      std::string t = need();
      if (t != "host" && t != "cuda") bad("-B " + t + ": expected host or cuda");
      backend = t == "cuda" ? 1 : 0;
    } else if (a == "-d") {
      std::string t = need();
      dt = -1;
      for (int k = 0; k < 10; ++k) if (t == kTypes[k]) dt = k;
      if (dt < 0) bad("-d " + t + ": unknown data type");
    } else if (a == "-o") {
      std::string t = need();
      op = -1;
      for (int k = 0; k < 4; ++k) if (t == kOps[k]) op = k;
      if (op < 0) bad("-o " + t + ": unknown reduction (sum, prod, min, max)");
    } else bad("unknown argument " + a);
  }
  if (!xml) bad("-x FILE.xml is required");
  if (factor < 2) bad("-f: the size factor must be at least 2");
  if (minb <= 0 || maxb < minb) bad("-b / -e: sizes must be positive, MIN <= MAX");
  if (iters < 1 || warm < 0) bad("-n must be at least 1 and -w at least 0");
  if (timeout <= 0) bad("-t: the timeout must be positive (milliseconds)");
  tacclRuntime* h = tacclCreate();
  tacclSetOption(h, "timeout_ms", timeout);
  if (backend && tacclSetOption(h, "backend", 1) != TACCL_OK) {
    std::fprintf(stderr, "taccl_bench: %s\n", tacclLastError(h));
    return 2;
  }
  if (tacclLoadFile(h, xml) != TACCL_OK) {
    std::fprintf(stderr, "taccl_bench: %s\n", tacclLastError(h));
    tacclDestroy(h);
    return 2;
  }
  tacclProgramInfo info;
  tacclGetProgramInfo(h, 0, &info);
  const int R = info.ngpus;
  const size_t ts = tacclTypeSize(dt);
  const int64_t mult = (info.coll == TACCL_ALLGATHER || info.coll == TACCL_REDUCESCATTER || info.coll == TACCL_ALLTOALL) ? R : 1;
  std::printf("# taccl_bench %s: %s, %d ranks, %s backend, %d warm-up + %d iterations\n", xml, tacclCollName(info.coll), R,
              backend ? "cuda" : "host", warm, iters);
  std::printf("#                                                      out-of-place                       in-place\n");
  std::printf("# %10s %12s %8s %6s %6s %9s %8s %8s %6s %9s %8s %8s %6s\n", "size", "count", "type", "redop", "root",
              "time", "algbw", "busbw", "#wrong", "time", "algbw", "busbw", "#wrong");
  std::printf("# %10s %12s %8s %6s %6s %9s %8s %8s %6s %9s %8s %8s %6s\n", "(B)", "(elements)", "", "", "", "(us)",
              "(GB/s)", "(GB/s)", "", "(us)", "(GB/s)", "(GB/s)", "");
  long totalWrong = 0, rows = 0;
  double busSum = 0;
  int busN = 0;
  bool wrapped = false;  // the next size would not fit in int64
  for (int64_t next = minb; !wrapped && next <= maxb;) {
    const int64_t size = next;
    wrapped = __builtin_mul_overflow(size, (int64_t)factor, &next);
    const int64_t N = size / (int64_t)ts;
    if (N <= 0 || N % info.nchunksperloop != 0 || N % mult != 0) continue;
    const int64_t count = N / mult;
    std::printf("  %10lld %12lld %8s %6s %6d", (long long)(N * ts), (long long)count, kTypes[dt], kOps[op], 0);
    for (int ip = 0; ip < 2; ++ip) {
      if (!(ip ? info.inplace : info.outofplace)) {
        std::printf(" %9s %8s %8s %6s", "n/a", "", "", "");
        continue;
      }
      Case c = runCase(h, info, dt, op, count, ip == 1, warm, iters, check);
      if (!c.ran) {
        std::printf("\n# error: %s\n", c.error.c_str());
        tacclDestroy(h);
        return 1;
      }
      double algbw = (double)(N * ts) / 1000.0 / c.us;  // bytes/us / 1000 = GB/s
      double busbw = algbw * busFactor(info.coll, R);
      busSum += busbw;
      busN++;
      if (c.wrong > 0) totalWrong += c.wrong;
      std::printf(" %9.1f %8.3f %8.3f %6ld", c.us, algbw, busbw, c.wrong);
    }
    std::printf("\n");
    rows++;
  }
  std::printf("# Avg bus bandwidth    : %.4f\n", busN ? busSum / busN : 0.0);
  std::printf("# Data check           : %s\n", !check ? "skipped" : totalWrong ? "FAILED" : "OK");
  tacclDestroy(h);
  if (!rows) { std::fprintf(stderr, "taccl_bench: no size in [%lld, %lld] fits the program\n", (long long)minb, (long long)maxb); return 2; }
  return totalWrong ? 1 : 0;
}
