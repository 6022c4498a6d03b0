// AVX2 + FMA versions of the heavy forward-pass functions of ops.hpp, bit-identical to the portable ones.
#pragma once

#include "model/ops.hpp"

namespace gaac::model::ops::avx2 {

/// Whether this build has the AVX2 versions and this CPU runs them (AVX2 and FMA).
bool available();

/// As ops::swiglu and ops::attend. Call only when available().
void swiglu(float* gate, const float* up, size_t n);
void attend(const AttentionQuery& query, float* out, std::vector<float>& scratch);

}  // namespace gaac::model::ops::avx2
