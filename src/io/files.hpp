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

/// The bytes of a whole file: mapped read-only (private) when the system allows, read into memory
/// otherwise; or a copy of an image already in memory. Move-only; the bytes live as long as it does.
class FileBytes {
 public:
  /// Opens a regular file. Throws gaac::Error (ErrorCode::io) naming the path and the reason.
  static FileBytes open(const std::string& path);
  /// Holds a copy of `image`.
  static FileBytes copy_of(std::span<const uint8_t> image);

  FileBytes() = default;
  FileBytes(FileBytes&& other) noexcept;
  FileBytes& operator=(FileBytes&& other) noexcept;
  FileBytes(const FileBytes&) = delete;
  FileBytes& operator=(const FileBytes&) = delete;
  ~FileBytes();

  /// The file's bytes.
  std::span<const uint8_t> bytes() const;

 private:
  void* mapping_ = nullptr;
  size_t mapped_size_ = 0;
  std::vector<uint8_t> owned_;
};

/// Reads a whole file. Throws gaac::Error naming the path and the system's reason.
std::vector<uint8_t> read_file(const std::string& path);

/// Writes `parts` one after another to `path` through a temporary file in the same directory that is
/// renamed into place, so readers never see a half-written file.
void write_file_atomic(const std::string& path, std::span<const std::span<const uint8_t>> parts);

}  // namespace gaac::io
