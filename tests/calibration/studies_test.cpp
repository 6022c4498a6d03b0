// The mode-scheme and escape-drift studies agree with the codec's own accounting (gaac::measure).
#include "gaac/studies.hpp"

#include <gtest/gtest.h>

#include "gaac/error.hpp"
#include "gaac/stats.hpp"
#include "gaac/synthetic.hpp"
#include "gaac/tiling.hpp"

namespace gaac {
namespace {

KvDump synthetic(int tokens, int head_dim, uint64_t seed) {
  SyntheticKvSpec spec;
  spec.layers = 3;
  spec.kv_heads = 2;
  spec.head_dim = head_dim;
  spec.tokens = tokens;
  spec.seed = seed;
  return make_synthetic_kv(spec);
}

TEST(Studies, GaacSchemeReproducesTheCodecsModeSplit) {
  for (const int head_dim : {64, 128, 256}) {
    const KvDump calib = synthetic(200, head_dim, 1), eval = synthetic(300, head_dim, 2);
    const KvDump* dumps[] = {&calib};
    const DumpStats stats = measure(eval, calibrate(dumps));
    const ModeScheme gaac_scheme{"3+4+raw", {3, 4}};
    const auto results = compare_mode_schemes(dumps, eval, std::span(&gaac_scheme, 1));
    ASSERT_EQ(results.size(), 1u);
    ASSERT_EQ(results[0].fractions.size(), 3u);
    EXPECT_DOUBLE_EQ(results[0].fractions[0], stats.total.mode_fraction(GroupMode::bits3)) << head_dim;
    EXPECT_DOUBLE_EQ(results[0].fractions[1], stats.total.mode_fraction(GroupMode::bits4)) << head_dim;
    EXPECT_DOUBLE_EQ(results[0].fractions[2], stats.total.mode_fraction(GroupMode::raw)) << head_dim;
    // The stream's bits: 11.25 per element for 3-bit groups, one escape byte per 4-bit group, five per raw one.
    const double bits = 8.25 + 3 * results[0].fractions[0] + 4 * results[0].fractions[1] + 8 * results[0].fractions[2];
    EXPECT_DOUBLE_EQ(results[0].bits_per_element, bits);
  }
}

TEST(Studies, MoreModesNeverStoreMore) {
  const KvDump calib = synthetic(160, 128, 3), eval = synthetic(160, 128, 4);
  const KvDump* dumps[] = {&calib};
  const auto schemes = paper_mode_schemes();
  const auto r = compare_mode_schemes(dumps, eval, schemes);
  ASSERT_EQ(r.size(), 3u);
  EXPECT_EQ(r[0].scheme.name, "2+3+4+raw");
  EXPECT_GE(r[0].ratio, r[1].ratio);
  EXPECT_GE(r[1].ratio, r[2].ratio);
  for (const auto& s : r) {
    double sum = 0;
    for (double f : s.fractions) sum += f;
    EXPECT_NEAR(sum, 1.0, 1e-12) << s.scheme.name;
  }
}

TEST(Studies, SegmentEscapesAddUpToTheCodecsEscapeBytes) {
  const KvDump dump = synthetic(16 * 21 + 5, 256, 5);  // 21 complete blocks and a tail
  const KvDump* dumps[] = {&dump};
  const CalibrationTable table = calibrate(dumps);
  const DumpStats stats = measure(dump, table);
  const auto segments = escape_bytes_by_segment(dump, table, 64);
  ASSERT_EQ(segments.size(), 6u);  // 4 blocks per segment: 5 full segments and one of 1 block
  EXPECT_EQ(segments.back().first_token, 320);
  EXPECT_EQ(segments.back().end_token, 336);
  const int tiles_per_block = tiles_per_head(256);
  double k_total = 0, v_total = 0;
  for (const auto& s : segments) {
    const int blocks = (s.end_token - s.first_token) / kTileTokens;
    for (double m : s.mean_escape_bytes[0]) k_total += m * blocks * tiles_per_block;
    for (double m : s.mean_escape_bytes[1]) v_total += m * blocks * tiles_per_block;
  }
  EXPECT_NEAR(k_total, static_cast<double>(stats.k_total.escape_bytes), 1e-6);
  EXPECT_NEAR(v_total, static_cast<double>(stats.v_total.escape_bytes), 1e-6);
}

TEST(Studies, RejectsBadArguments) {
  const KvDump dump = synthetic(64, 64, 6);
  const KvDump* dumps[] = {&dump};
  const CalibrationTable table = calibrate(dumps);
  EXPECT_THROW(escape_bytes_by_segment(dump, table, 24), Error);
  EXPECT_THROW(escape_bytes_by_segment(dump, table, 0), Error);
  const KvDump other = synthetic(64, 128, 7);
  const auto schemes = paper_mode_schemes();
  EXPECT_THROW(compare_mode_schemes(dumps, other, schemes), Error);
  EXPECT_THROW(compare_mode_schemes({}, dump, schemes), Error);
  const ModeScheme unsorted{"4+3", {4, 3}};
  EXPECT_THROW(compare_mode_schemes(dumps, dump, std::span(&unsorted, 1)), Error);
}

}  // namespace
}  // namespace gaac
