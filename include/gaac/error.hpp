// The one exception type of the C++ API, carrying where it was raised and what was being done.
#pragma once

#include "gaac/export.h"

#include <stdexcept>
#include <string>

namespace gaac {

/// Broad category of an Error, for callers that react differently (the C API maps it to a status).
enum class ErrorCode {
  invalid_input = 0,  ///< bad arguments or malformed data
  io = 1,             ///< a file could not be read or written
  out_of_space = 2,   ///< a cache's budget has no room for what was asked; the cache is as it was before
};

/// Where an Error was raised. Defaults to the caller's file and line (through compiler builtins, which
/// every supported compiler has, unlike std::source_location).
struct GAAC_API SourceLocation {
  constexpr SourceLocation(const char* file_name = __builtin_FILE(), unsigned line_number = __builtin_LINE())
      : file(file_name), line(line_number) {}
  const char* file;
  unsigned line;
};

/// Failure of a gaac operation: bad input, a malformed file, an I/O error. `what()` reads
/// "context: message" (a NUL byte in either written as \0, so that none ends it early) and `where()`
/// gives the source file and line that raised it.
class GAAC_API Error : public std::runtime_error {
 public:
  /// Builds an error; `loc` defaults to the caller's location.
  explicit Error(const std::string& message, SourceLocation loc = SourceLocation());
  /// Builds an error of a given category.
  Error(ErrorCode code, const std::string& message, SourceLocation loc = SourceLocation());

  /// Category of the failure.
  ErrorCode code() const noexcept { return code_; }

  /// "file:line" of the statement that raised the error.
  const std::string& where() const noexcept { return where_; }

  /// Returns a copy whose message is prefixed by `context` ("reading k.3: ...").
  Error with_context(const std::string& context) const;

 private:
  Error(ErrorCode code, const std::string& message, std::string where);
  ErrorCode code_ = ErrorCode::invalid_input;
  std::string where_;
};

}  // namespace gaac
