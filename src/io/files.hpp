// Whole-file reads and atomic whole-file writes with gaac::Error on failure.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace gaac::io {

/// Reads a whole file. Throws gaac::Error naming the path and the system's reason.
std::vector<uint8_t> read_file(const std::string& path);

/// Writes `parts` one after another to `path` through a temporary file in the same directory that is
/// renamed into place, so readers never see a half-written file.
void write_file_atomic(const std::string& path, std::span<const std::span<const uint8_t>> parts);

}  // namespace gaac::io
