// NIC probes through libibverbs (compiled only when <infiniband/verbs.h> exists; see the Makefile).
//
// nic_loopback: an RC queue pair connected to itself; RDMA writes of a host buffer onto itself, posted and
//   polled by a thread pinned to one NUMA node with its buffer allocated there. Latency is lowest from the
//   socket the NIC hangs off (TACCL section 4: "which CPU is nearest the NIC").
// host_nic_busy: the same loopback kept busy with 1 MiB writes by a background thread while each GPU copies
//   to the host; GPUs behind the NIC's PCIe switch lose bandwidth ("which GPUs share the NIC's switch").
//
// UNTESTED ON HARDWARE: compiled only.
#pragma once

#include <infiniband/verbs.h>
#include <sched.h>

#include <atomic>
#include <functional>
#include <thread>

struct VerbsHooks {
  std::function<void(const std::string&)> arm;
  std::function<void()> disarm;
  std::function<std::string(int gpu, size_t bytes, int reps, bool* ok)> host_times;
};

namespace verbs_detail {

struct Loop {
  ibv_context* ctx = nullptr;
  ibv_pd* pd = nullptr;
  ibv_cq* cq = nullptr;
  ibv_qp* qp = nullptr;
  ibv_mr* mr = nullptr;
  char* buf = nullptr;
  size_t len = 0;
  std::string err;

  ~Loop() {
    if (qp) ibv_destroy_qp(qp);
    if (mr) ibv_dereg_mr(mr);
    if (cq) ibv_destroy_cq(cq);
    if (pd) ibv_dealloc_pd(pd);
    if (ctx) ibv_close_device(ctx);
    free(buf);
  }

  bool fail(const std::string& e) {
    err = e;
    return false;
  }

  bool open(const std::string& name, size_t bytes) {
    int n = 0;
    ibv_device** list = ibv_get_device_list(&n);
    if (!list) return fail("ibv_get_device_list failed");
    for (int i = 0; i < n && !ctx; ++i)
      if (name == ibv_get_device_name(list[i])) ctx = ibv_open_device(list[i]);
    ibv_free_device_list(list);
    if (!ctx) return fail("cannot open RDMA device " + name);
    ibv_port_attr port{};
    if (ibv_query_port(ctx, 1, &port)) return fail("ibv_query_port failed");
    if (port.state != IBV_PORT_ACTIVE) return fail("port 1 is not active");
    len = bytes;
    if (posix_memalign((void**)&buf, 4096, 2 * len)) return fail("out of memory");
    memset(buf, 1, 2 * len);  // first touch: the memory lands on the calling thread's NUMA node
    if (!(pd = ibv_alloc_pd(ctx))) return fail("ibv_alloc_pd failed");
    if (!(mr = ibv_reg_mr(pd, buf, 2 * len, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ)))
      return fail("ibv_reg_mr failed");
    if (!(cq = ibv_create_cq(ctx, 256, nullptr, nullptr, 0))) return fail("ibv_create_cq failed");
    ibv_qp_init_attr qa{};
    qa.send_cq = qa.recv_cq = cq;
    qa.qp_type = IBV_QPT_RC;
    qa.cap.max_send_wr = 128;
    qa.cap.max_recv_wr = 1;
    qa.cap.max_send_sge = qa.cap.max_recv_sge = 1;
    if (!(qp = ibv_create_qp(pd, &qa))) return fail("ibv_create_qp failed");
    ibv_qp_attr a{};
    a.qp_state = IBV_QPS_INIT;
    a.pkey_index = 0;
    a.port_num = 1;
    a.qp_access_flags = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ;
    if (ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS))
      return fail("QP to INIT failed");
    a = ibv_qp_attr{};
    a.qp_state = IBV_QPS_RTR;
    a.path_mtu = port.active_mtu;
    a.dest_qp_num = qp->qp_num;  // loopback: connected to itself
    a.rq_psn = 0;
    a.max_dest_rd_atomic = 1;
    a.min_rnr_timer = 12;
    a.ah_attr.dlid = port.lid;
    a.ah_attr.port_num = 1;
    if (port.link_layer == IBV_LINK_LAYER_ETHERNET) {  // RoCE needs a GID
      const char* gi = getenv("TACCL_GID_INDEX");
      ibv_gid gid{};
      int idx = gi ? atoi(gi) : 0;
      if (ibv_query_gid(ctx, 1, idx, &gid)) return fail("ibv_query_gid failed");
      a.ah_attr.is_global = 1;
      a.ah_attr.grh.dgid = gid;
      a.ah_attr.grh.sgid_index = (uint8_t)idx;
      a.ah_attr.grh.hop_limit = 1;
    }
    if (ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
                                  IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER))
      return fail("QP to RTR failed");
    a = ibv_qp_attr{};
    a.qp_state = IBV_QPS_RTS;
    a.timeout = 14;
    a.retry_cnt = 7;
    a.rnr_retry = 7;
    a.sq_psn = 0;
    a.max_rd_atomic = 1;
    if (ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN |
                                  IBV_QP_MAX_QP_RD_ATOMIC))
      return fail("QP to RTS failed");
    return true;
  }

  bool post(size_t bytes, bool signaled) {
    ibv_sge sge{};
    sge.addr = (uintptr_t)buf;
    sge.length = (uint32_t)bytes;
    sge.lkey = mr->lkey;
    ibv_send_wr wr{}, *bad = nullptr;
    wr.opcode = IBV_WR_RDMA_WRITE;
    wr.sg_list = &sge;
    wr.num_sge = 1;
    wr.send_flags = signaled ? IBV_SEND_SIGNALED : 0;
    wr.wr.rdma.remote_addr = (uintptr_t)(buf + len);
    wr.wr.rdma.rkey = mr->rkey;
    return ibv_post_send(qp, &wr, &bad) == 0;
  }

  // Wait for `n` completions; false on a failed completion.
  bool poll(int n) {
    ibv_wc wc[16];
    while (n > 0) {
      int got = ibv_poll_cq(cq, n < 16 ? n : 16, wc);
      if (got < 0) return false;
      for (int i = 0; i < got; ++i)
        if (wc[i].status != IBV_WC_SUCCESS) return false;
      n -= got;
    }
    return true;
  }
};

inline bool pin_to_node(int node) {
  std::string list = read_line("/sys/devices/system/node/node" + std::to_string(node) + "/cpulist");
  if (list.empty()) return false;
  cpu_set_t set;
  CPU_ZERO(&set);
  for (auto& part : split(list, ',')) {
    size_t dash = part.find('-');
    int a = atoi(part.c_str()), b = dash == std::string::npos ? a : atoi(part.c_str() + dash + 1);
    for (int c = a; c <= b && c < CPU_SETSIZE; ++c) CPU_SET(c, &set);
  }
  return sched_setaffinity(0, sizeof set, &set) == 0;
}

inline std::vector<int> numa_nodes() {
  std::vector<int> out;
  for (int i = 0; i < 64; ++i)
    if (!read_line("/sys/devices/system/node/node" + std::to_string(i) + "/cpulist").empty()) out.push_back(i);
  if (out.empty()) out.push_back(0);
  return out;
}

}  // namespace verbs_detail

inline void run_verbs_probes(Output& out, int ngpu, bool quick, int reps, size_t big, VerbsHooks& hk, Progress& prog) {
  using namespace verbs_detail;
  if (out.nics.empty()) {
    out.add_skip("nic_loopback", "NIC", "no NIC found (no RDMA device under /sys/class/infiniband)");
    return;
  }
  cpu_set_t saved;
  sched_getaffinity(0, sizeof saved, &saved);
  std::vector<size_t> sizes;
  for (size_t s = 8; s <= (size_t(1) << 20); s *= quick ? 16 : 4) sizes.push_back(s);
  for (auto& nic : out.nics) {
    for (int node : numa_nodes()) {
      std::string what = "nic_loopback " + nic.name + " from NUMA node " + std::to_string(node);
      prog.step(what);
      hk.arm(what);
      bool pinned = pin_to_node(node);
      std::string samples = "[";
      std::string err;
      {
        Loop lp;
        if (!lp.open(nic.name, size_t(1) << 20)) {
          err = lp.err;
        } else {
          bool first = true;
          for (size_t b : sizes)
            for (int r = -1; r < reps * 4 && err.empty(); ++r) {  // r = -1 is a warm-up
              auto t0 = std::chrono::steady_clock::now();
              if (!lp.post(b, true) || !lp.poll(1)) err = "RDMA write failed";
              double us = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count();
              if (r >= 0 && err.empty()) {
                samples += std::string(first ? "" : ",") + "[" + std::to_string(b) + "," + fmt_num(us) + "]";
                first = false;
              }
            }
        }
      }
      sched_setaffinity(0, sizeof saved, &saved);
      hk.disarm();
      std::string rec = "{\"probe\":\"nic_loopback\",\"nic\":" + jstr(nic.name) + ",\"numa_node\":" + std::to_string(node) +
                        ",\"pinned\":" + (pinned ? "true" : "false");
      if (!err.empty()) rec += ",\"status\":\"error\",\"reason\":" + jstr(err);
      out.add_measurement(rec + ",\"samples\":" + samples + "]}");
      if (!err.empty()) break;  // the NIC cannot loop back: no point trying other sockets
    }
    if (ngpu < 1) {
      out.add_skip("host_nic_busy", nic.name, "no GPU");
      continue;
    }
    // Keep the NIC busy from its own socket while each GPU copies to the host.
    std::atomic<bool> stop{false}, ready{false};
    std::string busy_err;
    std::thread busy([&] {
      if (nic.numa >= 0) pin_to_node(nic.numa);
      Loop lp;
      if (!lp.open(nic.name, size_t(1) << 20)) {
        busy_err = lp.err;
        ready = true;
        return;
      }
      ready = true;
      int outstanding = 0;
      while (!stop) {
        while (outstanding < 16 && lp.post(size_t(1) << 20, true)) ++outstanding;
        if (!lp.poll(1)) { busy_err = "RDMA write failed"; break; }
        --outstanding;
      }
      lp.poll(outstanding);
    });
    while (!ready) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    for (int g = 0; g < ngpu && busy_err.empty(); ++g) {
      std::string what = "host_nic_busy " + nic.name + " gpu " + std::to_string(g);
      prog.step(what);
      hk.arm(what);
      bool ok = true;
      std::string times = hk.host_times(g, big, reps, &ok);
      hk.disarm();
      std::string rec = "{\"probe\":\"host_nic_busy\",\"nic\":" + jstr(nic.name) + ",\"direction\":\"d2h\",\"gpu\":" +
                        std::to_string(g) + ",\"bytes\":" + std::to_string(big) + ",\"times_us\":" + times;
      if (!ok) rec += ",\"status\":\"error\",\"reason\":\"CUDA error\"";
      out.add_measurement(rec + "}");
    }
    stop = true;
    busy.join();
    if (!busy_err.empty()) out.add_skip("host_nic_busy", nic.name, "NIC loopback traffic failed: " + busy_err);
  }
}
