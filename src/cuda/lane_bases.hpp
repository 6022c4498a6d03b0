// The calibrated bases of a compressed cache rearranged as the decode kernel's lanes read them: for
// each (layer, KV head), per half-head, four sections of base words (lane_decode.cuh, base_word) —
// key b3 (C/16 words per lane), key b4 − b3 (C/16), value b3 (C/8), value b4 − b3 (C/8); in a GAAC-FP8
// cache key b2, key b3, value b2, value b3 (lane_fp8.cuh selects one with a PRMT) — with word
// w of lane l at ((w / 4)·32 + l)·4 + w % 4 inside its section, so one 16-byte load gives a lane four
// consecutive words. Made once on the host when a cache is copied to the device; a CTA copies the
// block of its (layer, head) to shared memory as it is. Plain data and arithmetic: no device code.
#pragma once

#include <cstddef>
#include <cstdint>

#include "gaac/paged_layout.hpp"

namespace gaac::cuda::detail {

/// Words of one half-head's sections: 2·(C/16) key words and 2·(C/8) value words per lane.
GAAC_HOST_DEVICE constexpr uint32_t lane_base_words_per_half(int channels) {
  return 2u * static_cast<uint32_t>(channels / 16 + channels / 8) * 32u;
}
/// Words of one (layer, KV head): every half-head's sections.
GAAC_HOST_DEVICE constexpr uint32_t lane_base_words(int channels, int halves) {
  return static_cast<uint32_t>(halves) * lane_base_words_per_half(channels);
}
/// First word of (layer, head) in the array of a whole cache ([layers][kv_heads] blocks).
GAAC_HOST_DEVICE constexpr size_t lane_bases_index(const PagedGeometry& g, int layer, int head) {
  return (static_cast<size_t>(layer) * g.kv_heads + head) * lane_base_words(g.tile_channels(), g.halves());
}

/// Fills `out` (geometry.layers · kv_heads · lane_base_words words) from a cache's bases array
/// (docs/format.md, section 13). Host code.
void fill_lane_bases(const PagedGeometry& geometry, const uint8_t* bases, uint32_t* out);

}  // namespace gaac::cuda::detail
