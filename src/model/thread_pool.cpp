#include "model/thread_pool.hpp"

#include <sched.h>

#include <algorithm>
#include <string>

#include "gaac/error.hpp"

namespace gaac::model {

int ThreadPool::available_threads() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (::sched_getaffinity(0, sizeof set, &set) == 0 && CPU_COUNT(&set) > 0) return CPU_COUNT(&set);
  return static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
}

int ThreadPool::max_threads() { return kMaxThreadsPerCpu * available_threads(); }

ThreadPool::ThreadPool(int threads)
    : ThreadPool(threads, [](std::function<void()> run) { return std::thread(std::move(run)); }) {}

ThreadPool::ThreadPool(int threads, const ThreadStarter& start) {
  if (threads < 0) throw Error("thread count " + std::to_string(threads) + " is negative (0 means one per CPU)");
  if (threads > max_threads()) {
    throw Error("thread count " + std::to_string(threads) + " is more than the " + std::to_string(max_threads()) +
                " this machine allows (" + std::to_string(kMaxThreadsPerCpu) + " per available CPU, " +
                std::to_string(available_threads()) + " CPUs)");
  }
  if (threads == 0) threads = available_threads();
  workers_.reserve(static_cast<size_t>(threads - 1));
  for (int i = 1; i < threads; ++i) {
    try {
      workers_.push_back(start([this] { work(); }));
    } catch (const std::exception& e) {
      // Without this the members would be destroyed under the running workers (a condition
      // variable with waiters: a hang in its destructor).
      stop_workers();
      throw Error("cannot start worker thread " + std::to_string(i) + " of " + std::to_string(threads - 1) + ": " +
                  e.what());
    }
  }
}

ThreadPool::~ThreadPool() { stop_workers(); }

void ThreadPool::stop_workers() {
  {
    std::lock_guard lock(mutex_);
    stop_ = true;
  }
  wake_.notify_all();
  for (auto& t : workers_) {
    if (t.joinable()) t.join();
  }
  workers_.clear();
}

void ThreadPool::run_chunks() {
  // Grains are handed out one at a time to whichever thread is free: uneven grains (causal attention,
  // a thread the system preempts) balance themselves.
  const int64_t grains = (n_ + grain_ - 1) / grain_;
  for (;;) {
    const int64_t g = next_grain_.fetch_add(1, std::memory_order_relaxed);
    if (g >= grains) return;
    try {
      (*body_)(g * grain_, std::min(n_, (g + 1) * grain_));
    } catch (...) {
      next_grain_.store(grains, std::memory_order_relaxed);  // the others stop at their next grain
      std::lock_guard lock(mutex_);
      if (!error_) error_ = std::current_exception();
      return;
    }
  }
}

void ThreadPool::work() {
  uint64_t seen = 0;
  for (;;) {
    {
      std::unique_lock lock(mutex_);
      wake_.wait(lock, [&] { return stop_ || generation_ != seen; });
      if (stop_) return;
      seen = generation_;
    }
    run_chunks();
    std::lock_guard lock(mutex_);
    if (--pending_ == 0) done_.notify_one();
  }
}

void ThreadPool::parallel_for(int64_t n, int64_t grain, const std::function<void(int64_t, int64_t)>& body) {
  if (n <= 0) return;
  if (workers_.empty() || n <= grain) {
    body(0, n);
    return;
  }
  {
    std::lock_guard lock(mutex_);
    body_ = &body;
    n_ = n;
    grain_ = std::max<int64_t>(1, grain);
    pending_ = static_cast<int>(workers_.size());
    error_ = nullptr;
    next_grain_.store(0, std::memory_order_relaxed);
    ++generation_;
  }
  wake_.notify_all();
  run_chunks();
  std::unique_lock lock(mutex_);
  done_.wait(lock, [&] { return pending_ == 0; });
  body_ = nullptr;
  if (error_) std::rethrow_exception(error_);
}

}  // namespace gaac::model
