// AVX2 FP8 tile codec: exactly the scalar FP8 backend's slot bytes, counts, decoded bytes and statuses
// (fp8_scalar.cpp is the oracle; tests/codec/fp8_backend_test.cpp compares the two bit for bit).
//
// A 32-byte register holds 32 consecutive fragment positions (four groups), and every FP8 stream gives
// them with one load, a shift and a mask (docs/format.md, section 14.4). Decoding works in fragment order
// and permutes bytes to rows only at the end:
//
//   tags -> validation and escape offsets per row of 16 groups (the BF16 decoder's parts,
//           codec/decode_avx2.hpp, with X − 2 escape bytes per raw group); then, two rows at a time,
//           every group's mode and escape planes (one byte per plane and group), gathered with vpshufb
//           from 16-byte windows of the row's escapes at the offsets of an in-register prefix sum
//   one pass per register: 2-bit code + the base of the group's mode (b2, b3 or 0) + the bits of its
//           planes, compose the FP8 byte with its sign and mantissa, permute to rows (keys: one qword
//           interleave, a vpermd and a vpshufb per register; values: a vpshufb, three interleave rounds
//           and a lane swap)
//
// Raw groups are about one in ten on real FP8 KV (section 14.3), so unlike BF16's decoder, which
// patches its rare raw groups in scalar code afterwards, every mode is decoded in the vector pass.
//
// Two translation units build these kernels: fp8_avx2.cpp (AVX2 + BMI2) and fp8_gfni.cpp (the same
// and GFNI). With GFNI (make_fp8_kernels<true>) the escape planes are stored as one 8×8 bit matrix
// per group (its qword: plane k in the byte whose row is the exponent bit 2 + k), written per fragment
// register, and one vgf2p8affineqb against byte i = 1 << i turns a register's four matrices into the
// weighted plane bits of its 32 elements: 2 instructions a register; and each stream field (codes, signs,
// mantissas) is moved to its place by one affine against a constant matrix (move_bits) instead of a
// shift and a mask. Without GFNI the planes are stored per register as nibble words (element j's plane
// bits in the low nibble of byte j mod 4 of its group's word, element j + 4's in the high one), and a
// vpshufb, a dword shift and a mask give a register's weighted plane bits: 4 instructions a register,
// not 6 a plane. In both sets E5M2's codes and mantissas, two 2-bit streams of
// the same layout, are taken for two registers at once (code_mantissa_nibbles): a shift (with GFNI an
// affine), two ands and an or make both registers' [code | mantissa] nibbles, which pass through the
// exponent's additions untouched.
//
// Encoding reads rows, permutes them to fragment order with the inverse networks, classifies each group
// with vector compares and writes the streams; tags and escapes are written per group, as BF16's are.
#pragma once

#include "codec/fp8_kernels.hpp"

#if defined(__AVX2__)

#include <immintrin.h>

#include <algorithm>
#include <array>
#include <cstring>
#include <new>
#include <type_traits>
#include <utility>

#include "codec/decode_avx2.hpp"
#include "codec/encode_avx2.hpp"

namespace gaac::avx2 {
namespace {

template <ElementFormat Format, TensorKind Kind, int Channels>
struct Fp8Geometry : Geometry<Kind, Channels> {
  static constexpr Fp8TileShape kFp8Shape{Format, {Kind, Channels}};
  static constexpr ElementFormat kFormat = Format;
  static constexpr int kRawBytes = exponent_bits(Format) - kFp8CodeBits;  // escape bytes of a raw group
  static constexpr int kRegisters = Channels / 2;                        // 16·C positions / 32
};

// ----------------------------------------------------------------------------------------------
// Shuffle controls of the permutation networks (derivations beside each)

/// Keys, towards rows. After the qword interleave of a segment's two registers a byte sits at
/// [lane t0 | t1 s0 b1 b0] (register s1); vpermd brings s0 into the lane and t0 to bit 2 ...
constexpr DwordControl kKeyDwords = [] {
  DwordControl control{};
  for (uint32_t k = 0; k < 8; ++k) control.dwords[k] = (k & 1) << 2 | (k & 2) | k >> 2;
  return control;
}();
/// ... and vpshufb makes the byte offset [b0 t1 t0 b1]: channel [s1 | s0 | b0 t1 t0 b1] of the segment.
constexpr ByteControl kKeyBytes = [] {
  ByteControl control{};
  for (int d = 0; d < 32; ++d) {
    const int o = d % 16;
    control.bytes[static_cast<size_t>(d)] = static_cast<uint8_t>((o >> 2 & 1) << 3 | (o >> 1 & 1) << 2 | (o & 1) << 1 | (o >> 3 & 1));
  }
  return control;
}();
/// Values, towards rows: a register's byte at [lane t0 | cc1 cc0 b1 b0] moves to [t0 | b0 b1 cc1 cc0], so
/// the byte, word and dword interleaves on g0, g1, g2 leave [t0 | cc0 g2 g1 g0] (value_rounds_12, value_round_3).
constexpr ByteControl kValueBytes = [] {
  ByteControl control{};
  for (int d = 0; d < 32; ++d) {
    const int o = d % 16;
    control.bytes[static_cast<size_t>(d)] = static_cast<uint8_t>((o >> 1 & 1) << 3 | (o & 1) << 2 | (o >> 2 & 1) << 1 | (o >> 3 & 1));
  }
  return control;
}();

/// The inverses, for the encoder (rows to fragment order).
constexpr ByteControl inverse(const ByteControl& c) {
  ByteControl inv{};
  for (int d = 0; d < 32; ++d) inv.bytes[static_cast<size_t>(d / 16 * 16 + c.bytes[static_cast<size_t>(d)])] = static_cast<uint8_t>(d % 16);
  return inv;
}
constexpr DwordControl inverse(const DwordControl& c) {
  DwordControl inv{};
  for (uint32_t d = 0; d < 8; ++d) inv.dwords[c.dwords[d]] = d;
  return inv;
}
constexpr ByteControl kKeyBytesInverse = inverse(kKeyBytes);
constexpr DwordControl kKeyDwordsInverse = inverse(kKeyDwords);
constexpr ByteControl kValueBytesInverse = inverse(kValueBytes);

/// Keys: a segment's two fragment registers (one token, 64 channels) become its two row registers.
inline void key_to_rows(__m256i x[2]) {
  const __m256i low = _mm256_unpacklo_epi64(x[0], x[1]), high = _mm256_unpackhi_epi64(x[0], x[1]);
  const __m256i dwords = load(kKeyDwords), bytes = load(kKeyBytes);
  x[0] = _mm256_shuffle_epi8(_mm256_permutevar8x32_epi32(low, dwords), bytes);
  x[1] = _mm256_shuffle_epi8(_mm256_permutevar8x32_epi32(high, dwords), bytes);
}

inline void key_to_fragment(__m256i x[2]) {
  const __m256i dwords = load(kKeyDwordsInverse), bytes = load(kKeyBytesInverse);
  const __m256i low = _mm256_permutevar8x32_epi32(_mm256_shuffle_epi8(x[0], bytes), dwords);
  const __m256i high = _mm256_permutevar8x32_epi32(_mm256_shuffle_epi8(x[1], bytes), dwords);
  x[0] = _mm256_unpacklo_epi64(low, high);
  x[1] = _mm256_unpackhi_epi64(low, high);
}

/// Values: the eight fragment registers 16c + 2g + t1 (g = j) of one chunk half become eight token rows
/// of the chunk's 32 channels: row value_row(j, t1) in register j. The interleave on g0 pushes b0 into
/// the register number, on g1 b1, on g2 cc1; the lane swap trades cc1 for t0. The first two rounds work
/// within each half (g2 = 0, 1) of four registers, so a decoder can run them on one half while it
/// decodes the other (value_rounds_12), and the last round joins the halves (value_round_3).
[[gnu::always_inline]] inline void value_rounds_12(__m256i x[4]) {
  const __m256i bytes = load(kValueBytes);
#pragma GCC unroll 4
  for (int j = 0; j < 4; ++j) x[j] = _mm256_shuffle_epi8(x[j], bytes);
#pragma GCC unroll 2
  for (int j = 0; j < 4; j += 2) {
    const __m256i a = x[j], b = x[j + 1];
    x[j] = _mm256_unpacklo_epi8(a, b);
    x[j + 1] = _mm256_unpackhi_epi8(a, b);
  }
#pragma GCC unroll 2
  for (int j = 0; j < 2; ++j) {
    const __m256i a = x[j], b = x[j + 2];
    x[j] = _mm256_unpacklo_epi16(a, b);
    x[j + 2] = _mm256_unpackhi_epi16(a, b);
  }
}

/// The last round: registers low[j] (g2 = 0) and high[j] (g2 = 1) become rows j and j + 4.
inline void value_round_3(const __m256i& low, const __m256i& high, __m256i& row_j, __m256i& row_j4) {
  const __m256i lo = _mm256_unpacklo_epi32(low, high), hi = _mm256_unpackhi_epi32(low, high);
  row_j = _mm256_permute2x128_si256(lo, hi, 0x20);
  row_j4 = _mm256_permute2x128_si256(lo, hi, 0x31);
}

/// Token row of register j after value_round_3 (j < 4: row_j; else row_j4 of j − 4): [b0 t1 t0 b1] with j = [t0 b1 b0].
constexpr int value_row(int j, int t1) { return 8 * (j & 1) + 4 * t1 + 2 * (j >> 2 & 1) + (j >> 1 & 1); }

inline void value_to_fragment(__m256i x[8]) {
#pragma GCC unroll 4
  for (int j = 0; j < 4; ++j) {
    const __m256i lo = _mm256_permute2x128_si256(x[j], x[j + 4], 0x20), hi = _mm256_permute2x128_si256(x[j], x[j + 4], 0x31);
    // lo/hi are the dword interleaves of the fragment-side pair; undo them.
    const __m256i a = _mm256_castps_si256(_mm256_shuffle_ps(_mm256_castsi256_ps(lo), _mm256_castsi256_ps(hi), 0x88));
    const __m256i b = _mm256_castps_si256(_mm256_shuffle_ps(_mm256_castsi256_ps(lo), _mm256_castsi256_ps(hi), 0xDD));
    x[j] = a;
    x[j + 4] = b;
  }
  const __m256i even_odd_words = _mm256_setr_epi8(0, 1, 4, 5, 8, 9, 12, 13, 2, 3, 6, 7, 10, 11, 14, 15,  //
                                                  0, 1, 4, 5, 8, 9, 12, 13, 2, 3, 6, 7, 10, 11, 14, 15);
  const __m256i even_odd_bytes = _mm256_setr_epi8(0, 2, 4, 6, 8, 10, 12, 14, 1, 3, 5, 7, 9, 11, 13, 15,  //
                                                  0, 2, 4, 6, 8, 10, 12, 14, 1, 3, 5, 7, 9, 11, 13, 15);
#pragma GCC unroll 4
  for (int j = 0; j < 8; ++j) {
    if (j & 2) continue;
    const __m256i a = _mm256_shuffle_epi8(x[j], even_odd_words), b = _mm256_shuffle_epi8(x[j + 2], even_odd_words);
    x[j] = _mm256_unpacklo_epi64(a, b);
    x[j + 2] = _mm256_unpackhi_epi64(a, b);
  }
#pragma GCC unroll 4
  for (int j = 0; j < 8; j += 2) {
    const __m256i a = _mm256_shuffle_epi8(x[j], even_odd_bytes), b = _mm256_shuffle_epi8(x[j + 1], even_odd_bytes);
    x[j] = _mm256_unpacklo_epi64(a, b);
    x[j + 1] = _mm256_unpackhi_epi64(a, b);
  }
  const __m256i bytes = load(kValueBytesInverse);
#pragma GCC unroll 8
  for (int j = 0; j < 8; ++j) x[j] = _mm256_shuffle_epi8(x[j], bytes);
}

// ----------------------------------------------------------------------------------------------
// Bases in fragment order

/// The bases of every fragment register, shifted to the exponent field's place (left by M, so a
/// decoded exponent is already where the FP8 byte keeps it): the narrow window's (b2 << M) and the wide
/// one's (b3 << M). Keys repeat per token (patterns 2h + t1, codec/decode_avx2.hpp's key_base_patterns);
/// values per (chunk, g).
template <class F>
class Fp8Bases {
 public:
  explicit Fp8Bases(const Fp8TileBases& bases) {
    store_patterns(bases);
    for (int i = 0; i < kPatterns; ++i) {
      // Bases < 2^X and X + M = 7: nothing crosses a byte.
      store(narrow_[i], _mm256_slli_epi16(load(narrow_[i]), kM));
      store(wide_[i], _mm256_slli_epi16(load(wide_[i]), kM));
    }
  }
  __m256i narrow(int v) const { return load(narrow_[pattern(v)]); }
  __m256i wide(int v) const { return load(wide_[pattern(v)]); }

 private:
  static constexpr int kM = mantissa_bits(F::kFormat);
  void store_patterns(const Fp8TileBases& bases) {
    if constexpr (F::kShape.kind == TensorKind::key) {
      for (int h = 0; h < F::kHalves; ++h) {
        __m256i b2[2], b3[2];
        key_base_patterns(bases.b2.data() + 64 * h, b2);
        key_base_patterns(bases.b3.data() + 64 * h, b3);
        for (int i = 0; i < 2; ++i) {
          store(narrow_[2 * h + i], b2[i]);
          store(wide_[2 * h + i], b3[i]);
        }
      }
    } else {
      for (int c = 0; c < F::kChunks; ++c) {
        __m256i d2[2], d3[2];
        value_base_dwords(bases.b2.data() + 32 * c, d2);
        value_base_dwords(bases.b3.data() + 32 * c, d3);
        for (int g = 0; g < 8; ++g) {
          const __m256i spread = load(kSpreadDword[static_cast<size_t>(g % 4)]);
          store(narrow_[8 * c + g], _mm256_shuffle_epi8(d2[g / 4], spread));
          store(wide_[8 * c + g], _mm256_shuffle_epi8(d3[g / 4], spread));
        }
      }
    }
  }
  static constexpr int kPatterns = F::kShape.kind == TensorKind::key ? 2 * F::kHalves : 8 * F::kChunks;
  static constexpr int pattern(int v) {
    const auto u = static_cast<unsigned>(v);
    if constexpr (F::kShape.kind == TensorKind::key) return static_cast<int>(u / 16 % F::kHalves * 2 + u % 2);
    return static_cast<int>(u / 16 * 8 + u % 16 / 2);
  }
  alignas(32) uint8_t narrow_[kPatterns][32];
  alignas(32) uint8_t wide_[kPatterns][32];
};

// ----------------------------------------------------------------------------------------------
// Streams

/// Calls fn(std::integral_constant<int, I>{}) for I = 0 .. N−1: loops whose index must be a constant.
template <int N, class Fn>
inline void static_for(Fn&& fn) {
  [&]<int... I>(std::integer_sequence<int, I...>) { (fn(std::integral_constant<int, I>{}), ...); }(std::make_integer_sequence<int, N>{});
}

/// The `Bits`-bit fields of fragment register V (positions 32V .. 32V+31), one per byte.
template <int Bits, int V>
inline __m256i read_fields(const uint8_t* stream) {
  constexpr int kPerBlock = 8 / Bits;
  const __m256i block = load(stream + 32 * (V / kPerBlock));
  return _mm256_and_si256(_mm256_srli_epi16(block, Bits * (V % kPerBlock)), _mm256_set1_epi8(static_cast<char>((1 << Bits) - 1)));
}

/// The 2-bit codes of fragment register V at bits M, M + 1 of each byte (the exponent field's place).
template <int M, int V>
inline __m256i read_codes_at(const uint8_t* stream) {
  constexpr int kShift = 2 * (V % 4) - M;  // the field sits at 2·(V mod 4) in its byte
  const __m256i block = load(stream + 32 * (V / 4));
  // Bits leaking across bytes land outside bits M, M + 1 (the shift is at most 6 − M right or M left).
  const __m256i at = kShift >= 0 ? _mm256_srli_epi16(block, kShift > 0 ? kShift : 0) : _mm256_slli_epi16(block, kShift < 0 ? -kShift : 0);
  return _mm256_and_si256(at, _mm256_set1_epi8(static_cast<char>(3 << M)));
}

#if defined(__GFNI__)
/// vgf2p8affineqb's matrix operand (its qword four times) that moves bit From + k of every byte to bit To + k
/// for k < Count and clears the others (result bit j is parity(qword byte 7 − j AND x)); with SignFrom, that
/// bit also goes to bit 7; with BothNibbles, each move is made again 4 bits higher.
template <int From, int To, int Count, int SignFrom = -1, bool BothNibbles = false>
constexpr ByteControl kBitMove = [] {
  uint64_t m = 0;
  for (int k = 0; k < Count; ++k) {
    m |= uint64_t{1} << (8 * (7 - (To + k)) + From + k);
    if (BothNibbles) m |= uint64_t{1} << (8 * (7 - (To + k + 4)) + From + k + 4);
  }
  if constexpr (SignFrom >= 0) m |= uint64_t{1} << SignFrom;  // byte 0 of the qword: result bit 7
  ByteControl c{};
  for (int d = 0; d < 32; ++d) c.bytes[static_cast<size_t>(d)] = static_cast<uint8_t>(m >> (8 * (d % 8)));
  return c;
}();

/// kBitMove's product: one instruction in place of a shift and a mask (or, for E4M3, a shift, a mask and
/// a table).
template <int From, int To, int Count, int SignFrom = -1, bool BothNibbles = false>
inline __m256i move_bits(__m256i x) {
  return _mm256_gf2p8affine_epi64_epi8(x, load(kBitMove<From, To, Count, SignFrom, BothNibbles>), 0);
}
#endif

/// The 2-bit codes of fragment register V at bits M, M + 1 of each byte, the other bits 0.
template <int M, int V, bool Gfni>
inline __m256i codes_of(const uint8_t* stream) {
#if defined(__GFNI__)
  if constexpr (Gfni) return move_bits<2 * (V % 4), M, 2>(load(stream + 32 * (V / 4)));
#endif
  return read_codes_at<M, V>(stream);
}

/// The bits of fragment register V's FP8 bytes that are neither exponent nor code, in place: E4M3's sign and
/// mantissa; E5M2's sign alone (its mantissas come with the codes: code_mantissa_nibbles).
template <class F, int V, bool Gfni>
inline __m256i sign_mantissa_of(const uint8_t* slot) {
  constexpr Fp8TileShape shape = F::kFp8Shape;
#if defined(__GFNI__)
  if constexpr (Gfni) {
    if constexpr (F::kFormat == ElementFormat::e4m3) {
      // The nibble [s m2 m1 m0] at bit 4·(V mod 2): m to bits 0..2, s to bit 7.
      constexpr int kAt = 4 * (V % 2);
      return move_bits<kAt, 0, 3, kAt + 3>(load(slot + shape.sign_mantissa_offset() + 32 * (V / 2)));
    } else {
      return move_bits<0, 0, 0, V % 8>(load(slot + shape.sign_mantissa_offset() + 32 * (V / 8)));
    }
  }
#endif
  if constexpr (F::kFormat == ElementFormat::e4m3) {
    // sign+mantissa nibble [s m2 m1 m0] to s << 7 | m, by table.
    const __m256i table = _mm256_setr_epi8(0, 1, 2, 3, 4, 5, 6, 7, -128, -127, -126, -125, -124, -123, -122, -121,  //
                                           0, 1, 2, 3, 4, 5, 6, 7, -128, -127, -126, -125, -124, -123, -122, -121);
    return _mm256_shuffle_epi8(table, read_fields<4, V>(slot + shape.sign_mantissa_offset()));
  } else {
    const __m256i signs = load(slot + shape.sign_mantissa_offset() + 32 * (V / 8));
    return _mm256_and_si256(_mm256_slli_epi16(signs, 7 - V % 8), _mm256_set1_epi8(static_cast<char>(0x80)));
  }
}

/// E5M2: the codes and mantissas of fragment registers V and V + 2 (u = V mod 4 is 0 or 1) as one nibble
/// per register, [code | mantissa] (the code at the exponent field's place, bits 2, 3), V's in bits 0..3 and
/// V + 2's in bits 4..7. Both 2-bit streams keep the two registers' fields in the same block, at bits 2u,
/// 2u + 1 and 2u + 4, 2u + 5: for u = 0 the codes move up two bits, for u = 1 the mantissas down two, and
/// the other stream's fields are already in place (a 16-bit shift's bits that cross bytes fall outside the
/// masks).
template <class F, int V, bool Gfni>
inline __m256i code_mantissa_nibbles(const uint8_t* slot) {
  static_assert(F::kFormat == ElementFormat::e5m2 && V % 4 < 2);
  constexpr Fp8TileShape shape = F::kFp8Shape;
  const __m256i codes = load(slot + shape.code_offset() + 32 * (V / 4));
  const __m256i mantissas = load(slot + shape.mantissa_offset() + 32 * (V / 4));
  const __m256i low_pairs = _mm256_set1_epi8(0x33), high_pairs = _mm256_set1_epi8(static_cast<char>(0xCC));
#if defined(__GFNI__)
  if constexpr (Gfni) {
    if constexpr (V % 4 == 0) return _mm256_or_si256(move_bits<0, 2, 2, -1, true>(codes), _mm256_and_si256(mantissas, low_pairs));
    return _mm256_or_si256(_mm256_and_si256(codes, high_pairs), move_bits<2, 0, 2, -1, true>(mantissas));
  }
#endif
  if constexpr (V % 4 == 0)
    return _mm256_or_si256(_mm256_and_si256(_mm256_slli_epi16(codes, 2), high_pairs), _mm256_and_si256(mantissas, low_pairs));
  return _mm256_or_si256(_mm256_and_si256(codes, high_pairs), _mm256_and_si256(_mm256_srli_epi16(mantissas, 2), low_pairs));
}

// ----------------------------------------------------------------------------------------------
// Decode

/// Per fragment register v = 16c + p: byte d holds the row byte of its group (lane 2p + d / 16, group
/// 2c + d % 16 / 8 of the lane). Depends on c and, with four groups per lane, on p's parity.
template <class F>
constexpr std::array<ByteControl, 2 * F::kChunks> kFp8GroupPick = [] {
  std::array<ByteControl, 2 * F::kChunks> controls{};
  for (int c = 0; c < F::kChunks; ++c) {
    for (int parity = 0; parity < 2; ++parity) {
      for (int d = 0; d < 32; ++d) {
        const int group = (2 * parity + d / 16) * F::kGroupsPerLane + 2 * c + d % 16 / 8;
        controls[static_cast<size_t>(2 * c + parity)].bytes[static_cast<size_t>(d)] = static_cast<uint8_t>(group % 16);
      }
    }
  }
  return controls;
}();

/// Per byte of a register: bit i for element i of its group.
constexpr ByteControl kFp8ElementBit = [] {
  ByteControl bits{};
  for (int d = 0; d < 32; ++d) bits.bytes[static_cast<size_t>(d)] = static_cast<uint8_t>(1u << (d % 8));
  return bits;
}();

/// Every group's mode and escape planes: the mode in rows of 16 groups (group 16r + i at byte i of row r)
/// as 0x00 (2-bit), 0x80 (3-bit) or 0x7F (raw), so that bit 7 picks b3 over b2 and bits 0..6 clear a raw
/// group's base (exponents_of); the planes (plane k: bit 2 + k of each offset or exponent, 0 for a 2-bit
/// group) per fragment register. With GFNI as `matrix`: the register's four groups' qwords
/// (write_matrices). Without, as `nibbles`: per group of the register a 4-byte word whose byte j holds
/// element j's plane bits in its low nibble and element j + 4's in its high nibble (bit k: plane k), the
/// register's groups 0, 1 in bytes 0..7 and 2, 3 in bytes 8..15 (write_nibbles).
template <class F, bool Gfni>
struct EscapePlanes {
  alignas(32) uint8_t mode[TagRows<F>::kRows][16];
  alignas(32) uint8_t matrix[Gfni ? F::kRegisters : 1][32];
  alignas(16) uint8_t nibbles[Gfni ? 1 : F::kRegisters][16];
};

/// A tile without escapes: every group 2-bit.
template <class F, bool Gfni>
constexpr EscapePlanes<F, Gfni> kNoPlanes{};

/// GFNI: where write_matrices finds the groups of the r-th of the four fragment registers whose groups
/// lie in one row of 16 (rows hold the groups of 8 / G values of p, each with all kChunks chunks).
/// Register 16c + p has, in qword q, group (2p + q / 2)·G + 2c + q % 2: row-local index
/// (2·pp + q / 2)·G + 2c + q % 2 with pp = p mod (8 / G).
struct MatrixSlot {
  int register_base;  // 16c + pp; the register is register_base + (8 / G)·row
  int low_half, high_half;  // which 8 groups of the row (unpacklo or unpackhi) feed the lower / upper lane
  ByteControl pair;   // vpshufb of the plane 0/1 pairs into the matrix bytes
  ByteControl third;  // vpshufb of plane 2 (E5M2) from the row broadcast to both lanes
};

template <class F>
constexpr std::array<MatrixSlot, 4> kMatrixSlots = [] {
  constexpr int G = F::kGroupsPerLane, kPerRow = 8 / G, kM = mantissa_bits(F::kFormat);
  static_assert(G == 4 || G == 8);
  std::array<MatrixSlot, 4> slots{};
  for (int s = 0; s < 4; ++s) {
    const int c = s / kPerRow, pp = s % kPerRow;
    MatrixSlot& m = slots[static_cast<size_t>(s)];
    m.register_base = 16 * c + pp;
    for (auto& b : m.pair.bytes) b = 0x80;
    for (auto& b : m.third.bytes) b = 0x80;
    for (int q = 0; q < 4; ++q) {
      const int i = (2 * pp + q / 2) * G + 2 * c + q % 2;
      if (q == 0) m.low_half = i / 8;
      if (q == 2) m.high_half = i / 8;
      for (int k = 0; k < F::kRawBytes; ++k) {
        // Plane k weighs 4 << (k + M): output bit 2 + k + M, which the affine takes from matrix byte 7 − that.
        const auto at = static_cast<size_t>(8 * q + 5 - k - kM);
        if (k < 2) m.pair.bytes[at] = static_cast<uint8_t>(2 * (i % 8) + k);
        else m.third.bytes[at] = static_cast<uint8_t>(i);
      }
    }
  }
  return slots;
}();

/// GFNI: the matrices of the eight registers whose groups lie in rows r and r + 1, from the planes of
/// those rows (one row per 128-bit lane).
template <class F>
inline void write_matrices(const __m256i* plane, int r, uint8_t (*matrix)[32]) {
  constexpr int kPerRow = 8 / F::kGroupsPerLane;
  const __m256i pairs[2] = {_mm256_unpacklo_epi8(plane[0], plane[1]), _mm256_unpackhi_epi8(plane[0], plane[1])};
  static_for<2>([&](auto lane) {
    constexpr int L = decltype(lane)::value;
    [[maybe_unused]] __m256i third;
    if constexpr (F::kRawBytes == 3) third = _mm256_permute2x128_si256(plane[2], plane[2], L * 0x11);
    static_for<4>([&](auto slot) {
      constexpr int s = decltype(slot)::value;
      constexpr MatrixSlot m = kMatrixSlots<F>[s];
      const __m256i x = _mm256_permute2x128_si256(pairs[m.low_half], pairs[m.high_half], L | (2 + L) << 4);
      __m256i out = _mm256_shuffle_epi8(x, load(kMatrixSlots<F>[s].pair));
      if constexpr (F::kRawBytes == 3) out = _mm256_or_si256(out, _mm256_shuffle_epi8(third, load(kMatrixSlots<F>[s].third)));
      store(matrix[m.register_base + kPerRow * (r + L)], out);
    });
  });
}

/// Without GFNI: the nibble words (EscapePlanes::nibbles) of the registers whose groups lie in rows r and
/// r + 1, from the planes of those rows (one row per 128-bit lane; plane k: bit i for element i of each
/// group). Byte j of a group's word is the sum over k of (bits j and j + 4 of plane k) << k; unpacking the
/// four bytes j makes the words of groups 4w .. 4w + 3 in words[w]; a register's groups 0, 1 and 2, 3 are two
/// adjacent words each (row-local groups (2·pp)·G + 2c and (2·pp + 1)·G + 2c, kMatrixSlots' numbering).
template <class F>
inline void write_nibbles(const __m256i* plane, int r, uint8_t (*nibbles)[16]) {
  constexpr int G = F::kGroupsPerLane, kPerRow = 8 / G;
  __m256i byte[4];
  static_for<4>([&](auto j) {
    constexpr int J = decltype(j)::value;
    __m256i sum = _mm256_setzero_si256();
    static_for<F::kRawBytes>([&](auto k) {
      // Bits J and J + 4 of every byte to bits K and K + 4: a 16-bit shift's bits that cross bytes land
      // outside the mask (the shift is at most 3).
      constexpr int K = decltype(k)::value, kShift = K - J;
      const __m256i at = kShift >= 0 ? _mm256_slli_epi16(plane[K], kShift > 0 ? kShift : 0)
                                     : _mm256_srli_epi16(plane[K], kShift < 0 ? -kShift : 0);
      sum = _mm256_or_si256(sum, _mm256_and_si256(at, _mm256_set1_epi8(static_cast<char>(0x11 << K))));
    });
    byte[J] = sum;
  });
  const __m256i low01 = _mm256_unpacklo_epi8(byte[0], byte[1]), low23 = _mm256_unpacklo_epi8(byte[2], byte[3]);
  const __m256i high01 = _mm256_unpackhi_epi8(byte[0], byte[1]), high23 = _mm256_unpackhi_epi8(byte[2], byte[3]);
  const __m256i words[4] = {_mm256_unpacklo_epi16(low01, low23), _mm256_unpackhi_epi16(low01, low23),
                            _mm256_unpacklo_epi16(high01, high23), _mm256_unpackhi_epi16(high01, high23)};
  static_for<F::kChunks>([&](auto chunk) {
    constexpr int c = decltype(chunk)::value;
    static_for<kPerRow>([&](auto part) {
      constexpr int pp = decltype(part)::value, first = 2 * pp * G + 2 * c, second = (2 * pp + 1) * G + 2 * c;
      // Both pairs sit in the same half of their words' registers (2c mod 4 is 0 or 2).
      const __m256i x = c % 2 == 0 ? _mm256_unpacklo_epi64(words[first / 4], words[second / 4])
                                   : _mm256_unpackhi_epi64(words[first / 4], words[second / 4]);
      _mm_store_si128(reinterpret_cast<__m128i*>(nibbles[16 * c + kPerRow * r + pp]), _mm256_castsi256_si128(x));
      _mm_store_si128(reinterpret_cast<__m128i*>(nibbles[16 * c + kPerRow * (r + 1) + pp]), _mm256_extracti128_si256(x, 1));
    });
  });
}

/// Without GFNI, per byte of a register: the byte of its group's nibble word that holds the element's
/// plane bits (element i: byte i mod 4 of the word of group d / 8, as the register's 16 bytes are
/// broadcast to both lanes).
constexpr ByteControl kNibblePick = [] {
  ByteControl pick{};
  for (int d = 0; d < 32; ++d) pick.bytes[static_cast<size_t>(d)] = static_cast<uint8_t>(4 * (d / 8) + d % 4);
  return pick;
}();

/// Without GFNI, per dword of a register (elements 0..3 of a group, then 4..7): the left shift that takes
/// the elements' nibble (low, then high) to the planes' place, bit 2 + M.
template <class F>
constexpr DwordControl kNibbleShift = [] {
  constexpr uint32_t kAt = 2 + mantissa_bits(F::kFormat);
  DwordControl shift{};
  for (uint32_t d = 0; d < 8; ++d) shift.dwords[d] = d % 2 == 0 ? kAt : kAt - 4;
  return shift;
}();

/// Fills `out`, two rows (one per 128-bit lane) at a time. A group's escapes start at its row's start
/// plus the escape bytes of the groups before it in the row (a prefix sum of 0, 1 or X − 2 per group);
/// plane k of it is the byte k further on, picked with vpshufb from the 16-byte windows of the row's
/// escapes (at most 16·(X − 2) bytes, so X − 2 windows). Only a group's own bytes are looked up, so the
/// windows may run past the tile's escapes into the slot's zero padding; a row whose windows would run past
/// the slot (`capacity` escape bytes) reads them from a copy of the slot's last bytes followed by zeros.
template <class F, bool Gfni>
void find_escape_planes(const uint8_t* tags, const uint8_t* escapes, size_t capacity, const TagRows<F>& rows,
                        EscapePlanes<F, Gfni>& out) {
  constexpr int kR = F::kRawBytes;
  constexpr size_t kReach = 16 * kR;  // the bytes a row's windows span
  alignas(32) uint8_t tail[2 * kReach];
  const size_t tail_from = capacity > kReach ? capacity - kReach : 0;
  if (capacity >= kReach) {
    std::memcpy(tail, escapes + tail_from, kReach);
  } else {
    std::memcpy(tail, escapes, capacity);
    std::memset(tail + capacity, 0, kReach - capacity);
  }
  std::memset(tail + kReach, 0, kReach);
  // Rows starting before tail_from end their windows inside the slot; the others start at most kReach
  // bytes into the tail (start <= used <= capacity).
  const auto row_escapes = [&](uint32_t start) { return start < tail_from ? escapes + start : tail + (start - tail_from); };
  const __m256i tag_bytes = load(kTagBytes.data());
  const __m256i field = _mm256_set1_epi32(static_cast<int>(0xC0300C03u));  // group i's tag in byte i
  const __m256i tag1 = _mm256_set1_epi32(0x40100401), tag2 = _mm256_set1_epi32(static_cast<int>(0x80200802u));
  for (int r = 0; r < TagRows<F>::kRows; r += 2) {
    const __m256i word = _mm256_set1_epi64x(static_cast<long long>(load_u64(tags + 4 * r)));
    const __m256i t = _mm256_and_si256(_mm256_shuffle_epi8(word, tag_bytes), field);
    const __m256i is3 = _mm256_cmpeq_epi8(t, tag1), raw = _mm256_cmpeq_epi8(t, tag2);
    const __m256i size = _mm256_or_si256(_mm256_and_si256(is3, _mm256_set1_epi8(1)), _mm256_and_si256(raw, _mm256_set1_epi8(kR)));
    __m256i before = _mm256_slli_si256(size, 1);  // exclusive prefix sum inside each row (lane)
    before = _mm256_add_epi8(before, _mm256_slli_si256(before, 1));
    before = _mm256_add_epi8(before, _mm256_slli_si256(before, 2));
    before = _mm256_add_epi8(before, _mm256_slli_si256(before, 4));
    before = _mm256_add_epi8(before, _mm256_slli_si256(before, 8));
    // Window w enters as its xor with window w − 1, looked up at index − 16w: vpshufb reads an index's low four
    // bits, or gives 0 when it is negative (bit 7), so the lookups of windows 0 .. index / 16 telescope to
    // window index / 16's byte. Every index is below 16·(X − 2) (a row's escapes), the last window's end.
    const uint8_t *low = row_escapes(rows.start[r]), *high = row_escapes(rows.start[r + 1]);
    __m256i windows[kR];
    for (int w = 0; w < kR; ++w) {
      windows[w] = _mm256_loadu2_m128i(reinterpret_cast<const __m128i*>(high + 16 * w), reinterpret_cast<const __m128i*>(low + 16 * w));
    }
    for (int w = kR - 1; w > 0; --w) windows[w] = _mm256_xor_si256(windows[w], windows[w - 1]);
    __m256i planes[kR];
    for (int k = 0; k < kR; ++k) {
      __m256i plane = _mm256_shuffle_epi8(windows[0], _mm256_add_epi8(before, _mm256_set1_epi8(static_cast<char>(k))));
      for (int w = 1; w < kR; ++w) {
        const __m256i at = _mm256_add_epi8(before, _mm256_set1_epi8(static_cast<char>(k - 16 * w)));
        plane = _mm256_xor_si256(plane, _mm256_shuffle_epi8(windows[w], at));
      }
      planes[k] = _mm256_and_si256(plane, k == 0 ? _mm256_or_si256(is3, raw) : raw);
    }
    if constexpr (Gfni) write_matrices<F>(planes, r, out.matrix);
    else write_nibbles<F>(planes, r, out.nibbles);
    store(out.mode[r], _mm256_or_si256(_mm256_and_si256(is3, _mm256_set1_epi8(static_cast<char>(0x80))),
                                       _mm256_and_si256(raw, _mm256_set1_epi8(0x7F))));
  }
}

/// The exponents of fragment register V at the exponent field's place (bits M..): its 2-bit codes (`code`,
/// at bits M, M + 1; bits below M pass through unchanged), plus the base of its group's mode (b2, b3, or 0 for
/// raw groups), plus bit 2 + k of plane k.
template <class F, bool Gfni, int V>
inline __m256i exponents_of(__m256i code, const Fp8Bases<F>& bases, const EscapePlanes<F, Gfni>& planes) {
  constexpr int v = V, kM = mantissa_bits(F::kFormat);
  constexpr unsigned p = V % 16, c = V / 16;
  constexpr unsigned row = 2 * p * F::kGroupsPerLane / 16;
  const __m256i pick = load(kFp8GroupPick<F>[2 * c + p % 2]);
  const auto picked = [&](const uint8_t* r) {
    return _mm256_shuffle_epi8(_mm256_broadcastsi128_si256(_mm_load_si128(reinterpret_cast<const __m128i*>(r))), pick);
  };
  // One pick gives the mode: its bit 7 (0x80) selects b3 over b2, and a raw group's bits 0..6 (0x7F) clear the
  // base (bases are below 2^7).
  const __m256i mode = picked(planes.mode[row]);
  const __m256i base = _mm256_andnot_si256(mode, _mm256_blendv_epi8(bases.narrow(v), bases.wide(v), mode));
  const __m256i exponent = _mm256_add_epi8(code, base);
#if defined(__GFNI__)
  if constexpr (Gfni) {
    // Byte i of each qword is 1 << i: the affine gives element i bit i of every matrix byte, at the bit
    // the byte's row stands for (the planes' weights; the matrix's other bytes are 0).
    return _mm256_add_epi8(exponent, _mm256_gf2p8affine_epi64_epi8(load(kFp8ElementBit), load(planes.matrix[V]), 0));
  }
#else
  static_assert(!Gfni, "the GFNI kernels need a translation unit built with -mgfni");
#endif
  // Each element's byte of its group's nibble word, its nibble shifted to bit 2 + M (a dword shift: what
  // crosses into the next byte, and the other nibble, fall outside the mask).
  const __m256i words = _mm256_broadcastsi128_si256(_mm_load_si128(reinterpret_cast<const __m128i*>(planes.nibbles[V])));
  const __m256i bits = _mm256_sllv_epi32(_mm256_shuffle_epi8(words, load(kNibblePick)), load(kNibbleShift<F>));
  constexpr int kPlaneBits = ((1 << F::kRawBytes) - 1) << (2 + kM);
  return _mm256_add_epi8(exponent, _mm256_and_si256(bits, _mm256_set1_epi8(static_cast<char>(kPlaneBits))));
}

/// The FP8 bytes of fragment register V from its codes, escape planes and sign+mantissa stream (E4M3; E5M2's
/// registers are decoded in pairs: decode_pair).
template <class F, int V, bool Gfni>
inline __m256i decode_register(const uint8_t* slot, const Fp8Bases<F>& bases, const EscapePlanes<F, Gfni>& rows) {
  const __m256i code = codes_of<mantissa_bits(F::kFormat), V, Gfni>(slot + F::kFp8Shape.code_offset());
  return _mm256_or_si256(sign_mantissa_of<F, V, Gfni>(slot), exponents_of<F, Gfni, V>(code, bases, rows));
}

/// Bits 4..7 of every byte moved to bits 0..3, the others 0.
template <bool Gfni>
inline __m256i high_nibbles(__m256i x) {
#if defined(__GFNI__)
  if constexpr (Gfni) return move_bits<4, 0, 4>(x);
#endif
  return _mm256_and_si256(_mm256_srli_epi16(x, 4), _mm256_set1_epi8(0x0F));
}

/// Fragment registers V and V + 2 (V mod 4 = 0 or 1), whose fields share their stream blocks; E5M2 takes
/// their codes and mantissas together.
template <class F, int V, bool Gfni>
inline void decode_pair(const uint8_t* slot, const Fp8Bases<F>& bases, const EscapePlanes<F, Gfni>& rows, __m256i& x, __m256i& x2) {
  static_assert(V % 4 < 2);
  if constexpr (F::kFormat == ElementFormat::e5m2) {
    const __m256i nibbles = code_mantissa_nibbles<F, V, Gfni>(slot);
    const __m256i low = _mm256_and_si256(nibbles, _mm256_set1_epi8(0x0F));
    x = _mm256_or_si256(sign_mantissa_of<F, V, Gfni>(slot), exponents_of<F, Gfni, V>(low, bases, rows));
    x2 = _mm256_or_si256(sign_mantissa_of<F, V + 2, Gfni>(slot), exponents_of<F, Gfni, V + 2>(high_nibbles<Gfni>(nibbles), bases, rows));
  } else {
    x = decode_register<F, V, Gfni>(slot, bases, rows);
    x2 = decode_register<F, V + 2, Gfni>(slot, bases, rows);
  }
}

template <class F, bool Gfni>
void write_rows(const uint8_t* slot, const Fp8Bases<F>& bases, const EscapePlanes<F, Gfni>& rows, uint8_t* dst, size_t stride) {
  static_for<F::kChunks>([&](auto chunk) {
    constexpr int c = decltype(chunk)::value;
    if constexpr (F::kShape.kind == TensorKind::key) {
      // Segment q (registers 16c + 2q, 2q + 1) is token 8·(c / kHalves) + q, channels 64·(c % kHalves) on;
      // segments 2b and 2b + 1 are decoded together (decode_pair).
      uint8_t* first = dst + static_cast<size_t>(8 * (c / F::kHalves)) * stride + 64 * (c % F::kHalves);
      static_for<4>([&](auto pair) {
        constexpr int b = decltype(pair)::value;
        __m256i x[2], y[2];
        decode_pair<F, 16 * c + 4 * b>(slot, bases, rows, x[0], y[0]);
        decode_pair<F, 16 * c + 4 * b + 1>(slot, bases, rows, x[1], y[1]);
        key_to_rows(x);
        key_to_rows(y);
        uint8_t* row = first + static_cast<size_t>(2 * b) * stride;
        store(row, x[0]);
        store(row + 32, x[1]);
        store(row + stride, y[0]);
        store(row + stride + 32, y[1]);
      });
    } else {
      static_for<2>([&](auto half) {
        constexpr int t1 = decltype(half)::value;
        // Half g2 = 0 is decoded, interleaved and parked; half g2 = 1 meets it in the last round. Four
        // registers live at a time leave room for the decoder's constants (eight would spill them).
        alignas(32) __m256i parked[4];
        __m256i x[4];
        decode_pair<F, 16 * c + t1>(slot, bases, rows, x[0], x[1]);
        decode_pair<F, 16 * c + 4 + t1>(slot, bases, rows, x[2], x[3]);
        value_rounds_12(x);
        for (int j = 0; j < 4; ++j) _mm256_store_si256(&parked[j], x[j]);
        decode_pair<F, 16 * c + 8 + t1>(slot, bases, rows, x[0], x[1]);
        decode_pair<F, 16 * c + 12 + t1>(slot, bases, rows, x[2], x[3]);
        value_rounds_12(x);
#pragma GCC unroll 4
        for (int j = 0; j < 4; ++j) {
          __m256i row_j, row_j4;
          value_round_3(_mm256_load_si256(&parked[j]), x[j], row_j, row_j4);
          store(dst + static_cast<size_t>(value_row(j, t1)) * stride + 32 * c, row_j);
          store(dst + static_cast<size_t>(value_row(j + 4, t1)) * stride + 32 * c, row_j4);
        }
      });
    }
  });
}

/// True when escape bytes [from, capacity) are all zero (capacity a multiple of 16): the 16-byte block holding
/// `from`, its bytes before `from` masked off, then 32-byte blocks and a last 16-byte one. FP8 slots use a few
/// hundred escape bytes of a capacity of several hundred, so starting at `from` skips most of the slot
/// (decode_avx2.hpp's BF16 version scans the whole capacity, which there is small).
inline bool padding_after_is_zero(const uint8_t* escapes, size_t from, size_t capacity) {
  if (from >= capacity) return true;
  const __m128i index = _mm_setr_epi8(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
  size_t block = from / 16 * 16;
  const __m128i keep = _mm_cmpgt_epi8(index, _mm_set1_epi8(static_cast<char>(from - block - 1)));
  const __m128i first = _mm_and_si128(_mm_loadu_si128(reinterpret_cast<const __m128i*>(escapes + block)), keep);
  __m256i any = _mm256_zextsi128_si256(first);
  for (block += 16; block + 32 <= capacity; block += 32) any = _mm256_or_si256(any, load(escapes + block));
  if (block < capacity) any = _mm256_or_si256(any, _mm256_zextsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(escapes + block))));
  return _mm256_testz_si256(any, any) != 0;
}

template <class F, bool Gfni>
DecodeStatus decode(const uint8_t* slot, size_t capacity, const Fp8Bases<F>& bases, uint8_t* dst, size_t stride) {
  constexpr Fp8TileShape shape = F::kFp8Shape;
  const uint8_t* tags = slot + shape.tag_offset();
  const uint8_t* escapes = slot + shape.escape_offset();
  TagRows<F> rows;
  const bool no_invalid_tag = read_tag_rows<F, F::kRawBytes>(tags, capacity, rows);
  if (!no_invalid_tag || rows.used > capacity) return first_tag_problem<F, F::kRawBytes>(tags, capacity);
  if (!padding_after_is_zero(escapes, rows.used, capacity)) return DecodeStatus::nonzero_padding;
  EscapePlanes<F, Gfni> planes;
  if (rows.used != 0) find_escape_planes(tags, escapes, capacity, rows, planes);
  write_rows<F>(slot, bases, rows.used != 0 ? planes : kNoPlanes<F, Gfni>, dst, stride);
  return DecodeStatus::ok;
}

// ----------------------------------------------------------------------------------------------
// Encode

/// Splits FP8 bytes into exponents (in place, at bits M.., as Fp8Bases holds the bases) and sign+mantissa
/// fields.
template <class F>
inline void split(__m256i x, __m256i& exponent, __m256i& sign_mantissa) {
  constexpr int kM = mantissa_bits(F::kFormat);
  const __m256i mantissa = _mm256_and_si256(x, _mm256_set1_epi8((1 << kM) - 1));
  exponent = _mm256_and_si256(x, _mm256_set1_epi8(0x7F & ~((1 << kM) - 1)));
  // The sign moves from bit 7 to bit M (one 16-bit shift right by 7 − M, masked).
  sign_mantissa = _mm256_or_si256(mantissa, _mm256_and_si256(_mm256_srli_epi16(x, 7 - kM), _mm256_set1_epi8(1 << kM)));
}

/// Chooses the modes of the four groups of fragment register v and stores their offsets (fragment
/// order) and modes (group order), as codec_avx2.cpp's classify does for BF16.
/// Everything is shifted left by M: an offset d is d << M, and, exponents being below 2^X with X + M = 7,
/// a negative one is 128 or more, outside every window.
template <class F>
void classify(int v, __m256i exponent, const Fp8Bases<F>& bases, uint8_t* offsets, uint8_t* modes) {
  constexpr int kM = mantissa_bits(F::kFormat);
  const __m256i b2 = bases.narrow(v);
  const __m256i d2 = _mm256_sub_epi8(exponent, b2);
  const __m256i d3 = _mm256_sub_epi8(exponent, bases.wide(v));
  const __m256i offset = choose_modes<F>(v, exponent, d2, d3, _mm256_set1_epi8(3 << kM), _mm256_set1_epi8(7 << kM), modes);
  // Every byte a multiple of 2^M: the 16-bit shift back moves no bit across bytes.
  store(offsets + 32 * v, _mm256_srli_epi16(offset, kM));
}

/// Reads the rows into fragment registers, classifying each, and keeps their sign+mantissa fields.
template <class F>
void read_rows(const uint8_t* src, size_t stride, const Fp8Bases<F>& bases, uint8_t* fields, uint8_t* offsets, uint8_t* modes) {
  const auto take = [&](int v, __m256i x) {
    __m256i exponent, sm;
    split<F>(x, exponent, sm);
    store(fields + 32 * v, sm);
    classify(v, exponent, bases, offsets, modes);
  };
  for (int c = 0; c < F::kChunks; ++c) {
    if constexpr (F::kShape.kind == TensorKind::key) {
      const uint8_t* row = src + static_cast<size_t>(8 * (c / F::kHalves)) * stride + 64 * (c % F::kHalves);
      for (int q = 0; q < 8; ++q, row += stride) {
        __m256i x[2] = {load(row), load(row + 32)};
        key_to_fragment(x);
        take(16 * c + 2 * q, x[0]);
        take(16 * c + 2 * q + 1, x[1]);
      }
    } else {
      for (int t1 = 0; t1 < 2; ++t1) {
        __m256i x[8];
        for (int j = 0; j < 8; ++j) x[j] = load(src + static_cast<size_t>(value_row(j, t1)) * stride + 32 * c);
        value_to_fragment(x);
        for (int j = 0; j < 8; ++j) take(16 * c + 2 * j + t1, x[j]);
      }
    }
  }
}

/// Packs one byte per position (fragment order, low `Bits` bits used) into a `Bits`-bit stream.
template <int Bits, int kRegisters>
void write_stream(const uint8_t* values, uint8_t* stream) {
  constexpr int kPerBlock = 8 / Bits;
  const __m256i mask = _mm256_set1_epi8(static_cast<char>((1 << Bits) - 1));
  for (int block = 0; block < kRegisters / kPerBlock; ++block) {
    __m256i packed = _mm256_setzero_si256();
    for (int r = 0; r < kPerBlock; ++r) {
      const __m256i field = _mm256_and_si256(load(values + 32 * (kPerBlock * block + r)), mask);
      packed = _mm256_or_si256(packed, _mm256_sll_epi16(field, _mm_cvtsi32_si128(Bits * r)));
    }
    store(stream + 32 * block, packed);
  }
}

template <class F>
TileEncoding encode(const uint8_t* src, size_t stride, const Fp8Bases<F>& bases, size_t capacity, uint8_t* slot) {
  constexpr Fp8TileShape shape = F::kFp8Shape;
  alignas(32) uint8_t fields[F::kElements];
  alignas(32) uint8_t offsets[F::kElements];
  alignas(8) uint8_t modes[F::kGroups];
  read_rows(src, stride, bases, fields, offsets, modes);
  if constexpr (F::kFormat == ElementFormat::e4m3) {
    write_stream<4, F::kRegisters>(fields, slot + shape.sign_mantissa_offset());
  } else {
    alignas(32) uint8_t signs[F::kElements];
    for (int v = 0; v < F::kRegisters; ++v) store(signs + 32 * v, _mm256_srli_epi16(load(fields + 32 * v), 2));
    write_stream<1, F::kRegisters>(signs, slot + shape.sign_mantissa_offset());
    write_stream<2, F::kRegisters>(fields, slot + shape.mantissa_offset());
  }
  write_stream<kFp8CodeBits, F::kRegisters>(offsets, slot + shape.code_offset());
  return write_tags_and_escapes<F, kFp8CodeBits>(offsets, modes, capacity, slot + shape.tag_offset(), slot + shape.escape_offset(),
                                                 [](int mode) { return fp8_escape_bytes_for(static_cast<Fp8GroupMode>(mode), F::kFormat); });
}

/// The kernels of one shape; Gfni selects the GFNI escape-plane expansion (a translation unit built
/// with -mgfni only).
template <bool Gfni>
detail::Fp8ShapeKernels make_fp8_kernels(Fp8TileShape shape) {
  return detail::dispatch_fp8_shape(shape, []<ElementFormat Format, TensorKind Kind, int Channels>() {
    using F = Fp8Geometry<Format, Kind, Channels>;
    using Prepared = Fp8Bases<F>;
    static_assert(sizeof(Prepared) <= Fp8TileCodec::kPreparedBytes && alignof(Prepared) <= 64);
    static_assert(std::is_trivially_copyable_v<Prepared> && std::is_trivially_destructible_v<Prepared>);
    return detail::Fp8ShapeKernels{
        [](const Fp8TileBases& bases, uint8_t* prepared) { new (prepared) Prepared(bases); },
        [](const uint8_t* prepared, const uint8_t* src, size_t row_stride, size_t capacity, uint8_t* slot) {
          return encode<F>(src, row_stride, *std::launder(reinterpret_cast<const Prepared*>(prepared)), capacity, slot);
        },
        [](const uint8_t* prepared, const uint8_t* slot, size_t capacity, uint8_t* dst, size_t row_stride) {
          return decode<F, Gfni>(slot, capacity, *std::launder(reinterpret_cast<const Prepared*>(prepared)), dst, row_stride);
        }};
  });
}

}  // namespace
}  // namespace gaac::avx2

#endif  // __AVX2__
