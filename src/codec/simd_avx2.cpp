// AVX2 tile codec (not yet written: reports itself as absent so dispatch uses the reference).
#include "kernels.hpp"

namespace gaac::avx2 {
bool compiled() { return false; }
TileEncoding encode_tile(TileShape shape, const uint16_t* src, size_t row_stride, const TileBases& bases,
                         size_t escape_capacity, uint8_t* slot) {
  return reference::encode_tile(shape, src, row_stride, bases, escape_capacity, slot);
}
DecodeStatus decode_tile(TileShape shape, const uint8_t* slot, size_t escape_capacity, const TileBases& bases,
                         uint16_t* dst, size_t row_stride) {
  return reference::decode_tile(shape, slot, escape_capacity, bases, dst, row_stride);
}
}  // namespace gaac::avx2
