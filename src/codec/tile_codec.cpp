// TileCodec and CalibratedCodecs: validation and preparation once, then unchecked batched coding.
#include "gaac/tile_codec.hpp"

#include <algorithm>
#include <string>

#include "codec/codec_setup.hpp"
#include "codec/kernels.hpp"
#include "gaac/error.hpp"

namespace gaac {

TileCodec::TileCodec(TileShape shape, const TileBases& bases, size_t escape_capacity, Backend backend)
    : shape_(shape), capacity_(escape_capacity) {
  if (!shape.valid()) throw Error("tile width must be 64 or 128 channels, got " + std::to_string(shape.channels));
  detail::check_escape_capacity(escape_capacity, shape.max_slot_capacity());
  if (!validate_bases(shape, bases)) throw Error("exponent bases missing or outside their valid range");
  backend = detail::resolve_backend(backend);
  backend_ = backend;
  std::copy_n(bases.b3.begin(), shape.channels, b3_.begin());
  std::copy_n(bases.b4.begin(), shape.channels, b4_.begin());
  const detail::ShapeKernels kernels = backend == Backend::avx2 ? avx2::kernels(shape) : scalar::kernels(shape);
  kernels.prepare(bases, prepared_.data());
  encode_ = kernels.encode;
  decode_ = kernels.decode;
}

void TileCodec::encode_blocks(const uint16_t* src, size_t row_stride, size_t tile_stride, size_t count, uint8_t* slots,
                              size_t slot_stride, TileEncoding* results) const noexcept {
  for (size_t i = 0; i < count; ++i) {
    uint8_t* slot = slots + i * slot_stride;
    const TileEncoding e = encode_(prepared_.data(), src + i * tile_stride, row_stride, capacity_, slot, slot + shape_.escape_offset());
    if (results != nullptr) results[i] = e;
  }
}

TileEncoding TileCodec::encode_split(const uint16_t* src, size_t row_stride, uint8_t* fixed, uint8_t* escapes) const noexcept {
  return encode_(prepared_.data(), src, row_stride, capacity_, fixed, escapes);
}

DecodeStatus TileCodec::decode_split(const uint8_t* fixed, const uint8_t* escapes, size_t escape_capacity, uint16_t* dst,
                                     size_t row_stride) const noexcept {
  return decode_(prepared_.data(), fixed, escapes, escape_capacity, dst, row_stride);
}

BlockDecodeResult TileCodec::decode_blocks(const uint8_t* slots, size_t slot_stride, size_t count, uint16_t* dst,
                                           size_t row_stride, size_t tile_stride) const noexcept {
  for (size_t i = 0; i < count; ++i) {
    const uint8_t* slot = slots + i * slot_stride;
    const DecodeStatus status =
        decode_(prepared_.data(), slot, slot + shape_.escape_offset(), capacity_, dst + i * tile_stride, row_stride);
    if (status != DecodeStatus::ok) return {i, status};
  }
  return {count, DecodeStatus::ok};
}

CalibratedCodecs::CalibratedCodecs(const CalibrationTable& table, std::optional<size_t> escape_capacity, Backend backend)
    : layers_(table.layers()), kv_heads_(table.kv_heads()), head_dim_(table.head_dim()), halves_(tiles_per_head(table.head_dim())) {
  table.validate();
  codecs_ = detail::codecs_of_table<TileCodec>(table, escape_capacity, [&](TensorKind kind, int l, int h, int half, size_t capacity) {
    return TileCodec(tile_shape_for(kind, head_dim_), table.tile_bases(kind, l, h, half), capacity, backend);
  });
}

size_t CalibratedCodecs::index(TensorKind kind, int layer) const {
  return detail::codec_table_index(kind, layer, layers_, kv_heads_ * halves_);
}

const TileCodec& CalibratedCodecs::codec(TensorKind kind, int layer, int head, int half) const {
  return codecs_[index(kind, layer) + static_cast<size_t>(head * halves_ + half)];
}

std::span<const TileCodec> CalibratedCodecs::tensor_codecs(TensorKind kind, int layer) const {
  return std::span<const TileCodec>(codecs_).subspan(index(kind, layer), static_cast<size_t>(kv_heads_ * halves_));
}

}  // namespace gaac
