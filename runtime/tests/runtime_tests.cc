// C++ tests of the runtime: the strict reader, the validator, the happens-before analysis, and host runs of
// the baseline programs against a reference computed here from the collective's definition.
// Run from runtime/ (pytest does): data in tests/data, shared programs in $TACCL_SHARED_XML_DIR.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <random>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "launch_pool.h"
#include "taccl_runtime.h"
#include "program.h"
#include "xml_reader.h"

using namespace taccl;

namespace {

std::string dataDir() { return "tests/data/"; }
std::string sharedDir() {
  const char* d = std::getenv("TACCL_SHARED_XML_DIR");
  return d ? std::string(d) + "/" : std::string("../../shared/data/msccl-xml/");
}

const char* kMinimal =
    "<algo name=\"ar2\" proto=\"LL\" nchannels=\"1\" nchunksperloop=\"2\" ngpus=\"2\" coll=\"allreduce\" inplace=\"1\" outofplace=\"0\" minBytes=\"0\" maxBytes=\"0\">\n"
    "  <gpu id=\"0\" i_chunks=\"2\" o_chunks=\"0\" s_chunks=\"0\">\n"
    "    <tb id=\"0\" send=\"1\" recv=\"1\" chan=\"0\">\n"
    "      <step s=\"0\" type=\"s\" srcbuf=\"i\" srcoff=\"1\" dstbuf=\"i\" dstoff=\"1\" cnt=\"1\" depid=\"-1\" deps=\"-1\" hasdep=\"0\"/>\n"
    "      <step s=\"1\" type=\"rrcs\" srcbuf=\"i\" srcoff=\"0\" dstbuf=\"i\" dstoff=\"0\" cnt=\"1\" depid=\"-1\" deps=\"-1\" hasdep=\"0\"/>\n"
    "      <step s=\"2\" type=\"r\" srcbuf=\"i\" srcoff=\"1\" dstbuf=\"i\" dstoff=\"1\" cnt=\"1\" depid=\"-1\" deps=\"-1\" hasdep=\"0\"/>\n"
    "    </tb>\n"
    "  </gpu>\n"
    "  <gpu id=\"1\" i_chunks=\"2\" o_chunks=\"0\" s_chunks=\"0\">\n"
    "    <tb id=\"0\" send=\"0\" recv=\"0\" chan=\"0\">\n"
    "      <step s=\"0\" type=\"s\" srcbuf=\"i\" srcoff=\"0\" dstbuf=\"i\" dstoff=\"0\" cnt=\"1\" depid=\"-1\" deps=\"-1\" hasdep=\"0\"/>\n"
    "      <step s=\"1\" type=\"rrcs\" srcbuf=\"i\" srcoff=\"1\" dstbuf=\"i\" dstoff=\"1\" cnt=\"1\" depid=\"-1\" deps=\"-1\" hasdep=\"0\"/>\n"
    "      <step s=\"2\" type=\"r\" srcbuf=\"i\" srcoff=\"0\" dstbuf=\"i\" dstoff=\"0\" cnt=\"1\" depid=\"-1\" deps=\"-1\" hasdep=\"0\"/>\n"
    "    </tb>\n"
    "  </gpu>\n"
    "</algo>\n";

std::string replaceFirst(std::string s, const std::string& from, const std::string& to) {
  size_t p = s.find(from);
  EXPECT_NE(p, std::string::npos) << from;
  if (p != std::string::npos) s.replace(p, from.size(), to);
  return s;
}

std::string loadError(const std::string& text) {
  try {
    loadProgramText(text, "t.xml");
  } catch (const ProgramError& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST(Reader, AcceptsMinimalExample) { EXPECT_EQ(loadError(kMinimal), ""); }

TEST(Reader, LexicalRules) {
  struct Case { std::string text, expect; };
  std::string m = kMinimal;
  std::vector<Case> cases = {
      {"<?xml version=\"1.0\"?>\n" + m, "XML declaration"},
      {replaceFirst(m, "  <gpu id=\"0\"", "\t<gpu id=\"0\""), "tab"},
      {replaceFirst(m, "ngpus=\"2\" coll", "ngpus=\"2\"\ncoll"), "next line"},
      {replaceFirst(m, "ngpus=\"2\"", "ngpus = \"2\""), "'='"},
      {replaceFirst(m, "ngpus=\"2\"", "ngpus='2'"), "double-quoted"},
      {replaceFirst(m, "ngpus=\"2\" coll", "ngpus=\"2\"  coll"), "two spaces"},
      {replaceFirst(m, "</algo>", "</alg>"), "does not match"},
      {replaceFirst(m, "</algo>", "</algo >"), "exactly"},
      {replaceFirst(m, "</algo>\n", ""), "missing </algo>"},
      {m + "<algo/>", "after the root"},
      {replaceFirst(m, "<gpu id=\"1\"", "text <gpu id=\"1\""), "text content"},
      {replaceFirst(m, "name=\"ar2\"", "name=\"" + std::string(300, 'x') + "\""), "255"},
      {"", "empty"},
      {"<!-- x", "unterminated comment"},
  };
  for (auto& c : cases) {
    std::string err = loadError(c.text);
    EXPECT_NE(err.find(c.expect), std::string::npos) << "expected '" << c.expect << "', got: " << err;
  }
  // Comments between elements, self-closing and explicit end tags, unknown elements/attributes are fine.
  std::string ok = "<!-- c -->\n" + replaceFirst(m, "</gpu>", "<copy i_off=\"0\" o_off=\"0\"/>\n<!-- x -->\n  </gpu>");
  ok = replaceFirst(ok, "hasdep=\"0\"/>", "hasdep=\"0\" extra=\"1\"></step>");
  EXPECT_EQ(loadError(ok), "");
}

TEST(Validator, Rules) {
  struct Case { std::string from, to, expect; };
  std::vector<Case> cases = {
      {"proto=\"LL\"", "proto=\"XX\"", "proto"},
      {"coll=\"allreduce\"", "coll=\"custom\"", "not supported"},
      {"nchannels=\"1\"", "nchannels=\"33\"", "out of range"},
      {"ngpus=\"2\"", "ngpus=\"3\"", "no <gpu id=\"2\">"},
      {"<gpu id=\"1\"", "<gpu id=\"0\"", "second <gpu"},
      {"inplace=\"1\" outofplace=\"0\"", "inplace=\"0\" outofplace=\"0\"", "never be selected"},
      {"minBytes=\"0\" maxBytes=\"0\"", "minBytes=\"9\" maxBytes=\"8\"", "minBytes > maxBytes"},
      {"<tb id=\"0\" send=\"1\"", "<tb id=\"1\" send=\"1\"", "without gaps"},
      {"send=\"1\" recv=\"1\"", "send=\"0\" recv=\"1\"", "own rank"},
      {"chan=\"0\"", "chan=\"1\"", "nchannels=1"},
      {"<step s=\"1\"", "<step s=\"2\"", "s must be 0, 1, 2"},
      {"type=\"rrcs\"", "type=\"ra\"", "ra"},
      {"type=\"rrcs\"", "type=\"foo\"", "unknown step type"},
      {"srcbuf=\"i\"", "srcbuf=\"x\"", "must be i, o or s"},
      {"srcoff=\"1\"", "srcoff=\"2\"", "exceed"},
      {"srcoff=\"1\"", "srcoff=\"-1\"", "uses its src"},
      {"srcoff=\"1\"", "srcoff=\"1x\"", "not an integer"},
      {"cnt=\"1\"", "cnt=\"72\"", "out of range"},
      {"cnt=\"1\"", "cnt=\"0\"", "cnt=0"},
      {"cnt=\"1\"", "cnt=\"2\"", "exceed"},
      {"depid=\"-1\" deps=\"-1\"", "depid=\"0\" deps=\"-1\"", "both"},
      {"depid=\"-1\" deps=\"-1\"", "depid=\"3\" deps=\"0\"", "names no thread block"},
      {"depid=\"-1\" deps=\"-1\"", "depid=\"0\" deps=\"2\"", "never publishes"},
      {" hasdep=\"0\"/>", "/>", "hasdep"},
      {"i_chunks=\"2\"", "i_chunks=\"3\"", "exceeds the input buffer"},
      {"<step s=\"0\" type=\"s\"", "<step s=\"0\" type=\"r\"", "receives"},
  };
  for (auto& c : cases) {
    std::string err = loadError(replaceFirst(kMinimal, c.from, c.to));
    EXPECT_NE(err.find(c.expect), std::string::npos) << c.from << " -> " << c.to << ": got: " << err;
    EXPECT_NE(err.find("t.xml:"), std::string::npos) << err;
  }
  // FIFO matching: a cnt mismatch names both sides.
  std::string mm = replaceFirst(kMinimal, "type=\"rrcs\" srcbuf=\"i\" srcoff=\"0\" dstbuf=\"i\" dstoff=\"0\" cnt=\"1\"",
                                "type=\"rrcs\" srcbuf=\"i\" srcoff=\"0\" dstbuf=\"i\" dstoff=\"0\" cnt=\"2\"");
  EXPECT_NE(loadError(mm).find("matching receive"), std::string::npos) << loadError(mm);
  // A located message names file, line, rank, tb and step.
  std::string err = loadError(replaceFirst(kMinimal, "type=\"rrcs\"", "type=\"zz\""));
  EXPECT_NE(err.find("t.xml:5: rank 0 tb 0 step 1:"), std::string::npos) << err;
}

TEST(Validator, SharedAndBaselinePrograms) {
  std::vector<std::string> files = {"a2a2ll.xml", "ag_hier_4_LL.xml", "ar_ll128.xml", "r48ll.xml"};
  for (auto& f : files) {
    std::ifstream probe(sharedDir() + f);
    if (!probe) { GTEST_SKIP() << "shared data not found in " << sharedDir(); }
    EXPECT_NO_THROW(loadProgramFile(sharedDir() + f)) << f;
  }
  for (const char* f : {"ring_allgather_4.xml", "ring_allgather_8.xml", "ring_allreduce_4.xml", "ring_allreduce_8.xml",
                        "ring_reducescatter_4.xml", "direct_alltoall_4.xml", "direct_allreduce_4.xml",
                        "direct_allreduce_3.xml", "chain_broadcast_4.xml", "chain_reduce_4.xml", "bad_fifo_deadlock.xml"}) {
    try {
      loadProgramFile(dataDir() + f);
    } catch (const ProgramError& e) {
      ADD_FAILURE() << e.what();
    }
  }
}

TEST(Analysis, CatchesCycleAndRace) {
  try {
    loadProgramFile(dataDir() + "bad_cycle_deadlock.xml");
    ADD_FAILURE() << "cycle not caught";
  } catch (const ProgramError& e) {
    EXPECT_NE(std::string(e.what()).find("dependency cycle"), std::string::npos) << e.what();
  }
  try {
    loadProgramFile(dataDir() + "bad_race.xml");
    ADD_FAILURE() << "race not caught";
  } catch (const ProgramError& e) {
    EXPECT_NE(std::string(e.what()).find("data race on chunk o[0]"), std::string::npos) << e.what();
  }
  LoadOptions off;
  off.analysis = false;
  EXPECT_NO_THROW(loadProgramFile(dataDir() + "bad_race.xml", off));
}

// ---- host runs ----------------------------------------------------------------------------------------

namespace {

struct RunFixture {
  tacclRuntime* h = tacclCreate();
  ~RunFixture() { tacclDestroy(h); }
};

// Reference: int32 sum over ranks, from the collective's definition only.
std::vector<std::vector<int32_t>> reference(int coll, int R, int64_t count, const std::vector<std::vector<int32_t>>& in,
                                            int root) {
  std::vector<std::vector<int32_t>> out(R);
  for (int r = 0; r < R; ++r) {
    switch (coll) {
      case TACCL_ALLGATHER:
        for (int q = 0; q < R; ++q) out[r].insert(out[r].end(), in[q].begin(), in[q].end());
        break;
      case TACCL_REDUCESCATTER:
        out[r].assign(count, 0);
        for (int q = 0; q < R; ++q)
          for (int64_t k = 0; k < count; ++k) out[r][k] += in[q][r * count + k];
        break;
      case TACCL_ALLREDUCE:
        out[r].assign(count, 0);
        for (int q = 0; q < R; ++q)
          for (int64_t k = 0; k < count; ++k) out[r][k] += in[q][k];
        break;
      case TACCL_ALLTOALL:
        for (int q = 0; q < R; ++q) out[r].insert(out[r].end(), in[q].begin() + r * count, in[q].begin() + (r + 1) * count);
        break;
      case TACCL_BROADCAST: out[r] = in[root]; break;
      case TACCL_REDUCE:
        out[r].assign(count, 0);
        for (int q = 0; q < R; ++q)
          for (int64_t k = 0; k < count; ++k) out[r][k] += in[q][k];
        break;
    }
  }
  return out;
}

void runAndCheck(const std::string& path, int coll, int R, int64_t count, bool inplace, int64_t tile = 0) {
  RunFixture f;
  ASSERT_EQ(tacclLoadFile(f.h, path.c_str()), TACCL_OK) << tacclLastError(f.h);
  if (tile) {
    ASSERT_EQ(tacclSetOption(f.h, "tile_bytes", tile), TACCL_OK);
  }
  const int64_t mult = (coll == TACCL_ALLGATHER || coll == TACCL_REDUCESCATTER || coll == TACCL_ALLTOALL) ? R : 1;
  const int64_t inN = coll == TACCL_ALLGATHER ? count : count * mult;
  const int64_t outN = coll == TACCL_REDUCESCATTER ? count : count * mult;
  std::mt19937 rng(1234);
  std::vector<std::vector<int32_t>> in(R), buf(R);
  std::vector<void*> send(R), recv(R);
  for (int r = 0; r < R; ++r) {
    in[r].resize(inN);
    for (auto& x : in[r]) x = (int32_t)(rng() % 1000) - 500;
    const int64_t big = std::max(inN, outN);
    buf[r].assign(big * 2, -7);
    if (!inplace) {
      std::copy(in[r].begin(), in[r].end(), buf[r].begin() + big);
      send[r] = buf[r].data() + big;
      recv[r] = buf[r].data();
    } else if (coll == TACCL_ALLGATHER) {
      std::copy(in[r].begin(), in[r].end(), buf[r].begin() + r * count);
      recv[r] = buf[r].data();
      send[r] = buf[r].data() + r * count;
    } else if (coll == TACCL_REDUCESCATTER) {
      std::copy(in[r].begin(), in[r].end(), buf[r].begin());
      send[r] = buf[r].data();
      recv[r] = buf[r].data() + r * count;
    } else {
      std::copy(in[r].begin(), in[r].end(), buf[r].begin());
      send[r] = recv[r] = buf[r].data();
    }
  }
  tacclRunResult res;
  ASSERT_EQ(tacclRun(f.h, -1, coll, TACCL_INT32, TACCL_SUM, R, count, send.data(), recv.data(), 0, &res), TACCL_OK);
  ASSERT_EQ(res.outcome, TACCL_RUN_DONE) << tacclLastError(f.h);
  auto ref = reference(coll, R, count, in, 0);
  for (int r = 0; r < R; ++r) {
    if (coll == TACCL_REDUCE && r != 0) {
      continue;
    }
    const int32_t* o = (const int32_t*)recv[r];
    for (int64_t k = 0; k < outN; ++k)
      ASSERT_EQ(o[k], ref[r][k]) << path << " rank " << r << " element " << k << (inplace ? " in-place" : "");
  }
}

}  // namespace

TEST(HostRun, Baselines) {
  for (bool ip : {false, true}) {
    runAndCheck(dataDir() + "ring_allgather_4.xml", TACCL_ALLGATHER, 4, 2 * 37, ip);
    runAndCheck(dataDir() + "ring_allreduce_4.xml", TACCL_ALLREDUCE, 4, 8 * 101, ip);
    runAndCheck(dataDir() + "ring_reducescatter_4.xml", TACCL_REDUCESCATTER, 4, 53, ip);
    runAndCheck(dataDir() + "direct_allreduce_4.xml", TACCL_ALLREDUCE, 4, 4 * 29, ip);
    runAndCheck(dataDir() + "chain_broadcast_4.xml", TACCL_BROADCAST, 4, 4 * 17, ip);
  }
  runAndCheck(dataDir() + "direct_alltoall_4.xml", TACCL_ALLTOALL, 4, 31, false);
  runAndCheck(dataDir() + "chain_reduce_4.xml", TACCL_REDUCE, 4, 2 * 41, false);
}

TEST(HostRun, TilingWithRaggedLastTile) {
  // 96-byte tiles: 24 int32 per tile, chunks of 101 elements: 5 tiles, the last one 5 elements.
  runAndCheck(dataDir() + "ring_allreduce_4.xml", TACCL_ALLREDUCE, 4, 8 * 101, false, 96);
  runAndCheck(dataDir() + "direct_allreduce_4.xml", TACCL_ALLREDUCE, 4, 4 * 101, true, 96);
  runAndCheck(dataDir() + "ring_allgather_4.xml", TACCL_ALLGATHER, 4, 2 * 101, true, 96);
}

TEST(HostRun, SharedPrograms) {
  std::ifstream probe(sharedDir() + "r48ll.xml");
  if (!probe) {
    GTEST_SKIP() << "shared data not found";
  }
  runAndCheck(sharedDir() + "r48ll.xml", TACCL_ALLREDUCE, 8, 64 * 1040, true);
  runAndCheck(sharedDir() + "ag_hier_4_LL.xml", TACCL_ALLGATHER, 4, 4 * 50, false);
  runAndCheck(sharedDir() + "a2a2ll.xml", TACCL_ALLTOALL, 8, 2 * 64, false);
}

TEST(HostRun, WatchdogNamesWaitingBlocks) {
  RunFixture f;
  ASSERT_EQ(tacclSetOption(f.h, "timeout_ms", 300), TACCL_OK);
  ASSERT_EQ(tacclLoadFile(f.h, (dataDir() + "bad_fifo_deadlock.xml").c_str()), TACCL_OK) << tacclLastError(f.h);
  std::vector<int32_t> a(30), b(30), c(30), d(30);
  void* send[2] = {a.data(), b.data()};
  void* recv[2] = {c.data(), d.data()};
  tacclRunResult res;
  ASSERT_EQ(tacclRun(f.h, -1, TACCL_ALLREDUCE, TACCL_INT32, TACCL_SUM, 2, 30, send, recv, 0, &res), TACCL_OK);
  EXPECT_EQ(res.outcome, TACCL_RUN_DEADLOCK);
  std::string msg = tacclLastError(f.h);
  EXPECT_NE(msg.find("rank 0 tb 0 step 2"), std::string::npos) << msg;
  EXPECT_NE(msg.find("rank 1 tb 0 step 2"), std::string::npos) << msg;
  EXPECT_NE(msg.find("FIFO is full"), std::string::npos) << msg;
}

TEST(HostRun, SelectionWindowAndDivisibility) {
  RunFixture f;
  ASSERT_EQ(tacclLoadFile(f.h, (dataDir() + "ring_allreduce_4.xml").c_str()), TACCL_OK);
  int idx = 5;
  EXPECT_EQ(tacclSelect(f.h, TACCL_ALLREDUCE, 4, 8 * 3, TACCL_FLOAT32, 0, &idx), TACCL_OK);
  EXPECT_EQ(idx, 0);
  EXPECT_EQ(tacclSelect(f.h, TACCL_ALLREDUCE, 4, 8 * 3 + 1, TACCL_FLOAT32, 0, &idx), TACCL_OK);
  EXPECT_EQ(idx, -1);
  EXPECT_EQ(tacclSelect(f.h, TACCL_ALLREDUCE, 8, 8 * 3, TACCL_FLOAT32, 0, &idx), TACCL_OK);
  EXPECT_EQ(idx, -1);
  EXPECT_EQ(tacclSelect(f.h, TACCL_ALLGATHER, 4, 8 * 3, TACCL_FLOAT32, 0, &idx), TACCL_OK);
  EXPECT_EQ(idx, -1);
}

// A directory given as a program said "empty file: expected an <algo> element".
TEST(HostRun, ADirectoryIsNotAProgram) {
  RunFixture f;
  EXPECT_NE(tacclLoadFile(f.h, dataDir().c_str()), TACCL_OK);
  EXPECT_NE(std::string(tacclLastError(f.h)).find("is a directory"), std::string::npos) << tacclLastError(f.h);
}

// A count whose buffers would pass 2^63 bytes wrapped to a chunk of 0 elements (SIGFPE in the plan) or to a
// small count that "succeeded": an error status now, and no program is selected for it.
TEST(HostRun, CountsPastInt64AreRefused) {
  RunFixture f;
  ASSERT_EQ(tacclLoadFile(f.h, (dataDir() + "ring_allgather_8.xml").c_str()), TACCL_OK) << tacclLastError(f.h);
  std::vector<float> bufs(16 * 64);
  std::vector<void*> send(8), recv(8);
  for (int r = 0; r < 8; ++r) send[r] = recv[r] = nullptr;
  for (int r = 0; r < 8; ++r) {
    recv[r] = bufs.data() + r * 128;
    send[r] = bufs.data() + r * 128 + 64;
  }
  for (int64_t count : {int64_t(0x1000000000000000LL), int64_t(0x2000000000000001LL)}) {
    tacclRunResult res;
    int rc = tacclRun(f.h, -1, TACCL_ALLGATHER, TACCL_FLOAT32, TACCL_SUM, 8, count, send.data(), recv.data(), 0, &res);
    EXPECT_TRUE(rc != TACCL_OK || res.outcome != TACCL_RUN_DONE) << count;
    EXPECT_NE(std::string(tacclLastError(f.h)).find("would exceed 2^63 bytes"), std::string::npos) << tacclLastError(f.h);
    int idx = 5;
    EXPECT_EQ(tacclSelect(f.h, TACCL_ALLGATHER, 8, count, TACCL_FLOAT32, 0, &idx), TACCL_OK);
    EXPECT_EQ(idx, -1);
  }
}

// The CUDA backend's launcher threads (launch_pool.h), without a GPU: each call runs job i for every i < n
// exactly once (job 0 on the calling thread, job i always on worker i), returns only after all of them,
// rethrows a job's exception and stays usable.
TEST(LaunchPool, RunsEachJobOncePerCallAndWaitsForAll) {
  LaunchPool pool(4);
  ASSERT_EQ(pool.size(), 4);
  std::vector<std::atomic<int>> runs(4);
  std::vector<std::thread::id> ids(4);
  for (int call = 0; call < 2000; ++call) {
    const int n = 1 + call % 4;
    std::atomic<int> finished{0};
    pool.run(n, [&](int i) {
      if (call % 97 == 0) std::this_thread::sleep_for(std::chrono::microseconds(200 * i));
      runs[i]++;
      if (ids[i] == std::thread::id()) ids[i] = std::this_thread::get_id();  // worker i, its own slot
      else if (ids[i] != std::this_thread::get_id()) ADD_FAILURE() << "job " << i << " moved to another thread";
      finished++;
    });
    ASSERT_EQ(finished.load(), n) << "call " << call << " returned before its jobs ended";
  }
  // jobs i < n run in every call: job 0 2000 times, job 3 only when n == 4 (500 calls)
  EXPECT_EQ(runs[0].load(), 2000);
  EXPECT_EQ(runs[1].load(), 1500);
  EXPECT_EQ(runs[2].load(), 1000);
  EXPECT_EQ(runs[3].load(), 500);
  EXPECT_THROW(pool.run(3, [](int i) { if (i == 1) throw std::runtime_error("launch failed"); }), std::runtime_error);
  std::atomic<int> after{0};
  pool.run(4, [&](int) { after++; });
  EXPECT_EQ(after.load(), 4);
}
