// Mutation fuzzer for the XML reader and validator: takes seed files, applies random byte/token/attribute
// mutations, and loads each mutant. Every mutant must either load or be refused with a ProgramError; a
// crash, a sanitizer report, a hang or any other exception is a failure. Deterministic for a given --seed.
//
//   taccl_xml_fuzz [--iterations N] [--seed S] [--run] seed.xml...
//   --run: also execute accepted mutants on the host backend (small count, short watchdog).
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "taccl_runtime.h"
#include "program.h"

using namespace taccl;

static const char* kTokens[] = {"<", ">", "/>", "\"", "=", " ", "\n", "\t", "<!--", "-->", "<?xml ?>", "</step>",
                                "</tb>", "</gpu>", "</algo>", "-1", "0", "1", "2", "71", "72", "127", "128", "32767",
                                "0x10", "-2", "99999999999999999999", "nop", "re", "rrcs", "cpy", "ra", "s", "o", "i",
                                "<step s=\"0\" type=\"nop\" srcbuf=\"i\" srcoff=\"-1\" dstbuf=\"o\" dstoff=\"-1\" cnt=\"0\" depid=\"0\" deps=\"0\" hasdep=\"1\"/>",
                                "<tb id=\"9\" send=\"-1\" recv=\"-1\" chan=\"0\"></tb>", "<x>", "</x>", "\r\n"};

static std::string mutate(std::string s, std::mt19937_64& rng) {
  int n = 1 + (int)(rng() % 4);
  for (int k = 0; k < n && !s.empty(); ++k) {
    size_t pos = rng() % s.size();
    switch (rng() % 8) {
      case 0: s[pos] = (char)(rng() % 256); break;                                  // random byte
      case 1: s.erase(pos, 1 + rng() % 16); break;                                  // delete a run
      case 2: s.insert(pos, kTokens[rng() % (sizeof kTokens / sizeof *kTokens)]); break;  // insert a token
      case 3: {                                                                     // change an attribute value
        size_t q = s.find('"', pos);
        if (q == std::string::npos) break;
        size_t e = s.find('"', q + 1);
        if (e == std::string::npos) break;
        s.replace(q + 1, e - q - 1, kTokens[rng() % (sizeof kTokens / sizeof *kTokens)]);
        break;
      }
      case 4: {                                                                     // duplicate a line
        size_t a = s.rfind('\n', pos), b = s.find('\n', pos);
        if (a == std::string::npos || b == std::string::npos) break;
        s.insert(b, s.substr(a, b - a));
        break;
      }
      case 5: {                                                                     // delete a line
        size_t a = s.rfind('\n', pos), b = s.find('\n', pos);
        if (a == std::string::npos || b == std::string::npos) break;
        s.erase(a, b - a);
        break;
      }
      case 6: {                                                                     // small integer tweak
        size_t q = s.find_first_of("0123456789", pos);
        if (q == std::string::npos) break;
        s[q] = (char)('0' + rng() % 10);
        break;
      }
      case 7: s.resize(pos); break;                                                 // truncate
    }
  }
  return s;
}

int main(int argc, char** argv) {
  long iterations = 2000;
  unsigned long seed = 1;
  bool run = false;
  std::vector<std::string> seeds;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--iterations") && i + 1 < argc) iterations = std::atol(argv[++i]);
    else if (!std::strcmp(argv[i], "--seed") && i + 1 < argc) seed = std::strtoul(argv[++i], nullptr, 0);
    else if (!std::strcmp(argv[i], "--run")) run = true;
    else seeds.push_back(argv[i]);
  }
  std::vector<std::string> texts;
  for (auto& p : seeds) {
    std::ifstream f(p, std::ios::binary);
    if (!f) { std::fprintf(stderr, "cannot read %s\n", p.c_str()); return 2; }
    std::ostringstream ss;
    ss << f.rdbuf();
    texts.push_back(ss.str());
  }
  if (texts.empty()) { std::fprintf(stderr, "usage: taccl_xml_fuzz [--iterations N] [--seed S] [--run] seed.xml...\n"); return 2; }
  std::mt19937_64 rng(seed);
  long accepted = 0, refused = 0, ran = 0;
  for (long it = 0; it < iterations; ++it) {
    std::string m = mutate(texts[it % texts.size()], rng);
    try {
      Program p = loadProgramText(m, "mutant.xml");
      accepted++;
      if (run && p.ngpus <= 8) {
        // Execute through the C API on a file written to a temporary path.
        char path[] = "/tmp/taccl_fuzz_XXXXXX";
        int fd = mkstemp(path);
        if (fd < 0) continue;
        FILE* f = fdopen(fd, "w");
        std::fwrite(m.data(), 1, m.size(), f);
        std::fclose(f);
        tacclRuntime* h = tacclCreate();
        tacclSetOption(h, "timeout_ms", 200);
        if (tacclLoadFile(h, path) == TACCL_OK) {
          const int R = p.ngpus;
          const int64_t count = (int64_t)p.nchunks * 3;  // divisible for every collective
          const int64_t elems = count * R;
          std::vector<std::vector<float>> sb(R, std::vector<float>(elems, 1.f)), rb(R, std::vector<float>(elems, 0.f));
          std::vector<void*> s(R), r(R);
          for (int k = 0; k < R; ++k) { s[k] = sb[k].data(); r[k] = rb[k].data(); }
          tacclRunResult res;
          tacclRun(h, 0, (int)p.coll, TACCL_FLOAT32, TACCL_SUM, R, count, s.data(), r.data(), 0, &res);
          ran++;
        }
        tacclDestroy(h);
        std::remove(path);
      }
    } catch (const ProgramError& e) {
      refused++;
      if (std::strncmp(e.what(), "mutant.xml", 10) != 0) {
        std::fprintf(stderr, "error message without the file name: %s\n", e.what());
        return 1;
      }
    }
  }
  std::printf("fuzz: %ld mutants, %ld accepted, %ld refused cleanly, %ld executed\n", iterations, accepted, refused, ran);
  return 0;
}
