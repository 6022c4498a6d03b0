// The thread pool's contract on its size: 0 means one thread per CPU, counts beyond the machine's
// bound or below zero are refused, and a worker the system will not start is an error, raised after
// the workers already started are joined (never a hang).
#include "model/thread_pool.hpp"

#include <gtest/gtest.h>

#include <atomic>
#include <cerrno>
#include <string>
#include <system_error>

#include "gaac/error.hpp"

namespace gaac::model {
namespace {

/// The message of the gaac::Error that constructing the pool throws ("" and a failure if none).
template <class... Args>
std::string construction_error(Args&&... args) {
  try {
    ThreadPool pool(std::forward<Args>(args)...);
    ADD_FAILURE() << "a pool of " << pool.size() << " threads was created";
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(ThreadPoolContract, ZeroMeansOneThreadPerAvailableCpu) {
  EXPECT_GE(ThreadPool::available_threads(), 1);
  EXPECT_EQ(ThreadPool(0).size(), ThreadPool::available_threads());
  EXPECT_EQ(ThreadPool(1).size(), 1);
  EXPECT_EQ(ThreadPool::max_threads(), ThreadPool::kMaxThreadsPerCpu * ThreadPool::available_threads());
}

TEST(ThreadPoolContract, RefusesNegativeCountsAndCountsBeyondTheMachine) {
  EXPECT_NE(construction_error(-1).find("thread count -1 is negative"), std::string::npos);
  EXPECT_NE(construction_error(-40000).find("negative"), std::string::npos);
  const std::string message = construction_error(ThreadPool::max_threads() + 1);
  EXPECT_NE(message.find("more than the " + std::to_string(ThreadPool::max_threads())), std::string::npos) << message;
  EXPECT_NE(construction_error(40000).find("this machine allows"), std::string::npos);
}

TEST(ThreadPoolContract, AWorkerThatCannotStartIsAnErrorAndTheOthersAreJoined) {
  std::atomic<int> started{0}, running{0};
  // Starts two real workers, then fails as std::thread does when the system has no thread to give.
  const ThreadPool::ThreadStarter start = [&](std::function<void()> work) {
    if (started.load() == 2) throw std::system_error(EAGAIN, std::generic_category(), "pthread_create");
    ++started;
    return std::thread([&running, work = std::move(work)] {
      ++running;
      work();
      --running;
    });
  };
  const std::string message = construction_error(4, start);
  EXPECT_NE(message.find("cannot start worker thread 3 of 3"), std::string::npos) << message;
  EXPECT_NE(message.find("Resource temporarily unavailable"), std::string::npos) << message;
  EXPECT_EQ(started.load(), 2);
  EXPECT_EQ(running.load(), 0);  // both stopped and joined before the constructor threw
}

TEST(ThreadPoolContract, APoolBuiltThroughAStarterWorks) {
  std::atomic<int> started{0};
  ThreadPool pool(3, [&](std::function<void()> work) {
    ++started;
    return std::thread(std::move(work));
  });
  EXPECT_EQ(started.load(), 2);
  std::atomic<int64_t> sum{0};
  pool.parallel_for(1000, 10, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) sum += i;
  });
  EXPECT_EQ(sum.load(), 999 * 1000 / 2);
}

}  // namespace
}  // namespace gaac::model
