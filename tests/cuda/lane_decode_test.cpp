// The GPU's per-lane slot decoder (src/cuda/lane_decode.cuh) run on the host, lane by lane, against
// the reference codec: every element of every register must be the tile's own BF16 value. It needs
// no GPU, so the bit manipulation the kernels use is checked on every machine.
#include <gtest/gtest.h>

#include <random>
#include <vector>

#include "cuda/lane_decode.cuh"
#include "gaac/codec.hpp"
#include "support/tile_data.hpp"

namespace gaac {
namespace {

using namespace gaac::cuda::lane;

/// Decodes `slot` the way a warp does (lane by lane, the escape offsets by an exclusive scan, every
/// lane on the escape path `Path`) and returns the tile row-major; `fixed_lanes` counts lanes that
/// take the wide-group path.
template <int C, EscapePath Path>
std::vector<uint16_t> decode_on_path(TileShape shape, const std::vector<uint8_t>& slot, const TileBases& bases,
                                     int* fixed_lanes, int* single_raw_lanes) {
  using S = SlotShape<C>;
  const bool key = shape.kind == TensorKind::key;
  LaneSlot<C> lanes[kWarpLanes];
  uint32_t offset[kWarpLanes];
  uint32_t running = 0;
  for (int lane = 0; lane < kWarpLanes; ++lane) {
    load_lane_slot<C>(slot.data(), lane, lanes[lane]);
    offset[lane] = running;
    running += escape_bytes_of_lane(lanes[lane].tags);
  }
  std::vector<uint16_t> out(static_cast<size_t>(shape.elements()));
  std::vector<uint8_t> b3(bases.b3.begin(), bases.b3.end()), b4(bases.b4.begin(), bases.b4.end());
  for (int lane = 0; lane < kWarpLanes; ++lane) {
    uint32_t base3w[S::kQuads], deltaw[S::kQuads], exponents[S::kQuads];
    const int words = key ? kBaseWords<C, true> : kBaseWords<C, false>;
    for (int w = 0; w < words; ++w) {
      const uint32_t w3 = key ? base_word<C, true>(b3.data(), lane, w) : base_word<C, false>(b3.data(), lane, w);
      const uint32_t w4 = key ? base_word<C, true>(b4.data(), lane, w) : base_word<C, false>(b4.data(), lane, w);
      base3w[w] = w3;
      deltaw[w] = w4 - w3;
    }
    const uint8_t* escapes = slot.data() + S::kEscapeOffset;
    const auto base3_at = [&](int w) { return base3w[w]; };
    if (key) lane_exponents<C, true, Path>(lanes[lane], escapes, offset[lane], base3w, deltaw, base3_at, exponents);
    else lane_exponents<C, false, Path>(lanes[lane], escapes, offset[lane], base3w, deltaw, base3_at, exponents);
    *fixed_lanes += lane_needs_fixing<C>(lanes[lane].tags) ? 1 : 0;
    *single_raw_lanes += !lane_needs_fixing<C>(lanes[lane].tags) && popc(lanes[lane].tags & S::kHighTagBits) == 1 ? 1 : 0;
    for (int q = 0; q < S::kQuads; ++q) {
      uint32_t r[2];
      compose(lanes[lane].sm[q], exponents[q], r[0], r[1]);
      for (int byte = 0; byte < 4; ++byte) {
        const ElementSlot at = element_slot(shape, lane, q, byte);
        const uint16_t value = static_cast<uint16_t>(r[byte % 2] >> (16 * (byte / 2)));
        out[static_cast<size_t>(at.token) * shape.channels + at.channel] = value;
      }
    }
  }
  return out;
}

/// Decodes `slot` as the kernels do: on the branch-free path when no lane needs fixing, and always on
/// the wide path too (both must give the same values); returns the tile row-major.
template <int C>
std::vector<uint16_t> decode_like_a_warp(TileShape shape, const std::vector<uint8_t>& slot, const TileBases& bases,
                                         int* fixed_lanes, int* single_raw_lanes) {
  bool any_wide = false;
  for (int lane = 0; lane < kWarpLanes; ++lane) {
    LaneSlot<C> s;
    load_lane_slot<C>(slot.data(), lane, s);
    any_wide |= lane_needs_fixing<C>(s.tags);
  }
  const std::vector<uint16_t> wide = decode_on_path<C, EscapePath::wide>(shape, slot, bases, fixed_lanes, single_raw_lanes);
  int f = 0, r = 0;
  if (!any_wide) {
    EXPECT_TRUE((decode_on_path<C, EscapePath::branch_free>(shape, slot, bases, &f, &r) == wide)) << "branch-free path differs";
  }
  return wide;
}

std::vector<uint16_t> decode_like_a_warp(TileShape shape, const std::vector<uint8_t>& slot, const TileBases& bases,
                                         int* fixed_lanes, int* single_raw_lanes = nullptr) {
  int ignored = 0;
  if (!single_raw_lanes) single_raw_lanes = &ignored;
  return shape.channels == 128 ? decode_like_a_warp<128>(shape, slot, bases, fixed_lanes, single_raw_lanes)
                               : decode_like_a_warp<64>(shape, slot, bases, fixed_lanes, single_raw_lanes);
}

/// Encodes `tile` with the largest capacity (plus 16 bytes of padding the GPU reads past the slot).
std::vector<uint8_t> encode(const test::TileCase& tile, size_t* escape_bytes = nullptr) {
  const size_t cap = tile.shape.max_slot_capacity();
  std::vector<uint8_t> slot(tile.shape.slot_bytes(cap) + 16, 0xA5);
  const TileEncoding enc = encode_tile(tile.shape, tile.elements.data(), static_cast<size_t>(tile.shape.channels),
                                       tile.bases(), cap, std::span<uint8_t>(slot.data(), tile.shape.slot_bytes(cap)));
  EXPECT_TRUE(enc.fits);
  if (escape_bytes) *escape_bytes = enc.escape_bytes;
  return slot;
}

TEST(LaneDecode, RandomTilesOfEveryModeMix) {
  std::mt19937_64 rng(91);
  // (p3, p4): all 3-bit; the real mix; many 4-bit groups; some raw groups; everything wide.
  const double mixes[][2] = {{1.0, 0.0}, {0.985, 0.0145}, {0.9, 0.1}, {0.96, 0.03}, {0.6, 0.395}, {0.89, 0.104},
                             {0.85, 0.13}};
  int fixed = 0, single_raw = 0;
  for (const TileShape shape : test::all_shapes()) {
    for (const auto& mix : mixes) {
      for (int rep = 0; rep < 60; ++rep) {
        test::TileCase tile = test::random_tile(shape, rng, mix[0], mix[1]);
        size_t escape_bytes = 0;
        const std::vector<uint8_t> slot = encode(tile, &escape_bytes);
        if (escape_bytes > shape.max_slot_capacity()) continue;
        const std::vector<uint16_t> got = decode_like_a_warp(shape, slot, tile.bases(), &fixed, &single_raw);
        ASSERT_EQ(got, tile.elements) << "channels " << shape.channels << " kind " << int(shape.kind) << " mix "
                                      << mix[0] << " rep " << rep;
      }
    }
  }
  EXPECT_GT(fixed, 0) << "no lane took the wide-group path: the test does not cover it";
  EXPECT_GT(single_raw, 0) << "no lane had exactly one raw group: the test does not cover it";
}

TEST(LaneDecode, EveryBf16Pattern) {
  // fill_pattern_tile places raw-mode patterns in every other group: all 65,536 bit patterns pass
  // through the raw path of some lane, the others through 3-bit codes.
  for (const TileShape shape : test::all_shapes()) {
    uint32_t next = 0;
    while (next < 65536) {
      test::TileCase tile = test::uniform_bases_tile(shape, 120, 116);
      next = test::fill_pattern_tile(tile, next);
      int fixed = 0;
      const std::vector<uint8_t> slot = encode(tile);
      ASSERT_EQ(decode_like_a_warp(shape, slot, tile.bases(), &fixed), tile.elements) << "patterns before " << next;
    }
  }
}

TEST(LaneDecode, FourBitGroupsAtEveryRank) {
  // Lanes with 0..8 four-bit groups in every position: ranks 0..3 take the branch-free path,
  // more than four 4-bit groups the fixing path.
  for (const TileShape shape : test::all_shapes()) {
    std::mt19937_64 rng(5);
    for (int rep = 0; rep < 200; ++rep) {
      test::TileCase tile = test::uniform_bases_tile(shape, 120, 112);
      const uint32_t wide_groups = static_cast<uint32_t>(rng());
      for (int lane = 0; lane < kWarpLanes; ++lane) {
        for (int q = 0; q < shape.quads_per_lane(); ++q) {
          const int group = group_index(shape, lane, q);
          const bool wide = (wide_groups >> (group % 32)) & 1u;
          for (int byte = 0; byte < 4; ++byte) {
            const ElementSlot at = element_slot(shape, lane, q, byte);
            // Inside the 4-bit window [112, 127] but below the 3-bit one [120, 127] when wide.
            const int e = wide ? 112 + static_cast<int>(rng() % 16) : 120 + static_cast<int>(rng() % 8);
            tile.elements[static_cast<size_t>(at.token) * shape.channels + at.channel] =
                test::bf16_bits(static_cast<int>(rng() & 1), e, static_cast<int>(rng() & 0x7F));
          }
        }
      }
      size_t escape_bytes = 0;
      const std::vector<uint8_t> slot = encode(tile, &escape_bytes);
      if (escape_bytes > shape.max_slot_capacity()) continue;
      int fixed = 0;
      ASSERT_EQ(decode_like_a_warp(shape, slot, tile.bases(), &fixed), tile.elements) << "rep " << rep;
    }
  }
}

TEST(LaneDecode, OneRawGroupBesideFourBitGroups) {
  // Every lane: one raw group at a random position and up to three 4-bit groups around it (the
  // branch-free raw path), or up to five 4-bit groups with a raw one (the fixing path).
  for (const TileShape shape : test::all_shapes()) {
    std::mt19937_64 rng(17);
    const int groups = shape.groups_per_lane();
    for (int rep = 0; rep < 300; ++rep) {
      test::TileCase tile = test::uniform_bases_tile(shape, 120, 112);
      for (int lane = 0; lane < kWarpLanes; ++lane) {
        const int raw_group = static_cast<int>(rng() % static_cast<uint64_t>(groups));
        const int fours = static_cast<int>(rng() % (rep % 2 ? 6 : 4));
        uint32_t four_mask = 0;
        for (int k = 0; k < fours; ++k) four_mask |= 1u << (rng() % static_cast<uint64_t>(groups));
        four_mask &= ~(1u << raw_group);
        for (int q = 0; q < shape.quads_per_lane(); ++q) {
          const int p = q / 2;
          for (int byte = 0; byte < 4; ++byte) {
            const ElementSlot at = element_slot(shape, lane, q, byte);
            int e = 120 + static_cast<int>(rng() % 8);
            if (p == raw_group) e = static_cast<int>(rng() % 256);
            else if (four_mask >> p & 1u) e = 112 + static_cast<int>(rng() % 16);
            tile.elements[static_cast<size_t>(at.token) * shape.channels + at.channel] =
                test::bf16_bits(static_cast<int>(rng() & 1), e, static_cast<int>(rng() & 0x7F));
          }
        }
      }
      size_t escape_bytes = 0;
      const std::vector<uint8_t> slot = encode(tile, &escape_bytes);
      if (escape_bytes > shape.max_slot_capacity()) continue;
      int fixed = 0;
      ASSERT_EQ(decode_like_a_warp(shape, slot, tile.bases(), &fixed), tile.elements) << "rep " << rep;
    }
  }
}

}  // namespace
}  // namespace gaac
