// Shared pieces of taccl-probe: JSON output, sysfs facts (NUMA nodes, NICs), progress lines.
#pragma once

#include <dirent.h>
#include <limits.h>
#include <stdlib.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <mutex>
#include <sstream>
#include <string>
#include <vector>

inline std::string jstr(const std::string& s) {
  std::string o = "\"";
  for (unsigned char c : s) {
    if (c == '"' || c == '\\') { o += '\\'; o += (char)c; }
    else if (c < 0x20) { char b[8]; snprintf(b, sizeof b, "\\u%04x", c); o += b; }
    else o += (char)c;
  }
  return o + "\"";
}
inline std::string jstr(const char* s) { return s ? jstr(std::string(s)) : std::string("null"); }

inline std::string fmt_num(double v) {
  if (!std::isfinite(v)) return "null";
  char b[32];
  snprintf(b, sizeof b, "%.6g", v);
  return b;
}

inline std::vector<std::string> split(const std::string& s, char sep) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  std::string x;
  while (std::getline(ss, x, sep))
    if (!x.empty()) out.push_back(x);
  return out;
}

inline std::string read_line(const std::string& path) {
  std::ifstream f(path);
  std::string s;
  if (f) std::getline(f, s);
  return s;
}

inline int pci_numa_node(const std::string& bus) {
  std::string lower;
  for (char c : bus) lower += (char)tolower(c);
  std::string s = read_line("/sys/bus/pci/devices/" + lower + "/numa_node");
  return s.empty() ? -1 : atoi(s.c_str());
}

struct NicMeta {
  std::string name, pci;
  int numa = -1;
  double rate_gbps = 0;
};

// RDMA devices from sysfs: name, PCI address, NUMA node, port 1 rate.
inline std::vector<NicMeta> sysfs_nics() {
  std::vector<NicMeta> out;
  DIR* d = opendir("/sys/class/infiniband");
  if (!d) return out;
  while (dirent* e = readdir(d)) {
    if (e->d_name[0] == '.') continue;
    NicMeta m;
    m.name = e->d_name;
    std::string base = std::string("/sys/class/infiniband/") + e->d_name;
    char buf[PATH_MAX];
    if (realpath((base + "/device").c_str(), buf)) {
      std::string p = buf;
      m.pci = p.substr(p.rfind('/') + 1);
    }
    std::string numa = read_line(base + "/device/numa_node");
    m.numa = numa.empty() ? -1 : atoi(numa.c_str());
    std::string rate = read_line(base + "/ports/1/rate");  // "100 Gb/sec (4X EDR)"
    m.rate_gbps = rate.empty() ? 0 : atof(rate.c_str());
    out.push_back(m);
  }
  closedir(d);
  return out;
}

inline std::string host_info_json() {
  char hn[256] = {0};
  gethostname(hn, sizeof hn - 1);
  std::string s = "{\"hostname\":" + jstr(hn) + ",\"numa_nodes\":[";
  bool first = true;
  for (int i = 0; i < 64; ++i) {
    std::string cpus = read_line("/sys/devices/system/node/node" + std::to_string(i) + "/cpulist");
    if (cpus.empty()) continue;
    s += std::string(first ? "" : ",") + "{\"id\":" + std::to_string(i) + ",\"cpus\":" + jstr(cpus) + "}";
    first = false;
  }
  return s + "]}";
}

// The samples document, built up by the probes; add_* may be called from any thread.
struct Output {
  std::mutex mu;
  std::string tool_json = "null", host_json = "null", env_json = "null", gpus_json = "[]", peer_json = "[]";
  std::vector<NicMeta> nics;
  std::vector<std::string> measurements, skipped, errors;
  std::string status = "partial";

  void add_measurement(const std::string& j) { std::lock_guard<std::mutex> l(mu); measurements.push_back(j); }
  void add_skip(const std::string& probe, const std::string& what, const std::string& why) {
    std::lock_guard<std::mutex> l(mu);
    skipped.push_back("{\"probe\":" + jstr(probe) + ",\"what\":" + jstr(what) + ",\"reason\":" + jstr(why) + "}");
  }
  void add_error(const std::string& e) { std::lock_guard<std::mutex> l(mu); errors.push_back(jstr(e)); }

  std::string json() {
    std::lock_guard<std::mutex> l(mu);
    auto list = [](const std::vector<std::string>& v, const char* sep) {
      std::string s = "[";
      for (size_t i = 0; i < v.size(); ++i) s += (i ? std::string(",") + sep : std::string(sep)) + v[i];
      return s + "]";
    };
    std::vector<std::string> nj;
    for (auto& m : nics)
      nj.push_back("{\"name\":" + jstr(m.name) + ",\"pci_bus_id\":" + jstr(m.pci) + ",\"numa_node\":" +
                   std::to_string(m.numa) + ",\"rate_Gbps\":" + (m.rate_gbps > 0 ? fmt_num(m.rate_gbps) : "null") + "}");
    return "{\"format\":\"taccl-profile-samples\",\"version\":1,\n\"tool\":" + tool_json + ",\n\"host\":" + host_json +
           ",\n\"env\":" + env_json + ",\n\"gpus\":" + gpus_json + ",\n\"peer_access\":" + peer_json +
           ",\n\"nics\":" + list(nj, "") + ",\n\"measurements\":" + list(measurements, "\n") +
           ",\n\"skipped\":" + list(skipped, "\n") + ",\n\"errors\":" + list(errors, "") + ",\n\"status\":" +
           jstr(status) + "}\n";
  }

  // Written atomically (temporary file, then rename) so a reader never sees half a file.
  void write(const std::string& path) {
    std::string j = json();
    if (path.empty() || path == "-") {
      fwrite(j.data(), 1, j.size(), stdout);
      fflush(stdout);
      return;
    }
    std::string tmp = path + ".tmp" + std::to_string(getpid());
    FILE* f = fopen(tmp.c_str(), "w");
    if (!f) { fprintf(stderr, "taccl-probe: cannot write %s\n", tmp.c_str()); return; }
    fwrite(j.data(), 1, j.size(), f);
    fclose(f);
    if (rename(tmp.c_str(), path.c_str())) fprintf(stderr, "taccl-probe: cannot rename to %s\n", path.c_str());
  }
};

// Progress: "[k/N] what (eta)" on stderr, N estimated up front.
inline int estimate_steps(int n, bool quick, bool p2p, bool host, bool nic, int nnics) {
  int s = 0;
  if (p2p && n > 1) s += 2 * n * (n - 1) + 2 * (quick ? 1 : n);
  if (host && n > 0) s += 2 * n + n * (n - 1);
  if (nic) s += nnics * 3;
  return s > 0 ? s : 1;
}

struct Progress {
  int total, done = 0;
  std::chrono::steady_clock::time_point t0 = std::chrono::steady_clock::now();
  explicit Progress(int t) : total(t) {}
  void step(const std::string& what) {
    ++done;
    double el = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    double eta = done > 1 ? el / (done - 1) * (total - done + 1) : 0;
    fprintf(stderr, "[%d/%d %6.1fs, ~%.0fs left] %s\n", done, total > done ? total : done, el, eta, what.c_str());
  }
};
