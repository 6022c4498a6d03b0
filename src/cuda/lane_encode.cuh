// One warp encodes one tile into a GAAC slot (docs/format.md, sections 3-5): the device twin of the
// scalar encoder (codec/codec_scalar.cpp), written through the same layout functions of format.hpp,
// so the bytes are the same by construction and tested to be.
//
// Lane L does what the reference does for lane L: its groups' modes, its sign+mantissa chunks, its
// code words, its tag field; a warp scan places its escape bytes. Two passes over the lane's quads,
// held in registers: the first picks the modes and counts escapes (so a tile that overflows the slot
// is known before anything is written, and nothing is), the second writes. Device code only.
#pragma once

#include <cstdint>

#include "cuda/lane_decode.cuh"
#include "cuda/warp.cuh"
#include "gaac/format.hpp"

namespace gaac::cuda::lane {

/// Elements per row of a tile staged in shared memory: eight more than the channels (16 bytes, four
/// banks), so the eight tokens (keys) or the tokens 2 apart (values) a warp reads at once fall in
/// different banks, and rows stay 16-byte aligned.
template <int C>
inline constexpr int kStagedRow = C + 8;

/// Copies rows `first .. first + count - 1` (first + count ≤ 16) of a tile (row-major, `C` BF16 each,
/// 16-byte aligned, consecutive rows `src_stride` elements apart) into the staged tile, all lanes of
/// the warp. A lane issues all its loads before its first store: one memory round trip a tile.
template <int C>
__device__ __forceinline__ void stage_rows(const uint16_t* src, size_t src_stride, int first, int count, uint16_t* staged,
                                           int lane) {
  constexpr int kPieces = C * 2 / 16;                   // 16-byte pieces per row
  constexpr int kPerLane = kTileTokens * kPieces / 32;  // a whole tile's pieces per lane
  uint4 pieces[kPerLane];
#pragma unroll
  for (int k = 0; k < kPerLane; ++k) {
    const int i = lane + 32 * k, row = i / kPieces, piece = i % kPieces;
    if (i < count * kPieces) pieces[k] = *reinterpret_cast<const uint4*>(src + static_cast<size_t>(row) * src_stride + piece * 8);
  }
#pragma unroll
  for (int k = 0; k < kPerLane; ++k) {
    const int i = lane + 32 * k, row = i / kPieces, piece = i % kPieces;
    if (i < count * kPieces) *reinterpret_cast<uint4*>(staged + (first + row) * kStagedRow<C> + piece * 8) = pieces[k];
  }
}

/// The exponents and sign+mantissa bytes of the four elements of a pair of BF16 values `lo` (bytes 0
/// and 2 of the quad) and `hi` (bytes 1 and 3), two BF16 in each word: four elements in four bytes.
__device__ __forceinline__ void split_quad(uint32_t lo, uint32_t hi, uint32_t& exponents, uint32_t& sign_mantissa) {
  exponents = ((lo >> 7) & 0x00FF00FFu) | ((hi << 1) & 0xFF00FF00u);
  const uint32_t sm_lo = ((lo >> 8) & 0x00800080u) | (lo & 0x007F007Fu);
  const uint32_t sm_hi = ((hi >> 8) & 0x00800080u) | (hi & 0x007F007Fu);
  sign_mantissa = sm_lo | sm_hi << 8;
}

/// Lane `lane`'s quad `quad` of the staged tile, as exponent and sign+mantissa bytes in the quad's
/// byte order (element_slot): keys read two words of one token (channels 16s+2t+{0,1} and +{8,9}),
/// values four halfwords of one channel (tokens 2t+{0,1} and 2t+{8,9}).
template <int C, bool Key>
__device__ __forceinline__ void load_quad(const uint16_t* staged, int lane, int quad, uint32_t& exponents,
                                          uint32_t& sign_mantissa) {
  const int g = lane / 4, t = lane % 4;
  uint32_t lo, hi;
  if (Key) {
    const uint16_t* row = staged + (8 * (quad / (C / 16)) + g) * kStagedRow<C> + 16 * (quad % (C / 16)) + 2 * t;
    lo = *reinterpret_cast<const uint32_t*>(row);
    hi = *reinterpret_cast<const uint32_t*>(row + 8);
  } else {
    const uint16_t* column = staged + 8 * quad + g;
    lo = column[(2 * t) * kStagedRow<C>] | static_cast<uint32_t>(column[(2 * t + 1) * kStagedRow<C>]) << 16;
    hi = column[(2 * t + 8) * kStagedRow<C>] | static_cast<uint32_t>(column[(2 * t + 9) * kStagedRow<C>]) << 16;
  }
  split_quad(lo, hi, exponents, sign_mantissa);
}

/// Encodes the staged tile (16 rows of kStagedRow<C> elements in shared memory) with the tile's bases,
/// given as the lane's base words (lane_decode.cuh, base_word): `base3(w)` and `base4(w)` return word
/// w (0 .. kBaseWords<C, Key> − 1) of b3 and of b4; and escape capacity `capacity`. Returns the tile's
/// escape bytes, the same in every lane. When they fit the capacity, the fixed part (sign+mantissa,
/// codes, tags: fixed_bytes) is written to `slot` (16-byte aligned) and the escapes to `escape_slot`
/// (any alignment; with `zero_fill`, the rest of its `capacity` bytes zeroed: 16-byte aligned and
/// capacity a multiple of 16 then); otherwise nothing is written. All 32 lanes must call it.
///
/// Four elements at a time in the bytes of a word: offsets are one byte-wise subtraction
/// (`__vsub4`), and because calibrated bases keep every window inside 0..255 (b3 ≤ 248, b4 ≤ 240) an
/// exponent below its base wraps to at least 8 (16), so "fits the window" is one mask test.
template <int C, bool Key, class Base3, class Base4>
__device__ uint32_t encode_staged_tile_with(const uint16_t* staged, const Base3& base3, const Base4& base4, uint32_t capacity,
                                            uint8_t* slot, uint8_t* escape_slot, bool zero_fill, int lane) {
  constexpr TileShape shape{Key ? TensorKind::key : TensorKind::value, C};
  constexpr int kQuads = shape.quads_per_lane();
  constexpr int kGroups = shape.groups_per_lane();
  constexpr int kWords = code_words_per_lane(shape);

  // Pass 1: every quad's bytes, the modes of the lane's groups (its tag field) and its escape bytes.
  uint32_t exponents[kQuads], sign_mantissa[kQuads], offsets3[kQuads], offsets4[kQuads];
#pragma unroll
  for (int q = 0; q < kQuads; ++q) {
    load_quad<C, Key>(staged, lane, q, exponents[q], sign_mantissa[q]);
    const int w = base_word_of_quad<C, Key>(q);
    offsets3[q] = __vsub4(exponents[q], base3(w));
    offsets4[q] = __vsub4(exponents[q], base4(w));
  }
  uint32_t tags = 0, escapes = 0;
#pragma unroll
  for (int p = 0; p < kGroups; ++p) {
    const bool fits3 = ((offsets3[2 * p] | offsets3[2 * p + 1]) & 0xF8F8F8F8u) == 0;
    const bool fits4 = ((offsets4[2 * p] | offsets4[2 * p + 1]) & 0xF0F0F0F0u) == 0;
    const GroupMode mode = fits3 ? GroupMode::bits3 : fits4 ? GroupMode::bits4 : GroupMode::raw;
    tags |= static_cast<uint32_t>(mode) << (2 * p);
    escapes += static_cast<uint32_t>(escape_bytes_for(mode));
  }
  const uint32_t start = detail::warp_exclusive_scan(escapes, lane);
  const uint32_t total = __shfl_sync(0xffffffffu, start + escapes, 31);
  if (total > capacity) return total;

  // Pass 2: sign+mantissa chunks (16 bytes per lane each), code words, escape bit-planes.
  if (zero_fill) {
    for (uint32_t i = static_cast<uint32_t>(lane) * 16; i < capacity; i += 32 * 16) {
      *reinterpret_cast<uint4*>(escape_slot + i) = make_uint4(0, 0, 0, 0);
    }
    __syncwarp();
  }
#pragma unroll
  for (int chunk = 0; chunk < kQuads / 4; ++chunk) {
    *reinterpret_cast<uint4*>(slot + sign_mantissa_offset(lane, 4 * chunk, 0)) =
        make_uint4(sign_mantissa[4 * chunk], sign_mantissa[4 * chunk + 1], sign_mantissa[4 * chunk + 2],
                   sign_mantissa[4 * chunk + 3]);
  }
  uint32_t words[kWords] = {};
  uint32_t at = start;
#pragma unroll
  for (int p = 0; p < kGroups; ++p) {
    const auto mode = static_cast<GroupMode>((tags >> (2 * p)) & 3u);
    uint32_t d[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int q = 2 * p + h;
      d[h] = mode == GroupMode::bits3 ? offsets3[q] : mode == GroupMode::bits4 ? offsets4[q] : exponents[q];
      const CodeBits where = code_bits(shape, q);
      words[where.low_word] |= (d[h] & (((1u << where.low_bits) - 1) * 0x01010101u)) << where.low_shift;
      if (where.high_word >= 0) words[where.high_word] |= ((d[h] >> 2) & 0x01010101u) << where.high_shift;
    }
    if (mode != GroupMode::bits3) {  // rare: bit-plane k holds bit 3 + k of element i at bit i
      const int n = escape_bytes_for(mode);
      for (int k = 0; k < n; ++k) {
        uint32_t plane = 0;
#pragma unroll
        for (int i = 0; i < kGroupSize; ++i) plane |= ((d[i / kQuadSize] >> (8 * (i % kQuadSize) + 3 + k)) & 1u) << i;
        escape_slot[at + k] = static_cast<uint8_t>(plane);
      }
      at += static_cast<uint32_t>(n);
    }
  }
#pragma unroll
  for (int w = 0; w < kWords; ++w) {
    *reinterpret_cast<uint32_t*>(slot + shape.code_offset() + code_word_offset(shape, lane, w)) = words[w];
  }

  // Tags: a lane's field is 2·kGroups bits of word (lane·kGroups)/16; the lanes sharing a word OR
  // their fields together and the first of them stores it.
  constexpr int kLanesPerWord = 16 / kGroups;
  uint32_t word = tags << (2 * kGroups * (lane % kLanesPerWord));
#pragma unroll
  for (int dist = 1; dist < kLanesPerWord; dist <<= 1) word |= __shfl_xor_sync(0xffffffffu, word, dist);
  if (lane % kLanesPerWord == 0) {
    *reinterpret_cast<uint32_t*>(slot + shape.tag_offset() + 4 * (lane / kLanesPerWord)) = word;
  }
  return total;
}

/// encode_staged_tile_with the bases as bytes (`b3`, `b4`: C bytes each, any memory), each base word
/// gathered from four of them.
template <int C, bool Key>
__device__ uint32_t encode_staged_tile_split(const uint16_t* staged, const uint8_t* b3, const uint8_t* b4, uint32_t capacity,
                                             uint8_t* slot, uint8_t* escape_slot, bool zero_fill, int lane) {
  return encode_staged_tile_with<C, Key>(
      staged, [&](int w) { return base_word<C, Key>(b3, lane, w); }, [&](int w) { return base_word<C, Key>(b4, lane, w); },
      capacity, slot, escape_slot, zero_fill, lane);
}

/// encode_staged_tile_split into one slot: `fixed_bytes + capacity` bytes at `slot` (16-byte aligned,
/// capacity a multiple of 16), the unused escape bytes zero.
template <int C, bool Key>
__device__ uint32_t encode_staged_tile(const uint16_t* staged, const uint8_t* b3, const uint8_t* b4, uint32_t capacity,
                                       uint8_t* slot, int lane) {
  constexpr TileShape shape{Key ? TensorKind::key : TensorKind::value, C};
  return encode_staged_tile_split<C, Key>(staged, b3, b4, capacity, slot, slot + shape.escape_offset(), true, lane);
}

}  // namespace gaac::cuda::lane
