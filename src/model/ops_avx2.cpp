// AVX2 + FMA forward-pass arithmetic: the same operations as the portable versions in ops.cpp, eight
// lanes at a time. Built with -ffp-contract=off so that only the fused multiply-adds written here fuse.
#include "model/ops_avx2.hpp"

#include <bit>
#include <cmath>
#include <cstdint>

#include "attention/expf.hpp"
#include "common/cpu.hpp"
#include "gaac/bf16.hpp"

#if (defined(__x86_64__) || defined(_M_X64)) && defined(__AVX2__) && defined(__FMA__)
#define GAAC_OPS_AVX2 1
#include <immintrin.h>
#endif

namespace gaac::model::ops::avx2 {

#if defined(GAAC_OPS_AVX2)

namespace {

/// ops::exp_polynomial on eight lanes.
__m256 exp_polynomial(__m256 x) {
  const __m256 shift = _mm256_set1_ps(0x1.8p23f);
  const __m256 z = _mm256_fmadd_ps(x, _mm256_set1_ps(0x1.715476p+0f), shift);
  const __m256 n = _mm256_sub_ps(z, shift);
  const __m256 b = _mm256_fnmadd_ps(n, _mm256_set1_ps(0x1.7f7d1cp-20f), _mm256_fnmadd_ps(n, _mm256_set1_ps(0x1.62e4p-1f), x));
  const __m256i e = _mm256_slli_epi32(_mm256_castps_si256(z), 23);
  const __m256 k = _mm256_castsi256_ps(_mm256_add_epi32(e, _mm256_castps_si256(_mm256_set1_ps(1.0f))));
  const __m256 abs_n = _mm256_andnot_ps(_mm256_set1_ps(-0.0f), n);
  const __m256 large = _mm256_cmp_ps(abs_n, _mm256_set1_ps(126.0f), _CMP_GT_OQ);
  const __m256 u = _mm256_mul_ps(b, b);
  const __m256 j = _mm256_fmadd_ps(
      _mm256_fmadd_ps(_mm256_fmadd_ps(_mm256_set1_ps(0x1.0e4020p-7f), b, _mm256_set1_ps(0x1.573e2ep-5f)), u,
                      _mm256_fmadd_ps(_mm256_set1_ps(0x1.555e66p-3f), b, _mm256_set1_ps(0x1.fffdb6p-2f))),
      u, _mm256_mul_ps(_mm256_set1_ps(0x1.ffffecp-1f), b));
  const __m256 normal = _mm256_fmadd_ps(k, j, k);
  if (!_mm256_movemask_ps(large)) return normal;
  const __m256i d = _mm256_and_si256(_mm256_castps_si256(_mm256_cmp_ps(n, _mm256_setzero_ps(), _CMP_LE_OQ)),
                                     _mm256_set1_epi32(static_cast<int>(0x82000000u)));
  const __m256 s1 = _mm256_castsi256_ps(_mm256_add_epi32(d, _mm256_set1_epi32(0x7f000000)));
  const __m256 s2 = _mm256_castsi256_ps(_mm256_sub_epi32(e, d));
  const __m256 huge = _mm256_cmp_ps(abs_n, _mm256_set1_ps(192.0f), _CMP_GT_OQ);
  const __m256 scaled = _mm256_mul_ps(_mm256_fmadd_ps(s2, j, s2), s1);
  return _mm256_blendv_ps(_mm256_blendv_ps(normal, scaled, large), _mm256_mul_ps(s1, s1), huge);
}

__m256 load_bf16(const uint16_t* p) {
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))), 16));
}

float hsum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_extractf128_ps(v, 1), _mm256_castps256_ps128(v));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

}  // namespace

namespace {


/// K·Q with Q already rounded to BF16 and widened: four 8-lane accumulators, multiply then add.
float dot_bf16(const uint16_t* k, const float* q, int n) {
  __m256 c1 = _mm256_setzero_ps(), c2 = c1, c3 = c1, c4 = c1;
  int i = 0;
  for (; i + 32 <= n; i += 32) {
    c1 = _mm256_add_ps(_mm256_mul_ps(load_bf16(k + i), _mm256_loadu_ps(q + i)), c1);
    c2 = _mm256_add_ps(_mm256_mul_ps(load_bf16(k + i + 8), _mm256_loadu_ps(q + i + 8)), c2);
    c3 = _mm256_add_ps(_mm256_mul_ps(load_bf16(k + i + 16), _mm256_loadu_ps(q + i + 16)), c3);
    c4 = _mm256_add_ps(_mm256_mul_ps(load_bf16(k + i + 24), _mm256_loadu_ps(q + i + 24)), c4);
  }
  double sum = hsum(_mm256_add_ps(_mm256_add_ps(c1, c3), _mm256_add_ps(c2, c4)));
  for (; i < n; ++i) sum += static_cast<double>(bf16_to_float(k[i]) * q[i]);
  return static_cast<float>(sum);
}

/// Folds `n` V rows into kVectors·8 accumulators held in registers: for each position j, acc·ms[j]
/// (skipped when ms[j] is 1, which changes no bit), then fma(v, vs[j], acc).
template <int kVectors>
void fold_chunk(const uint16_t* v, size_t stride, size_t n, const float* ms, const float* vs, float* acc) {
  __m256 a[kVectors];
  for (int k = 0; k < kVectors; ++k) a[k] = _mm256_loadu_ps(acc + 8 * k);
  for (size_t j = 0; j < n; ++j, v += stride) {
    if (ms[j] != 1.0f) {
      const __m256 r = _mm256_set1_ps(ms[j]);
      for (int k = 0; k < kVectors; ++k) a[k] = _mm256_mul_ps(a[k], r);
    }
    const __m256 w = _mm256_set1_ps(vs[j]);
    for (int k = 0; k < kVectors; ++k) a[k] = _mm256_fmadd_ps(load_bf16(v + 8 * k), w, a[k]);
  }
  for (int k = 0; k < kVectors; ++k) _mm256_storeu_ps(acc + 8 * k, a[k]);
}

bool cpu_ok() { return cpu_features().avx2_set(); }

}  // namespace

bool available() {
  static const bool ok = cpu_ok();
  return ok;
}

void swiglu(float* gate, const float* up, size_t n) {
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 x = _mm256_loadu_ps(gate + i);
    const __m256 silu = _mm256_div_ps(x, _mm256_add_ps(_mm256_set1_ps(1.0f), exp_polynomial(_mm256_sub_ps(_mm256_setzero_ps(), x))));
    _mm256_storeu_ps(gate + i, _mm256_mul_ps(silu, _mm256_loadu_ps(up + i)));
  }
  if (i < n) portable::swiglu(gate + i, up + i, n - i);
}

void attend(const AttentionQuery& query, float* out, std::vector<float>& scratch) {
  // The portable version's arithmetic in four passes: every score; the running maximum and with it
  // each exponential's argument; the exponentials, eight at a time; then the fold of the V rows in
  // position order. Every value is computed by the same operations on the same operands.
  const int hd = query.head_dim;
  const size_t n = query.last >= query.first ? static_cast<size_t>(query.last - query.first + 1) : 0;
  scratch.resize(2 * static_cast<size_t>(hd) + 2 * n);
  float* q = scratch.data();
  float* acc = q + hd;
  float* scores = acc + hd;
  float* e = scores + n;
  for (int i = 0; i < hd; ++i) {
    q[i] = bf16_to_float(float_to_bf16(query.q[i]));
    acc[i] = 0.0f;
  }
  const uint16_t* keys = query.keys + static_cast<size_t>(query.first) * query.stride;
  const uint16_t* values = query.values + static_cast<size_t>(query.first) * query.stride;
  for (size_t j = 0; j < n; ++j) scores[j] = dot_bf16(keys + j * query.stride, q, hd) * query.scale;

  // A score above the running maximum rescales what came before by e^(max − s) and weighs its own V
  // row by 1; any other score weighs its row by e^(s − max).
  float max = -INFINITY;
  for (size_t j = 0; j < n; ++j) {
    const float s = scores[j];
    if (s > max) {
      e[j] = max - s;
      max = s;
    } else {
      e[j] = s - max;
    }
  }
  attention::expf_in_place(e, n);

  // Per position: the factor ms applied to the accumulator first (1 unless the maximum rose) and the
  // weight vs of its V row; then the sum S = S·ms + vs, contracted in ggml's build.
  float* weights = scores;  // the scores are no longer needed once read below; reuse them for vs
  float sum = 0.0f;
  max = -INFINITY;
  for (size_t j = 0; j < n; ++j) {
    float rescale = 1.0f, weight = 1.0f;
    if (scores[j] > max) {
      max = scores[j];
      rescale = e[j];
    } else {
      weight = e[j];
    }
    e[j] = rescale;
    weights[j] = weight;
    sum = std::fma(sum, rescale, weight);
  }

  // The fold acc = acc·ms + v·vs (the multiply-add fused, as ggml's), 64 channels at a time kept in
  // registers across all positions.
  int i = 0;
  for (; i + 64 <= hd; i += 64) fold_chunk<8>(values + i, query.stride, n, e, weights, acc + i);
  for (; i + 8 <= hd; i += 8) fold_chunk<1>(values + i, query.stride, n, e, weights, acc + i);
  for (; i < hd; ++i) {
    for (size_t j = 0; j < n; ++j) {
      acc[i] *= e[j];
      acc[i] = std::fma(bf16_to_float(values[j * query.stride + static_cast<size_t>(i)]), weights[j], acc[i]);
    }
  }

  const float inverse = sum == 0.0f ? 0.0f : 1.0f / sum;
  const __m256 inv = _mm256_set1_ps(inverse);
  i = 0;
  for (; i + 8 <= hd; i += 8) _mm256_storeu_ps(out + i, _mm256_mul_ps(_mm256_loadu_ps(acc + i), inv));
  for (; i < hd; ++i) out[i] = acc[i] * inverse;
}

#else  // no AVX2 code in this build

bool available() { return false; }
void swiglu(float* gate, const float* up, size_t n) { portable::swiglu(gate, up, n); }
void attend(const AttentionQuery& query, float* out, std::vector<float>& scratch) { portable::attend(query, out, scratch); }

#endif

}  // namespace gaac::model::ops::avx2
