// Fused AVX2 key scores over compressed slots. A token's row is one key segment (64 channels) per
// 512-byte chunk it spans: two fragment registers, composed by the decoder (key_segment_words) and
// turned into eight float registers with one shift or one AND each, never written out. Their lanes
// are not in channel order, and need not be: the contract only asks that lane l (channels ≡ l mod 32)
// adds its products in channel order, so the queries are stored once in the segment's own order
// (prepare_query) and the reduction reads the lanes where they are.
//
// Lane l = [s0 b0 t1 t0 b1] of the contract (channel bits, within a segment 32·s1 + l) sits in
// accumulator a[t1][b0] at float [t0 s0 b1]; a segment adds its s1 = 0 products, then its s1 = 1
// ones, and the segments of a head come in channel order (half 0's chunks, then half 1's), so every
// lane sees its channels in increasing order. All query heads of the KV head use each segment while
// it is in registers; a head's four accumulators stay in registers for a 64-wide head and are kept in
// a small array between the segments of wider ones.
#include "attention/fused_avx2.hpp"

#if defined(__AVX2__) && defined(__BMI2__) && defined(__FMA__)

#include <immintrin.h>

#include <algorithm>

#include "attention/fused_tile_avx2.hpp"
#include "attention/fused_walk.hpp"

namespace gaac::attention::fused_avx2 {
namespace {

/// The eight float registers of a key segment, f[t1][s1][b0] at floats [t0 s0 b1].
struct SegmentFloats {
  __m256 f[2][2][2];
};

/// Composes key segment 8c + q (c = 2o + kOdd) and widens it to floats: the even words of a word
/// register (b0 = 0) shifted into the high half of their dword, the odd ones (b0 = 1) masked in place.
template <class G, int kOdd, class Exponents>
inline SegmentFloats segment_floats(const uint8_t* slot, const Exponents& exponents, int o, int q) {
  __m256i words[2][2];
  avx2::key_segment_words<G, kOdd>(slot, exponents, o, q, words);
  const __m256i high = _mm256_set1_epi32(static_cast<int>(0xFFFF0000u));
  SegmentFloats s;
  for (int t1 = 0; t1 < 2; ++t1) {
    for (int s1 = 0; s1 < 2; ++s1) {
      s.f[t1][s1][0] = _mm256_castsi256_ps(_mm256_slli_epi32(words[t1][s1], 16));
      s.f[t1][s1][1] = _mm256_castsi256_ps(_mm256_and_si256(words[t1][s1], high));
    }
  }
  return s;
}

/// Adds one segment's products to a head's lanes: q holds the segment's 64 query floats in
/// prepare_query's order (register 4·t1 + 2·s1 + b0).
inline void accumulate(const SegmentFloats& s, const float* q, __m256 a[2][2]) {
  for (int t1 = 0; t1 < 2; ++t1) {
    for (int b0 = 0; b0 < 2; ++b0) {
      a[t1][b0] = _mm256_add_ps(_mm256_mul_ps(s.f[t1][0][b0], _mm256_loadu_ps(q + 8 * (4 * t1 + b0))), a[t1][b0]);
      a[t1][b0] = _mm256_add_ps(_mm256_mul_ps(s.f[t1][1][b0], _mm256_loadu_ps(q + 8 * (4 * t1 + 2 + b0))), a[t1][b0]);
    }
  }
}

/// The contract's reduction of the lanes in a[t1][b0] (floats [t0 s0 b1]): v[l] for l = [t1 t0 b1]
/// is (lane(s0 0, b0 0) + lane(s0 1, b0 0)) + (lane(s0 0, b0 1) + lane(s0 1, b0 1)); h[l] for
/// l = [t0 b1] is v[4 + l] + v[l]; the score (h0 + h2) + (h1 + h3).
inline float reduce(const __m256 a[2][2]) {
  __m256 v[2];
  for (int t1 = 0; t1 < 2; ++t1) {
    // Floats 2·s0 + b1 of each 128-bit lane: s0 = 1 moved onto s0 = 0.
    const __m256 y0 = _mm256_add_ps(a[t1][0], _mm256_permute_ps(a[t1][0], 0x4E));
    const __m256 y1 = _mm256_add_ps(a[t1][1], _mm256_permute_ps(a[t1][1], 0x4E));
    v[t1] = _mm256_add_ps(y0, y1);
  }
  const __m256 h = _mm256_add_ps(v[1], v[0]);  // floats 0, 1 of lane t0: h[2·t0 + b1]
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

/// Where a head's lanes are between the segments of one token.
struct LaneStore {
  alignas(32) float lanes[kMaxQueryHeads][32];
};

/// One segment of token t for every head: `index` is the segment's place in the head (0 first),
/// `segments` their count; the last one writes the scores.
inline void segment_for_heads(const SegmentFloats& s, const BlockTask& task, const float* q, int head_dim, int index,
                              int segments, int t, float scale, LaneStore& store, float* scores) {
  const bool first = index == 0, last = index + 1 == segments;
  for (int g = 0; g < task.heads; ++g) {
    float* kept = store.lanes[g];
    __m256 a[2][2];
    for (int k = 0; k < 4; ++k) a[k / 2][k % 2] = first ? _mm256_setzero_ps() : _mm256_load_ps(kept + 8 * k);
    accumulate(s, q + static_cast<size_t>(g) * head_dim + 64 * index, a);
    if (last) {
      scores[g * kTileTokens + t] = reduce(a) * scale;
    } else {
      for (int k = 0; k < 4; ++k) _mm256_store_ps(kept + 8 * k, a[k / 2][k % 2]);
    }
  }
}

/// This instruction set's parts of the shared block walk (fused_walk.hpp).
struct Isa {
  using LaneStore = fused_avx2::LaneStore;
  template <class G, int kChunk, class Exponents>
  static SegmentFloats segment_floats(const uint8_t* slot, const Exponents& exponents, int o, int q) {
    return fused_avx2::segment_floats<G, kChunk>(slot, exponents, o, q);
  }
  static void segment_for_heads(const SegmentFloats& s, const BlockTask& task, const float* q, int head_dim, int index,
                                int segments, int t, float scale, LaneStore& store, float* scores) {
    fused_avx2::segment_for_heads(s, task, q, head_dim, index, segments, t, scale, store, scores);
  }
};

}  // namespace

void prepare_query(int heads, int head_dim, const float* q, float* out) {
  for (int block = 0; block < heads * head_dim; block += 64) {
    for (int i = 0; i < 64; ++i) {
      const int t1 = i >> 5 & 1, s1 = i >> 4 & 1, b0 = i >> 3 & 1, t0 = i >> 2 & 1, s0 = i >> 1 & 1, b1 = i & 1;
      out[block + i] = q[block + 32 * s1 + 16 * s0 + 8 * b0 + 4 * t1 + 2 * t0 + b1];
    }
  }
}

void key_scores(const BlockTask& task, const float* q, float scale, float* scores) {
  fused::key_scores<Isa>(task, q, scale, scores);
}

}  // namespace gaac::attention::fused_avx2

#endif
