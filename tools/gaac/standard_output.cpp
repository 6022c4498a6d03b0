#include "standard_output.hpp"

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <string>

#include "gaac/error.hpp"

namespace gaac::cli {
namespace {

[[noreturn]] void fail(int err) {
  throw Error(ErrorCode::io, std::string("cannot write the results to standard output") +
                                 (err != 0 ? std::string(": ") + std::strerror(err) : std::string()));
}

}  // namespace

void flush_stdout() {
  errno = 0;
  if (std::fflush(stdout) != 0 || std::ferror(stdout)) fail(errno);
}

void finish_stdout() {
  flush_stdout();
  errno = 0;
  if (std::fclose(stdout) != 0) fail(errno);
}

}  // namespace gaac::cli
