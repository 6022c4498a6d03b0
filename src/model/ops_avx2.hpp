// AVX2 + FMA versions of the heavy forward-pass functions of ops.hpp, bit-identical to the scalar ones.
#pragma once

#include "model/ops.hpp"

namespace gaac::model::ops::avx2 {

/// Whether this build has the AVX2 versions and this CPU runs them (AVX2 and FMA).
bool available();

/// As ops::swiglu. Call only when available().
void swiglu(float* gate, const float* up, size_t n);

}  // namespace gaac::model::ops::avx2
