// The paged KV cache against a dense reference: randomised operation sequences (new, append,
// prefill, fork, free, truncate, clone) with sliding windows and forced raw fallbacks, every value read back
// bit-exact after every step, every invariant checked; exhaustion leaves the cache bit-identical.
#include <gtest/gtest.h>

#include <random>
#include <vector>

#include "cache_model.hpp"
#include "gaac/error.hpp"
#include "gaac/kv_cache.hpp"

namespace gaac {
namespace {

using test::expect_holds;
using test::Expected;
using test::Model;
using Rows = test::Rows<uint16_t>;

TEST(KvCache, RandomOperationsMatchADenseReference) {
  for (const int head_dim : {64, 128, 256}) {
    const Model setup(3, 2, head_dim, {0, 48, 0});
    SCOPED_TRACE("head_dim " + std::to_string(head_dim));
    int failures = 0;
    test::run_random_operations<uint16_t>(setup, CacheFormat::gaac, size_t{6} << 20, 1 + head_dim, 160, failures);
    test::run_random_operations<uint16_t>(setup, CacheFormat::bf16, size_t{6} << 20, 2 + head_dim, 120, failures);
  }
}

TEST(KvCache, RandomOperationsUnderATightBudget) {
  // Little room: appends and forks fail often, and every failure must leave the cache as it was.
  const Model setup(2, 1, 128, {32, 0});
  const CacheConfig probe = setup.config(CacheFormat::gaac, size_t{8} << 20);
  const KvCache sizing(probe);
  const size_t block = sizing.geometry().entries_per_row() * 2 * sizing.geometry().unit_bytes;
  int failures = 0;
  test::run_random_operations<uint16_t>(setup, CacheFormat::gaac, 12 * block, 77, 300, failures);
  EXPECT_GT(failures, 10);
  test::run_random_operations<uint16_t>(setup, CacheFormat::bf16, 12 * block, 78, 300, failures);
  EXPECT_GT(failures, 10);
}

TEST(KvCache, AllSlidingLayersReleaseOldBlocks) {
  test::expect_sliding_layers_release<uint16_t>(Model(2, 2, 64, {32, 32}), CacheFormat::gaac, 0.0);
}

TEST(KvCache, PrefillEncodesCompleteBlocksAndKeepsTheSuffixRaw) {
  const Model setup(1, 2, 128, {});
  KvCache cache(setup.config(CacheFormat::gaac, size_t{16} << 20));
  std::mt19937_64 rng(9);
  const SequenceId id = cache.add_sequence();
  const Rows rows(setup, 16 * 5 + 7, 0, rng, 0.0);
  ASSERT_EQ(cache.append(id, rows.kv, rows.vv).status, CacheStatus::ok);
  const CacheUsage u = cache.usage();
  EXPECT_EQ(u.compressed_bytes() + u.raw_bytes() + u.tail_bytes(), u.unit_bytes_used());
  EXPECT_EQ(cache.resident_bytes(), u.resident_bytes());
  EXPECT_EQ(u.tail_tiles, 4u);  // 2 heads × K/V of the last block
  EXPECT_EQ(u.compressed_tiles + u.raw_tiles, 5u * 4);
  EXPECT_GT(u.compressed_tiles, u.raw_tiles);
  // Completing the open block finalizes it: no tail left.
  const Rows more(setup, 9, 87, rng, 0.0);
  ASSERT_EQ(cache.append(id, more.kv, more.vv).status, CacheStatus::ok);
  EXPECT_EQ(cache.usage().tail_tiles, 0u);
  EXPECT_EQ(cache.usage().compressed_tiles + cache.usage().raw_tiles, 6u * 4);
  cache.check_invariants();
}

TEST(KvCache, ForkSharesCompleteBlocks) {
  const Model setup(2, 1, 64, {});
  KvCache cache(setup.config(CacheFormat::gaac, size_t{16} << 20));
  std::mt19937_64 rng(4);
  const SequenceId parent = cache.add_sequence();
  const Rows prompt(setup, 40, 0, rng, 0.0);
  ASSERT_EQ(cache.append(parent, prompt.kv, prompt.vv).status, CacheStatus::ok);
  const uint64_t before = cache.usage().units - cache.usage().units_free;
  SequenceId child;
  ASSERT_EQ(cache.fork(parent, child), CacheStatus::ok);
  // Only the open block (8 tokens) is copied: 4 raw tiles of 2 units.
  EXPECT_EQ(cache.usage().units - cache.usage().units_free, before + 4 * 2);
  EXPECT_EQ(cache.sequence_table(std::vector<SequenceId>{parent, child}).rows[0],
            cache.sequence_table(std::vector<SequenceId>{child}).rows[0]);
  cache.free_sequence(parent);
  cache.check_invariants();
  Expected<uint16_t> want;
  want.add(prompt, setup.geometry);
  expect_holds(cache, child, want, setup.geometry);
}

TEST(KvCache, TruncateTurnsACompressedBlockBackIntoATail) {
  const Model setup(2, 1, 64, {});
  KvCache cache(setup.config(CacheFormat::gaac, size_t{16} << 20));
  std::mt19937_64 rng(6);
  const SequenceId id = cache.add_sequence();
  const Rows prompt(setup, 40, 0, rng, 0.0);
  ASSERT_EQ(cache.append(id, prompt.kv, prompt.vv).status, CacheStatus::ok);
  SequenceId child;
  ASSERT_EQ(cache.fork(id, child), CacheStatus::ok);
  const uint64_t compressed = cache.usage().compressed_tiles;
  ASSERT_GT(compressed, 0u);
  // The parent cut inside its second block: that block (shared with the child) is copied into a tail.
  ASSERT_EQ(cache.truncate(id, 20), CacheStatus::ok);
  EXPECT_EQ(cache.usage().tail_tiles, 2u * 2 * 2);  // both sequences' open blocks: 2 layers × K/V
  EXPECT_EQ(cache.usage().compressed_tiles, compressed);  // the child still holds the compressed block
  cache.free_sequence(child);
  cache.check_invariants();
  // Appending the rest again finalizes the block into the same bytes an uncut append made.
  const Rows rest(setup, 20, 20, rng, 0.0);  // positions 20..39 of the prompt (no outliers: the source's rows)
  ASSERT_EQ(cache.append(id, rest.kv, rest.vv).status, CacheStatus::ok);
  Expected<uint16_t> want;
  want.add(prompt, setup.geometry);
  expect_holds(cache, id, want, setup.geometry);
  EXPECT_EQ(cache.usage().compressed_tiles, compressed);
  // Cut to a block boundary, then to nothing: every unit comes back.
  ASSERT_EQ(cache.truncate(id, 16), CacheStatus::ok);
  EXPECT_EQ(cache.usage().tail_tiles, 0u);
  ASSERT_EQ(cache.truncate(id, 0), CacheStatus::ok);
  cache.check_invariants();
  EXPECT_EQ(cache.usage().units_free, cache.usage().units);
  EXPECT_THROW(cache.truncate(id, 1), Error);
}

TEST(KvCache, TruncateRefusesPositionsASlidingWindowReleased) {
  const Model setup(2, 1, 64, {32, 0});
  KvCache cache(setup.config(CacheFormat::gaac, size_t{16} << 20));
  std::mt19937_64 rng(7);
  const SequenceId id = cache.add_sequence();
  const Rows rows(setup, 88, 0, rng, 0.0);  // window 32: blocks 0..2 released in layer 0
  ASSERT_EQ(cache.append(id, rows.kv, rows.vv).status, CacheStatus::ok);
  EXPECT_EQ(cache.truncate(id, 80), CacheStatus::ok);  // its newest token attends from position 48: block 3 on
  EXPECT_THROW(cache.truncate(id, 79), Error);          // would attend position 47
  EXPECT_EQ(cache.length(id), 80);
  EXPECT_EQ(cache.truncate(id, 0), CacheStatus::ok);
  cache.check_invariants();
}

TEST(KvCache, RejectsBadConfigurationsAndArguments) {
  const Model setup(2, 2, 64, {});
  EXPECT_THROW(KvCache(setup.config(CacheFormat::gaac, 1000)), Error);  // less than one block
  CacheConfig no_calibration = setup.config(CacheFormat::gaac, size_t{1} << 20);
  no_calibration.calibration = nullptr;
  EXPECT_THROW(KvCache{no_calibration}, Error);
  CacheConfig bad_dim = setup.config(CacheFormat::bf16, size_t{1} << 20);
  bad_dim.geometry.head_dim = 96;
  EXPECT_THROW(KvCache{bad_dim}, Error);
  CacheConfig mismatch = setup.config(CacheFormat::gaac, size_t{1} << 20);
  mismatch.geometry.layers = 3;
  mismatch.geometry.sliding_window = {};
  EXPECT_THROW(KvCache{mismatch}, Error);
  KvCache cache(setup.config(CacheFormat::gaac, size_t{4} << 20));
  EXPECT_THROW(cache.length(7), Error);
  const SequenceId id = cache.add_sequence();
  std::mt19937_64 rng(1);
  Rows rows(setup, 3, 0, rng, 0.0);
  rows.kv.pop_back();
  EXPECT_THROW(cache.append(id, rows.kv, rows.vv), Error);
  EXPECT_THROW(cache.can_append(id, -1), Error);
}

TEST(KvCache, DecodeAdmissionIsExact) {
  // For single decoding tokens can_append is exact: it fails exactly when append would.
  const Model setup(1, 1, 64, {});
  const KvCache sizing(setup.config(CacheFormat::gaac, size_t{1} << 20));
  const size_t block = sizing.geometry().entries_per_row() * 2 * sizing.geometry().unit_bytes;
  KvCache cache(setup.config(CacheFormat::gaac, 5 * block));
  std::mt19937_64 rng(8);
  const SequenceId id = cache.add_sequence();
  for (int t = 0; t < 400; ++t) {
    const bool can = cache.can_append(id, 1);
    const Rows rows(setup, 1, t, rng, 0.0);
    const AppendOutcome r = cache.append(id, rows.kv, rows.vv);
    ASSERT_EQ(can, r.status == CacheStatus::ok) << "token " << t;
    if (!can) break;
  }
  EXPECT_GT(cache.length(id), 5 * 16);  // compression let it hold more than 5 raw blocks
}

}  // namespace
}  // namespace gaac
