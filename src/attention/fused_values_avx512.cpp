// Fused AVX-512 fold of compressed value slots: fused_values_avx2.cpp's scheme, with the AVX2
// decoder's registers composed by vpternlogd (codec/decode_avx2.hpp built with AVX-512VL), 32
// vector registers so the word network does not spill, and the fold in 64-byte registers: a token's
// 32 channels of a chunk are two float registers, even channels then odd ones.
//
// As in the AVX2 kernel the chunk's floats wait in a local array (2 KB, in L1) while every query
// head folds them: the fold visits each channel's tokens in order for every head, and the word
// network emits tokens 0-3 and 8-11 before 4-7.
#include "attention/fused_avx512.hpp"

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__) && defined(__BMI2__) && defined(__FMA__)

#include <immintrin.h>

#include "attention/fused_tile_avx2.hpp"
#include "attention/fused_walk.hpp"

namespace gaac::attention::fused_avx512 {
namespace {

/// One chunk as floats: f[t][odd] holds token t, channels 2k + odd (k = 0..15) of the chunk.
struct ChunkFloats {
  __m512 f[kTileTokens][2];
};

/// Composes chunk c = 2o + kOdd and widens it to floats: the two 16-channel halves of a token
/// (jj1 = 0, 1) side by side, then even words shifted, odd ones masked.
template <class G, int kOdd, class Exponents>
inline void chunk_floats(const uint8_t* slot, const Exponents& exponents, int o, ChunkFloats& out) {
  const __m512i high = _mm512_set1_epi32(static_cast<int>(0xFFFF0000u));
#pragma GCC unroll 2
  for (int t1 = 0; t1 < 2; ++t1) {
    __m256i words[2][8];  // [jj1][j]
    avx2::value_half_chunk_words<G, kOdd>(slot, exponents, o, t1, words[0], words[1]);
    avx2::value_words_to_rows(words[0]);
    avx2::value_words_to_rows(words[1]);
#pragma GCC unroll 8
    for (int j = 0; j < 8; ++j) {
      const __m512i w = _mm512_inserti64x4(_mm512_castsi256_si512(words[0][j]), words[1][j], 1);
      __m512* token = out.f[avx2::value_word_row(j, t1)];
      token[0] = _mm512_castsi512_ps(_mm512_slli_epi32(w, 16));
      token[1] = _mm512_castsi512_ps(_mm512_and_si512(w, high));
    }
  }
}

/// Bit t set when token t's rescale is not 1 (NaN included).
inline uint32_t rescaled_tokens(const float* rescale) {
  return _mm512_cmp_ps_mask(_mm512_loadu_ps(rescale), _mm512_set1_ps(1.0f), _CMP_NEQ_UQ);
}

/// Folds one head's 32 channels of a chunk (acc, channel order) over tokens [first, end); a whole
/// block without rescales, the common case, in one straight run.
inline void fold_chunk(const ChunkFloats& v, int first, int end, uint32_t rescaled, const float* rescale, const float* weight,
                       float* acc) {
  // Even channels (idx 0, 2, .., 30 of the pair of registers) and odd ones, and back.
  const __m512i even = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
  const __m512i odd = _mm512_setr_epi32(1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31);
  const __m512i low = _mm512_setr_epi32(0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22, 7, 23);
  const __m512i high = _mm512_setr_epi32(8, 24, 9, 25, 10, 26, 11, 27, 12, 28, 13, 29, 14, 30, 15, 31);
  const __m512 x = _mm512_loadu_ps(acc), y = _mm512_loadu_ps(acc + 16);
  __m512 a[2] = {_mm512_permutex2var_ps(x, even, y), _mm512_permutex2var_ps(x, odd, y)};
  const auto token = [&](int t, bool check) {
    if (check && (rescaled >> t & 1) != 0) {
      const __m512 r = _mm512_set1_ps(rescale[t]);
      a[0] = _mm512_mul_ps(a[0], r);
      a[1] = _mm512_mul_ps(a[1], r);
    }
    const __m512 w = _mm512_set1_ps(weight[t]);
    a[0] = _mm512_fmadd_ps(v.f[t][0], w, a[0]);
    a[1] = _mm512_fmadd_ps(v.f[t][1], w, a[1]);
  };
  if (first == 0 && end == kTileTokens && rescaled == 0) {
#pragma GCC unroll 16
    for (int t = 0; t < kTileTokens; ++t) token(t, false);
  } else {
    for (int t = first; t < end; ++t) token(t, true);
  }
  _mm512_storeu_ps(acc, _mm512_permutex2var_ps(a[0], low, a[1]));
  _mm512_storeu_ps(acc + 16, _mm512_permutex2var_ps(a[0], high, a[1]));
}

/// This instruction set's parts of the shared block walk (fused_walk.hpp).
struct Isa {
  using ChunkFloats = fused_avx512::ChunkFloats;
  template <class G, int kOdd, class Exponents>
  static void chunk_floats(const uint8_t* slot, const Exponents& exponents, int o, ChunkFloats& out) {
    fused_avx512::chunk_floats<G, kOdd>(slot, exponents, o, out);
  }
  static void fold_chunk(const ChunkFloats& v, int first, int end, uint32_t rescaled, const float* rescale, const float* weight,
                         float* acc) {
    fused_avx512::fold_chunk(v, first, end, rescaled, rescale, weight, acc);
  }
  static uint32_t rescaled_tokens(const float* rescale) { return fused_avx512::rescaled_tokens(rescale); }
};

}  // namespace

void fold_values(const BlockTask& task, const float* rescale, const float* weight, float* acc) {
  fused::fold_values<Isa>(task, rescale, weight, acc);
}

}  // namespace gaac::attention::fused_avx512

#else  // no AVX-512 in this build

namespace gaac::attention::fused_avx512 {
void fold_values(const BlockTask&, const float*, const float*, float*) {}
}  // namespace gaac::attention::fused_avx512

#endif
