#include "io/files.hpp"

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <memory>
#include <unistd.h>

#include "gaac/error.hpp"

namespace gaac::io {
namespace {

std::string reason() { return std::strerror(errno); }

struct FileCloser {
  void operator()(std::FILE* f) const {
    if (f) std::fclose(f);
  }
};
using File = std::unique_ptr<std::FILE, FileCloser>;

}  // namespace

std::vector<uint8_t> read_file(const std::string& path) {
  File f(std::fopen(path.c_str(), "rb"));
  if (!f) throw Error(ErrorCode::io, "cannot open " + path + ": " + reason());
  if (std::fseek(f.get(), 0, SEEK_END) != 0) throw Error(ErrorCode::io, "cannot seek in " + path + ": " + reason());
  const long size = std::ftell(f.get());
  if (size < 0) throw Error(ErrorCode::io, "cannot size " + path + ": " + reason());
  std::rewind(f.get());
  std::vector<uint8_t> bytes(static_cast<size_t>(size));
  if (!bytes.empty() && std::fread(bytes.data(), 1, bytes.size(), f.get()) != bytes.size()) {
    throw Error(ErrorCode::io, "cannot read " + path + ": " + (std::ferror(f.get()) ? reason() : "file shrank while reading"));
  }
  return bytes;
}

void write_file_atomic(const std::string& path, std::span<const std::span<const uint8_t>> parts) {
  const std::string temporary = path + ".tmp." + std::to_string(::getpid());
  {
    File f(std::fopen(temporary.c_str(), "wb"));
    if (!f) throw Error(ErrorCode::io, "cannot create " + temporary + ": " + reason());
    for (const auto part : parts) {
      if (!part.empty() && std::fwrite(part.data(), 1, part.size(), f.get()) != part.size()) {
        const std::string why = reason();
        std::remove(temporary.c_str());
        throw Error(ErrorCode::io, "cannot write " + temporary + ": " + why);
      }
    }
    if (std::fflush(f.get()) != 0 || ::fsync(::fileno(f.get())) != 0) {
      const std::string why = reason();
      std::remove(temporary.c_str());
      throw Error(ErrorCode::io, "cannot write " + temporary + ": " + why);
    }
  }
  if (std::rename(temporary.c_str(), path.c_str()) != 0) {
    const std::string why = reason();
    std::remove(temporary.c_str());
    throw Error(ErrorCode::io, "cannot rename " + temporary + " to " + path + ": " + why);
  }
}

}  // namespace gaac::io
