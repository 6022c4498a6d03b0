// AVX2 tile codec: exactly the reference's slot bytes, counts, decoded values and statuses
// (reference.cpp is the oracle; tests/codec/backend_test.cpp compares the two bit for bit).
//
// The slot keeps a tile in fragment order: byte p of the sign+mantissa section is element p, and
// every 8 consecutive fragment positions are one exponent group. So both directions do their
// arithmetic in fragment order, 32 elements per register, and move between fragment order and the
// row-major tile only at one end:
//
//   decode: code words + b3 -> exponents as if every group were 3-bit (fragment order)
//           -> scalar pass over the 4-bit and raw groups only, in group order: validation, escapes
//           -> compose the two bytes of each BF16 value and permute them to rows
//   encode: rows -> split each BF16 value into its stored byte and exponent, permute to fragment order
//           -> modes and offsets per group -> code words -> scalar pass for tags and escapes
//
// The permutation is a fixed network of shuffles per tensor kind. Each intermediate state is a
// Layout (which bit of an element's fragment index sits at which bit of its byte position), and the
// shuffle controls are derived from those layouts at compile time.
#include "kernels.hpp"

#if defined(__AVX2__)

#include <immintrin.h>

#include <algorithm>
#include <array>
#include <cstring>

namespace gaac::avx2 {
namespace {

// ----------------------------------------------------------------------------------------------
// Layouts and the shuffle controls derived from them

/// Entry k (0..3) names the bit of an element's index found at bit k of the element's byte offset
/// inside its 128-bit lane; entry 4 names the index bit that selects the lane.
using Layout = std::array<int, 5>;

constexpr int index_at(const Layout& layout, int position) {
  int index = 0;
  for (int k = 0; k < 5; ++k) index |= ((position >> k) & 1) << layout[k];
  return index;
}

constexpr int position_of(const Layout& layout, int index) {
  int position = 0;
  for (int k = 0; k < 5; ++k) position |= ((index >> layout[k]) & 1) << k;
  return position;
}

struct ByteControl {
  std::array<uint8_t, 32> bytes;
};
struct DwordControl {
  std::array<uint32_t, 8> dwords;
};

/// vpshufb control moving every byte from its place under `from` to its place under `to`.
constexpr ByteControl byte_shuffle(const Layout& from, const Layout& to) {
  ByteControl control{};
  for (int d = 0; d < 32; ++d) control.bytes[d] = static_cast<uint8_t>(position_of(from, index_at(to, d)) & 15);
  return control;
}

/// True when no byte changes lanes, so vpshufb can do the move.
constexpr bool lane_local(const Layout& from, const Layout& to) {
  for (int d = 0; d < 32; ++d) {
    if (position_of(from, index_at(to, d)) / 16 != d / 16) return false;
  }
  return true;
}

/// vpermd control; valid when the two layouts agree on the byte inside each dword.
constexpr DwordControl dword_permutation(const Layout& from, const Layout& to) {
  DwordControl control{};
  for (int d = 0; d < 8; ++d) control.dwords[d] = static_cast<uint32_t>(position_of(from, index_at(to, 4 * d)) / 4);
  return control;
}

constexpr bool dword_local(const Layout& from, const Layout& to) { return from[0] == to[0] && from[1] == to[1]; }

/// Fragment order itself: index bit k at position bit k.
constexpr Layout kFragment = {0, 1, 2, 3, 4};

// Keys. A key segment is 64 consecutive fragment bytes: lanes 4g..4g+3 of one 512-byte chunk, i.e.
// one token and 64 channels. Its index bits are p = [t1 t0 s1 s0 b1 b0] (lane 4g+t, quad 4·(s/4)+s,
// byte b of the quad) and its channel is [s1 s0 b0 t1 t0 b1] (format.hpp: 16s + 2t + {0,8,1,9}[b]).
// Register r of the segment holds p5 = r. Towards rows: put p0 at bit 2, let vpermd swap it into
// the lane bit, arrange the rest for a dword interleave of the two registers (p5 comes in at bit 2,
// p3 picks the output register) and a final byte interleave with the other byte stream (p2 picks
// the output register), which leaves channel = [p3 p2 | p0 | p5 p4 p1] = (register, lane, word).
constexpr Layout kKeyStep1 = {1, 2, 0, 3, 4};
constexpr Layout kKeyStep2 = {1, 2, 4, 3, 0};
constexpr Layout kKeyStep3 = {1, 4, 2, 3, 0};
static_assert(lane_local(kFragment, kKeyStep1) && dword_local(kKeyStep1, kKeyStep2) && lane_local(kKeyStep2, kKeyStep3));

constexpr ByteControl kKeyToRows1 = byte_shuffle(kFragment, kKeyStep1);
constexpr DwordControl kKeyToRows2 = dword_permutation(kKeyStep1, kKeyStep2);
constexpr ByteControl kKeyToRows3 = byte_shuffle(kKeyStep2, kKeyStep3);
constexpr ByteControl kKeyToFragment3 = byte_shuffle(kKeyStep3, kKeyStep2);
constexpr DwordControl kKeyToFragment2 = dword_permutation(kKeyStep2, kKeyStep1);
constexpr ByteControl kKeyToFragment1 = byte_shuffle(kKeyStep1, kFragment);

// Values. A value chunk is 512 fragment bytes, 32 channels × 16 tokens, in 16 registers numbered
// i = [g2 g1 g0 t1] (lanes 2i, 2i+1 = 4g + 2t1 + t0). Inside a register the index bits are
// [t0 | cc1 cc0 b1 b0]; the element is channel 8cc + g, token [b0 t1 t0 b1]. The network works on
// the eight registers of one t1 at a time, numbered j = [g2 g1 g0]. Towards rows: move cc0 to bit 0,
// three byte-interleave rounds on g2, g1, g0 (each round drops the top bit of the byte offset into
// the register number), then vpermq swaps the lane with bit 3. The register number ends as
// j = [b0 b1 cc1]; the final byte interleave picks t0.
constexpr Layout kValueStep1 = {2, 3, 1, 0, 4};
static_assert(lane_local(kFragment, kValueStep1));
constexpr ByteControl kValueToRows1 = byte_shuffle(kFragment, kValueStep1);
constexpr ByteControl kValueToFragment1 = byte_shuffle(kValueStep1, kFragment);

/// Row and first channel (relative to the chunk) of value register j of half t1 after the network,
/// for the low (t0 = 0) and high (t0 = 1) half of the final byte interleave.
constexpr int value_row(int j, int t1, int t0) { return 8 * ((j >> 2) & 1) + 4 * t1 + 2 * t0 + ((j >> 1) & 1); }
constexpr int value_column(int j) { return 16 * (j & 1); }

/// Per lane: even bytes, then odd bytes (undoes one byte interleave round).
constexpr ByteControl kSplitEvenOdd = [] {
  ByteControl control{};
  for (int d = 0; d < 32; ++d) control.bytes[d] = static_cast<uint8_t>(d % 16 < 8 ? 2 * (d % 8) : 2 * (d % 8) + 1);
  return control;
}();

/// Gathers, from 16 channels [b0 t1 t0 b1] of a key base row, dword t = the four bytes b of lane t.
constexpr std::array<uint8_t, 16> kKeyBaseGather = [] {
  std::array<uint8_t, 16> control{};
  for (int t = 0; t < 4; ++t) {
    for (int b = 0; b < 4; ++b) control[4 * t + b] = static_cast<uint8_t>(8 * (b & 1) + 2 * t + (b >> 1));
  }
  return control;
}();

/// Spreads byte k of dword j over four bytes: 16-byte lane = [x4j ×4, x4j+1 ×4, x4j+2 ×4, x4j+3 ×4].
constexpr std::array<ByteControl, 4> kSpreadDword = [] {
  std::array<ByteControl, 4> controls{};
  for (int j = 0; j < 4; ++j) {
    for (int d = 0; d < 32; ++d) controls[j].bytes[d] = static_cast<uint8_t>(4 * j + (d % 16) / 4);
  }
  return controls;
}();

// ----------------------------------------------------------------------------------------------
// Small helpers

inline __m256i load(const void* p) { return _mm256_loadu_si256(static_cast<const __m256i*>(p)); }
inline void store(void* p, __m256i v) { _mm256_storeu_si256(static_cast<__m256i*>(p), v); }
inline __m256i load(const ByteControl& c) { return load(c.bytes.data()); }
inline __m256i load(const DwordControl& c) { return load(c.dwords.data()); }

inline __m128i load8(const void* p) { return _mm_loadl_epi64(static_cast<const __m128i*>(p)); }
inline uint64_t load_u64(const void* p) {
  uint64_t v;
  std::memcpy(&v, p, sizeof v);
  return v;
}
inline void store_u16(void* p, uint16_t v) { std::memcpy(p, &v, sizeof v); }

constexpr uint64_t kByteBit0 = 0x0101010101010101ull;

/// Decode: the low and high byte of each BF16 value from its stored byte (sign | mantissa) and its
/// exponent. The 16-bit shifts leak bits across bytes only into bits the masks drop.
inline void compose(__m256i stored, __m256i exponent, __m256i& lo, __m256i& hi) {
  const __m256i top = _mm256_set1_epi8(static_cast<char>(0x80));
  lo = _mm256_or_si256(_mm256_andnot_si256(top, stored), _mm256_and_si256(_mm256_slli_epi16(exponent, 7), top));
  hi = _mm256_or_si256(_mm256_and_si256(stored, top), _mm256_andnot_si256(top, _mm256_srli_epi16(exponent, 1)));
}

/// Encode: the stored byte of each of 16 BF16 values, in the low byte of its word.
inline __m256i stored_bytes16(__m256i x) {
  return _mm256_or_si256(_mm256_and_si256(x, _mm256_set1_epi16(0x7F)),
                         _mm256_and_si256(_mm256_srli_epi16(x, 8), _mm256_set1_epi16(0x80)));
}

/// Encode: the exponent of each of 16 BF16 values, in the low byte of its word.
inline __m256i exponents16(__m256i x) { return _mm256_and_si256(_mm256_srli_epi16(x, 7), _mm256_set1_epi16(0xFF)); }

// ----------------------------------------------------------------------------------------------
// The permutation networks, one byte stream at a time

/// Key segment, decode side: the two fragment registers of one byte stream become the two
/// registers the final byte interleave expects (register R holds channels 32R..32R+31).
inline void key_stream_to_rows(__m256i x[2]) {
  const __m256i step1 = load(kKeyToRows1), step2 = load(kKeyToRows2), step3 = load(kKeyToRows3);
  for (int r = 0; r < 2; ++r) {
    x[r] = _mm256_shuffle_epi8(_mm256_permutevar8x32_epi32(_mm256_shuffle_epi8(x[r], step1), step2), step3);
  }
  const __m256i low = _mm256_unpacklo_epi32(x[0], x[1]);
  const __m256i high = _mm256_unpackhi_epi32(x[0], x[1]);
  x[0] = low;
  x[1] = high;
}

/// Key segment, encode side: the inverse of key_stream_to_rows.
inline void key_stream_to_fragment(__m256i x[2]) {
  const __m256 low = _mm256_castsi256_ps(x[0]), high = _mm256_castsi256_ps(x[1]);
  x[0] = _mm256_castps_si256(_mm256_shuffle_ps(low, high, 0x88));  // dwords 0, 2 of each
  x[1] = _mm256_castps_si256(_mm256_shuffle_ps(low, high, 0xDD));  // dwords 1, 3 of each
  const __m256i step3 = load(kKeyToFragment3), step2 = load(kKeyToFragment2), step1 = load(kKeyToFragment1);
  for (int r = 0; r < 2; ++r) {
    x[r] = _mm256_shuffle_epi8(_mm256_permutevar8x32_epi32(_mm256_shuffle_epi8(x[r], step3), step2), step1);
  }
}

/// Value half-chunk, decode side: 8 fragment registers of one byte stream to the layout the final
/// byte interleave expects (see value_row / value_column).
inline void value_stream_to_rows(__m256i x[8]) {
  const __m256i step1 = load(kValueToRows1);
#pragma GCC unroll 8
  for (int j = 0; j < 8; ++j) x[j] = _mm256_shuffle_epi8(x[j], step1);
#pragma GCC unroll 3
  for (int bit = 4; bit >= 1; bit /= 2) {
#pragma GCC unroll 8
    for (int j = 0; j < 8; ++j) {
      if (j & bit) continue;
      const __m256i a = x[j], b = x[j | bit];
      x[j] = _mm256_unpacklo_epi8(a, b);
      x[j | bit] = _mm256_unpackhi_epi8(a, b);
    }
  }
#pragma GCC unroll 8
  for (int j = 0; j < 8; ++j) x[j] = _mm256_permute4x64_epi64(x[j], 0xD8);  // swap lane and bit 3
}

/// Value half-chunk, encode side: the inverse of value_stream_to_rows.
inline void value_stream_to_fragment(__m256i x[8]) {
#pragma GCC unroll 8
  for (int j = 0; j < 8; ++j) x[j] = _mm256_permute4x64_epi64(x[j], 0xD8);
  const __m256i split = load(kSplitEvenOdd);
#pragma GCC unroll 3
  for (int bit = 1; bit <= 4; bit *= 2) {
#pragma GCC unroll 8
    for (int j = 0; j < 8; ++j) {
      if (j & bit) continue;
      const __m256i a = _mm256_shuffle_epi8(x[j], split), b = _mm256_shuffle_epi8(x[j | bit], split);
      x[j] = _mm256_unpacklo_epi64(a, b);
      x[j | bit] = _mm256_unpackhi_epi64(a, b);
    }
  }
  const __m256i step1 = load(kValueToFragment1);
#pragma GCC unroll 8
  for (int j = 0; j < 8; ++j) x[j] = _mm256_shuffle_epi8(x[j], step1);
}

// ----------------------------------------------------------------------------------------------
// Tile geometry and the bases in fragment order

template <TensorKind Kind, int Channels>
struct Geometry {
  static constexpr TileShape kShape{Kind, Channels};
  static constexpr int kElements = kShape.elements();
  static constexpr int kGroups = kShape.groups();
  static constexpr int kGroupsPerLane = kShape.groups_per_lane();
  static constexpr int kChunks = kShape.quads_per_lane() / 4;  // 512-byte chunks of fragment order
  static constexpr int kOctets = kShape.quads_per_lane() / 8;  // code-word octets per lane
  static constexpr int kHalves = Channels / 64;                // key segments per token row

  /// Fragment offset of group g's eight elements.
  static constexpr int group_offset(int g) {
    const int lane = g / kGroupsPerLane, k = g % kGroupsPerLane;
    return k / 2 * 512 + lane * 16 + k % 2 * 8;
  }
  /// Token row and first channel of key segment `segment` (64 fragment bytes).
  static constexpr int key_row(int segment) { return segment / 8 / kHalves * 8 + segment % 8; }
  static constexpr int key_column(int segment) { return segment / 8 % kHalves * 64; }
};

/// The channel bases as the fragment-order passes read them: 32 bytes for fragment register v
/// (b3(v), b4(v)), and for the group at fragment offset `at` its eight b3 bytes and its eight
/// b4 - b3 steps (modulo 256), in the low half of an xmm (b3_group, step_group).
template <class G, TensorKind Kind = G::kShape.kind>
class FragmentBases;

/// Keys: the bases repeat with the token, so a few registers hold them all. Pattern 2h + t1 holds,
/// at fragment byte [t0 | s1 s0 b1 b0], the base of channel 64h + 16s + 8b0 + 4t1 + 2t0 + b1.
template <class G>
class FragmentBases<G, TensorKind::key> {
 public:
  explicit FragmentBases(const TileBases& bases) {
    patterns(bases.b3.data(), b3_);
    patterns(bases.b4.data(), b4_);
    for (int i = 0; i < 2 * G::kHalves; ++i) store(step_[i], _mm256_sub_epi8(load(b4_[i]), load(b3_[i])));
  }
  __m256i b3(int v) const { return load(b3_[pattern(v)]); }
  __m256i b4(int v) const { return load(b4_[pattern(v)]); }
  __m128i b3_group(int at) const { return load8(b3_[pattern(at / 32)] + at % 32); }
  __m128i step_group(int at) const { return load8(step_[pattern(at / 32)] + at % 32); }
  __m256i step(int v) const { return load(step_[pattern(v)]); }

 private:
  static constexpr int pattern(int v) { return v / 16 % G::kHalves * 2 + v % 2; }

  static void patterns(const uint8_t* base, uint8_t (*out)[32]) {
    const __m128i gather = _mm_loadu_si128(reinterpret_cast<const __m128i*>(kKeyBaseGather.data()));
    for (int h = 0; h < G::kHalves; ++h) {
      __m128i d[4];  // d[s] dword t: the bases of lane t, quad s
      for (int s = 0; s < 4; ++s) {
        d[s] = _mm_shuffle_epi8(_mm_loadu_si128(reinterpret_cast<const __m128i*>(base + 64 * h + 16 * s)), gather);
      }
      // 4 × 4 dword transpose: lane t collects dword t of every quad.
      const __m128i a = _mm_unpacklo_epi32(d[0], d[1]), b = _mm_unpacklo_epi32(d[2], d[3]);
      const __m128i c = _mm_unpackhi_epi32(d[0], d[1]), e = _mm_unpackhi_epi32(d[2], d[3]);
      store(out[2 * h], _mm256_setr_m128i(_mm_unpacklo_epi64(a, b), _mm_unpackhi_epi64(a, b)));
      store(out[2 * h + 1], _mm256_setr_m128i(_mm_unpacklo_epi64(c, e), _mm_unpackhi_epi64(c, e)));
    }
  }

  alignas(32) uint8_t b3_[2 * G::kHalves][32];
  alignas(32) uint8_t b4_[2 * G::kHalves][32];
  alignas(32) uint8_t step_[2 * G::kHalves][32];
};

/// Values: fragment register v = 16c + 2g + t1 needs, in both lanes, the base of channel
/// 32c + 8cc + g at bytes 4cc..4cc+3: one byte shuffle of the dword [x(g), x(8+g), x(16+g), x(24+g)],
/// kept for every chunk and g.
template <class G>
class FragmentBases<G, TensorKind::value> {
 public:
  explicit FragmentBases(const TileBases& bases) {
    for (int c = 0; c < G::kChunks; ++c) {
      __m256i d3[2], d4[2];
      dwords(bases.b3.data() + 32 * c, d3);
      dwords(bases.b4.data() + 32 * c, d4);
      for (int i = 0; i < 2; ++i) {
        store(b3_[c][i], d3[i]);
        store(b4_[c][i], d4[i]);
        store(step_[c][i], _mm256_sub_epi8(d4[i], d3[i]));
      }
    }
  }
  __m256i b3(int v) const { return spread(b3_, v); }
  __m256i b4(int v) const { return spread(b4_, v); }
  __m128i b3_group(int at) const { return group(b3_, at); }
  __m128i step_group(int at) const { return group(step_, at); }
  __m256i step(int v) const { return spread(step_, v); }

 private:
  /// Both halves of `out`: dword g (g = 0..3, then 4..7) = [x(g), x(8+g), x(16+g), x(24+g)].
  static void dwords(const uint8_t* x, __m256i out[2]) {
    const __m128i low = _mm_loadu_si128(reinterpret_cast<const __m128i*>(x));
    const __m128i high = _mm_loadu_si128(reinterpret_cast<const __m128i*>(x + 16));
    const __m128i pairs_low = _mm_unpacklo_epi8(low, _mm_srli_si128(low, 8));     // (x[g], x[8+g])
    const __m128i pairs_high = _mm_unpacklo_epi8(high, _mm_srli_si128(high, 8));  // (x[16+g], x[24+g])
    out[0] = _mm256_broadcastsi128_si256(_mm_unpacklo_epi16(pairs_low, pairs_high));
    out[1] = _mm256_broadcastsi128_si256(_mm_unpackhi_epi16(pairs_low, pairs_high));
  }
  using Table = uint8_t[G::kChunks][2][32];

  static __m256i spread(const Table& dwords, int v) {
    const int c = v / 16, g = v % 16 / 2;
    return _mm256_shuffle_epi8(load(dwords[c][g / 4]), load(kSpreadDword[g % 4]));
  }
  /// The group at `at` (chunk c, lane 4g + t, half h) covers channels 32c + 16h + g (bytes 0..3)
  /// and 32c + 16h + 8 + g (bytes 4..7): bytes 2h, 2h+1 of dword g.
  static __m128i group(const Table& dwords, int at) {
    const int c = at / 512, g = at % 512 / 64, h = at % 16 / 8;
    uint16_t pair;
    std::memcpy(&pair, &dwords[c][g / 4][4 * (g % 4) + 2 * h], sizeof pair);
    return _mm_shuffle_epi8(_mm_cvtsi32_si128(pair), _mm_setr_epi8(0, 0, 0, 0, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0));
  }

  alignas(32) Table b3_;
  alignas(32) Table b4_;
  alignas(32) Table step_;
};

// ----------------------------------------------------------------------------------------------
// Code words. Per lane and octet o of quads: W0 = q0 | q1 << 3 | (q6 & 3) << 6,
// W1 = q2 | q3 << 3 | (q7 & 3) << 6, W2 = q4 | q5 << 3 | (q6 >> 2) << 6 | (q7 >> 2) << 7, byte b of
// each word for byte b of the quads. In fragment order, chunk 2o holds quads 0..3 of the octet and
// chunk 2o+1 quads 4..7, one dword per quad. The first area holds per lane [W0 of every octet, W1 of
// every octet], the second [W2 of every octet].

template <class G>
struct CodeArea {
  static constexpr int kFirstWords = 2 * G::kOctets;  // per lane
  static constexpr int kSecondOffset = kWarpLanes * kFirstWords * 4;

  /// The first-area words of lanes 2p, 2p+1 (dword j·kFirstWords + w is word w of lane 2p+j).
  static __m256i first(const uint8_t* codes, int p) {
    if constexpr (G::kOctets == 2) return load(codes + 32 * p);
    return _mm256_zextsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(codes + 16 * p)));
  }
  /// The W2 words of lanes 2p, 2p+1 (dword j·kOctets + o).
  static __m256i second(const uint8_t* codes, int p) {
    const uint8_t* at = codes + kSecondOffset + 8 * G::kOctets * p;
    if constexpr (G::kOctets == 2) return _mm256_zextsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(at)));
    return _mm256_zextsi128_si256(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(at)));
  }
};

/// Decode: the 3-bit codes of fragment register 16c + p, chunk c = 2o + kOdd.
template <class G, int kOdd>
__m256i read_codes(const uint8_t* codes, int o, int p) {
  using Area = CodeArea<G>;
  constexpr int kOc = G::kOctets, kFw = Area::kFirstWords;
  const __m256i octet = _mm256_set1_epi32(o);
  if constexpr (kOdd == 0) {  // quads 0..3: W0, W0 >> 3, W1, W1 >> 3
    const __m256i pick = _mm256_add_epi32(_mm256_setr_epi32(0, 0, kOc, kOc, kFw, kFw, kFw + kOc, kFw + kOc), octet);
    const __m256i shift = _mm256_setr_epi32(0, 3, 0, 3, 0, 3, 0, 3);
    const __m256i w = _mm256_permutevar8x32_epi32(Area::first(codes, p), pick);
    return _mm256_and_si256(_mm256_srlv_epi32(w, shift), _mm256_set1_epi8(7));
  } else {  // quads 4..7: W2, W2 >> 3, W0 >> 6 | bit 6 of W2, W1 >> 6 | bit 7 of W2
    const __m256i pick01 = _mm256_add_epi32(_mm256_setr_epi32(0, 0, 0, kOc, 0, 0, kFw, kFw + kOc), octet);
    const __m256i pick2 = _mm256_add_epi32(_mm256_setr_epi32(0, 0, 0, 0, kOc, kOc, kOc, kOc), octet);
    const __m256i shift01 = _mm256_setr_epi32(32, 32, 6, 6, 32, 32, 6, 6);
    const __m256i shift2 = _mm256_setr_epi32(0, 3, 4, 5, 0, 3, 4, 5);
    const __m256i mask2 = _mm256_setr_epi8(7, 7, 7, 7, 7, 7, 7, 7, 4, 4, 4, 4, 4, 4, 4, 4,  //
                                           7, 7, 7, 7, 7, 7, 7, 7, 4, 4, 4, 4, 4, 4, 4, 4);
    const __m256i w01 = _mm256_permutevar8x32_epi32(Area::first(codes, p), pick01);
    const __m256i w2 = _mm256_permutevar8x32_epi32(Area::second(codes, p), pick2);
    return _mm256_or_si256(_mm256_and_si256(_mm256_srlv_epi32(w2, shift2), mask2),
                           _mm256_and_si256(_mm256_srlv_epi32(w01, shift01), _mm256_set1_epi8(3)));
  }
}

/// Encode: the code words of every lane from the offsets (fragment order; low 3 bits used).
template <class G>
void write_code_words(const uint8_t* offsets, uint8_t* codes) {
  using Area = CodeArea<G>;
  const __m256i low3 = _mm256_set1_epi8(7), low2 = _mm256_set1_epi8(3), bit0 = _mm256_set1_epi8(1);
  const __m256i shift_a = _mm256_setr_epi32(0, 3, 0, 3, 0, 3, 0, 3);
  const __m256i shift_67 = _mm256_setr_epi32(32, 32, 6, 6, 32, 32, 6, 6);
  const __m256i shift_45 = _mm256_setr_epi32(0, 3, 32, 32, 0, 3, 32, 32);
  const __m256i shift_hi = _mm256_setr_epi32(32, 32, 6, 7, 32, 32, 6, 7);
  for (int p = 0; p < 16; ++p) {
    __m256i w01[G::kOctets], w2[G::kOctets];  // per lane: dword 0 = W0, dword 2 = W1; dword 0 = W2
    for (int o = 0; o < G::kOctets; ++o) {
      const __m256i a = _mm256_and_si256(load(offsets + 512 * (2 * o) + 32 * p), low3);      // quads 0..3
      const __m256i b = _mm256_and_si256(load(offsets + 512 * (2 * o + 1) + 32 * p), low3);  // quads 4..7
      const __m256i sa = _mm256_sllv_epi32(a, shift_a);
      const __m256i q67 = _mm256_sllv_epi32(_mm256_and_si256(b, low2), shift_67);
      w01[o] = _mm256_or_si256(_mm256_or_si256(sa, _mm256_srli_epi64(sa, 32)), _mm256_shuffle_epi32(q67, 0xFE));
      __m256i t = _mm256_or_si256(_mm256_sllv_epi32(b, shift_45),
                                  _mm256_sllv_epi32(_mm256_and_si256(_mm256_srli_epi32(b, 2), bit0), shift_hi));
      t = _mm256_or_si256(t, _mm256_srli_epi64(t, 32));
      w2[o] = _mm256_or_si256(t, _mm256_shuffle_epi32(t, 0x02));
    }
    if constexpr (G::kOctets == 2) {
      // Lane: [W0(0) W0(1) W1(0) W1(1)], 16 bytes per lane; [W2(0) W2(1)], 8 bytes per lane.
      const __m256i first = _mm256_unpacklo_epi32(_mm256_shuffle_epi32(w01[0], 0x08), _mm256_shuffle_epi32(w01[1], 0x08));
      store(codes + 32 * p, first);
      const __m256i second = _mm256_permute4x64_epi64(_mm256_unpacklo_epi32(w2[0], w2[1]), 0x08);
      _mm_storeu_si128(reinterpret_cast<__m128i*>(codes + Area::kSecondOffset + 16 * p), _mm256_castsi256_si128(second));
    } else {
      // Lane: [W0 W1], 8 bytes per lane; [W2], 4 bytes per lane.
      const __m256i first = _mm256_permute4x64_epi64(_mm256_shuffle_epi32(w01[0], 0x08), 0x08);
      _mm_storeu_si128(reinterpret_cast<__m128i*>(codes + 16 * p), _mm256_castsi256_si128(first));
      const __m256i second = _mm256_permutevar8x32_epi32(w2[0], _mm256_setr_epi32(0, 4, 0, 0, 0, 0, 0, 0));
      _mm_storel_epi64(reinterpret_cast<__m128i*>(codes + Area::kSecondOffset + 8 * p), _mm256_castsi256_si128(second));
    }
  }
}

// ----------------------------------------------------------------------------------------------
// Decode

/// True when escape bytes [from, capacity) are all zero. The range ends on a 16-byte block (the
/// capacity is a multiple of 16), so its first block is read whole and the bytes before `from`
/// masked off.
bool padding_is_zero(const uint8_t* escapes, size_t from, size_t capacity) {
  if (from >= capacity) return true;
  size_t block = from & ~size_t{15};
  const __m128i index = _mm_setr_epi8(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
  const __m128i keep = _mm_cmpgt_epi8(index, _mm_set1_epi8(static_cast<char>(from - block - 1)));
  __m128i any = _mm_and_si128(_mm_loadu_si128(reinterpret_cast<const __m128i*>(escapes + block)), keep);
  for (block += 16; block < capacity; block += 16) {
    any = _mm_or_si128(any, _mm_loadu_si128(reinterpret_cast<const __m128i*>(escapes + block)));
  }
  return _mm_testz_si128(any, any);
}

/// The tags, one 32-bit word ("row": 16 consecutive groups) at a time: where each row's escapes
/// start, which rows hold raw groups, and how many escape bytes the tile uses.
template <class G>
struct TagRows {
  static constexpr int kRows = G::kGroups / 16;
  uint16_t start[kRows];  // escape offset of the row's first group
  uint32_t raw_rows;      // bit r: row r has a raw group
  uint32_t used;          // escape bytes of the whole tile
};

/// The reference's verdict on tags that hold a 3 or ask for more than `capacity` escape bytes:
/// whichever problem comes first in group order. Only bad slots get here.
template <class G>
DecodeStatus first_tag_problem(const uint8_t* tags, size_t capacity) {
  size_t next = 0;
  for (int g = 0; g < G::kGroups; ++g) {
    const unsigned tag = tags[g / 4] >> (2 * (g % 4)) & 3u;
    if (tag == kInvalidTag) return DecodeStatus::invalid_tag;
    next += static_cast<size_t>(escape_bytes_for(static_cast<GroupMode>(tag)));
    if (next > capacity) return DecodeStatus::escape_overrun;
  }
  return DecodeStatus::ok;
}

/// Validates the tags (no 3, escapes within `capacity`, zero padding; the reference's statuses in
/// its order) and fills `rows`. Each row's escape bytes: one per 4-bit group, five per raw group.
template <class G>
DecodeStatus scan_tags(const uint8_t* tags, const uint8_t* escapes, size_t capacity, TagRows<G>& rows) {
  uint32_t invalid = 0, used = 0, raw_rows = 0;
  for (int r = 0; r < TagRows<G>::kRows; ++r) {
    uint32_t word;
    std::memcpy(&word, tags + 4 * r, sizeof word);
    invalid |= word & word >> 1;
    const uint32_t raw = word & 0xAAAAAAAAu;
    rows.start[r] = static_cast<uint16_t>(used);
    used += static_cast<uint32_t>(__builtin_popcount(word & 0x55555555u) + 5 * __builtin_popcount(raw));
    raw_rows |= static_cast<uint32_t>(raw != 0) << r;
  }
  rows.raw_rows = raw_rows;
  rows.used = used;
  if ((invalid & 0x55555555u) != 0 || used > capacity) return first_tag_problem<G>(tags, capacity);
  return padding_is_zero(escapes, used, capacity) ? DecodeStatus::ok : DecodeStatus::nonzero_padding;
}

/// What the vector pass adds to the 3-bit exponents. Per group, in rows of 16 (group 16r + i at
/// byte i of row r): its plane-3 escape byte if it is 4-bit, else 0; 0xFF if it is 4-bit, else 0.
/// And the fragment registers that hold a raw group (bit v), which are rare enough to be rebuilt
/// one at a time (Exponents::with_raw_groups).
template <class G>
struct EscapeRows {
  alignas(32) uint8_t plane3[TagRows<G>::kRows][16];
  alignas(32) uint8_t is4[TagRows<G>::kRows][16];
  uint64_t raw_registers;
};

/// Per byte i of a 128-bit lane: tag byte i / 4 of the lane's tag word (lane 1: the next word).
constexpr std::array<uint8_t, 32> kTagBytes = [] {
  std::array<uint8_t, 32> control{};
  for (int d = 0; d < 32; ++d) control[static_cast<size_t>(d)] = static_cast<uint8_t>(4 * (d / 16) + d % 16 / 4);
  return control;
}();

/// Both 128-bit lanes: byte values (lane 0: `low`, lane 1: `high`) added to every byte.
inline __m256i per_lane(int low, int high) {
  const __m256i lane_pick = _mm256_setr_epi64x(0, 0, 0x0101010101010101ll, 0x0101010101010101ll);
  return _mm256_shuffle_epi8(_mm256_set1_epi16(static_cast<short>((low & 0xFF) | (high & 0xFF) << 8)), lane_pick);
}

/// Fills `out`, two rows at a time. A row's escapes are consecutive bytes from its start: 4-bit
/// groups take one, raw groups five, so an exclusive prefix sum of those sizes over the row (at
/// most 75) locates each 4-bit group's byte, and two 16-byte windows from the row's start reach
/// every byte of a row that needs at most 32 (a row of 4-bit groups needs 16; one that needs more
/// holds several raw groups and is rebuilt in scalar code).
template <class G>
void find_escape_rows(const uint8_t* tags, const uint8_t* escapes, size_t capacity, const TagRows<G>& rows,
                      EscapeRows<G>& out) {
  const __m256i tag_bytes = load(kTagBytes.data());
  const __m256i field = _mm256_set1_epi32(static_cast<int>(0xC0300C03u));  // group i's tag in byte i
  const __m256i tag1 = _mm256_set1_epi32(0x40100401);                     // ... when it is 1
  const __m256i tag2 = _mm256_set1_epi32(static_cast<int>(0x80200802u));  // ... when it is 2
  const __m256i high_nibble = _mm256_set1_epi8(0x70);  // index + 0x70, saturated: bit 7 (byte 0) unless 0..15
  const __m256i not4 = _mm256_set1_epi8(static_cast<char>(0x80));
  // Windows stay inside the escape slot: near its end they start earlier (capacity >= used > 0, so
  // capacity >= 16). They may overlap; a byte found in both is the same byte.
  const int last = static_cast<int>(capacity) - 16;
  for (int r = 0; r < TagRows<G>::kRows; r += 2) {
    const __m256i tag = _mm256_and_si256(_mm256_shuffle_epi8(_mm256_set1_epi64x(static_cast<long long>(load_u64(tags + 4 * r))), tag_bytes), field);
    const __m256i is4 = _mm256_cmpeq_epi8(tag, tag1);
    const __m256i size = _mm256_sub_epi8(_mm256_and_si256(_mm256_cmpeq_epi8(tag, tag2), _mm256_set1_epi8(5)), is4);
    __m256i sum = size;  // inclusive prefix sum over the row
    sum = _mm256_add_epi8(sum, _mm256_slli_si256(sum, 1));
    sum = _mm256_add_epi8(sum, _mm256_slli_si256(sum, 2));
    sum = _mm256_add_epi8(sum, _mm256_slli_si256(sum, 4));
    sum = _mm256_add_epi8(sum, _mm256_slli_si256(sum, 8));
    const __m256i before = _mm256_or_si256(_mm256_sub_epi8(sum, size), _mm256_andnot_si256(is4, not4));
    const int start0 = rows.start[r], start1 = rows.start[r + 1];
    const int first0 = std::min(start0, last), first1 = std::min(start1, last);
    const int second0 = std::min(start0 + 16, last), second1 = std::min(start1 + 16, last);
    const __m256i window0 = _mm256_loadu2_m128i(reinterpret_cast<const __m128i*>(escapes + first1),
                                                reinterpret_cast<const __m128i*>(escapes + first0));
    const __m256i window1 = _mm256_loadu2_m128i(reinterpret_cast<const __m128i*>(escapes + second1),
                                                reinterpret_cast<const __m128i*>(escapes + second0));
    // Indices into each window; before + anything keeps bit 7 for groups that are not 4-bit.
    const __m256i index0 = _mm256_adds_epu8(_mm256_add_epi8(before, per_lane(start0 - first0, start1 - first1)), high_nibble);
    const __m256i index1 = _mm256_adds_epu8(_mm256_add_epi8(before, per_lane(start0 - second0, start1 - second1)), high_nibble);
    // (index1 is negative, so saturates to 0xFF, for bytes before the second window.)
    const __m256i plane3 = _mm256_or_si256(_mm256_shuffle_epi8(window0, index0), _mm256_shuffle_epi8(window1, index1));
    _mm_store_si128(reinterpret_cast<__m128i*>(out.plane3[r]), _mm256_castsi256_si128(plane3));
    _mm_store_si128(reinterpret_cast<__m128i*>(out.plane3[r + 1]), _mm256_extracti128_si256(plane3, 1));
    _mm_store_si128(reinterpret_cast<__m128i*>(out.is4[r]), _mm256_castsi256_si128(is4));
    _mm_store_si128(reinterpret_cast<__m128i*>(out.is4[r + 1]), _mm256_extracti128_si256(is4, 1));
  }
  uint64_t raw_registers = 0;
  for (uint32_t pending = rows.raw_rows; pending != 0; pending &= pending - 1) {
    const int r = __builtin_ctz(pending);
    uint32_t word;
    std::memcpy(&word, tags + 4 * r, sizeof word);
    if (__builtin_popcount(word & 0x55555555u) + 5 * __builtin_popcount(word & 0xAAAAAAAAu) > 32) [[unlikely]] {
      alignas(16) uint8_t plane3[16] = {};
      size_t next = rows.start[r];
      for (int i = 0; i < 16; ++i) {
        const auto mode = static_cast<GroupMode>(word >> (2 * i) & 3u);
        if (mode == GroupMode::bits4) plane3[i] = escapes[next];
        next += static_cast<size_t>(escape_bytes_for(mode));
      }
      std::memcpy(out.plane3[r], plane3, sizeof plane3);
    }
    for (uint32_t raw = word & 0xAAAAAAAAu; raw != 0; raw &= raw - 1) {
      const int g = 16 * r + __builtin_ctz(raw) / 2;
      const int lane = g / G::kGroupsPerLane, pair = g % G::kGroupsPerLane;
      raw_registers |= uint64_t{1} << (16 * (pair / 2) + lane / 2);
    }
  }
  out.raw_registers = raw_registers;
}

/// Per fragment register v = 16c + p: byte d holds the row byte of its group (lane 2p + d / 16,
/// group 2c + d % 16 / 8 of the lane). Depends on c and, with four groups per lane, on p's parity.
template <class G>
constexpr std::array<ByteControl, 2 * G::kChunks> kGroupPick = [] {
  std::array<ByteControl, 2 * G::kChunks> controls{};
  for (int c = 0; c < G::kChunks; ++c) {
    for (int parity = 0; parity < 2; ++parity) {
      for (int d = 0; d < 32; ++d) {
        const int group = (2 * parity + d / 16) * G::kGroupsPerLane + 2 * c + d % 16 / 8;
        controls[static_cast<size_t>(2 * c + parity)].bytes[static_cast<size_t>(d)] = static_cast<uint8_t>(group % 16);
      }
    }
  }
  return controls;
}();

/// The exponents of a tile's fragment registers: 3-bit code plus b3, plus what `EscapeRows` says
/// for 4-bit and raw groups.
template <class G>
class Exponents {
 public:
  Exponents(const uint8_t* slot, const FragmentBases<G>& bases, const TagRows<G>& tag_rows, const EscapeRows<G>& rows)
      : slot_(slot), codes_(slot + G::kShape.code_offset()), bases_(bases), tag_rows_(tag_rows), rows_(&rows) {}

  /// Fragment register v = 16c + p, chunk c = 2o + kOdd.
  template <int kOdd>
  __m256i get(int o, int p) const {
    const int c = 2 * o + kOdd, v = 16 * c + p;
    const __m256i code = read_codes<G, kOdd>(codes_, o, p);
    const __m256i exponent = _mm256_add_epi8(code, bases_.b3(v));
    const int row = 2 * p * G::kGroupsPerLane / 16;
    const __m256i pick = load(kGroupPick<G>[static_cast<size_t>(2 * c + p % 2)]);
    const __m256i plane3 = _mm256_shuffle_epi8(broadcast(rows_->plane3[row]), pick);
    const __m256i is4 = _mm256_shuffle_epi8(broadcast(rows_->is4[row]), pick);
    const __m256i bit = _mm256_set1_epi64x(0x8040201008040201ll);  // element i of a group: bit i
    const __m256i bit3 = _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(plane3, bit), bit), _mm256_set1_epi8(8));
    const __m256i escaped = _mm256_add_epi8(_mm256_add_epi8(exponent, _mm256_and_si256(is4, bases_.step(v))), bit3);
    if ((rows_->raw_registers >> v & 1) == 0) [[likely]] return escaped;
    return with_raw_groups(c, p, escaped, code);
  }

 private:
  static __m256i broadcast(const uint8_t* row) {
    return _mm256_broadcastsi128_si256(_mm_load_si128(reinterpret_cast<const __m128i*>(row)));
  }

  /// Register 16c + p with its raw groups' exponents (code | bits 3..7 from their five escapes).
  [[gnu::noinline]] __m256i with_raw_groups(int c, int p, __m256i escaped, __m256i code) const {
    const uint8_t* tags = slot_ + G::kShape.tag_offset();
    const uint8_t* escapes = slot_ + G::kShape.escape_offset();
    uint64_t high[4] = {}, mask[4] = {};
    for (int q = 0; q < 4; ++q) {  // qword q: lane 2p + q / 2, pair 2c + q % 2
      const int g = (2 * p + q / 2) * G::kGroupsPerLane + 2 * c + q % 2;
      uint32_t word;
      std::memcpy(&word, tags + 4 * (g / 16), sizeof word);
      if ((word >> (2 * (g % 16)) & 3u) != static_cast<unsigned>(GroupMode::raw)) continue;
      const uint32_t earlier = word & ((1u << (2 * (g % 16))) - 1);
      const uint8_t* planes = escapes + tag_rows_.start[g / 16] + __builtin_popcount(earlier & 0x55555555u) +
                              5 * __builtin_popcount(earlier & 0xAAAAAAAAu);
      for (int k = 0; k < 5; ++k) high[q] |= _pdep_u64(planes[k], kByteBit0) << (3 + k);
      mask[q] = ~uint64_t{0};
    }
    const auto vec = [](const uint64_t* x) {
      return _mm256_setr_epi64x(static_cast<long long>(x[0]), static_cast<long long>(x[1]), static_cast<long long>(x[2]),
                                static_cast<long long>(x[3]));
    };
    return _mm256_blendv_epi8(escaped, _mm256_or_si256(code, vec(high)), vec(mask));
  }

  const uint8_t* slot_;
  const uint8_t* codes_;
  const FragmentBases<G>& bases_;
  const TagRows<G>& tag_rows_;
  const EscapeRows<G>* rows_;
};

/// Row and first channel (relative to the chunk) of the value words that value_stream_to_rows
/// leaves in register j, for the low (b0 = 0) and high (b0 = 1) half of the final byte interleave.
constexpr int value_out_row(int j, int t1, int b0) { return 8 * b0 + 4 * t1 + 2 * ((j >> 1) & 1) + (j & 1); }
constexpr int value_out_column(int j) { return 16 * ((j >> 2) & 1); }

/// Value half-chunk, decode side: the 8 fragment registers of one byte stream and one t1 (register
/// j = g; in-register index bits [t0 | jj1 jj0 b1 b0], channel 8jj + g, token [b0 t1 t0 b1]).
/// Three byte-interleave rounds on g2, g1, g0 bring g into the byte offset (each pushes the top
/// offset bit, jj1, jj0, b1 in turn, into the register number); then exchanging 128-bit halves
/// between registers that differ in jj0 swaps it with t0. Leaves offset [b0 g2 g1 g0 | jj0] and
/// register j = [jj1 t0 b1]: the final byte interleave makes rows of 16 channels (value_out_*).
inline void value_stream_to_rows_fused(__m256i x[8]) {
#pragma GCC unroll 3
  for (int bit = 4; bit >= 1; bit /= 2) {
#pragma GCC unroll 8
    for (int j = 0; j < 8; ++j) {
      if (j & bit) continue;
      const __m256i a = x[j], b = x[j | bit];
      x[j] = _mm256_unpacklo_epi8(a, b);
      x[j | bit] = _mm256_unpackhi_epi8(a, b);
    }
  }
#pragma GCC unroll 8
  for (int j = 0; j < 8; ++j) {
    if (j & 2) continue;
    const __m256i a = x[j], b = x[j | 2];
    x[j] = _mm256_permute2x128_si256(a, b, 0x20);
    x[j | 2] = _mm256_permute2x128_si256(a, b, 0x31);
  }
}

/// Composes the elements of chunk c = 2o + kOdd of fragment order from their stored bytes and
/// exponents and writes them to their rows.
template <class G, int kOdd>
void write_chunk(const uint8_t* stored, const Exponents<G>& exponents, int o, uint16_t* dst, size_t stride) {
  const int c = 2 * o + kOdd;
  if constexpr (G::kShape.kind == TensorKind::key) {
#pragma GCC unroll 1
    for (int q = 0; q < 8; ++q) {  // key segment 8c + q: registers p = 2q, 2q + 1
      const int segment = 8 * c + q;
      __m256i lo[2], hi[2];
#pragma GCC unroll 2
      for (int r = 0; r < 2; ++r) {
        compose(load(stored + 64 * segment + 32 * r), exponents.template get<kOdd>(o, 2 * q + r), lo[r], hi[r]);
      }
      key_stream_to_rows(lo);
      key_stream_to_rows(hi);
      uint16_t* row = dst + G::key_row(segment) * stride + G::key_column(segment);
#pragma GCC unroll 2
      for (int r = 0; r < 2; ++r) {
        store(row + 32 * r, _mm256_unpacklo_epi8(lo[r], hi[r]));
        store(row + 32 * r + 16, _mm256_unpackhi_epi8(lo[r], hi[r]));
      }
    }
  } else {
#pragma GCC unroll 1
    for (int t1 = 0; t1 < 2; ++t1) {
      __m256i lo[8], hi[8];
#pragma GCC unroll 8
      for (int j = 0; j < 8; ++j) {
        compose(load(stored + 512 * c + 64 * j + 32 * t1), exponents.template get<kOdd>(o, 2 * j + t1), lo[j], hi[j]);
      }
      value_stream_to_rows_fused(lo);
      value_stream_to_rows_fused(hi);
#pragma GCC unroll 8
      for (int j = 0; j < 8; ++j) {
        uint16_t* column = dst + 32 * c + value_out_column(j);
        store(column + value_out_row(j, t1, 0) * stride, _mm256_unpacklo_epi8(lo[j], hi[j]));
        store(column + value_out_row(j, t1, 1) * stride, _mm256_unpackhi_epi8(lo[j], hi[j]));
      }
    }
  }
}

template <class G>
void write_rows(const uint8_t* stored, const Exponents<G>& exponents, uint16_t* dst, size_t stride) {
  for (int o = 0; o < G::kOctets; ++o) {
    write_chunk<G, 0>(stored, exponents, o, dst, stride);
    write_chunk<G, 1>(stored, exponents, o, dst, stride);
  }
}

template <TensorKind Kind, int Channels>
DecodeStatus decode(const uint8_t* slot, size_t capacity, const TileBases& bases, uint16_t* dst, size_t stride) {
  using G = Geometry<Kind, Channels>;
  const uint8_t* tags = slot + G::kShape.tag_offset();
  const uint8_t* escapes = slot + G::kShape.escape_offset();
  TagRows<G> rows;
  const DecodeStatus status = scan_tags(tags, escapes, capacity, rows);
  if (status != DecodeStatus::ok) return status;

  const FragmentBases<G> fragment_bases(bases);
  static const EscapeRows<G> kNoEscapes{};  // an all-3-bit tile
  EscapeRows<G> escape_rows;
  if (rows.used != 0) find_escape_rows(tags, escapes, capacity, rows, escape_rows);
  const Exponents<G> exponents(slot, fragment_bases, rows, rows.used != 0 ? escape_rows : kNoEscapes);
  write_rows<G>(slot, exponents, dst, stride);
  return DecodeStatus::ok;
}

// ----------------------------------------------------------------------------------------------
// Encode

/// Chooses the mode of the four groups of fragment register v from their exponents, stores their
/// offsets (fragment order) and their modes (group order).
template <class G>
void classify(int v, __m256i exponent, const FragmentBases<G>& bases, uint8_t* offsets, uint8_t* modes) {
  const __m256i d3 = _mm256_sub_epi8(exponent, bases.b3(v));
  const __m256i d4 = _mm256_sub_epi8(exponent, bases.b4(v));
  const __m256i in3 = _mm256_cmpeq_epi8(_mm256_min_epu8(d3, _mm256_set1_epi8(7)), d3);
  const __m256i in4 = _mm256_cmpeq_epi8(_mm256_min_epu8(d4, _mm256_set1_epi8(15)), d4);
  const __m256i ones = _mm256_set1_epi8(-1);
  const __m256i group3 = _mm256_cmpeq_epi64(in3, ones), group4 = _mm256_cmpeq_epi64(in4, ones);
  store(offsets + 32 * v, _mm256_blendv_epi8(_mm256_blendv_epi8(exponent, d4, group4), d3, group3));
  const auto not3 = ~static_cast<unsigned>(_mm256_movemask_pd(_mm256_castsi256_pd(group3))) & 15u;
  const auto raw = not3 & ~static_cast<unsigned>(_mm256_movemask_pd(_mm256_castsi256_pd(group4)));
  const uint32_t mode_bytes = _pdep_u32(not3, 0x01010101u) + _pdep_u32(raw, 0x01010101u);  // 0, 1 or 2 per group
  // The four groups are (lane 2p, k), (2p, k+1), (2p+1, k), (2p+1, k+1) with k = 2·chunk.
  const int lane = 2 * (v % 16), k = 2 * (v / 16);
  store_u16(modes + lane * G::kGroupsPerLane + k, static_cast<uint16_t>(mode_bytes));
  store_u16(modes + (lane + 1) * G::kGroupsPerLane + k, static_cast<uint16_t>(mode_bytes >> 16));
}

/// Reads the rows, writes the sign+mantissa section, classifies every group.
template <class G>
void read_rows(const uint16_t* src, size_t stride, const FragmentBases<G>& bases, uint8_t* stored, uint8_t* offsets,
               uint8_t* modes) {
  if constexpr (G::kShape.kind == TensorKind::key) {
    for (int segment = 0; segment < G::kElements / 64; ++segment) {
      const uint16_t* row = src + G::key_row(segment) * stride + G::key_column(segment);
      __m256i sm[2], e[2];
      for (int r = 0; r < 2; ++r) {
        const __m256i x0 = load(row + 32 * r), x1 = load(row + 32 * r + 16);
        sm[r] = _mm256_packus_epi16(stored_bytes16(x0), stored_bytes16(x1));
        e[r] = _mm256_packus_epi16(exponents16(x0), exponents16(x1));
      }
      key_stream_to_fragment(sm);
      key_stream_to_fragment(e);
      for (int r = 0; r < 2; ++r) {
        store(stored + 64 * segment + 32 * r, sm[r]);
        classify(2 * segment + r, e[r], bases, offsets, modes);
      }
    }
  } else {
    for (int c = 0; c < G::kChunks; ++c) {
#pragma GCC unroll 2
      for (int t1 = 0; t1 < 2; ++t1) {
        __m256i sm[8], e[8];
#pragma GCC unroll 8
        for (int j = 0; j < 8; ++j) {
          const uint16_t* column = src + 32 * c + value_column(j);
          const __m256i x0 = load(column + value_row(j, t1, 0) * stride);
          const __m256i x1 = load(column + value_row(j, t1, 1) * stride);
          sm[j] = _mm256_packus_epi16(stored_bytes16(x0), stored_bytes16(x1));
          e[j] = _mm256_packus_epi16(exponents16(x0), exponents16(x1));
        }
        value_stream_to_fragment(sm);
        value_stream_to_fragment(e);
#pragma GCC unroll 8
        for (int j = 0; j < 8; ++j) {
          store(stored + 512 * c + 64 * j + 32 * t1, sm[j]);
          classify(16 * c + 2 * j + t1, e[j], bases, offsets, modes);
        }
      }
    }
  }
}

/// Writes the tags of every group and the escapes of the 4-bit and raw groups, in group order.
template <class G>
TileEncoding write_tags_and_escapes(const uint8_t* offsets, const uint8_t* modes, size_t capacity, uint8_t* tags,
                                    uint8_t* escapes) {
  TileEncoding result;
  size_t used = 0;
  for (int g0 = 0; g0 < G::kGroups; g0 += 8) {
    const uint64_t eight = load_u64(modes + g0);
    store_u16(tags + g0 / 4, static_cast<uint16_t>(_pext_u64(eight, 0x0303030303030303ull)));
    for (uint64_t pending = eight; pending != 0; pending &= ~(0xFFull << (__builtin_ctzll(pending) & ~7))) {
      const int i = __builtin_ctzll(pending) / 8;
      const int mode = modes[g0 + i];
      ++result.groups_by_mode[mode];
      // Plane k holds bit 3+k of every offset (raw groups: of every exponent).
      const uint64_t offset = load_u64(offsets + G::group_offset(g0 + i));
      const int planes = escape_bytes_for(static_cast<GroupMode>(mode));
      for (int k = 0; k < planes; ++k, ++used) {
        if (used < capacity) escapes[used] = static_cast<uint8_t>(_pext_u64(offset, 0x0808080808080808ull << k));
      }
    }
  }
  if (used < capacity) std::memset(escapes + used, 0, capacity - used);
  result.groups_by_mode[0] = G::kGroups - result.groups_by_mode[1] - result.groups_by_mode[2];
  result.escape_bytes = static_cast<uint32_t>(used);
  result.fits = used <= capacity;
  return result;
}

template <TensorKind Kind, int Channels>
TileEncoding encode(const uint16_t* src, size_t stride, const TileBases& bases, size_t capacity, uint8_t* slot) {
  using G = Geometry<Kind, Channels>;
  const FragmentBases<G> fragment_bases(bases);
  alignas(32) uint8_t offsets[G::kElements];
  alignas(8) uint8_t modes[G::kGroups];
  read_rows(src, stride, fragment_bases, slot, offsets, modes);
  write_code_words<G>(offsets, slot + G::kShape.code_offset());
  return write_tags_and_escapes<G>(offsets, modes, capacity, slot + G::kShape.tag_offset(),
                                   slot + G::kShape.escape_offset());
}

}  // namespace

bool compiled() { return true; }

TileEncoding encode_tile(TileShape shape, const uint16_t* src, size_t row_stride, const TileBases& bases,
                         size_t escape_capacity, uint8_t* slot) {
  if (shape.kind == TensorKind::key) {
    return shape.channels == 64 ? encode<TensorKind::key, 64>(src, row_stride, bases, escape_capacity, slot)
                                : encode<TensorKind::key, 128>(src, row_stride, bases, escape_capacity, slot);
  }
  return shape.channels == 64 ? encode<TensorKind::value, 64>(src, row_stride, bases, escape_capacity, slot)
                              : encode<TensorKind::value, 128>(src, row_stride, bases, escape_capacity, slot);
}

DecodeStatus decode_tile(TileShape shape, const uint8_t* slot, size_t escape_capacity, const TileBases& bases,
                         uint16_t* dst, size_t row_stride) {
  if (shape.kind == TensorKind::key) {
    return shape.channels == 64 ? decode<TensorKind::key, 64>(slot, escape_capacity, bases, dst, row_stride)
                                : decode<TensorKind::key, 128>(slot, escape_capacity, bases, dst, row_stride);
  }
  return shape.channels == 64 ? decode<TensorKind::value, 64>(slot, escape_capacity, bases, dst, row_stride)
                              : decode<TensorKind::value, 128>(slot, escape_capacity, bases, dst, row_stride);
}

}  // namespace gaac::avx2

#else  // !__AVX2__: no AVX2 path in this build; dispatch never selects it.

namespace gaac::avx2 {
bool compiled() { return false; }
TileEncoding encode_tile(TileShape shape, const uint16_t* src, size_t row_stride, const TileBases& bases,
                         size_t escape_capacity, uint8_t* slot) {
  return reference::encode_tile(shape, src, row_stride, bases, escape_capacity, slot);
}
DecodeStatus decode_tile(TileShape shape, const uint8_t* slot, size_t escape_capacity, const TileBases& bases,
                         uint16_t* dst, size_t row_stride) {
  return reference::decode_tile(shape, slot, escape_capacity, bases, dst, row_stride);
}
}  // namespace gaac::avx2

#endif
