// Tile encode/decode: 16 tokens × 64 or 128 channels of BF16 to and from one fixed-capacity slot.
#pragma once

#include "gaac/export.h"

#include <array>
#include <cstddef>
#include <cstdint>
#include <span>

#include "gaac/format.hpp"

namespace gaac {

/// The calibrated exponent bases of one tile's channels: `b3[c]` and `b4[c]` for c < channels.
/// Every `b3` must be ≤ kMaxBase3 and every `b4` ≤ kMaxBase4 (see validate_bases).
struct GAAC_API TileBases {
  std::span<const uint8_t> b3;
  std::span<const uint8_t> b4;
};

/// The calibrated exponent bases of one FP8 tile's channels (gaac/fp8_codec.hpp): `b2[c]` and `b3[c]` for
/// c < channels, with b2 ≤ fp8_max_base2(format) and b3 ≤ fp8_max_base3(format).
struct GAAC_API Fp8TileBases {
  std::span<const uint8_t> b2;
  std::span<const uint8_t> b3;
};

/// True when `bases` has `shape.channels` entries per window and every base keeps its window
/// inside the exponent range.
GAAC_API bool validate_bases(TileShape shape, const TileBases& bases);

/// What encoding one tile produced.
struct GAAC_API TileEncoding {
  /// Groups per mode, indexed by GroupMode (3-bit, 4-bit, raw).
  std::array<uint32_t, 3> groups_by_mode{};
  /// Escape bytes the tile needs (may exceed the capacity).
  uint32_t escape_bytes = 0;
  /// True when the escapes fit the slot; otherwise the caller stores the tile raw.
  bool fits = false;
};

/// Outcome of decoding one slot.
enum class DecodeStatus : uint8_t {
  ok = 0,
  invalid_tag,      ///< a group carries tag value 3
  escape_overrun,   ///< the tags ask for more escape bytes than the slot holds
  nonzero_padding,  ///< escape-slot bytes past the last escape are not zero
};

/// A short English description of a decode status.
GAAC_API const char* to_string(DecodeStatus status);

/// Implementation used for tile encoding and decoding.
enum class Backend : uint8_t {
  automatic = 0,  ///< the fastest one this CPU supports
  scalar,         ///< plain C++, obviously correct: the oracle of every test
  avx2,           ///< x86-64 AVX2 fast path
};

/// Name of a backend ("scalar", "avx2", "automatic").
GAAC_API const char* to_string(Backend backend);
/// True when this build and this CPU can run `backend`.
GAAC_API bool backend_available(Backend backend);
/// The backend `Backend::automatic` resolves to on this machine.
GAAC_API Backend best_backend();

/// Encodes a 16 × shape.channels BF16 tile into `slot`.
///
/// `src` points at token 0, channel 0; element (t, c) is `src[t * row_stride + c]` (bit patterns).
/// `slot` must hold `shape.slot_bytes(escape_capacity)` bytes; `escape_capacity` must be a multiple
/// of kSlotAlignment no larger than `shape.max_slot_capacity()`. When the escapes do not fit,
/// `fits` is false and the slot contents are unspecified. Bases must pass validate_bases.
GAAC_API TileEncoding encode_tile(TileShape shape, const uint16_t* src, size_t row_stride, const TileBases& bases,
                         size_t escape_capacity, std::span<uint8_t> slot, Backend backend = Backend::automatic);

/// Decodes a slot written by encode_tile back into BF16 bit patterns at `dst` (same addressing as
/// encode_tile's `src`). Validates every tag and the escape accounting; on any status other than
/// `ok` the contents of `dst` are unspecified.
GAAC_API DecodeStatus decode_tile(TileShape shape, std::span<const uint8_t> slot, size_t escape_capacity, const TileBases& bases,
                         uint16_t* dst, size_t row_stride, Backend backend = Backend::automatic);

}  // namespace gaac
