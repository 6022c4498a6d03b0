// The fused AVX2 kernels over compressed slots: the AVX2 decoder's own parts (codec/decode_avx2.hpp)
// compose each fragment register's values, and the kernels consume them at once, the contract's
// arithmetic of tile_kernels.hpp bit for bit. Keys: fused_keys_avx2.cpp; values:
// fused_values_avx2.cpp. Call only when avx2_kernels() is not null.
#pragma once

#include "attention/tile_kernels.hpp"

namespace gaac::attention::fused_avx2 {

/// Writes the queries in the order key_scores reads them: within every 64 channels, float
/// 8·(4·t1 + 2·s1 + b0) + 4·t0 + 2·s0 + b1 is channel 32·s1 + 16·s0 + 8·b0 + 4·t1 + 2·t0 + b1, the
/// order a key segment's values come out of the decoder.
void prepare_query(int heads, int head_dim, const float* q, float* out);

/// KeyScoresFn over compressed slots (every half compressed), `q` from prepare_query.
void key_scores(const BlockTask& task, const float* q, float scale, float* scores);

/// FoldValuesFn over compressed slots (every half compressed).
void fold_values(const BlockTask& task, const float* rescale, const float* weight, float* acc);

}  // namespace gaac::attention::fused_avx2
