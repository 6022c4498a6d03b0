// Capacity estimates against real fills: exact for BF16 caches, close for GAAC caches, and GAAC
// holding more than BF16 in the same budget.
#include <gtest/gtest.h>

#include "gaac/capacity.hpp"
#include "gaac/error.hpp"
#include "gaac/synthetic.hpp"

namespace gaac {
namespace {

struct Sample {
  KvDump dump;
  CalibrationTable table;
  CacheGeometry geometry;

  Sample(int head_dim, std::vector<int> windows) {
    SyntheticKvSpec spec;
    spec.layers = static_cast<int>(windows.size());
    spec.kv_heads = 2;
    spec.head_dim = head_dim;
    spec.tokens = 600;
    spec.seed = 3;
    dump = make_synthetic_kv(spec);
    const KvDump* dumps[] = {&dump};
    table = calibrate(dumps);
    geometry = {spec.layers, 2, head_dim, std::move(windows)};
  }
};

TEST(Capacity, Bf16EstimatesAreExact) {
  for (const auto& windows : {std::vector<int>{0, 0}, std::vector<int>{64, 0}}) {
    const Sample s(128, windows);
    for (const uint64_t budget : {uint64_t{2} << 20, uint64_t{9} << 20}) {
      for (const int tokens : {40, 200, 1000}) {
        const CapacityEstimate e = estimate_capacity(s.geometry, CacheFormat::bf16, nullptr, budget, tokens);
        const CapacityMeasurement m = measure_capacity(s.geometry, CacheFormat::bf16, nullptr, budget, tokens, s.dump);
        EXPECT_EQ(e.max_sequences, m.sequences) << budget << " bytes, " << tokens << " tokens";
      }
      const CapacityEstimate one = estimate_capacity(s.geometry, CacheFormat::bf16, nullptr, budget, 1);
      EXPECT_EQ(measure_capacity(s.geometry, CacheFormat::bf16, nullptr, budget, static_cast<int>(one.max_tokens), s.dump).sequences, 1);
      EXPECT_EQ(measure_capacity(s.geometry, CacheFormat::bf16, nullptr, budget, static_cast<int>(one.max_tokens) + 16, s.dump).sequences, 0);
    }
  }
}

TEST(Capacity, GaacEstimatesAreCloseAndHoldMoreThanBf16) {
  for (const int head_dim : {64, 256}) {
    const Sample s(head_dim, {0, 48, 0});
    const uint64_t budget = uint64_t{12} << 20;
    for (const int tokens : {300, 2000}) {
      const CapacityEstimate g = estimate_capacity(s.geometry, CacheFormat::gaac, &s.table, budget, tokens);
      const CapacityEstimate b = estimate_capacity(s.geometry, CacheFormat::bf16, nullptr, budget, tokens);
      const CapacityMeasurement m = measure_capacity(s.geometry, CacheFormat::gaac, &s.table, budget, tokens, s.dump);
      EXPECT_NEAR(static_cast<double>(g.max_sequences), static_cast<double>(m.sequences), 0.06 * static_cast<double>(m.sequences) + 1)
          << "head_dim " << head_dim << ", " << tokens << " tokens";
      EXPECT_GT(g.max_sequences, b.max_sequences);
      EXPECT_LT(g.bytes_per_token, b.bytes_per_token);
    }
  }
}

TEST(Capacity, RejectsBadArguments) {
  const Sample s(64, {0});
  EXPECT_THROW(estimate_capacity(s.geometry, CacheFormat::bf16, nullptr, 1 << 20, 0), Error);
  EXPECT_THROW(estimate_capacity(s.geometry, CacheFormat::gaac, nullptr, 1 << 20, 10), Error);
}

}  // namespace
}  // namespace gaac
