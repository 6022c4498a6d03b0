// A fixed pool of worker threads running parallel loops.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace gaac::model {

/// Runs `parallel_for` loops on `size()` threads (the caller's thread is one of them).
///
/// The contract on the thread count: 0 means one thread per available CPU; a count above
/// max_threads() or below 0 is refused; a worker the system cannot start is an error. Every
/// refusal is a gaac::Error thrown by the constructor after any workers it had started are
/// stopped and joined, so constructing a pool never hangs and never leaks a thread.
class ThreadPool {
 public:
  /// Most threads a pool may have per available CPU. More only slow a compute-bound loop; the bound
  /// keeps a mistyped count from exhausting the system's process table.
  static constexpr int kMaxThreadsPerCpu = 4;

  /// A worker-thread factory, as std::thread's constructor is (and may fail as it does, by throwing).
  using ThreadStarter = std::function<std::thread(std::function<void()>)>;

  /// CPUs this process may run on (its affinity mask; at least 1).
  static int available_threads();
  /// The largest thread count a pool accepts: kMaxThreadsPerCpu × available_threads().
  static int max_threads();

  /// A pool of `threads` threads (0: available_threads()). Throws gaac::Error when `threads` is
  /// negative or above max_threads(), or when a worker cannot be started.
  explicit ThreadPool(int threads = 0);
  /// The same, with `start` creating each worker (tests use it to make the system's refusal happen).
  ThreadPool(int threads, const ThreadStarter& start);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  /// Number of threads taking part in a loop.
  int size() const { return static_cast<int>(workers_.size()) + 1; }

  /// Calls body(begin, end) once per grain of [0, n) — [0, grain), [grain, 2·grain), ..., the last
  /// one shorter — each on whichever thread is free next, and returns when all are done. The first
  /// exception from a body is rethrown here (grains not yet started are then skipped).
  void parallel_for(int64_t n, int64_t grain, const std::function<void(int64_t, int64_t)>& body);

 private:
  void work();
  /// Runs grains of the current loop until none is left.
  void run_chunks();
  /// Tells the workers to finish and joins them.
  void stop_workers();

  std::vector<std::thread> workers_;
  std::mutex mutex_;
  std::condition_variable wake_, done_;
  const std::function<void(int64_t, int64_t)>* body_ = nullptr;
  int64_t n_ = 0, grain_ = 1;
  uint64_t generation_ = 0;
  std::atomic<int64_t> next_grain_{0};
  int pending_ = 0;
  bool stop_ = false;
  std::exception_ptr error_;
};

}  // namespace gaac::model
