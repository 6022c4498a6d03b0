// The fused AVX-512 kernels over compressed slots (built with F, BW, VL, VBMI on top of the AVX2
// set, offered where cpu_features().avx512_set() holds): the AVX2 decoder's parts compose the
// values, 64-byte registers and vpternlogd do the rest, the contract's arithmetic of
// tile_kernels.hpp bit for bit. Keys: fused_keys_avx512.cpp; values:
// fused_values_avx512.cpp. Call only when avx512_kernels() is not null.
#pragma once

#include "attention/tile_kernels.hpp"

namespace gaac::attention::fused_avx512 {

/// True when this build has the AVX-512 kernels (x86-64 with a compiler that supports them).
bool compiled();

/// Writes the queries in the order key_scores reads them: within every 64 channels, float
/// 16·(2·s1 + b0) + 8·t1 + 4·t0 + 2·s0 + b1 is channel 32·s1 + 16·s0 + 8·b0 + 4·t1 + 2·t0 + b1.
void prepare_query(int heads, int head_dim, const float* q, float* out);

/// KeyScoresFn over compressed slots (every half compressed), `q` from prepare_query.
void key_scores(const BlockTask& task, const float* q, float scale, float* scores);

/// FoldValuesFn over compressed slots (every half compressed).
void fold_values(const BlockTask& task, const float* rescale, const float* weight, float* acc);

}  // namespace gaac::attention::fused_avx512
