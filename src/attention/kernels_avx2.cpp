// AVX2 + FMA attention kernels over BF16 rows: the contract's lanes are four 8-float registers, and a
// block's value rows fold into 64 accumulators held in registers. Compressed slots go to the fused
// kernels (fused_avx2.hpp). Built with -mavx2 -mfma -mf16c -ffp-contract=off, so that only the
// written fused multiply-adds fuse.
#include "attention/fused_avx2.hpp"
#include "attention/fused_avx512.hpp"
#include "attention/tile_kernels.hpp"
#include "common/cpu.hpp"

#if (defined(__x86_64__) || defined(_M_X64)) && defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>

namespace gaac::attention {
namespace {

__m256 load_bf16(const uint16_t* p) {
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))), 16));
}

/// The contract's reduction of lanes c1 (0..7), c2 (8..15), c3 (16..23), c4 (24..31).
float reduce(__m256 c1, __m256 c2, __m256 c3, __m256 c4) {
  const __m256 v = _mm256_add_ps(_mm256_add_ps(c1, c3), _mm256_add_ps(c2, c4));
  __m128 s = _mm_add_ps(_mm256_extractf128_ps(v, 1), _mm256_castps256_ps128(v));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

void key_scores_raw(const BlockTask& task, const float* q, float scale, float* scores) {
  const int channels = task.tile_channels, head_dim = task.halves_count * channels;
  for (int t = task.first; t < task.end; ++t) {
    for (int g = 0; g < task.heads; ++g) {
      const float* qg = q + static_cast<size_t>(g) * head_dim;
      __m256 c1 = _mm256_setzero_ps(), c2 = c1, c3 = c1, c4 = c1;
      for (int half = 0; half < task.halves_count; ++half) {
        const uint16_t* k = task.halves[half].rows[t];
        const float* qh = qg + half * channels;
        for (int i = 0; i < channels; i += 32) {
          c1 = _mm256_add_ps(_mm256_mul_ps(load_bf16(k + i), _mm256_loadu_ps(qh + i)), c1);
          c2 = _mm256_add_ps(_mm256_mul_ps(load_bf16(k + i + 8), _mm256_loadu_ps(qh + i + 8)), c2);
          c3 = _mm256_add_ps(_mm256_mul_ps(load_bf16(k + i + 16), _mm256_loadu_ps(qh + i + 16)), c3);
          c4 = _mm256_add_ps(_mm256_mul_ps(load_bf16(k + i + 24), _mm256_loadu_ps(qh + i + 24)), c4);
        }
      }
      scores[g * kTileTokens + t] = reduce(c1, c2, c3, c4) * scale;
    }
  }
}

/// Folds 64 channels of one head over the block's tokens, the accumulators in registers.
void fold_chunk(const BlockTask& task, int half, int offset, const float* rescale, const float* weight, float* acc) {
  __m256 a[8];
  for (int k = 0; k < 8; ++k) a[k] = _mm256_loadu_ps(acc + 8 * k);
  for (int t = task.first; t < task.end; ++t) {
    if (rescale[t] != 1.0f) {
      const __m256 r = _mm256_set1_ps(rescale[t]);
      for (int k = 0; k < 8; ++k) a[k] = _mm256_mul_ps(a[k], r);
    }
    const __m256 w = _mm256_set1_ps(weight[t]);
    const uint16_t* v = task.halves[half].rows[t] + offset;
    for (int k = 0; k < 8; ++k) a[k] = _mm256_fmadd_ps(load_bf16(v + 8 * k), w, a[k]);
  }
  for (int k = 0; k < 8; ++k) _mm256_storeu_ps(acc + 8 * k, a[k]);
}

void fold_values_raw(const BlockTask& task, const float* rescale, const float* weight, float* acc) {
  const int channels = task.tile_channels, head_dim = task.halves_count * channels;
  for (int g = 0; g < task.heads; ++g) {
    for (int half = 0; half < task.halves_count; ++half) {
      for (int offset = 0; offset < channels; offset += 64) {
        fold_chunk(task, half, offset, rescale + g * kTileTokens, weight + g * kTileTokens,
                   acc + static_cast<size_t>(g) * head_dim + half * channels + offset);
      }
    }
  }
}

}  // namespace

const Kernels* avx2_kernels() {
  static const Kernels kernels{key_scores_raw,         fold_values_raw,           fused_avx2::key_scores,
                               fused_avx2::fold_values, fused_avx2::prepare_query, "avx2"};
  static const Kernels* available = cpu_features().avx2_set() ? &kernels : nullptr;
  return available;
}

const Kernels* avx512_kernels() {
  static const Kernels kernels{key_scores_raw,           fold_values_raw,             fused_avx512::key_scores,
                               fused_avx512::fold_values, fused_avx512::prepare_query, "avx512"};
  static const Kernels* available = fused_avx512::compiled() && cpu_features().avx512_set() ? &kernels : nullptr;
  return available;
}

}  // namespace gaac::attention

#else  // no AVX2 in this build

namespace gaac::attention {
const Kernels* avx2_kernels() { return nullptr; }
const Kernels* avx512_kernels() { return nullptr; }
}  // namespace gaac::attention

#endif
