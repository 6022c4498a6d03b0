// The AVX2 FP8 kernels (codec/fp8_avx2.hpp), built with AVX2 and BMI2: what runs where the CPU has no GFNI.
#include "codec/fp8_avx2.hpp"

#if defined(__AVX2__)

namespace gaac::avx2 {
detail::Fp8ShapeKernels fp8_kernels(Fp8TileShape shape) { return make_fp8_kernels<false>(shape); }
}  // namespace gaac::avx2

#else  // !__AVX2__: no AVX2 path in this build; dispatch never selects it.

namespace gaac::avx2 {
detail::Fp8ShapeKernels fp8_kernels(Fp8TileShape shape) { return scalar::fp8_kernels(shape); }
}  // namespace gaac::avx2

#endif
