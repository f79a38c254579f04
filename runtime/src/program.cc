#include "program.h"

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <climits>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>

#include "xml_reader.h"

namespace taccl {

const char* collName(Coll c) {
  switch (c) {
    case Coll::AllGather: return "allgather";
    case Coll::ReduceScatter: return "reducescatter";
    case Coll::AllReduce: return "allreduce";
    case Coll::AllToAll: return "alltoall";
    case Coll::Broadcast: return "broadcast";
    case Coll::Reduce: return "reduce";
  }
  return "?";
}

int Program::inputChunks() const { return coll == Coll::AllGather ? nchunks / ngpus : nchunks; }
int Program::outputChunks() const { return coll == Coll::ReduceScatter ? nchunks / ngpus : nchunks; }
int Program::maxTbs() const {
  size_t m = 0;
  for (auto& r : ranks) m = std::max(m, r.tbs.size());
  return (int)m;
}

namespace {

const char* kTypeNames[] = {"s", "r", "rcs", "rrs", "rrc", "rrcs", "cpy", "re", "nop"};

// Where an error is: built up as the loader descends, rendered as "path:line: rank R tb T step S: ".
struct Where {
  const std::string* path;
  int line = 0, rank = -1, tb = -1, step = -1;
  std::string str() const {
    std::ostringstream o;
    o << *path;
    if (line > 0) o << ":" << line;
    o << ": ";
    if (rank >= 0) o << "rank " << rank;
    if (tb >= 0) o << " tb " << tb;
    if (step >= 0) o << " step " << step;
    if (rank >= 0) o << ": ";
    return o.str();
  }
};

[[noreturn]] void fail(const Where& w, const std::string& msg) { throw ProgramError(w.str() + msg); }

int64_t parseInt(const Where& w, const XmlNode& n, const char* key, int64_t lo, int64_t hi, bool required = true,
                 int64_t def = 0) {
  const std::string* v = n.find(key);
  if (!v) {
    if (!required) return def;
    fail(w, "<" + n.name + "> lacks the required attribute '" + key + "'" +
                (n.droppedAttrs ? " (more than 16 attributes: the runtimes ignore the extra ones)" : ""));
  }
  const char* s = v->c_str();
  if (*s == '\0' || *s == ' ') fail(w, std::string("attribute ") + key + "=\"" + *v + "\" is not an integer");
  char* end = nullptr;
  errno = 0;
  long long x = std::strtoll(s, &end, 0);
  if (errno == ERANGE || *end != '\0')
    fail(w, std::string("attribute ") + key + "=\"" + *v + "\" is not an integer");
  if (x < lo || x > hi)
    fail(w, std::string("attribute ") + key + "=" + std::to_string(x) + " is out of range [" + std::to_string(lo) +
                ", " + std::to_string(hi) + "]");
  return x;
}

const std::string& parseStr(const Where& w, const XmlNode& n, const char* key) {
  const std::string* v = n.find(key);
  if (!v)
    fail(w, "<" + n.name + "> lacks the required attribute '" + key + "'" +
                (n.droppedAttrs ? " (more than 16 attributes: the runtimes ignore the extra ones)" : ""));
  return *v;
}

uint8_t parseBuf(const Where& w, const XmlNode& n, const char* key) {
  const std::string& v = parseStr(w, n, key);
  if (v == "i") return BUF_I;
  if (v == "o") return BUF_O;
  if (v == "s") return BUF_S;
  fail(w, std::string("attribute ") + key + "=\"" + v + "\" must be i, o or s");
}

void readStep(const Where& w, const XmlNode& n, int index, Step& st) {
  int64_t s = parseInt(w, n, "s", INT_MIN, INT_MAX);
  if (s != index)
    fail(w, "s=\"" + std::to_string(s) + "\" but this is step " + std::to_string(index) +
                " of its block (the runtimes count steps in document order; s must be 0, 1, 2, ...)");
  const std::string& type = parseStr(w, n, "type");
  int t = -1;
  for (int i = 0; i < 9; ++i)
    if (type == kTypeNames[i]) t = i;
  if (type == "ra") fail(w, "type \"ra\" is not executed by any runtime (the legacy interpreter silently stops)");
  if (t < 0) fail(w, "unknown step type \"" + type + "\"");
  st.type = (uint8_t)t;
  st.srcbuf = parseBuf(w, n, "srcbuf");
  st.dstbuf = parseBuf(w, n, "dstbuf");
  st.srcoff = (int16_t)parseInt(w, n, "srcoff", -1, kMaxOffset);
  st.dstoff = (int16_t)parseInt(w, n, "dstoff", -1, kMaxOffset);
  st.cnt = (uint8_t)parseInt(w, n, "cnt", 0, kMaxCount - 1);
  st.depid = (int16_t)parseInt(w, n, "depid", -1, kMaxTbs - 1);
  st.deps = (int16_t)parseInt(w, n, "deps", -1, kMaxSteps - 1);
  st.hasdep = (uint8_t)parseInt(w, n, "hasdep", 0, 1);
  st.direct = 0;
  st.peeroff = 0;
}

// Physical chunk of an access of rank r, as (buffer << 32 | chunk), with the in-place aliases of section 1.8
// when the program allows in-place calls.
int64_t physicalChunk(const Program& p, int r, int buf, int chunk) {
  if (p.inplace) {
    switch (p.coll) {
      case Coll::AllGather: if (buf == BUF_I) { buf = BUF_O; chunk += r * p.inputChunks(); } break;
      case Coll::ReduceScatter: if (buf == BUF_O) { buf = BUF_I; chunk += r * p.outputChunks(); } break;
      default: if (buf == BUF_O) buf = BUF_I; break;
    }
  }
  return (int64_t)buf << 32 | (uint32_t)chunk;
}

// A step that reads src and writes dst where the two ranges overlap without being the same: its threads
// would read elements that others have already overwritten (the GPU runs a step's elements in parallel).
void checkOverlap(const Where& w, const Program& p, int rank, const Step& st) {
  if (!stepReadsSrc(st.type) || !stepWritesDst(st.type)) return;
  const int64_t a = physicalChunk(p, rank, st.srcbuf, st.srcoff), b = physicalChunk(p, rank, st.dstbuf, st.dstoff);
  if (a >> 32 != b >> 32 || a == b) return;
  if ((a > b ? a - b : b - a) >= st.cnt) return;
  static const char* names[] = {"i", "o", "s"};
  fail(w, std::string("source ") + names[st.srcbuf] + "[" + std::to_string(st.srcoff) + ".." +
              std::to_string(st.srcoff + st.cnt - 1) + "] and destination " + names[st.dstbuf] + "[" +
              std::to_string(st.dstoff) + ".." + std::to_string(st.dstoff + st.cnt - 1) + "] overlap" +
              (st.srcbuf != st.dstbuf ? " (in-place aliasing)" : "") +
              " without being the same chunks: the elements of one step are moved in parallel");
}

void checkRange(const Where& w, const char* which, int buf, int off, int cnt, int chunks) {
  static const char* names[] = {"i", "o", "s"};
  if (off < 0) fail(w, std::string(which) + "off=-1 but this step type uses its " + which + " buffer");
  if ((int64_t)off + cnt > chunks)
    fail(w, std::string(which) + "buf=\"" + names[buf] + "\" chunks " + std::to_string(off) + ".." +
                std::to_string(off + cnt - 1) + " exceed the buffer's " + std::to_string(chunks) + " chunks");
}

}  // namespace

Program loadProgramText(const std::string& text, const std::string& path, const LoadOptions& opt) {
  Program p;
  p.path = path;
  Where w{&p.path};
  XmlResult xr = parseXml(text);
  if (!xr.ok()) throw ProgramError(path + ":" + std::to_string(xr.line) + ": " + xr.error.substr(xr.error.find(": ") + 2));
  const XmlNode& algo = *xr.root;
  w.line = algo.line;
  if (algo.name != "algo") fail(w, "the first element must be <algo>, found <" + algo.name + ">");
  if (const std::string* v = algo.find("name")) p.name = *v;
  const std::string& proto = parseStr(w, algo, "proto");
  if (proto == "Simple") p.proto = Proto::Simple;
  else if (proto == "LL") p.proto = Proto::LL;
  else if (proto == "LL128") p.proto = Proto::LL128;
  else fail(w, "proto=\"" + proto + "\" must be Simple, LL or LL128");
  p.nchannels = (int)parseInt(w, algo, "nchannels", 1, kMaxChannels);
  p.nchunks = (int)parseInt(w, algo, "nchunksperloop", 1, 1 << 20);
  p.ngpus = (int)parseInt(w, algo, "ngpus", 1, kMaxRanks);
  const std::string& coll = parseStr(w, algo, "coll");
  if (coll == "allreduce") p.coll = Coll::AllReduce;
  else if (coll == "allgather") p.coll = Coll::AllGather;
  else if (coll == "reducescatter" || coll == "reduce_scatter") p.coll = Coll::ReduceScatter;
  else if (coll == "alltoall") p.coll = Coll::AllToAll;
  else if (coll == "broadcast") p.coll = Coll::Broadcast;
  else if (coll == "reduce") p.coll = Coll::Reduce;
  else fail(w, "coll=\"" + coll + "\" is not supported (allreduce, allgather, reducescatter, alltoall, broadcast, reduce)");
  p.inplace = parseInt(w, algo, "inplace", INT_MIN, INT_MAX) != 0;
  // Legacy files have no outofplace: there inplace="0" means out-of-place only.
  p.outofplace = parseInt(w, algo, "outofplace", INT_MIN, INT_MAX, false, p.inplace ? 0 : 1) != 0;
  p.executorDialect = algo.find("outofplace") != nullptr;
  static std::atomic<uint64_t> uids{0};
  p.uid = ++uids;
  p.minBytes = parseInt(w, algo, "minBytes", 0, INT64_MAX, false, 0);
  p.maxBytes = parseInt(w, algo, "maxBytes", 0, INT64_MAX, false, 0);
  if (p.maxBytes != 0 && p.minBytes > p.maxBytes) fail(w, "minBytes > maxBytes");
  if (!p.inplace && !p.outofplace) fail(w, "inplace=\"0\" and outofplace=\"0\": the program can never be selected");
  // No MSCCL runtime reads root; taccl's runs a rooted program only for calls with its root (and, like
  // them, ignores the attribute of a collective without one).
  p.root = rooted(p.coll) ? (int)parseInt(w, algo, "root", 0, p.ngpus - 1, false, 0) : 0;
  if ((p.coll == Coll::AllGather || p.coll == Coll::ReduceScatter) && p.nchunks % p.ngpus != 0)
    fail(w, "nchunksperloop=" + std::to_string(p.nchunks) + " is not a multiple of ngpus=" + std::to_string(p.ngpus));

  p.ranks.resize(p.ngpus);
  std::vector<bool> seen(p.ngpus, false);
  if (algo.children.size() > 1024) fail(w, "more than 1024 children under <algo> (MAX_SUBS)");
  for (auto& gp : algo.children) {
    if (gp->name != "gpu") continue;  // unknown elements are ignored, as by the runtimes
    Where gw = w;
    gw.line = gp->line;
    int id = (int)parseInt(gw, *gp, "id", 0, p.ngpus - 1);
    gw.rank = id;
    if (seen[id]) fail(gw, "a second <gpu id=\"" + std::to_string(id) + "\">");
    seen[id] = true;
    RankProgram& rp = p.ranks[id];
    rp.id = id;
    rp.line = gp->line;
    rp.iChunks = (int)parseInt(gw, *gp, "i_chunks", 0, kMaxOffset + kMaxCount);
    rp.oChunks = (int)parseInt(gw, *gp, "o_chunks", 0, kMaxOffset + kMaxCount);
    rp.sChunks = (int)parseInt(gw, *gp, "s_chunks", 0, kMaxOffset + kMaxCount);
    if (rp.iChunks > p.inputChunks())
      fail(gw, "i_chunks=" + std::to_string(rp.iChunks) + " exceeds the input buffer's " + std::to_string(p.inputChunks()) + " chunks");
    if (rp.oChunks > p.outputChunks())
      fail(gw, "o_chunks=" + std::to_string(rp.oChunks) + " exceeds the output buffer's " + std::to_string(p.outputChunks()) + " chunks");
    if (gp->children.size() > 1024) fail(gw, "more than 1024 children under <gpu> (MAX_SUBS)");
    int nsteps = 0;
    for (auto& tn : gp->children) {
      if (tn->name != "tb") continue;
      Where tw = gw;
      tw.line = tn->line;
      TbProgram tb;
      tb.line = tn->line;
      tb.id = (int)parseInt(tw, *tn, "id", 0, kMaxTbs - 1);
      tw.tb = tb.id;
      tb.send = (int)parseInt(tw, *tn, "send", -1, p.ngpus - 1);
      tb.recv = (int)parseInt(tw, *tn, "recv", -1, p.ngpus - 1);
      tb.chan = (int)parseInt(tw, *tn, "chan", 0, kMaxChannels - 1);
      if (tb.send == id || tb.recv == id) fail(tw, "a thread block may not send to or receive from its own rank");
      if (tb.chan >= p.nchannels)
        fail(tw, "chan=" + std::to_string(tb.chan) + " but nchannels=" + std::to_string(p.nchannels));
      if (tn->children.size() > 1024) fail(tw, "more than 1024 children under <tb> (MAX_SUBS)");
      int pendingNops = 0;
      for (auto& sn : tn->children) {
        if (sn->name != "step") continue;
        Where sw = tw;
        sw.line = sn->line;
        sw.step = (int)tb.steps.size();
        if ((int)tb.steps.size() >= kMaxSteps) fail(sw, "more than " + std::to_string(kMaxSteps) + " steps in one thread block");
        Step st{};
        readStep(sw, *sn, (int)tb.steps.size(), st);
        const int t = st.type;
        if ((st.depid < 0) != (st.deps < 0)) fail(sw, "depid and deps must both be -1 or both be set");
        if (t == ST_NOP) {
          if (st.depid < 0) fail(sw, "a nop without a dependency desynchronises the step indices of its block");
          pendingNops++;
        } else {
          if (pendingNops && st.depid < 0)
            fail(sw, "nop dependencies must be followed by a step that carries the last dependency");
          pendingNops = 0;
          if (st.cnt < 1) fail(sw, "cnt=0 on a step that moves data");
          if (stepSends(t) && tb.send < 0) fail(sw, std::string("type \"") + kTypeNames[t] + "\" sends but the block has send=\"-1\"");
          if (stepRecvs(t) && tb.recv < 0) fail(sw, std::string("type \"") + kTypeNames[t] + "\" receives but the block has recv=\"-1\"");
          const int chunks[3] = {rp.iChunks, rp.oChunks, rp.sChunks};
          if (stepReadsSrc(t)) checkRange(sw, "src", st.srcbuf, st.srcoff, st.cnt, chunks[st.srcbuf]);
          if (stepWritesDst(t)) checkRange(sw, "dst", st.dstbuf, st.dstoff, st.cnt, chunks[st.dstbuf]);
          checkOverlap(sw, p, id, st);
        }
        tb.steps.push_back(st);
        tb.lines.push_back(sn->line);
      }
      if (pendingNops) fail(tw, "the block ends with a nop: its dependency is attached to no step");
      nsteps += (int)tb.steps.size();
      rp.tbs.push_back(std::move(tb));
    }
    // Ids dense 0..n-1 and unique; grid size is max id + 1.
    std::sort(rp.tbs.begin(), rp.tbs.end(), [](const TbProgram& a, const TbProgram& b) { return a.id < b.id; });
    for (size_t i = 0; i < rp.tbs.size(); ++i) {
      if (rp.tbs[i].id != (int)i) {
        Where tw = gw;
        tw.line = rp.tbs[i].line;
        if (i > 0 && rp.tbs[i].id == rp.tbs[i - 1].id) fail(tw, "two thread blocks with id " + std::to_string(rp.tbs[i].id));
        fail(tw, "thread block ids must be 0.." + std::to_string(rp.tbs.size() - 1) + " without gaps; id " +
                     std::to_string(i) + " is missing");
      }
    }
    if (1 + p.ngpus + (int)rp.tbs.size() + nsteps > 4096)
      fail(gw, "more than 4096 XML nodes for this rank (MAX_NODES: algo + gpus + its tbs and steps)");
    // Connection uniqueness (rule 1) and the per-channel limits.
    std::map<std::pair<int, int>, int> sendOwner, recvOwner;
    std::vector<int> senders(kMaxChannels, 0), receivers(kMaxChannels, 0);
    for (auto& tb : rp.tbs) {
      Where tw = gw;
      tw.line = tb.line;
      tw.tb = tb.id;
      // one thread block per (channel, peer) and direction, at most 32 per channel and direction
      auto claim = [&](int peer, std::map<std::pair<int, int>, int>& owner, std::vector<int>& count,
                       const char* verb, const char* noun) {
        if (peer < 0) return;
        auto key = std::make_pair(tb.chan, peer);
        if (owner.count(key))
          fail(tw, "thread blocks " + std::to_string(owner[key]) + " and " + std::to_string(tb.id) + " both " + verb +
                       " rank " + std::to_string(peer) + " on channel " + std::to_string(tb.chan));
        owner[key] = tb.id;
        if (++count[tb.chan] > kMaxTbsPerChannel)
          fail(tw, std::string("more than 32 ") + noun + " thread blocks on one channel");
      };
      claim(tb.send, sendOwner, senders, "send to", "sending");
      claim(tb.recv, recvOwner, receivers, "receive from", "receiving");
    }
    // Dependencies: target exists on this rank, id <= 127, step exists and publishes (hasdep=1).
    for (auto& tb : rp.tbs) {
      for (size_t s = 0; s < tb.steps.size(); ++s) {
        const Step& st = tb.steps[s];
        if (st.depid < 0) continue;
        Where sw = gw;
        sw.tb = tb.id;
        sw.step = (int)s;
        sw.line = tb.lines[s];
        if (st.depid >= (int)rp.tbs.size()) fail(sw, "depid=" + std::to_string(st.depid) + " names no thread block of this rank");
        if (st.depid > kMaxDepTarget) fail(sw, "depid=" + std::to_string(st.depid) + " > 127 (stored as int8 by the runtimes)");
        const TbProgram& tgt = rp.tbs[st.depid];
        if (st.deps >= (int)tgt.steps.size())
          fail(sw, "deps=" + std::to_string(st.deps) + " but thread block " + std::to_string(st.depid) + " has " +
                       std::to_string(tgt.steps.size()) + " steps");
        if (!tgt.steps[st.deps].hasdep)
          fail(sw, "depends on tb " + std::to_string(st.depid) + " step " + std::to_string(st.deps) +
                       ", which has hasdep=\"0\" and so never publishes");
        if (st.depid == tb.id && st.deps >= (int)s) fail(sw, "depends on a later step of its own block");
      }
    }
  }
  for (int r = 0; r < p.ngpus; ++r)
    if (!seen[r]) fail(w, "no <gpu id=\"" + std::to_string(r) + "\">: every rank needs one");

  // FIFO matching (rule 2): per (A->B, chan) the send-type steps of A and receive-type steps of B pair up in
  // order with equal cnt.
  for (int a = 0; a < p.ngpus; ++a) {
    for (auto& stb : p.ranks[a].tbs) {
      if (stb.send < 0) continue;
      const int b = stb.send;
      const TbProgram* rtb = nullptr;
      for (auto& t : p.ranks[b].tbs)
        if (t.recv == a && t.chan == stb.chan) rtb = &t;
      std::vector<int> sends, recvs;
      for (size_t s = 0; s < stb.steps.size(); ++s)
        if (stb.steps[s].type != ST_NOP && stepSends(stb.steps[s].type)) sends.push_back((int)s);
      if (rtb)
        for (size_t s = 0; s < rtb->steps.size(); ++s)
          if (rtb->steps[s].type != ST_NOP && stepRecvs(rtb->steps[s].type)) recvs.push_back((int)s);
      Where sw = w;
      sw.rank = a;
      sw.tb = stb.id;
      sw.line = stb.line;
      for (size_t k = 0; k < std::min(sends.size(), recvs.size()); ++k) {
        const Step& x = stb.steps[sends[k]];
        const Step& y = rtb->steps[recvs[k]];
        if (x.cnt != y.cnt) {
          sw.step = sends[k];
          sw.line = stb.lines[sends[k]];
          fail(sw, "send #" + std::to_string(k) + " to rank " + std::to_string(b) + " on channel " + std::to_string(stb.chan) +
                       " has cnt=" + std::to_string(x.cnt) + " but the matching receive (rank " + std::to_string(b) + " tb " +
                       std::to_string(rtb->id) + " step " + std::to_string(recvs[k]) + ") has cnt=" + std::to_string(y.cnt));
        }
      }
      if (sends.size() != recvs.size())
        fail(sw, "sends " + std::to_string(sends.size()) + " calls to rank " + std::to_string(b) + " on channel " +
                     std::to_string(stb.chan) + " but rank " + std::to_string(b) + " receives " + std::to_string(recvs.size()) +
                     (rtb ? " (tb " + std::to_string(rtb->id) + ")" : " (no thread block receives from it there)"));
    }
    // Receivers without a sending block.
    for (auto& rtb : p.ranks[a].tbs) {
      if (rtb.recv < 0) continue;
      bool hasRecv = false;
      for (auto& st : rtb.steps) hasRecv |= st.type != ST_NOP && stepRecvs(st.type);
      bool hasSender = false;
      for (auto& t : p.ranks[rtb.recv].tbs) hasSender |= t.send == a && t.chan == rtb.chan;
      if (hasRecv && !hasSender) {
        Where sw = w;
        sw.rank = a;
        sw.tb = rtb.id;
        sw.line = rtb.line;
        fail(sw, "receives from rank " + std::to_string(rtb.recv) + " on channel " + std::to_string(rtb.chan) +
                     " but no thread block there sends to rank " + std::to_string(a));
      }
    }
  }
  if (opt.analysis) analyzeProgram(p);
  return p;
}

Program loadProgramFile(const std::string& path, const LoadOptions& opt) {
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec))
    throw ProgramError(path + ": is a directory: expected an XML file (MSCCL_ALGO_DIR names directories)");
  std::ifstream f(path, std::ios::binary);
  if (!f) throw ProgramError(path + ": cannot open the file");
  std::ostringstream ss;
  ss << f.rdbuf();
  if (f.bad()) throw ProgramError(path + ": cannot read the file");
  std::string text = ss.str();
  if (text.size() > (64u << 20)) throw ProgramError(path + ": file larger than 64 MiB");
  return loadProgramText(text, path, opt);
}

// ---------------------------------------------------------------------------------------------------------
// Happens-before analysis.

void analyzeProgram(Program& p) {
  struct Node { int rank, tb, step; };
  std::vector<Node> nodes;
  std::vector<std::vector<int>> base(p.ngpus);  // base[r][tb] = first node of that tb
  for (int r = 0; r < p.ngpus; ++r)
    for (auto& tb : p.ranks[r].tbs) {
      base[r].push_back((int)nodes.size());
      for (size_t s = 0; s < tb.steps.size(); ++s) nodes.push_back({r, tb.id, (int)s});
    }
  const int n = (int)nodes.size();
  // Up to three predecessors per node: program order, dependency, matched send.
  std::vector<int> pred(3 * (size_t)n, -1);
  std::vector<std::vector<int>> succ(n);
  auto edge = [&](int from, int to, int slot) {
    pred[3 * (size_t)to + slot] = from;
    succ[from].push_back(to);
  };
  for (int r = 0; r < p.ngpus; ++r)
    for (auto& tb : p.ranks[r].tbs)
      for (size_t s = 0; s < tb.steps.size(); ++s) {
        int me = base[r][tb.id] + (int)s;
        if (s > 0) edge(me - 1, me, 0);
        const Step& st = tb.steps[s];
        if (st.depid >= 0 && !(st.depid == tb.id)) edge(base[r][st.depid] + st.deps, me, 1);
      }
  // (send, receive) pairs whose receive only stores what arrives (recv, rcs), by the receiver's rank: the
  // candidates for a direct transfer.
  std::vector<std::vector<std::pair<int, int>>> directCandidates(p.ngpus);
  for (int a = 0; a < p.ngpus; ++a)
    for (auto& stb : p.ranks[a].tbs) {
      if (stb.send < 0) continue;
      const int b = stb.send;
      for (auto& rtb : p.ranks[b].tbs) {
        if (rtb.recv != a || rtb.chan != stb.chan) continue;
        size_t j = 0;
        for (size_t s = 0; s < stb.steps.size(); ++s) {
          if (stb.steps[s].type == ST_NOP || !stepSends(stb.steps[s].type)) continue;
          while (j < rtb.steps.size() && (rtb.steps[j].type == ST_NOP || !stepRecvs(rtb.steps[j].type))) j++;
          if (j < rtb.steps.size()) {
            const int from = base[a][stb.id] + (int)s, to = base[b][rtb.id] + (int)j++;
            edge(from, to, 2);
            const int t = p.ranks[b].tbs[rtb.id].steps[to - base[b][rtb.id]].type;
            if (t == ST_RECV || t == ST_RCS) directCandidates[b].push_back({from, to});
          }
        }
      }
    }
  // Topological order (Kahn).
  std::vector<int> indeg(n, 0), order;
  order.reserve(n);
  for (int v = 0; v < n; ++v)
    for (int k = 0; k < 3; ++k) indeg[v] += pred[3 * (size_t)v + k] >= 0;
  for (int v = 0; v < n; ++v)
    if (!indeg[v]) order.push_back(v);
  for (size_t i = 0; i < order.size(); ++i)
    for (int w : succ[order[i]])
      if (--indeg[w] == 0) order.push_back(w);
  if ((int)order.size() != n) {
    std::ostringstream o;
    o << p.path << ": dependency cycle (a certain deadlock, whatever the FIFO sizes); blocked steps:";
    int shown = 0;
    for (int v = 0; v < n && shown < 8; ++v) {
      if (!indeg[v]) continue;
      if (nodes[v].step > 0 && indeg[v - 1]) continue;  // show the first blocked step of each block
      const TbProgram& tb = p.ranks[nodes[v].rank].tbs[nodes[v].tb];
      const Step& st = tb.steps[nodes[v].step];
      o << "\n  rank " << nodes[v].rank << " tb " << nodes[v].tb << " step " << nodes[v].step << " (line "
        << tb.lines[nodes[v].step] << ", " << kTypeNames[st.type] << ")";
      if (st.depid >= 0) o << " waits for tb " << st.depid << " step " << st.deps;
      if (stepRecvs(st.type) && st.type != ST_NOP) o << " receives from rank " << tb.recv << " channel " << tb.chan;
      shown++;
    }
    throw ProgramError(o.str());
  }

  // Races and direct transfers, one rank at a time. Vector clocks over that rank's blocks: vc[v][t] = 1 +
  // the last step of block t that happens before (or is) node v.
  const bool directAffordable = (int64_t)n * p.ngpus <= (int64_t)64 << 20;
  for (int r = 0; r < p.ngpus; ++r) {
    const int T = (int)p.ranks[r].tbs.size();
    const bool races = T >= 2, direct = directAffordable && !directCandidates[r].empty();
    if (!races && !direct) continue;
    if ((int64_t)n * T > (int64_t)48 << 20) continue;  // too large to analyse; the run-time watchdog remains
    std::vector<int16_t> vc((size_t)n * T, 0);
    for (int v : order) {
      int16_t* mine = &vc[(size_t)v * T];
      for (int k = 0; k < 3; ++k) {
        int u = pred[3 * (size_t)v + k];
        if (u < 0) continue;
        const int16_t* theirs = &vc[(size_t)u * T];
        for (int t = 0; t < T; ++t) mine[t] = std::max(mine[t], theirs[t]);
      }
      if (nodes[v].rank == r) mine[nodes[v].tb] = (int16_t)(nodes[v].step + 1);
    }
    auto phys = [&](int buf, int chunk) { return physicalChunk(p, r, buf, chunk); };
    std::map<int64_t, std::vector<std::pair<int, bool>>> acc;
    for (auto& tb : p.ranks[r].tbs)
      for (size_t s = 0; s < tb.steps.size(); ++s) {
        const Step& st = tb.steps[s];
        if (st.type == ST_NOP) continue;
        int v = base[r][tb.id] + (int)s;
        if (stepReadsSrc(st.type))
          for (int c = 0; c < st.cnt; ++c) acc[phys(st.srcbuf, st.srcoff + c)].push_back({v, false});
        if (stepWritesDst(st.type))
          for (int c = 0; c < st.cnt; ++c) {
            int64_t d = phys(st.dstbuf, st.dstoff + c);
            // a copy onto itself (an in-place AllGather's own chunk) leaves memory unchanged: not a write
            if (st.type == ST_CPY && d == phys(st.srcbuf, st.srcoff + c)) continue;
            acc[d].push_back({v, true});
          }
      }
    // a (on rank r) happens before b (on any rank)
    auto before = [&](int a, int b) { return vc[(size_t)b * T + nodes[a].tb] >= nodes[a].step + 1; };
    // A direct transfer writes the receiver's destination at some moment of the send step, which may come
    // before the receive step begins: safe when every other access of rank r to those chunks happens after
    // the receive (it waits for the data anyway) or before the send (the sender's wait covers it).
    if (direct)
      for (auto [snd, rcv] : directCandidates[r]) {
        Step& rs = p.ranks[r].tbs[nodes[rcv].tb].steps[nodes[rcv].step];
        bool safe = true;
        for (int c = 0; c < rs.cnt && safe; ++c) {
          auto it = acc.find(phys(rs.dstbuf, rs.dstoff + c));
          if (it == acc.end()) continue;
          for (auto& [v, writes] : it->second)
            if (v != rcv && !before(rcv, v) && !before(v, snd)) { safe = false; break; }
        }
        if (!safe) continue;
        Step& ss = p.ranks[nodes[snd].rank].tbs[nodes[snd].tb].steps[nodes[snd].step];
        rs.direct |= DIRECT_RECV;
        ss.direct |= (uint8_t)(DIRECT_SEND | rs.dstbuf << 2);
        ss.peeroff = rs.dstoff;
      }
    if (!races) continue;
    for (auto& kv : acc) {
      auto& list = kv.second;
      for (size_t i = 0; i < list.size(); ++i)
        for (size_t j = i + 1; j < list.size(); ++j) {
          int a = list[i].first, b = list[j].first;
          if (nodes[a].tb == nodes[b].tb || !(list[i].second || list[j].second)) continue;
          if (before(a, b) || before(b, a)) continue;
          static const char* names[] = {"i", "o", "s"};
          const TbProgram& ta = p.ranks[r].tbs[nodes[a].tb];
          const TbProgram& tb2 = p.ranks[r].tbs[nodes[b].tb];
          std::ostringstream o;
          o << p.path << ":" << ta.lines[nodes[a].step] << ": rank " << r << ": data race on chunk "
            << names[kv.first >> 32] << "[" << (kv.first & 0xffffffff) << "]" << (p.inplace ? " (in-place aliasing)" : "")
            << ": tb " << nodes[a].tb << " step " << nodes[a].step << " (" << kTypeNames[ta.steps[nodes[a].step].type]
            << (list[i].second ? ", writes" : ", reads") << ") and tb " << nodes[b].tb << " step " << nodes[b].step
            << " (line " << tb2.lines[nodes[b].step] << ", " << kTypeNames[tb2.steps[nodes[b].step].type]
            << (list[j].second ? ", writes" : ", reads") << ") are not ordered by any dependency chain";
          throw ProgramError(o.str());
        }
    }
  }
}

}  // namespace taccl
