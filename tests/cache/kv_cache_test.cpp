// The paged KV cache against a dense reference: randomised operation sequences (new, append,
// prefill, fork, free, truncate, clone) with sliding windows and forced raw fallbacks, every value read back
// bit-exact after every step, every invariant checked; exhaustion leaves the cache bit-identical.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <random>
#include <vector>

#include "gaac/calibration.hpp"
#include "gaac/error.hpp"
#include "gaac/kv_cache.hpp"
#include "gaac/synthetic.hpp"

namespace gaac {
namespace {

/// A model geometry with its calibration and a long source of realistic K/V rows to append from.
struct Model {
  CacheGeometry geometry;
  KvDump source;  ///< rows to draw appends from
  CalibrationTable table;

  Model(int layers, int heads, int head_dim, std::vector<int> windows, int source_tokens = 512) {
    geometry = {layers, heads, head_dim, std::move(windows)};
    SyntheticKvSpec spec;
    spec.layers = layers;
    spec.kv_heads = heads;
    spec.head_dim = head_dim;
    spec.tokens = source_tokens;
    spec.seed = 5;
    source = make_synthetic_kv(spec);
    const KvDump* dumps[] = {&source};
    table = calibrate(dumps);
  }

  CacheConfig config(CacheFormat format, size_t budget) const {
    CacheConfig c;
    c.geometry = geometry;
    c.format = format;
    c.budget_bytes = budget;
    c.calibration = &table;
    return c;
  }
};

/// The new rows of one append, per layer: drawn from the source at `offset`, some elements replaced
/// by values far outside every window when `outliers` (so tiles overflow their slots and stay raw).
struct Rows {
  std::vector<KvTensor> k, v;
  std::vector<KvView> kv, vv;

  Rows(const Model& s, int tokens, int offset, std::mt19937_64& rng, double outliers) {
    for (size_t l = 0; l < s.source.layers.size(); ++l) {
      for (auto* pair : {&k, &v}) {
        const KvTensor& src = pair == &k ? s.source.layers[l].k : s.source.layers[l].v;
        KvTensor t{tokens, src.kv_heads, src.head_dim, {}};
        const size_t row = static_cast<size_t>(src.kv_heads) * src.head_dim;
        for (int i = 0; i < tokens; ++i) {
          const size_t from = static_cast<size_t>((offset + i) % src.tokens) * row;
          t.data.insert(t.data.end(), src.data.begin() + static_cast<std::ptrdiff_t>(from),
                        src.data.begin() + static_cast<std::ptrdiff_t>(from + row));
        }
        std::uniform_real_distribution<double> u(0, 1);
        for (uint16_t& x : t.data) {
          if (u(rng) < outliers) x = static_cast<uint16_t>((x & 0x807F) | ((rng() % 2 ? 0x01 : 0xFE) << 7));
        }
        pair->push_back(std::move(t));
      }
    }
    for (size_t l = 0; l < k.size(); ++l) {
      kv.push_back(view_of(k[l]));
      vv.push_back(view_of(v[l]));
    }
  }
};

/// What a sequence should hold: every layer's K and V rows appended so far, and per sliding window the
/// leading blocks it has released (the most it ever could).
struct Expected {
  std::vector<std::vector<uint16_t>> k, v;  // per layer, [tokens][heads][dim]
  int length = 0;
  std::map<int, int> released;  // window → blocks

  void add(const Rows& rows, const CacheGeometry& g) {
    k.resize(rows.k.size());
    v.resize(rows.v.size());
    for (size_t l = 0; l < rows.k.size(); ++l) {
      k[l].insert(k[l].end(), rows.k[l].data.begin(), rows.k[l].data.end());
      v[l].insert(v[l].end(), rows.v[l].data.begin(), rows.v[l].data.end());
    }
    length += rows.k.empty() ? 0 : rows.k[0].tokens;
    for (const int w : g.sliding_window) {
      if (w > 0) released[w] = std::max(released[w], length > w ? (length - w) / kTileTokens : 0);
    }
  }
  /// Whether cutting back to `tokens` keeps every position the newest token then attends.
  bool can_truncate(int tokens) const {
    if (tokens == 0) return true;
    for (const auto& [w, blocks] : released) {
      if (blocks > (tokens > w ? (tokens - w) / kTileTokens : 0)) return false;
    }
    return true;
  }
  void truncate(int tokens, const CacheGeometry& g) {
    const size_t row = static_cast<size_t>(g.kv_heads) * g.head_dim;
    for (auto& t : k) t.resize(static_cast<size_t>(tokens) * row);
    for (auto& t : v) t.resize(static_cast<size_t>(tokens) * row);
    length = tokens;
    if (tokens == 0) released.clear();
  }
};

/// Reads back every position the cache must still hold and compares it with `want`.
void expect_holds(const KvCache& cache, SequenceId id, const Expected& want, const CacheGeometry& g) {
  ASSERT_EQ(cache.length(id), want.length);
  if (want.length == 0) return;
  const size_t row = static_cast<size_t>(g.kv_heads) * g.head_dim;
  for (int l = 0; l < g.layers; ++l) {
    const int w = g.sliding_window.empty() ? 0 : g.sliding_window[static_cast<size_t>(l)];
    const int first = w > 0 && want.length > w ? (want.length - w) / kTileTokens * kTileTokens : 0;
    for (const TensorKind kind : {TensorKind::key, TensorKind::value}) {
      KvTensor got{want.length - first, g.kv_heads, g.head_dim, {}};
      got.data.assign(got.elements(), 0);
      cache.read(id, l, kind, first, mutable_view_of(got));
      const auto& all = (kind == TensorKind::key ? want.k : want.v)[static_cast<size_t>(l)];
      const std::vector<uint16_t> expected(all.begin() + static_cast<std::ptrdiff_t>(first * row), all.end());
      ASSERT_EQ(got.data, expected) << "sequence " << id << " layer " << l << (kind == TensorKind::key ? " K" : " V");
    }
  }
}

/// Everything observable about a cache: its memory and its accounting.
struct Snapshot {
  std::vector<uint8_t> units;
  std::vector<uint32_t> entries;
  CacheUsage usage;

  explicit Snapshot(const KvCache& c) {
    const PagedCacheView v = c.view();
    const CacheUsage u = c.usage();
    units.assign(v.units, v.units + u.units * u.unit_bytes);
    entries.assign(v.entries, v.entries + v.geometry.table_entries());
    usage = u;
  }
  bool operator==(const Snapshot& o) const {
    return units == o.units && entries == o.entries && std::memcmp(&usage, &o.usage, sizeof usage) == 0;
  }
};

/// Counts in `failures` the appends that failed for lack of space.
void run_random_operations(const Model& setup, CacheFormat format, size_t budget, uint64_t seed, int steps, int& failures) {
  KvCache cache(setup.config(format, budget));
  std::mt19937_64 rng(seed);
  std::map<SequenceId, Expected> live;
  failures = 0;
  for (int step = 0; step < steps; ++step) {
    const int op = static_cast<int>(rng() % 12);
    if (live.empty() || op == 0) {
      live[cache.add_sequence()] = Expected{};
    } else {
      auto it = live.begin();
      std::advance(it, static_cast<long>(rng() % live.size()));
      const SequenceId id = it->first;
      if (op <= 5) {  // decode-like append of 1..3 tokens, or a prefill of up to 70
        const int tokens = op <= 3 ? 1 + static_cast<int>(rng() % 3) : 1 + static_cast<int>(rng() % 70);
        const Rows rows(setup, tokens, static_cast<int>(rng() % 512), rng, op == 5 ? 0.02 : 0.0005);
        const bool guaranteed = cache.can_append(id, tokens);
        const Snapshot before(cache);
        const AppendOutcome r = cache.append(id, rows.kv, rows.vv);
        if (r.status == CacheStatus::ok) {
          it->second.add(rows, setup.geometry);
        } else {
          ++failures;
          ASSERT_FALSE(guaranteed) << "can_append promised what append refused";
          ASSERT_GT(r.bytes_needed, 0u);
          ASSERT_TRUE(Snapshot(cache) == before) << "a failed append changed the cache";
        }
      } else if (op <= 7) {
        SequenceId child;
        const Snapshot before(cache);
        if (cache.fork(id, child) == CacheStatus::ok) {
          live[child] = it->second;
        } else {
          ASSERT_TRUE(Snapshot(cache) == before) << "a failed fork changed the cache";
        }
      } else if (op <= 9) {
        cache.free_sequence(id);
        live.erase(it);
      } else if (op == 10) {  // cut back to a random prefix
        const int tokens = static_cast<int>(rng() % static_cast<uint64_t>(it->second.length + 1));
        const Snapshot before(cache);
        if (!it->second.can_truncate(tokens)) {
          ASSERT_THROW(cache.truncate(id, tokens), Error);
          ASSERT_TRUE(Snapshot(cache) == before) << "a refused truncate changed the cache";
        } else if (cache.truncate(id, tokens) == CacheStatus::ok) {
          it->second.truncate(tokens, setup.geometry);
        } else {
          ++failures;
          ASSERT_TRUE(Snapshot(cache) == before) << "a failed truncate changed the cache";
        }
      } else {  // a clone holds the same bytes and values, and changing it leaves the original alone
        KvCache copy = cache.clone();
        ASSERT_TRUE(Snapshot(copy) == Snapshot(cache));
        ASSERT_NO_THROW(copy.check_invariants());
        for (const auto& [sid, want] : live) ASSERT_NO_FATAL_FAILURE(expect_holds(copy, sid, want, setup.geometry));
        const Snapshot before(cache);
        copy.free_sequence(id);
        ASSERT_TRUE(Snapshot(cache) == before);
      }
    }
    ASSERT_NO_THROW(cache.check_invariants()) << "step " << step;
    for (const auto& [id, want] : live) ASSERT_NO_FATAL_FAILURE(expect_holds(cache, id, want, setup.geometry));
  }
  for (const auto& [id, want] : live) cache.free_sequence(id);
  cache.check_invariants();
  const CacheUsage u = cache.usage();
  EXPECT_EQ(u.units_free, u.units) << "units leaked";
  EXPECT_EQ(u.rows_used, 0u) << "rows leaked";
  EXPECT_EQ(u.elements, 0u);
}

TEST(KvCache, RandomOperationsMatchADenseReference) {
  for (const int head_dim : {64, 128, 256}) {
    const Model setup(3, 2, head_dim, {0, 48, 0});
    SCOPED_TRACE("head_dim " + std::to_string(head_dim));
    int failures = 0;
    run_random_operations(setup, CacheFormat::gaac, size_t{6} << 20, 1 + head_dim, 160, failures);
    run_random_operations(setup, CacheFormat::bf16, size_t{6} << 20, 2 + head_dim, 120, failures);
  }
}

TEST(KvCache, RandomOperationsUnderATightBudget) {
  // Little room: appends and forks fail often, and every failure must leave the cache as it was.
  const Model setup(2, 1, 128, {32, 0});
  const CacheConfig probe = setup.config(CacheFormat::gaac, size_t{8} << 20);
  const KvCache sizing(probe);
  const size_t block = sizing.geometry().entries_per_row() * 2 * sizing.geometry().unit_bytes;
  int failures = 0;
  run_random_operations(setup, CacheFormat::gaac, 12 * block, 77, 300, failures);
  EXPECT_GT(failures, 10);
  run_random_operations(setup, CacheFormat::bf16, 12 * block, 78, 300, failures);
  EXPECT_GT(failures, 10);
}

TEST(KvCache, AllSlidingLayersReleaseOldBlocks) {
  const Model setup(2, 2, 64, {32, 32});
  KvCache cache(setup.config(CacheFormat::gaac, size_t{16} << 20));
  std::mt19937_64 rng(3);
  const SequenceId id = cache.add_sequence();
  Expected want;
  for (int i = 0; i < 20; ++i) {
    const Rows rows(setup, 16, 16 * i, rng, 0.0);
    ASSERT_EQ(cache.append(id, rows.kv, rows.vv).status, CacheStatus::ok);
    want.add(rows, setup.geometry);
  }
  cache.check_invariants();
  expect_holds(cache, id, want, setup.geometry);
  // 320 tokens, window 32: only the last two blocks are held.
  EXPECT_EQ(cache.usage().elements, 2u * 16 * 2 * 2 * 2 * 64);
  KvTensor first{1, 2, 64, std::vector<uint16_t>(128)};
  EXPECT_THROW(cache.read(id, 0, TensorKind::key, 0, mutable_view_of(first)), Error);
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
  Expected want;
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
  Expected want;
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
