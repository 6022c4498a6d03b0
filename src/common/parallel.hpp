// Work split over a few threads started for it, in phases: every thread finishes a phase before any
// starts the next, and a step between phases runs on one thread. For coding one large object (a KV
// chunk) on a bounded number of threads, with no pool shared between callers.
#pragma once

#include <cstddef>
#include <functional>

namespace gaac {

/// Runs `phases` phases on `threads` threads (the caller's among them; 1 runs everything inline):
/// work(phase, thread) on every thread, then between(phase) once, then the next phase. The first
/// exception thrown by either skips the work left and is rethrown here once every thread is done.
void run_phases(int threads, int phases, const std::function<void(int phase, int thread)>& work,
                const std::function<void(int phase)>& between);

/// The part of [0, n) thread `thread` of `threads` takes: [n·thread/threads, n·(thread+1)/threads).
constexpr size_t part_begin(size_t n, int thread, int threads) {
  return n / static_cast<size_t>(threads) * static_cast<size_t>(thread) +
         n % static_cast<size_t>(threads) * static_cast<size_t>(thread) / static_cast<size_t>(threads);
}

}  // namespace gaac
