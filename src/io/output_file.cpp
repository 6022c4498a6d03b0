#include "io/output_file.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>

#include "gaac/error.hpp"
#include "io/files.hpp"
#include "io/temporary_files.hpp"

namespace gaac::io {
namespace {

[[noreturn]] void fail(const std::string& path, const std::string& action, int err) {
  throw Error(ErrorCode::io, path + ": " + action + ": " + std::strerror(err));
}

[[noreturn]] void refuse(const std::string& path, const std::string& why) {
  throw Error(ErrorCode::io, path + ": " + why);
}

/// How an output is written.
enum class Way {
  create,          ///< a new regular file, through a temporary file
  replace,         ///< an existing regular file (`file`: its resolved path), through a temporary file
  through_stdout,  ///< the file or pipe that is standard output: descriptor 1
  in_place,        ///< an existing character device or FIFO, opened for writing
};

/// Where an output goes: how it is written, the file (resolved through links when replaced), and
/// what exists there now.
struct Destination {
  Way way;
  std::string file;
  struct stat existing {};
};

bool same_file(const struct stat& a, const struct stat& b) { return a.st_dev == b.st_dev && a.st_ino == b.st_ino; }

std::string directory_of(const std::string& path) {
  const auto slash = path.find_last_of('/');
  if (slash == std::string::npos) return ".";
  return slash == 0 ? "/" : path.substr(0, slash);
}

/// Refuses a file whose directory is missing or not writable (a temporary file goes there).
void check_directory(const std::string& path, const std::string& file) {
  const std::string dir = directory_of(file);
  struct stat st {};
  if (::stat(dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) refuse(path, "the directory " + dir + " does not exist");
  if (::access(dir.c_str(), W_OK | X_OK) != 0) fail(path, "cannot write in the directory " + dir, errno);
}

/// Refuses an output that is the same file as one of the inputs.
void check_not_an_input(const std::string& path, const struct stat& output, std::span<const std::string> inputs) {
  for (const std::string& input : inputs) {
    struct stat st {};
    if (input.empty() || ::stat(input.c_str(), &st) != 0 || !same_file(st, output)) continue;
    refuse(path, (input == path ? std::string("is also an input of this command")
                                : "is the same file as the input " + input + " (through a link)") +
                     "; gaac never writes over a file it reads, so choose another output");
  }
}

const char* kind_of(mode_t mode) {
  if (S_ISBLK(mode)) return "a block device";
  if (S_ISSOCK(mode)) return "a socket";
  return "neither a regular file, a character device nor a FIFO";
}

/// Where `path` would be written, or an error saying why it is refused (what check_output checks).
Destination resolve_output(const std::string& path, std::span<const std::string> inputs) {
  if (path.empty()) refuse("(empty output path)", "give the name of a file to write");
  check_path(path);
  struct stat link {};
  if (::lstat(path.c_str(), &link) != 0) {
    if (errno != ENOENT) fail(path, "cannot use as an output", errno);
    check_directory(path, path);
    return {Way::create, path};
  }
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) {
    if (errno == ENOENT) refuse(path, "is a symbolic link to a file that does not exist; give the file's own path");
    fail(path, "cannot use as an output", errno);
  }
  check_not_an_input(path, st, inputs);
  struct stat out {};
  if (::fstat(STDOUT_FILENO, &out) == 0 && same_file(out, st)) return {Way::through_stdout, path, st};
  if (S_ISCHR(st.st_mode) || S_ISFIFO(st.st_mode)) return {Way::in_place, path, st};
  if (S_ISDIR(st.st_mode)) refuse(path, "is a directory; give the name of a file to write");
  if (!S_ISREG(st.st_mode)) {
    refuse(path, std::string("is ") + kind_of(st.st_mode) +
                     "; gaac writes regular files, and character devices or FIFOs in place");
  }
  // Replace the file itself, so a symbolic link to it stays a link.
  const std::unique_ptr<char, decltype(&std::free)> real(::realpath(path.c_str(), nullptr), &std::free);
  if (!real) fail(path, "cannot resolve its symbolic links", errno);
  Destination destination{Way::replace, real.get(), st};
  check_directory(path, destination.file);
  return destination;
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

void write_parts(int fd, std::span<const std::span<const uint8_t>> parts, const std::string& path) {
  for (const auto part : parts) write_all(fd, part, path);
}

/// Writes through a temporary file renamed over `file` once complete.
void write_through_temporary(const Destination& destination, const std::string& path,
                             std::span<const std::span<const uint8_t>> parts, std::span<const std::string> inputs) {
  const bool replacing = destination.way == Way::replace;
  // A replacement starts private and takes the old file's bits; a new file gets 0666 less the umask.
  TemporaryFile temporary(destination.file, replacing ? 0600 : 0666);
  if (replacing) {
    if (destination.existing.st_uid != ::geteuid() || destination.existing.st_gid != ::getegid()) {
      (void)!::fchown(temporary.fd(), destination.existing.st_uid, destination.existing.st_gid);  // allowed only to some users
    }
    if (::fchmod(temporary.fd(), destination.existing.st_mode & 07777) != 0) fail(path, "cannot set the permissions", errno);
  }
  write_parts(temporary.fd(), parts, path);
  (void)resolve_output(path, inputs);  // again: the names may have changed while the data was computed
  temporary.commit(destination.file);
}

}  // namespace

void check_output(const std::string& path, std::span<const std::string> inputs) {
  const Destination destination = resolve_output(path, inputs);
  if (destination.way == Way::create || destination.way == Way::replace) {
    const TemporaryFile probe(destination.file, 0600);  // where a file cannot be created (/proc, a read-only mount)
  }
}

bool is_standard_output(const std::string& path) {
  struct stat st {}, out {};
  return ::stat(path.c_str(), &st) == 0 && ::fstat(STDOUT_FILENO, &out) == 0 && same_file(st, out);
}

void write_output(const std::string& path, std::span<const std::span<const uint8_t>> parts,
                  std::span<const std::string> inputs) {
  const Destination destination = resolve_output(path, inputs);
  switch (destination.way) {
    case Way::create:
    case Way::replace:
      write_through_temporary(destination, path, parts, inputs);
      return;
    case Way::through_stdout:
      if (std::fflush(stdout) != 0) fail(path, "cannot write", errno);
      write_parts(STDOUT_FILENO, parts, path);
      if (S_ISREG(destination.existing.st_mode) && ::fsync(STDOUT_FILENO) != 0) fail(path, "cannot flush to disk", errno);
      return;
    case Way::in_place: {
      Descriptor fd(::open(path.c_str(), O_WRONLY | O_NOCTTY | O_CLOEXEC));
      if (fd.get() < 0) fail(path, "cannot open for writing", errno);
      write_parts(fd.get(), parts, path);
      if (fd.close() != 0) fail(path, "cannot close", errno);
      return;
    }
  }
}

}  // namespace gaac::io
