// Whole-file reads and atomic whole-file writes with gaac::Error on failure.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace gaac::io {

/// A POSIX file descriptor closed on scope exit (negative: none).
class Descriptor {
 public:
  explicit Descriptor(int fd) : fd_(fd) {}
  Descriptor(const Descriptor&) = delete;
  Descriptor& operator=(const Descriptor&) = delete;
  ~Descriptor();
  /// The descriptor.
  int get() const { return fd_; }
  /// Closes now, returning close()'s result.
  int close();

 private:
  int fd_;
};

/// Reads a whole file. Throws gaac::Error naming the path and the system's reason.
std::vector<uint8_t> read_file(const std::string& path);

/// Writes `parts` one after another to `path` through a temporary file in the same directory that is
/// renamed into place, so readers never see a half-written file.
void write_file_atomic(const std::string& path, std::span<const std::span<const uint8_t>> parts);

}  // namespace gaac::io
