// Argument checking and backend selection for the public tile codec entry points.
#include <algorithm>
#include <string>

#include "gaac/error.hpp"
#include "kernels.hpp"

namespace gaac {
namespace {

bool cpu_has_avx2_and_bmi2() {
#if defined(__x86_64__) || defined(_M_X64)
  return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("bmi2");
#else
  return false;
#endif
}

Backend resolve(Backend backend) {
  if (backend == Backend::automatic) return best_backend();
  if (!backend_available(backend)) throw Error(std::string("backend not available on this machine: ") + to_string(backend));
  return backend;
}

void check_arguments(TileShape shape, const TileBases& bases, size_t escape_capacity, size_t slot_size) {
  if (!shape.valid()) throw Error("tile width must be 64 or 128 channels, got " + std::to_string(shape.channels));
  if (escape_capacity % kSlotAlignment != 0 || escape_capacity > shape.max_slot_capacity()) {
    throw Error("escape capacity " + std::to_string(escape_capacity) + " is not a multiple of 16 in [0, " +
                std::to_string(shape.max_slot_capacity()) + "]");
  }
  if (slot_size < shape.slot_bytes(escape_capacity)) {
    throw Error("slot of " + std::to_string(slot_size) + " bytes is smaller than " +
                std::to_string(shape.slot_bytes(escape_capacity)));
  }
  if (!validate_bases(shape, bases)) throw Error("exponent bases missing or outside their valid range");
}

}  // namespace

bool validate_bases(TileShape shape, const TileBases& bases) {
  const auto n = static_cast<size_t>(shape.channels);
  if (bases.b3.size() < n || bases.b4.size() < n) return false;
  // A max-reduction without early exit: the compiler vectorises it, and it runs on every tile call.
  uint8_t high3 = 0, high4 = 0;
  for (size_t c = 0; c < n; ++c) {
    high3 = std::max(high3, bases.b3[c]);
    high4 = std::max(high4, bases.b4[c]);
  }
  return high3 <= kMaxBase3 && high4 <= kMaxBase4;
}

const char* to_string(DecodeStatus status) {
  switch (status) {
    case DecodeStatus::ok: return "ok";
    case DecodeStatus::invalid_tag: return "invalid mode tag 3";
    case DecodeStatus::escape_overrun: return "mode tags need more escape bytes than the slot holds";
    case DecodeStatus::nonzero_padding: return "unused escape-slot bytes are not zero";
  }
  return "unknown decode status";
}

const char* to_string(Backend backend) {
  switch (backend) {
    case Backend::automatic: return "automatic";
    case Backend::scalar: return "scalar";
    case Backend::avx2: return "avx2";
  }
  return "unknown";
}

bool backend_available(Backend backend) {
  switch (backend) {
    case Backend::automatic:
    case Backend::scalar: return true;
    case Backend::avx2: return avx2::compiled() && cpu_has_avx2_and_bmi2();
  }
  return false;
}

Backend best_backend() {
  static const Backend best = backend_available(Backend::avx2) ? Backend::avx2 : Backend::scalar;
  return best;
}

TileEncoding encode_tile(TileShape shape, const uint16_t* src, size_t row_stride, const TileBases& bases,
                         size_t escape_capacity, std::span<uint8_t> slot, Backend backend) {
  check_arguments(shape, bases, escape_capacity, slot.size());
  if (row_stride < static_cast<size_t>(shape.channels)) throw Error("row stride shorter than the tile width");
  if (resolve(backend) == Backend::avx2) return avx2::encode_tile(shape, src, row_stride, bases, escape_capacity, slot.data());
  return reference::encode_tile(shape, src, row_stride, bases, escape_capacity, slot.data());
}

DecodeStatus decode_tile(TileShape shape, std::span<const uint8_t> slot, size_t escape_capacity, const TileBases& bases,
                         uint16_t* dst, size_t row_stride, Backend backend) {
  check_arguments(shape, bases, escape_capacity, slot.size());
  if (row_stride < static_cast<size_t>(shape.channels)) throw Error("row stride shorter than the tile width");
  if (resolve(backend) == Backend::avx2) return avx2::decode_tile(shape, slot.data(), escape_capacity, bases, dst, row_stride);
  return reference::decode_tile(shape, slot.data(), escape_capacity, bases, dst, row_stride);
}

}  // namespace gaac
