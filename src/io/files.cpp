#include "io/files.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <utility>

#include "gaac/error.hpp"

namespace gaac::io {
namespace {

[[noreturn]] void fail(const std::string& path, const std::string& action, int err) {
  throw Error(ErrorCode::io, path + ": " + action + ": " + std::strerror(err));
}

/// Writes all of `bytes`, resuming after partial writes and interruptions.
void write_all(int fd, std::span<const uint8_t> bytes, const std::string& path) {
  while (!bytes.empty()) {
    const ssize_t n = ::write(fd, bytes.data(), bytes.size());
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) fail(path, "cannot write", errno);
    bytes = bytes.subspan(static_cast<size_t>(n));
  }
}

/// A new temporary file beside `destination`; O_EXCL so it never clobbers anyone else's file.
int create_temporary(const std::string& destination, std::string& path) {
  static std::atomic<unsigned> counter{0};
  for (int attempt = 0; attempt < 100; ++attempt) {
    path = destination + ".tmp." + std::to_string(::getpid()) + "." + std::to_string(counter++);
    const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);  // umask decides the mode
    if (fd >= 0) return fd;
    if (errno != EEXIST) break;
  }
  fail(destination, "cannot create a temporary file beside it", errno);
}

/// Reads exactly `size` bytes from `fd`.
std::vector<uint8_t> read_exactly(int fd, size_t size, const std::string& path) {
  std::vector<uint8_t> bytes(size);
  size_t done = 0;
  while (done < size) {
    const ssize_t n = ::read(fd, bytes.data() + done, size - done);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) fail(path, "cannot read", errno);
    if (n == 0) throw Error(ErrorCode::io, path + ": file shrank while being read");
    done += static_cast<size_t>(n);
  }
  return bytes;
}

}  // namespace

FileBytes FileBytes::open(const std::string& path) {
  Descriptor fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (fd.get() < 0) fail(path, "cannot open", errno);
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0) fail(path, "cannot stat", errno);
  if (!S_ISREG(st.st_mode)) throw Error(ErrorCode::io, path + ": not a regular file");
  FileBytes file;
  const auto size = static_cast<size_t>(st.st_size);
  void* mapping = size == 0 ? MAP_FAILED : ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd.get(), 0);
  if (mapping != MAP_FAILED) {
    file.mapping_ = mapping;
    file.mapped_size_ = size;
  } else {
    file.owned_ = read_exactly(fd.get(), size, path);  // e.g. a file system without mmap
  }
  return file;
}

FileBytes FileBytes::copy_of(std::span<const uint8_t> image) {
  FileBytes file;
  file.owned_.assign(image.begin(), image.end());
  return file;
}

FileBytes::FileBytes(FileBytes&& other) noexcept
    : mapping_(std::exchange(other.mapping_, nullptr)),
      mapped_size_(std::exchange(other.mapped_size_, 0)),
      owned_(std::move(other.owned_)) {}

FileBytes& FileBytes::operator=(FileBytes&& other) noexcept {
  if (this != &other) {
    if (mapping_ != nullptr) ::munmap(mapping_, mapped_size_);
    mapping_ = std::exchange(other.mapping_, nullptr);
    mapped_size_ = std::exchange(other.mapped_size_, 0);
    owned_ = std::move(other.owned_);
  }
  return *this;
}

FileBytes::~FileBytes() {
  if (mapping_ != nullptr) ::munmap(mapping_, mapped_size_);
}

std::span<const uint8_t> FileBytes::bytes() const {
  if (mapping_ != nullptr) return {static_cast<const uint8_t*>(mapping_), mapped_size_};
  return owned_;
}

Descriptor::~Descriptor() {
  if (fd_ >= 0) ::close(fd_);
}

int Descriptor::close() {
  const int rc = ::close(fd_);
  fd_ = -1;
  return rc;
}

std::vector<uint8_t> read_file(const std::string& path) {
  Descriptor fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (fd.get() < 0) fail(path, "cannot open", errno);
  std::vector<uint8_t> bytes;
  uint8_t buffer[1 << 16];
  for (;;) {
    const ssize_t n = ::read(fd.get(), buffer, sizeof buffer);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) fail(path, "cannot read", errno);
    if (n == 0) break;
    bytes.insert(bytes.end(), buffer, buffer + n);
  }
  return bytes;
}

void write_file_atomic(const std::string& path, std::span<const std::span<const uint8_t>> parts) {
  std::string temporary;
  Descriptor fd(create_temporary(path, temporary));
  try {
    for (const auto part : parts) write_all(fd.get(), part, path);
    if (::fsync(fd.get()) != 0) fail(path, "cannot flush", errno);
    if (fd.close() != 0) fail(path, "cannot close", errno);
    if (::rename(temporary.c_str(), path.c_str()) != 0) fail(path, "cannot rename the temporary file into place", errno);
  } catch (...) {
    ::unlink(temporary.c_str());
    throw;
  }
}

}  // namespace gaac::io
