#include "common/parallel.hpp"

#include <atomic>
#include <barrier>
#include <exception>
#include <mutex>
#include <thread>
#include <vector>

namespace gaac {

void run_phases(int threads, int phases, const std::function<void(int, int)>& work, const std::function<void(int)>& between) {
  std::exception_ptr error;
  std::mutex error_mutex;
  std::atomic<bool> failed{false};
  const auto keep = [&](std::exception_ptr e) {
    const std::lock_guard lock(error_mutex);
    if (!error) error = std::move(e);
    failed = true;
  };
  int phase = 0;
  const auto step = [&]() noexcept {
    if (!failed) {
      try {
        between(phase);
      } catch (...) {
        keep(std::current_exception());
      }
    }
    ++phase;
  };
  if (threads <= 1) {
    for (int p = 0; p < phases && !failed; ++p) {
      try {
        work(p, 0);
      } catch (...) {
        keep(std::current_exception());
      }
      step();
    }
  } else {
    std::barrier sync(threads, step);
    const auto run = [&](int thread) {
      for (int p = 0; p < phases; ++p) {
        if (!failed) {
          try {
            work(p, thread);
          } catch (...) {
            keep(std::current_exception());
          }
        }
        sync.arrive_and_wait();
      }
    };
    std::vector<std::thread> helpers;
    helpers.reserve(static_cast<size_t>(threads - 1));
    try {
      for (int t = 1; t < threads; ++t) helpers.emplace_back(run, t);
    } catch (...) {
      // Threads that could not start never arrive: take them out of every barrier, and fail so the
      // started ones do no work.
      keep(std::current_exception());
      const int missing = threads - 1 - static_cast<int>(helpers.size());
      for (int m = 0; m < missing; ++m) (void)sync.arrive_and_drop();
    }
    run(0);
    for (std::thread& t : helpers) t.join();
  }
  if (error) std::rethrow_exception(error);
}

}  // namespace gaac
