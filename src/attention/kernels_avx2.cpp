// AVX2 + FMA attention kernels over BF16 rows: the contract's lanes are four 8-float registers, and a
// block's value rows fold into 64 accumulators held in registers. Compressed slots go to the fused
// kernels (fused_avx2.hpp). Built with -mavx2 -mfma -mf16c -ffp-contract=off, so that only the
// written fused multiply-adds fuse.
#include <algorithm>
#include <cmath>

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

/// The contract's 32 lanes of one widened key row times one query, combined as (c1 + c3) + (c2 + c4).
inline __m256 lane_vector(const float* k, const float* q, int head_dim) {
  __m256 c1 = _mm256_setzero_ps(), c2 = c1, c3 = c1, c4 = c1;
  for (int i = 0; i < head_dim; i += 32) {
    c1 = _mm256_add_ps(_mm256_mul_ps(_mm256_loadu_ps(k + i), _mm256_loadu_ps(q + i)), c1);
    c2 = _mm256_add_ps(_mm256_mul_ps(_mm256_loadu_ps(k + i + 8), _mm256_loadu_ps(q + i + 8)), c2);
    c3 = _mm256_add_ps(_mm256_mul_ps(_mm256_loadu_ps(k + i + 16), _mm256_loadu_ps(q + i + 16)), c3);
    c4 = _mm256_add_ps(_mm256_mul_ps(_mm256_loadu_ps(k + i + 24), _mm256_loadu_ps(q + i + 24)), c4);
  }
  return _mm256_add_ps(_mm256_add_ps(c1, c3), _mm256_add_ps(c2, c4));
}

/// The rest of the contract's reduction for one lane vector v: (h0 + h2) + (h1 + h3), h_l = v[4+l] + v[l].
inline float reduce_vector(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_extractf128_ps(v, 1), _mm256_castps256_ps128(v));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

/// reduce_vector of eight lane vectors at once, the same additions of the same operands lane by lane:
/// result j is reduce_vector(v[j]).
inline __m256 reduce_vectors(const __m256* v) {
  const auto halves = [](__m256 a, __m256 b) {  // [a.hi + a.lo | b.hi + b.lo]: h of a, h of b
    return _mm256_add_ps(_mm256_permute2f128_ps(a, b, 0x31), _mm256_permute2f128_ps(a, b, 0x20));
  };
  const auto pairs = [](__m256 a, __m256 b) {  // per 128-bit half: [a0 + a2, a1 + a3, b0 + b2, b1 + b3]
    return _mm256_add_ps(_mm256_shuffle_ps(a, b, _MM_SHUFFLE(1, 0, 1, 0)), _mm256_shuffle_ps(a, b, _MM_SHUFFLE(3, 2, 3, 2)));
  };
  const __m256 abcd = pairs(halves(v[0], v[1]), halves(v[2], v[3]));  // [A02 A13 C02 C13 | B02 B13 D02 D13]
  const __m256 efgh = pairs(halves(v[4], v[5]), halves(v[6], v[7]));
  const __m256 r = _mm256_add_ps(_mm256_shuffle_ps(abcd, efgh, _MM_SHUFFLE(2, 0, 2, 0)),
                                 _mm256_shuffle_ps(abcd, efgh, _MM_SHUFFLE(3, 1, 3, 1)));  // [A C E G | B D F H]
  return _mm256_permutevar8x32_ps(r, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
}

/// Folds widened value rows first .. end-1 into one lane's accumulators (head_dim floats), with the
/// factors of token t at rescale[t · stride] and weight[t · stride]: fold_values_raw's arithmetic.
void fold_lane(const float* v, int head_dim, int first, int end, const float* rescale, const float* weight, size_t stride,
               float* acc) {
  for (int offset = 0; offset < head_dim; offset += 64) {
    __m256 a[8];
    for (int k = 0; k < 8; ++k) a[k] = _mm256_loadu_ps(acc + offset + 8 * k);
    for (int t = first; t < end; ++t) {
      const float r = rescale[static_cast<size_t>(t) * stride];
      if (r != 1.0f) {
        const __m256 rv = _mm256_set1_ps(r);
        for (int k = 0; k < 8; ++k) a[k] = _mm256_mul_ps(a[k], rv);
      }
      const __m256 w = _mm256_set1_ps(weight[static_cast<size_t>(t) * stride]);
      const float* vt = v + static_cast<size_t>(t) * head_dim + offset;
      for (int k = 0; k < 8; ++k) a[k] = _mm256_fmadd_ps(_mm256_loadu_ps(vt + 8 * k), w, a[k]);
    }
    for (int k = 0; k < 8; ++k) _mm256_storeu_ps(acc + offset + 8 * k, a[k]);
  }
}

/// lane_vector with the head width known when compiling (0: not known), so that a 64-wide key row
/// stays in registers while the lanes' queries stream past.
template <int kWidth>
inline __m256 lane_vector_of(const float* k, const float* q, int head_dim) {
  if constexpr (kWidth == 0) {
    return lane_vector(k, q, head_dim);
  } else {
    return lane_vector(k, q, kWidth);
  }
}

/// Every lane's score for tokens first .. end-1 of a block, `stride` per token (padding lanes 0).
template <int kWidth>
void block_scores(const QueryTileTask& task, const float* k, int lanes, size_t stride, float* scores) {
  const int head_dim = kWidth == 0 ? task.halves_count * task.tile_channels : kWidth;
  const __m256 scale = _mm256_set1_ps(task.scale);
  for (int t = task.first; t < task.end; ++t) {
    const float* kt = k + static_cast<size_t>(t) * head_dim;
    float* row = scores + static_cast<size_t>(t) * stride;
    int j = 0;
    for (; j + 8 <= lanes; j += 8) {
      __m256 vectors[8];
      for (int l = 0; l < 8; ++l) vectors[l] = lane_vector_of<kWidth>(kt, task.q + static_cast<size_t>(j + l) * head_dim, head_dim);
      _mm256_storeu_ps(row + j, _mm256_mul_ps(reduce_vectors(vectors), scale));
    }
    for (; j < lanes; ++j) row[j] = reduce_vector(lane_vector_of<kWidth>(kt, task.q + static_cast<size_t>(j) * head_dim, head_dim)) * task.scale;
    for (; j < static_cast<int>(stride); ++j) row[j] = 0.0f;  // padding lanes: finite, never folded
  }
}

/// A block every query attends whole: scores for all lanes (eight reduced at once), the online
/// softmax of eight lanes per vector (each lane's steps in position order, as online_softmax takes
/// them), then each lane's fold. `stride` lanes (a multiple of 8) per token in the scratch rows.
void full_block(const QueryTileTask& task, const float* k, const float* v, int head_dim, int lanes, size_t stride, float* scores,
                float* factors, float* weights, float* max, float* sum) {
  const int first = task.first, end = task.end;
  if (head_dim == 64) {
    block_scores<64>(task, k, lanes, stride, scores);
  } else {
    block_scores<0>(task, k, lanes, stride, scores);
  }
  const __m256 one = _mm256_set1_ps(1.0f);
  for (size_t j = 0; j < stride; j += 8) {
    __m256 m = _mm256_loadu_ps(max + j);
    for (int t = first; t < end; ++t) {
      const __m256 s = _mm256_loadu_ps(scores + static_cast<size_t>(t) * stride + j);
      const __m256 above = _mm256_cmp_ps(s, m, _CMP_GT_OQ);
      _mm256_storeu_ps(factors + static_cast<size_t>(t) * stride + j, _mm256_blendv_ps(_mm256_sub_ps(s, m), _mm256_sub_ps(m, s), above));
      m = _mm256_blendv_ps(m, s, above);
    }
  }
  expf_in_place(factors + static_cast<size_t>(first) * stride, static_cast<size_t>(end - first) * stride);
  for (size_t j = 0; j < stride; j += 8) {
    __m256 m = _mm256_loadu_ps(max + j), total = _mm256_loadu_ps(sum + j);
    for (int t = first; t < end; ++t) {
      const size_t at = static_cast<size_t>(t) * stride + j;
      const __m256 s = _mm256_loadu_ps(scores + at), e = _mm256_loadu_ps(factors + at);
      const __m256 above = _mm256_cmp_ps(s, m, _CMP_GT_OQ);
      m = _mm256_blendv_ps(m, s, above);
      const __m256 r = _mm256_blendv_ps(one, e, above), w = _mm256_blendv_ps(e, one, above);
      total = _mm256_fmadd_ps(total, r, w);
      _mm256_storeu_ps(factors + at, r);
      _mm256_storeu_ps(weights + at, w);
    }
    _mm256_storeu_ps(max + j, m);
    _mm256_storeu_ps(sum + j, total);
  }
  for (int l = 0; l < lanes; ++l) {
    fold_lane(v, head_dim, first, end, factors + l, weights + l, stride, task.acc + static_cast<size_t>(l) * head_dim);
  }
}

/// The block's K and V rows widened once; a block every query attends whole goes through
/// full_block, any other query by query.
void query_tile(const QueryTileTask& task) {
  const int channels = task.tile_channels, head_dim = task.halves_count * channels, lanes = task.count * task.heads;
  const size_t stride = (static_cast<size_t>(lanes) + 7) / 8 * 8;
  float* k = task.scratch;
  float* v = k + static_cast<size_t>(kTileTokens) * head_dim;
  float* scores = v + static_cast<size_t>(kTileTokens) * head_dim;
  float* factors = scores + kTileTokens * stride;
  float* weights = factors + kTileTokens * stride;
  float* max = weights + kTileTokens * stride;
  float* sum = max + stride;
  widen_rows(task.k, task.halves_count, channels, task.first, task.end, k);
  widen_rows(task.v, task.halves_count, channels, task.first, task.end, v);
  bool whole = true;
  for (int i = 0; i < task.count; ++i) whole = whole && task.ranges[i].first == task.first && task.ranges[i].end == task.end;
  if (whole) {
    std::copy(task.max, task.max + lanes, max);
    std::copy(task.sum, task.sum + lanes, sum);
    std::fill(max + lanes, max + stride, -INFINITY);
    std::fill(sum + lanes, sum + stride, 0.0f);
    full_block(task, k, v, head_dim, lanes, stride, scores, factors, weights, max, sum);
    std::copy(max, max + lanes, task.max);
    std::copy(sum, sum + lanes, task.sum);
    return;
  }
  for (int i = 0; i < task.count; ++i) {
    const TokenRange r = task.ranges[i];
    if (r.end <= r.first) continue;
    for (int h = 0; h < task.heads; ++h) {
      const size_t lane = static_cast<size_t>(i) * task.heads + h;
      float* s = scores + h * kTileTokens;
      for (int t = r.first; t < r.end; ++t) {
        s[t] = reduce_vector(lane_vector(k + static_cast<size_t>(t) * head_dim, task.q + lane * head_dim, head_dim)) * task.scale;
      }
      Partial part{task.max[lane], task.sum[lane]};
      online_softmax(s, r.first, r.end, part, factors + h * kTileTokens, weights + h * kTileTokens);
      task.max[lane] = part.max;
      task.sum[lane] = part.sum;
      fold_lane(v, head_dim, r.first, r.end, factors + h * kTileTokens, weights + h * kTileTokens, 1, task.acc + lane * head_dim);
    }
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
