// AVX2 + FMA + F16C dequantization and matmul_rows.
//
// Every format is decoded by one `emit` function per type that turns a block into float vectors,
// 32 elements (four __m256) at a time, and hands them to a sink. Quants are widened to 32-bit lanes
// either straight from memory (vpmovzxbd, for plain nibbles) or after byte-wide bit assembly over 32
// quants at once (for formats with extra high bits), whichever measured faster. The sink decides what happens:
// dequantize_row stores them; the decode path (one token) multiplies them straight into the dot
// product, so a weight row is read once and never stored.
//
// The dequantized values are bit-identical to the reference: the same float expressions in the same
// order, each rounded as the reference rounds it. The file is built with -ffp-contract=off, so the
// compiler never fuses a multiply and an add on its own; the one place the decoders use an explicit
// FMA is where the product is exact, so that it rounds like mul-then-add (see exact_fma below).
// Scales are converted with F16C, which agrees with the reference's fp16_to_float on all 65,536
// patterns (tested).
//
// Prefill (several tokens): the weights are dequantized 4 rows × up to 1024 columns at a time into a
// 16 KiB buffer that stays in L1, and every token of a block of up to 64 (whose activations stay in
// L2) is multiplied against it by a register-blocked kernel: 4 rows × 3 tokens, 12 independent
// 8-wide FMA accumulators per column step. Partial sums of successive column chunks are added into Y.
#include <algorithm>
#include <cstring>
#include <type_traits>

#include "common/cpu.hpp"
#include "gaac/error.hpp"
#include "model/k_quant_scales.hpp"
#include "model/quants.hpp"

#if (defined(__x86_64__) || defined(_M_X64)) && defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#define GAAC_QUANTS_AVX2 1
#include <immintrin.h>
#endif

namespace gaac::model::avx2 {

#if defined(GAAC_QUANTS_AVX2)

namespace {

// ----------------------------------------------------------------------------------------------
// Small helpers

inline float half_at(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, sizeof h);
  return _cvtsh_ss(h);
}
inline __m128i load128(const uint8_t* p) { return _mm_loadu_si128(reinterpret_cast<const __m128i*>(p)); }
inline __m256i load256(const uint8_t* p) { return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)); }
inline __m256i byte_splat(int v) { return _mm256_set1_epi8(static_cast<char>(v)); }

/// 32 signed bytes as four vectors of 8 floats, in order.
struct Four {
  __m256 v[4];
};
inline Four i8x32_to_ps(__m256i bytes) {
  const __m128i lo = _mm256_castsi256_si128(bytes), hi = _mm256_extracti128_si256(bytes, 1);
  const auto widen = [](__m128i v) { return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(v)); };
  return {{widen(lo), widen(_mm_srli_si128(lo, 8)), widen(hi), widen(_mm_srli_si128(hi, 8))}};
}

/// 16 bytes of nibbles → 32 bytes: low nibbles (elements 0..15), then high nibbles (16..31).
inline __m256i split_nibbles16(const uint8_t* p) {
  const __m128i q = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  const __m128i mask = _mm_set1_epi8(15);
  const __m128i lo = _mm_and_si128(q, mask), hi = _mm_and_si128(_mm_srli_epi16(q, 4), mask);
  return _mm256_inserti128_si256(_mm256_castsi128_si256(lo), hi, 1);
}

/// The 32 bits of `h` as 32 bytes of 0 or 16 (byte j ← bit j).
inline __m256i bits_to_16(uint32_t h) {
  const __m256i spread = _mm256_shuffle_epi8(
      _mm256_set1_epi32(static_cast<int>(h)),
      _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3));
  const __m256i bit = _mm256_set1_epi64x(static_cast<long long>(0x8040201008040201ull));
  return _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(spread, bit), bit), byte_splat(16));
}

inline uint32_t le32(const uint8_t* p) {
  uint32_t v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

inline float f(int v) { return static_cast<float>(v); }

/// Bytes p[0..7] widened to 8 dwords (one vpmovzxbd from memory).
inline __m256i u8x8(const uint8_t* p) {
  return _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)));
}
inline __m256i dwords(int v) { return _mm256_set1_epi32(v); }
inline __m256 to_ps(__m256i v) { return _mm256_cvtepi32_ps(v); }

// exact_fma: every product in these formats is exact in float. d is an fp16 value (11 significant
// bits, magnitude at least 2^-24); d·sc has at most 11 + 6 significant bits (K-quant scales < 64) or
// 11 + 7 (Q6_K, |sc| ≤ 128), and times a quant below 32 in magnitude (5 bits; Q6_K's −32 is one bit)
// at most 23, far inside float's exponent range. So where a format adds an offset to a scaled quant
// (Q4_1, Q5_1: q·d + m; Q4_K, Q5_K: (d·sc)·q − dmin·m) an FMA rounds only the sum, exactly as the
// reference's mul-then-add does (signed zeros included: the exact product keeps its sign). Formats
// without an offset keep a plain mul: folding Q4_0's −8 into an FMA (q·d − 8d) would turn the
// reference's −0 for q = 8, d < 0 into +0.
//
// ----------------------------------------------------------------------------------------------
// Block decoders. `emit(block, sink)` calls sink(g, v0, v1, v2, v3) for g = 0 .. kElements/32 − 1,
// v0..v3 holding elements 32g .. 32g+31 of the block.

/// What a decoder of type T reads, from the type table.
template <GgmlType T>
struct Decodes {
  /// The type decoded.
  static constexpr GgmlType kType = T;
  /// F32, F16, BF16: blocks of one element, decoded 32 at a time, any count (a scalar tail after the
  /// groups of 32).
  static constexpr bool kPlainFloat = ggml_type_info(T).block_elements == 1;
  /// Elements one emit() call decodes: a block, or 32 elements of a plain float type.
  static constexpr int64_t kElements = kPlainFloat ? 32 : ggml_type_info(T).block_elements;
  /// Bytes one emit() call reads.
  static constexpr size_t kBytes =
      ggml_type_info(T).block_bytes * static_cast<size_t>(kElements / ggml_type_info(T).block_elements);
};

struct F32 : Decodes<GgmlType::f32> {
  template <class Sink>
  static void emit(const uint8_t* b, Sink&& sink) {
    const auto* p = reinterpret_cast<const float*>(b);
    sink(0, _mm256_loadu_ps(p), _mm256_loadu_ps(p + 8), _mm256_loadu_ps(p + 16), _mm256_loadu_ps(p + 24));
  }
  static float scalar(const uint8_t* b, int64_t i) {
    float v;
    std::memcpy(&v, b + 4 * i, sizeof v);
    return v;
  }
};

struct F16 : Decodes<GgmlType::f16> {
  template <class Sink>
  static void emit(const uint8_t* b, Sink&& sink) {
    sink(0, _mm256_cvtph_ps(load128(b)), _mm256_cvtph_ps(load128(b + 16)), _mm256_cvtph_ps(load128(b + 32)),
         _mm256_cvtph_ps(load128(b + 48)));
  }
  static float scalar(const uint8_t* b, int64_t i) { return half_at(b + 2 * i); }
};

struct BF16 : Decodes<GgmlType::bf16> {
  static __m256 widen(const uint8_t* p) {
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(load128(p)), 16));
  }
  template <class Sink>
  static void emit(const uint8_t* b, Sink&& sink) {
    sink(0, widen(b), widen(b + 16), widen(b + 32), widen(b + 48));
  }
  static float scalar(const uint8_t* b, int64_t i) {
    uint16_t h;
    std::memcpy(&h, b + 2 * i, sizeof h);
    const uint32_t bits = static_cast<uint32_t>(h) << 16;
    float v;
    std::memcpy(&v, &bits, sizeof v);
    return v;
  }
};

struct Q8_0 : Decodes<GgmlType::q8_0> {  // f16 d; i8 qs[32]: q·d
  template <class Sink>
  static void emit(const uint8_t* b, Sink&& sink) {
    const __m256 d = _mm256_set1_ps(half_at(b));
    const auto q = [b](int k) {  // 8 quants straight from memory to floats
      return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(b + 2 + 8 * k))));
    };
    sink(0, _mm256_mul_ps(q(0), d), _mm256_mul_ps(q(1), d), _mm256_mul_ps(q(2), d), _mm256_mul_ps(q(3), d));
  }
};

struct Q4_0 : Decodes<GgmlType::q4_0> {  // f16 d; u8 qs[16]: (q−8)·d
  template <class Sink>
  static void emit(const uint8_t* b, Sink&& sink) {
    const __m256 d = _mm256_set1_ps(half_at(b));
    const __m256i v0 = u8x8(b + 2), v1 = u8x8(b + 10), mask = dwords(15), eight = dwords(8);
    const auto value = [&](__m256i q) { return _mm256_mul_ps(to_ps(_mm256_sub_epi32(q, eight)), d); };
    sink(0, value(_mm256_and_si256(v0, mask)), value(_mm256_and_si256(v1, mask)), value(_mm256_srli_epi32(v0, 4)),
         value(_mm256_srli_epi32(v1, 4)));
  }
};

struct Q4_1 : Decodes<GgmlType::q4_1> {  // f16 d, m; u8 qs[16]: q·d + m
  template <class Sink>
  static void emit(const uint8_t* b, Sink&& sink) {
    const __m256 d = _mm256_set1_ps(half_at(b)), m = _mm256_set1_ps(half_at(b + 2));
    const __m256i v0 = u8x8(b + 4), v1 = u8x8(b + 12), mask = dwords(15);
    const auto value = [&](__m256i q) { return _mm256_fmadd_ps(to_ps(q), d, m); };  // exact_fma
    sink(0, value(_mm256_and_si256(v0, mask)), value(_mm256_and_si256(v1, mask)), value(_mm256_srli_epi32(v0, 4)),
         value(_mm256_srli_epi32(v1, 4)));
  }
};

struct Q5_0 : Decodes<GgmlType::q5_0> {  // f16 d; u8 qh[4]; u8 qs[16]: (q−16)·d
  template <class Sink>
  static void emit(const uint8_t* b, Sink&& sink) {
    const __m256 d = _mm256_set1_ps(half_at(b));
    // (low | 16·bit) − 16 = low − 16·(1 − bit): subtract the complemented fifth bits.
    const Four q = i8x32_to_ps(_mm256_sub_epi8(split_nibbles16(b + 6), bits_to_16(~le32(b + 2))));
    sink(0, _mm256_mul_ps(q.v[0], d), _mm256_mul_ps(q.v[1], d), _mm256_mul_ps(q.v[2], d), _mm256_mul_ps(q.v[3], d));
  }
};

struct Q5_1 : Decodes<GgmlType::q5_1> {  // f16 d, m; u8 qh[4]; u8 qs[16]: q·d + m
  template <class Sink>
  static void emit(const uint8_t* b, Sink&& sink) {
    const __m256 d = _mm256_set1_ps(half_at(b)), m = _mm256_set1_ps(half_at(b + 2));
    // Quants are below 32, so widening them as signed bytes is exact.
    const Four q = i8x32_to_ps(_mm256_or_si256(split_nibbles16(b + 8), bits_to_16(le32(b + 4))));
    sink(0, _mm256_fmadd_ps(q.v[0], d, m), _mm256_fmadd_ps(q.v[1], d, m), _mm256_fmadd_ps(q.v[2], d, m),  // exact_fma
         _mm256_fmadd_ps(q.v[3], d, m));
  }
};

/// (d·sc)·q − dmin·m for one sub-block of 32 quants (four vectors of 8 dwords).
template <class Sink>
inline void k_quant_sub_block(int g, const __m256i (&q)[4], float d, float dmin, int sc, int m, Sink& sink) {
  const __m256 scale = _mm256_set1_ps(d * f(sc)), offset = _mm256_set1_ps(dmin * f(m));
  // exact_fma: (d·sc)·q is exact, so this rounds like the reference's mul-then-sub.
  sink(g, _mm256_fmsub_ps(to_ps(q[0]), scale, offset), _mm256_fmsub_ps(to_ps(q[1]), scale, offset),
       _mm256_fmsub_ps(to_ps(q[2]), scale, offset), _mm256_fmsub_ps(to_ps(q[3]), scale, offset));
}

struct Q4_K : Decodes<GgmlType::q4_k> {  // f16 d, dmin; u8 scales[12]; u8 qs[128]
  template <class Sink>
  static void emit(const uint8_t* b, Sink&& sink) {
    const float d = half_at(b), dmin = half_at(b + 2);
    const KQuantScales scales = unpack_k_quant_scales(b + 4);
    const __m256i mask = dwords(15);
#pragma GCC unroll 4  // constant sub-block indices: the scales and mins come out of `scales` by fixed shifts
    for (int c = 0; c < 4; ++c) {
      const uint8_t* qs = b + 16 + 32 * c;
      __m256i lo[4], hi[4];
      for (int k = 0; k < 4; ++k) {
        const __m256i v = u8x8(qs + 8 * k);
        lo[k] = _mm256_and_si256(v, mask);
        hi[k] = _mm256_srli_epi32(v, 4);
      }
      k_quant_sub_block(2 * c, lo, d, dmin, scales.scale(2 * c), scales.min(2 * c), sink);
      k_quant_sub_block(2 * c + 1, hi, d, dmin, scales.scale(2 * c + 1), scales.min(2 * c + 1), sink);
    }
  }
};

struct Q5_K : Decodes<GgmlType::q5_k> {  // f16 d, dmin; u8 scales[12]; u8 qh[32]; u8 qs[128]
  template <class Sink>
  static void emit(const uint8_t* b, Sink&& sink) {
    const float d = half_at(b), dmin = half_at(b + 2);
    const KQuantScales scales = unpack_k_quant_scales(b + 4);
    const uint8_t* qh = b + 16;
    const __m256i mask = dwords(15), sixteen = dwords(16);
#pragma GCC unroll 4  // as in Q4_K
    for (int c = 0; c < 4; ++c) {
      const uint8_t* qs = b + 48 + 32 * c;
      __m256i lo[4], hi[4];
      for (int k = 0; k < 4; ++k) {
        const __m256i v = u8x8(qs + 8 * k);
        const __m256i h16 = _mm256_slli_epi32(u8x8(qh + 8 * k), 4);  // bit i of qh[l] at bit 4 + i
        lo[k] = _mm256_or_si256(_mm256_and_si256(v, mask), _mm256_and_si256(_mm256_srli_epi32(h16, 2 * c), sixteen));
        hi[k] = _mm256_or_si256(_mm256_srli_epi32(v, 4), _mm256_and_si256(_mm256_srli_epi32(h16, 2 * c + 1), sixteen));
      }
      k_quant_sub_block(2 * c, lo, d, dmin, scales.scale(2 * c), scales.min(2 * c), sink);
      k_quant_sub_block(2 * c + 1, hi, d, dmin, scales.scale(2 * c + 1), scales.min(2 * c + 1), sink);
    }
  }
};

struct Q6_K : Decodes<GgmlType::q6_k> {  // u8 ql[128]; u8 qh[64]; i8 scales[16]; f16 d: (d·sc)·(q−32)
  template <class Sink>
  static void sub_blocks(int g, __m256i q, float s0, float s1, Sink& sink) {
    const __m256i qq = _mm256_sub_epi8(q, byte_splat(32));
    const Four v = i8x32_to_ps(qq);
    const __m256 a = _mm256_set1_ps(s0), c = _mm256_set1_ps(s1);
    sink(g, _mm256_mul_ps(v.v[0], a), _mm256_mul_ps(v.v[1], a), _mm256_mul_ps(v.v[2], c), _mm256_mul_ps(v.v[3], c));
  }
  template <class Sink>
  static void emit(const uint8_t* b, Sink&& sink) {
    const float d = half_at(b + 208);
    const auto* sc = reinterpret_cast<const int8_t*>(b + 192);
    const __m256i low = byte_splat(15), high = byte_splat(0x30);
    for (int h = 0; h < 2; ++h) {
      const __m256i a = load256(b + 64 * h), bb = load256(b + 64 * h + 32), qh = load256(b + 128 + 32 * h);
      const int8_t* s = sc + 8 * h;
      const __m256i q1 = _mm256_or_si256(_mm256_and_si256(a, low), _mm256_and_si256(_mm256_slli_epi16(qh, 4), high));
      const __m256i q2 = _mm256_or_si256(_mm256_and_si256(bb, low), _mm256_and_si256(_mm256_slli_epi16(qh, 2), high));
      const __m256i q3 = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(a, 4), low), _mm256_and_si256(qh, high));
      const __m256i q4 =
          _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(bb, 4), low), _mm256_and_si256(_mm256_srli_epi16(qh, 2), high));
      sub_blocks(4 * h + 0, q1, d * f(s[0]), d * f(s[1]), sink);
      sub_blocks(4 * h + 1, q2, d * f(s[2]), d * f(s[3]), sink);
      sub_blocks(4 * h + 2, q3, d * f(s[4]), d * f(s[5]), sink);
      sub_blocks(4 * h + 3, q4, d * f(s[6]), d * f(s[7]), sink);
    }
  }
};

/// Dequantizes `n` elements (a multiple of the type's unit) starting at `src`.
template <class K>
void dequantize(const uint8_t* src, float* dst, int64_t n) {
  const int64_t blocks = n / K::kElements;
  for (int64_t i = 0; i < blocks; ++i) {
    float* out = dst + i * K::kElements;
    K::emit(src + static_cast<size_t>(i) * K::kBytes, [out](int g, __m256 v0, __m256 v1, __m256 v2, __m256 v3) {
      float* p = out + 32 * g;
      _mm256_storeu_ps(p, v0);
      _mm256_storeu_ps(p + 8, v1);
      _mm256_storeu_ps(p + 16, v2);
      _mm256_storeu_ps(p + 24, v3);
    });
  }
  if constexpr (K::kPlainFloat) {
    const uint8_t* tail = src + static_cast<size_t>(blocks) * K::kBytes;
    for (int64_t i = blocks * K::kElements; i < n; ++i) dst[i] = K::scalar(tail, i - blocks * K::kElements);
  }
}

inline float hsum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

/// [Σa0, Σa1, Σa2, Σa3].
inline __m128 hsum4(__m256 a0, __m256 a1, __m256 a2, __m256 a3) {
  const __m256 h = _mm256_hadd_ps(_mm256_hadd_ps(a0, a1), _mm256_hadd_ps(a2, a3));
  return _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
}

// ----------------------------------------------------------------------------------------------
// Decode: one token, each row decoded in registers straight into its dot product.

template <class K>
float dot_row(const uint8_t* w, const float* x, int64_t cols) {
  __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps(), acc2 = _mm256_setzero_ps(), acc3 = _mm256_setzero_ps();
  const int64_t blocks = cols / K::kElements;
  for (int64_t i = 0; i < blocks; ++i) {
    const float* xb = x + i * K::kElements;
    K::emit(w + static_cast<size_t>(i) * K::kBytes, [&](int g, __m256 v0, __m256 v1, __m256 v2, __m256 v3) {
      const float* p = xb + 32 * g;
      acc0 = _mm256_fmadd_ps(v0, _mm256_loadu_ps(p), acc0);
      acc1 = _mm256_fmadd_ps(v1, _mm256_loadu_ps(p + 8), acc1);
      acc2 = _mm256_fmadd_ps(v2, _mm256_loadu_ps(p + 16), acc2);
      acc3 = _mm256_fmadd_ps(v3, _mm256_loadu_ps(p + 24), acc3);
    });
  }
  float sum = hsum(_mm256_add_ps(_mm256_add_ps(acc0, acc1), _mm256_add_ps(acc2, acc3)));
  if constexpr (K::kPlainFloat) {
    const uint8_t* tail = w + static_cast<size_t>(blocks) * K::kBytes;
    for (int64_t c = blocks * K::kElements; c < cols; ++c) sum += K::scalar(tail, c - blocks * K::kElements) * x[c];
  }
  return sum;
}

// ----------------------------------------------------------------------------------------------
// Prefill: 4 dequantized rows in L1 against blocks of tokens.

constexpr int kRows = 4;          // rows per dequantized panel
constexpr int64_t kChunk = 1024;  // columns per panel (a multiple of every block size)
constexpr int64_t kTokenBlock = 64;

/// Y[t][0..nr) (+)= panel · X[t] over `n` columns for NT tokens.
template <int NT>
void panel_kernel(const float (*panel)[kChunk], int64_t n, const float* x, int64_t x_stride, float* y, int64_t y_stride,
                  int nr, bool accumulate) {
  __m256 acc[kRows][NT];
#pragma GCC unroll 4
  for (int r = 0; r < kRows; ++r) {
#pragma GCC unroll 4
    for (int t = 0; t < NT; ++t) acc[r][t] = _mm256_setzero_ps();
  }
  const int64_t n8 = n & ~int64_t{7};
  for (int64_t k = 0; k < n8; k += 8) {
    __m256 xv[NT];
#pragma GCC unroll 4
    for (int t = 0; t < NT; ++t) xv[t] = _mm256_loadu_ps(x + t * x_stride + k);
#pragma GCC unroll 4
    for (int r = 0; r < kRows; ++r) {
      const __m256 wv = _mm256_load_ps(panel[r] + k);
#pragma GCC unroll 4
      for (int t = 0; t < NT; ++t) acc[r][t] = _mm256_fmadd_ps(wv, xv[t], acc[r][t]);
    }
  }
  for (int t = 0; t < NT; ++t) {
    alignas(16) float out[kRows];
    _mm_store_ps(out, hsum4(acc[0][t], acc[1][t], acc[2][t], acc[3][t]));
    const float* xt = x + t * x_stride;
    for (int64_t k = n8; k < n; ++k) {
      for (int r = 0; r < kRows; ++r) out[r] += panel[r][k] * xt[k];
    }
    float* yt = y + t * y_stride;
    if (nr == kRows && accumulate) {
      _mm_storeu_ps(yt, _mm_add_ps(_mm_loadu_ps(yt), _mm_load_ps(out)));
    } else if (nr == kRows) {
      _mm_storeu_ps(yt, _mm_load_ps(out));
    } else {
      for (int r = 0; r < nr; ++r) yt[r] = accumulate ? yt[r] + out[r] : out[r];
    }
  }
}

template <class K>
void matmul(const uint8_t* w, size_t row_bytes, int64_t cols, int64_t row_begin, int64_t row_end, const float* x,
            int64_t tokens, float* y, int64_t y_stride) {
  if (cols == 0) {
    for (int64_t t = 0; t < tokens; ++t) std::fill(y + t * y_stride + row_begin, y + t * y_stride + row_end, 0.0f);
    return;
  }
  if (tokens == 1) {
    for (int64_t r = row_begin; r < row_end; ++r) y[r] = dot_row<K>(w + static_cast<size_t>(r) * row_bytes, x, cols);
    return;
  }
  alignas(32) float panel[kRows][kChunk];
  for (int64_t t0 = 0; t0 < tokens; t0 += kTokenBlock) {
    const int64_t t1 = std::min(tokens, t0 + kTokenBlock);
    for (int64_t r0 = row_begin; r0 < row_end; r0 += kRows) {
      const int nr = static_cast<int>(std::min<int64_t>(kRows, row_end - r0));
      for (int64_t c0 = 0; c0 < cols; c0 += kChunk) {
        const int64_t n = std::min(kChunk, cols - c0);
        const GgmlTypeInfo& info = ggml_type_info(K::kType);
        const size_t offset = static_cast<size_t>(c0 / info.block_elements) * info.block_bytes;
        for (int r = 0; r < kRows; ++r) {
          if (r < nr) {
            dequantize<K>(w + static_cast<size_t>(r0 + r) * row_bytes + offset, panel[r], n);
          } else {
            std::fill(panel[r], panel[r] + n, 0.0f);
          }
        }
        const bool accumulate = c0 > 0;
        float* yb = y + r0;
        const auto tile = [&](auto width, int64_t first) {
          panel_kernel<decltype(width)::value>(panel, n, x + first * cols + c0, cols, yb + first * y_stride, y_stride, nr,
                                               accumulate);
        };
        // Tiles of 3 tokens; a remainder of 4 goes as 2 + 2 rather than 3 + 1 (8 accumulators, not 4).
        int64_t t = t0;
        for (; t1 - t >= 3 && t1 - t != 4; t += 3) tile(std::integral_constant<int, 3>{}, t);
        for (; t1 - t >= 2; t += 2) tile(std::integral_constant<int, 2>{}, t);
        if (t < t1) tile(std::integral_constant<int, 1>{}, t);
      }
    }
  }
}

template <class F>
void with_kind(GgmlType type, F&& fn) {
  switch (type) {
    case GgmlType::f32: fn(F32{}); return;
    case GgmlType::f16: fn(F16{}); return;
    case GgmlType::bf16: fn(BF16{}); return;
    case GgmlType::q8_0: fn(Q8_0{}); return;
    case GgmlType::q4_0: fn(Q4_0{}); return;
    case GgmlType::q4_1: fn(Q4_1{}); return;
    case GgmlType::q5_0: fn(Q5_0{}); return;
    case GgmlType::q5_1: fn(Q5_1{}); return;
    case GgmlType::q4_k: fn(Q4_K{}); return;
    case GgmlType::q5_k: fn(Q5_K{}); return;
    case GgmlType::q6_k: fn(Q6_K{}); return;
  }
}

bool cpu_ok() { return cpu_features().avx2_set(); }

void require() {
  static const bool ok = cpu_ok();
  if (!ok) throw Error("the AVX2 quantized kernels need AVX2, FMA and F16C, which this CPU lacks");
}

}  // namespace

bool available() {
  static const bool ok = cpu_ok();
  return ok;
}

void dequantize_row(GgmlType type, const uint8_t* src, float* dst, int64_t n) {
  require();
  detail::check_dequantize(type, src, dst, n);
  with_kind(type, [&](auto kind) { dequantize<decltype(kind)>(src, dst, n); });
}

void matmul_rows(GgmlType type, const uint8_t* w, size_t row_bytes, int64_t cols, int64_t row_begin, int64_t row_end,
                 const float* x, int64_t tokens, float* y, int64_t y_stride) {
  require();
  detail::check_matmul(type, w, row_bytes, cols, row_begin, row_end, x, tokens, y, y_stride);
  if (row_end == row_begin || tokens == 0) return;
  with_kind(type, [&](auto kind) {
    matmul<decltype(kind)>(w, row_bytes, cols, row_begin, row_end, x, tokens, y, y_stride);
  });
}

#else  // no AVX2 code in this build

bool available() { return false; }

void dequantize_row(GgmlType, const uint8_t*, float*, int64_t) {
  throw Error("the AVX2 quantized kernels are not compiled into this build");
}

void matmul_rows(GgmlType, const uint8_t*, size_t, int64_t, int64_t, int64_t, const float*, int64_t, float*, int64_t) {
  throw Error("the AVX2 quantized kernels are not compiled into this build");
}

#endif

}  // namespace gaac::model::avx2
