// The AVX2 tile decoder's parts: geometry, the bases in the decoder's order, code words, tags and
// escapes, the exponents of each fragment register, and the composition of BF16 words. The codec
// (codec_avx2.cpp) writes them to rows; the fused attention kernels (src/attention/fused_*_avx2.cpp)
// consume them in registers. One decoder, two consumers.
//
// Everything here has internal linkage (an unnamed namespace), deliberately: the including files are
// built with different target flags (the codec with -mavx2 -mbmi2, the attention with FMA and F16C
// too), and inline functions with external linkage would let the linker keep one file's code for the
// other's callers.
#pragma once

#if !defined(__AVX2__) || !defined(__BMI2__)
#error "codec/decode_avx2.hpp needs -mavx2 -mbmi2"
#endif

#include <immintrin.h>

#include <array>
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "gaac/codec.hpp"
#include "gaac/format.hpp"

namespace gaac::avx2 {
namespace {

// ----------------------------------------------------------------------------------------------
// Shuffle controls

struct ByteControl {
  std::array<uint8_t, 32> bytes;
};
struct DwordControl {
  std::array<uint32_t, 8> dwords;
};


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

/// The decoder's value order: dword d of a register holds fragment-order dword kValueDwords[d]
/// (see to_decode_order).
constexpr std::array<int, 8> kValueDwords = {0, 4, 2, 6, 1, 5, 3, 7};

/// kSpreadDword for registers in the decoder's value order.
constexpr std::array<ByteControl, 4> kSpreadDwordDecode = [] {
  std::array<ByteControl, 4> controls{};
  for (int j = 0; j < 4; ++j) {
    for (int d = 0; d < 32; ++d) controls[j].bytes[d] = static_cast<uint8_t>(4 * j + kValueDwords[d / 4] % 4);
  }
  return controls;
}();

// ----------------------------------------------------------------------------------------------
// Small helpers

inline __m256i load(const void* p) { return _mm256_loadu_si256(static_cast<const __m256i*>(p)); }
inline void store(void* p, __m256i v) { _mm256_storeu_si256(static_cast<__m256i*>(p), v); }
inline __m256i load(const ByteControl& c) { return load(c.bytes.data()); }
inline __m256i load(const DwordControl& c) { return load(c.dwords.data()); }

inline uint64_t load_u64(const void* p) {
  uint64_t v;
  std::memcpy(&v, p, sizeof v);
  return v;
}
inline void store_u16(void* p, uint16_t v) { std::memcpy(p, &v, sizeof v); }

constexpr uint64_t kByteBit0 = 0x0101010101010101ull;

/// Decode: the low and high byte of each BF16 value from its stored byte (sign | mantissa) and its
/// exponent. The 16-bit shifts leak bits across bytes only into bits the masks drop. Built with
/// AVX-512VL (the AVX-512 attention kernels), each select is one vpternlogd.
inline void compose(__m256i stored, __m256i exponent, __m256i& lo, __m256i& hi) {
  const __m256i top = _mm256_set1_epi8(static_cast<char>(0x80));
#if defined(__AVX512VL__)
  lo = _mm256_ternarylogic_epi32(top, _mm256_slli_epi16(exponent, 7), stored, 0xCA);  // 0xCA: a ? b : c
  hi = _mm256_ternarylogic_epi32(top, stored, _mm256_srli_epi16(exponent, 1), 0xCA);
#else
  lo = _mm256_or_si256(_mm256_andnot_si256(top, stored), _mm256_and_si256(_mm256_slli_epi16(exponent, 7), top));
  hi = _mm256_or_si256(_mm256_and_si256(stored, top), _mm256_andnot_si256(top, _mm256_srli_epi16(exponent, 1)));
#endif
}

inline void compose(__m128i stored, __m128i exponent, __m128i& lo, __m128i& hi) {
  const __m128i top = _mm_set1_epi8(static_cast<char>(0x80));
  lo = _mm_or_si128(_mm_andnot_si128(top, stored), _mm_and_si128(_mm_slli_epi16(exponent, 7), top));
  hi = _mm_or_si128(_mm_and_si128(stored, top), _mm_andnot_si128(top, _mm_srli_epi16(exponent, 1)));
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

/// The decoder works on values in a permuted fragment order: dword d of a register holds what
/// fragment order has in dword kValueDwords[d] (bit 0 of the dword offset and the lane swapped),
/// which puts channel bit 3 (jj0) in the lane, where the rows need it: the stored bytes take one
/// vpermd per register, the exponents are produced in that order for free. Keys use fragment order.
template <class G>
constexpr int fragment_dword(int d) {
  return G::kShape.kind == TensorKind::value ? kValueDwords[static_cast<size_t>(d)] : d;
}

/// Fragment-order byte at byte d of a register in decode order.
template <class G>
constexpr int fragment_byte(int d) {
  return 4 * fragment_dword<G>(d / 4) + d % 4;
}

/// A fragment-order register in decode order.
template <class G>
inline __m256i to_decode_order(__m256i x) {
  if constexpr (G::kShape.kind == TensorKind::key) return x;
  return _mm256_permutevar8x32_epi32(x, _mm256_setr_epi32(0, 4, 2, 6, 1, 5, 3, 7));
}

/// Eight per-dword constants of fragment order, in decode order.
template <class G>
inline __m256i dwords_in_decode_order(const std::array<int, 8>& x) {
  const auto at = [&](int d) { return x[static_cast<size_t>(fragment_dword<G>(d))]; };
  return _mm256_setr_epi32(at(0), at(1), at(2), at(3), at(4), at(5), at(6), at(7));
}

/// Keys: the bases repeat with the token, so a few registers hold them all. Pattern 2h + t1 holds,
/// at fragment byte [t0 | s1 s0 b1 b0], the base of channel 64h + 16s + 8b0 + 4t1 + 2t0 + b1; this
/// makes the two patterns (t1 = 0, 1) of the half at `base` (64 channels).
inline void key_base_patterns(const uint8_t* base, __m256i out[2]) {
  const __m128i gather = _mm_loadu_si128(reinterpret_cast<const __m128i*>(kKeyBaseGather.data()));
  __m128i d[4];  // d[s] dword t: the bases of lane t, quad s
  for (int s = 0; s < 4; ++s) d[s] = _mm_shuffle_epi8(_mm_loadu_si128(reinterpret_cast<const __m128i*>(base + 16 * s)), gather);
  // 4 × 4 dword transpose: lane t collects dword t of every quad.
  const __m128i a = _mm_unpacklo_epi32(d[0], d[1]), b = _mm_unpacklo_epi32(d[2], d[3]);
  const __m128i c = _mm_unpackhi_epi32(d[0], d[1]), e = _mm_unpackhi_epi32(d[2], d[3]);
  out[0] = _mm256_setr_m128i(_mm_unpacklo_epi64(a, b), _mm_unpackhi_epi64(a, b));
  out[1] = _mm256_setr_m128i(_mm_unpacklo_epi64(c, e), _mm_unpackhi_epi64(c, e));
}

/// Values: fragment register v = 16c + 2g + t1 needs the base of channel 32c + 8cc + g at bytes
/// 4cc..4cc+3 (both lanes): a byte shuffle of the dword [x(g), x(8+g), x(16+g), x(24+g)] of the
/// chunk's 32 bases x. Both halves of `out`: dword g (g = 0..3, then 4..7).
inline void value_base_dwords(const uint8_t* x, __m256i out[2]) {
  const __m128i low = _mm_loadu_si128(reinterpret_cast<const __m128i*>(x));
  const __m128i high = _mm_loadu_si128(reinterpret_cast<const __m128i*>(x + 16));
  const __m128i pairs_low = _mm_unpacklo_epi8(low, _mm_srli_si128(low, 8));     // (x[g], x[8+g])
  const __m128i pairs_high = _mm_unpacklo_epi8(high, _mm_srli_si128(high, 8));  // (x[16+g], x[24+g])
  out[0] = _mm256_broadcastsi128_si256(_mm_unpacklo_epi16(pairs_low, pairs_high));
  out[1] = _mm256_broadcastsi128_si256(_mm_unpackhi_epi16(pairs_low, pairs_high));
}

/// Encode: the channel bases b3(v), b4(v) of fragment register v, fragment order.
template <class G, TensorKind Kind = G::kShape.kind>
class FragmentBases;

template <class G>
class FragmentBases<G, TensorKind::key> {
 public:
  explicit FragmentBases(const TileBases& bases) {
    for (int h = 0; h < G::kHalves; ++h) {
      __m256i b3[2], b4[2];
      key_base_patterns(bases.b3.data() + 64 * h, b3);
      key_base_patterns(bases.b4.data() + 64 * h, b4);
      for (int i = 0; i < 2; ++i) {
        store(b3_[2 * h + i], b3[i]);
        store(b4_[2 * h + i], b4[i]);
      }
    }
  }
  __m256i b3(int v) const { return load(b3_[pattern(v)]); }
  __m256i b4(int v) const { return load(b4_[pattern(v)]); }

 private:
  static constexpr int pattern(int v) { return v / 16 % G::kHalves * 2 + v % 2; }

  alignas(32) uint8_t b3_[2 * G::kHalves][32];
  alignas(32) uint8_t b4_[2 * G::kHalves][32];
};

template <class G>
class FragmentBases<G, TensorKind::value> {
 public:
  explicit FragmentBases(const TileBases& bases) {
    for (int c = 0; c < G::kChunks; ++c) {
      __m256i d3[2], d4[2];
      value_base_dwords(bases.b3.data() + 32 * c, d3);
      value_base_dwords(bases.b4.data() + 32 * c, d4);
      for (int i = 0; i < 2; ++i) {
        store(b3_[c][i], d3[i]);
        store(b4_[c][i], d4[i]);
      }
    }
  }
  __m256i b3(int v) const { return spread(b3_, v); }
  __m256i b4(int v) const { return spread(b4_, v); }

 private:
  using Table = uint8_t[G::kChunks][2][32];

  static __m256i spread(const Table& dwords, int v) {
    const int c = v / 16, g = v % 16 / 2;
    return _mm256_shuffle_epi8(load(dwords[c][g / 4]), load(kSpreadDword[static_cast<size_t>(g % 4)]));
  }

  alignas(32) Table b3_;
  alignas(32) Table b4_;
};

/// Decode: the channel bases of fragment register v in decode order, b3(v) and the step
/// b4 - b3 (modulo 256); and for the group at fragment offset `at` the same as eight bytes in
/// fragment order (b3_group, step_group).
template <class G, TensorKind Kind = G::kShape.kind>
class DecodeBases;

/// Keys: decode order is fragment order; the patterns of key_base_patterns.
template <class G>
class DecodeBases<G, TensorKind::key> {
 public:
  explicit DecodeBases(const TileBases& bases) {
    for (int h = 0; h < G::kHalves; ++h) {
      __m256i b3[2], b4[2];
      key_base_patterns(bases.b3.data() + 64 * h, b3);
      key_base_patterns(bases.b4.data() + 64 * h, b4);
      for (int i = 0; i < 2; ++i) {
        store(b3_[2 * h + i], b3[i]);
        store(step_[2 * h + i], _mm256_sub_epi8(b4[i], b3[i]));
      }
    }
  }
  __m256i b3(int v) const { return load(b3_[pattern(v)]); }
  __m256i step(int v) const { return load(step_[pattern(v)]); }
  uint64_t b3_group(int at) const { return load_u64(b3_[pattern(at / 32)] + at % 32); }
  uint64_t step_group(int at) const { return load_u64(step_[pattern(at / 32)] + at % 32); }

 private:
  // Unsigned: v is never negative, and the signed division costs a dozen instructions per register.
  static constexpr int pattern(int v) { return static_cast<int>(static_cast<unsigned>(v) / 16 % G::kHalves * 2 + static_cast<unsigned>(v) % 2); }

  alignas(32) uint8_t b3_[2 * G::kHalves][32];
  alignas(32) uint8_t step_[2 * G::kHalves][32];
};

/// Values: one pattern per chunk c and g (registers 16c + 2g + t1 share it), made once per tile
/// rather than shuffled per register: in decode order the dwords are jj = 0, 0, 2, 2 | 1, 1, 3, 3.
template <class G>
class DecodeBases<G, TensorKind::value> {
 public:
  explicit DecodeBases(const TileBases& bases) {
    for (int c = 0; c < G::kChunks; ++c) {
      __m256i d3[2], d4[2];
      value_base_dwords(bases.b3.data() + 32 * c, d3);
      value_base_dwords(bases.b4.data() + 32 * c, d4);
      for (int g = 0; g < 8; ++g) {
        const __m256i spread = load(kSpreadDwordDecode[static_cast<size_t>(g % 4)]);
        const __m256i b3 = _mm256_shuffle_epi8(d3[g / 4], spread);
        store(b3_[c][g], b3);
        store(step_[c][g], _mm256_sub_epi8(_mm256_shuffle_epi8(d4[g / 4], spread), b3));
      }
    }
  }
  __m256i b3(int v) const { return load(b3_[static_cast<unsigned>(v) / 16][static_cast<unsigned>(v) % 16 / 2]); }
  __m256i step(int v) const { return load(step_[static_cast<unsigned>(v) / 16][static_cast<unsigned>(v) % 16 / 2]); }
  uint64_t b3_group(int at) const { return group(b3_, at); }
  uint64_t step_group(int at) const { return group(step_, at); }

 private:
  using Table = uint8_t[G::kChunks][8][32];

  /// Fragment qword q of register v is fragment dwords 2q, 2q + 1, at decode dwords kValueDwords[..].
  static uint64_t group(const Table& table, int at) {
    const int v = at / 32, q = at % 32 / 8;
    const uint8_t* pattern = table[v / 16][v % 16 / 2];
    uint32_t low, high;
    std::memcpy(&low, pattern + 4 * kValueDwords[static_cast<size_t>(2 * q)], sizeof low);
    std::memcpy(&high, pattern + 4 * kValueDwords[static_cast<size_t>(2 * q + 1)], sizeof high);
    return low | uint64_t{high} << 32;
  }

  alignas(32) Table b3_;
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

/// Decode: the 3-bit codes of fragment register 16c + p (decode order), chunk c = 2o + kOdd.
template <class G, int kOdd>
__m256i read_codes(const uint8_t* codes, int o, int p) {
  using Area = CodeArea<G>;
  constexpr int kOc = G::kOctets, kFw = Area::kFirstWords;
  const __m256i octet = _mm256_set1_epi32(o);
  const auto constant = [](const std::array<int, 8>& x) { return dwords_in_decode_order<G>(x); };
  if constexpr (kOdd == 0) {  // quads 0..3: W0, W0 >> 3, W1, W1 >> 3
    const __m256i pick = _mm256_add_epi32(constant({0, 0, kOc, kOc, kFw, kFw, kFw + kOc, kFw + kOc}), octet);
    const __m256i shift = constant({0, 3, 0, 3, 0, 3, 0, 3});
    const __m256i w = _mm256_permutevar8x32_epi32(Area::first(codes, p), pick);
    return _mm256_and_si256(_mm256_srlv_epi32(w, shift), _mm256_set1_epi8(7));
  } else {  // quads 4..7: W2, W2 >> 3, W0 >> 6 | bit 6 of W2, W1 >> 6 | bit 7 of W2
    const __m256i pick01 = _mm256_add_epi32(constant({0, 0, 0, kOc, 0, 0, kFw, kFw + kOc}), octet);
    const __m256i pick2 = _mm256_add_epi32(constant({0, 0, 0, 0, kOc, kOc, kOc, kOc}), octet);
    const __m256i shift01 = constant({32, 32, 6, 6, 32, 32, 6, 6});
    const __m256i shift2 = constant({0, 3, 4, 5, 0, 3, 4, 5});
    const __m256i mask2 = constant({0x07070707, 0x07070707, 0x04040404, 0x04040404, 0x07070707, 0x07070707, 0x04040404, 0x04040404});
    const __m256i w01 = _mm256_permutevar8x32_epi32(Area::first(codes, p), pick01);
    const __m256i w2 = _mm256_permutevar8x32_epi32(Area::second(codes, p), pick2);
    return _mm256_or_si256(_mm256_and_si256(_mm256_srlv_epi32(w2, shift2), mask2),
                           _mm256_and_si256(_mm256_srlv_epi32(w01, shift01), _mm256_set1_epi8(3)));
  }
}

/// Encode: the code words of every lane from the offsets (fragment order; low 3 bits used).

// ----------------------------------------------------------------------------------------------
// Decode

/// True when escape bytes [from, capacity) are all zero. Scans every 16-byte block of the slot
/// (the capacity is a multiple of 16) with the bytes before `from` masked off, so the trip count
/// depends on the capacity, a per-tensor constant, and not on the data: the loop predicts.
inline bool padding_is_zero(const uint8_t* escapes, size_t from, size_t capacity) {
  const __m128i index = _mm_setr_epi8(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
  __m128i any = _mm_setzero_si128();
  for (size_t block = 0; block < capacity; block += 16) {
    const size_t skip = std::min<size_t>(from - std::min(from, block), 16);  // bytes of the block before `from`
    const __m128i keep = _mm_cmpgt_epi8(index, _mm_set1_epi8(static_cast<char>(skip - 1)));
    any = _mm_or_si128(any, _mm_and_si128(_mm_loadu_si128(reinterpret_cast<const __m128i*>(escapes + block)), keep));
  }
  return _mm_testz_si128(any, any);
}

/// The tags, one 32-bit word ("row": 16 consecutive groups) at a time: where each row's escapes
/// start, which rows hold raw groups, and how many escape bytes the tile uses.
template <class G>
struct TagRows {
  static constexpr int kRows = G::kGroups / 16;
  alignas(32) uint32_t start[kRows];  // escape offset of the row's first group
  // Where find_escape_rows reads the row's 16-byte window: at the start, but at most 16 bytes
  // before the end of the escape slot, and how far into the window the start then is (at most 15
  // for a row with 4-bit groups; 16 can occur only for a row without).
  alignas(32) uint32_t window[kRows];
  alignas(16) uint8_t skip[16];
  uint32_t raw_rows;  // bit r: row r has a raw group
  uint32_t used;      // escape bytes of the whole tile
};

/// The scalar backend's verdict on tags that hold a 3 or ask for more than `capacity` escape bytes:
/// whichever problem comes first in group order. Only bad slots get here. A raw group has
/// `kRawBytes` escape bytes (5 for BF16 tiles, X − 2 for FP8 ones), a tag-1 group one.
template <class G, int kRawBytes = 5>
DecodeStatus first_tag_problem(const uint8_t* tags, size_t capacity) {
  size_t next = 0;
  for (int g = 0; g < G::kGroups; ++g) {
    const unsigned tag = tags[g / 4] >> (2 * (g % 4)) & 3u;
    if (tag == kInvalidTag) return DecodeStatus::invalid_tag;
    next += tag == 1 ? 1 : tag == 2 ? kRawBytes : 0;
    if (next > capacity) return DecodeStatus::escape_overrun;
  }
  return DecodeStatus::ok;
}

/// Escape bytes per row (tag word = dword) of the eight rows in `t`: one per tag-1 group, kRawBytes per
/// raw group (3s count nothing; they are rejected anyway), looked up two tags (a nibble) at a time.
template <int kRawBytes = 5>
inline __m256i row_escape_bytes(__m256i t) {
  alignas(32) static constexpr std::array<int8_t, 32> kSizes = [] {
    constexpr std::array<int8_t, 4> kSize = {0, 1, static_cast<int8_t>(kRawBytes), 0};
    std::array<int8_t, 32> sizes{};
    for (int n = 0; n < 32; ++n) sizes[static_cast<size_t>(n)] = static_cast<int8_t>(kSize[static_cast<size_t>(n % 4)] + kSize[static_cast<size_t>(n % 16 / 4)]);
    return sizes;
  }();
  const __m256i sizes = _mm256_load_si256(reinterpret_cast<const __m256i*>(kSizes.data()));
  const __m256i nibble = _mm256_set1_epi8(0x0F);
  const __m256i bytes = _mm256_add_epi8(_mm256_shuffle_epi8(sizes, _mm256_and_si256(t, nibble)),
                                        _mm256_shuffle_epi8(sizes, _mm256_and_si256(_mm256_srli_epi16(t, 4), nibble)));
  return _mm256_madd_epi16(_mm256_maddubs_epi16(bytes, _mm256_set1_epi8(1)), _mm256_set1_epi16(1));
}

/// Inclusive prefix sum of eight dwords, plus `carry` (every dword).
inline __m256i prefix_sum(__m256i x, __m256i carry) {
  x = _mm256_add_epi32(x, _mm256_slli_si256(x, 4));
  x = _mm256_add_epi32(x, _mm256_slli_si256(x, 8));
  x = _mm256_add_epi32(x, _mm256_blend_epi32(_mm256_setzero_si256(), _mm256_permutevar8x32_epi32(x, _mm256_set1_epi32(3)), 0xF0));
  return _mm256_add_epi32(x, carry);
}

/// Reads the tags into `rows`, eight rows per register, checking nothing; returns false when a tag
/// is 3. All a reader of slots known to be valid (a cache's own) needs; scan_tags validates too.
/// A raw group has kRawBytes escape bytes (first_tag_problem).
template <class G, int kRawBytes = 5>
bool read_tag_rows(const uint8_t* tags, size_t capacity, TagRows<G>& rows) {
  constexpr int kRegisters = TagRows<G>::kRows / 8;
  const __m256i last = _mm256_set1_epi32(static_cast<int>(capacity) - 16);
  __m256i invalid = _mm256_setzero_si256(), carry = _mm256_setzero_si256(), skip[2] = {carry, carry};
  uint32_t raw_rows = 0;
  for (int i = 0; i < kRegisters; ++i) {
    const __m256i t = load(tags + 32 * i);
    invalid = _mm256_or_si256(invalid, _mm256_and_si256(_mm256_and_si256(t, _mm256_srli_epi16(t, 1)), _mm256_set1_epi8(0x55)));
    const __m256i own = row_escape_bytes<kRawBytes>(t);
    const __m256i end = prefix_sum(own, carry);
    const __m256i start = _mm256_sub_epi32(end, own);
    const __m256i window = _mm256_min_epi32(start, last);
    _mm256_store_si256(reinterpret_cast<__m256i*>(rows.start + 8 * i), start);
    _mm256_store_si256(reinterpret_cast<__m256i*>(rows.window + 8 * i), window);
    skip[i] = _mm256_sub_epi32(start, window);
    carry = _mm256_permutevar8x32_epi32(end, _mm256_set1_epi32(7));
    // A tag with bit 1 set is raw (or 3, and rejected).
    const __m256i no_raw = _mm256_cmpeq_epi32(_mm256_and_si256(t, _mm256_set1_epi8(static_cast<char>(0xAA))), _mm256_setzero_si256());
    raw_rows |= (~static_cast<uint32_t>(_mm256_movemask_ps(_mm256_castsi256_ps(no_raw))) & 0xFFu) << (8 * i);
  }
  // The skips as bytes, row r at byte r: dwords to words (per lane: rows 0..3, 8..11 | 4..7,
  // 12..15), to bytes, then the lanes' first dwords interleaved.
  const __m256i skip16 = _mm256_packus_epi32(skip[0], skip[1]);
  const __m256i skip8 = _mm256_packus_epi16(skip16, skip16);
  _mm_store_si128(reinterpret_cast<__m128i*>(rows.skip),
                  _mm_unpacklo_epi32(_mm256_castsi256_si128(skip8), _mm256_extracti128_si256(skip8, 1)));
  rows.raw_rows = raw_rows;
  rows.used = static_cast<uint32_t>(_mm256_cvtsi256_si32(carry));
  return _mm256_testz_si256(invalid, invalid) != 0;
}

/// Validates the tags (no 3, escapes within `capacity`, zero padding; the scalar backend's statuses in
/// its order) and fills `rows`.
template <class G, int kRawBytes = 5>
DecodeStatus scan_tags(const uint8_t* tags, const uint8_t* escapes, size_t capacity, TagRows<G>& rows) {
  const bool no_invalid_tag = read_tag_rows<G, kRawBytes>(tags, capacity, rows);
  if (!no_invalid_tag || rows.used > capacity) return first_tag_problem<G, kRawBytes>(tags, capacity);
  return padding_is_zero(escapes, rows.used, capacity) ? DecodeStatus::ok : DecodeStatus::nonzero_padding;
}

/// What the vector pass adds to the 3-bit exponents. Per group, in rows of 16 (group 16r + i at
/// byte i of row r): its plane-3 escape byte if it is 4-bit, else 0; 0xFF if it is 4-bit, else 0.
template <class G>
struct EscapeRows {
  alignas(32) uint8_t plane3[TagRows<G>::kRows][16];
  alignas(32) uint8_t is4[TagRows<G>::kRows][16];
};

/// Per byte i of a 128-bit lane: tag byte i / 4 of the lane's tag word (lane 1: the next word).
constexpr std::array<uint8_t, 32> kTagBytes = [] {
  std::array<uint8_t, 32> control{};
  for (int d = 0; d < 32; ++d) control[static_cast<size_t>(d)] = static_cast<uint8_t>(4 * (d / 16) + d % 16 / 4);
  return control;
}();

/// Fills `out`, two rows at a time. The 4-bit escapes of a row are consecutive bytes from the
/// row's start as long as no raw group comes first, so the k-th 4-bit group of the row takes byte k
/// of a 16-byte window at that start: a prefix count and one byte shuffle, no branches. The window
/// stays inside the escape slot (TagRows::window; there are escapes, so the slot has 16 bytes or
/// more). In a row with a raw group the 4-bit groups after it get a wrong byte; patch_escaped_groups
/// redoes them.
template <class G>
void find_escape_rows(const uint8_t* tags, const uint8_t* escapes, const TagRows<G>& rows, EscapeRows<G>& out) {
  const __m256i tag_bytes = load(kTagBytes.data());
  const __m256i field = _mm256_set1_epi32(static_cast<int>(0xC0300C03u));  // group i's tag in byte i
  const __m256i tag1 = _mm256_set1_epi32(0x40100401);                     // ... when it is 1
  const __m256i not4 = _mm256_set1_epi8(static_cast<char>(0x80));          // vpshufb: byte 0
  const __m256i skips = _mm256_broadcastsi128_si256(_mm_load_si128(reinterpret_cast<const __m128i*>(rows.skip)));
  // vpshufb control taking skip byte r into lane 0 and r + 1 into lane 1.
  __m256i pair = _mm256_setr_epi64x(0, 0, 0x0101010101010101ll, 0x0101010101010101ll);
  for (int r = 0; r < TagRows<G>::kRows; r += 2, pair = _mm256_add_epi8(pair, _mm256_set1_epi8(2))) {
    const __m256i word = _mm256_set1_epi64x(static_cast<long long>(load_u64(tags + 4 * r)));
    const __m256i is4 = _mm256_cmpeq_epi8(_mm256_and_si256(_mm256_shuffle_epi8(word, tag_bytes), field), tag1);
    // is4 is -1 per 4-bit group: its inclusive prefix sum is minus the count up to each group.
    __m256i count = is4;
    count = _mm256_add_epi8(count, _mm256_slli_si256(count, 1));
    count = _mm256_add_epi8(count, _mm256_slli_si256(count, 2));
    count = _mm256_add_epi8(count, _mm256_slli_si256(count, 4));
    count = _mm256_add_epi8(count, _mm256_slli_si256(count, 8));
    const __m256i before = _mm256_sub_epi8(is4, count);  // 4-bit groups before this one in its row
    const __m256i window = _mm256_loadu2_m128i(reinterpret_cast<const __m128i*>(escapes + rows.window[r + 1]),
                                               reinterpret_cast<const __m128i*>(escapes + rows.window[r]));
    const __m256i index = _mm256_or_si256(_mm256_add_epi8(before, _mm256_shuffle_epi8(skips, pair)),
                                          _mm256_andnot_si256(is4, not4));
    store(out.plane3[r], _mm256_shuffle_epi8(window, index));
    store(out.is4[r], is4);
  }
}

/// Per fragment register v = 16c + p: byte d holds the row byte of its group (lane 2p + d / 16,
/// group 2c + d % 16 / 8 of the lane). Depends on c and, with four groups per lane, on p's parity.
template <class G>
constexpr std::array<ByteControl, 2 * G::kChunks> kGroupPick = [] {
  std::array<ByteControl, 2 * G::kChunks> controls{};
  for (int c = 0; c < G::kChunks; ++c) {
    for (int parity = 0; parity < 2; ++parity) {
      for (int d = 0; d < 32; ++d) {
        const int f = fragment_byte<G>(d);
        const int group = (2 * parity + f / 16) * G::kGroupsPerLane + 2 * c + f % 16 / 8;
        controls[static_cast<size_t>(2 * c + parity)].bytes[static_cast<size_t>(d)] = static_cast<uint8_t>(group % 16);
      }
    }
  }
  return controls;
}();

/// Per byte of a register in decode order: bit i for element i of its group.
template <class G>
constexpr ByteControl kElementBit = [] {
  ByteControl bits{};
  for (int d = 0; d < 32; ++d) bits.bytes[static_cast<size_t>(d)] = static_cast<uint8_t>(1u << (fragment_byte<G>(d) % 8));
  return bits;
}();

/// The exponents of a tile's fragment registers (decode order), made where the register is composed:
/// 3-bit code plus b3, plus for 4-bit groups b4 - b3 and bit 3 of the offset (from `EscapeRows`).
/// Raw groups come out as if 3-bit; patch_escaped_groups rewrites them.
template <class G>
class Exponents {
 public:
  Exponents(const uint8_t* codes, const DecodeBases<G>& bases, const EscapeRows<G>& rows)
      : codes_(codes), bases_(bases), rows_(&rows) {}

  /// Fragment register v = 16c + p, chunk c = 2o + kOdd. The escapes cost two byte shuffles of
  /// the group's row (plane-3 byte and 4-bit flag to each of its elements) and a few ALU ops.
  template <int kOdd>
  __m256i get(int o, int p) const {
    const int c = 2 * o + kOdd, v = 16 * c + p;
    const __m256i code = read_codes<G, kOdd>(codes_, o, p);
    const __m256i exponent = _mm256_add_epi8(code, bases_.b3(v));
    const unsigned row = 2 * static_cast<unsigned>(p) * G::kGroupsPerLane / 16;
    const __m256i pick = load(kGroupPick<G>[static_cast<size_t>(2 * c) + static_cast<unsigned>(p) % 2]);
    const __m256i plane3 = _mm256_shuffle_epi8(broadcast(rows_->plane3[row]), pick);
    const __m256i is4 = _mm256_shuffle_epi8(broadcast(rows_->is4[row]), pick);
    const __m256i bit = load(kElementBit<G>);
    const __m256i bit3 = _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(plane3, bit), bit), _mm256_set1_epi8(8));
    return _mm256_add_epi8(_mm256_add_epi8(exponent, _mm256_and_si256(is4, bases_.step(v))), bit3);
  }

 private:
  static __m256i broadcast(const uint8_t* row) {
    return _mm256_broadcastsi128_si256(_mm_load_si128(reinterpret_cast<const __m128i*>(row)));
  }
  const uint8_t* codes_;
  const DecodeBases<G>& bases_;
  const EscapeRows<G>* rows_;
};

/// Words 0..7 of each 128-bit lane in the order 0, 2, 1, 3, 4, 6, 5, 7 (swaps bits 0 and 1 of the
/// word offset).
constexpr ByteControl kSwapWordBits01 = [] {
  ByteControl control{};
  for (int d = 0; d < 32; ++d) {
    const int w = d % 16 / 2, from = (w & 4) | (w & 1) << 1 | (w & 2) >> 1;
    control.bytes[static_cast<size_t>(d)] = static_cast<uint8_t>(2 * from + d % 2);
  }
  return control;
}();
/// Dwords in the order 0, 4, 2, 6, 1, 5, 3, 7 (swaps bit 0 of the dword offset with the lane).
constexpr DwordControl kSwapDwordBit0AndLane = {{0, 4, 2, 6, 1, 5, 3, 7}};

/// Token row of the words value_words_to_rows leaves in register j, for t1.
constexpr int value_word_row(int j, int t1) { return 8 * (j & 1) + 4 * t1 + 2 * ((j >> 2) & 1) + ((j >> 1) & 1); }

/// Value words, one t1 and one jj1: the 8 registers j = g (word offset [t0 b1 b0], lane jj0; the
/// element is channel 8jj + g, token [b0 t1 t0 b1]). Three word-interleave rounds on g2, g1, g0 bring
/// g into the word offset, each pushing the top offset bit (t0, b1, b0 in turn) into the register
/// number: register j = [t0 b1 b0] ends as 16 consecutive channels of one token (value_word_row).
inline void value_words_to_rows(__m256i x[8]) {
#pragma GCC unroll 3
  for (int bit = 4; bit >= 1; bit /= 2) {
#pragma GCC unroll 8
    for (int j = 0; j < 8; ++j) {
      if (j & bit) continue;
      const __m256i a = x[j], b = x[j | bit];
      x[j] = _mm256_unpacklo_epi16(a, b);
      x[j | bit] = _mm256_unpackhi_epi16(a, b);
    }
  }
}

/// Keys: the 16-bit words of key segment 8c + q (c = 2o + kOdd), one token and 64 channels, from
/// fragment registers 16c + 2q + r. words[r][s1] holds register r's elements of quads with s1 (the
/// quad's bit 1 in the chunk) at word offset [s0 b1 b0] and lane t0: element channel
/// 64·(c % kHalves) + [s1 s0 b0 r t0 b1] (format.hpp: 16s + 2t + {0, 8, 1, 9}[b], t = 2r + t0).
/// `exponents` is an Exponents<G> or anything with its get<kOdd>(o, p).
template <class G, int kOdd, class Source>
inline void key_segment_words(const uint8_t* stored, const Source& exponents, int o, int q, __m256i words[2][2]) {
  const int segment = 8 * (2 * o + kOdd) + q;
#pragma GCC unroll 2
  for (int r = 0; r < 2; ++r) {
    __m256i lo, hi;
    compose(load(stored + 64 * segment + 32 * r), exponents.template get<kOdd>(o, 2 * q + r), lo, hi);
    words[r][0] = _mm256_unpacklo_epi8(lo, hi);
    words[r][1] = _mm256_unpackhi_epi8(lo, hi);
  }
}

/// Values: the 16-bit words of the eight fragment registers 16c + 2j + t1 (j = g) of chunk
/// c = 2o + kOdd: low[j] holds quads jj = 0, 1 and high[j] quads jj = 2, 3 (jj1 = 0, 1), each at word
/// offset [t0 b1 b0] and lane jj0 (element: channel 32c + 8jj + g, token [b0 t1 t0 b1]).
/// value_words_to_rows turns either set into rows. The stored bytes are put in decode order with
/// one vpermd each, the exponents are made in it.
template <class G, int kOdd, class Source>
inline void value_half_chunk_words(const uint8_t* stored, const Source& exponents, int o, int t1, __m256i low[8], __m256i high[8]) {
  const int c = 2 * o + kOdd;
#pragma GCC unroll 8
  for (int j = 0; j < 8; ++j) {
    __m256i lo, hi;
    compose(to_decode_order<G>(load(stored + 512 * c + 64 * j + 32 * t1)), exponents.template get<kOdd>(o, 2 * j + t1), lo, hi);
    low[j] = _mm256_unpacklo_epi8(lo, hi);
    high[j] = _mm256_unpackhi_epi8(lo, hi);
  }
}

template <class G>
uint64_t group_codes(const uint8_t* codes, int lane, int pair) {
  constexpr TileShape shape = G::kShape;
  constexpr int kOctets = G::kOctets;
  const auto word = [&](int w) {
    uint32_t x;
    std::memcpy(&x, codes + code_word_offset(shape, lane, w), sizeof x);
    return x;
  };
  const int o = pair / 4, k = pair % 4;
  const uint32_t w0 = word(o), w1 = word(kOctets + o), w2 = word(2 * kOctets + o);
  if (k == 3) {
    return (w0 >> 6 & 0x03030303u) | (w2 >> 4 & 0x04040404u) | uint64_t{(w1 >> 6 & 0x03030303u) | (w2 >> 5 & 0x04040404u)} << 32;
  }
  const uint32_t w = k == 0 ? w0 : k == 1 ? w1 : w2;
  return (w & 0x07070707u) | uint64_t{w >> 3 & 0x07070707u} << 32;
}

/// Bytewise sum of eight bytes (no carries from one byte into the next).
inline uint64_t add_bytes(uint64_t a, uint64_t b) {
  return static_cast<uint64_t>(_mm_cvtsi128_si64(_mm_add_epi8(_mm_cvtsi64_si128(static_cast<long long>(a)),
                                                              _mm_cvtsi64_si128(static_cast<long long>(b)))));
}

/// Writes the eight BF16 values of group g (lane, pair), in group order in `values`, to the rows.

/// Calls visit(at, lane, pair, exponents) for every group the vector pass (Exponents) gets wrong:
/// the raw groups (it takes them for 3-bit) and the 4-bit groups after a raw group in the same row
/// (it gives them the escape byte they would have if the raw group had none). `exponents` holds
/// the group's eight exponents, byte e for element e (fragment bytes at .. at + 7). About one raw
/// group per tile, so scalar code, one group (eight bytes) at a time.
/// `escapes` is the tile's escape slot (in a slot, right after the fixed part).
template <class G, class Visit>
void for_each_escaped_group(const uint8_t* slot, const uint8_t* escapes, const DecodeBases<G>& bases, const TagRows<G>& rows,
                            Visit&& visit) {
  constexpr TileShape shape = G::kShape;
  const uint8_t* tags = slot + shape.tag_offset();
  for (uint32_t pending = rows.raw_rows; pending != 0; pending &= pending - 1) {
    const int r = __builtin_ctz(pending);
    uint32_t word;
    std::memcpy(&word, tags + 4 * r, sizeof word);
    const int first = __builtin_ctz(word & 0xAAAAAAAAu) / 2;  // the row's first raw group
    const uint32_t earlier = word & ((1u << (2 * first)) - 1);
    const uint8_t* next = escapes + rows.start[r] + __builtin_popcount(earlier & 0x55555555u);
    for (uint32_t groups = (word | word >> 1) & (0x55555555u << (2 * first)); groups != 0; groups &= groups - 1) {
      const int i = __builtin_ctz(groups) / 2;
      const bool raw = (word >> (2 * i) & 3u) == static_cast<unsigned>(GroupMode::raw);
      const int g = 16 * r + i, lane = g / G::kGroupsPerLane, pair = g % G::kGroupsPerLane, at = G::group_offset(g);
      const uint64_t codes = group_codes<G>(slot + shape.code_offset(), lane, pair);
      // Byte e is element e. Raw: code | bits 3..7, bit e of plane k at bit 3 + k. 4-bit: b4 + (code
      // | bit 3). Branch-free: a 4-bit group reads its "planes" from the slot's first escape bytes.
      const uint8_t* planes = raw ? next : escapes;
      const uint64_t high = (_pdep_u64(planes[0], kByteBit0) << 3 | _pdep_u64(planes[1], kByteBit0) << 4) |
                            (_pdep_u64(planes[2], kByteBit0) << 5 | _pdep_u64(planes[3], kByteBit0) << 6) |
                            _pdep_u64(planes[4], kByteBit0) << 7;
      const uint64_t b4 = add_bytes(bases.b3_group(at), bases.step_group(at));
      const uint64_t exponents = raw ? codes | high : b4 + (codes | _pdep_u64(*next, kByteBit0) << 3);
      next += raw ? 5 : 1;
      visit(at, lane, pair, exponents);
    }
  }
}

/// An all-3-bit tile: no escapes.
template <class G>
constexpr EscapeRows<G> kNoEscapes{};

/// The prepared bases of a tile shape (what TileCodec::prepared() holds for the AVX2 backend): the
/// decoder's and the encoder's forms, side by side.
template <class G>
struct PreparedBases {
  DecodeBases<G> decode;
  FragmentBases<G> encode;
  explicit PreparedBases(const TileBases& bases) : decode(bases), encode(bases) {}
};

}  // namespace
}  // namespace gaac::avx2
