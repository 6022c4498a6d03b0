// A fixed pool of worker threads running parallel loops.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace gaac::model {

/// Runs `parallel_for` loops on `threads` threads (the caller's thread is one of them).
class ThreadPool {
 public:
  /// `threads` ≤ 0 means one per hardware thread.
  explicit ThreadPool(int threads = 0);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  /// Number of threads taking part in a loop.
  int size() const { return static_cast<int>(workers_.size()) + 1; }

  /// Calls body(begin, end) over disjoint chunks covering [0, n), chunk boundaries at multiples of
  /// `grain`, and returns when all are done. Exceptions from a body are rethrown here.
  void parallel_for(int64_t n, int64_t grain, const std::function<void(int64_t, int64_t)>& body);

 private:
  void work(int index);
  void run_chunk(int index);

  std::vector<std::thread> workers_;
  std::mutex mutex_;
  std::condition_variable wake_, done_;
  const std::function<void(int64_t, int64_t)>* body_ = nullptr;
  int64_t n_ = 0, grain_ = 1;
  uint64_t generation_ = 0;
  int pending_ = 0;
  bool stop_ = false;
  std::exception_ptr error_;
};

}  // namespace gaac::model
