// Tile codecs: the codec's arguments validated once, then tiles coded in batches with no further checks.
//
// A TileCodec holds everything needed to code the tiles of one (K/V, layer, head, half-head): the tile
// shape, the escape capacity, the backend, and the calibrated bases already rearranged into the
// backend's own order. Building one checks every argument (and throws gaac::Error); running it
// (encode_blocks / decode_blocks) is noexcept and checks nothing, so the cost per tile is the coding
// itself. CalibratedCodecs holds the codecs of a whole calibration table.
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
#include "gaac/tiling.hpp"

namespace gaac {

/// Where decode_blocks stopped: the index of the first slot that did not decode and why, or
/// {count, ok} when every slot decoded.
struct GAAC_API BlockDecodeResult {
  size_t index = 0;
  DecodeStatus status = DecodeStatus::ok;
};

/// The coding of one kind of tile, validated once. Copyable; about 3 KB.
class GAAC_API TileCodec {
 public:
  /// Bytes of the bases in a backend's prepared form (the AVX2 backend's value tiles need the most).
  static constexpr size_t kPreparedBytes = 3072;

  /// Checks the shape (64 or 128 channels), the capacity (a multiple of 16 up to the shape's
  /// maximum), the bases (one per channel, inside their windows) and the backend, then prepares the
  /// bases. Throws gaac::Error on any bad argument.
  TileCodec(TileShape shape, const TileBases& bases, size_t escape_capacity, Backend backend = Backend::automatic);

  TileShape shape() const noexcept { return shape_; }
  size_t escape_capacity() const noexcept { return capacity_; }
  /// Bytes of one slot: shape().slot_bytes(escape_capacity()).
  size_t slot_bytes() const noexcept { return shape_.slot_bytes(capacity_); }
  /// The backend this codec runs on (never Backend::automatic).
  Backend backend() const noexcept { return backend_; }
  /// The backend's prepared bases (for kernels of the same backend that decode in place).
  const uint8_t* prepared() const noexcept { return prepared_.data(); }
  /// The bases as given, one per channel (for kernels that decode element by element).
  TileBases bases() const noexcept {
    const auto n = static_cast<size_t>(shape_.channels);
    return {{b3_.data(), n}, {b4_.data(), n}};
  }

  /// Encodes `count` tiles. Tile i has element (t, c) at `src[i·tile_stride + t·row_stride + c]` and goes
  /// to the slot at `slots + i·slot_stride`; `results[i]` (when `results` is not null) receives its
  /// mode counts, escape bytes and whether they fit. A slot whose escapes do not fit holds unspecified
  /// bytes. Requires row_stride ≥ channels and slot_stride ≥ slot_bytes() (not checked).
  void encode_blocks(const uint16_t* src, size_t row_stride, size_t tile_stride, size_t count, uint8_t* slots,
                     size_t slot_stride, TileEncoding* results) const noexcept;

  /// Decodes `count` slots laid out as encode_blocks writes them into tiles laid out as it reads
  /// them. Stops at the first slot that fails validation (docs/format.md, section 6); the tiles
  /// before it are decoded, its own tile and those after are unspecified.
  BlockDecodeResult decode_blocks(const uint8_t* slots, size_t slot_stride, size_t count, uint16_t* dst,
                                  size_t row_stride, size_t tile_stride) const noexcept;

  /// Encodes one tile with its escapes apart from the rest of its slot: the fixed part
  /// (shape().fixed_bytes(): sign+mantissa, codes, tags) to `fixed`, the escape bytes to `escapes`,
  /// which must have room for escape_capacity() bytes (those past the tile's own are zeroed). The
  /// same bytes as encode_blocks writes to a slot, in two places. When the escapes do not fit,
  /// `fits` is false and only the first escape_capacity() of them are written.
  TileEncoding encode_split(const uint16_t* src, size_t row_stride, uint8_t* fixed, uint8_t* escapes) const noexcept;

  /// Decodes a tile stored as encode_split writes it: the fixed part at `fixed`, an escape slot of
  /// `escape_capacity` bytes at `escapes` (any multiple of 16 up to the shape's maximum, not
  /// checked; bytes past the tile's escapes must be zero). Validates as decode_blocks does.
  DecodeStatus decode_split(const uint8_t* fixed, const uint8_t* escapes, size_t escape_capacity, uint16_t* dst,
                            size_t row_stride) const noexcept;

 private:
  using EncodeFn = TileEncoding (*)(const uint8_t* prepared, const uint16_t* src, size_t row_stride, size_t capacity,
                                    uint8_t* slot, uint8_t* escapes);
  using DecodeFn = DecodeStatus (*)(const uint8_t* prepared, const uint8_t* slot, const uint8_t* escapes, size_t capacity,
                                    uint16_t* dst, size_t row_stride);
  TileShape shape_;
  size_t capacity_ = 0;
  Backend backend_ = Backend::scalar;
  EncodeFn encode_ = nullptr;
  DecodeFn decode_ = nullptr;
  std::array<uint8_t, kMaxTileChannels> b3_{}, b4_{};
  alignas(64) std::array<uint8_t, kPreparedBytes> prepared_{};
};

/// The tile codecs of every tile of one calibration table: (kind, layer, head, half-head).
class GAAC_API CalibratedCodecs {
 public:
  /// Codecs from `table`. Every codec uses `escape_capacity` when given (for example the shape's
  /// maximum, to learn exact escape sizes), else its (kind, layer)'s calibrated capacity.
  explicit CalibratedCodecs(const CalibrationTable& table, std::optional<size_t> escape_capacity = std::nullopt,
                            Backend backend = Backend::automatic);

  /// The codec of (kind, layer, head, half).
  const TileCodec& codec(TensorKind kind, int layer, int head, int half) const;
  /// The codecs of one (kind, layer), indexed head · halves + half: what encode_each_tile takes.
  std::span<const TileCodec> tensor_codecs(TensorKind kind, int layer) const;

  int layers() const { return layers_; }
  int kv_heads() const { return kv_heads_; }
  int head_dim() const { return head_dim_; }

 private:
  size_t index(TensorKind kind, int layer) const;
  int layers_ = 0, kv_heads_ = 0, head_dim_ = 0, halves_ = 1;
  std::vector<TileCodec> codecs_;  // [kind][layer][head][half]
};

/// The one tile loop: encodes every complete tile of `tensor` in storage order (block, head, half)
/// with `codecs` (indexed head · halves + half, as CalibratedCodecs::tensor_codecs gives them) and
/// calls `visit(index, position, encoding, slot)` for each, `slot` being valid during the call only.
/// BF16 views take TileCodecs, FP8 views (gaac/fp8_codec.hpp) Fp8TileCodecs.
template <class Element, class Codec, class Visit>
void encode_each_tile(const BasicKvView<Element>& tensor, std::span<const Codec> codecs, Visit&& visit) {
  const int halves = tiles_per_head(tensor.head_dim);
  std::vector<uint8_t> slot(codecs.empty() ? 0 : codecs.front().slot_bytes());
  const size_t tiles = tile_count(tensor);
  for (size_t i = 0; i < tiles; ++i) {
    const TilePosition p = tile_position(tensor, i);
    const Codec& codec = codecs[static_cast<size_t>(p.head * halves + p.half)];
    TileEncoding encoding;
    codec.encode_blocks(tile_origin(tensor, p), tensor.token_stride, 0, 1, slot.data(), 0, &encoding);
    visit(i, p, encoding, std::span<const uint8_t>(slot.data(), codec.slot_bytes()));
  }
}

}  // namespace gaac
