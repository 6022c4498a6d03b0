// Per-lane reconstruction of a GAAC slot into mma.m16n8k16 operand registers (docs/format.md,
// sections 3-6 and 8). Pure integer code on 32-bit words: it compiles for the device, where each
// lane of a warp rebuilds its own fragments, and for the host, where tests run the 32 lanes one
// after another and compare with the reference codec.
//
// One lane's work on one slot of C channels:
//   1. load_lane_slot: its sign+mantissa words (C/8 quads), code words and tag field;
//   2. escape_bytes_of_lane, then an exclusive scan over the warp: where its escapes start;
//   3. lane_escapes: its 4-bit groups' escape bytes spread per group, branch-free;
//   4. quad_exponents (group_exponents for a group's two): base + code for four exponents at once,
//      the 4-bit and single-raw-group corrections folded in;
//   5. fix_group, only in lanes with two raw groups or many 4-bit groups (rare);
//   6. compose: two bf16x2 registers per quad (PRMT sign spread + LOP3 select).
#pragma once

#include <cstdint>
#include <cstring>
#include <utility>

#include "gaac/format.hpp"

#if defined(__CUDACC__)
#define GAAC_LANE_INLINE __host__ __device__ __forceinline__
#define GAAC_LANE_UNROLL _Pragma("unroll")
#else
#define GAAC_LANE_INLINE inline
#define GAAC_LANE_UNROLL
#endif

namespace gaac::cuda::lane {

/// PTX prmt.b32 in its default mode: byte i of the result is byte (nibble i of `sel`) & 7 of the
/// eight bytes {b:a} (a holds bytes 0..3); a nibble with bit 3 set gives that byte's sign bit
/// replicated over all eight bits instead.
GAAC_LANE_INLINE uint32_t prmt(uint32_t a, uint32_t b, uint32_t sel) {
#if defined(__CUDA_ARCH__)
  uint32_t d;
  asm("prmt.b32 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(sel));
  return d;
#else
  const uint64_t src = static_cast<uint64_t>(b) << 32 | a;
  uint32_t d = 0;
  for (int i = 0; i < 4; ++i) {
    const uint32_t s = (sel >> (4 * i)) & 0xFu;
    uint32_t byte = static_cast<uint32_t>(src >> (8 * (s & 7u))) & 0xFFu;
    if (s & 8u) byte = (byte & 0x80u) ? 0xFFu : 0u;
    d |= byte << (8 * i);
  }
  return d;
#endif
}

/// (a & Mask) | (b & ~Mask) in one LOP3 (the compiler, left alone, spends two on it).
template <uint32_t Mask>
GAAC_LANE_INLINE uint32_t select_bits(uint32_t a, uint32_t b) {
#if defined(__CUDA_ARCH__)
  uint32_t d;
  asm("lop3.b32 %0, %1, %2, %3, 0xE4;" : "=r"(d) : "r"(a), "r"(b), "n"(Mask));
  return d;
#else
  return (a & Mask) | (b & ~Mask);
#endif
}

/// Population count.
GAAC_LANE_INLINE uint32_t popc(uint32_t x) {
#if defined(__CUDA_ARCH__)
  return static_cast<uint32_t>(__popc(x));
#else
  return static_cast<uint32_t>(__builtin_popcount(x));
#endif
}

/// Little-endian 32-bit word at `p` (4-byte aligned).
GAAC_LANE_INLINE uint32_t load_u32(const uint8_t* p) {
#if defined(__CUDA_ARCH__)
  return *reinterpret_cast<const uint32_t*>(p);
#else
  uint32_t v;
  std::memcpy(&v, p, 4);
  return v;
#endif
}

/// Four consecutive little-endian words at `p` (16-byte aligned on the device: one 16-byte load).
GAAC_LANE_INLINE void load_u32x4(const uint8_t* p, uint32_t* out) {
#if defined(__CUDA_ARCH__)
  const uint4 v = *reinterpret_cast<const uint4*>(p);
  out[0] = v.x, out[1] = v.y, out[2] = v.z, out[3] = v.w;
#else
  std::memcpy(out, p, 16);
#endif
}

/// Two consecutive little-endian words at `p` (8-byte aligned on the device: one 8-byte load).
GAAC_LANE_INLINE void load_u32x2(const uint8_t* p, uint32_t* out) {
#if defined(__CUDA_ARCH__)
  const uint2 v = *reinterpret_cast<const uint2*>(p);
  out[0] = v.x, out[1] = v.y;
#else
  std::memcpy(out, p, 8);
#endif
}

/// Numbers of a slot of C channels as one lane sees it.
template <int C>
struct SlotShape {
  static_assert(C == 64 || C == 128, "tiles have 64 or 128 channels");
  static constexpr int kQuads = C / 8;          ///< quads per lane
  static constexpr int kOctets = kQuads / 8;    ///< octets of quads per lane (code-word triples)
  static constexpr int kGroups = kQuads / 2;    ///< groups per lane
  static constexpr int kWords = 3 * kOctets;    ///< code words per lane
  static constexpr int kSteps = C / 16;         ///< key channel steps (k16) = value m16 blocks
  static constexpr int kCodeOffset = 16 * C;
  static constexpr int kTagOffset = 22 * C;
  static constexpr int kEscapeOffset = 45 * C / 2;
  /// Tag bits of a lane that mark 4-bit groups (low bit of each 2-bit tag) and raw groups (high bit).
  static constexpr uint32_t kLowTagBits = C == 128 ? 0x5555u : 0x55u;
  static constexpr uint32_t kHighTagBits = C == 128 ? 0xAAAAu : 0xAAu;
};

/// What one lane reads of a slot: the sign+mantissa word of each of its quads, its code words (W0 of
/// every octet, then W1s, then W2s) and its tag field (2 bits per group, group 0 lowest).
template <int C>
struct LaneSlot {
  uint32_t sm[SlotShape<C>::kQuads];
  uint32_t words[SlotShape<C>::kWords];
  uint32_t tags;
};

/// Reads lane `lane`'s part of the slot at `slot` (16-byte aligned): C/32 16-byte sign+mantissa
/// loads, one 16-byte (8-byte for C = 64) and one 8-byte (4-byte) code load, and one tag load.
template <int C>
GAAC_LANE_INLINE void load_lane_slot(const uint8_t* slot, int lane, LaneSlot<C>& out) {
  using S = SlotShape<C>;
GAAC_LANE_UNROLL
  for (int chunk = 0; chunk < S::kQuads / 4; ++chunk) load_u32x4(slot + chunk * 512 + lane * 16, &out.sm[4 * chunk]);
  if constexpr (C == 128) {
    load_u32x4(slot + S::kCodeOffset + lane * 16, &out.words[0]);
    load_u32x2(slot + S::kCodeOffset + 512 + lane * 8, &out.words[4]);
    out.tags = static_cast<uint32_t>(slot[S::kTagOffset + 2 * lane]) |
               static_cast<uint32_t>(slot[S::kTagOffset + 2 * lane + 1]) << 8;
  } else {
    load_u32x2(slot + S::kCodeOffset + lane * 8, &out.words[0]);
    out.words[2] = load_u32(slot + S::kCodeOffset + 256 + lane * 4);
    out.tags = slot[S::kTagOffset + lane];
  }
}

/// Escape bytes lane's groups own: one per 4-bit group, five per raw group. The exclusive prefix
/// sum of this over the warp's lanes is where the lane's escapes start in the escape slot.
GAAC_LANE_INLINE uint32_t escape_bytes_of_lane(uint32_t tags) {
  return popc(tags & 0x5555u) + 5u * popc(tags & 0xAAAAu);
}

/// Spreads the 2-bit tags of a lane's (up to 8) groups to nibbles: nibble p = tag of group p.
GAAC_LANE_INLINE uint32_t tags_as_nibbles(uint32_t tags) {
  uint32_t n = tags & 0xFFFFu;
  n = (n | (n << 8)) & 0x00FF00FFu;
  n = (n | (n << 4)) & 0x0F0F0F0Fu;
  return (n | (n << 2)) & 0x33333333u;
}

/// True when the branch-free path cannot rebuild the lane's escaped groups: two or more raw groups,
/// a raw group and more than three 4-bit groups, or more than four 4-bit groups. Such a lane's
/// escaped groups are rebuilt by fix_group (rare: about 0.1% of lanes on real KV).
template <int C>
GAAC_LANE_INLINE bool lane_needs_fixing(uint32_t tags) {
  using S = SlotShape<C>;
  const uint32_t raw = popc(tags & S::kHighTagBits), four = popc(tags & S::kLowTagBits);
  return raw > 1 || (raw == 1 && four > 3) || four > 4;
}

/// Which decode a tile takes. A warp decodes a tile on the path its most demanding lane needs: the
/// branch-free path nearly always, the wide path only in the rare tiles where some lane has groups
/// it cannot rebuild (lane_needs_fixing).
enum class EscapePath : uint32_t {
  branch_free = 0,  ///< 4-bit groups (at most four per lane) and one raw group beside at most three
  wide = 1,         ///< anything: lanes beyond the branch-free path rebuild their groups with fix_group
};

/// The branch-free view of a lane's escapes: byte p%4 of lo[p/4] holds the low nibble of group p's
/// 4-bit escape byte (bit 3 of the offsets of its first quad), hi[p/4] the high nibble (second
/// quad), both zero for a group not in 4-bit mode; nibble p of `four` / `raw` is 1 for a 4-bit / raw
/// group; corr[0] and corr[1] are what the lane's single raw group (if any) adds to the two quads'
/// exponent words as the branch-free path computes them (codes + b3): its high bit-planes minus b3.
struct LaneEscapes {
  uint32_t lo[2];
  uint32_t hi[2];
  uint32_t four;
  uint32_t raw;
  uint32_t corr[2];
};

/// Bits 3..7 of the offsets of one raw group's quads from its five bit-planes (docs/format.md 5.4):
/// `planes` holds planes 3..6 (byte k: plane 3 + k), `plane7` plane 7 in its low byte; `low` gets the
/// group's first quad (bits 0..3 of each plane), `high` its second.
GAAC_LANE_INLINE void raw_planes(uint32_t planes, uint32_t plane7, uint32_t& low, uint32_t& high);

/// Builds LaneEscapes from the lane's tag field and its escapes, which start `offset` bytes into the
/// escape slot at `escapes` (reads up to 12 bytes from offset rounded down to 4; the caller pads).
/// `base3_at(w)` returns the lane's b3 base word w (any w, known only at run time). Exact for every
/// lane lane_needs_fixing accepts.
template <int C, bool Key, class BaseAt>
GAAC_LANE_INLINE LaneEscapes lane_escapes(uint32_t tags, const uint8_t* escapes, uint32_t offset, const BaseAt& base3_at) {
  const uint32_t n = tags_as_nibbles(tags);
  LaneEscapes e;
  e.four = n & 0x11111111u;
  e.raw = (n >> 1) & 0x11111111u;
  // Rank of each 4-bit group among the lane's 4-bit groups (exclusive prefix count, per nibble).
  const uint32_t rank = e.four * 0x11111111u - e.four;
  // Selector: byte `rank` of the window for a 4-bit group, a byte of the zero operand otherwise.
  const uint32_t select = rank | ((e.four ^ 0x11111111u) << 2);
  const uint8_t* aligned = escapes + (offset & ~3u);
  const uint32_t shift = 0x3210u + 0x1111u * (offset & 3u);
  const uint32_t a1 = load_u32(aligned + 4);
  uint32_t window = prmt(load_u32(aligned), a1, shift);
  e.corr[0] = e.corr[1] = 0u;
  if (e.raw != 0u && popc(e.raw) == 1u && popc(e.four) <= 3u) {
    // One raw group p after `before` 4-bit groups: its planes are bytes before..before+4 of the
    // lane's escapes; the 4-bit groups' bytes are the others, in order.
    const int p = static_cast<int>(popc((e.raw & (0u - e.raw)) - 1u)) / 4;
    const uint32_t before = popc(e.four & ((1u << (4 * p)) - 1u));
    const uint32_t next = prmt(a1, load_u32(aligned + 8), shift);  // escape bytes 4..7
    const uint32_t four_planes = prmt(window, next, 0x3210u + 0x1111u * before);
    const uint32_t plane7 = prmt(window, next, 4u + before);
    window = prmt(window, next, 0x3210u + (0x0555u & ~((1u << (4 * before)) - 1u)));  // bytes 0..2 suffice
    uint32_t low, high;
    raw_planes(four_planes, plane7, low, high);
    constexpr int kSteps = SlotShape<C>::kSteps;
    e.corr[0] = low - base3_at(Key ? (2 * p) % kSteps : 2 * p);
    e.corr[1] = high - base3_at(Key ? (2 * p + 1) % kSteps : 2 * p + 1);
  }
  const uint32_t first = prmt(window, 0u, select);
  const uint32_t second = prmt(window, 0u, select >> 16);
  e.lo[0] = first & 0x0F0F0F0Fu;
  e.hi[0] = (first >> 4) & 0x0F0F0F0Fu;
  e.lo[1] = second & 0x0F0F0F0Fu;
  e.hi[1] = (second >> 4) & 0x0F0F0F0Fu;
  return e;
}

/// Spreads the four bits of `nibble` (0..15) to bit 3 of bytes 0..3.
GAAC_LANE_INLINE uint32_t spread_to_bit3(uint32_t nibble) { return (nibble * 0x01020408u) & 0x08080808u; }

GAAC_LANE_INLINE void raw_planes(uint32_t planes, uint32_t plane7, uint32_t& low, uint32_t& high) {
  // Byte k of `planes` holds bit 3 + k of the group's eight exponents (bit i: element i). Transposing
  // its two 4×4 bit blocks (bits 0..3 and 4..7 of the four bytes) with two delta swaps puts bit 3 + k
  // of element i of the first quad at bit k of byte i, and of the second quad at bit 4 + k.
  uint32_t x = planes;
  uint32_t t = (x ^ (x >> 7)) & 0x00AA00AAu;
  x ^= t ^ (t << 7);
  t = (x ^ (x >> 14)) & 0x0000CCCCu;
  x ^= t ^ (t << 14);
  // Plane 7: bit i of a nibble to bit 7 of byte i (the partial products land on no target bit and
  // carry into none).
  const uint32_t top_low = ((plane7 & 0xFu) * 0x10204080u) & 0x80808080u;
  const uint32_t top_high = (((plane7 >> 4) & 0xFu) * 0x10204080u) & 0x80808080u;
  low = ((x & 0x0F0F0F0Fu) << 3) | top_low;
  high = ((x & 0xF0F0F0F0u) >> 1) | top_high;
}

/// The low three bits of the offsets of quad Q, one per byte (docs/format.md, section 5.2).
template <int C, int Q>
GAAC_LANE_INLINE uint32_t quad_codes(const LaneSlot<C>& s) {
  using S = SlotShape<C>;
  constexpr int o = Q / 8, k = Q % 8;
  const uint32_t w0 = s.words[o], w1 = s.words[S::kOctets + o], w2 = s.words[2 * S::kOctets + o];
  constexpr uint32_t m = 0x07070707u;
  if constexpr (k == 0) return w0 & m;
  else if constexpr (k == 1) return (w0 >> 3) & m;
  else if constexpr (k == 2) return w1 & m;
  else if constexpr (k == 3) return (w1 >> 3) & m;
  else if constexpr (k == 4) return w2 & m;
  else if constexpr (k == 5) return (w2 >> 3) & m;
  else if constexpr (k == 6) return ((w0 >> 6) & 0x03030303u) | ((w2 >> 4) & 0x04040404u);
  else return ((w1 >> 6) & 0x03030303u) | ((w2 >> 5) & 0x04040404u);
}

/// Exponent bytes of quad Q: `base3` holds the b3 bases of the quad's four elements (one per byte)
/// and `delta` the word b4 − b3 (mod 2³²), so a 4-bit group gets b4 + (code | bit 3) and the raw
/// group code + its planes, each with one multiply-add and no branch. No byte carries: every
/// base + offset is an exponent, at most 255, and the words are equal mod 2³².
template <int C, int Q>
GAAC_LANE_INLINE uint32_t quad_exponents(const LaneSlot<C>& s, const LaneEscapes& e, uint32_t base3, uint32_t delta) {
  constexpr int p = Q / 2;
  const uint32_t nibbles = (Q % 2 == 0 ? e.lo : e.hi)[p / 4];
  const uint32_t nibble = prmt(nibbles, 0u, 0x4440u | static_cast<uint32_t>(p % 4));
  const uint32_t four = (e.four >> (4 * p)) & 1u, raw = (e.raw >> (4 * p)) & 1u;
  return (quad_codes<C, Q>(s) | spread_to_bit3(nibble)) + base3 + four * delta + raw * e.corr[Q % 2];
}

/// Rebuilds the exponent bytes of group G (quads 2G, 2G+1) of a lane from the escape slot when it is
/// a 4-bit or raw group; the lane's escapes start at `offset`. `base3`/`delta` are the words
/// quad_exponents took for the two quads, `exponents` theirs. Used only in lanes that
/// lane_needs_fixing selects.
template <int C, int G>
GAAC_LANE_INLINE void fix_group(const LaneSlot<C>& s, const uint8_t* escapes, uint32_t offset, const uint32_t (&base3)[2],
                                const uint32_t (&delta)[2], uint32_t (&exponents)[2]) {
  const uint32_t mode = (s.tags >> (2 * G)) & 3u;
  if (mode == 0u) return;
  const uint32_t at = offset + escape_bytes_of_lane(s.tags & ((1u << (2 * G)) - 1u));
  if (mode == 1u) {
    const uint32_t x = escapes[at];
    exponents[0] = (quad_codes<C, 2 * G>(s) | spread_to_bit3(x & 0xFu)) + base3[0] + delta[0];
    exponents[1] = (quad_codes<C, 2 * G + 1>(s) | spread_to_bit3(x >> 4)) + base3[1] + delta[1];
  } else {
    uint32_t planes = 0u, first, second;
    GAAC_LANE_UNROLL
    for (int k = 0; k < 4; ++k) planes |= static_cast<uint32_t>(escapes[at + k]) << (8 * k);
    raw_planes(planes, escapes[at + 4], first, second);
    exponents[0] = quad_codes<C, 2 * G>(s) | first;
    exponents[1] = quad_codes<C, 2 * G + 1>(s) | second;
  }
}

/// Exponent bytes of group G's two quads (2G, 2G+1): the branch-free path, then, on the wide path
/// and in a lane lane_needs_fixing selects, the group rebuilt from its escapes. `base3`/`delta` are
/// the quads' base words; `escapes`/`offset` as for lane_escapes, whose result `e` is.
template <int C, int G, EscapePath Path>
GAAC_LANE_INLINE void group_exponents(const LaneSlot<C>& s, const LaneEscapes& e, const uint8_t* escapes, uint32_t offset,
                                      const uint32_t (&base3)[2], const uint32_t (&delta)[2], uint32_t (&exponents)[2]) {
  exponents[0] = quad_exponents<C, 2 * G>(s, e, base3[0], delta[0]);
  exponents[1] = quad_exponents<C, 2 * G + 1>(s, e, base3[1], delta[1]);
  if constexpr (Path == EscapePath::wide) {
    if (lane_needs_fixing<C>(s.tags)) fix_group<C, G>(s, escapes, offset, base3, delta, exponents);
  }
}

/// The two bf16x2 registers of a quad from its sign+mantissa word and exponent bytes: register 0
/// holds elements 0 and 2 (k = 2t, 2t+1), register 1 elements 1 and 3 (k = 2t+8, 2t+9).
GAAC_LANE_INLINE void compose(uint32_t sm, uint32_t exponents, uint32_t& r0, uint32_t& r1) {
  constexpr uint32_t keep = 0x807F807Fu;  // sign and mantissa bits of two bf16 values
  r0 = select_bits<keep>(prmt(sm, 0u, 0xA280u), exponents << 7);
  r1 = select_bits<keep>(prmt(sm, 0u, 0xB391u), exponents >> 1);
}

/// Index of the base word of quad Q: keys share one per channel step (both token halves), values
/// have one per quad (one channel each).
template <int C, bool Key>
GAAC_LANE_INLINE constexpr int base_word_of_quad(int quad) {
  return Key ? quad % SlotShape<C>::kSteps : quad;
}

/// Base words of a lane (one per base_word_of_quad): bytes [b(16s+2t), b(16s+2t+8), b(16s+2t+1),
/// b(16s+2t+9)] for keys at step s, b(8c+g) in all four bytes for values at quad c.
template <int C, bool Key>
GAAC_LANE_INLINE uint32_t base_word(const uint8_t* bases, int lane, int word) {
  const int g = lane / 4, t = lane % 4;
  if (Key) {
    const int c = 16 * word + 2 * t;
    return static_cast<uint32_t>(bases[c]) | static_cast<uint32_t>(bases[c + 8]) << 8 |
           static_cast<uint32_t>(bases[c + 1]) << 16 | static_cast<uint32_t>(bases[c + 9]) << 24;
  }
  return static_cast<uint32_t>(bases[8 * word + g]) * 0x01010101u;
}

/// Number of base words per lane.
template <int C, bool Key>
inline constexpr int kBaseWords = Key ? SlotShape<C>::kSteps : SlotShape<C>::kQuads;

/// Rebuilds every quad's exponent bytes of one lane, group by group, on escape path `Path` (wide for
/// a lane that lane_needs_fixing selects), given its escape offset (its exclusive prefix of
/// escape_bytes_of_lane over the warp). `base3w`/`deltaw` are its base words (kBaseWords);
/// `base3_at(w)` reads b3 word w at run time (the rare raw-group path).
template <int C, bool Key, EscapePath Path, class BaseAt>
GAAC_LANE_INLINE void lane_exponents(const LaneSlot<C>& s, const uint8_t* escapes, uint32_t offset,
                                     const uint32_t* base3w, const uint32_t* deltaw, const BaseAt& base3_at,
                                     uint32_t* exponents) {
  const LaneEscapes e = lane_escapes<C, Key>(s.tags, escapes, offset, base3_at);
  [&]<int... G>(std::integer_sequence<int, G...>) {
    (
        [&] {
          constexpr int w = base_word_of_quad<C, Key>(2 * G);
          const uint32_t b3[2] = {base3w[w], base3w[w + 1]}, dl[2] = {deltaw[w], deltaw[w + 1]};
          uint32_t pair[2];
          group_exponents<C, G, Path>(s, e, escapes, offset, b3, dl, pair);
          exponents[2 * G] = pair[0], exponents[2 * G + 1] = pair[1];
        }(),
        ...);
  }(std::make_integer_sequence<int, SlotShape<C>::kGroups>{});
}

}  // namespace gaac::cuda::lane
