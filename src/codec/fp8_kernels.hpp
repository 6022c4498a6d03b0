// The backends behind Fp8TileCodec. Each offers, per FP8 tile shape, a way to prepare the bases in its
// own order and to encode and decode one tile with them. Arguments are validated by Fp8TileCodec; every
// backend must produce exactly the scalar backend's bytes, values and statuses.
#pragma once

#include "codec/shape_dispatch.hpp"
#include "gaac/fp8_codec.hpp"

namespace gaac::detail {

/// One backend's kernels for one FP8 tile shape.
struct Fp8ShapeKernels {
  /// Writes the bases in the backend's order into `prepared` (Fp8TileCodec::kPreparedBytes, 64-aligned).
  void (*prepare)(const Fp8TileBases& bases, uint8_t* prepared);
  /// Encodes the tile of FP8 bytes at `src` (rows `row_stride` apart) into `slot`.
  TileEncoding (*encode)(const uint8_t* prepared, const uint8_t* src, size_t row_stride, size_t capacity, uint8_t* slot);
  /// Decodes `slot` into the tile at `dst`.
  DecodeStatus (*decode)(const uint8_t* prepared, const uint8_t* slot, size_t capacity, uint8_t* dst, size_t row_stride);
};

/// Calls `f.template operator()<Format, Kind, Channels>()` for the shape's format (E4M3 or E5M2), kind and
/// width (the caller has validated them) and returns what it returns: the one FP8 switch.
template <class F>
decltype(auto) dispatch_fp8_shape(Fp8TileShape shape, F&& f) {
  return dispatch_shape(shape.tile, [&]<TensorKind Kind, int Channels>() -> decltype(auto) {
    if (shape.format == ElementFormat::e4m3) return f.template operator()<ElementFormat::e4m3, Kind, Channels>();
    return f.template operator()<ElementFormat::e5m2, Kind, Channels>();
  });
}

}  // namespace gaac::detail

namespace gaac::scalar {
/// The scalar backend's FP8 kernels: follows docs/format.md, section 14, element by element.
detail::Fp8ShapeKernels fp8_kernels(Fp8TileShape shape);
}  // namespace gaac::scalar

namespace gaac::avx2 {
/// The AVX2 FP8 kernels; only call them when the CPU supports AVX2 and BMI2 (avx2::compiled() too).
detail::Fp8ShapeKernels fp8_kernels(Fp8TileShape shape);
}  // namespace gaac::avx2

namespace gaac::gfni {
/// True when this build has the GFNI FP8 kernels (an x86-64 compiler that takes -mgfni).
bool compiled();
/// The AVX2 FP8 kernels with GFNI's escape-plane expansion (codec/fp8_gfni.cpp); only call them when
/// the CPU supports AVX2, BMI2 and GFNI and gfni::compiled().
detail::Fp8ShapeKernels fp8_kernels(Fp8TileShape shape);
}  // namespace gaac::gfni

namespace gaac::detail {

/// The FP8 kernel sets. Backend::avx2 runs avx2_gfni where this build and CPU have it, else avx2; the
/// tests name the sets to compare each with the scalar oracle on any machine.
enum class Fp8KernelSet : uint8_t { scalar, avx2, avx2_gfni };

/// "scalar", "avx2", "avx2_gfni".
const char* to_string(Fp8KernelSet set);
/// True when this build and this CPU (common/cpu.hpp's probe) can run `set`.
bool fp8_kernel_set_available(Fp8KernelSet set);
/// The set a resolved backend (not Backend::automatic) runs.
Fp8KernelSet fp8_kernel_set(Backend backend);
/// The kernels of `set` for `shape` (which the caller has validated).
Fp8ShapeKernels fp8_kernels(Fp8KernelSet set, Fp8TileShape shape);

}  // namespace gaac::detail
