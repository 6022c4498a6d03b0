// expf over arrays with the C library's results bit for bit (the attention's softmax needs them).
#pragma once

#include <cstddef>

namespace gaac::attention {

/// x[i] = expf(x[i]) for i < n, the C library's results bit for bit: eight at a time by the library's
/// own algorithm when a start-up check finds this library computes it so (and the CPU has AVX2), else
/// by calling it.
void expf_in_place(float* x, size_t n);
/// Whether expf_in_place runs the vector version (the start-up check passed).
bool expf_vectorised();

}  // namespace gaac::attention
