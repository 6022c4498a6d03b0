// The scalar FP8 codec (the oracle): every byte pattern, adversarial tiles (all raw, every NaN and
// infinity, subnormals), exact sizes, seeded random tiles, rejection of malformed slots and of bad arguments.
#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <set>
#include <vector>

#include "gaac/error.hpp"
#include "gaac/fp8_codec.hpp"
#include "support/fp8_tile_data.hpp"

namespace gaac {
namespace {

using test::Fp8TileCase;
using test::fp8_bits;
using test::fp8_round_trip;
using test::uniform_fp8_tile;

/// The NaN and infinity encodings of a format: E4M3 S.1111.111; E5M2 S.11111.xx.
std::vector<uint8_t> specials(ElementFormat f) {
  if (f == ElementFormat::e4m3) return {0x7F, 0xFF};
  return {0x7C, 0x7D, 0x7E, 0x7F, 0xFC, 0xFD, 0xFE, 0xFF};
}

TEST(Fp8ScalarBackend, EveryBytePatternRoundTripsInEveryShape) {
  for (const Fp8TileShape shape : test::all_fp8_shapes()) {
    const int bases[][2] = {{0, 0}, {5, 3}, {fp8_max_base2(shape.format), fp8_max_base3(shape.format)}};
    for (const auto& b : bases) {
      Fp8TileCase tile = uniform_fp8_tile(shape, b[0], b[1]);
      test::fill_every_pattern(tile);
      ASSERT_EQ(std::set<uint8_t>(tile.elements.begin(), tile.elements.end()).size(), 256u);
      TileEncoding enc;
      const auto out = fp8_round_trip(tile, shape.max_slot_capacity(), Backend::scalar, &enc);
      ASSERT_TRUE(enc.fits) << to_string(shape.format) << " " << shape.tile.channels;
      ASSERT_EQ(out, tile.elements) << to_string(shape.format) << " " << shape.tile.channels << " b2 " << b[0];
    }
  }
}

TEST(Fp8ScalarBackend, AllRawTilesNeedMoreThanAnySlotHolds) {
  for (const Fp8TileShape shape : test::all_fp8_shapes()) {
    // Bases at the top, exponents 0 (zeros and subnormals): no window holds them, every group is raw.
    Fp8TileCase tile = uniform_fp8_tile(shape, fp8_max_base2(shape.format), fp8_max_base3(shape.format));
    for (size_t i = 0; i < tile.elements.size(); ++i) tile.elements[i] = fp8_bits(shape.format, int(i % 3 == 0), 0, int(i));
    TileEncoding enc;
    fp8_round_trip(tile, shape.max_slot_capacity(), Backend::scalar, &enc);
    EXPECT_FALSE(enc.fits);
    EXPECT_EQ(enc.groups_by_mode[static_cast<int>(Fp8GroupMode::raw)], static_cast<uint32_t>(shape.groups()));
    EXPECT_EQ(enc.escape_bytes, shape.max_escape_bytes());
    EXPECT_GT(shape.max_escape_bytes(), shape.max_slot_capacity());
  }
}

TEST(Fp8ScalarBackend, EveryNanAndInfinityEncodingRoundTrips) {
  for (const Fp8TileShape shape : test::all_fp8_shapes()) {
    const std::vector<uint8_t> special = specials(shape.format);
    // A tile of nothing but NaNs (and E5M2's infinities): the top exponent, held by windows at the top.
    Fp8TileCase tile = uniform_fp8_tile(shape, fp8_max_base2(shape.format), fp8_max_base3(shape.format));
    for (size_t i = 0; i < tile.elements.size(); ++i) tile.elements[i] = special[i % special.size()];
    TileEncoding enc;
    ASSERT_EQ(fp8_round_trip(tile, 0, Backend::scalar, &enc), tile.elements);
    EXPECT_EQ(enc.groups_by_mode[0], static_cast<uint32_t>(shape.groups()));
    // The same values among ordinary ones near the bottom: raw groups, still lossless.
    tile = uniform_fp8_tile(shape, 2, 0);
    for (size_t i = 0; i < tile.elements.size(); ++i) {
      tile.elements[i] = i % 64 < 8 ? special[i % special.size()] : fp8_bits(shape.format, int(i & 1), 2 + int(i % 4), int(i));
    }
    ASSERT_EQ(fp8_round_trip(tile, shape.max_slot_capacity(), Backend::scalar, &enc), tile.elements);
    EXPECT_GT(enc.groups_by_mode[static_cast<int>(Fp8GroupMode::raw)], 0u);
  }
}

TEST(Fp8ScalarBackend, SubnormalsAndZerosAreTwoBitGroupsAtBaseZero) {
  for (const Fp8TileShape shape : test::all_fp8_shapes()) {
    Fp8TileCase tile = uniform_fp8_tile(shape, 0, 0);
    const int mantissas = 1 << mantissa_bits(shape.format);
    for (size_t i = 0; i < tile.elements.size(); ++i) tile.elements[i] = fp8_bits(shape.format, int(i / mantissas % 2), 0, int(i));
    TileEncoding enc;
    ASSERT_EQ(fp8_round_trip(tile, 0, Backend::scalar, &enc), tile.elements);
    EXPECT_EQ(enc.groups_by_mode[0], static_cast<uint32_t>(shape.groups()));
    EXPECT_EQ(enc.escape_bytes, 0u);
  }
}

TEST(Fp8ScalarBackend, ModeChoiceAndExactSizes) {
  for (const Fp8TileShape shape : test::all_fp8_shapes()) {
    const auto groups = static_cast<uint32_t>(shape.groups());
    const int m = mantissa_bits(shape.format);
    // Offsets 0..3 from b2: every group 2-bit; 6.25 (E4M3) or 5.25 (E5M2) bits per element.
    Fp8TileCase tile = uniform_fp8_tile(shape, 4, 2);
    for (size_t i = 0; i < tile.elements.size(); ++i) tile.elements[i] = fp8_bits(shape.format, int(i & 1), 4 + int(i % 4), int(i));
    TileEncoding enc;
    EXPECT_EQ(fp8_round_trip(tile, 0, Backend::scalar, &enc), tile.elements);
    EXPECT_EQ(enc.groups_by_mode[0], groups);
    EXPECT_EQ(enc.escape_bytes, 0u);
    EXPECT_EQ(shape.slot_bytes(0) * 8 * 4, static_cast<size_t>(shape.elements()) * static_cast<size_t>(4 * (m + 1) + 8 + 1));

    // The first element of every group at exponent 2 (outside [4, 7], inside [2, 9]), the others at 6:
    // every group 3-bit, one escape byte each.
    for (int lane = 0; lane < kWarpLanes; ++lane) {
      for (int quad = 0; quad < shape.tile.quads_per_lane(); ++quad) {
        for (int b = 0; b < kQuadSize; ++b) {
          const ElementSlot at = element_slot(shape.tile, lane, quad, b);
          tile.at(at.token, at.channel) = fp8_bits(shape.format, b & 1, index_in_group(quad, b) == 0 ? 2 : 6, lane + quad);
        }
      }
    }
    EXPECT_EQ(fp8_round_trip(tile, shape.max_slot_capacity(), Backend::scalar, &enc), tile.elements);
    EXPECT_EQ(enc.groups_by_mode[1], groups);
    EXPECT_EQ(enc.escape_bytes, groups);

    // A single element outside both windows: one raw group of X − 2 escape bytes, the rest 2-bit.
    for (size_t i = 0; i < tile.elements.size(); ++i) tile.elements[i] = fp8_bits(shape.format, 1, 5, int(i));
    tile.at(3, 5) = fp8_bits(shape.format, 0, 12, 1);
    EXPECT_EQ(fp8_round_trip(tile, 16, Backend::scalar, &enc), tile.elements);
    EXPECT_EQ(enc.groups_by_mode[2], 1u);
    EXPECT_EQ(enc.escape_bytes, static_cast<uint32_t>(exponent_bits(shape.format) - 2));
  }
}

TEST(Fp8ScalarBackend, SeededRandomTilesRoundTrip) {
  std::mt19937_64 rng(8);
  for (const Fp8TileShape shape : test::all_fp8_shapes()) {
    for (int i = 0; i < 40; ++i) {
      const Fp8TileCase tile = test::random_fp8_tile(shape, rng, 0.3, 0.65);
      TileEncoding enc;
      const auto out = fp8_round_trip(tile, shape.max_slot_capacity(), Backend::scalar, &enc);
      ASSERT_TRUE(enc.fits);
      ASSERT_EQ(out, tile.elements);
      EXPECT_EQ(enc.groups_by_mode[0] + enc.groups_by_mode[1] + enc.groups_by_mode[2], static_cast<uint32_t>(shape.groups()));
      EXPECT_EQ(enc.escape_bytes, enc.groups_by_mode[1] + enc.groups_by_mode[2] * static_cast<uint32_t>(exponent_bits(shape.format) - 2));
    }
  }
}

/// A valid slot of a random tile with escapes (3-bit and raw groups), for the rejection tests.
std::vector<uint8_t> slot_with_escapes(const Fp8TileCase& tile, size_t capacity, TileEncoding& enc) {
  std::vector<uint8_t> slot(tile.shape.slot_bytes(capacity));
  enc = encode_fp8_tile(tile.shape, tile.elements.data(), static_cast<size_t>(tile.shape.tile.channels), tile.bases(),
                        capacity, slot, Backend::scalar);
  return slot;
}

TEST(Fp8ScalarBackend, RejectsInvalidTagsOverrunsAndNonzeroPadding) {
  std::mt19937_64 rng(3);
  for (const Fp8TileShape shape : test::all_fp8_shapes()) {
    const Fp8TileCase tile = test::random_fp8_tile(shape, rng, 0.5, 0.49);
    const size_t capacity = shape.max_slot_capacity();
    TileEncoding enc;
    const std::vector<uint8_t> good = slot_with_escapes(tile, capacity, enc);
    ASSERT_TRUE(enc.fits);
    ASSERT_LT(enc.escape_bytes, capacity);
    std::vector<uint8_t> out(tile.elements.size());
    const auto decode = [&](const std::vector<uint8_t>& slot) {
      return decode_fp8_tile(shape, slot, capacity, tile.bases(), out.data(), static_cast<size_t>(shape.tile.channels), Backend::scalar);
    };
    ASSERT_EQ(decode(good), DecodeStatus::ok);

    std::vector<uint8_t> bad = good;
    bad[shape.tag_offset() + 5] |= 0x0C;  // group 21's tag becomes 3
    EXPECT_EQ(decode(bad), DecodeStatus::invalid_tag);

    bad = good;
    std::memset(bad.data() + shape.tag_offset(), 0xAA, shape.tag_bytes());  // every group raw
    EXPECT_EQ(decode(bad), DecodeStatus::escape_overrun);

    bad = good;
    bad[shape.escape_offset() + capacity - 1] = 1;  // a padding byte
    EXPECT_EQ(decode(bad), DecodeStatus::nonzero_padding);
  }
}

TEST(Fp8ScalarBackend, EncodingIsDeterministicWithZeroPadding) {
  std::mt19937_64 rng(5);
  for (const Fp8TileShape shape : test::all_fp8_shapes()) {
    const Fp8TileCase tile = test::random_fp8_tile(shape, rng, 0.4, 0.55);
    TileEncoding enc;
    std::vector<uint8_t> a = slot_with_escapes(tile, shape.max_slot_capacity(), enc);
    std::vector<uint8_t> b(a.size(), 0xEE);
    encode_fp8_tile(shape, tile.elements.data(), static_cast<size_t>(shape.tile.channels), tile.bases(), shape.max_slot_capacity(), b,
                    Backend::scalar);
    EXPECT_EQ(a, b);
    for (size_t i = shape.escape_offset() + enc.escape_bytes; i < a.size(); ++i) ASSERT_EQ(a[i], 0) << i;
  }
}

TEST(Fp8TileCodec, RefusesBadArguments) {
  const Fp8TileShape shape{ElementFormat::e4m3, {TensorKind::key, 128}};
  Fp8TileCase tile = uniform_fp8_tile(shape, 12, 8);
  EXPECT_NO_THROW(Fp8TileCodec(shape, tile.bases(), 432));
  EXPECT_THROW(Fp8TileCodec(shape, tile.bases(), 448), Error);  // beyond the largest capacity
  EXPECT_THROW(Fp8TileCodec(shape, tile.bases(), 8), Error);    // not a multiple of 16
  EXPECT_THROW(Fp8TileCodec(Fp8TileShape{ElementFormat::bf16, shape.tile}, tile.bases(), 0), Error);
  EXPECT_THROW(Fp8TileCodec(Fp8TileShape{ElementFormat::e4m3, {TensorKind::key, 96}}, tile.bases(), 0), Error);
  tile.b2[7] = 13;  // b2 ≤ 12 for E4M3
  EXPECT_THROW(Fp8TileCodec(shape, tile.bases(), 0), Error);
  tile.b2[7] = 12;
  tile.b3[7] = 9;  // b3 ≤ 8
  EXPECT_THROW(Fp8TileCodec(shape, tile.bases(), 0), Error);
  // E5M2 allows them.
  EXPECT_NO_THROW(Fp8TileCodec(Fp8TileShape{ElementFormat::e5m2, shape.tile}, tile.bases(), 688));
  std::vector<uint8_t> small(shape.slot_bytes(0) - 1);
  EXPECT_THROW(encode_fp8_tile(shape, tile.elements.data(), 128, uniform_fp8_tile(shape, 0, 0).bases(), 0, small), Error);
}

}  // namespace
}  // namespace gaac
