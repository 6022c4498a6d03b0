// Fused AVX2 fold of compressed value slots. A 512-byte chunk is 32 channels × 16 tokens: the
// decoder composes its sixteen fragment registers (value_half_chunk_words) and its word network
// (value_words_to_rows) turns them into one register of 16 channels per token and half-chunk, which
// are widened to floats with one shift or one AND each: even channels in one register, odd ones in
// the other. The accumulators are taken into that order when a chunk starts and put back when it
// ends, so the per-token work is exactly the contract's: per channel, tokens in order, a rescale and
// one fused multiply-add.
//
// The chunk's floats are held in a local array (2 KB, in L1): the one buffer of this path, and an
// unavoidable one with 16 vector registers. The fold visits a channel's tokens in order for each
// query head, so either every head's accumulators (4 registers per head for 32 channels) or every
// token's values (64 registers) would have to stay live across the chunk, and the network emits
// tokens 0-3 and 8-11 before 4-7. Each float is written once and read once per head, as a memory
// operand of its multiply-add; the slot itself is read once.
#include "attention/fused_avx2.hpp"

#if defined(__AVX2__) && defined(__BMI2__) && defined(__FMA__)

#include <immintrin.h>

#include "attention/fused_tile_avx2.hpp"
#include "attention/fused_walk.hpp"

namespace gaac::attention::fused_avx2 {
namespace {

/// One chunk as floats: f[t][2·jj1 + odd] holds token t, channels 16·jj1 + 2k + odd (k = 0..7) of
/// the chunk.
struct ChunkFloats {
  __m256 f[kTileTokens][4];
};

/// Composes chunk c = 2o + kOdd and widens it to floats.
template <class G, int kOdd, class Exponents>
inline void chunk_floats(const uint8_t* slot, const Exponents& exponents, int o, ChunkFloats& out) {
  const __m256i high = _mm256_set1_epi32(static_cast<int>(0xFFFF0000u));
#pragma GCC unroll 1
  for (int t1 = 0; t1 < 2; ++t1) {
    __m256i words[2][8];  // [jj1][j]
    avx2::value_half_chunk_words<G, kOdd>(slot, exponents, o, t1, words[0], words[1]);
#pragma GCC unroll 2
    for (int jj1 = 0; jj1 < 2; ++jj1) {
      avx2::value_words_to_rows(words[jj1]);
#pragma GCC unroll 8
      for (int j = 0; j < 8; ++j) {
        __m256* token = out.f[avx2::value_word_row(j, t1)];
        token[2 * jj1] = _mm256_castsi256_ps(_mm256_slli_epi32(words[jj1][j], 16));
        token[2 * jj1 + 1] = _mm256_castsi256_ps(_mm256_and_si256(words[jj1][j], high));
      }
    }
  }
}

/// Bit t set when token t's rescale is not 1 (NaN included): those tokens multiply the accumulators
/// first; the others skip it, as the contract allows (a factor of 1 changes no bit).
inline uint32_t rescaled_tokens(const float* rescale) {
  const __m256 one = _mm256_set1_ps(1.0f);
  const auto low = static_cast<uint32_t>(_mm256_movemask_ps(_mm256_cmp_ps(_mm256_loadu_ps(rescale), one, _CMP_NEQ_UQ)));
  const auto high = static_cast<uint32_t>(_mm256_movemask_ps(_mm256_cmp_ps(_mm256_loadu_ps(rescale + 8), one, _CMP_NEQ_UQ)));
  return low | high << 8;
}

/// acc · rescale[t] (when bit t of `rescaled` is set), then fma(v[t], weight[t], acc).
inline void fold_token(const __m256 v[4], int t, uint32_t rescaled, const float* rescale, const float* weight, __m256 a[4]) {
  if ((rescaled >> t & 1) != 0) {
    const __m256 r = _mm256_set1_ps(rescale[t]);
    for (int k = 0; k < 4; ++k) a[k] = _mm256_mul_ps(a[k], r);
  }
  const __m256 w = _mm256_set1_ps(weight[t]);
  for (int k = 0; k < 4; ++k) a[k] = _mm256_fmadd_ps(v[k], w, a[k]);
}

/// Folds one head's 32 channels of a chunk (acc, channel order) over tokens [first, end); a whole
/// block without rescales, the common case, in one straight run.
inline void fold_chunk(const ChunkFloats& v, int first, int end, uint32_t rescaled, const float* rescale, const float* weight,
                       float* acc) {
  __m256 a[4];  // channels 16·jj1 + 2k + odd in a[2·jj1 + odd]
  for (int jj1 = 0; jj1 < 2; ++jj1) {
    const __m256 low = _mm256_loadu_ps(acc + 16 * jj1), high = _mm256_loadu_ps(acc + 16 * jj1 + 8);
    a[2 * jj1] = _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(_mm256_shuffle_ps(low, high, 0x88)), 0xD8));
    a[2 * jj1 + 1] = _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(_mm256_shuffle_ps(low, high, 0xDD)), 0xD8));
  }
  if (first == 0 && end == kTileTokens && rescaled == 0) {
#pragma GCC unroll 16
    for (int t = 0; t < kTileTokens; ++t) fold_token(v.f[t], t, 0, rescale, weight, a);
  } else {
    for (int t = first; t < end; ++t) fold_token(v.f[t], t, rescaled, rescale, weight, a);
  }
  for (int jj1 = 0; jj1 < 2; ++jj1) {
    const __m256 even = _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(a[2 * jj1]), 0xD8));
    const __m256 odd = _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(a[2 * jj1 + 1]), 0xD8));
    _mm256_storeu_ps(acc + 16 * jj1, _mm256_unpacklo_ps(even, odd));
    _mm256_storeu_ps(acc + 16 * jj1 + 8, _mm256_unpackhi_ps(even, odd));
  }
}

/// This instruction set's parts of the shared block walk (fused_walk.hpp).
struct Isa {
  using ChunkFloats = fused_avx2::ChunkFloats;
  template <class G, int kOdd, class Exponents>
  static void chunk_floats(const uint8_t* slot, const Exponents& exponents, int o, ChunkFloats& out) {
    fused_avx2::chunk_floats<G, kOdd>(slot, exponents, o, out);
  }
  static void fold_chunk(const ChunkFloats& v, int first, int end, uint32_t rescaled, const float* rescale, const float* weight,
                         float* acc) {
    fused_avx2::fold_chunk(v, first, end, rescaled, rescale, weight, acc);
  }
  static uint32_t rescaled_tokens(const float* rescale) { return fused_avx2::rescaled_tokens(rescale); }
};

}  // namespace

void fold_values(const BlockTask& task, const float* rescale, const float* weight, float* acc) {
  fused::fold_values<Isa>(task, rescale, weight, acc);
}

}  // namespace gaac::attention::fused_avx2

#endif
