// Temporary files that never outlive the write they serve: removed when the write fails or is
// abandoned, and (once remove_temporaries_on_signals() has run) when SIGINT, SIGTERM or SIGHUP ends
// the process in the middle of it.
#pragma once

#include <sys/types.h>

#include <string>

namespace gaac::io {

/// A new file `<destination>.tmp.<pid>.<n>` beside `destination`, open for writing, created with
/// O_EXCL so it never touches anyone else's file. Until commit() renames it over its destination it
/// is registered for removal by the signal handlers; the destructor removes it when not committed.
class TemporaryFile {
 public:
  /// Creates the file with permission bits `mode` (before the umask). Throws gaac::Error naming
  /// `destination` when no temporary file can be created beside it.
  TemporaryFile(const std::string& destination, mode_t mode);
  ~TemporaryFile();
  TemporaryFile(const TemporaryFile&) = delete;
  TemporaryFile& operator=(const TemporaryFile&) = delete;

  /// The open descriptor (valid until commit()).
  int fd() const { return fd_; }
  /// The temporary file's path.
  const std::string& path() const { return path_; }

  /// Flushes the file to disk, closes it and renames it to `destination`. Throws gaac::Error naming
  /// `destination` on failure (the destructor then removes the temporary file).
  void commit(const std::string& destination);

 private:
  std::string path_;
  int fd_ = -1;
  int slot_ = -1;  ///< index in the signal handlers' list, -1 when not registered
  bool committed_ = false;
};

/// Installs handlers for SIGINT, SIGTERM and SIGHUP that remove every live TemporaryFile (with
/// async-signal-safe calls only) and then end the process by the same signal, so the exit status
/// still says what happened. A signal that is ignored or already handled by the program is left
/// alone. Idempotent; a program calls it once, early (gaac's main does).
void remove_temporaries_on_signals();

}  // namespace gaac::io
