// The vector expf of expf.hpp: the C library's algorithm for expf, eight lanes at a time in AVX2.
// Built with -mavx2 -mfma -ffp-contract=off; called only where the CPU has both.
#include "attention/expf.hpp"

#include <bit>
#include <cmath>
#include <cstdint>

#include "common/cpu.hpp"

#if (defined(__x86_64__) || defined(_M_X64)) && defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>

namespace gaac::attention {
namespace {

// expf as the C library computes it (glibc ≥ 2.28 on x86-64 with FMA, the variant it selects on
// such CPUs; the same code as Arm optimized-routines): e^x = 2^(k/32) · p(r) in double, with a 32-entry
// table of 2^(i/32), then rounded to float once. Exact agreement with the library's expf was checked on
// every float in [−103.97, 0] (1.12·10⁹ inputs); at run time a sample check decides whether this
// library is the same, else the library's expf is called instead (exp_matches_library).
struct ExpTable {
  alignas(32) uint64_t bits[32];
  ExpTable() {
    for (int i = 0; i < 32; ++i) {
      bits[i] = std::bit_cast<uint64_t>(std::exp2(static_cast<double>(i) / 32)) - (static_cast<uint64_t>(i) << 52) / 32;
    }
  }
};
const ExpTable kExpTable;

/// Eight expf results; lanes with |x| ≥ 88 or NaN (the library's special cases) call the library.
__m256 exp_like_library(__m256 x) {
  const __m256d inv_ln2_n = _mm256_set1_pd(0x1.71547652b82fep0 * 32), shift = _mm256_set1_pd(0x1.8p+52);
  const __m256d c0 = _mm256_set1_pd(0x1.c6af84b912394p-5 / 32 / 32 / 32), c1 = _mm256_set1_pd(0x1.ebfce50fac4f3p-3 / 32 / 32);
  const __m256d c2 = _mm256_set1_pd(0x1.62e42ff0c52d6p-1 / 32), one = _mm256_set1_pd(1.0);
  const auto half = [&](__m128 xf) {
    const __m256d xd = _mm256_cvtps_pd(xf);
    __m256d kd = _mm256_fmadd_pd(inv_ln2_n, xd, shift);
    const __m256i ki = _mm256_castpd_si256(kd);
    kd = _mm256_sub_pd(kd, shift);
    const __m256d r = _mm256_fmsub_pd(inv_ln2_n, xd, kd);
    const __m256i t = _mm256_add_epi64(
        _mm256_i64gather_epi64(reinterpret_cast<const long long*>(kExpTable.bits), _mm256_and_si256(ki, _mm256_set1_epi64x(31)), 8),
        _mm256_slli_epi64(ki, 47));
    const __m256d z = _mm256_fmadd_pd(c0, r, c1);
    const __m256d r2 = _mm256_mul_pd(r, r);
    __m256d y = _mm256_fmadd_pd(c2, r, one);
    y = _mm256_fmadd_pd(z, r2, y);
    return _mm256_cvtpd_ps(_mm256_mul_pd(y, _mm256_castsi256_pd(t)));
  };
  __m256 result = _mm256_set_m128(half(_mm256_extractf128_ps(x, 1)), half(_mm256_castps256_ps128(x)));
  // |x| ≥ 88 (or NaN, infinity): the library's own path.
  const __m256 special = _mm256_cmp_ps(_mm256_andnot_ps(_mm256_set1_ps(-0.0f), x), _mm256_set1_ps(88.0f), _CMP_NLT_UQ);
  if (const int mask = _mm256_movemask_ps(special)) {
    alignas(32) float in[8], out[8];
    _mm256_store_ps(in, x);
    _mm256_store_ps(out, result);
    for (int i = 0; i < 8; ++i) {
      if (mask & (1 << i)) out[i] = std::exp(in[i]);
    }
    result = _mm256_load_ps(out);
  }
  return result;
}

/// Whether exp_like_library returns the C library's expf bits, on a sample across its range.
bool exp_matches_library() {
  alignas(32) float in[8], out[8];
  for (uint32_t bits = 0x80000000u; bits < 0xC2D00000u; bits += 0x8000u * 8 + 12345) {
    for (int i = 0; i < 8; ++i) in[i] = std::bit_cast<float>(bits + static_cast<uint32_t>(i) * 0x8000u);
    _mm256_store_ps(out, exp_like_library(_mm256_load_ps(in)));
    for (int i = 0; i < 8; ++i) {
      if (std::bit_cast<uint32_t>(out[i]) != std::bit_cast<uint32_t>(std::exp(in[i]))) return false;
    }
  }
  return true;
}

}  // namespace

bool expf_vectorised() {
  static const bool vector = cpu_features().avx2_set() && exp_matches_library();
  return vector;
}

void expf_in_place(float* x, size_t n) {
  size_t i = 0;
  if (expf_vectorised()) {
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(x + i, exp_like_library(_mm256_loadu_ps(x + i)));
  }
  for (; i < n; ++i) x[i] = std::exp(x[i]);
}

}  // namespace gaac::attention

#else  // no AVX2 in this build

namespace gaac::attention {
bool expf_vectorised() { return false; }
void expf_in_place(float* x, size_t n) {
  for (size_t i = 0; i < n; ++i) x[i] = std::exp(x[i]);
}
}  // namespace gaac::attention

#endif
