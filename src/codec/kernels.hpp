// The backends behind TileCodec. Each offers, per tile shape, a way to prepare the bases in its own
// order and to encode and decode one tile with them. Arguments are validated by TileCodec; every
// backend must produce exactly the scalar backend's bytes, values and statuses.
#pragma once

#include "gaac/codec.hpp"

namespace gaac::detail {

/// One backend's kernels for one tile shape.
struct ShapeKernels {
  /// Writes the bases in the backend's order into `prepared` (TileCodec::kPreparedBytes, 64-aligned).
  void (*prepare)(const TileBases& bases, uint8_t* prepared);
  /// Encodes the tile at `src` (rows `row_stride` apart): its fixed part (sign+mantissa, codes, tags) to
  /// `slot`, its escape bytes to `escapes` (`capacity` bytes, zero past the tile's own; in a slot they
  /// follow the fixed part).
  TileEncoding (*encode)(const uint8_t* prepared, const uint16_t* src, size_t row_stride, size_t capacity,
                         uint8_t* slot, uint8_t* escapes);
  /// Decodes the tile whose fixed part is at `slot` and whose escape slot is the `capacity` bytes at
  /// `escapes` into the tile at `dst`.
  DecodeStatus (*decode)(const uint8_t* prepared, const uint8_t* slot, const uint8_t* escapes, size_t capacity,
                         uint16_t* dst, size_t row_stride);
};

}  // namespace gaac::detail

namespace gaac::scalar {
/// The scalar backend's kernels: follows docs/format.md element by element.
detail::ShapeKernels kernels(TileShape shape);
}  // namespace gaac::scalar

namespace gaac::avx2 {
/// True when this binary was built with the AVX2 path (x86-64 with a compiler that supports it).
bool compiled();
/// The AVX2 kernels; only call them when the CPU supports AVX2 and BMI2.
detail::ShapeKernels kernels(TileShape shape);
}  // namespace gaac::avx2
