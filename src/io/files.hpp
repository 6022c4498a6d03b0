// Whole-file reads with gaac::Error on failure. Inputs are read into memory, never mapped: a file
// truncated or rewritten while gaac uses it then gives an error, not a SIGBUS.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "io/output_file.hpp"

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

/// The bytes of a whole file or stream, read into memory (so nothing that happens to the file
/// afterwards can affect them), or a copy of an image already in memory. Move-only.
class FileBytes {
 public:
  /// Reads `path` as read_file() does.
  static FileBytes open(const std::string& path);
  /// Holds a copy of `image`.
  static FileBytes copy_of(std::span<const uint8_t> image);

  /// The file's bytes.
  std::span<const uint8_t> bytes() const { return bytes_; }

 private:
  std::vector<uint8_t> bytes_;
};

/// Throws gaac::Error (ErrorCode::invalid_input) unless `path` can name a file: not empty, and no
/// NUL byte (which the system would take as its end, naming another file).
void check_path(const std::string& path);

/// What a file must start with: `magic`, the first bytes of the format named by `what`.
struct ExpectedStart {
  std::span<const uint8_t> magic;
  std::string what;  ///< "a .gaac snapshot"
};

/// Reads a whole regular file, or a stream (a pipe, a FIFO, /dev/stdin) until its end. Throws
/// gaac::Error (ErrorCode::io) naming the path and the reason: it cannot be opened or read, it is a
/// directory, block device or socket, a regular file changed size or was modified while being
/// read, or it is larger than this machine's memory. With `start`, a stream that does not begin with
/// its magic is refused as soon as those bytes are read (/dev/zero is not read on); a regular file,
/// read in time linear in its size, is left to its parser, which names what it is instead.
std::vector<uint8_t> read_file(const std::string& path, const ExpectedStart& start = {});

/// write_output() with no inputs to protect.
inline void write_file_atomic(const std::string& path, std::span<const std::span<const uint8_t>> parts) {
  write_output(path, parts);
}

}  // namespace gaac::io
