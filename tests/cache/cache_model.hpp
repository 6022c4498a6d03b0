// A model and dense reference copies to test a paged KV cache against, for BF16 and FP8 elements:
// realistic rows to append (with outliers that force raw tiles), what each sequence must hold, a
// snapshot of a cache's memory, and a run of random operations checked after every step.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <random>
#include <vector>

#include "gaac/calibration.hpp"
#include "gaac/error.hpp"
#include "gaac/fp8_dump.hpp"
#include "gaac/kv_cache.hpp"
#include "gaac/synthetic.hpp"

namespace gaac::test {

/// A model geometry with its calibrations and a long source of realistic K/V rows to append from: BF16,
/// and the same converted to FP8 (`fp8`, per-tensor scales) as an engine's FP8 cache write makes them.
struct Model {
  CacheGeometry geometry;
  KvDump source;  ///< rows to draw appends from
  CalibrationTable table;
  Fp8KvDump fp8_source;  ///< source converted to FP8
  CalibrationTable fp8_table;

  Model(int layers, int heads, int head_dim, std::vector<int> windows, int source_tokens = 512,
        ElementFormat fp8 = ElementFormat::e4m3) {
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
    fp8_source = convert_to_fp8(source, fp8, Fp8Scaling::per_tensor);
    const Fp8KvDump* fp8_dumps[] = {&fp8_source};
    fp8_table = calibrate(fp8_dumps);
  }

  /// A cache config of `format`: the BF16 or the FP8 calibration, the FP8 source's format and scales.
  CacheConfig config(CacheFormat format, size_t budget) const {
    CacheConfig c;
    c.geometry = geometry;
    c.format = format;
    c.budget_bytes = budget;
    c.calibration = is_fp8(format) ? &fp8_table : &table;
    c.fp8 = {fp8_source.format, fp8_source.k_scales, fp8_source.v_scales};
    return c;
  }
  /// The layers of the source of `Element` rows.
  const auto& layers_of(uint16_t) const { return source.layers; }
  const auto& layers_of(uint8_t) const { return fp8_source.layers; }
};

/// A value far outside every calibrated window, so that its tile overflows its slot and stays raw:
/// BF16 with exponent 1 or 254, FP8 any byte (most lie outside the windows; NaNs included).
inline uint16_t outlier(uint16_t x, std::mt19937_64& rng) { return static_cast<uint16_t>((x & 0x807F) | ((rng() % 2 ? 0x01 : 0xFE) << 7)); }
inline uint8_t outlier(uint8_t, std::mt19937_64& rng) { return static_cast<uint8_t>(rng()); }

/// The new rows of one append, per layer: drawn from the source of `Element` rows (uint16_t BF16,
/// uint8_t FP8) at `offset`, some elements replaced by outliers when `outliers` (so tiles overflow
/// their slots and stay raw).
template <class Element>
struct Rows {
  using Tensor = BasicKvTensor<Element>;
  std::vector<Tensor> k, v;
  std::vector<BasicKvView<const Element>> kv, vv;

  Rows(const Model& s, int tokens, int offset, std::mt19937_64& rng, double outliers) {
    const auto& layers = s.layers_of(Element{});
    for (size_t l = 0; l < layers.size(); ++l) {
      for (auto* pair : {&k, &v}) {
        const Tensor& src = pair == &k ? layers[l].k : layers[l].v;
        Tensor t{tokens, src.kv_heads, src.head_dim, {}};
        const size_t row = static_cast<size_t>(src.kv_heads) * src.head_dim;
        for (int i = 0; i < tokens; ++i) {
          const size_t from = static_cast<size_t>((offset + i) % src.tokens) * row;
          t.data.insert(t.data.end(), src.data.begin() + static_cast<std::ptrdiff_t>(from),
                        src.data.begin() + static_cast<std::ptrdiff_t>(from + row));
        }
        std::uniform_real_distribution<double> u(0, 1);
        for (Element& x : t.data) {
          if (u(rng) < outliers) x = outlier(x, rng);
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
template <class Element>
struct Expected {
  std::vector<std::vector<Element>> k, v;  // per layer, [tokens][heads][dim]
  int length = 0;
  std::map<int, int> released;  // window → blocks

  void add(const Rows<Element>& rows, const CacheGeometry& g) {
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

/// Reads back every position the cache must still hold and compares it with `want`, bit for bit.
template <class Element>
void expect_holds(const KvCache& cache, SequenceId id, const Expected<Element>& want, const CacheGeometry& g) {
  ASSERT_EQ(cache.length(id), want.length);
  if (want.length == 0) return;
  const size_t row = static_cast<size_t>(g.kv_heads) * g.head_dim;
  for (int l = 0; l < g.layers; ++l) {
    const int w = g.sliding_window.empty() ? 0 : g.sliding_window[static_cast<size_t>(l)];
    const int first = w > 0 && want.length > w ? (want.length - w) / kTileTokens * kTileTokens : 0;
    for (const TensorKind kind : {TensorKind::key, TensorKind::value}) {
      BasicKvTensor<Element> got{want.length - first, g.kv_heads, g.head_dim, {}};
      got.data.assign(got.elements(), 0);
      cache.read(id, l, kind, first, mutable_view_of(got));
      const auto& all = (kind == TensorKind::key ? want.k : want.v)[static_cast<size_t>(l)];
      const std::vector<Element> expected(all.begin() + static_cast<std::ptrdiff_t>(first * row), all.end());
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

/// Random operations (new, append, prefill, fork, free, truncate, clone) on a cache of `format` against
/// dense copies, every value read back after every step; counts in `failures` the operations that failed
/// for lack of space (each of which must leave the cache as it was).
template <class Element>
void run_random_operations(const Model& setup, CacheFormat format, size_t budget, uint64_t seed, int steps, int& failures) {
  KvCache cache(setup.config(format, budget));
  std::mt19937_64 rng(seed);
  std::map<SequenceId, Expected<Element>> live;
  failures = 0;
  for (int step = 0; step < steps; ++step) {
    const int op = static_cast<int>(rng() % 12);
    if (live.empty() || op == 0) {
      live[cache.add_sequence()] = Expected<Element>{};
    } else {
      auto it = live.begin();
      std::advance(it, static_cast<long>(rng() % live.size()));
      const SequenceId id = it->first;
      if (op <= 5) {  // decode-like append of 1..3 tokens, or a prefill of up to 70
        const int tokens = op <= 3 ? 1 + static_cast<int>(rng() % 3) : 1 + static_cast<int>(rng() % 70);
        const Rows<Element> rows(setup, tokens, static_cast<int>(rng() % 512), rng, op == 5 ? 0.02 : 0.0005);
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

/// Appends 20 blocks of `Element` rows to one sequence of a cache of `format` whose layers all have a
/// 32-token window (the model's geometry: 2 KV heads of 64), reads back what it must hold, and checks
/// that only the last two blocks are held and that a released position cannot be read.
template <class Element>
void expect_sliding_layers_release(const Model& setup, CacheFormat format, double outliers) {
  const CacheGeometry& g = setup.geometry;
  KvCache cache(setup.config(format, size_t{16} << 20));
  std::mt19937_64 rng(3);
  const SequenceId id = cache.add_sequence();
  Expected<Element> want;
  for (int i = 0; i < 20; ++i) {
    const Rows<Element> rows(setup, 16, 16 * i, rng, outliers);
    ASSERT_EQ(cache.append(id, rows.kv, rows.vv).status, CacheStatus::ok);
    want.add(rows, g);
  }
  cache.check_invariants();
  expect_holds(cache, id, want, g);
  // 320 tokens, window 32: only the last two blocks are held.
  EXPECT_EQ(cache.usage().elements, 2u * kTileTokens * static_cast<uint64_t>(g.layers) * 2 * g.kv_heads * g.head_dim);
  BasicKvTensor<Element> first{1, g.kv_heads, g.head_dim, std::vector<Element>(static_cast<size_t>(g.kv_heads) * g.head_dim)};
  EXPECT_THROW(cache.read(id, 0, TensorKind::key, 0, mutable_view_of(first)), Error);
}

}  // namespace gaac::test
