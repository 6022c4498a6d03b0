// One warp encodes one tile into a GAAC slot (docs/format.md, sections 3-5): the device twin of the
// reference encoder (codec/reference.cpp), written through the same layout functions of format.hpp,
// so the bytes are the same by construction and tested to be.
//
// Lane L does what the reference does for lane L: its groups' modes, its sign+mantissa chunks, its
// code words, its tag field; a warp scan places its escape bytes. Two passes over the tile in shared
// memory: the first picks the modes and counts escapes (so a tile that overflows the slot is known
// before anything is written, and nothing is), the second writes. Device code only.
#pragma once

#include <cstdint>

#include "cuda/warp.cuh"
#include "gaac/format.hpp"

namespace gaac::cuda::lane {

/// Elements per row of a tile staged in shared memory: two more than the channels, so the eight
/// tokens (keys) or the tokens 2 apart (values) a warp reads at once fall in different banks.
template <int C>
inline constexpr int kStagedRow = C + 2;

/// Copies rows `first .. first + count - 1` of a tile (row-major, `C` BF16 each, 16-byte aligned,
/// consecutive rows `src_stride` elements apart) into the staged tile, all lanes of the warp.
template <int C>
__device__ __forceinline__ void stage_rows(const uint16_t* src, size_t src_stride, int first, int count, uint16_t* staged,
                                           int lane) {
  constexpr int kPieces = C * 2 / 16;  // 16-byte pieces per row
  for (int i = lane; i < count * kPieces; i += 32) {
    const int row = i / kPieces, piece = i % kPieces;
    const uint4 v = *reinterpret_cast<const uint4*>(src + static_cast<size_t>(row) * src_stride + piece * 8);
    uint32_t* d = reinterpret_cast<uint32_t*>(staged + (first + row) * kStagedRow<C> + piece * 8);
    d[0] = v.x, d[1] = v.y, d[2] = v.z, d[3] = v.w;
  }
}

/// Encodes the staged tile (16 rows of kStagedRow<C> elements in shared memory) with the tile's bases
/// (`b3`, `b4`: C bytes each, any memory) and escape capacity `capacity` (a multiple of
/// 16). Returns the tile's escape bytes, the same in every lane. When they fit the capacity the slot,
/// `fixed_bytes + capacity` bytes with its unused escape bytes zero, is written to `slot` (16-byte
/// aligned); otherwise nothing is written. All 32 lanes must call it.
template <int C, bool Key>
__device__ uint32_t encode_staged_tile(const uint16_t* staged, const uint8_t* b3, const uint8_t* b4, uint32_t capacity,
                                       uint8_t* slot, int lane) {
  constexpr TileShape shape{Key ? TensorKind::key : TensorKind::value, C};
  constexpr int kQuads = shape.quads_per_lane();
  constexpr int kGroups = shape.groups_per_lane();
  constexpr int kWords = code_words_per_lane(shape);
  const auto element = [&](int quad, int byte) {
    const ElementSlot at = element_slot(shape, lane, quad, byte);
    return staged[at.token * kStagedRow<C> + at.channel];
  };
  const auto channel = [&](int quad, int byte) { return element_slot(shape, lane, quad, byte).channel; };

  // Pass 1: the modes of the lane's groups (its tag field) and its escape bytes.
  uint32_t tags = 0, escapes = 0;
#pragma unroll
  for (int p = 0; p < kGroups; ++p) {
    bool fits3 = true, fits4 = true;
#pragma unroll
    for (int i = 0; i < kGroupSize; ++i) {
      const int quad = 2 * p + i / kQuadSize, byte = i % kQuadSize;
      const int e = bf16_exponent(element(quad, byte)), ch = channel(quad, byte);
      const int d3 = e - b3[ch], d4 = e - b4[ch];
      fits3 = fits3 && d3 >= 0 && d3 < 8;
      fits4 = fits4 && d4 >= 0 && d4 < 16;
    }
    const GroupMode mode = fits3 ? GroupMode::bits3 : fits4 ? GroupMode::bits4 : GroupMode::raw;
    tags |= static_cast<uint32_t>(mode) << (2 * p);
    escapes += static_cast<uint32_t>(escape_bytes_for(mode));
  }
  const uint32_t start = detail::warp_exclusive_scan(escapes, lane);
  const uint32_t total = __shfl_sync(0xffffffffu, start + escapes, 31);
  if (total > capacity) return total;

  // Pass 2: sign+mantissa chunks (16 bytes per lane each), code words, escape bytes.
  uint8_t* escape_slot = slot + shape.escape_offset();
  for (uint32_t i = static_cast<uint32_t>(lane) * 16; i < capacity; i += 32 * 16) {
    *reinterpret_cast<uint4*>(escape_slot + i) = make_uint4(0, 0, 0, 0);
  }
  __syncwarp();
#pragma unroll
  for (int chunk = 0; chunk < kQuads / 4; ++chunk) {
    uint32_t w[4];
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      w[j] = 0;
#pragma unroll
      for (int b = 0; b < kQuadSize; ++b) w[j] |= static_cast<uint32_t>(bf16_sign_mantissa(element(4 * chunk + j, b))) << (8 * b);
    }
    *reinterpret_cast<uint4*>(slot + sign_mantissa_offset(lane, 4 * chunk, 0)) = make_uint4(w[0], w[1], w[2], w[3]);
  }
  uint32_t words[kWords] = {};
  uint32_t at = start;
#pragma unroll
  for (int p = 0; p < kGroups; ++p) {
    const auto mode = static_cast<GroupMode>((tags >> (2 * p)) & 3u);
    uint32_t planes[5] = {0, 0, 0, 0, 0};
#pragma unroll
    for (int i = 0; i < kGroupSize; ++i) {
      const int quad = 2 * p + i / kQuadSize, byte = i % kQuadSize, ch = channel(quad, byte);
      const int base = mode == GroupMode::bits3 ? b3[ch] : mode == GroupMode::bits4 ? b4[ch] : 0;
      const uint32_t offset = static_cast<uint32_t>(bf16_exponent(element(quad, byte)) - base);
      const CodeBits where = code_bits(shape, quad);
      words[where.low_word] |= (offset & ((1u << where.low_bits) - 1)) << (8 * byte + where.low_shift);
      if (where.high_word >= 0) words[where.high_word] |= ((offset >> 2) & 1u) << (8 * byte + where.high_shift);
#pragma unroll
      for (int k = 0; k < 5; ++k) planes[k] |= ((offset >> (3 + k)) & 1u) << i;
    }
    const int n = escape_bytes_for(mode);
    for (int k = 0; k < n; ++k) escape_slot[at + k] = static_cast<uint8_t>(planes[k]);
    at += static_cast<uint32_t>(n);
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
  for (int d = 1; d < kLanesPerWord; d <<= 1) word |= __shfl_xor_sync(0xffffffffu, word, d);
  if (lane % kLanesPerWord == 0) {
    *reinterpret_cast<uint32_t*>(slot + shape.tag_offset() + 4 * (lane / kLanesPerWord)) = word;
  }
  return total;
}

}  // namespace gaac::cuda::lane
