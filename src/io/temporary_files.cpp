#include "io/temporary_files.hpp"

#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>

#include "gaac/error.hpp"

namespace gaac::io {
namespace {

/// The live temporary files, in storage a signal handler may read: fixed-size slots, each claimed
/// by one TemporaryFile. A path is copied in before `live` is set; `live` is set before the file
/// is created and cleared only after it is renamed or removed, so the handler finds every
/// temporary file (and at worst unlinks a name that no longer exists). A file that finds no free
/// slot (or has a longer path) is still removed on error, only not on a signal.
struct Slot {
  std::atomic<bool> claimed{false};
  std::atomic<bool> live{false};
  char path[PATH_MAX];
};
constexpr int kSlots = 16;
Slot g_slots[kSlots];

constexpr int kSignals[] = {SIGINT, SIGTERM, SIGHUP};

int claim_slot(const std::string& path) {
  if (path.size() >= PATH_MAX) return -1;
  for (int i = 0; i < kSlots; ++i) {
    bool expected = false;
    if (g_slots[i].claimed.compare_exchange_strong(expected, true)) {
      std::memcpy(g_slots[i].path, path.c_str(), path.size() + 1);
      g_slots[i].live.store(true, std::memory_order_release);
      return i;
    }
  }
  return -1;
}

void release_slot(int slot) {
  if (slot < 0) return;
  g_slots[slot].live.store(false, std::memory_order_release);
  g_slots[slot].claimed.store(false, std::memory_order_release);
}

extern "C" void remove_temporaries_and_reraise(int sig) {
  const int saved_errno = errno;
  for (Slot& slot : g_slots) {
    if (slot.live.load(std::memory_order_acquire)) ::unlink(slot.path);
  }
  errno = saved_errno;
  // SA_RESETHAND restored the default action and the signal is blocked while this handler runs,
  // so the raised signal ends the process as soon as the handler returns.
  ::raise(sig);
}

}  // namespace

TemporaryFile::TemporaryFile(const std::string& destination, mode_t mode) {
  static std::atomic<unsigned> counter{0};
  // Each name is registered before the file is created and unregistered only after it is renamed
  // or removed, so a signal at any moment finds every temporary file that exists. (Should a stale
  // file of that name exist, it is left to its owner: O_EXCL fails and the next name is tried.)
  int err = 0;
  for (int attempt = 0; attempt < 100; ++attempt) {
    path_ = destination + ".tmp." + std::to_string(::getpid()) + "." + std::to_string(counter++);
    slot_ = claim_slot(path_);
    fd_ = ::open(path_.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOCTTY, mode);
    if (fd_ >= 0) return;
    err = errno;
    release_slot(slot_);
    slot_ = -1;
    if (err != EEXIST) break;
  }
  throw Error(ErrorCode::io, destination + ": cannot create a temporary file beside it: " + std::strerror(err));
}

TemporaryFile::~TemporaryFile() {
  if (!committed_) {
    if (fd_ >= 0) ::close(fd_);
    ::unlink(path_.c_str());
  }
  release_slot(slot_);
}

void TemporaryFile::commit(const std::string& destination) {
  const auto fail = [&](const char* action) {
    throw Error(ErrorCode::io, destination + ": " + action + ": " + std::strerror(errno));
  };
  if (::fsync(fd_) != 0) fail("cannot flush to disk");
  const int fd = fd_;
  fd_ = -1;
  if (::close(fd) != 0) fail("cannot close");
  if (::rename(path_.c_str(), destination.c_str()) != 0) fail("cannot rename the temporary file into place");
  committed_ = true;
  release_slot(slot_);  // only now: until the rename, a signal must still find the file
  slot_ = -1;
}

void remove_temporaries_on_signals() {
  for (const int sig : kSignals) {
    struct sigaction current {};
    if (::sigaction(sig, nullptr, &current) != 0) continue;
    const bool is_default = (current.sa_flags & SA_SIGINFO) == 0 && current.sa_handler == SIG_DFL;
    if (!is_default) continue;  // ignored (nohup) or the program's own handler: not ours to replace
    struct sigaction action {};
    action.sa_handler = remove_temporaries_and_reraise;
    sigemptyset(&action.sa_mask);
    for (const int other : kSignals) sigaddset(&action.sa_mask, other);
    action.sa_flags = SA_RESETHAND;
    ::sigaction(sig, &action, nullptr);
  }
}

}  // namespace gaac::io
