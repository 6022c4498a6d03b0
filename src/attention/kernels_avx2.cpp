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

/// The K and V rows of tokens first .. end-1 widened to float, `head_dim` apart: done once per block
/// for all the queries of a tile.
void widen_rows(const TileSource* halves, int halves_count, int channels, int first, int end, float* out) {
  const int head_dim = halves_count * channels;
  for (int t = first; t < end; ++t) {
    float* row = out + static_cast<size_t>(t) * head_dim;
    for (int half = 0; half < halves_count; ++half) {
      const uint16_t* src = halves[half].rows[t];
      for (int c = 0; c < channels; c += 8) _mm256_storeu_ps(row + half * channels + c, load_bf16(src + c));
    }
  }
}

/// key_scores_raw over widened rows (the same products and sums: widening BF16 is exact).
void key_scores_widened(const float* k, int head_dim, int first, int end, int heads, const float* q, float scale, float* scores) {
  for (int t = first; t < end; ++t) {
    const float* kt = k + static_cast<size_t>(t) * head_dim;
    for (int g = 0; g < heads; ++g) {
      const float* qg = q + static_cast<size_t>(g) * head_dim;
      __m256 c1 = _mm256_setzero_ps(), c2 = c1, c3 = c1, c4 = c1;
      for (int i = 0; i < head_dim; i += 32) {
        c1 = _mm256_add_ps(_mm256_mul_ps(_mm256_loadu_ps(kt + i), _mm256_loadu_ps(qg + i)), c1);
        c2 = _mm256_add_ps(_mm256_mul_ps(_mm256_loadu_ps(kt + i + 8), _mm256_loadu_ps(qg + i + 8)), c2);
        c3 = _mm256_add_ps(_mm256_mul_ps(_mm256_loadu_ps(kt + i + 16), _mm256_loadu_ps(qg + i + 16)), c3);
        c4 = _mm256_add_ps(_mm256_mul_ps(_mm256_loadu_ps(kt + i + 24), _mm256_loadu_ps(qg + i + 24)), c4);
      }
      scores[g * kTileTokens + t] = reduce(c1, c2, c3, c4) * scale;
    }
  }
}

/// fold_values_raw over widened rows.
void fold_values_widened(const float* v, int head_dim, int first, int end, int heads, const float* rescale, const float* weight,
                         float* acc) {
  for (int g = 0; g < heads; ++g) {
    const float* rg = rescale + g * kTileTokens;
    const float* wg = weight + g * kTileTokens;
    for (int offset = 0; offset < head_dim; offset += 64) {
      float* ag = acc + static_cast<size_t>(g) * head_dim + offset;
      __m256 a[8];
      for (int k = 0; k < 8; ++k) a[k] = _mm256_loadu_ps(ag + 8 * k);
      for (int t = first; t < end; ++t) {
        if (rg[t] != 1.0f) {
          const __m256 r = _mm256_set1_ps(rg[t]);
          for (int k = 0; k < 8; ++k) a[k] = _mm256_mul_ps(a[k], r);
        }
        const __m256 w = _mm256_set1_ps(wg[t]);
        const float* vt = v + static_cast<size_t>(t) * head_dim + offset;
        for (int k = 0; k < 8; ++k) a[k] = _mm256_fmadd_ps(_mm256_loadu_ps(vt + 8 * k), w, a[k]);
      }
      for (int k = 0; k < 8; ++k) _mm256_storeu_ps(ag + 8 * k, a[k]);
    }
  }
}

/// The block's K and V rows widened once, then each query of the tile in turn.
void query_tile(const QueryTileTask& task) {
  const int channels = task.tile_channels, head_dim = task.halves_count * channels;
  float* k = task.scratch;
  float* v = k + static_cast<size_t>(kTileTokens) * head_dim;
  float* scores = v + static_cast<size_t>(kTileTokens) * head_dim;
  float* rescale = scores + kTileTokens * task.heads;
  float* weight = rescale + kTileTokens * task.heads;
  widen_rows(task.k, task.halves_count, channels, task.first, task.end, k);
  widen_rows(task.v, task.halves_count, channels, task.first, task.end, v);
  for (int i = 0; i < task.count; ++i) {
    const TileQuery& query = task.queries[i];
    if (query.end <= query.first) continue;
    key_scores_widened(k, head_dim, query.first, query.end, task.heads, query.q, task.scale, scores);
    for (int h = 0; h < task.heads; ++h) {
      online_softmax(scores + h * kTileTokens, query.first, query.end, query.partials[h], rescale + h * kTileTokens,
                     weight + h * kTileTokens);
    }
    fold_values_widened(v, head_dim, query.first, query.end, task.heads, rescale, weight, query.acc);
  }
}

}  // namespace

const Kernels* avx2_kernels() {
  static const Kernels kernels{key_scores_raw,          fold_values_raw,           fused_avx2::key_scores,
                               fused_avx2::fold_values, fused_avx2::prepare_query, query_tile,
                               "avx2"};
  static const Kernels* available = cpu_features().avx2_set() ? &kernels : nullptr;
  return available;
}

const Kernels* avx512_kernels() {
  static const Kernels kernels{key_scores_raw,            fold_values_raw,             fused_avx512::key_scores,
                               fused_avx512::fold_values, fused_avx512::prepare_query, query_tile,
                               "avx512"};
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
