// Backend selection, and the single-tile entry points (a TileCodec made for one tile).
#include <algorithm>
#include <string>

#include "codec/kernels.hpp"
#include "common/cpu.hpp"
#include "gaac/tile_codec.hpp"
#include "gaac/error.hpp"

namespace gaac {

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
    case Backend::avx2: return avx2::compiled() && cpu_features().avx2_set();
  }
  return false;
}

Backend best_backend() {
  static const Backend best = backend_available(Backend::avx2) ? Backend::avx2 : Backend::scalar;
  return best;
}

TileEncoding encode_tile(TileShape shape, const uint16_t* src, size_t row_stride, const TileBases& bases,
                         size_t escape_capacity, std::span<uint8_t> slot, Backend backend) {
  const TileCodec codec(shape, bases, escape_capacity, backend);
  if (slot.size() < codec.slot_bytes()) {
    throw Error("slot of " + std::to_string(slot.size()) + " bytes is smaller than " + std::to_string(codec.slot_bytes()));
  }
  if (row_stride < static_cast<size_t>(shape.channels)) throw Error("row stride shorter than the tile width");
  TileEncoding result;
  codec.encode_blocks(src, row_stride, 0, 1, slot.data(), 0, &result);
  return result;
}

DecodeStatus decode_tile(TileShape shape, std::span<const uint8_t> slot, size_t escape_capacity, const TileBases& bases,
                         uint16_t* dst, size_t row_stride, Backend backend) {
  const TileCodec codec(shape, bases, escape_capacity, backend);
  if (slot.size() < codec.slot_bytes()) {
    throw Error("slot of " + std::to_string(slot.size()) + " bytes is smaller than " + std::to_string(codec.slot_bytes()));
  }
  if (row_stride < static_cast<size_t>(shape.channels)) throw Error("row stride shorter than the tile width");
  return codec.decode_blocks(slot.data(), 0, 1, dst, row_stride, 0).status;
}

}  // namespace gaac
