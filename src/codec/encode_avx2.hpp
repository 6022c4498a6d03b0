// The AVX2 encoders' parts that are the same for BF16 (codec_avx2.cpp) and FP8 (fp8_avx2.cpp): each
// group's mode from its offsets in the two windows, then tags and escape planes written group by group
// from the offsets and modes the vector pass left.
#pragma once

#if defined(__AVX2__)

#include <immintrin.h>

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "codec/decode_avx2.hpp"
#include "gaac/codec.hpp"

namespace gaac::avx2 {
// Internal linkage, as decode_avx2.hpp's parts have (their including files are built with different flags).
namespace {

/// Chooses the modes of the four groups of fragment register v (lanes 2p, 2p + 1, groups 2c, 2c + 1 of
/// each, v = 16c + p) and returns every element's offset in its group's mode: `narrow` (and `wide`) are
/// the exponents minus the narrow (wide) window's bases, in the window when at most `narrow_max`
/// (`wide_max`) as unsigned bytes; raw groups keep `exponent`. The modes (0 narrow, 1 wide, 2 raw) go to
/// `modes`, one byte per group in group order.
template <class G>
inline __m256i choose_modes(int v, __m256i exponent, __m256i narrow, __m256i wide, __m256i narrow_max, __m256i wide_max,
                            uint8_t* modes) {
  const __m256i in_narrow = _mm256_cmpeq_epi8(_mm256_min_epu8(narrow, narrow_max), narrow);
  const __m256i in_wide = _mm256_cmpeq_epi8(_mm256_min_epu8(wide, wide_max), wide);
  // A group (a qword) is in a window when all eight of its bytes are.
  const __m256i ones = _mm256_set1_epi8(-1);
  const __m256i group_narrow = _mm256_cmpeq_epi64(in_narrow, ones), group_wide = _mm256_cmpeq_epi64(in_wide, ones);
  const auto not_narrow = ~static_cast<unsigned>(_mm256_movemask_pd(_mm256_castsi256_pd(group_narrow))) & 15u;
  const auto raw = not_narrow & ~static_cast<unsigned>(_mm256_movemask_pd(_mm256_castsi256_pd(group_wide)));
  const uint32_t mode_bytes = _pdep_u32(not_narrow, 0x01010101u) + _pdep_u32(raw, 0x01010101u);  // 0, 1 or 2 per group
  // The four groups are (lane 2p, k), (2p, k+1), (2p+1, k), (2p+1, k+1) with k = 2·chunk.
  const int lane = 2 * (v % 16), k = 2 * (v / 16);
  store_u16(modes + lane * G::kGroupsPerLane + k, static_cast<uint16_t>(mode_bytes));
  store_u16(modes + (lane + 1) * G::kGroupsPerLane + k, static_cast<uint16_t>(mode_bytes >> 16));
  return _mm256_blendv_epi8(_mm256_blendv_epi8(exponent, wide, group_wide), narrow, group_narrow);
}

/// Writes the tags of every group and, in group order, the escape planes of the groups that have
/// them. `offsets` holds one byte per element in fragment order (raw groups: the exponent), `modes` one
/// per group (0, 1 or 2) in group order; G is the shape's Geometry. Plane k of a group holds bit
/// CodeBits + k of its eight offsets; `planes_of(mode)` gives how many planes a group of `mode` has.
/// Escapes past `capacity` are counted, not written; the bytes after the last plane are zeroed.
template <class G, int CodeBits, class PlanesOf>
TileEncoding write_tags_and_escapes(const uint8_t* offsets, const uint8_t* modes, size_t capacity, uint8_t* tags,
                                    uint8_t* escapes, PlanesOf planes_of) {
  TileEncoding result;
  size_t used = 0;
  for (int g0 = 0; g0 < G::kGroups; g0 += 8) {
    const uint64_t eight = load_u64(modes + g0);
    store_u16(tags + g0 / 4, static_cast<uint16_t>(_pext_u64(eight, 0x0303030303030303ull)));
    // Only groups with escapes (mode not 0) need a visit: the loop steps over the nonzero mode bytes.
    for (uint64_t pending = eight; pending != 0; pending &= ~(0xFFull << (__builtin_ctzll(pending) & ~7))) {
      const int i = __builtin_ctzll(pending) / 8;
      const int mode = modes[g0 + i];
      ++result.groups_by_mode[mode];
      const uint64_t offset = load_u64(offsets + G::group_offset(g0 + i));
      const int planes = planes_of(mode);
      for (int k = 0; k < planes; ++k, ++used) {
        if (used < capacity) escapes[used] = static_cast<uint8_t>(_pext_u64(offset, (kByteBit0 << CodeBits) << k));
      }
    }
  }
  if (used < capacity) std::memset(escapes + used, 0, capacity - used);
  result.groups_by_mode[0] = G::kGroups - result.groups_by_mode[1] - result.groups_by_mode[2];
  result.escape_bytes = static_cast<uint32_t>(used);
  result.fits = used <= capacity;
  return result;
}

}  // namespace
}  // namespace gaac::avx2

#endif
