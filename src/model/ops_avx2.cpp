// AVX2 + FMA forward-pass arithmetic: the same operations as the portable versions in ops.cpp, eight
// lanes at a time. Built with -ffp-contract=off so that only the fused multiply-adds written here fuse.
#include "model/ops_avx2.hpp"

#include <cmath>

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

bool cpu_ok() { return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"); }

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

void attend(const AttentionQuery& query, float* out, float* scratch) {
  const int hd = query.head_dim;
  float* q = scratch;
  float* acc = scratch + hd;
  for (int i = 0; i < hd; ++i) {
    q[i] = bf16_to_float(float_to_bf16(query.q[i]));
    acc[i] = 0.0f;
  }
  const int vector_end = hd / 8 * 8;
  float max = -INFINITY, sum = 0.0f;
  for (int p = query.first; p <= query.last; ++p) {
    const size_t at = static_cast<size_t>(p) * query.stride;
    const float s = dot_bf16(query.keys + at, q, hd) * query.scale;
    float rescale = 1.0f, weight = 1.0f;
    if (s > max) {
      rescale = std::exp(max - s);
      max = s;
      const __m256 r = _mm256_set1_ps(rescale);
      int i = 0;
      for (; i < vector_end; i += 8) _mm256_storeu_ps(acc + i, _mm256_mul_ps(_mm256_loadu_ps(acc + i), r));
      for (; i < hd; ++i) acc[i] *= rescale;
    } else {
      weight = std::exp(s - max);
    }
    const uint16_t* v = query.values + at;
    const __m256 w = _mm256_set1_ps(weight);
    int i = 0;
    for (; i < vector_end; i += 8) _mm256_storeu_ps(acc + i, _mm256_fmadd_ps(load_bf16(v + i), w, _mm256_loadu_ps(acc + i)));
    for (; i < hd; ++i) acc[i] = std::fma(bf16_to_float(v[i]), weight, acc[i]);
    sum = std::fma(sum, rescale, weight);  // S·ms + vs, contracted in ggml's build
  }
  const float inverse = sum == 0.0f ? 0.0f : 1.0f / sum;
  const __m256 inv = _mm256_set1_ps(inverse);
  int i = 0;
  for (; i < vector_end; i += 8) _mm256_storeu_ps(out + i, _mm256_mul_ps(_mm256_loadu_ps(acc + i), inv));
  for (; i < hd; ++i) out[i] = acc[i] * inverse;
}

#else  // no AVX2 code in this build

bool available() { return false; }
void swiglu(float* gate, const float* up, size_t n) { portable::swiglu(gate, up, n); }
void attend(const AttentionQuery& query, float* out, float* scratch) { portable::attend(query, out, scratch); }

#endif

}  // namespace gaac::model::ops::avx2
