#include "gaac/error.hpp"

#include <string>

namespace gaac {
namespace {
std::string format_location(const SourceLocation& loc) {
  std::string file = loc.file;
  const auto slash = file.find_last_of('/');
  if (slash != std::string::npos) file = file.substr(slash + 1);
  return file + ":" + std::to_string(loc.line);
}

/// The message with each NUL byte written as \0: what() is a C string, which a NUL would end.
std::string without_nul(const std::string& message) {
  if (message.find('\0') == std::string::npos) return message;
  std::string out;
  for (const char c : message) {
    if (c == '\0') {
      out += "\\0";
    } else {
      out += c;
    }
  }
  return out;
}
}  // namespace

Error::Error(const std::string& message, SourceLocation loc)
    : std::runtime_error(without_nul(message)), where_(format_location(loc)) {}

Error::Error(ErrorCode code, const std::string& message, SourceLocation loc)
    : std::runtime_error(without_nul(message)), code_(code), where_(format_location(loc)) {}

Error::Error(ErrorCode code, const std::string& message, std::string where)
    : std::runtime_error(without_nul(message)), code_(code), where_(std::move(where)) {}

Error Error::with_context(const std::string& context) const {
  return Error(code_, context + ": " + what(), where_);
}

}  // namespace gaac
