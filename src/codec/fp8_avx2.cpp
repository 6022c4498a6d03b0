// AVX2 FP8 tile codec: exactly the scalar FP8 backend's slot bytes, counts, decoded bytes and statuses
// (fp8_scalar.cpp is the oracle; tests/codec/fp8_backend_test.cpp compares the two bit for bit).
//
// A 32-byte register holds 32 consecutive fragment positions (four groups), and every FP8 stream gives
// them with one load, a shift and a mask (docs/format.md, section 14.4). Decoding works in fragment order
// and permutes bytes to rows only at the end:
//
//   tags -> validation, escape offsets per row of 16 groups, plane-2 byte per 3-bit group (the BF16
//           decoder's parts, codec/decode_avx2.hpp, with X − 2 escape bytes per raw group)
//   one pass per register: 2-bit code + b2 (+ b3 − b2 and bit 2 for 3-bit groups), compose the FP8
//           byte with its sign and mantissa, permute to rows (keys: one qword interleave, a vpermd and
//           a vpshufb per register; values: a vpshufb, three interleave rounds and a lane swap)
//   scalar patch of the few raw groups (and the 3-bit groups after them in their row)
//
// Encoding reads rows, permutes them to fragment order with the inverse networks, classifies each group
// with vector compares and writes the streams; tags and escapes are written per group, as BF16's are.
#include "codec/fp8_kernels.hpp"

#if defined(__AVX2__)

#include <immintrin.h>

#include <array>
#include <cstring>
#include <new>
#include <type_traits>

#include "codec/decode_avx2.hpp"

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
/// the byte, word and dword interleaves on g0, g1, g2 leave [t0 | cc0 g2 g1 g0] (see value_to_rows).
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
/// the register number, on g1 b1, on g2 cc1; the lane swap trades cc1 for t0.
inline void value_to_rows(__m256i x[8]) {
  const __m256i bytes = load(kValueBytes);
#pragma GCC unroll 8
  for (int j = 0; j < 8; ++j) x[j] = _mm256_shuffle_epi8(x[j], bytes);
#pragma GCC unroll 4
  for (int j = 0; j < 8; j += 2) {
    const __m256i a = x[j], b = x[j + 1];
    x[j] = _mm256_unpacklo_epi8(a, b);
    x[j + 1] = _mm256_unpackhi_epi8(a, b);
  }
#pragma GCC unroll 4
  for (int j = 0; j < 8; ++j) {
    if (j & 2) continue;
    const __m256i a = x[j], b = x[j + 2];
    x[j] = _mm256_unpacklo_epi16(a, b);
    x[j + 2] = _mm256_unpackhi_epi16(a, b);
  }
#pragma GCC unroll 4
  for (int j = 0; j < 4; ++j) {
    const __m256i a = x[j], b = x[j + 4];
    const __m256i lo = _mm256_unpacklo_epi32(a, b), hi = _mm256_unpackhi_epi32(a, b);
    x[j] = _mm256_permute2x128_si256(lo, hi, 0x20);
    x[j + 4] = _mm256_permute2x128_si256(lo, hi, 0x31);
  }
}

/// Token row of register j after value_to_rows: [b0 t1 t0 b1] with j = [t0 b1 b0].
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

/// The bases of every fragment register: the narrow window's (b2) and the step b3 − b2 (modulo 256).
/// Keys repeat per token (patterns 2h + t1, codec/decode_avx2.hpp's key_base_patterns); values per
/// (chunk, g).
template <class F>
class Fp8Bases {
 public:
  explicit Fp8Bases(const Fp8TileBases& bases) {
    if constexpr (F::kShape.kind == TensorKind::key) {
      for (int h = 0; h < F::kHalves; ++h) {
        __m256i b2[2], b3[2];
        key_base_patterns(bases.b2.data() + 64 * h, b2);
        key_base_patterns(bases.b3.data() + 64 * h, b3);
        for (int i = 0; i < 2; ++i) {
          store(narrow_[2 * h + i], b2[i]);
          store(step_[2 * h + i], _mm256_sub_epi8(b3[i], b2[i]));
        }
      }
    } else {
      for (int c = 0; c < F::kChunks; ++c) {
        __m256i d2[2], d3[2];
        value_base_dwords(bases.b2.data() + 32 * c, d2);
        value_base_dwords(bases.b3.data() + 32 * c, d3);
        for (int g = 0; g < 8; ++g) {
          const __m256i spread = load(kSpreadDword[static_cast<size_t>(g % 4)]);
          const __m256i b2 = _mm256_shuffle_epi8(d2[g / 4], spread);
          store(narrow_[8 * c + g], b2);
          store(step_[8 * c + g], _mm256_sub_epi8(_mm256_shuffle_epi8(d3[g / 4], spread), b2));
        }
      }
    }
  }
  __m256i narrow(int v) const { return load(narrow_[pattern(v)]); }
  __m256i step(int v) const { return load(step_[pattern(v)]); }
  uint64_t narrow_group(int at) const { return load_u64(narrow_[pattern(at / 32)] + at % 32); }
  uint64_t step_group(int at) const { return load_u64(step_[pattern(at / 32)] + at % 32); }

 private:
  static constexpr int kPatterns = F::kShape.kind == TensorKind::key ? 2 * F::kHalves : 8 * F::kChunks;
  static constexpr int pattern(int v) {
    const auto u = static_cast<unsigned>(v);
    if constexpr (F::kShape.kind == TensorKind::key) return static_cast<int>(u / 16 % F::kHalves * 2 + u % 2);
    return static_cast<int>(u / 16 * 8 + u % 16 / 2);
  }
  alignas(32) uint8_t narrow_[kPatterns][32];
  alignas(32) uint8_t step_[kPatterns][32];
};

// ----------------------------------------------------------------------------------------------
// Streams

/// The `Bits`-bit fields of fragment register v (positions 32v .. 32v+31), one per byte.
template <int Bits>
inline __m256i read_fields(const uint8_t* stream, int v) {
  constexpr int kPerBlock = 8 / Bits;
  const __m256i block = load(stream + 32 * (v / kPerBlock));
  const __m256i shifted = _mm256_srl_epi16(block, _mm_cvtsi32_si128(Bits * (v % kPerBlock)));
  return _mm256_and_si256(shifted, _mm256_set1_epi8(static_cast<char>((1 << Bits) - 1)));
}

/// The 8 fields of one group (fragment positions at .. at+7, at a multiple of 8), one per byte.
template <int Bits>
inline uint64_t group_fields(const uint8_t* stream, int at) {
  const StreamField f = stream_field(Bits, at);
  return load_u64(stream + f.byte) >> f.shift & (kByteBit0 * ((1u << Bits) - 1));
}

/// FP8 bytes from the exponents (valid where they fit the format) and the stored fields of register v.
template <class F>
inline __m256i compose_fp8(const uint8_t* slot, int v, __m256i exponent) {
  constexpr Fp8TileShape shape = F::kFp8Shape;
  if constexpr (F::kFormat == ElementFormat::e4m3) {
    const __m256i sm = read_fields<4>(slot + shape.sign_mantissa_offset(), v);
    const __m256i sign = _mm256_and_si256(_mm256_slli_epi16(sm, 4), _mm256_set1_epi8(static_cast<char>(0x80)));
    const __m256i mantissa = _mm256_and_si256(sm, _mm256_set1_epi8(7));
    const __m256i e = _mm256_and_si256(_mm256_slli_epi16(exponent, 3), _mm256_set1_epi8(0x78));
    return _mm256_or_si256(_mm256_or_si256(sign, mantissa), e);
  } else {
    const __m256i signs = load(slot + shape.sign_mantissa_offset() + 32 * (v / 8));
    const __m256i sign = _mm256_and_si256(_mm256_sll_epi16(signs, _mm_cvtsi32_si128(7 - v % 8)), _mm256_set1_epi8(static_cast<char>(0x80)));
    const __m256i mantissa = read_fields<2>(slot + shape.mantissa_offset(), v);
    const __m256i e = _mm256_and_si256(_mm256_slli_epi16(exponent, 2), _mm256_set1_epi8(0x7C));
    return _mm256_or_si256(_mm256_or_si256(sign, mantissa), e);
  }
}

/// The same for one group's eight bytes (exponents in bytes, each inside the format's range).
template <class F>
inline uint64_t compose_group(const uint8_t* slot, int at, uint64_t exponents) {
  constexpr Fp8TileShape shape = F::kFp8Shape;
  if constexpr (F::kFormat == ElementFormat::e4m3) {
    const uint64_t sm = group_fields<4>(slot + shape.sign_mantissa_offset(), at);
    return (sm & kByteBit0 * 7) | (sm & kByteBit0 * 8) << 4 | exponents << 3;
  } else {
    const uint64_t sign = group_fields<1>(slot + shape.sign_mantissa_offset(), at);
    return sign << 7 | group_fields<2>(slot + shape.mantissa_offset(), at) | exponents << 2;
  }
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

/// The exponents of fragment register v: 2-bit code plus b2, plus for 3-bit groups b3 − b2 and bit 2
/// of the offset (from `EscapeRows`, whose "4-bit" entries are this format's tag-1 groups). Raw groups
/// come out wrong; patch_escaped_groups rewrites them.
template <class F>
inline __m256i exponents_of(const uint8_t* slot, const Fp8Bases<F>& bases, const EscapeRows<F>& rows, int v) {
  const __m256i code = read_fields<kFp8CodeBits>(slot + F::kFp8Shape.code_offset(), v);
  const __m256i exponent = _mm256_add_epi8(code, bases.narrow(v));
  const auto p = static_cast<unsigned>(v % 16), c = static_cast<unsigned>(v / 16);
  const unsigned row = 2 * p * F::kGroupsPerLane / 16;
  const __m256i pick = load(kFp8GroupPick<F>[2 * c + p % 2]);
  const auto broadcast = [](const uint8_t* r) { return _mm256_broadcastsi128_si256(_mm_load_si128(reinterpret_cast<const __m128i*>(r))); };
  const __m256i plane2 = _mm256_shuffle_epi8(broadcast(rows.plane3[row]), pick);
  const __m256i is3 = _mm256_shuffle_epi8(broadcast(rows.is4[row]), pick);
  const __m256i bit = load(kFp8ElementBit);
  const __m256i bit2 = _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(plane2, bit), bit), _mm256_set1_epi8(4));
  return _mm256_add_epi8(_mm256_add_epi8(exponent, _mm256_and_si256(is3, bases.step(v))), bit2);
}

template <class F>
inline __m256i decode_register(const uint8_t* slot, const Fp8Bases<F>& bases, const EscapeRows<F>& rows, int v) {
  return compose_fp8<F>(slot, v, exponents_of(slot, bases, rows, v));
}

template <class F>
void write_rows(const uint8_t* slot, const Fp8Bases<F>& bases, const EscapeRows<F>& rows, uint8_t* dst, size_t stride) {
  for (int c = 0; c < F::kChunks; ++c) {
    if constexpr (F::kShape.kind == TensorKind::key) {
      // Segment q (registers 16c + 2q, 2q + 1) is token 8·(c / kHalves) + q, channels 64·(c % kHalves) on.
      uint8_t* row = dst + static_cast<size_t>(8 * (c / F::kHalves)) * stride + 64 * (c % F::kHalves);
#pragma GCC unroll 2
      for (int q = 0; q < 8; ++q, row += stride) {
        __m256i x[2] = {decode_register(slot, bases, rows, 16 * c + 2 * q), decode_register(slot, bases, rows, 16 * c + 2 * q + 1)};
        key_to_rows(x);
        store(row, x[0]);
        store(row + 32, x[1]);
      }
    } else {
#pragma GCC unroll 1
      for (int t1 = 0; t1 < 2; ++t1) {
        __m256i x[8];
#pragma GCC unroll 8
        for (int j = 0; j < 8; ++j) x[j] = decode_register(slot, bases, rows, 16 * c + 2 * j + t1);
        value_to_rows(x);
#pragma GCC unroll 8
        for (int j = 0; j < 8; ++j) store(dst + static_cast<size_t>(value_row(j, t1)) * stride + 32 * c, x[j]);
      }
    }
  }
}

/// Writes the eight FP8 bytes of group (lane, pair), byte i for element i, to the rows.
template <class F>
void store_group(uint64_t values, int lane, int pair, uint8_t* dst, size_t stride) {
  const int g = lane / 4, t = lane % 4;
  const auto byte = [&](int i) { return static_cast<uint8_t>(values >> (8 * i)); };
  if constexpr (F::kShape.kind == TensorKind::key) {
    // Token 8h + g, channels 16s + 2t + {0, 8, 1, 9} and 16 more for the second quad.
    constexpr int kSteps = F::kShape.channels / 16;
    const int h = 2 * pair / kSteps, s = 2 * pair % kSteps;
    uint8_t* row = dst + static_cast<size_t>(8 * h + g) * stride + 16 * s + 2 * t;
    constexpr int kChannel[4] = {0, 8, 1, 9};
    for (int i = 0; i < kGroupSize; ++i) row[16 * (i / 4) + kChannel[i % 4]] = byte(i);
  } else {
    // Channels 16·pair + g (elements 0..3) and 8 more (4..7), tokens 2t + {0, 8, 1, 9}.
    constexpr int kToken[4] = {0, 8, 1, 9};
    uint8_t* column = dst + 16 * pair + g;
    for (int i = 0; i < kGroupSize; ++i) column[static_cast<size_t>(2 * t + kToken[i % 4]) * stride + 8 * (i / 4)] = byte(i);
  }
}

/// Rewrites the groups the vector pass got wrong: the raw groups (it took them for 2-bit) and the
/// 3-bit groups after a raw group in the same row (it gave them the escape byte they would have if the
/// raw group had none). About one raw group in ten, so scalar code, one group at a time.
template <class F>
void patch_escaped_groups(const uint8_t* slot, const Fp8Bases<F>& bases, const TagRows<F>& rows, uint8_t* dst, size_t stride) {
  constexpr Fp8TileShape shape = F::kFp8Shape;
  const uint8_t* tags = slot + shape.tag_offset();
  const uint8_t* escapes = slot + shape.escape_offset();
  for (uint32_t pending = rows.raw_rows; pending != 0; pending &= pending - 1) {
    const int r = __builtin_ctz(pending);
    uint32_t word;
    std::memcpy(&word, tags + 4 * r, sizeof word);
    const int first = __builtin_ctz(word & 0xAAAAAAAAu) / 2;  // the row's first raw group
    const uint32_t earlier = word & ((1u << (2 * first)) - 1);
    const uint8_t* next = escapes + rows.start[r] + __builtin_popcount(earlier & 0x55555555u);
    for (uint32_t groups = (word | word >> 1) & (0x55555555u << (2 * first)); groups != 0; groups &= groups - 1) {
      const int i = __builtin_ctz(groups) / 2;
      const bool raw = (word >> (2 * i) & 3u) == static_cast<unsigned>(Fp8GroupMode::raw);
      const int g = 16 * r + i, lane = g / F::kGroupsPerLane, pair = g % F::kGroupsPerLane, at = F::group_offset(g);
      const uint64_t codes = group_fields<kFp8CodeBits>(slot + shape.code_offset(), at);
      uint64_t exponents;
      if (raw) {
        uint64_t high = 0;
        for (int k = 0; k < F::kRawBytes; ++k) high |= _pdep_u64(next[k], kByteBit0) << (kFp8CodeBits + k);
        exponents = codes | high;
        next += F::kRawBytes;
      } else {
        exponents = add_bytes(add_bytes(bases.narrow_group(at), bases.step_group(at)), codes | _pdep_u64(*next, kByteBit0) << 2);
        next += 1;
      }
      store_group<F>(compose_group<F>(slot, at, exponents), lane, pair, dst, stride);
    }
  }
}

template <class F>
DecodeStatus decode(const uint8_t* slot, size_t capacity, const Fp8Bases<F>& bases, uint8_t* dst, size_t stride) {
  constexpr Fp8TileShape shape = F::kFp8Shape;
  const uint8_t* tags = slot + shape.tag_offset();
  const uint8_t* escapes = slot + shape.escape_offset();
  TagRows<F> rows;
  const DecodeStatus status = scan_tags<F, F::kRawBytes>(tags, escapes, capacity, rows);
  if (status != DecodeStatus::ok) return status;
  EscapeRows<F> escape_rows;
  if (rows.used != 0) find_escape_rows(tags, escapes, rows, escape_rows);
  write_rows<F>(slot, bases, rows.used != 0 ? escape_rows : kNoEscapes<F>, dst, stride);
  patch_escaped_groups(slot, bases, rows, dst, stride);
  return DecodeStatus::ok;
}

// ----------------------------------------------------------------------------------------------
// Encode

/// Splits FP8 bytes into exponents and sign+mantissa fields.
template <class F>
inline void split(__m256i x, __m256i& exponent, __m256i& sign_mantissa) {
  constexpr int kM = mantissa_bits(F::kFormat);
  const __m256i mantissa = _mm256_and_si256(x, _mm256_set1_epi8((1 << kM) - 1));
  exponent = _mm256_and_si256(_mm256_srli_epi16(x, kM), _mm256_set1_epi8(static_cast<char>((1 << exponent_bits(F::kFormat)) - 1)));
  // The sign moves from bit 7 to bit M (one 16-bit shift right by 7 − M, masked).
  sign_mantissa = _mm256_or_si256(mantissa, _mm256_and_si256(_mm256_srli_epi16(x, 7 - kM), _mm256_set1_epi8(1 << kM)));
}

/// Chooses the modes of the four groups of fragment register v and stores their offsets (fragment
/// order) and modes (group order), as codec_avx2.cpp's classify does for BF16.
template <class F>
void classify(int v, __m256i exponent, const Fp8Bases<F>& bases, uint8_t* offsets, uint8_t* modes) {
  const __m256i b2 = bases.narrow(v);
  const __m256i d2 = _mm256_sub_epi8(exponent, b2);
  const __m256i d3 = _mm256_sub_epi8(d2, bases.step(v));
  const __m256i in2 = _mm256_cmpeq_epi8(_mm256_min_epu8(d2, _mm256_set1_epi8(3)), d2);
  const __m256i in3 = _mm256_cmpeq_epi8(_mm256_min_epu8(d3, _mm256_set1_epi8(7)), d3);
  const __m256i ones = _mm256_set1_epi8(-1);
  const __m256i group2 = _mm256_cmpeq_epi64(in2, ones), group3 = _mm256_cmpeq_epi64(in3, ones);
  store(offsets + 32 * v, _mm256_blendv_epi8(_mm256_blendv_epi8(exponent, d3, group3), d2, group2));
  const auto not2 = ~static_cast<unsigned>(_mm256_movemask_pd(_mm256_castsi256_pd(group2))) & 15u;
  const auto raw = not2 & ~static_cast<unsigned>(_mm256_movemask_pd(_mm256_castsi256_pd(group3)));
  const uint32_t mode_bytes = _pdep_u32(not2, 0x01010101u) + _pdep_u32(raw, 0x01010101u);  // 0, 1 or 2 per group
  const int lane = 2 * (v % 16), k = 2 * (v / 16);
  store_u16(modes + lane * F::kGroupsPerLane + k, static_cast<uint16_t>(mode_bytes));
  store_u16(modes + (lane + 1) * F::kGroupsPerLane + k, static_cast<uint16_t>(mode_bytes >> 16));
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

/// Writes the tags of every group and the escapes of the 3-bit and raw groups, in group order.
template <class F>
TileEncoding write_tags_and_escapes(const uint8_t* offsets, const uint8_t* modes, size_t capacity, uint8_t* tags, uint8_t* escapes) {
  TileEncoding result;
  size_t used = 0;
  for (int g0 = 0; g0 < F::kGroups; g0 += 8) {
    const uint64_t eight = load_u64(modes + g0);
    store_u16(tags + g0 / 4, static_cast<uint16_t>(_pext_u64(eight, 0x0303030303030303ull)));
    for (uint64_t pending = eight; pending != 0; pending &= ~(0xFFull << (__builtin_ctzll(pending) & ~7))) {
      const int i = __builtin_ctzll(pending) / 8;
      const int mode = modes[g0 + i];
      ++result.groups_by_mode[mode];
      // Plane k holds bit 2 + k of every offset (raw groups: of every exponent).
      const uint64_t offset = load_u64(offsets + F::group_offset(g0 + i));
      const int planes = fp8_escape_bytes_for(static_cast<Fp8GroupMode>(mode), F::kFormat);
      for (int k = 0; k < planes; ++k, ++used) {
        if (used < capacity) escapes[used] = static_cast<uint8_t>(_pext_u64(offset, 0x0404040404040404ull << k));
      }
    }
  }
  if (used < capacity) std::memset(escapes + used, 0, capacity - used);
  result.groups_by_mode[0] = F::kGroups - result.groups_by_mode[1] - result.groups_by_mode[2];
  result.escape_bytes = static_cast<uint32_t>(used);
  result.fits = used <= capacity;
  return result;
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
  return write_tags_and_escapes<F>(offsets, modes, capacity, slot + shape.tag_offset(), slot + shape.escape_offset());
}

}  // namespace

detail::Fp8ShapeKernels fp8_kernels(Fp8TileShape shape) {
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
          return decode<F>(slot, capacity, *std::launder(reinterpret_cast<const Prepared*>(prepared)), dst, row_stride);
        }};
  });
}

}  // namespace gaac::avx2

#else  // !__AVX2__: no AVX2 path in this build; dispatch never selects it.

namespace gaac::avx2 {
detail::Fp8ShapeKernels fp8_kernels(Fp8TileShape shape) { return scalar::fp8_kernels(shape); }
}  // namespace gaac::avx2

#endif
