// AVX2 tile codec: exactly the scalar backend's slot bytes, counts, decoded values and statuses
// (codec_scalar.cpp is the oracle; tests/codec/backend_test.cpp compares the two bit for bit).
//
// The slot keeps a tile in fragment order: byte p of the sign+mantissa section is element p, and
// every 8 consecutive fragment positions are one exponent group. So both directions do their
// arithmetic in fragment order, 32 elements per register, and move between fragment order and the
// row-major tile only at one end:
//
//   decode: tags -> validation, escape offsets per row of 16 groups, plane-3 byte per 4-bit group
//           -> one pass per fragment register: code + b3 (+ b4 - b3 and bit 3 for 4-bit groups),
//              compose the two bytes of each BF16 value, permute them to rows (no buffer between)
//           -> scalar patch of the few raw groups (and 4-bit groups after them in their row)
//   encode: rows -> split each BF16 value into its stored byte and exponent, permute to fragment order
//           -> modes and offsets per group -> code words -> scalar pass for tags and escapes
//
// The permutation is a fixed network of shuffles per tensor kind. Each intermediate state is a
// Layout (which bit of an element's fragment index sits at which bit of its byte position), and the
// shuffle controls are derived from those layouts at compile time.
#include "codec/kernels.hpp"
#include "codec/shape_dispatch.hpp"
#include "gaac/tile_codec.hpp"

#if defined(__AVX2__)

#include <immintrin.h>

#include <algorithm>
#include <array>
#include <cstring>
#include <new>
#include <type_traits>

#include "codec/decode_avx2.hpp"
#include "codec/encode_avx2.hpp"

namespace gaac::avx2 {
namespace {

// ----------------------------------------------------------------------------------------------
// Layouts and the shuffle controls of the encoder, derived from them

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

// ----------------------------------------------------------------------------------------------
// Encode helpers

/// Encode: the stored byte of each of 16 BF16 values, in the low byte of its word.
inline __m256i stored_bytes16(__m256i x) {
  return _mm256_or_si256(_mm256_and_si256(x, _mm256_set1_epi16(0x7F)),
                         _mm256_and_si256(_mm256_srli_epi16(x, 8), _mm256_set1_epi16(0x80)));
}

/// Encode: the exponent of each of 16 BF16 values, in the low byte of its word.
inline __m256i exponents16(__m256i x) { return _mm256_and_si256(_mm256_srli_epi16(x, 7), _mm256_set1_epi16(0xFF)); }

// ----------------------------------------------------------------------------------------------
// The permutation networks, one byte stream at a time

/// Key segment, encode side: the two registers of one byte stream (register R holds channels
/// 32R..32R+31 of the segment's token, dword-interleaved) to fragment order.
inline void key_stream_to_fragment(__m256i x[2]) {
  const __m256 low = _mm256_castsi256_ps(x[0]), high = _mm256_castsi256_ps(x[1]);
  x[0] = _mm256_castps_si256(_mm256_shuffle_ps(low, high, 0x88));  // dwords 0, 2 of each
  x[1] = _mm256_castps_si256(_mm256_shuffle_ps(low, high, 0xDD));  // dwords 1, 3 of each
  const __m256i step3 = load(kKeyToFragment3), step2 = load(kKeyToFragment2), step1 = load(kKeyToFragment1);
  for (int r = 0; r < 2; ++r) {
    x[r] = _mm256_shuffle_epi8(_mm256_permutevar8x32_epi32(_mm256_shuffle_epi8(x[r], step3), step2), step1);
  }
}

/// Value half-chunk, encode side: from rows (see value_row / value_column) to the 8 fragment
/// registers of one byte stream.
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
// Code words (encode side; codec/decode_avx2.hpp reads them)

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

/// Composes the elements of chunk c = 2o + kOdd of fragment order from their stored bytes and
/// exponents and writes them to their rows. Both kinds interleave the low and high bytes into
/// 16-bit words first (key_segment_words, value_half_chunk_words), then permute words (half as many
/// registers as permuting each byte stream).
/// Keys: a segment (64 bytes: one token, 64 channels) is two registers; after the interleave the
/// word offset is [s0 b1 b0] and the lane t0 (element: channel 16s + 8b0 + 4t1 + 2t0 + b1); one qword
/// interleave of the two registers brings t1 in for s0, a vpshufb and a vpermd make [t0 t1 b1] with
/// b0 as the lane: 16 consecutive channels per register.
/// Values: eight registers per t1 (value_words_to_rows).
template <class G, int kOdd>
void write_chunk(const uint8_t* stored, const Exponents<G>& exponents, int o, uint16_t* dst, size_t stride) {
  const int c = 2 * o + kOdd;
  if constexpr (G::kShape.kind == TensorKind::key) {
    // Key segment 8c + q (registers p = 2q, 2q + 1) is token row 8·(c / kHalves) + q, channels
    // 64·(c % kHalves) on.
    uint16_t* row = dst + static_cast<size_t>(8 * (c / G::kHalves)) * stride + 64 * (c % G::kHalves);
#pragma GCC unroll 1
    for (int q = 0; q < 8; ++q, row += stride) {
      // Words [t1][s1] of the segment; inside each: word offset [s0 b1 b0], lane t0.
      __m256i words[2][2];
      key_segment_words<G, kOdd>(stored, exponents, o, q, words);
      const __m256i swap01 = load(kSwapWordBits01), lane_b0 = load(kSwapDwordBit0AndLane);
#pragma GCC unroll 2
      for (int s1 = 0; s1 < 2; ++s1) {
        // t1 into the word offset, s0 out: [t1 b1 b0]; then [t0 t1 b1] with b0 as the lane: 16 channels.
        const __m256i s0_low = _mm256_unpacklo_epi64(words[0][s1], words[1][s1]);
        const __m256i s0_high = _mm256_unpackhi_epi64(words[0][s1], words[1][s1]);
        store(row + 32 * s1, _mm256_permutevar8x32_epi32(_mm256_shuffle_epi8(s0_low, swap01), lane_b0));
        store(row + 32 * s1 + 16, _mm256_permutevar8x32_epi32(_mm256_shuffle_epi8(s0_high, swap01), lane_b0));
      }
    }
  } else {
#pragma GCC unroll 1
    for (int t1 = 0; t1 < 2; ++t1) {
      // Words of the 8 registers j = g: offset [t0 b1 b0], lane jj0; jj1 = 0 kept, jj1 = 1 parked.
      __m256i words[8];
      alignas(32) __m256i parked[8];
      value_half_chunk_words<G, kOdd>(stored, exponents, o, t1, words, parked);
#pragma GCC unroll 2
      for (int jj1 = 0; jj1 < 2; ++jj1) {
        if (jj1 == 1) {
#pragma GCC unroll 8
          for (int j = 0; j < 8; ++j) words[j] = parked[j];
        }
        value_words_to_rows(words);
#pragma GCC unroll 8
        for (int j = 0; j < 8; ++j) store(dst + value_word_row(j, t1) * stride + 32 * c + 16 * jj1, words[j]);
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

template <class G>
void store_group(__m128i values, int lane, int pair, uint16_t* dst, size_t stride) {
  const int g = lane / 4, t = lane % 4;  // lane 4g + t
  if constexpr (G::kShape.kind == TensorKind::key) {
    // Token 8h + g, channels 16s + 2t + {0, 8, 1, 9} and 16 more for the second quad: elements
    // (0, 2), (1, 3), (4, 6), (5, 7) are adjacent channels.
    constexpr int kSteps = G::kShape.channels / 16;
    const int h = 2 * pair / kSteps, s = 2 * pair % kSteps;
    uint16_t* row = dst + static_cast<size_t>(8 * h + g) * stride + 16 * s + 2 * t;
    const __m128i pairs = _mm_shuffle_epi8(values, _mm_setr_epi8(0, 1, 4, 5, 2, 3, 6, 7, 8, 9, 12, 13, 10, 11, 14, 15));
    const int words[4] = {_mm_cvtsi128_si32(pairs), _mm_extract_epi32(pairs, 1), _mm_extract_epi32(pairs, 2),
                          _mm_extract_epi32(pairs, 3)};
    for (int i = 0; i < 4; ++i) std::memcpy(row + 8 * i, &words[i], sizeof words[i]);
  } else {
    // Channels 16·pair + g (elements 0..3) and 8 more (4..7), tokens 2t + {0, 8, 1, 9}.
    constexpr int kTokens[4] = {0, 8, 1, 9};
    uint16_t* column = dst + 16 * pair + g;
    const auto first = static_cast<uint64_t>(_mm_cvtsi128_si64(values));
    const auto second = static_cast<uint64_t>(_mm_extract_epi64(values, 1));
    for (int b = 0; b < 4; ++b) {
      uint16_t* element = column + static_cast<size_t>(2 * t + kTokens[b]) * stride;
      element[0] = static_cast<uint16_t>(first >> (16 * b));
      element[8] = static_cast<uint16_t>(second >> (16 * b));
    }
  }
}

/// Rewrites the groups the vector pass got wrong: the raw groups (it took them for 3-bit) and the
/// 4-bit groups after a raw group in the same row (it gave them the escape byte they would have if
/// the raw group had none). About one raw group per tile, so scalar code, one group (eight bytes) at
/// a time, after the vector pass (its data-dependent branches would stall the pass if earlier).

/// Rewrites the groups the vector pass got wrong (for_each_escaped_group), after it: its
/// data-dependent branches would stall the pass if earlier.
template <class G>
void patch_escaped_groups(const uint8_t* slot, const uint8_t* escapes, const DecodeBases<G>& bases, const TagRows<G>& rows,
                          uint16_t* dst, size_t stride) {
  for_each_escaped_group(slot, escapes, bases, rows, [&](int at, int lane, int pair, uint64_t exponents) {
    __m128i lo, hi;  // the group's stored bytes are fragment bytes at..at + 7
    compose(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(slot + at)), _mm_cvtsi64_si128(static_cast<long long>(exponents)), lo, hi);
    store_group<G>(_mm_unpacklo_epi8(lo, hi), lane, pair, dst, stride);
  });
}

template <class G>
DecodeStatus decode(const uint8_t* slot, const uint8_t* escapes, size_t capacity, const DecodeBases<G>& decode_bases,
                    uint16_t* dst, size_t stride) {
  const uint8_t* tags = slot + G::kShape.tag_offset();
  TagRows<G> rows;
  const DecodeStatus status = scan_tags(tags, escapes, capacity, rows);
  if (status != DecodeStatus::ok) return status;

  EscapeRows<G> escape_rows;
  if (rows.used != 0) find_escape_rows(tags, escapes, rows, escape_rows);
  const Exponents<G> exponents(slot + G::kShape.code_offset(), decode_bases, rows.used != 0 ? escape_rows : kNoEscapes<G>);
  write_rows<G>(slot, exponents, dst, stride);
  patch_escaped_groups(slot, escapes, decode_bases, rows, dst, stride);
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
  store(offsets + 32 * v, choose_modes<G>(v, exponent, d3, d4, _mm256_set1_epi8(7), _mm256_set1_epi8(15), modes));
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

template <class G>
TileEncoding encode(const uint16_t* src, size_t stride, const FragmentBases<G>& fragment_bases, size_t capacity, uint8_t* slot,
                    uint8_t* escapes) {
  alignas(32) uint8_t offsets[G::kElements];
  alignas(8) uint8_t modes[G::kGroups];
  read_rows(src, stride, fragment_bases, slot, offsets, modes);
  write_code_words<G>(offsets, slot + G::kShape.code_offset());
  // Offsets hold 3 bits in the code words; plane k is bit 3 + k (raw groups: of every exponent).
  return write_tags_and_escapes<G, 3>(offsets, modes, capacity, slot + G::kShape.tag_offset(), escapes,
                                      [](int mode) { return escape_bytes_for(static_cast<GroupMode>(mode)); });
}

/// The prepared bases of a tile shape: the decoder's and the encoder's forms, side by side.
}  // namespace

bool compiled() { return true; }

detail::ShapeKernels kernels(TileShape shape) {
  return detail::dispatch_shape(shape, []<TensorKind Kind, int Channels>() {
    using G = Geometry<Kind, Channels>;
    using Prepared = PreparedBases<G>;
    static_assert(sizeof(Prepared) <= TileCodec::kPreparedBytes && alignof(Prepared) <= 64);
    static_assert(std::is_trivially_copyable_v<Prepared> && std::is_trivially_destructible_v<Prepared>);
    return detail::ShapeKernels{
        [](const TileBases& bases, uint8_t* prepared) { new (prepared) Prepared(bases); },
        [](const uint8_t* prepared, const uint16_t* src, size_t row_stride, size_t capacity, uint8_t* slot,
           uint8_t* escapes) {
          return encode<G>(src, row_stride, std::launder(reinterpret_cast<const Prepared*>(prepared))->encode, capacity,
                           slot, escapes);
        },
        [](const uint8_t* prepared, const uint8_t* slot, const uint8_t* escapes, size_t capacity, uint16_t* dst,
           size_t row_stride) {
          return decode<G>(slot, escapes, capacity, std::launder(reinterpret_cast<const Prepared*>(prepared))->decode, dst,
                           row_stride);
        }};
  });
}

}  // namespace gaac::avx2

#else  // !__AVX2__: no AVX2 path in this build; dispatch never selects it.

namespace gaac::avx2 {
bool compiled() { return false; }
detail::ShapeKernels kernels(TileShape shape) { return scalar::kernels(shape); }
}  // namespace gaac::avx2

#endif