// Backend entry points behind the dispatching encode_tile / decode_tile. Arguments are already
// validated by the dispatcher; each backend must produce exactly the reference's bytes and values.
#pragma once

#include "gaac/codec.hpp"

namespace gaac::reference {
/// Scalar reference encoder: follows docs/format.md element by element.
TileEncoding encode_tile(TileShape shape, const uint16_t* src, size_t row_stride, const TileBases& bases,
                         size_t escape_capacity, uint8_t* slot);
/// Scalar reference decoder.
DecodeStatus decode_tile(TileShape shape, const uint8_t* slot, size_t escape_capacity, const TileBases& bases,
                         uint16_t* dst, size_t row_stride);
}  // namespace gaac::reference

namespace gaac::avx2 {
/// True when this binary was built with the AVX2 path (x86-64 with a compiler that supports it).
bool compiled();
/// AVX2 encoder; only call when the CPU supports AVX2.
TileEncoding encode_tile(TileShape shape, const uint16_t* src, size_t row_stride, const TileBases& bases,
                         size_t escape_capacity, uint8_t* slot);
/// AVX2 decoder; only call when the CPU supports AVX2.
DecodeStatus decode_tile(TileShape shape, const uint8_t* slot, size_t escape_capacity, const TileBases& bases,
                         uint16_t* dst, size_t row_stride);
}  // namespace gaac::avx2
