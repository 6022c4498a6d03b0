// Fp8TileCodec and Fp8CalibratedCodecs: validation and preparation once, then unchecked batched coding;
// the single-tile entry points are an Fp8TileCodec made for one tile.
#include <algorithm>
#include <string>

#include "codec/codec_setup.hpp"
#include "codec/fp8_kernels.hpp"
#include "common/cpu.hpp"
#include "gaac/error.hpp"
#include "gaac/fp8_codec.hpp"

namespace gaac {

namespace detail {

const char* to_string(Fp8KernelSet set) {
  switch (set) {
    case Fp8KernelSet::scalar: return "scalar";
    case Fp8KernelSet::avx2: return "avx2";
    case Fp8KernelSet::avx2_gfni: return "avx2_gfni";
  }
  return "unknown";
}

bool fp8_kernel_set_available(Fp8KernelSet set) {
  switch (set) {
    case Fp8KernelSet::scalar: return true;
    case Fp8KernelSet::avx2: return backend_available(Backend::avx2);
    case Fp8KernelSet::avx2_gfni: return backend_available(Backend::avx2) && gfni::compiled() && cpu_features().gfni;
  }
  return false;
}

Fp8KernelSet fp8_kernel_set(Backend backend) {
  static const Fp8KernelSet avx2_set =
      fp8_kernel_set_available(Fp8KernelSet::avx2_gfni) ? Fp8KernelSet::avx2_gfni : Fp8KernelSet::avx2;
  return backend == Backend::avx2 ? avx2_set : Fp8KernelSet::scalar;
}

Fp8ShapeKernels fp8_kernels(Fp8KernelSet set, Fp8TileShape shape) {
  switch (set) {
    case Fp8KernelSet::avx2: return avx2::fp8_kernels(shape);
    case Fp8KernelSet::avx2_gfni: return gfni::fp8_kernels(shape);
    case Fp8KernelSet::scalar: break;
  }
  return scalar::fp8_kernels(shape);
}

}  // namespace detail

bool validate_fp8_bases(Fp8TileShape shape, const Fp8TileBases& bases) {
  const auto n = static_cast<size_t>(shape.tile.channels);
  if (!is_fp8(shape.format) || bases.b2.size() < n || bases.b3.size() < n) return false;
  uint8_t high2 = 0, high3 = 0;
  for (size_t c = 0; c < n; ++c) {
    high2 = std::max(high2, bases.b2[c]);
    high3 = std::max(high3, bases.b3[c]);
  }
  return high2 <= fp8_max_base2(shape.format) && high3 <= fp8_max_base3(shape.format);
}

Fp8TileCodec::Fp8TileCodec(Fp8TileShape shape, const Fp8TileBases& bases, size_t escape_capacity, Backend backend)
    : shape_(shape), capacity_(escape_capacity) {
  if (!is_fp8(shape.format)) throw Error(std::string("an FP8 tile codec needs E4M3 or E5M2, got ") + to_string(shape.format));
  if (!shape.tile.valid()) throw Error("tile width must be 64 or 128 channels, got " + std::to_string(shape.tile.channels));
  detail::check_escape_capacity(escape_capacity, shape.max_slot_capacity());
  if (!validate_fp8_bases(shape, bases)) throw Error("FP8 exponent bases missing or outside their valid range");
  backend = detail::resolve_backend(backend);
  backend_ = backend;
  std::copy_n(bases.b2.begin(), shape.tile.channels, b2_.begin());
  std::copy_n(bases.b3.begin(), shape.tile.channels, b3_.begin());
  const detail::Fp8ShapeKernels kernels = detail::fp8_kernels(detail::fp8_kernel_set(backend), shape);
  kernels.prepare(bases, prepared_.data());
  encode_ = kernels.encode;
  decode_ = kernels.decode;
}

void Fp8TileCodec::encode_blocks(const uint8_t* src, size_t row_stride, size_t tile_stride, size_t count, uint8_t* slots,
                                 size_t slot_stride, TileEncoding* results) const noexcept {
  for (size_t i = 0; i < count; ++i) {
    const TileEncoding e = encode_(prepared_.data(), src + i * tile_stride, row_stride, capacity_, slots + i * slot_stride);
    if (results != nullptr) results[i] = e;
  }
}

BlockDecodeResult Fp8TileCodec::decode_blocks(const uint8_t* slots, size_t slot_stride, size_t count, uint8_t* dst,
                                              size_t row_stride, size_t tile_stride) const noexcept {
  for (size_t i = 0; i < count; ++i) {
    const DecodeStatus status = decode_(prepared_.data(), slots + i * slot_stride, capacity_, dst + i * tile_stride, row_stride);
    if (status != DecodeStatus::ok) return {i, status};
  }
  return {count, DecodeStatus::ok};
}

namespace {

/// Checks the buffers of a single-tile call.
void check_tile_call(const Fp8TileCodec& codec, size_t slot_size, size_t row_stride) {
  if (slot_size < codec.slot_bytes()) {
    throw Error("slot of " + std::to_string(slot_size) + " bytes is smaller than " + std::to_string(codec.slot_bytes()));
  }
  if (row_stride < static_cast<size_t>(codec.shape().tile.channels)) throw Error("row stride shorter than the tile width");
}

}  // namespace

TileEncoding encode_fp8_tile(Fp8TileShape shape, const uint8_t* src, size_t row_stride, const Fp8TileBases& bases,
                             size_t escape_capacity, std::span<uint8_t> slot, Backend backend) {
  const Fp8TileCodec codec(shape, bases, escape_capacity, backend);
  check_tile_call(codec, slot.size(), row_stride);
  TileEncoding result;
  codec.encode_blocks(src, row_stride, 0, 1, slot.data(), 0, &result);
  return result;
}

DecodeStatus decode_fp8_tile(Fp8TileShape shape, std::span<const uint8_t> slot, size_t escape_capacity,
                             const Fp8TileBases& bases, uint8_t* dst, size_t row_stride, Backend backend) {
  const Fp8TileCodec codec(shape, bases, escape_capacity, backend);
  check_tile_call(codec, slot.size(), row_stride);
  return codec.decode_blocks(slot.data(), 0, 1, dst, row_stride, 0).status;
}

Fp8CalibratedCodecs::Fp8CalibratedCodecs(const CalibrationTable& table, std::optional<size_t> escape_capacity, Backend backend)
    : layers_(table.layers()), kv_heads_(table.kv_heads()), halves_(tiles_per_head(table.head_dim())) {
  table.validate();
  if (!is_fp8(table.element_format())) throw Error("FP8 tile codecs need an FP8 calibration table, this one is for BF16");
  codecs_ = detail::codecs_of_table<Fp8TileCodec>(table, escape_capacity, [&](TensorKind kind, int l, int h, int half, size_t capacity) {
    const Fp8TileShape shape{table.element_format(), tile_shape_for(kind, table.head_dim())};
    return Fp8TileCodec(shape, table.fp8_tile_bases(kind, l, h, half), capacity, backend);
  });
}

size_t Fp8CalibratedCodecs::index(TensorKind kind, int layer) const {
  return detail::codec_table_index(kind, layer, layers_, kv_heads_ * halves_);
}

const Fp8TileCodec& Fp8CalibratedCodecs::codec(TensorKind kind, int layer, int head, int half) const {
  return codecs_[index(kind, layer) + static_cast<size_t>(head * halves_ + half)];
}

std::span<const Fp8TileCodec> Fp8CalibratedCodecs::tensor_codecs(TensorKind kind, int layer) const {
  return std::span<const Fp8TileCodec>(codecs_).subspan(index(kind, layer), static_cast<size_t>(kv_heads_ * halves_));
}

}  // namespace gaac
