// Size arithmetic that cannot wrap: every product or sum of sizes that untrusted arguments reach goes
// through these, and a result past 2^64 is a gaac::Error naming what was being computed.
#pragma once

#include <cstdint>
#include <string>

#include "gaac/error.hpp"

namespace gaac {

/// a × b; throws gaac::Error ("`what` overflows 64 bits") when the product does not fit.
inline uint64_t checked_mul(uint64_t a, uint64_t b, const char* what) {
  uint64_t r = 0;
  if (__builtin_mul_overflow(a, b, &r)) throw Error(std::string(what) + " overflows 64 bits: the arguments are too large");
  return r;
}

/// a + b; throws gaac::Error ("`what` overflows 64 bits") when the sum does not fit.
inline uint64_t checked_add(uint64_t a, uint64_t b, const char* what) {
  uint64_t r = 0;
  if (__builtin_add_overflow(a, b, &r)) throw Error(std::string(what) + " overflows 64 bits: the arguments are too large");
  return r;
}

}  // namespace gaac
