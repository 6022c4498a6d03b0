// A compressed tile rebuilt as BF16 rows in shared memory by one warp, from its lane parts and its
// escape bytes: what decompression (decompress.cu) and KV chunk objects (chunk.cu) share. Device code.
#pragma once

#include <cstdint>

#include "cuda/lane_decode.cuh"
#include "cuda/warp.cuh"
#include "gaac/format.hpp"

namespace gaac::cuda {

/// Elements per row of a tile rebuilt in shared memory: 8 more than its channels, so that the rows
/// the lanes of a warp write at once (eight tokens for keys, tokens 2 apart for values) start in
/// different banks (v3 wrote rows C apart: 8-way conflicts on keys, 4-way on values).
template <int C>
inline constexpr int kRow = C + 8;

/// Rebuilds a compressed tile whose lane part `s` is loaded and whose escape bytes are at `escapes`
/// into `tile` (16 rows of C BF16, kRow<C> elements apart, shared memory). `words3` and `deltas` are
/// the tile's sections of the cache's lane bases (lane_bases.hpp): b3 words and b4 − b3 words, four
/// of a lane's words in each 16-byte load.
template <int C, bool Key>
__device__ void decode_tile_to_rows(const lane::LaneSlot<C>& s, const uint8_t* escapes, const uint32_t* words3,
                                    const uint32_t* deltas, int lane, uint16_t* tile) {
  using S = lane::SlotShape<C>;
  constexpr int kWords = lane::kBaseWords<C, Key>;
  const uint32_t offset = detail::warp_exclusive_scan(lane::escape_bytes_of_lane(s.tags), lane);
  uint32_t w3[kWords], dl[kWords];
#pragma unroll
  for (int w = 0; w < kWords; w += 4) {
    const uint4 a = reinterpret_cast<const uint4*>(words3)[(w / 4) * 32 + lane];
    const uint4 b = reinterpret_cast<const uint4*>(deltas)[(w / 4) * 32 + lane];
    w3[w] = a.x, w3[w + 1] = a.y, w3[w + 2] = a.z, w3[w + 3] = a.w;
    dl[w] = b.x, dl[w + 1] = b.y, dl[w + 2] = b.z, dl[w + 3] = b.w;
  }
  uint32_t exponents[S::kQuads];
  const auto base3_at = [&](int w) { return words3[((w / 4) * 32 + lane) * 4 + w % 4]; };  // rare: raw groups
  lane::lane_exponents<C, Key, lane::EscapePath::wide>(s, escapes, offset, w3, dl, base3_at, exponents);
  const int g = lane / 4, t = lane % 4;
#pragma unroll
  for (int q = 0; q < S::kQuads; ++q) {
    uint32_t r0, r1;
    lane::compose(s.sm[q], exponents[q], r0, r1);
    if (Key) {
      // Quad h·(C/16) + s: token 8h + g, channels 16s + 2t + {0, 1} (r0) and + {8, 9} (r1).
      const int token = 8 * (q / (C / 16)) + g, channel = 16 * (q % (C / 16)) + 2 * t;
      *reinterpret_cast<uint32_t*>(tile + token * kRow<C> + channel) = r0;
      *reinterpret_cast<uint32_t*>(tile + token * kRow<C> + channel + 8) = r1;
    } else {
      // Quad c: channel 8c + g, tokens 2t, 2t+1 (r0) and 2t+8, 2t+9 (r1).
      const int channel = 8 * q + g;
      tile[(2 * t) * kRow<C> + channel] = static_cast<uint16_t>(r0);
      tile[(2 * t + 1) * kRow<C> + channel] = static_cast<uint16_t>(r0 >> 16);
      tile[(2 * t + 8) * kRow<C> + channel] = static_cast<uint16_t>(r1);
      tile[(2 * t + 9) * kRow<C> + channel] = static_cast<uint16_t>(r1 >> 16);
    }
  }
}

}  // namespace gaac::cuda
