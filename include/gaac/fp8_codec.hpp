// FP8 tile codec: 16 tokens × 64 or 128 channels of E4M3 or E5M2 to and from one fixed-capacity slot
// (docs/format.md, section 14).
//
// The same shape as the BF16 codec (gaac/codec.hpp, gaac/tile_codec.hpp): a tile at a time through
// encode_fp8_tile / decode_fp8_tile, or an Fp8TileCodec validated once and then run on batches of tiles
// with no checks; the scalar backend is the oracle, the AVX2 backend produces its bytes exactly.
#pragma once

#include "gaac/export.h"

#include <array>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <vector>

#include "gaac/calibration.hpp"
#include "gaac/codec.hpp"
#include "gaac/fp8_format.hpp"
#include "gaac/tile_codec.hpp"

namespace gaac {

/// True when `bases` has `shape.tile.channels` entries per window, each inside its window's range.
GAAC_API bool validate_fp8_bases(Fp8TileShape shape, const Fp8TileBases& bases);

/// The coding of one kind of FP8 tile, validated once. Copyable; about 2.3 KB. TileEncoding's
/// groups_by_mode is indexed by Fp8GroupMode (2-bit, 3-bit, raw).
class GAAC_API Fp8TileCodec {
 public:
  /// Bytes of the bases in a backend's prepared form.
  static constexpr size_t kPreparedBytes = 2048;

  /// Checks the shape (E4M3 or E5M2, 64 or 128 channels), the capacity (a multiple of 16 up to the
  /// shape's maximum), the bases and the backend, then prepares the bases. Throws gaac::Error.
  Fp8TileCodec(Fp8TileShape shape, const Fp8TileBases& bases, size_t escape_capacity, Backend backend = Backend::automatic);

  Fp8TileShape shape() const noexcept { return shape_; }
  size_t escape_capacity() const noexcept { return capacity_; }
  /// Bytes of one slot: shape().slot_bytes(escape_capacity()).
  size_t slot_bytes() const noexcept { return shape_.slot_bytes(capacity_); }
  /// The backend this codec runs on (never Backend::automatic).
  Backend backend() const noexcept { return backend_; }
  /// The bases as given, one per channel.
  Fp8TileBases bases() const noexcept {
    const auto n = static_cast<size_t>(shape_.tile.channels);
    return {{b2_.data(), n}, {b3_.data(), n}};
  }

  /// Encodes `count` tiles of FP8 bytes: tile i has element (t, c) at `src[i·tile_stride + t·row_stride + c]`
  /// and goes to the slot at `slots + i·slot_stride`; `results[i]` (when not null) receives its mode
  /// counts, escape bytes and whether they fit. A slot whose escapes do not fit holds unspecified bytes.
  /// Requires row_stride ≥ channels and slot_stride ≥ slot_bytes() (not checked).
  void encode_blocks(const uint8_t* src, size_t row_stride, size_t tile_stride, size_t count, uint8_t* slots,
                     size_t slot_stride, TileEncoding* results) const noexcept;

  /// Decodes `count` slots into tiles laid out as encode_blocks reads them. Stops at the first slot that
  /// fails validation (docs/format.md, section 14.6); tiles before it are decoded, the rest unspecified.
  BlockDecodeResult decode_blocks(const uint8_t* slots, size_t slot_stride, size_t count, uint8_t* dst,
                                  size_t row_stride, size_t tile_stride) const noexcept;

 private:
  using EncodeFn = TileEncoding (*)(const uint8_t* prepared, const uint8_t* src, size_t row_stride, size_t capacity,
                                    uint8_t* slot);
  using DecodeFn = DecodeStatus (*)(const uint8_t* prepared, const uint8_t* slot, size_t capacity, uint8_t* dst,
                                    size_t row_stride);
  Fp8TileShape shape_;
  size_t capacity_ = 0;
  Backend backend_ = Backend::scalar;
  EncodeFn encode_ = nullptr;
  DecodeFn decode_ = nullptr;
  std::array<uint8_t, kMaxTileChannels> b2_{}, b3_{};
  alignas(64) std::array<uint8_t, kPreparedBytes> prepared_{};
};

/// Encodes one 16 × channels FP8 tile (`src[t·row_stride + c]`) into `slot`, which must hold
/// `shape.slot_bytes(escape_capacity)` bytes. When the escapes do not fit, `fits` is false and the slot
/// contents are unspecified. Throws gaac::Error on a bad argument.
GAAC_API TileEncoding encode_fp8_tile(Fp8TileShape shape, const uint8_t* src, size_t row_stride, const Fp8TileBases& bases,
                                      size_t escape_capacity, std::span<uint8_t> slot, Backend backend = Backend::automatic);

/// Decodes a slot written by encode_fp8_tile into FP8 bytes at `dst` (same addressing). Validates every
/// tag, the escape accounting and the padding; on any status but `ok` `dst` is unspecified.
GAAC_API DecodeStatus decode_fp8_tile(Fp8TileShape shape, std::span<const uint8_t> slot, size_t escape_capacity,
                                      const Fp8TileBases& bases, uint8_t* dst, size_t row_stride,
                                      Backend backend = Backend::automatic);

/// The FP8 tile codecs of every tile of an FP8 calibration table: (kind, layer, head, half-head).
class GAAC_API Fp8CalibratedCodecs {
 public:
  /// Codecs from `table` (whose element format must be FP8). Every codec uses `escape_capacity` when
  /// given (for example the shape's maximum, to learn exact escape sizes), else its (kind, layer)'s.
  explicit Fp8CalibratedCodecs(const CalibrationTable& table, std::optional<size_t> escape_capacity = std::nullopt,
                               Backend backend = Backend::automatic);

  /// The codec of (kind, layer, head, half).
  const Fp8TileCodec& codec(TensorKind kind, int layer, int head, int half) const;
  /// The codecs of one (kind, layer), indexed head · halves + half: what encode_each_tile takes.
  std::span<const Fp8TileCodec> tensor_codecs(TensorKind kind, int layer) const;

 private:
  size_t index(TensorKind kind, int layer) const;
  int layers_ = 0, kv_heads_ = 0, halves_ = 1;
  std::vector<Fp8TileCodec> codecs_;  // [kind][layer][head][half]
};

}  // namespace gaac
