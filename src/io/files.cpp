#include "io/files.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <algorithm>
#include <cstring>
#include <new>

#include "gaac/error.hpp"

namespace gaac::io {
namespace {

[[noreturn]] void fail(const std::string& path, const std::string& action, int err) {
  throw Error(ErrorCode::io, path + ": " + action + ": " + std::strerror(err));
}

/// "a directory", "a block device", ... for what gaac does not read.
const char* kind_of(mode_t mode) {
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISBLK(mode)) return "a block device";
  if (S_ISSOCK(mode)) return "a socket";
  return "neither a regular file nor a stream";
}

/// True when two fstat results describe the same, unmodified file.
bool unchanged(const struct stat& a, const struct stat& b) {
  return a.st_dev == b.st_dev && a.st_ino == b.st_ino && a.st_size == b.st_size &&
         a.st_mtim.tv_sec == b.st_mtim.tv_sec && a.st_mtim.tv_nsec == b.st_mtim.tv_nsec;
}

/// This machine's memory in bytes (0 when unknown).
uint64_t machine_memory() {
  const long pages = ::sysconf(_SC_PHYS_PAGES), page = ::sysconf(_SC_PAGE_SIZE);
  return pages > 0 && page > 0 ? static_cast<uint64_t>(pages) * static_cast<uint64_t>(page) : 0;
}

/// Refuses `bytes`, the start of `path`, unless they begin as `start` says.
void check_start(std::span<const uint8_t> bytes, const ExpectedStart& start, const std::string& path) {
  if (start.magic.empty()) return;
  const size_t n = std::min(bytes.size(), start.magic.size());
  if (bytes.size() < start.magic.size() || !std::equal(start.magic.begin(), start.magic.end(), bytes.begin())) {
    throw Error(ErrorCode::io, path + ": not " + start.what + " (its first " + std::to_string(n) + " bytes are not " + start.what +
                                   "'s)");
  }
}

/// Reads all `st.st_size` bytes of the regular file open as `fd`, and fails if the file changes
/// meanwhile (another size, or a new modification time), so a half-rewritten file is never parsed.
std::vector<uint8_t> read_regular(int fd, const struct stat& st, const std::string& path) {
  const auto size = static_cast<size_t>(st.st_size);
  const uint64_t memory = machine_memory();
  if (memory > 0 && size > memory) {
    throw Error(ErrorCode::io, path + ": is " + std::to_string(size) + " bytes, more than this machine's " + std::to_string(memory) +
                                   " bytes of memory, and inputs are read into memory");
  }
  std::vector<uint8_t> bytes;
  try {
    bytes.resize(size);
  } catch (const std::bad_alloc&) {
    throw Error(ErrorCode::io, path + ": not enough memory to read its " + std::to_string(size) + " bytes");
  }
  size_t done = 0;
  while (done < size) {
    const ssize_t n = ::pread(fd, bytes.data() + done, size - done, static_cast<off_t>(done));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) fail(path, "cannot read", errno);
    if (n == 0) {
      throw Error(ErrorCode::io, path + ": the file shrank from " + std::to_string(size) + " to " + std::to_string(done) +
                                     " bytes while being read; read it again once nothing is writing to it");
    }
    done += static_cast<size_t>(n);
  }
  uint8_t probe = 0;
  ssize_t extra = 0;
  do {
    extra = ::pread(fd, &probe, 1, static_cast<off_t>(size));
  } while (extra < 0 && errno == EINTR);
  struct stat after {};
  if (::fstat(fd, &after) != 0) fail(path, "cannot stat", errno);
  if (extra > 0 || !unchanged(st, after)) {
    throw Error(ErrorCode::io, path + ": the file changed while being read; read it again once nothing is writing to it");
  }
  return bytes;
}

/// Reads a pipe or another stream until its end (it cannot change under the reader: what was read
/// is what the writer wrote).
std::vector<uint8_t> read_stream(int fd, const std::string& path, const ExpectedStart& start) {
  std::vector<uint8_t> bytes;
  uint8_t buffer[1 << 16];
  const uint64_t memory = machine_memory();
  bool started = start.magic.empty();
  for (;;) {
    const ssize_t n = ::read(fd, buffer, sizeof buffer);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) fail(path, "cannot read", errno);
    if (n == 0) break;
    if (memory > 0 && bytes.size() + static_cast<size_t>(n) > memory) {
      throw Error(ErrorCode::io, path + ": holds more than this machine's " + std::to_string(memory) +
                                     " bytes of memory, and inputs are read into memory");
    }
    try {
      bytes.insert(bytes.end(), buffer, buffer + n);
    } catch (const std::bad_alloc&) {
      throw Error(ErrorCode::io, path + ": not enough memory to read more than its first " +
                                     std::to_string(bytes.size()) + " bytes");
    }
    if (!started && bytes.size() >= start.magic.size()) {
      check_start(bytes, start, path);
      started = true;
    }
  }
  if (!started) check_start(bytes, start, path);
  return bytes;
}

}  // namespace

FileBytes FileBytes::open(const std::string& path) {
  FileBytes file;
  file.bytes_ = read_file(path);
  return file;
}

FileBytes FileBytes::copy_of(std::span<const uint8_t> image) {
  FileBytes file;
  file.bytes_.assign(image.begin(), image.end());
  return file;
}

Descriptor::~Descriptor() {
  if (fd_ >= 0) ::close(fd_);
}

int Descriptor::close() {
  const int rc = ::close(fd_);
  fd_ = -1;
  return rc;
}

void check_path(const std::string& path) {
  if (path.empty()) throw Error("an empty path names no file");
  const size_t nul = path.find('\0');
  if (nul != std::string::npos) {
    throw Error("the path '" + path + "' holds a NUL byte, which no file name can: it would name '" + path.substr(0, nul) + "'");
  }
}

std::vector<uint8_t> read_file(const std::string& path, const ExpectedStart& start) {
  check_path(path);
  Descriptor fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOCTTY));
  if (fd.get() < 0) fail(path, "cannot open", errno);
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0) fail(path, "cannot stat", errno);
  if (S_ISREG(st.st_mode)) return read_regular(fd.get(), st, path);
  if (S_ISFIFO(st.st_mode) || S_ISCHR(st.st_mode)) return read_stream(fd.get(), path, start);
  throw Error(ErrorCode::io, path + ": is " + kind_of(st.st_mode) + "; gaac reads regular files and streams (pipes)");
}

}  // namespace gaac::io
