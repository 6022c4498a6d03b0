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
}  // namespace

Error::Error(const std::string& message, SourceLocation loc)
    : std::runtime_error(message), where_(format_location(loc)) {}

Error::Error(ErrorCode code, const std::string& message, SourceLocation loc)
    : std::runtime_error(message), code_(code), where_(format_location(loc)) {}

Error::Error(ErrorCode code, const std::string& message, std::string where)
    : std::runtime_error(message), code_(code), where_(std::move(where)) {}

Error Error::with_context(const std::string& context) const {
  return Error(code_, context + ": " + what(), where_);
}

}  // namespace gaac
