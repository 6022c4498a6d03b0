// The one way gaac writes a file. A command names the files it reads; the writer never writes
// over any of them, never replaces what is not a regular file, replaces a regular file atomically
// (keeping its permissions), and never leaves a partial or temporary file behind.
#pragma once

#include <cstdint>
#include <span>
#include <string>

namespace gaac::io {

/// Throws gaac::Error (ErrorCode::io) naming `path` when write_output() would refuse it: it is the
/// same file (device and inode, through any symbolic or hard link) as one of `inputs`; it is a
/// directory, a block device, a socket or a symbolic link to nothing; or its directory does not
/// exist or no file can be created there (tried: a temporary file is created and removed at once).
/// Cheap: a command calls it before its work, so a refused output fails at once rather than after
/// minutes of computing; write_output() checks again.
void check_output(const std::string& path, std::span<const std::string> inputs = {});

/// True when `path` names the file or pipe that is this process's standard output (`/dev/stdout`,
/// or any other name of it).
bool is_standard_output(const std::string& path);

/// Writes `parts`, one after another, to `path`, refusing what check_output() refuses:
///  - the process's standard output (`/dev/stdout`, or any name of the file or pipe it is) is
///    written through descriptor 1, after what stdio has buffered, so data and messages keep
///    their order;
///  - an existing character device or FIFO (`/dev/null`, a named pipe) is written in place, never
///    replaced;
///  - a regular file, new or existing (also through symbolic links, which stay links), is written
///    to a temporary file beside it, flushed to disk and renamed over it, so no reader ever sees a
///    half-written file; a replaced file keeps its permission bits (and its owner, where the
///    system allows).
/// Throws gaac::Error naming `path` on any failure, after removing the temporary file.
void write_output(const std::string& path, std::span<const std::span<const uint8_t>> parts,
                  std::span<const std::string> inputs = {});

}  // namespace gaac::io
