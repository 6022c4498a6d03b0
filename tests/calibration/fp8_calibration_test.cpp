// Calibration, statistics and studies of FP8 dumps: windows inside the format's range, FP8 tables on disk,
// tables and dumps of different formats refused, exact byte counts, and the mode-scheme study agreeing
// with the codec's own accounting.
#include <gtest/gtest.h>

#include <cmath>

#include "gaac/calibration.hpp"
#include "gaac/error.hpp"
#include "gaac/fp8_codec.hpp"
#include "gaac/stats.hpp"
#include "gaac/studies.hpp"
#include "gaac/synthetic.hpp"
#include "support/temp_dir.hpp"

namespace gaac {
namespace {

Fp8KvDump fp8_dump(ElementFormat format, int head_dim, int tokens, uint64_t seed) {
  return convert_to_fp8(make_synthetic_kv({.layers = 2, .kv_heads = 2, .head_dim = head_dim, .tokens = tokens, .seed = seed}), format,
                        Fp8Scaling::per_tensor);
}

CalibrationTable calibrated(const Fp8KvDump& dump) {
  const Fp8KvDump* dumps[] = {&dump};
  return calibrate(std::span<const Fp8KvDump* const>(dumps));
}

TEST(Fp8Calibration, TablesRoundTripOnDiskAndKeepTheirFormat) {
  test::TempDir dir;
  for (const ElementFormat f : {ElementFormat::e4m3, ElementFormat::e5m2}) {
    const Fp8KvDump dump = fp8_dump(f, 256, 80, 3);
    const CalibrationTable table = calibrated(dump);
    EXPECT_EQ(table.element_format(), f);
    for (const TensorKind kind : {TensorKind::key, TensorKind::value}) {
      for (int l = 0; l < 2; ++l) {
        EXPECT_LE(table.escape_capacity(kind, l), (Fp8TileShape{f, {kind, 128}}.max_slot_capacity()));
        for (int h = 0; h < 2; ++h) {
          for (const uint8_t b : table.narrow(kind, l, h)) ASSERT_LE(b, fp8_max_base2(f));
          for (const uint8_t b : table.wide(kind, l, h)) ASSERT_LE(b, fp8_max_base3(f));
        }
      }
    }
    save_calibration(table, dir.file("t.safetensors"));
    const CalibrationTable back = load_calibration(dir.file("t.safetensors"));
    EXPECT_EQ(back.element_format(), f);
    for (const TensorKind kind : {TensorKind::key, TensorKind::value}) {
      for (int l = 0; l < 2; ++l) {
        EXPECT_EQ(back.escape_capacity(kind, l), table.escape_capacity(kind, l));
        for (int h = 0; h < 2; ++h) {
          EXPECT_TRUE(std::ranges::equal(back.narrow(kind, l, h), table.narrow(kind, l, h)));
          EXPECT_TRUE(std::ranges::equal(back.wide(kind, l, h), table.wide(kind, l, h)));
        }
      }
    }
    // BF16 names, BF16 dumps and the other FP8 format are refused.
    EXPECT_THROW((void)table.b3(TensorKind::key, 0, 0), Error);
    EXPECT_THROW((void)table.tile_bases(TensorKind::key, 0, 0, 0), Error);
    EXPECT_THROW(table.check_matches(make_synthetic_kv({.layers = 2, .kv_heads = 2, .head_dim = 256, .tokens = 1, .seed = 1})), Error);
    EXPECT_THROW(table.check_matches(fp8_dump(f == ElementFormat::e4m3 ? ElementFormat::e5m2 : ElementFormat::e4m3, 256, 16, 1)), Error);
    EXPECT_THROW(CalibratedCodecs{table}, Error);
  }
}

TEST(Fp8Calibration, WindowsStayInsideTheExponentRange) {
  // Every K value of layer 0 at the largest E4M3 exponent: the windows end there.
  Fp8KvDump dump = fp8_dump(ElementFormat::e4m3, 64, 32, 9);
  for (auto& x : dump.layers[0].k.data) x = static_cast<uint8_t>(0x78 | (x & 0x87));  // exponent 15
  const CalibrationTable table = calibrated(dump);
  for (const uint8_t b : table.narrow(TensorKind::key, 0, 0)) EXPECT_EQ(b, 12);
  for (const uint8_t b : table.wide(TensorKind::key, 0, 0)) EXPECT_EQ(b, 8);
}

TEST(Fp8Stats, CountExactlyWhatTheCodecStoresAndAgreeWithTheSchemeStudy) {
  for (const ElementFormat f : {ElementFormat::e4m3, ElementFormat::e5m2}) {
    for (const int head_dim : {64, 256}) {
      const Fp8KvDump dump = fp8_dump(f, head_dim, 96, 11);  // whole blocks: no tail
      const CalibrationTable table = calibrated(dump);
      const DumpStats stats = measure(dump, table);
      // The codec's bytes, tile by tile, with the scalar oracle.
      const Fp8CalibratedCodecs codecs(table, Fp8TileShape{f, tile_shape_for(TensorKind::key, head_dim)}.max_slot_capacity(), Backend::scalar);
      uint64_t packed = 0, groups = 0;
      for (size_t l = 0; l < dump.layers.size(); ++l) {
        for (const TensorKind kind : {TensorKind::key, TensorKind::value}) {
          const Fp8TileShape shape{f, tile_shape_for(kind, head_dim)};
          encode_each_tile(view_of(dump.layers[l].of(kind)), codecs.tensor_codecs(kind, static_cast<int>(l)),
                           [&](size_t, TilePosition, const TileEncoding& e, auto) {
                             packed += shape.fixed_bytes() + e.escape_bytes;
                             groups += static_cast<uint64_t>(shape.groups());
                           });
        }
      }
      EXPECT_EQ(stats.total.codec_bytes, packed);
      EXPECT_EQ(stats.total.groups[0] + stats.total.groups[1] + stats.total.groups[2], groups);
      EXPECT_EQ(stats.total.source_bytes(), dump.fp8_bytes());
      EXPECT_DOUBLE_EQ(stats.total.ratio_vs_bf16(), 2 * stats.total.ratio());
      // The study's 2+3+raw scheme, with windows chosen the same way, is the codec's stream bit for bit.
      const Fp8KvDump* dumps[] = {&dump};
      const ModeScheme scheme{"2+3+raw", {2, 3}};
      const auto results = compare_mode_schemes(std::span<const Fp8KvDump* const>(dumps), dump, std::span(&scheme, 1));
      EXPECT_NEAR(results[0].bits_per_element, stats.total.bits_per_element(), 1e-9);
      EXPECT_NEAR(results[0].fractions[2], stats.total.mode_fraction(GroupMode::raw), 1e-12);
    }
  }
}

TEST(Fp8Studies, RefuseWidthsOfTheWholeExponent) {
  const Fp8KvDump dump = fp8_dump(ElementFormat::e4m3, 64, 32, 2);
  const Fp8KvDump* dumps[] = {&dump};
  const ModeScheme too_wide{"2+4+raw", {2, 4}};
  EXPECT_THROW(compare_mode_schemes(std::span<const Fp8KvDump* const>(dumps), dump, std::span(&too_wide, 1)), Error);
  const auto all = fp8_mode_schemes(ElementFormat::e5m2);
  EXPECT_NO_THROW(compare_mode_schemes(std::span<const Fp8KvDump* const>(dumps), dump, fp8_mode_schemes(ElementFormat::e4m3)));
  EXPECT_FALSE(all.empty());
  EXPECT_THROW(fp8_mode_schemes(ElementFormat::bf16), Error);
}

}  // namespace
}  // namespace gaac
