// Fused AVX-512 key scores over compressed slots: fused_keys_avx2.cpp's scheme with 64-byte
// registers. A key segment (one token, 64 channels) is one register: the AVX2 decoder's exponents of
// its two fragment registers side by side, composed with two bitwise selects (vpternlogd), widened
// to four float registers. The contract's 32 lanes are two accumulators per head.
//
// Lane l = [s0 b0 t1 t0 b1] (within a segment, channel 32·s1 + l) sits in accumulator a[b0] at
// float [t1 t0 s0 b1]; a segment adds its s1 = 0 products, then its s1 = 1 ones, and a head's
// segments come in channel order.
#include "attention/fused_avx512.hpp"

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__) && defined(__BMI2__) && defined(__FMA__)

#include <immintrin.h>

#include <algorithm>

#include "attention/fused_tile_avx2.hpp"
#include "attention/fused_walk.hpp"

namespace gaac::attention::fused_avx512 {
namespace {

/// The four float registers of a key segment, f[s1][b0] at floats [t1 t0 s0 b1].
struct SegmentFloats {
  __m512 f[2][2];
};

/// Composes key segment 8c + q (c = 2o + kOdd): stored bytes and exponents to the BF16 values'
/// low and high bytes (two bitwise selects), interleaved to words, widened to floats (even words
/// shifted, odd ones masked).
template <class G, int kOdd, class Exponents>
inline SegmentFloats segment_floats(const uint8_t* slot, const Exponents& exponents, int o, int q) {
  const int segment = 8 * (2 * o + kOdd) + q;
  const __m512i stored = _mm512_loadu_si512(slot + 64 * segment);
  const __m512i e = _mm512_inserti64x4(_mm512_castsi256_si512(exponents.template get<kOdd>(o, 2 * q)),
                                       exponents.template get<kOdd>(o, 2 * q + 1), 1);
  const __m512i top = _mm512_set1_epi8(static_cast<char>(0x80));
  // 0xCA: a ? b : c, bit by bit.
  const __m512i lo = _mm512_ternarylogic_epi32(top, _mm512_slli_epi16(e, 7), stored, 0xCA);
  const __m512i hi = _mm512_ternarylogic_epi32(top, stored, _mm512_srli_epi16(e, 1), 0xCA);
  const __m512i words[2] = {_mm512_unpacklo_epi8(lo, hi), _mm512_unpackhi_epi8(lo, hi)};
  const __m512i high = _mm512_set1_epi32(static_cast<int>(0xFFFF0000u));
  SegmentFloats s;
  for (int s1 = 0; s1 < 2; ++s1) {
    s.f[s1][0] = _mm512_castsi512_ps(_mm512_slli_epi32(words[s1], 16));
    s.f[s1][1] = _mm512_castsi512_ps(_mm512_and_si512(words[s1], high));
  }
  return s;
}

/// Adds one segment's products to a head's lanes: q holds the segment's 64 query floats in
/// prepare_query's order (register 2·s1 + b0).
inline void accumulate(const SegmentFloats& s, const float* q, __m512 a[2]) {
  for (int b0 = 0; b0 < 2; ++b0) {
    a[b0] = _mm512_add_ps(_mm512_mul_ps(s.f[0][b0], _mm512_loadu_ps(q + 16 * b0)), a[b0]);
    a[b0] = _mm512_add_ps(_mm512_mul_ps(s.f[1][b0], _mm512_loadu_ps(q + 16 * (2 + b0))), a[b0]);
  }
}

/// The contract's reduction of the lanes in a[b0] (floats [t1 t0 s0 b1]): v[t1 t0 b1] is
/// (lane(s0 0, b0 0) + lane(s0 1, b0 0)) + (lane(s0 0, b0 1) + lane(s0 1, b0 1)); h[t0 b1] is
/// v[1 t0 b1] + v[0 t0 b1]; the score (h0 + h2) + (h1 + h3).
inline float reduce(const __m512 a[2]) {
  const __m512 y0 = _mm512_add_ps(a[0], _mm512_permute_ps(a[0], 0x4E));
  const __m512 y1 = _mm512_add_ps(a[1], _mm512_permute_ps(a[1], 0x4E));
  const __m512 v = _mm512_add_ps(y0, y1);
  const __m256 upper = _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1));
  const __m256 h = _mm256_add_ps(upper, _mm512_castps512_ps256(v));  // floats 0, 1 of lane t0
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

/// Where a head's lanes wait between the segments of one token.
struct LaneStore {
  alignas(64) float lanes[kMaxQueryHeads][32];
};

/// One segment of token t for every head: `index` is the segment's place in the head (0 first),
/// `segments` their count; the last one writes the scores.
inline void segment_for_heads(const SegmentFloats& s, const BlockTask& task, const float* q, int head_dim, int index,
                              int segments, int t, float scale, LaneStore& store, float* scores) {
  const bool first = index == 0, last = index + 1 == segments;
  for (int g = 0; g < task.heads; ++g) {
    float* kept = store.lanes[g];
    __m512 a[2];
    for (int k = 0; k < 2; ++k) a[k] = first ? _mm512_setzero_ps() : _mm512_load_ps(kept + 16 * k);
    accumulate(s, q + static_cast<size_t>(g) * head_dim + 64 * index, a);
    if (last) {
      scores[g * kTileTokens + t] = reduce(a) * scale;
    } else {
      for (int k = 0; k < 2; ++k) _mm512_store_ps(kept + 16 * k, a[k]);
    }
  }
}

/// This instruction set's parts of the shared block walk (fused_walk.hpp).
struct Isa {
  using LaneStore = fused_avx512::LaneStore;
  template <class G, int kChunk, class Exponents>
  static SegmentFloats segment_floats(const uint8_t* slot, const Exponents& exponents, int o, int q) {
    return fused_avx512::segment_floats<G, kChunk>(slot, exponents, o, q);
  }
  static void segment_for_heads(const SegmentFloats& s, const BlockTask& task, const float* q, int head_dim, int index,
                                int segments, int t, float scale, LaneStore& store, float* scores) {
    fused_avx512::segment_for_heads(s, task, q, head_dim, index, segments, t, scale, store, scores);
  }
};

}  // namespace

bool compiled() { return true; }

void prepare_query(int heads, int head_dim, const float* q, float* out) {
  for (int block = 0; block < heads * head_dim; block += 64) {
    for (int i = 0; i < 64; ++i) {
      const int s1 = i >> 5 & 1, b0 = i >> 4 & 1, t1 = i >> 3 & 1, t0 = i >> 2 & 1, s0 = i >> 1 & 1, b1 = i & 1;
      out[block + i] = q[block + 32 * s1 + 16 * s0 + 8 * b0 + 4 * t1 + 2 * t0 + b1];
    }
  }
}

void key_scores(const BlockTask& task, const float* q, float scale, float* scores) {
  fused::key_scores<Isa>(task, q, scale, scores);
}

}  // namespace gaac::attention::fused_avx512

#else  // no AVX-512 in this build

namespace gaac::attention::fused_avx512 {
bool compiled() { return false; }
void prepare_query(int, int, const float*, float*) {}
void key_scores(const BlockTask&, const float*, float, float*) {}
}  // namespace gaac::attention::fused_avx512

#endif
