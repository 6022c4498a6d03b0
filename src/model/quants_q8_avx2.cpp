// AVX2 + FMA + F16C activation quantizers and quantized products.
//
// Quantizers: bit-identical to the reference (same scalar d/id/iscale computations; roundf emulated
// exactly as trunc plus a correction where the exact fraction is at least one half; ggml's
// nearest_int is round-half-even, which is what vroundps does).
//
// Products: a weight row is first decoded into an L1-resident buffer in a form the integer kernels
// take directly, then multiplied against blocks of up to 64 tokens (their activations stay in L2),
// four tokens at a time so that each decoded weight vector is loaded once for four dot products:
//   32-element types: 32 quants per block as int8 (signed for Q4_0/Q5_0/Q8_0, which then use the
//     sign trick vpsignb + vpmaddubsw; unsigned 0..31 for Q4_1/Q5_1) and the block's d (and m);
//     per block: vpmaddubsw → vpmaddwd → 8 int32 lanes → float, times d_w·d_x, into 8-lane FMA
//     accumulators; Q4_1/Q5_1 add Σ m_w·s_x at the end (a separate 8-lane dot).
//   K-quants: 256 unsigned quants per super-block (Q6_K without its −32), one 16-lane int16 scale
//     vector per 32 quants, and 16 int16 "mins" that multiply the activations' bsums: Q4_K/Q5_K
//     m_j, Q6_K 32·s_j (so Σ s_j·Σ (q−32)·x = Σ s_j·Σ q·x − Σ 32·s_j·bsum_j). The integer sums are
//     exact; d_w·d_x and dmin_w·d_x scale them per super-block.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "gaac/bf16.hpp"
#include "gaac/error.hpp"
#include "model/k_quant_scales.hpp"
#include "model/quants.hpp"
#include "model/quants_q8.hpp"

#if (defined(__x86_64__) || defined(_M_X64)) && defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#define GAAC_Q8_AVX2 1
#include <immintrin.h>
#endif

namespace gaac::model::avx2 {

#if defined(GAAC_Q8_AVX2)

namespace {

// ----------------------------------------------------------------------------------------------
// Helpers

inline float half_at(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, sizeof h);
  return _cvtsh_ss(h);
}
inline float float_at(const uint8_t* p) {
  float v;
  std::memcpy(&v, p, sizeof v);
  return v;
}
inline void put16(uint8_t* p, uint16_t v) { std::memcpy(p, &v, sizeof v); }
inline __m256i load(const void* p) { return _mm256_loadu_si256(static_cast<const __m256i*>(p)); }
inline void store(void* p, __m256i v) { _mm256_storeu_si256(static_cast<__m256i*>(p), v); }
inline __m256i bytes(int v) { return _mm256_set1_epi8(static_cast<char>(v)); }

inline float hsum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}
inline int hsum_i32(__m256i v) {
  __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
  s = _mm_add_epi32(s, _mm_unpackhi_epi64(s, s));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, _MM_SHUFFLE(2, 3, 0, 1)));
  return _mm_cvtsi128_si32(s);
}
inline float hmax(__m256 v) {
  __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  m = _mm_max_ps(m, _mm_movehl_ps(m, m));
  m = _mm_max_ss(m, _mm_movehdup_ps(m));
  return _mm_cvtss_f32(m);
}
inline __m256 abs_ps(__m256 v) { return _mm256_and_ps(v, _mm256_castsi256_ps(_mm256_set1_epi32(0x7FFFFFFF))); }

/// Rounded values to quants as the reference's to_quant does: NaN → 0, clamped to [−127, 127].
inline __m256i to_quants(__m256 r) {
  r = _mm256_and_ps(r, _mm256_cmp_ps(r, r, _CMP_ORD_Q));
  r = _mm256_max_ps(_mm256_min_ps(r, _mm256_set1_ps(127.0f)), _mm256_set1_ps(-127.0f));
  return _mm256_cvttps_epi32(r);
}

/// roundf on 8 lanes: truncate, then step away from zero where the (exact) fraction is ≥ 1/2.
inline __m256 round_half_away(__m256 v) {
  const __m256 t = _mm256_round_ps(v, _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC);
  const __m256 frac = abs_ps(_mm256_sub_ps(v, t));
  const __m256 one = _mm256_or_ps(_mm256_and_ps(v, _mm256_set1_ps(-0.0f)), _mm256_set1_ps(1.0f));
  return _mm256_add_ps(t, _mm256_and_ps(_mm256_cmp_ps(frac, _mm256_set1_ps(0.5f), _CMP_GE_OQ), one));
}

/// Four vectors of 8 int32 quants (elements 0..31 in order) → 32 int8 stored at `out`.
inline void store_quants(uint8_t* out, __m256i i0, __m256i i1, __m256i i2, __m256i i3) {
  const __m256i a = _mm256_packs_epi32(i0, i1), b = _mm256_packs_epi32(i2, i3);
  const __m256i packed = _mm256_packs_epi16(a, b);
  store(out, _mm256_permutevar8x32_epi32(packed, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7)));
}

// ----------------------------------------------------------------------------------------------
// Quantizers

/// Q8_0 (with_sum == false) or Q8_1 blocks of 32; where given, d (and s) widened also into
/// scales[i·stride] (sums[i·stride]) and the quants into quants[32·i ..].
template <bool with_sum>
void quantize_q8_01(const float* x, uint8_t* out, int64_t blocks, float* scales, float* sums, size_t stride,
                    int8_t* quants, Q8Rounding rounding) {
  const bool reference = rounding == Q8Rounding::reference;
  constexpr size_t kBytes = activation_block_bytes(with_sum ? ActivationType::q8_1 : ActivationType::q8_0);
  for (int64_t i = 0; i < blocks; ++i, x += 32, out += kBytes) {
    __m256 v[4];
    for (int k = 0; k < 4; ++k) v[k] = _mm256_loadu_ps(x + 8 * k);
    const float amax = hmax(_mm256_max_ps(_mm256_max_ps(abs_ps(v[0]), abs_ps(v[1])), _mm256_max_ps(abs_ps(v[2]), abs_ps(v[3]))));
    const float d = amax / 127.0f;
    const float id = reference ? (d != 0.0f ? 1.0f / d : 0.0f) : (amax != 0.0f ? 127.0f / amax : 0.0f);
    const __m256 idv = _mm256_set1_ps(id);
    __m256i q[4];
    for (int k = 0; k < 4; ++k) {
      const __m256 p = _mm256_mul_ps(v[k], idv);
      q[k] = to_quants(reference ? round_half_away(p) : _mm256_round_ps(p, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
    }
    const uint16_t dh = float_to_fp16(d);
    put16(out, dh);
    if (scales != nullptr) scales[static_cast<size_t>(i) * stride] = _cvtsh_ss(dh);
    if constexpr (with_sum) {
      const int sum = hsum_i32(_mm256_add_epi32(_mm256_add_epi32(q[0], q[1]), _mm256_add_epi32(q[2], q[3])));
      const uint16_t sh = float_to_fp16(static_cast<float>(sum) * d);
      put16(out + 2, sh);
      if (sums != nullptr) sums[static_cast<size_t>(i) * stride] = _cvtsh_ss(sh);
    }
    store_quants(out + (with_sum ? 4 : 2), q[0], q[1], q[2], q[3]);
    if (quants != nullptr) store(quants + 32 * i, load(out + (with_sum ? 4 : 2)));
  }
}

void quantize_q8_k(const float* x, uint8_t* out, int64_t blocks) {
  constexpr size_t kBytes = activation_block_bytes(ActivationType::q8_k);
  for (int64_t i = 0; i < blocks; ++i, x += 256, out += kBytes) {
    __m256 amaxv = _mm256_setzero_ps();
    for (int k = 0; k < 32; ++k) amaxv = _mm256_max_ps(amaxv, abs_ps(_mm256_loadu_ps(x + 8 * k)));
    const float amax = hmax(amaxv);
    if (amax == 0.0f) {
      std::memset(out, 0, kBytes);
      continue;
    }
    // The first element of largest magnitude, with its sign (the reference keeps the first).
    float max = 0.0f;
    const __m256 target = _mm256_set1_ps(amax);
    for (int k = 0; k < 32; ++k) {
      const int mask = _mm256_movemask_ps(_mm256_cmp_ps(abs_ps(_mm256_loadu_ps(x + 8 * k)), target, _CMP_EQ_OQ));
      if (mask != 0) {
        max = x[8 * k + __builtin_ctz(static_cast<unsigned>(mask))];
        break;
      }
    }
    const float iscale = -127.0f / max;
    const __m256 isv = _mm256_set1_ps(iscale);
    for (int g = 0; g < 8; ++g) {
      __m256i q[4];
      for (int k = 0; k < 4; ++k) {
        const __m256 p = _mm256_mul_ps(_mm256_loadu_ps(x + 32 * g + 8 * k), isv);
        q[k] = to_quants(_mm256_round_ps(p, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
      }
      store_quants(out + 4 + 32 * g, q[0], q[1], q[2], q[3]);
      const auto s0 = static_cast<int16_t>(hsum_i32(_mm256_add_epi32(q[0], q[1])));
      const auto s1 = static_cast<int16_t>(hsum_i32(_mm256_add_epi32(q[2], q[3])));
      put16(out + 260 + 4 * g, static_cast<uint16_t>(s0));
      put16(out + 262 + 4 * g, static_cast<uint16_t>(s1));
    }
    const float d = 1.0f / iscale;
    std::memcpy(out, &d, sizeof d);
  }
}

/// Round-to-nearest-even BF16 of 8 floats, widened back (NaN: quiet, as float_to_bf16).
inline __m256 round_bf16(__m256 v) {
  const __m256i bits = _mm256_castps_si256(v);
  const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(bits, 16), _mm256_set1_epi32(1));
  const __m256i rounded = _mm256_add_epi32(bits, _mm256_add_epi32(_mm256_set1_epi32(0x7FFF), lsb));
  const __m256i nan = _mm256_or_si256(bits, _mm256_set1_epi32(0x00400000));
  const __m256i is_nan = _mm256_castps_si256(_mm256_cmp_ps(v, v, _CMP_UNORD_Q));
  const __m256i chosen = _mm256_blendv_epi8(rounded, nan, is_nan);
  return _mm256_castsi256_ps(_mm256_and_si256(chosen, _mm256_set1_epi32(static_cast<int>(0xFFFF0000u))));
}

void quantize_row(ActivationType type, const float* x, int64_t cols, uint8_t* out, float* scales, float* sums,
                  size_t stride, int8_t* quants, Q8Rounding rounding) {
  switch (type) {
    case ActivationType::q8_0: quantize_q8_01<false>(x, out, cols / 32, scales, nullptr, stride, quants, rounding); return;
    case ActivationType::q8_1: quantize_q8_01<true>(x, out, cols / 32, scales, sums, stride, quants, rounding); return;
    case ActivationType::q8_k: quantize_q8_k(x, out, cols / 256); return;
    default: return;  // float types are handled by the callers
  }
}

// ----------------------------------------------------------------------------------------------
// Weight decoders

/// 16 bytes of nibbles → 32 bytes: low nibbles (elements 0..15), then high nibbles (16..31).
inline __m256i split_nibbles16(const uint8_t* p) {
  const __m128i q = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  const __m128i mask = _mm_set1_epi8(15);
  return _mm256_inserti128_si256(_mm256_castsi128_si256(_mm_and_si128(q, mask)),
                                 _mm_and_si128(_mm_srli_epi16(q, 4), mask), 1);
}

/// The 32 bits at `p` as 32 bytes of 0 or 16 (byte j ← bit j).
inline __m256i bits_to_16(const uint8_t* p) {
  uint32_t h;
  std::memcpy(&h, p, sizeof h);
  const __m256i spread = _mm256_shuffle_epi8(
      _mm256_set1_epi32(static_cast<int>(h)),
      _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3));
  const __m256i bit = _mm256_set1_epi64x(static_cast<long long>(0x8040201008040201ull));
  return _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(spread, bit), bit), bytes(16));
}

/// A decoded row of a 32-element type: quants (element order), d and m per block.
struct RowA {
  std::vector<int8_t> q;
  std::vector<float> d, m;
  void resize(int64_t cols) {
    q.resize(static_cast<size_t>(cols));
    d.resize(static_cast<size_t>(cols / 32));
    m.resize(static_cast<size_t>(cols / 32));
  }
};

struct Q4_0 {
  static constexpr size_t kBytes = ggml_type_info(GgmlType::q4_0).block_bytes;
  static constexpr bool kSigned = true, kMin = false;
  static void decode(const uint8_t* b, int8_t* q, float& d, float&) {
    d = half_at(b);
    store(q, _mm256_sub_epi8(split_nibbles16(b + 2), bytes(8)));
  }
};
struct Q4_1 {
  static constexpr size_t kBytes = ggml_type_info(GgmlType::q4_1).block_bytes;
  static constexpr bool kSigned = false, kMin = true;
  static void decode(const uint8_t* b, int8_t* q, float& d, float& m) {
    d = half_at(b);
    m = half_at(b + 2);
    store(q, split_nibbles16(b + 4));
  }
};
struct Q5_0 {
  static constexpr size_t kBytes = ggml_type_info(GgmlType::q5_0).block_bytes;
  static constexpr bool kSigned = true, kMin = false;
  static void decode(const uint8_t* b, int8_t* q, float& d, float&) {
    d = half_at(b);
    store(q, _mm256_sub_epi8(_mm256_or_si256(split_nibbles16(b + 6), bits_to_16(b + 2)), bytes(16)));
  }
};
struct Q5_1 {
  static constexpr size_t kBytes = ggml_type_info(GgmlType::q5_1).block_bytes;
  static constexpr bool kSigned = false, kMin = true;
  static void decode(const uint8_t* b, int8_t* q, float& d, float& m) {
    d = half_at(b);
    m = half_at(b + 2);
    store(q, _mm256_or_si256(split_nibbles16(b + 8), bits_to_16(b + 4)));
  }
};
struct Q8_0 {
  static constexpr size_t kBytes = ggml_type_info(GgmlType::q8_0).block_bytes;
  static constexpr bool kSigned = true, kMin = false;
  static void decode(const uint8_t* b, int8_t* q, float& d, float&) {
    d = half_at(b);
    store(q, load(b + 2));
  }
};

/// A decoded K-quant super-block.
struct alignas(32) KBlock {
  uint8_t q[256];
  int16_t scale[8][16];  // per 32 quants: the scale of each vpmaddubsw lane (elements 0..15 | 16..31)
  int16_t mins[16];      // Q4_K/Q5_K: the min of each 32 quants (8); Q6_K: 32·scale of each 16 quants
  float d, dmin;
};

/// The scale vectors of a super-block from its 16 (Q6_K) or 8 (Q4_K/Q5_K: bytes 0..7, twice) scale
/// bytes: group g gets bytes 2g | 2g+1 (Q6_K) or g | g (K4), widened to 8 + 8 int16 lanes.
template <bool q6>
inline void scale_vectors(__m128i bytes16, KBlock& out) {
  for (int g = 0; g < 8; ++g) {
    const char lo = static_cast<char>(q6 ? 2 * g : g), hi = static_cast<char>(q6 ? 2 * g + 1 : g);
    const __m128i pick = _mm_shuffle_epi8(bytes16, _mm_setr_epi8(lo, lo, lo, lo, lo, lo, lo, lo, hi, hi, hi, hi, hi, hi, hi, hi));
    store(out.scale[g], q6 ? _mm256_cvtepi8_epi16(pick) : _mm256_cvtepu8_epi16(pick));
  }
}

/// Q4_K / Q5_K: the 12 packed bytes → the scale vectors and the mins.
inline void k4_scales(const uint8_t* packed, KBlock& out) {
  const KQuantScales unpacked = unpack_k_quant_scales(packed);
  const __m128i v = _mm_setr_epi32(static_cast<int>(unpacked.words[0]), static_cast<int>(unpacked.words[1]),
                                   static_cast<int>(unpacked.words[2]), static_cast<int>(unpacked.words[3]));
  scale_vectors<false>(v, out);
  _mm_storeu_si128(reinterpret_cast<__m128i*>(out.mins), _mm_cvtepu8_epi16(_mm_srli_si128(v, 8)));
  _mm_storeu_si128(reinterpret_cast<__m128i*>(out.mins + 8), _mm_setzero_si128());
}

struct Q4_K {
  static constexpr size_t kBytes = ggml_type_info(GgmlType::q4_k).block_bytes;
  static constexpr int kKind = 4;
  static void decode(const uint8_t* b, KBlock& out) {
    out.d = half_at(b);
    out.dmin = half_at(b + 2);
    const __m256i mask = bytes(15);
    for (int c = 0; c < 4; ++c) {
      const __m256i v = load(b + 16 + 32 * c);
      store(out.q + 64 * c, _mm256_and_si256(v, mask));
      store(out.q + 64 * c + 32, _mm256_and_si256(_mm256_srli_epi16(v, 4), mask));
    }
    k4_scales(b + 4, out);
  }
};

struct Q5_K {
  static constexpr size_t kBytes = ggml_type_info(GgmlType::q5_k).block_bytes;
  static constexpr int kKind = 5;
  static void decode(const uint8_t* b, KBlock& out) {
    out.d = half_at(b);
    out.dmin = half_at(b + 2);
    const __m256i mask = bytes(15), one = bytes(1);
    const __m256i qh = load(b + 16);
    for (int c = 0; c < 4; ++c) {
      const __m256i v = load(b + 48 + 32 * c);
      const __m256i h0 = _mm256_and_si256(_mm256_srl_epi16(qh, _mm_cvtsi32_si128(2 * c)), one);
      const __m256i h1 = _mm256_and_si256(_mm256_srl_epi16(qh, _mm_cvtsi32_si128(2 * c + 1)), one);
      store(out.q + 64 * c, _mm256_or_si256(_mm256_and_si256(v, mask), _mm256_slli_epi16(h0, 4)));
      store(out.q + 64 * c + 32,
            _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(v, 4), mask), _mm256_slli_epi16(h1, 4)));
    }
    k4_scales(b + 4, out);
  }
};

struct Q6_K {
  static constexpr size_t kBytes = ggml_type_info(GgmlType::q6_k).block_bytes;
  static constexpr int kKind = 6;
  static void decode(const uint8_t* b, KBlock& out) {
    out.d = half_at(b + 208);
    out.dmin = 0.0f;
    const __m256i low = bytes(15), high = bytes(0x30);
    for (int h = 0; h < 2; ++h) {
      const __m256i a = load(b + 64 * h), c = load(b + 64 * h + 32), qh = load(b + 128 + 32 * h);
      uint8_t* q = out.q + 128 * h;
      store(q, _mm256_or_si256(_mm256_and_si256(a, low), _mm256_and_si256(_mm256_slli_epi16(qh, 4), high)));
      store(q + 32, _mm256_or_si256(_mm256_and_si256(c, low), _mm256_and_si256(_mm256_slli_epi16(qh, 2), high)));
      store(q + 64, _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(a, 4), low), _mm256_and_si256(qh, high)));
      store(q + 96,
            _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(c, 4), low), _mm256_and_si256(_mm256_srli_epi16(qh, 2), high)));
    }
    const __m128i sc = _mm_loadu_si128(reinterpret_cast<const __m128i*>(b + 192));
    scale_vectors<true>(sc, out);
    store(out.mins, _mm256_slli_epi16(_mm256_cvtepi8_epi16(sc), 5));  // 32·s_j
  }
};

// ----------------------------------------------------------------------------------------------
// Kernels: one decoded row against NT tokens.

/// NR decoded rows against NT tokens (NT ≤ 4), with ggml's AVX2 arithmetic per row·token: per block,
/// d = d_w·d_x (one float product), acc = fma(d, float(lanes), acc) where lane k sums 4 products
/// q_w·q_x; Q4_1/Q5_1 add Σ m_w·s_x, accumulated block by block (those products are exact).
template <class K, int NR, int NT>
void kernel_a(const RowA* w, int64_t blocks, const QuantizedActivations& x, int64_t t0, float* y, int64_t y_stride,
              int64_t r0) {
  const auto tokens = static_cast<size_t>(x.tokens);
  const int8_t* xq[NT];
  __m256 acc[NR][NT];
  __m128 summs[NR];
  for (int t = 0; t < NT; ++t) xq[t] = x.quants.data() + x.quants_offset + static_cast<size_t>((t0 + t) * 32 * blocks);
  for (int r = 0; r < NR; ++r) {
    summs[r] = _mm_setzero_ps();
    for (int t = 0; t < NT; ++t) acc[r][t] = _mm256_setzero_ps();
  }
  const __m256i ones = _mm256_set1_epi16(1);
  alignas(16) float d[NR][4];
  for (int64_t b = 0; b < blocks; ++b) {
    const size_t bt = static_cast<size_t>(b) * tokens + static_cast<size_t>(t0);
    // d_w·d_x for 4 tokens at once (the caches are padded, so a group of fewer tokens reads spare lanes).
    const __m128 dx = _mm_loadu_ps(x.scales.data() + bt);
    __m256i wv[NR], aw[NR];
    for (int r = 0; r < NR; ++r) {
      _mm_store_ps(d[r], _mm_mul_ps(_mm_set1_ps(w[r].d[static_cast<size_t>(b)]), dx));
      if constexpr (K::kMin) {
        summs[r] = _mm_fmadd_ps(_mm_set1_ps(w[r].m[static_cast<size_t>(b)]), _mm_loadu_ps(x.sums.data() + bt), summs[r]);
      }
      wv[r] = load(w[r].q.data() + 32 * b);
      aw[r] = K::kSigned ? _mm256_sign_epi8(wv[r], wv[r]) : wv[r];
    }
    for (int t = 0; t < NT; ++t) {
      const __m256i xv = load(xq[t] + 32 * b);
      for (int r = 0; r < NR; ++r) {
        const __m256i sx = K::kSigned ? _mm256_sign_epi8(xv, wv[r]) : xv;
        const __m256i lanes = _mm256_madd_epi16(_mm256_maddubs_epi16(aw[r], sx), ones);
        acc[r][t] = _mm256_fmadd_ps(_mm256_broadcast_ss(&d[r][t]), _mm256_cvtepi32_ps(lanes), acc[r][t]);
      }
    }
  }
  for (int r = 0; r < NR; ++r) {
    alignas(16) float m[4];
    _mm_store_ps(m, summs[r]);
    for (int t = 0; t < NT; ++t) y[(t0 + t) * y_stride + r0 + r] = hsum(acc[r][t]) + (K::kMin ? m[t] : 0.0f);
  }
}

/// K-quants, with ggml's AVX2 float structure: per super-block, d·Σ lanes into 8-lane accumulators;
/// the mins (Q4_K) into a 4-lane accumulator of dmin·(m_2k·s_2k + m_2k+1·s_2k+1), s_g the activations'
/// sum over 32-element group g, or (Q5_K) dmin·Σ m·s into a scalar fused multiply-add chain; Q6_K
/// subtracts its −32 offset from the integer lanes through bsums (lane k: 32·(s_2k·bsum_2k +
/// s_2k+1·bsum_2k+1)). This is the arithmetic of the ggml build llama-cpp-python 0.3.36 ships,
/// reproduced bit for bit (checked against that library during development).
template <class K, int NT>
void kernel_k(const KBlock* w, int64_t blocks, const QuantizedActivations& x, int64_t t0, float* y, int64_t y_stride,
              int64_t r) {
  const uint8_t* xq[NT];
  __m256 acc[NT];
  __m128 acc_m[NT];
  float summs[NT];
  for (int t = 0; t < NT; ++t) {
    xq[t] = x.blocks.data() + static_cast<size_t>(t0 + t) * x.row_bytes;
    acc[t] = _mm256_setzero_ps();
    acc_m[t] = _mm_setzero_ps();
    summs[t] = 0.0f;
  }
  for (int64_t b = 0; b < blocks; ++b) {
    const KBlock& kb = w[b];
    const size_t base = activation_block_bytes(ActivationType::q8_k) * static_cast<size_t>(b);
    __m256i sumi[NT];
    for (int t = 0; t < NT; ++t) sumi[t] = _mm256_setzero_si256();
    for (int g = 0; g < 8; ++g) {
      const __m256i wv = _mm256_load_si256(reinterpret_cast<const __m256i*>(kb.q + 32 * g));
      const __m256i sv = _mm256_load_si256(reinterpret_cast<const __m256i*>(kb.scale[g]));
      for (int t = 0; t < NT; ++t) {
        const __m256i xv = load(xq[t] + base + 4 + 32 * g);
        sumi[t] = _mm256_add_epi32(sumi[t], _mm256_madd_epi16(sv, _mm256_maddubs_epi16(wv, xv)));
      }
    }
    const __m128i mins = _mm_loadu_si128(reinterpret_cast<const __m128i*>(kb.mins));
    for (int t = 0; t < NT; ++t) {
      const float xd = float_at(xq[t] + base);
      if constexpr (K::kKind == 6) {  // Σ s_j·Σ (q−32)·x = Σ s_j·Σ q·x − Σ 32·s_j·bsum_j, in 8 lanes
        sumi[t] = _mm256_sub_epi32(sumi[t], _mm256_madd_epi16(load(kb.mins), load(xq[t] + base + 260)));
      }
      acc[t] = _mm256_fmadd_ps(_mm256_set1_ps(xd * kb.d), _mm256_cvtepi32_ps(sumi[t]), acc[t]);
      if constexpr (K::kKind != 6) {
        const __m256i bsums = load(xq[t] + base + 260);
        const __m128i s32 = _mm_hadd_epi16(_mm256_castsi256_si128(bsums), _mm256_extracti128_si256(bsums, 1));
        const __m128i prod = _mm_madd_epi16(mins, s32);
        const float dmin = -xd * kb.dmin;
        if constexpr (K::kKind == 4) {
          acc_m[t] = _mm_fmadd_ps(_mm_set1_ps(dmin), _mm_cvtepi32_ps(prod), acc_m[t]);
        } else {
          __m128i total = _mm_add_epi32(prod, _mm_unpackhi_epi64(prod, prod));
          total = _mm_add_epi32(total, _mm_shuffle_epi32(total, _MM_SHUFFLE(2, 3, 0, 1)));
          summs[t] = std::fma(dmin, static_cast<float>(_mm_cvtsi128_si32(total)), summs[t]);
        }
      }
    }
  }
  for (int t = 0; t < NT; ++t) {
    float s = hsum(acc[t]);
    if constexpr (K::kKind == 4) {
      __m128 m = _mm_add_ps(acc_m[t], _mm_movehl_ps(acc_m[t], acc_m[t]));
      m = _mm_add_ss(m, _mm_movehdup_ps(m));
      s += _mm_cvtss_f32(m);
    } else if constexpr (K::kKind == 5) {
      s += summs[t];
    }
    y[(t0 + t) * y_stride + r] = s;
  }
}

constexpr int64_t kTokenBlock = 64;  // tokens whose activations stay in L2 while rows stream past

/// Calls kernel<NT>(t) over [t0, t1) in groups of 4, then 2, then 1.
template <class Run>
void token_groups(int64_t t0, int64_t t1, Run&& run) {
  int64_t t = t0;
  for (; t + 4 <= t1; t += 4) run(std::integral_constant<int, 4>{}, t);
  if (t + 2 <= t1) {
    run(std::integral_constant<int, 2>{}, t);
    t += 2;
  }
  if (t < t1) run(std::integral_constant<int, 1>{}, t);
}

template <class K>
void matmul_a(const uint8_t* w, size_t row_bytes, int64_t cols, int64_t row_begin, int64_t row_end,
              const QuantizedActivations& x, int64_t token_begin, int64_t token_end, float* y, int64_t y_stride) {
  const int64_t blocks = cols / 32;
  thread_local RowA rows[2];  // kept between calls: a product cut into many tiles allocates once per thread
  for (RowA& row : rows) row.resize(cols);
  const auto decode = [&](int64_t r, RowA& row) {
    const uint8_t* src = w + static_cast<size_t>(r) * row_bytes;
    for (int64_t b = 0; b < blocks; ++b) {
      K::decode(src + K::kBytes * static_cast<size_t>(b), row.q.data() + 32 * b, row.d[static_cast<size_t>(b)],
                row.m[static_cast<size_t>(b)]);
    }
  };
  for (int64_t t0 = token_begin; t0 < token_end; t0 += kTokenBlock) {
    const int64_t t1 = std::min(token_end, t0 + kTokenBlock);
    int64_t r = row_begin;
    for (; r + 2 <= row_end; r += 2) {
      decode(r, rows[0]);
      decode(r + 1, rows[1]);
      token_groups(t0, t1, [&](auto nt, int64_t t) { kernel_a<K, 2, decltype(nt)::value>(rows, blocks, x, t, y, y_stride, r); });
    }
    if (r < row_end) {
      decode(r, rows[0]);
      token_groups(t0, t1, [&](auto nt, int64_t t) { kernel_a<K, 1, decltype(nt)::value>(rows, blocks, x, t, y, y_stride, r); });
    }
  }
}

template <class K>
void matmul_k(const uint8_t* w, size_t row_bytes, int64_t cols, int64_t row_begin, int64_t row_end,
              const QuantizedActivations& x, int64_t token_begin, int64_t token_end, float* y, int64_t y_stride) {
  const int64_t blocks = cols / 256;
  thread_local std::vector<KBlock> row;  // as matmul_a's rows
  row.resize(static_cast<size_t>(blocks));
  for (int64_t t0 = token_begin; t0 < token_end; t0 += kTokenBlock) {
    const int64_t t1 = std::min(token_end, t0 + kTokenBlock);
    for (int64_t r = row_begin; r < row_end; ++r) {
      const uint8_t* src = w + static_cast<size_t>(r) * row_bytes;
      for (int64_t b = 0; b < blocks; ++b) K::decode(src + K::kBytes * static_cast<size_t>(b), row[static_cast<size_t>(b)]);
      token_groups(t0, t1, [&](auto nt, int64_t t) { kernel_k<K, decltype(nt)::value>(row.data(), blocks, x, t, y, y_stride, r); });
    }
  }
}

void require() {
  if (!available()) throw Error("the AVX2 quantized kernels need AVX2, FMA and F16C, which this CPU lacks");
}

}  // namespace

void quantize_activations(GgmlType weight_type, const float* x, int64_t cols, std::vector<uint8_t>& out,
                          Q8Rounding rounding) {
  require();
  const bool blocked = supported_type(weight_type) && activation_block_elements(activation_type(weight_type)) > 1;
  const int64_t block = blocked ? activation_block_elements(activation_type(weight_type)) : 1;
  if (!blocked || cols < 0 || cols % block != 0 || (cols > 0 && x == nullptr)) {
    // Float types are plain conversions; anything invalid gets the reference's error.
    scalar::quantize_activations(weight_type, x, cols, out, rounding);
    return;
  }
  const ActivationType type = activation_type(weight_type);
  out.resize(static_cast<size_t>(cols / block) * activation_block_bytes(type));
  if (cols > 0) quantize_row(type, x, cols, out.data(), nullptr, nullptr, 0, nullptr, rounding);
}

void quantize_activation_rows(const float* x, int64_t t_begin, int64_t t_end, QuantizedActivations& out) {
  require();
  detail::check_activation_rows(x, t_begin, t_end, out);
  if (out.cols == 0) return;
  const auto cols = static_cast<size_t>(out.cols);
  for (int64_t t = t_begin; t < t_end; ++t) {
    const float* row = x + static_cast<size_t>(t) * cols;
    if (out.type == ActivationType::f32 || out.type == ActivationType::f16 || out.type == ActivationType::bf16) {
      float* dst = out.values.data() + static_cast<size_t>(t) * cols;
      size_t i = 0;
      if (out.type == ActivationType::f32) {
        std::memcpy(dst, row, cols * sizeof(float));
        continue;
      }
      for (; i + 8 <= cols; i += 8) {
        const __m256 v = _mm256_loadu_ps(row + i);
        const __m256 r = out.type == ActivationType::f16
                             ? _mm256_cvtph_ps(_mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC))
                             : round_bf16(v);
        _mm256_storeu_ps(dst + i, r);
      }
      for (; i < cols; ++i) {
        dst[i] = out.type == ActivationType::f16 ? fp16_to_float(float_to_fp16(row[i]))
                                                 : bf16_to_float(float_to_bf16(row[i]));
      }
      continue;
    }
    float* scales = out.scales.empty() ? nullptr : out.scales.data() + t;
    float* sums = out.sums.empty() ? nullptr : out.sums.data() + t;
    int8_t* quants = out.quants.empty() ? nullptr : out.quants.data() + out.quants_offset + static_cast<size_t>(t) * cols;
    quantize_row(out.type, row, out.cols, out.blocks.data() + static_cast<size_t>(t) * out.row_bytes, scales, sums,
                 static_cast<size_t>(out.tokens), quants, out.rounding);
  }
}

void matmul_rows_quantized(GgmlType type, const uint8_t* w, size_t row_bytes, int64_t cols, int64_t row_begin,
                           int64_t row_end, const QuantizedActivations& x, float* y, int64_t y_stride) {
  avx2::matmul_tile_quantized(type, w, row_bytes, cols, row_begin, row_end, x, 0, x.tokens, y, y_stride);
}

void matmul_tile_quantized(GgmlType type, const uint8_t* w, size_t row_bytes, int64_t cols, int64_t row_begin,
                           int64_t row_end, const QuantizedActivations& x, int64_t token_begin, int64_t token_end,
                           float* y, int64_t y_stride) {
  require();
  detail::check_quantized_tile(type, w, row_bytes, cols, row_begin, row_end, x, token_begin, token_end, y, y_stride);
  if (activation_block_elements(x.type) == 1) {
    const auto first = static_cast<size_t>(token_begin) * static_cast<size_t>(cols);
    avx2::matmul_rows(type, w, row_bytes, cols, row_begin, row_end, x.values.data() + first, token_end - token_begin,
                      y + token_begin * y_stride, y_stride);
    return;
  }
  if (row_end == row_begin || token_end == token_begin) return;
  if (cols == 0) {
    for (int64_t t = token_begin; t < token_end; ++t) std::fill(y + t * y_stride + row_begin, y + t * y_stride + row_end, 0.0f);
    return;
  }
  const int64_t t0 = token_begin, t1 = token_end;
  switch (type) {
    case GgmlType::q4_0: matmul_a<Q4_0>(w, row_bytes, cols, row_begin, row_end, x, t0, t1, y, y_stride); return;
    case GgmlType::q4_1: matmul_a<Q4_1>(w, row_bytes, cols, row_begin, row_end, x, t0, t1, y, y_stride); return;
    case GgmlType::q5_0: matmul_a<Q5_0>(w, row_bytes, cols, row_begin, row_end, x, t0, t1, y, y_stride); return;
    case GgmlType::q5_1: matmul_a<Q5_1>(w, row_bytes, cols, row_begin, row_end, x, t0, t1, y, y_stride); return;
    case GgmlType::q8_0: matmul_a<Q8_0>(w, row_bytes, cols, row_begin, row_end, x, t0, t1, y, y_stride); return;
    case GgmlType::q4_k: matmul_k<Q4_K>(w, row_bytes, cols, row_begin, row_end, x, t0, t1, y, y_stride); return;
    case GgmlType::q5_k: matmul_k<Q5_K>(w, row_bytes, cols, row_begin, row_end, x, t0, t1, y, y_stride); return;
    case GgmlType::q6_k: matmul_k<Q6_K>(w, row_bytes, cols, row_begin, row_end, x, t0, t1, y, y_stride); return;
    default: return;  // float types handled above
  }
}

#else  // no AVX2 code in this build

void quantize_activations(GgmlType, const float*, int64_t, std::vector<uint8_t>&, Q8Rounding) {
  throw Error("the AVX2 quantized kernels are not compiled into this build");
}
void quantize_activation_rows(const float*, int64_t, int64_t, QuantizedActivations&) {
  throw Error("the AVX2 quantized kernels are not compiled into this build");
}
void matmul_rows_quantized(GgmlType, const uint8_t*, size_t, int64_t, int64_t, int64_t, const QuantizedActivations&, float*,
                           int64_t) {
  throw Error("the AVX2 quantized kernels are not compiled into this build");
}
void matmul_tile_quantized(GgmlType, const uint8_t*, size_t, int64_t, int64_t, int64_t, const QuantizedActivations&, int64_t,
                           int64_t, float*, int64_t) {
  throw Error("the AVX2 quantized kernels are not compiled into this build");
}

#endif

}  // namespace gaac::model::avx2
