// Every fast backend against the scalar backend: identical slot bytes, encodings, decoded values
// and decode statuses, on exhaustive, random, boundary and malformed inputs.
#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <string>
#include <vector>

#include "gaac/codec.hpp"
#include "support/tile_data.hpp"

namespace gaac {
namespace {

using test::bf16_bits;
using test::TileCase;
using test::uniform_bases_tile;

std::string describe(TileShape shape) {
  return std::string(shape.kind == TensorKind::key ? "key" : "value") + " " + std::to_string(shape.channels);
}

/// Every capacity a slot may have, from 0 to the largest.
std::vector<size_t> all_capacities(TileShape shape) {
  std::vector<size_t> capacities;
  for (size_t c = 0; c <= shape.max_slot_capacity(); c += kSlotAlignment) capacities.push_back(c);
  return capacities;
}

class Avx2Backend : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!backend_available(Backend::avx2)) GTEST_SKIP() << "AVX2 backend not available on this machine";
  }

  /// Encodes `tile` with both backends (source rows `stride` apart, junk between them) and checks
  /// the encodings and the slot bytes are identical; then decodes the slot with both backends into
  /// rows `stride` apart and checks statuses and every output element (junk between rows included)
  /// are identical. Returns the slot.
  std::vector<uint8_t> check(const TileCase& tile, size_t capacity, size_t stride, TileEncoding* encoding = nullptr) {
    const TileShape shape = tile.shape;
    const auto channels = static_cast<size_t>(shape.channels);
    std::vector<uint16_t> src(kTileTokens * stride, 0xBEEF);
    for (size_t t = 0; t < kTileTokens; ++t) {
      std::copy_n(tile.elements.begin() + static_cast<std::ptrdiff_t>(t * channels), channels,
                  src.begin() + static_cast<std::ptrdiff_t>(t * stride));
    }
    std::vector<uint8_t> expected(shape.slot_bytes(capacity), 0x5A);
    std::vector<uint8_t> actual(shape.slot_bytes(capacity), 0xA5);  // different junk: every byte must be written
    const TileEncoding want = encode_tile(shape, src.data(), stride, tile.bases(), capacity, expected, Backend::scalar);
    const TileEncoding got = encode_tile(shape, src.data(), stride, tile.bases(), capacity, actual, Backend::avx2);
    if (encoding) *encoding = want;
    EXPECT_EQ(got.groups_by_mode, want.groups_by_mode) << describe(shape) << ", capacity " << capacity;
    EXPECT_EQ(got.escape_bytes, want.escape_bytes) << describe(shape) << ", capacity " << capacity;
    EXPECT_EQ(got.fits, want.fits) << describe(shape) << ", capacity " << capacity;
    EXPECT_EQ(first_difference(actual, expected), -1) << describe(shape) << ", capacity " << capacity;
    check_decode(shape, expected, capacity, tile.bases(), stride);
    return expected;
  }

  /// Decodes `slot` with both backends and checks the statuses and, when ok, every output element.
  void check_decode(TileShape shape, const std::vector<uint8_t>& slot, size_t capacity, const TileBases& bases,
                    size_t stride) {
    std::vector<uint16_t> want(kTileTokens * stride + 7, 0x1234), got(kTileTokens * stride + 7, 0x1234);
    // Start one element in, so rows are not 32-byte aligned.
    const DecodeStatus want_status = decode_tile(shape, slot, capacity, bases, want.data() + 1, stride, Backend::scalar);
    const DecodeStatus got_status = decode_tile(shape, slot, capacity, bases, got.data() + 1, stride, Backend::avx2);
    ASSERT_EQ(got_status, want_status) << describe(shape) << ": avx2 says " << to_string(got_status)
                                       << ", scalar says " << to_string(want_status);
    if (want_status == DecodeStatus::ok) {
      ASSERT_EQ(first_difference(got, want), -1) << describe(shape) << ", stride " << stride;
    }
  }

  template <class T>
  static long first_difference(const std::vector<T>& a, const std::vector<T>& b) {
    if (a.size() != b.size()) return 0;
    const auto [ia, ib] = std::mismatch(a.begin(), a.end(), b.begin());
    return ia == a.end() ? -1 : static_cast<long>(ia - a.begin());
  }
};

TEST_F(Avx2Backend, EveryBf16PatternInEveryShape) {
  // As ScalarBackend.EveryBf16PatternRoundTripsInEveryShape: every pattern (±0, subnormals, ±Inf, NaN
  // payloads) in every other group, the rest inside the 3-bit window, bases at both ends and the middle.
  const int base_pairs[][2] = {{0, 0}, {120, 116}, {kMaxBase3, kMaxBase4}};
  for (const TileShape shape : test::all_shapes()) {
    for (const auto& bp : base_pairs) {
      TileCase tile = uniform_bases_tile(shape, bp[0], bp[1]);
      for (uint32_t next = 0; next < 65536;) {
        next = test::fill_pattern_tile(tile, next);
        check(tile, shape.max_slot_capacity(), static_cast<size_t>(shape.channels));
        if (HasFatalFailure() || HasNonfatalFailure()) return;
      }
    }
  }
}

TEST_F(Avx2Backend, EveryBf16PatternAsAWholeTile) {
  // The same patterns packed densely (every element), so most groups are raw and rarely fit.
  for (const TileShape shape : test::all_shapes()) {
    TileCase tile = uniform_bases_tile(shape, 120, 116);
    for (uint32_t next = 0; next < 65536;) {
      for (auto& x : tile.elements) x = static_cast<uint16_t>(next++);
      for (const size_t capacity : {size_t{0}, size_t{64}, shape.max_slot_capacity()}) {
        check(tile, capacity, static_cast<size_t>(shape.channels));
      }
      if (HasFailure()) return;
    }
  }
}

TEST_F(Avx2Backend, SeededRandomTilesAtSeveralModeMixes) {
  struct Mix {
    double p3, p4;
  };
  const Mix mixes[] = {{1.0, 0.0}, {0.0, 1.0}, {0.9, 0.09}, {0.97, 0.03}, {0.7, 0.2}, {0.5, 0.3}, {0.0, 0.0}};
  std::mt19937_64 rng(20240611);
  for (const TileShape shape : test::all_shapes()) {
    const std::vector<size_t> capacities = all_capacities(shape);
    for (const Mix& mix : mixes) {
      for (int i = 0; i < 40; ++i) {
        const TileCase tile = test::random_tile(shape, rng, mix.p3, mix.p4);
        const size_t capacity = capacities[rng() % capacities.size()];
        check(tile, capacity, static_cast<size_t>(shape.channels));
        check(tile, shape.max_slot_capacity(), static_cast<size_t>(shape.channels));
        if (HasFailure()) return;
      }
    }
  }
}

TEST_F(Avx2Backend, ModesAreChosenPerGroupAtEveryPosition) {
  // One group at a time forced to 4-bit or raw, everything else 3-bit: every group position, both modes.
  for (const TileShape shape : test::all_shapes()) {
    TileCase tile = uniform_bases_tile(shape, 100, 96);
    for (int lane = 0; lane < kWarpLanes; ++lane) {
      for (int pair = 0; pair < shape.groups_per_lane(); ++pair) {
        for (const int exponent : {110, 3}) {  // 110: 4-bit; 3: raw
          for (auto& x : tile.elements) x = bf16_bits(1, 103, 0x2A);
          const ElementSlot at = element_slot(shape, lane, 2 * pair + 1, 2);
          tile.elements[static_cast<size_t>(at.token) * shape.channels + at.channel] = bf16_bits(0, exponent, 0x11);
          TileEncoding enc;
          check(tile, 16, static_cast<size_t>(shape.channels), &enc);
          EXPECT_EQ(enc.groups_by_mode[0], static_cast<uint32_t>(shape.groups() - 1));
          if (HasFailure()) return;
        }
      }
    }
  }
}

TEST_F(Avx2Backend, BasesAtBothEndsOfTheirRange) {
  std::mt19937_64 rng(5);
  for (const TileShape shape : test::all_shapes()) {
    for (int round = 0; round < 20; ++round) {
      TileCase tile = uniform_bases_tile(shape, 0, 0);
      for (int c = 0; c < shape.channels; ++c) {
        const bool high = rng() & 1;
        tile.b3[c] = static_cast<uint8_t>(high ? kMaxBase3 : 0);
        tile.b4[c] = static_cast<uint8_t>(rng() & 1 ? kMaxBase4 : 0);
      }
      for (int t = 0; t < kTileTokens; ++t) {
        for (int c = 0; c < shape.channels; ++c) {
          // Mostly the 3-bit window, sometimes the 4-bit window, sometimes anywhere (0, 255, ...).
          const uint64_t r = rng() % 16;
          const int e = r < 12   ? tile.b3[c] + int(rng() % 8)
                        : r < 14 ? tile.b4[c] + int(rng() % 16)
                        : r < 15 ? int(rng() % 2) * 255
                                 : int(rng() % 256);
          tile.elements[static_cast<size_t>(t) * shape.channels + c] = bf16_bits(int(rng() & 1), e, int(rng() & 0x7F));
        }
      }
      check(tile, shape.max_slot_capacity(), static_cast<size_t>(shape.channels));
      check(tile, 0, static_cast<size_t>(shape.channels));
      if (HasFailure()) return;
    }
  }
}

TEST_F(Avx2Backend, EscapeSlotExactlyFullAndOneByteOver) {
  for (const TileShape shape : test::all_shapes()) {
    for (const int filled : {16, 48}) {
      TileCase tile = uniform_bases_tile(shape, 100, 96);
      for (auto& x : tile.elements) x = bf16_bits(0, 101, 1);
      // The first `filled` groups in group order become 4-bit: exactly `filled` escape bytes.
      int made = 0;
      for (int lane = 0; lane < kWarpLanes && made < filled; ++lane) {
        for (int pair = 0; pair < shape.groups_per_lane() && made < filled; ++pair, ++made) {
          const ElementSlot at = element_slot(shape, lane, 2 * pair, 0);
          tile.elements[static_cast<size_t>(at.token) * shape.channels + at.channel] = bf16_bits(0, 110, 1);
        }
      }
      const auto capacity = static_cast<size_t>(filled);
      TileEncoding enc;
      check(tile, capacity, static_cast<size_t>(shape.channels), &enc);
      EXPECT_TRUE(enc.fits);
      EXPECT_EQ(enc.escape_bytes, static_cast<uint32_t>(filled));
      // One more 4-bit group, the last one: one byte over.
      const ElementSlot last = element_slot(shape, kWarpLanes - 1, shape.quads_per_lane() - 1, 3);
      tile.elements[static_cast<size_t>(last.token) * shape.channels + last.channel] = bf16_bits(0, 110, 1);
      check(tile, capacity, static_cast<size_t>(shape.channels), &enc);
      EXPECT_FALSE(enc.fits);
      EXPECT_EQ(enc.escape_bytes, static_cast<uint32_t>(filled + 1));
      // A raw group instead: five bytes over, the slot still written up to its capacity.
      tile.elements[static_cast<size_t>(last.token) * shape.channels + last.channel] = bf16_bits(0, 7, 1);
      check(tile, capacity, static_cast<size_t>(shape.channels), &enc);
      EXPECT_EQ(enc.escape_bytes, static_cast<uint32_t>(filled + 5));
    }
  }
}

TEST_F(Avx2Backend, RowStridesLargerThanTheWidth) {
  std::mt19937_64 rng(99);
  for (const TileShape shape : test::all_shapes()) {
    const auto channels = static_cast<size_t>(shape.channels);
    for (const size_t stride : {channels + 1, channels + 7, channels + 16, 2 * channels + 3, 4 * channels}) {
      for (int i = 0; i < 5; ++i) {
        const TileCase tile = test::random_tile(shape, rng, 0.85, 0.13);
        check(tile, shape.max_slot_capacity(), stride);
        if (HasFailure()) return;
      }
    }
  }
}

class Avx2Malformed : public Avx2Backend {
 protected:
  /// A valid slot of a random tile with some 4-bit and raw groups.
  std::vector<uint8_t> valid_slot(TileShape shape, std::mt19937_64& rng, size_t capacity, TileCase& tile) {
    tile = test::random_tile(shape, rng, 0.8, 0.17);
    return check(tile, capacity, static_cast<size_t>(shape.channels));
  }
};

TEST_F(Avx2Malformed, RandomByteFlips) {
  std::mt19937_64 rng(11);
  for (const TileShape shape : test::all_shapes()) {
    const size_t capacity = shape.max_slot_capacity();
    for (int round = 0; round < 300; ++round) {
      TileCase tile;
      std::vector<uint8_t> slot = valid_slot(shape, rng, capacity, tile);
      const int flips = 1 + int(rng() % 4);
      for (int f = 0; f < flips; ++f) {
        // Bias towards the tags and escapes, where the statuses come from.
        const size_t begin = rng() % 2 ? shape.tag_offset() : 0;
        const size_t at = begin + rng() % (slot.size() - begin);
        slot[at] ^= static_cast<uint8_t>(1u << (rng() % 8));
      }
      check_decode(shape, slot, capacity, tile.bases(), static_cast<size_t>(shape.channels));
      if (HasFailure()) return;
    }
  }
}

TEST_F(Avx2Malformed, RandomTagsAndEscapes) {
  // Random tags (any of 0..3 with various odds) over random escape bytes: the first problem in group
  // order decides the status, whichever kind it is.
  std::mt19937_64 rng(12);
  for (const TileShape shape : test::all_shapes()) {
    const std::vector<size_t> capacities = all_capacities(shape);
    for (int round = 0; round < 400; ++round) {
      const size_t capacity = capacities[rng() % capacities.size()];
      std::vector<uint8_t> slot(shape.slot_bytes(capacity));
      for (auto& b : slot) b = static_cast<uint8_t>(rng());
      const uint64_t odds = rng() % 64;  // per-mille-ish weights
      for (int g = 0; g < shape.groups(); ++g) {
        const uint64_t r = rng() % 1024;
        const unsigned tag = r < 700 ? 0u : r < 1000 - odds ? 1u : r < 1023 - odds / 8 ? 2u : 3u;
        uint8_t& byte = slot[shape.tag_offset() + static_cast<size_t>(g) / 4];
        byte = static_cast<uint8_t>((byte & ~(3u << (2 * (g % 4)))) | tag << (2 * (g % 4)));
      }
      if (rng() % 2) std::fill(slot.begin() + static_cast<std::ptrdiff_t>(shape.escape_offset()), slot.end(), 0);
      const TileCase tile = test::random_tile(shape, rng, 0.9, 0.09);
      check_decode(shape, slot, capacity, tile.bases(), static_cast<size_t>(shape.channels));
      if (HasFailure()) return;
    }
  }
}

TEST_F(Avx2Malformed, InvalidTagAtEveryGroup) {
  std::mt19937_64 rng(13);
  for (const TileShape shape : test::all_shapes()) {
    TileCase tile;
    const std::vector<uint8_t> valid = valid_slot(shape, rng, shape.max_slot_capacity(), tile);
    for (int g = 0; g < shape.groups(); ++g) {
      std::vector<uint8_t> slot = valid;
      slot[shape.tag_offset() + static_cast<size_t>(g) / 4] |= static_cast<uint8_t>(3u << (2 * (g % 4)));
      check_decode(shape, slot, shape.max_slot_capacity(), tile.bases(), static_cast<size_t>(shape.channels));
      if (HasFailure()) return;
    }
  }
}

TEST_F(Avx2Malformed, EscapeOverrunAndInvalidTagPrecedence) {
  std::mt19937_64 rng(14);
  for (const TileShape shape : test::all_shapes()) {
    TileCase tile;
    const size_t capacity = 64;
    std::vector<uint8_t> valid = valid_slot(shape, rng, shape.max_slot_capacity(), tile);
    valid.resize(shape.slot_bytes(capacity));
    for (int raw_groups : {12, 13, 14, 40}) {  // 13 raw groups need 65 bytes: one over
      for (const int bad : {-1, 5, 12, 13, 100}) {
        std::vector<uint8_t> slot = valid;
        for (size_t i = 0; i < shape.tag_bytes(); ++i) slot[shape.tag_offset() + i] = 0;
        for (int g = 0; g < raw_groups; ++g) slot[shape.tag_offset() + static_cast<size_t>(g) / 4] |= static_cast<uint8_t>(2u << (2 * (g % 4)));
        if (bad >= 0) slot[shape.tag_offset() + static_cast<size_t>(bad) / 4] |= static_cast<uint8_t>(3u << (2 * (bad % 4)));
        std::fill(slot.begin() + static_cast<std::ptrdiff_t>(shape.escape_offset()), slot.end(), 0);
        check_decode(shape, slot, capacity, tile.bases(), static_cast<size_t>(shape.channels));
        if (HasFailure()) return;
      }
    }
    // Every group raw: overrun at the slot's first group past the capacity.
    std::vector<uint8_t> slot = valid;
    for (size_t i = 0; i < shape.tag_bytes(); ++i) slot[shape.tag_offset() + i] = 0xAA;
    check_decode(shape, slot, capacity, tile.bases(), static_cast<size_t>(shape.channels));
  }
}

TEST_F(Avx2Malformed, NonzeroPaddingAtEveryPosition) {
  std::mt19937_64 rng(15);
  for (const TileShape shape : test::all_shapes()) {
    TileCase tile;
    TileEncoding enc;
    const size_t capacity = shape.max_slot_capacity();
    tile = test::random_tile(shape, rng, 0.95, 0.05);
    const std::vector<uint8_t> valid = check(tile, capacity, static_cast<size_t>(shape.channels), &enc);
    ASSERT_TRUE(enc.fits);
    ASSERT_LT(enc.escape_bytes, capacity);
    for (size_t i = 0; i < capacity; ++i) {
      std::vector<uint8_t> slot = valid;
      slot[shape.escape_offset() + i] ^= 0x40;  // an escape byte changed (decodes), or padding (rejected)
      check_decode(shape, slot, capacity, tile.bases(), static_cast<size_t>(shape.channels));
      if (HasFailure()) return;
    }
  }
}

}  // namespace
}  // namespace gaac
