// The FP8 tile format's constants and layout functions (docs/format.md, section 14).
#include <gtest/gtest.h>

#include <set>
#include <utility>

#include "gaac/fp8_format.hpp"

namespace gaac {
namespace {

TEST(Fp8Format, FieldsSplitAndComposeForEveryPattern) {
  for (const ElementFormat f : {ElementFormat::e4m3, ElementFormat::e5m2}) {
    const int m = mantissa_bits(f);
    for (int x = 0; x < 256; ++x) {
      const auto byte = static_cast<uint8_t>(x);
      const uint8_t sm = fp8_sign_mantissa(byte, f);
      ASSERT_EQ(fp8_compose(sm, fp8_exponent(byte, f), f), byte) << to_string(f) << " " << x;
      ASSERT_EQ(sm >> m, x >> 7);                     // the sign
      ASSERT_EQ(sm & ((1 << m) - 1), x & ((1 << m) - 1));  // the mantissa
      ASSERT_EQ(fp8_exponent(byte, f), (x & 0x7F) >> m);
    }
  }
}

TEST(Fp8Format, SlotSizesAndOffsets) {
  for (const int c : {64, 128}) {
    const Fp8TileShape e4m3{ElementFormat::e4m3, {TensorKind::key, c}};
    const Fp8TileShape e5m2{ElementFormat::e5m2, {TensorKind::value, c}};
    EXPECT_EQ(e4m3.fixed_bytes() * 2, static_cast<size_t>(25 * c));  // 12.5·C
    EXPECT_EQ(e5m2.fixed_bytes() * 2, static_cast<size_t>(21 * c));  // 10.5·C
    EXPECT_EQ(e4m3.raw_bytes(), static_cast<size_t>(16 * c));
    EXPECT_EQ(e4m3.max_escape_bytes(), static_cast<size_t>(2 * c) * 2);
    EXPECT_EQ(e5m2.max_escape_bytes(), static_cast<size_t>(2 * c) * 3);
    for (const Fp8TileShape s : {e4m3, e5m2}) {
      EXPECT_LT(s.slot_bytes(s.max_slot_capacity()), s.raw_bytes());
      EXPECT_GE(s.slot_bytes(s.max_slot_capacity() + kSlotAlignment), s.raw_bytes());
      for (const size_t offset : {s.mantissa_offset(), s.code_offset(), s.tag_offset(), s.escape_offset()}) {
        EXPECT_EQ(offset % 16, 0u);
      }
    }
    EXPECT_EQ(e4m3.code_offset(), static_cast<size_t>(8 * c));
    EXPECT_EQ(e5m2.mantissa_offset(), static_cast<size_t>(2 * c));
    EXPECT_EQ(e5m2.code_offset(), static_cast<size_t>(6 * c));
  }
  EXPECT_EQ((Fp8TileShape{ElementFormat::e4m3, {TensorKind::key, 128}}.max_slot_capacity()), 432u);
  EXPECT_EQ((Fp8TileShape{ElementFormat::e4m3, {TensorKind::key, 64}}.max_slot_capacity()), 208u);
  EXPECT_EQ((Fp8TileShape{ElementFormat::e5m2, {TensorKind::key, 128}}.max_slot_capacity()), 688u);
  EXPECT_EQ((Fp8TileShape{ElementFormat::e5m2, {TensorKind::key, 64}}.max_slot_capacity()), 336u);
  EXPECT_EQ(fp8_max_base2(ElementFormat::e4m3), 12);
  EXPECT_EQ(fp8_max_base3(ElementFormat::e5m2), 24);
  EXPECT_EQ(fp8_escape_bytes_for(Fp8GroupMode::raw, ElementFormat::e4m3), 2);
  EXPECT_EQ(fp8_escape_bytes_for(Fp8GroupMode::raw, ElementFormat::e5m2), 3);
}

TEST(Fp8Format, EveryStreamIsABijectionOverItsBytes) {
  for (const int c : {64, 128}) {
    const int positions = 16 * c;
    for (const int bits : {1, 2, 4}) {
      std::set<std::pair<size_t, int>> seen;
      for (int p = 0; p < positions; ++p) {
        const StreamField f = stream_field(bits, p);
        ASSERT_LT(f.byte, static_cast<size_t>(positions * bits / 8));
        ASSERT_EQ(f.shift % bits, 0);
        ASSERT_LT(f.shift, 8);
        ASSERT_TRUE(seen.insert({f.byte, f.shift}).second) << bits << "-bit stream, position " << p;
        // 32 consecutive positions (a CPU register) share a shift and fill 32 consecutive bytes.
        const StreamField first = stream_field(bits, p / 32 * 32);
        ASSERT_EQ(f.shift, first.shift);
        ASSERT_EQ(f.byte, first.byte + static_cast<size_t>(p % 32));
      }
    }
  }
}

TEST(Fp8Format, EachLanesPositionsOfAChunkAreSixteenConsecutiveBytesOfEveryStream) {
  for (const int bits : {1, 2, 4}) {
    for (int chunk = 0; chunk < 4; ++chunk) {
      for (int lane = 0; lane < kWarpLanes; ++lane) {
        const StreamField first = stream_field(bits, fragment_position(lane, 4 * chunk, 0));
        for (int quad = 4 * chunk; quad < 4 * chunk + 4; ++quad) {
          for (int b = 0; b < kQuadSize; ++b) {
            const StreamField f = stream_field(bits, fragment_position(lane, quad, b));
            ASSERT_EQ(f.shift, first.shift);
            ASSERT_EQ(f.byte, first.byte + static_cast<size_t>((quad % 4) * 4 + b));
          }
        }
      }
    }
  }
}

}  // namespace
}  // namespace gaac
