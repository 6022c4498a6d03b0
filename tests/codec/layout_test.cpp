// The element order, code-bit placement and section offsets of gaac/format.hpp are bijections onto
// the tile and the slot: every element and every slot bit is used exactly once.
#include <gtest/gtest.h>

#include <set>
#include <vector>

#include "gaac/format.hpp"
#include "support/tile_data.hpp"

namespace gaac {
namespace {

TEST(Layout, SectionSizesMatchTheBitBudget) {
  const TileShape wide{TensorKind::key, 128};
  EXPECT_EQ(wide.sign_mantissa_bytes(), 2048u);
  EXPECT_EQ(wide.code_bytes(), 768u);
  EXPECT_EQ(wide.tag_bytes(), 64u);
  EXPECT_EQ(wide.fixed_bytes() * 8, static_cast<size_t>(wide.elements()) * (8 * 4 + 12 + 1) / 4);  // 11.25 bits
  const TileShape narrow{TensorKind::value, 64};
  EXPECT_EQ(narrow.fixed_bytes(), 1440u);
  for (const TileShape s : test::all_shapes()) {
    EXPECT_EQ(s.code_offset() % 16, 0u);
    EXPECT_EQ(s.tag_offset() % 16, 0u);
    EXPECT_EQ(s.escape_offset() % 16, 0u);
    EXPECT_LT(s.slot_bytes(s.max_slot_capacity()), s.raw_bytes());
    EXPECT_EQ(s.max_slot_capacity() % kSlotAlignment, 0u);
  }
}

TEST(Layout, ElementOrderCoversEveryElementOnce) {
  for (const TileShape s : test::all_shapes()) {
    std::set<std::pair<int, int>> seen;
    std::set<size_t> offsets;
    for (int lane = 0; lane < kWarpLanes; ++lane) {
      for (int q = 0; q < s.quads_per_lane(); ++q) {
        for (int b = 0; b < kQuadSize; ++b) {
          const ElementSlot at = element_slot(s, lane, q, b);
          ASSERT_LT(at.token, kTileTokens);
          ASSERT_LT(at.channel, s.channels);
          seen.insert({at.token, at.channel});
          offsets.insert(sign_mantissa_offset(lane, q, b));
        }
      }
    }
    EXPECT_EQ(seen.size(), static_cast<size_t>(s.elements()));
    EXPECT_EQ(offsets.size(), static_cast<size_t>(s.elements()));
    EXPECT_EQ(*offsets.rbegin(), s.sign_mantissa_bytes() - 1);
  }
}

TEST(Layout, QuadsAreMmaFragments) {
  // Lane 4g+t of a key tile holds token 8h+g and channels 16s + 2t + {0,8,1,9}: the bf16x2 registers
  // (bytes 0,2) and (bytes 1,3) are b0b1 and b2b3 of an m16n8k16 B operand.
  const TileShape k{TensorKind::key, 128};
  const ElementSlot a = element_slot(k, 4 * 3 + 2, 8 + 5, 0);  // g=3, t=2, h=1, s=5
  EXPECT_EQ(a.token, 11);
  EXPECT_EQ(a.channel, 16 * 5 + 4);
  EXPECT_EQ(element_slot(k, 14, 13, 2).channel, 16 * 5 + 5);
  EXPECT_EQ(element_slot(k, 14, 13, 1).channel, 16 * 5 + 12);
  const TileShape v{TensorKind::value, 64};
  const ElementSlot b = element_slot(v, 4 * 5 + 1, 3, 3);  // g=5, t=1, c=3
  EXPECT_EQ(b.channel, 29);
  EXPECT_EQ(b.token, 11);
}

TEST(Layout, GroupsAreOneTokenForKeysAndOneTokenQuartetPerChannelForValues) {
  for (const TileShape s : test::all_shapes()) {
    for (int lane = 0; lane < kWarpLanes; ++lane) {
      for (int pair = 0; pair < s.groups_per_lane(); ++pair) {
        std::set<int> tokens, channels;
        for (int i = 0; i < kGroupSize; ++i) {
          const ElementSlot at = element_slot(s, lane, 2 * pair + i / 4, i % 4);
          tokens.insert(at.token);
          channels.insert(at.channel);
        }
        if (s.kind == TensorKind::key) {
          EXPECT_EQ(tokens.size(), 1u);
          EXPECT_EQ(channels.size(), 8u);
        } else {
          EXPECT_EQ(tokens.size(), 4u);
          EXPECT_EQ(channels.size(), 2u);
        }
        EXPECT_EQ(group_index(s, lane, 2 * pair), group_index(s, lane, 2 * pair + 1));
      }
    }
  }
}

TEST(Layout, CodeBitsCoverTheCodeSectionExactly) {
  for (const TileShape s : test::all_shapes()) {
    std::vector<int> uses(s.code_bytes() * 8, 0);
    for (int lane = 0; lane < kWarpLanes; ++lane) {
      for (int q = 0; q < s.quads_per_lane(); ++q) {
        const CodeBits cb = code_bits(s, q);
        for (int b = 0; b < kQuadSize; ++b) {
          for (int bit = 0; bit < cb.low_bits; ++bit) {
            ++uses[code_word_offset(s, lane, cb.low_word) * 8 + 8 * b + cb.low_shift + bit];
          }
          if (cb.high_word >= 0) ++uses[code_word_offset(s, lane, cb.high_word) * 8 + 8 * b + cb.high_shift];
        }
      }
    }
    for (size_t i = 0; i < uses.size(); ++i) ASSERT_EQ(uses[i], 1) << "bit " << i << " channels " << s.channels;
  }
}

}  // namespace
}  // namespace gaac
