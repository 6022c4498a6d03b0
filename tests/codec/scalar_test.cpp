// The scalar codec backend: exhaustive and adversarial round trips, exact sizes, and rejection of
// malformed slots.
#include <gtest/gtest.h>

#include <random>
#include <vector>

#include "gaac/codec.hpp"
#include "gaac/error.hpp"
#include "support/tile_data.hpp"

namespace gaac {
namespace {

using test::bf16_bits;
using test::TileCase;
using test::uniform_bases_tile;

TEST(ScalarBackend, Bf16FieldsSplitAndComposeForEveryPattern) {
  for (uint32_t x = 0; x < 65536; ++x) {
    const auto bits = static_cast<uint16_t>(x);
    ASSERT_EQ(bf16_compose(bf16_sign_mantissa(bits), bf16_exponent(bits)), bits);
  }
}

TEST(ScalarBackend, EveryBf16PatternRoundTripsInEveryShape) {
  // All 65,536 patterns (±0, subnormals, ±Inf, every NaN payload) pass through tiles, one pattern in
  // every other group (so the escapes of the raw groups they force still fit), the other elements
  // inside the 3-bit window; bases at both ends of their range and in the middle.
  const int base_pairs[][2] = {{0, 0}, {120, 116}, {kMaxBase3, kMaxBase4}};
  for (const TileShape shape : test::all_shapes()) {
    for (const auto& bp : base_pairs) {
      TileCase tile = uniform_bases_tile(shape, bp[0], bp[1]);
      for (uint32_t next = 0; next < 65536;) {
        next = test::fill_pattern_tile(tile, next);
        TileEncoding enc;
        const auto out = test::round_trip(tile, shape.max_slot_capacity(), Backend::scalar, &enc);
        ASSERT_TRUE(enc.fits);
        ASSERT_EQ(out, tile.elements) << "patterns before " << next << ", channels " << shape.channels;
      }
    }
  }
}

TEST(ScalarBackend, SeededRandomTilesRoundTrip) {
  std::mt19937_64 rng(42);
  for (const TileShape shape : test::all_shapes()) {
    for (int i = 0; i < 50; ++i) {
      const TileCase tile = test::random_tile(shape, rng, 0.9, 0.09);
      TileEncoding enc;
      const auto out = test::round_trip(tile, shape.max_slot_capacity(), Backend::scalar, &enc);
      ASSERT_TRUE(enc.fits);
      ASSERT_EQ(out, tile.elements);
    }
  }
}

TEST(ScalarBackend, ModeChoiceAndExactSizes) {
  for (const TileShape shape : test::all_shapes()) {
    const int groups = shape.groups();
    // All offsets 0..7 from b3: every group 3-bit, no escapes; 11.25 bits per element.
    TileCase tile = uniform_bases_tile(shape, 100, 90);
    for (size_t i = 0; i < tile.elements.size(); ++i) tile.elements[i] = bf16_bits(int(i & 1), 100 + int(i % 8), int(i));
    TileEncoding enc;
    EXPECT_EQ(test::round_trip(tile, 0, Backend::scalar, &enc), tile.elements);
    EXPECT_EQ(enc.groups_by_mode[0], static_cast<uint32_t>(groups));
    EXPECT_EQ(enc.escape_bytes, 0u);
    EXPECT_EQ(shape.slot_bytes(0) * 8, static_cast<size_t>(shape.elements()) * 45 / 4);

    // Exponent 90 + (channel mod 16): every group holds a channel below 10 mod 16, outside [100,107]
    // but inside [90,105]: every group 4-bit, one escape byte each.
    for (auto& x : tile.elements) x = bf16_bits(0, 90 + int(&x - tile.elements.data()) % 16, 3);
    EXPECT_EQ(test::round_trip(tile, shape.max_slot_capacity(), Backend::scalar, &enc), tile.elements);
    EXPECT_EQ(enc.groups_by_mode[1], static_cast<uint32_t>(groups));
    EXPECT_EQ(enc.escape_bytes, static_cast<uint32_t>(groups));

    // Exponents far from both windows: every group raw, five escape bytes each.
    for (auto& x : tile.elements) x = bf16_bits(1, 250, 0x55);
    EXPECT_EQ(test::round_trip(tile, shape.max_slot_capacity(), Backend::scalar, &enc).size(), tile.elements.size());
    EXPECT_EQ(enc.groups_by_mode[2], static_cast<uint32_t>(groups));
    EXPECT_EQ(enc.escape_bytes, static_cast<uint32_t>(5 * groups));
    EXPECT_FALSE(enc.fits);  // 5 bytes per group never fits: the tile is stored raw
  }
}

TEST(ScalarBackend, EscapeSlotExactlyFullAndOneByteOver) {
  for (const TileShape shape : test::all_shapes()) {
    TileCase tile = uniform_bases_tile(shape, 100, 96);
    for (auto& x : tile.elements) x = bf16_bits(0, 101, 1);
    // Make the first 16 groups (in group order) 4-bit: 16 escape bytes exactly fill a 16-byte slot.
    int made = 0;
    for (int lane = 0; lane < kWarpLanes && made < 16; ++lane) {
      for (int pair = 0; pair < shape.groups_per_lane() && made < 16; ++pair, ++made) {
        const ElementSlot at = element_slot(shape, lane, 2 * pair, 0);
        tile.elements[static_cast<size_t>(at.token) * shape.channels + at.channel] = bf16_bits(0, 110, 1);
      }
    }
    TileEncoding enc;
    EXPECT_EQ(test::round_trip(tile, 16, Backend::scalar, &enc), tile.elements);
    EXPECT_TRUE(enc.fits);
    EXPECT_EQ(enc.escape_bytes, 16u);
    // One more 4-bit group: 17 bytes do not fit 16.
    const ElementSlot at = element_slot(shape, kWarpLanes - 1, shape.quads_per_lane() - 1, 3);
    tile.elements[static_cast<size_t>(at.token) * shape.channels + at.channel] = bf16_bits(0, 110, 1);
    test::round_trip(tile, 16, Backend::scalar, &enc);
    EXPECT_FALSE(enc.fits);
    EXPECT_EQ(enc.escape_bytes, 17u);
  }
}

TEST(ScalarBackend, PerChannelBasesAreHonoured) {
  for (const TileShape shape : test::all_shapes()) {
    TileCase tile = uniform_bases_tile(shape, 0, 0);
    for (int c = 0; c < shape.channels; ++c) {
      tile.b3[c] = static_cast<uint8_t>(c % 2 ? kMaxBase3 : 0);
      tile.b4[c] = static_cast<uint8_t>(c % 2 ? kMaxBase4 : 0);
    }
    for (int t = 0; t < kTileTokens; ++t) {
      for (int c = 0; c < shape.channels; ++c) {
        tile.elements[static_cast<size_t>(t) * shape.channels + c] = bf16_bits(t & 1, (c % 2 ? 255 - t % 8 : t % 8), c);
      }
    }
    TileEncoding enc;
    EXPECT_EQ(test::round_trip(tile, 0, Backend::scalar, &enc), tile.elements);
    EXPECT_EQ(enc.groups_by_mode[0], static_cast<uint32_t>(shape.groups()));
  }
}

class MalformedSlot : public ::testing::Test {
 protected:
  void encode(TileShape s) {
    shape = s;
    std::mt19937_64 rng(7);
    tile = test::random_tile(shape, rng, 0.8, 0.18);
    capacity = shape.max_slot_capacity();
    slot.assign(shape.slot_bytes(capacity), 0);
    const TileEncoding enc = encode_tile(shape, tile.elements.data(), static_cast<size_t>(shape.channels), tile.bases(),
                                         capacity, slot, Backend::scalar);
    ASSERT_TRUE(enc.fits);
    escape_bytes = enc.escape_bytes;
  }
  DecodeStatus decode() {
    out.assign(tile.elements.size(), 0);
    return decode_tile(shape, slot, capacity, tile.bases(), out.data(), static_cast<size_t>(shape.channels),
                       Backend::scalar);
  }
  TileShape shape;
  TileCase tile;
  size_t capacity = 0;
  uint32_t escape_bytes = 0;
  std::vector<uint8_t> slot;
  std::vector<uint16_t> out;
};

TEST_F(MalformedSlot, InvalidTagIsRejected) {
  for (const TileShape s : test::all_shapes()) {
    encode(s);
    slot[shape.tag_offset() + 5] |= 0x0C;  // group 22 gets tag 3
    EXPECT_EQ(decode(), DecodeStatus::invalid_tag);
  }
}

TEST_F(MalformedSlot, EscapeOverrunIsRejected) {
  for (const TileShape s : test::all_shapes()) {
    encode(s);
    for (size_t i = 0; i < shape.tag_bytes(); ++i) slot[shape.tag_offset() + i] = 0xAA;  // every group raw
    EXPECT_EQ(decode(), DecodeStatus::escape_overrun);
  }
}

TEST_F(MalformedSlot, NonzeroPaddingIsRejected) {
  for (const TileShape s : test::all_shapes()) {
    encode(s);
    ASSERT_LT(escape_bytes, capacity);
    slot[shape.escape_offset() + capacity - 1] = 1;
    EXPECT_EQ(decode(), DecodeStatus::nonzero_padding);
  }
}

TEST(ScalarBackend, BadArgumentsThrow) {
  const TileShape odd{TensorKind::key, 96};
  std::vector<uint16_t> src(16 * 128);
  std::vector<uint8_t> bases(128, 100), slot(4096);
  EXPECT_THROW(encode_tile(odd, src.data(), 128, {bases, bases}, 0, slot), Error);
  const TileShape shape{TensorKind::key, 128};
  EXPECT_THROW(encode_tile(shape, src.data(), 128, {bases, bases}, 8, slot), Error);  // capacity not ×16
  std::vector<uint8_t> high(128, kMaxBase3 + 1);
  EXPECT_THROW(encode_tile(shape, src.data(), 128, {high, bases}, 0, slot), Error);
  std::vector<uint8_t> small(100);
  EXPECT_THROW(encode_tile(shape, src.data(), 128, {bases, bases}, 0, small), Error);
}

}  // namespace
}  // namespace gaac
