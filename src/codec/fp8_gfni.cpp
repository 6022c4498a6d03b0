// The AVX2 FP8 kernels (codec/fp8_avx2.hpp) with the GFNI escape-plane expansion, built with AVX2, BMI2
// and GFNI: the only translation unit compiled with -mgfni. Encoding is the AVX2 encoder.
#include "codec/fp8_avx2.hpp"

#if defined(__AVX2__) && defined(__GFNI__)

namespace gaac::gfni {
bool compiled() { return true; }
detail::Fp8ShapeKernels fp8_kernels(Fp8TileShape shape) { return avx2::make_fp8_kernels<true>(shape); }
}  // namespace gaac::gfni

#else  // no GFNI in this build: dispatch never selects it.

namespace gaac::gfni {
bool compiled() { return false; }
detail::Fp8ShapeKernels fp8_kernels(Fp8TileShape shape) { return avx2::fp8_kernels(shape); }
}  // namespace gaac::gfni

#endif
