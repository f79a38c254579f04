// The simulator's event loop (taccl/simulator.py, `Simulator._run_tiles`) in C++: the same model, step for
// step and operation for operation, so that both give the same doubles. Python keeps the model's reference
// implementation (and the trace); this one exists because a 1024-rank program has millions of step events,
// about 40 us each in Python. Built by setup.py as the optional extension `taccl._simcore` and loaded with
// ctypes (plain C ABI: flat arrays in, times out); it has no Python API of its own.
//
// Inputs are the flattened program of `Simulator._native_inputs`: steps of all thread blocks back to back
// (tb_off[G]..tb_off[G+1] are block G's), connections with their link resources, and each resource's lanes.
// Keep the two implementations in step: tests/test_simulator_native.py compares them on many programs.
#include <algorithm>
#include <cstdint>
#include <deque>
#include <queue>
#include <unordered_map>
#include <vector>

namespace {

constexpr int kSend = 1, kRecv = 2, kLocal = 4;

// One lane of a resource: its booked intervals, sorted by start (their ends are sorted too: no overlaps).
struct Lane {
    std::vector<double> starts, ends;
};

// The earliest time >= t at which `lane` is free for a transfer `duration` long that ends no earlier than
// `tail`; gaps between bookings count (simulator.py `_lane_fit`).
double lane_fit(const Lane& lane, double t, double duration, double tail) {
    const std::vector<double>& starts = lane.starts;
    const std::vector<double>& ends = lane.ends;
    if (ends.empty() || ends.back() <= t) return t;
    long k = static_cast<long>(std::upper_bound(starts.begin(), starts.end(), t) - starts.begin()) - 1;
    if (k >= 0 && ends[k] > t) t = ends[k];
    ++k;
    const long n = static_cast<long>(starts.size());
    while (k < n) {
        double end = t + duration;
        if (tail > end) end = tail;
        if (starts[k] >= end) break;
        if (ends[k] > t) t = ends[k];
        ++k;
    }
    return t;
}

struct Candidate {
    std::vector<Lane>* full;  // the resource's full lanes
    double duration;          // the transfer's time on a full lane
    Lane* slow;               // its partial lane, or null when not offered
    double slow_duration;
};

struct Choice {
    Lane* lane = nullptr;
    double duration = 0.0;
};

// simulator.py `_fit`: the earliest start >= `start` at which every resource has a lane free, and the lane
// taken on each; a resource that makes the transfer wait pushes the start and the others are asked again.
double fit(const std::vector<Candidate>& cands, double start, double tail, std::vector<Choice>& chosen) {
    chosen.assign(cands.size(), Choice());
    bool moved = true;
    while (moved) {
        moved = false;
        for (size_t k = 0; k < cands.size(); ++k) {
            const Candidate& c = cands[k];
            bool have = false;
            double best = 0.0;
            for (Lane& lane : *c.full) {
                double t = lane_fit(lane, start, c.duration, tail);
                if (!have || t < best) {
                    have = true;
                    best = t;
                    chosen[k] = Choice{&lane, c.duration};
                    if (t <= start) break;
                }
            }
            if (c.slow != nullptr && best > start) {
                double t = lane_fit(*c.slow, start, c.slow_duration, tail);
                if (t < best) {
                    best = t;
                    chosen[k] = Choice{c.slow, c.slow_duration};
                }
            }
            if (best > start) {
                start = best;
                moved = true;
            }
        }
    }
    return start;
}

double max_duration(const std::vector<Choice>& chosen, double otherwise) {
    if (chosen.empty()) return otherwise;
    double m = chosen[0].duration;
    for (const Choice& c : chosen)
        if (c.duration > m) m = c.duration;
    return m;
}

struct Event {
    double ready;
    int64_t seq;
    int32_t tb;
    bool operator>(const Event& o) const { return ready != o.ready ? ready > o.ready : seq > o.seq; }
};

}  // namespace

extern "C" {

// Returns 0 when every thread block finished (iter_finish[x]: the last step end of tile iteration x, not
// yet made monotone; *transfers_out: sends simulated), 1 on a deadlock (stuck[0..3]: how many blocks never
// finish, the first one's index, step and tile iteration), 2 on an allocation failure.
int taccl_sim_run(
    // thread blocks and their steps
    int32_t ntb, const int64_t* tb_off, const int8_t* kind, const int32_t* cnt, const int64_t* dep_slot,
    const int64_t* fin_slot, const int32_t* sidx, const int32_t* ridx, const double* local_cost,
    const int32_t* nsend, const int32_t* nrecv, const int32_t* out_conn, const int32_t* in_conn,
    // connections and link resources
    int32_t nconn, const int32_t* conn_sender, const int32_t* conn_receiver, const double* conn_alpha,
    const double* conn_bpus, const double* conn_busy, const int64_t* conn_res_off, const int32_t* conn_res,
    int32_t nres, const int32_t* res_lanes, const double* res_partial,
    // model constants
    int64_t nslots, int32_t depth, double local_bpus, double sync, int32_t cut, int32_t per_call,
    double slice_fixed,
    // the tile iterations
    int32_t ntiles, const double* tile_bytes,
    // results
    double* iter_finish, int64_t* transfers_out, int64_t* stuck) try {
    const int64_t T = ntiles;
    std::vector<int64_t> pc(ntb, 0), it(ntb, 0);
    std::vector<double> tfree(ntb, 0.0), fwd_after(ntb, 0.0);
    std::vector<char> pending(ntb, 0);
    std::vector<std::vector<double>> arrivals(nconn), first_slice(nconn), recv_done(nconn);
    std::vector<std::vector<Lane>> lanes(nres);
    std::vector<Lane> partial_lane(nres);
    for (int32_t r = 0; r < nres; ++r) lanes[r].resize(res_lanes[r]);
    std::vector<double> fin(static_cast<size_t>(nslots * T), -1.0);  // < 0: not finished yet
    std::unordered_map<int64_t, std::vector<int32_t>> dep_waiters;
    std::priority_queue<Event, std::vector<Event>, std::greater<Event>> heap;
    std::deque<int32_t> work;
    int64_t seq = 0, transfers = 0;
    for (int64_t x = 0; x < T; ++x) iter_finish[x] = 0.0;
    for (int32_t G = 0; G < ntb; ++G) {
        work.push_back(G);
        if (tb_off[G + 1] == tb_off[G]) it[G] = T;
    }

    // step pc[G] of iteration it[G] finished at t
    auto complete = [&](int32_t G, double t) {
        const int64_t i = pc[G], itx = it[G], s = tb_off[G] + i;
        if (fin_slot[s] >= 0) {
            const int64_t key = fin_slot[s] * T + itx;
            fin[key] = t;
            auto w = dep_waiters.find(key);
            if (w != dep_waiters.end()) {
                for (int32_t g : w->second) work.push_back(g);
                dep_waiters.erase(w);
            }
        }
        tfree[G] = t;
        if (i + 1 == tb_off[G + 1] - tb_off[G]) {
            if (t > iter_finish[itx]) iter_finish[itx] = t;
            pc[G] = 0;
            it[G] = itx + 1;
        } else {
            pc[G] = i + 1;
        }
    };

    std::vector<Candidate> cands;
    std::vector<Choice> chosen, chosen_p;
    while (true) {
        while (!work.empty()) {
            const int32_t G = work.front();
            work.pop_front();
            if (pending[G]) continue;
            while (it[G] < T) {
                const int64_t i = pc[G], itx = it[G], s = tb_off[G] + i;
                double ready = tfree[G];
                if (dep_slot[s] >= 0) {
                    const int64_t key = dep_slot[s] * T + itx;
                    double f = fin[key];
                    if (f < 0.0) {
                        dep_waiters[key].push_back(G);
                        break;
                    }
                    f += sync;
                    if (f > ready) ready = f;
                }
                const int k = kind[s];
                if (k & kRecv) {
                    const int32_t c = in_conn[G];
                    const int64_t q = itx * nrecv[G] + ridx[s];
                    const std::vector<double>& arr = arrivals[c];
                    if (static_cast<int64_t>(arr.size()) <= q) break;  // the sender's arrival wakes this block
                    if (cut && (k & kSend)) {
                        // forward as slices arrive: start after the first, end after the last
                        fwd_after[G] = arr[q];
                        if (first_slice[c][q] > ready) ready = first_slice[c][q];
                    } else {
                        ready += static_cast<double>(cnt[s]) * tile_bytes[itx] / local_bpus * local_cost[s];
                        if (arr[q] > ready) ready = arr[q];
                    }
                }
                if (k & kSend) {
                    const int32_t c = out_conn[G];
                    const int64_t q = itx * nsend[G] + sidx[s];
                    if (q >= depth) {
                        const std::vector<double>& rd = recv_done[c];
                        if (static_cast<int64_t>(rd.size()) <= q - depth) break;  // the receiver wakes it
                        const double credit = rd[q - depth] + conn_alpha[c] - conn_busy[c];
                        if (credit > ready) ready = credit;
                    }
                    pending[G] = 1;
                    heap.push(Event{ready, ++seq, G});
                    break;
                }
                if (k & kRecv) {
                    const int32_t c = in_conn[G];
                    recv_done[c].push_back(ready);
                    work.push_back(conn_sender[c]);
                    complete(G, ready);
                    continue;
                }
                if (k & kLocal) ready += static_cast<double>(cnt[s]) * tile_bytes[itx] / local_bpus * local_cost[s];
                complete(G, ready);
            }
        }
        if (heap.empty()) break;
        const Event ev = heap.top();
        heap.pop();
        const int32_t G = ev.tb;
        const int64_t i = pc[G], itx = it[G], s = tb_off[G] + i;
        const int32_t c = out_conn[G];
        pending[G] = 0;
        double start = ev.ready + conn_busy[c];
        const double nbytes = static_cast<double>(cnt[s]) * tile_bytes[itx];
        double rate = conn_bpus[c];
        const double flight = conn_alpha[c] - conn_busy[c];
        const double duration = nbytes / rate;
        const double sl = per_call ? nbytes / per_call : std::min(nbytes, slice_fixed);
        double tail = 0.0;
        if (fwd_after[G] != 0.0) {
            tail = fwd_after[G] + sl / rate;  // the last incoming slice, forwarded
            fwd_after[G] = 0.0;
        }
        const int64_t r0 = conn_res_off[c], r1 = conn_res_off[c + 1];
        const double ready_at = start;
        cands.clear();
        bool any_partial = false;
        for (int64_t j = r0; j < r1; ++j) {
            cands.push_back(Candidate{&lanes[conn_res[j]], duration, nullptr, 0.0});
            if (res_partial[conn_res[j]] != 0.0) any_partial = true;
        }
        start = fit(cands, start, tail, chosen);
        if (start > ready_at && any_partial) {
            for (int64_t j = r0; j < r1; ++j) {
                const int32_t r = conn_res[j];
                if (res_partial[r] != 0.0) {
                    cands[j - r0].slow = &partial_lane[r];
                    cands[j - r0].slow_duration = duration / res_partial[r];
                }
            }
            const double start_p = fit(cands, ready_at, tail, chosen_p);
            if (start_p + max_duration(chosen_p, duration) <= start + duration) {
                start = start_p;
                chosen.swap(chosen_p);
            }
        }
        const double slowest = max_duration(chosen, duration);
        double end = start + slowest;
        if (tail > end) end = tail;
        rate = slowest > 0 ? nbytes / slowest : rate;
        for (const Choice& ch : chosen) {
            Lane& lane = *ch.lane;
            const auto pos = std::upper_bound(lane.starts.begin(), lane.starts.end(), start) - lane.starts.begin();
            lane.starts.insert(lane.starts.begin() + pos, start);
            lane.ends.insert(lane.ends.begin() + pos, std::max(start + ch.duration, tail));
        }
        ++transfers;
        arrivals[c].push_back(end + flight);
        const double fs = start + sl / rate;
        first_slice[c].push_back((fs < end ? fs : end) + flight);
        work.push_back(conn_receiver[c]);
        if (kind[s] & kRecv) {
            const int32_t ci = in_conn[G];
            recv_done[ci].push_back(end);
            work.push_back(conn_sender[ci]);
        }
        complete(G, end);
        work.push_back(G);
    }
    *transfers_out = transfers;
    int64_t nstuck = 0;
    for (int32_t G = 0; G < ntb; ++G) {
        if (it[G] < T) {
            if (nstuck == 0) {
                stuck[1] = G;
                stuck[2] = pc[G];
                stuck[3] = it[G];
            }
            ++nstuck;
        }
    }
    stuck[0] = nstuck;
    return nstuck ? 1 : 0;
} catch (const std::bad_alloc&) {
    return 2;
}

}  // extern "C"
