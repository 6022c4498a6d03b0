// Budgets: the budget a refused append names is exactly the smallest that takes it, an append far
// beyond the budget is refused before anything is encoded, least_budget and worst_case_budget bracket
// what a cache needs and refuse sizes past 2^64, and a cache's pool is reserved, not committed.
#include <gtest/gtest.h>

#include <cstdio>
#include <random>
#include <string>
#include <unistd.h>
#include <vector>

#include "gaac/calibration.hpp"
#include "gaac/error.hpp"
#include "gaac/kv_cache.hpp"
#include "gaac/synthetic.hpp"

namespace gaac {
namespace {

constexpr int kLayers = 2, kHeads = 2, kDim = 64;

/// A source of K/V rows (synthetic, some values far outside the windows so that some tiles stay raw)
/// and the calibration learnt on the clean ones.
struct Source {
  KvDump kv;
  CalibrationTable table;

  explicit Source(int tokens) {
    SyntheticKvSpec spec;
    spec.layers = kLayers, spec.kv_heads = kHeads, spec.head_dim = kDim, spec.tokens = tokens, spec.seed = 3;
    kv = make_synthetic_kv(spec);
    const KvDump* dumps[] = {&kv};
    table = calibrate(dumps);
    std::mt19937_64 rng(4);
    for (KvLayer& l : kv.layers) {
      for (uint16_t& x : l.k.data) {
        if (rng() % 200 == 0) x = static_cast<uint16_t>((x & 0x807F) | (0xFE << 7));
      }
    }
  }

  CacheConfig config(CacheFormat format, uint64_t budget, std::vector<int> windows = {}) const {
    CacheConfig c;
    c.geometry = {kLayers, kHeads, kDim, std::move(windows)};
    c.format = format;
    c.budget_bytes = budget;
    c.calibration = &table;
    return c;
  }

  /// Appends tokens first .. first+count-1 of the source to `id`.
  AppendOutcome append(KvCache& cache, SequenceId id, int first, int count) const {
    std::vector<KvView> k, v;
    for (const KvLayer& l : kv.layers) {
      k.push_back(view_of(l.k).tokens_from(first, count));
      v.push_back(view_of(l.v).tokens_from(first, count));
    }
    return cache.append(id, k, v);
  }
};

/// The appends of a run: a prefill of `prefill` tokens, then one token at a time.
struct Appends {
  int prefill;
  /// Appends until the budget runs out or the source ends; returns the failed append's outcome (or
  /// an ok one) and how many appends succeeded.
  AppendOutcome play(const Source& s, const CacheConfig& config, int limit, int& succeeded) const {
    KvCache cache(config);
    const SequenceId id = cache.add_sequence();
    succeeded = 0;
    int at = 0;
    for (int step = 0; at < s.kv.layers[0].k.tokens && (limit < 0 || step < limit); ++step) {
      const int n = step == 0 ? prefill : 1;
      const AppendOutcome r = s.append(cache, id, at, n);
      if (r.status != CacheStatus::ok) return r;
      at += n;
      ++succeeded;
    }
    return {};
  }
};

TEST(Budget, ARefusedAppendNamesTheSmallestBudgetThatTakesIt) {
  const Source s(1200);
  for (const CacheFormat format : {CacheFormat::gaac, CacheFormat::bf16}) {
    for (const int prefill : {1, 37, 300}) {
      SCOPED_TRACE(std::string(to_string(format)) + ", prefill " + std::to_string(prefill));
      const Appends run{prefill};
      const uint64_t budget = worst_case_budget(s.config(format, 0).geometry, format, &s.table, 200);
      int succeeded = 0;
      const AppendOutcome refused = run.play(s, s.config(format, budget), -1, succeeded);
      ASSERT_EQ(refused.status, CacheStatus::out_of_space);
      ASSERT_TRUE(refused.measured);
      ASSERT_GT(refused.budget_needed, budget);
      // With the budget named, the same appends all succeed; with one byte less, the last is refused.
      int with_needed = 0, with_less = 0;
      EXPECT_EQ(run.play(s, s.config(format, refused.budget_needed), succeeded + 1, with_needed).status, CacheStatus::ok);
      EXPECT_EQ(with_needed, succeeded + 1);
      const AppendOutcome short_by_one = run.play(s, s.config(format, refused.budget_needed - 1), succeeded + 1, with_less);
      EXPECT_EQ(short_by_one.status, CacheStatus::out_of_space);
      EXPECT_EQ(with_less, succeeded);
      EXPECT_EQ(short_by_one.budget_needed, refused.budget_needed);
    }
  }
}

TEST(Budget, AnAppendFarBeyondTheBudgetIsRefusedBeforeEncoding) {
  const Source s(64);
  KvCache cache(s.config(CacheFormat::gaac, uint64_t{1} << 20));
  const SequenceId id = cache.add_sequence();
  // 2^26 tokens that repeat one row (stride 0): encoding them all would take minutes and gigabytes.
  std::vector<KvView> k, v;
  for (const KvLayer& l : s.kv.layers) {
    KvView kk = view_of(l.k), vv = view_of(l.v);
    kk.tokens = vv.tokens = 1 << 26;
    kk.token_stride = vv.token_stride = 0;
    k.push_back(kk);
    v.push_back(vv);
  }
  const AppendOutcome r = cache.append(id, k, v);
  ASSERT_EQ(r.status, CacheStatus::out_of_space);
  EXPECT_FALSE(r.measured);  // refused on the best case: nothing was encoded
  const int tokens[] = {1 << 26};
  EXPECT_EQ(r.budget_needed, least_budget(s.config(CacheFormat::gaac, 0).geometry, CacheFormat::gaac, &s.table, tokens));
  EXPECT_EQ(cache.length(id), 0);
  cache.check_invariants();
}

TEST(Budget, LeastAndWorstCaseBracketWhatACacheNeeds) {
  const Source s(1200);
  for (const std::vector<int>& windows : {std::vector<int>{}, std::vector<int>{0, 100}}) {
    const CacheGeometry g = s.config(CacheFormat::gaac, 0, windows).geometry;
    const std::vector<int> lengths = {300, 45, 1};
    // bf16: least_budget is exact; one byte less and the last sequence does not fit.
    for (const uint64_t budget : {least_budget(g, CacheFormat::bf16, nullptr, lengths),
                                  least_budget(g, CacheFormat::bf16, nullptr, lengths) - 1}) {
      KvCache cache(s.config(CacheFormat::bf16, budget, windows));
      bool all = true;
      for (const int n : lengths) all = all && s.append(cache, cache.add_sequence(), 0, n).status == CacheStatus::ok;
      EXPECT_EQ(all, budget == least_budget(g, CacheFormat::bf16, nullptr, lengths)) << budget;
    }
    // gaac: below least_budget nothing fits them; at the worst case everything does.
    const uint64_t least = least_budget(g, CacheFormat::gaac, &s.table, lengths);
    const uint64_t worst = worst_case_budget(g, CacheFormat::gaac, &s.table, 300, 3);
    EXPECT_LT(least, worst);
    for (const uint64_t budget : {least - 1, worst}) {
      KvCache cache(s.config(CacheFormat::gaac, budget, windows));
      bool all = true;
      for (const int n : lengths) all = all && s.append(cache, cache.add_sequence(), 0, n).status == CacheStatus::ok;
      EXPECT_EQ(all, budget == worst) << budget;
    }
  }
}

TEST(Budget, SizesPast64BitsAreErrors) {
  CacheGeometry g{32, 8, 128, {}};
  EXPECT_THROW(worst_case_budget(g, CacheFormat::bf16, nullptr, (1 << 30) + ((1 << 30) - 1), 1 << 20), Error);
  EXPECT_THROW(worst_case_budget(g, CacheFormat::bf16, nullptr, 1 << 30, 1 << 30), Error);
  const std::vector<int> many(1 << 20, (1 << 30) + ((1 << 30) - 1));
  EXPECT_THROW(least_budget(g, CacheFormat::bf16, nullptr, many), Error);
  EXPECT_THROW(least_budget(g, CacheFormat::bf16, nullptr, std::vector<int>{-1}), Error);
  // Within range the value is exact: 2^20 sequences of 2^20 tokens are 2^36 rows of 2 raw tiles of
  // 2,048 bytes, and a table of 2^36 + 1 rows of 2 four-byte entries.
  g = {1, 1, 64, {}};
  EXPECT_EQ(worst_case_budget(g, CacheFormat::bf16, nullptr, 1 << 20, 1 << 20),
            (uint64_t{1} << 48) + ((uint64_t{1} << 36) + 1) * 8);
}

/// This process's resident memory, from /proc/self/statm.
uint64_t resident_bytes() {
  FILE* f = std::fopen("/proc/self/statm", "r");
  if (f == nullptr) return 0;
  unsigned long size = 0, resident = 0;
  const int read = std::fscanf(f, "%lu %lu", &size, &resident);
  std::fclose(f);
  return read == 2 ? static_cast<uint64_t>(resident) * static_cast<uint64_t>(::sysconf(_SC_PAGE_SIZE)) : 0;
}

TEST(Budget, ThePoolIsReservedNotCommitted) {
  const Source s(64);
  const uint64_t before = resident_bytes();
  ASSERT_GT(before, 0u);
  const KvCache cache(s.config(CacheFormat::gaac, uint64_t{1} << 30));
  // The bookkeeping (about 4 bytes per unit of about 1 KiB) is committed; the gigabyte of units is not.
  EXPECT_LT(resident_bytes() - before, uint64_t{64} << 20);
  EXPECT_EQ(cache.usage().budget_bytes, uint64_t{1} << 30);
}

TEST(Budget, ABudgetBeyondTheMachinesMemoryIsRefusedSayingSo) {
  const Source s(64);
  const uint64_t memory = static_cast<uint64_t>(::sysconf(_SC_PHYS_PAGES)) * static_cast<uint64_t>(::sysconf(_SC_PAGE_SIZE));
  try {
    const KvCache cache(s.config(CacheFormat::bf16, memory + (memory / 4)));
    FAIL() << "a budget beyond the machine's memory was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("memory"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace gaac
