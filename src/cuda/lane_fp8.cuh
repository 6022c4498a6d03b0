// Per-lane reconstruction of a GAAC-FP8 slot (docs/format.md, section 14) and the widening of FP8 codes
// to the BF16 operands of mma.m16n8k16 (section 13, "Attention over FP8 caches"), shared by every FP8
// tile source of the decode kernel. Pure integer code on 32-bit words, like lane_decode.cuh: it compiles
// for the device and for the host, where tests run the 32 lanes one after another against the
// reference codec.
//
// A lane rebuilds a slot group by group (fp8_decode_groups): its codes and sign+mantissa fields from one
// 16-byte load per stream and chunk, the group's base picked from the b2 and b3 words by one PRMT, its
// escape planes read whatever the mode and kept by a 0/1 factor, planes 2 and 3 spread to their bytes by
// one lookup in a 256-entry table (spread_entry): no predicated loads and no selects.
//
// A quad's four codes travel as two words (Fp8Quad): the 7-bit magnitude `e << M | m` of each code in
// its byte, and its sign at bit M of the byte. Widening places both in a BF16 word with one PRMT and a
// shift per register (the magnitude's exponent field lands in the low bits of BF16's, its mantissa at
// the top of BF16's) and multiplies the pair by 2^(127 − bias): exact for every finite code, subnormals
// and zeros included. NaN codes (and E5M2's infinities) would come out finite, so a tile holding one
// is widened through the table of exact values instead (widen_exact); CacheMemory marks those tiles.
#pragma once

#include <cstdint>

#include "cuda/lane_decode.cuh"
#include "gaac/fp8_format.hpp"

namespace gaac::cuda::lane {

/// Four FP8 codes of a quad (byte b: code b, in the quad's byte order): `magnitude` holds each code's
/// low seven bits (`e << M | m`), `sign` its sign at bit M of the byte.
struct Fp8Quad {
  uint32_t magnitude;
  uint32_t sign;
};

/// Constants of an FP8 element format as the widening uses them.
template <ElementFormat F>
struct Fp8Element {
  static_assert(F == ElementFormat::e4m3 || F == ElementFormat::e5m2, "an FP8 format");
  static constexpr int kM = mantissa_bits(F);
  static constexpr int kX = exponent_bits(F);
  /// Left shift that moves a magnitude from a BF16 half's low byte to bits 7 − M .. 13 − M.
  static constexpr int kShift = 7 - kM;
  /// 2^(127 − bias) in BF16 (exponent field 127 + 127 − bias), twice: the factor from the placed bits to
  /// the code's value.
  static constexpr uint32_t kScale = (254u - ((1u << (kX - 1)) - 1u)) << 7;
  static constexpr uint32_t kScalePair = kScale | kScale << 16;
  /// Per byte: the bits whose all being set marks a NaN (E4M3: the seven below the sign) or a NaN or
  /// infinity (E5M2: the exponent), and the value that carries into bit 7 exactly then.
  static constexpr uint32_t kSpecialMask = F == ElementFormat::e4m3 ? 0x7F7F7F7Fu : 0x7C7C7C7Cu;
  static constexpr uint32_t kSpecialCarry = F == ElementFormat::e4m3 ? 0x01010101u : 0x04040404u;
};

/// The quad of four FP8 codes (byte b of `codes`: code b).
template <ElementFormat F>
GAAC_LANE_INLINE Fp8Quad fp8_quad(uint32_t codes) {
  constexpr int m = Fp8Element<F>::kM;
  return {codes & 0x7F7F7F7Fu, (codes >> (7 - m)) & (0x01010101u << m)};
}

/// The four codes of a quad again (byte b: code b).
template <ElementFormat F>
GAAC_LANE_INLINE uint32_t fp8_codes(Fp8Quad q) {
  return q.magnitude | q.sign << (7 - Fp8Element<F>::kM);
}

/// Nonzero when one of the four codes is a NaN (E4M3), or a NaN or an infinity (E5M2): bit 7 of its
/// byte is set.
template <ElementFormat F>
GAAC_LANE_INLINE uint32_t fp8_special_codes(uint32_t codes) {
  using E = Fp8Element<F>;
  return ((codes & E::kSpecialMask) + E::kSpecialCarry) & 0x80808080u;
}

/// The BF16 pair a · b of two bf16x2 words, rounded to nearest (exact here: b is a power of two and
/// every product a BF16 value).
GAAC_LANE_INLINE uint32_t bf16x2_scale(uint32_t a, uint32_t b) {
#if defined(__CUDA_ARCH__)
  uint32_t d;
  // −0 as the addend keeps the sign of zero products.
  asm("fma.rn.bf16x2 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(0x80008000u));
  return d;
#else
  const auto half = [](uint32_t x, uint32_t y) {
    float fx, fy;
    const uint32_t bx = (x & 0xFFFFu) << 16, by = (y & 0xFFFFu) << 16;
    std::memcpy(&fx, &bx, 4);
    std::memcpy(&fy, &by, 4);
    const float p = fx * fy;  // exact: a power of two times a BF16 value that stays normal or zero
    uint32_t bp;
    std::memcpy(&bp, &p, 4);
    return bp >> 16;
  };
  return half(a, b) | half(a >> 16, b >> 16) << 16;
#endif
}

/// The two bf16x2 registers of a quad whose codes are all finite: register 0 holds codes 0 and 2,
/// register 1 codes 1 and 3 (the quad byte order of docs/format.md, section 3).
template <ElementFormat F>
GAAC_LANE_INLINE void widen_fast(Fp8Quad q, uint32_t& r0, uint32_t& r1) {
  using E = Fp8Element<F>;
  r0 = bf16x2_scale(prmt(q.magnitude, q.sign, 0x6240u) << E::kShift, E::kScalePair);
  r1 = bf16x2_scale(prmt(q.magnitude, q.sign, 0x7351u) << E::kShift, E::kScalePair);
}

/// The same registers through `table` (the BF16 value of each of the 256 codes): exact for every code.
template <ElementFormat F>
GAAC_LANE_INLINE void widen_exact(Fp8Quad q, const uint16_t* table, uint32_t& r0, uint32_t& r1) {
  const uint32_t codes = fp8_codes<F>(q);
  const auto at = [&](int b) { return static_cast<uint32_t>(table[(codes >> (8 * b)) & 0xFFu]); };
  r0 = at(0) | at(2) << 16;
  r1 = at(1) | at(3) << 16;
}

/// Numbers of a GAAC-FP8 slot of C channels in format F as one lane sees it.
template <int C, ElementFormat F>
struct Fp8SlotShape {
  static_assert(C == 64 || C == 128, "tiles have 64 or 128 channels");
  static constexpr Fp8TileShape kTile{F, TileShape{TensorKind::key, C}};
  static constexpr int kQuads = C / 8;    ///< quads per lane
  static constexpr int kGroups = C / 16;  ///< groups per lane
  static constexpr int kChunks = C / 32;  ///< 512-position chunks: one 16-byte load per stream each
  static constexpr int kSteps = C / 16;   ///< key channel steps
  static constexpr uint32_t kCodeOffset = static_cast<uint32_t>(kTile.code_offset());
  static constexpr uint32_t kMantissaOffset = static_cast<uint32_t>(kTile.mantissa_offset());  // E5M2
  static constexpr uint32_t kTagOffset = static_cast<uint32_t>(kTile.tag_offset());
  static constexpr uint32_t kEscapeOffset = static_cast<uint32_t>(kTile.escape_offset());
  /// Escape bytes of a raw group (X − 2).
  static constexpr uint32_t kRawEscapes = static_cast<uint32_t>(exponent_bits(F)) - 2u;
  static constexpr uint32_t kLowTagBits = C == 128 ? 0x5555u : 0x55u;
  static constexpr uint32_t kHighTagBits = C == 128 ? 0xAAAAu : 0xAAu;
};

/// Lane `lane`'s tag field of an FP8 slot (2 bits per group, group 0 lowest).
template <int C, ElementFormat F>
GAAC_LANE_INLINE uint32_t fp8_lane_tags(const uint8_t* slot, int lane) {
  using S = Fp8SlotShape<C, F>;
  if constexpr (C == 128)
    return static_cast<uint32_t>(slot[S::kTagOffset + 2 * lane]) | static_cast<uint32_t>(slot[S::kTagOffset + 2 * lane + 1]) << 8;
  else
    return slot[S::kTagOffset + lane];
}

/// Escape bytes a lane's groups own: one per 3-bit group, X − 2 per raw group. Their exclusive prefix
/// sum over the warp's lanes is where the lane's escapes start.
template <int C, ElementFormat F>
GAAC_LANE_INLINE uint32_t fp8_escape_bytes_of_lane(uint32_t tags) {
  using S = Fp8SlotShape<C, F>;
  return popc(tags & S::kLowTagBits) + S::kRawEscapes * popc(tags & S::kHighTagBits);
}

/// The four k-bit fields of the quads of chunk `chunk` that lane `lane` owns in a k-bit stream at
/// `stream` (docs/format.md, section 14.4): one 16-byte load; word w holds quad 4·chunk + w, field b at
/// bits 8b + shift .. of it, `shift` returned.
template <int K>
GAAC_LANE_INLINE uint32_t load_stream_chunk(const uint8_t* stream, int chunk, int lane, uint32_t (&words)[4]) {
  load_u32x4(stream + chunk * 64 * K + 32 * ((lane * K) / 16) + 16 * (lane % 2), words);
  return static_cast<uint32_t>(K * ((lane % (16 / K)) / 2));
}

/// The multiplier that spreads the four bits of a nibble to bit `bit` of bytes 0..3: (nibble · it) & (1
/// at bit `bit` of every byte) (no partial products overlap, so none carries).
GAAC_LANE_INLINE constexpr uint32_t spread_multiplier(uint32_t bit) {
  return (1u << bit) | (1u << (7 + bit)) | (1u << (14 + bit)) | (1u << (21 + bit));
}

/// The mantissas (low M bits of each byte) and signs (bit M of each byte) of the quads of chunk `chunk`
/// of lane `lane` (word w: quad 4·chunk + w): E4M3 from its 4-bit stream, E5M2 from its 1-bit stream of
/// signs and 2-bit stream of mantissas.
template <int C, ElementFormat F>
GAAC_LANE_INLINE void load_sign_mantissa(const uint8_t* slot, int chunk, int lane, uint32_t (&mantissas)[4],
                                         uint32_t (&signs)[4]) {
  uint32_t words[4];
  if constexpr (F == ElementFormat::e4m3) {
    const uint32_t shift = load_stream_chunk<4>(slot, chunk, lane, words);
    GAAC_LANE_UNROLL
    for (int w = 0; w < 4; ++w) {
      mantissas[w] = (words[w] >> shift) & 0x07070707u;
      signs[w] = (words[w] >> shift) & 0x08080808u;
    }
  } else {
    const uint32_t shift = load_stream_chunk<1>(slot, chunk, lane, words);
    GAAC_LANE_UNROLL
    for (int w = 0; w < 4; ++w) signs[w] = ((words[w] >> shift) & 0x01010101u) << 2;
    const uint32_t mshift = load_stream_chunk<2>(slot + Fp8SlotShape<C, F>::kMantissaOffset, chunk, lane, words);
    GAAC_LANE_UNROLL
    for (int w = 0; w < 4; ++w) mantissas[w] = (words[w] >> mshift) & 0x03030303u;
  }
}

/// Entries of the spread table: a byte (low nibble: four bits of plane 2, high nibble: the same four
/// elements' bits of plane 3) to those bits at bits 2 and 3 of bytes 0..3.
inline constexpr int kSpreadEntries = 256;
/// Entry `i` of the spread table.
GAAC_LANE_INLINE constexpr uint32_t spread_entry(uint32_t i) {
  return (((i & 0xFu) * spread_multiplier(2)) & 0x04040404u) | (((i >> 4) * spread_multiplier(3)) & 0x08080808u);
}

/// Bits 2 .. X − 1 of the offsets of a group's two quads (high[q]: quad q), placed in their bytes, from
/// the group's escape bytes at `escapes` (a 3-bit group's one, a raw group's X − 2), through `spread`
/// (the kSpreadEntries of spread_entry): one lookup a quad for planes 2 and 3, E5M2's plane 4 by a
/// multiply. The bytes are read whatever the mode (the stage holds them) and a mode's planes are kept by
/// multiplying them by 0 or 1: no predicated loads, no selects.
template <ElementFormat F>
GAAC_LANE_INLINE void offset_high_bits(const uint8_t* escapes, uint32_t mode, const uint32_t* spread,
                                       uint32_t (&high)[2]) {
  const uint32_t plane2 = escapes[0] * ((mode + 1u) >> 1);  // 3-bit and raw groups
  const uint32_t plane3 = escapes[1] * (mode >> 1);         // raw groups
  high[0] = spread[select_bits<0xF0u>(plane3 << 4, plane2)];
  high[1] = spread[select_bits<0xF0u>(plane3, plane2 >> 4)];
  if constexpr (F == ElementFormat::e5m2) {
    const uint32_t k4 = (mode >> 1) * spread_multiplier(4);
    high[0] |= ((escapes[2] & 0xFu) * k4) & 0x10101010u;
    high[1] |= ((escapes[2] >> 4) * k4) & 0x10101010u;
  }
}

/// Rebuilds lane `lane`'s quads of the GAAC-FP8 slot at `slot` group by group — keys interleaving the
/// token halves (group i, then kGroups/2 + i), values in order, as the kernel multiplies them — given the
/// lane's escape offset (its exclusive prefix of fp8_escape_bytes_of_lane over the warp), and passes
/// each group to `use(group, quads)` (quads[q]: quad 2·group + q). `base2`/`base3` return the lane's
/// base word w (lane_decode.cuh's base_word) over the b2 and over the b3 bases; `spread` is the spread
/// table (spread_entry).
template <int C, ElementFormat F, bool Key, class Base2At, class Base3At, class Use>
GAAC_LANE_INLINE void fp8_decode_groups(const uint8_t* slot, int lane, uint32_t offset, const Base2At& base2,
                                        const Base3At& base3, const uint32_t* spread, const Use& use) {
  using S = Fp8SlotShape<C, F>;
  constexpr int kM = Fp8Element<F>::kM;
  constexpr int kHalf = S::kGroups / 2;
  const uint32_t tags = fp8_lane_tags<C, F>(slot, lane);
  const uint8_t* escapes = slot + S::kEscapeOffset;
  // Keys: one cursor per token half (the second starts after the first half's escapes).
  uint32_t cursor[2] = {offset, offset};
  if constexpr (Key) {
    constexpr uint32_t kFirstHalf = (1u << (2 * kHalf)) - 1u;  // tag bits of groups 0 .. kHalf − 1
    cursor[1] = offset + fp8_escape_bytes_of_lane<C, F>(tags & kFirstHalf);
  }
  [&]<int... N>(std::integer_sequence<int, N...>) {
    (
        [&] {
          constexpr int G = Key ? (N % 2 == 0 ? N / 2 : kHalf + N / 2) : N;
          constexpr int kChunk = G / 2, kWord = (2 * G) % 4;  // the group's quads: words kWord, kWord + 1
          uint32_t mantissas[4], signs[4], codes[4];
          const uint32_t code_shift = load_stream_chunk<2>(slot + S::kCodeOffset, kChunk, lane, codes);
          load_sign_mantissa<C, F>(slot, kChunk, lane, mantissas, signs);
          const uint32_t mode = (tags >> (2 * G)) & 3u;
          uint32_t& at = cursor[Key && G >= kHalf ? 1 : 0];
          const uint8_t* group_escapes = escapes + at;
          // Escape bytes of a group of mode 0, 1, 2: 0, 1, X − 2 (E4M3: the mode; E5M2: 0, 1, 3).
          at += F == ElementFormat::e4m3 ? mode : mode + (mode >> 1);
          uint32_t high[2];
          offset_high_bits<F>(group_escapes, mode, spread, high);
          // The base of every byte in one PRMT: b2's bytes (selector 0x3210), b3's (0x7654), or, for a raw
          // group (0xBA98), the sign of b2's bytes replicated: 0, as every base is below 128.
          const uint32_t select = 0x3210u + mode * 0x4444u;
          Fp8Quad quads[2];
GAAC_LANE_UNROLL
          for (int q = 0; q < 2; ++q) {
            const int quad = 2 * G + q, w = kWord + q;
            const int bw = base_word_of_quad<C, Key>(quad);
            const uint32_t base = prmt(base2(bw), base3(bw), select);
            const uint32_t exponents = ((codes[w] >> code_shift) & 0x03030303u) + high[q] + base;
            quads[q] = {(exponents << kM) + mantissas[w], signs[w]};
          }
          use(std::integral_constant<int, G>{}, quads);
        }(),
        ...);
  }(std::make_integer_sequence<int, S::kGroups>{});
}

}  // namespace gaac::cuda::lane
