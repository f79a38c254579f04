// Persistent host threads that each run one job of a call and are waited for together: the CUDA backend
// launches each GPU's kernel from its own thread (the kernels wait for each other, so one thread launching
// them in turn deadlocks wherever a launch blocks), and creating those threads anew for every call costs
// tens of microseconds, as much as a small collective.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace taccl {

// Job 0 runs on the calling thread, after the others were handed out: one handoff fewer (a wake-up costs about
// as much as creating a thread on a loaded host).
class LaunchPool {
 public:
  explicit LaunchPool(int jobs) : size_(jobs) {
    for (int i = 1; i < jobs; ++i) threads_.emplace_back([this, i] { loop(i); });
  }
  ~LaunchPool() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    wake_.notify_all();
    for (auto& t : threads_) t.join();
  }
  LaunchPool(const LaunchPool&) = delete;
  LaunchPool& operator=(const LaunchPool&) = delete;

  int size() const { return size_; }

  // Runs job(i) for every i < n (n <= size()): job 0 on the calling thread, job i on worker i, and returns
  // once all have returned; the first exception a job threw is rethrown here. One call at a time.
  void run(int n, const std::function<void(int)>& job) {
    if (n <= 0) return;
    std::unique_lock<std::mutex> lock(mu_);
    job_ = &job;
    jobs_ = n;
    pending_ = n - 1;
    failure_ = nullptr;
    ++generation_;
    lock.unlock();
    wake_.notify_all();
    std::exception_ptr failed;
    try {
      job(0);
    } catch (...) {
      failed = std::current_exception();
    }
    lock.lock();
    if (failed && !failure_) failure_ = failed;
    done_.wait(lock, [this] { return pending_ == 0; });
    job_ = nullptr;
    if (failure_) std::rethrow_exception(failure_);
  }

 private:
  void loop(int i) {
    uint64_t seen = 0;
    std::unique_lock<std::mutex> lock(mu_);
    for (;;) {
      wake_.wait(lock, [&] { return stop_ || generation_ != seen; });
      if (stop_) return;
      seen = generation_;
      if (i >= jobs_) continue;
      const std::function<void(int)>* job = job_;
      lock.unlock();
      std::exception_ptr failed;
      try {
        (*job)(i);
      } catch (...) {
        failed = std::current_exception();
      }
      lock.lock();
      if (failed && !failure_) failure_ = failed;
      if (--pending_ == 0) done_.notify_one();
    }
  }

  std::mutex mu_;
  std::condition_variable wake_, done_;
  const std::function<void(int)>* job_ = nullptr;
  int jobs_ = 0, pending_ = 0;
  uint64_t generation_ = 0;
  bool stop_ = false;
  std::exception_ptr failure_;
  const int size_;
  std::vector<std::thread> threads_;  // last: started once everything they read is initialised
};

}  // namespace taccl
