// The CPU batch cache (gaac::make_host_batch_kv_cache): forwards of any length, attended layer by
// layer while their rows wait beside the cache, give the bits of gaac::attend over a KvCache holding
// every row (a sliding layer too, whose window moves inside a forward); a GAAC and a BF16 batch cache give the same bits;
// misuse and a full budget are errors that say what happened. Pad tokens are never stored nor read, and
// select (forks), truncate, clone and reset keep every row as a cache of its sequence alone would hold it.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "gaac/attention.hpp"
#include "gaac/batch_kv_cache.hpp"
#include "gaac/bf16.hpp"
#include "gaac/error.hpp"
#include "gaac/synthetic.hpp"

namespace gaac {
namespace {

constexpr int kLayers = 2, kKvHeads = 2, kHeadDim = 64, kQHeads = 6, kBatch = 2, kWindow = 40;

/// Every token's K and V of every layer and sequence: [layer][sequence] dumps of one layer each.
struct Values {
  std::vector<KvDump> per_sequence;  // kLayers layers each
  CalibrationTable table;
};

Values make_values(int tokens) {
  Values v;
  for (int b = 0; b < kBatch; ++b) {
    SyntheticKvSpec spec;
    spec.layers = kLayers, spec.kv_heads = kKvHeads, spec.head_dim = kHeadDim, spec.tokens = tokens;
    spec.seed = 31 + static_cast<uint64_t>(b);
    v.per_sequence.push_back(make_synthetic_kv(spec));
  }
  std::vector<const KvDump*> dumps;
  for (const KvDump& d : v.per_sequence) dumps.push_back(&d);
  v.table = calibrate(dumps);
  return v;
}

BatchCacheConfig config_for(const Values& v, CacheFormat format, int tokens) {
  BatchCacheConfig c;
  c.cache.geometry = {kLayers, kKvHeads, kHeadDim, {0, kWindow}};
  c.cache.format = format;
  c.cache.calibration = &v.table;
  c.cache.budget_bytes = worst_case_budget(c.cache.geometry, format, &v.table, tokens, kBatch);
  c.batch = kBatch;
  c.max_tokens = tokens;
  return c;
}

/// `[batch, heads, tokens, head_dim]` rows laid out as transformers does after its transpose: the
/// memory is [batch][tokens][heads][head_dim].
struct Rows {
  std::vector<uint16_t> data;
  int heads = 0, tokens = 0;
  BatchRows view() const {
    return {data.data(), kBatch, heads, tokens, kHeadDim, static_cast<int64_t>(tokens) * heads * kHeadDim,
            kHeadDim, static_cast<int64_t>(heads) * kHeadDim};
  }
  MutableBatchRows mutable_view() {
    return {data.data(), kBatch, heads, tokens, kHeadDim, static_cast<int64_t>(tokens) * heads * kHeadDim,
            kHeadDim, static_cast<int64_t>(heads) * kHeadDim};
  }
};

/// Tokens first .. first+tokens-1 of `kind` in `layer`, every sequence.
Rows kv_rows(const Values& v, int layer, TensorKind kind, int first, int tokens) {
  Rows r{{}, kKvHeads, tokens};
  for (int b = 0; b < kBatch; ++b) {
    const KvTensor& t = v.per_sequence[static_cast<size_t>(b)].layers[static_cast<size_t>(layer)].of(kind);
    const size_t row = static_cast<size_t>(kKvHeads) * kHeadDim;
    r.data.insert(r.data.end(), t.data.begin() + static_cast<std::ptrdiff_t>(first * row),
                  t.data.begin() + static_cast<std::ptrdiff_t>((first + tokens) * row));
  }
  return r;
}

Rows random_q(int tokens, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> d(0.0f, 1.0f);
  Rows q{std::vector<uint16_t>(static_cast<size_t>(kBatch) * tokens * kQHeads * kHeadDim), kQHeads, tokens};
  for (uint16_t& x : q.data) x = float_to_bf16(d(rng));
  return q;
}

/// What gaac::attend gives over a KvCache that holds every token up to first + tokens - 1 (no layer
/// releasing any: the sliding layer's window is applied by the attention's options).
std::vector<uint16_t> oracle(const Values& v, CacheFormat format, int first, const Rows& q) {
  BatchCacheConfig c = config_for(v, format, first + q.tokens);
  c.cache.geometry.sliding_window = {};
  KvCache cache(c.cache);
  std::vector<SequenceId> ids;
  for (int b = 0; b < kBatch; ++b) {
    ids.push_back(cache.add_sequence());
    std::vector<KvView> k, vv;
    for (const KvLayer& l : v.per_sequence[static_cast<size_t>(b)].layers) {
      k.push_back(view_of(l.k).tokens_from(0, first + q.tokens));
      vv.push_back(view_of(l.v).tokens_from(0, first + q.tokens));
    }
    EXPECT_EQ(cache.append(ids.back(), k, vv).status, CacheStatus::ok);
  }
  std::vector<uint16_t> all;
  for (int layer = 0; layer < kLayers; ++layer) {
    std::vector<float> qf(q.data.size()), out(q.data.size());
    for (size_t i = 0; i < qf.size(); ++i) qf[i] = bf16_to_float(q.data[i]);
    std::vector<AttentionQuery> queries;
    const size_t per = static_cast<size_t>(kQHeads) * kHeadDim;
    for (int b = 0; b < kBatch; ++b)
      for (int t = 0; t < q.tokens; ++t) {
        const size_t at = (static_cast<size_t>(b) * q.tokens + t) * per;
        queries.push_back({ids[static_cast<size_t>(b)], first + t, qf.data() + at, out.data() + at, {}, {}});
      }
    AttentionOptions o;
    o.q_heads = kQHeads;
    o.scale = 1.0f / std::sqrt(static_cast<float>(kHeadDim));
    o.window = layer == 1 ? kWindow : 0;
    attend(cache, layer, queries, o);
    for (const float x : out) all.push_back(float_to_bf16(x));
  }
  return all;
}

/// Runs forwards of the given sizes through a batch cache; returns every attention output.
std::vector<std::vector<uint16_t>> run_forwards(BatchKvCache& cache, const Values& v, const std::vector<int>& sizes) {
  std::vector<std::vector<uint16_t>> outs;
  int first = 0;
  for (size_t f = 0; f < sizes.size(); ++f) {
    const int n = sizes[f];
    cache.begin(n, {}, nullptr);
    EXPECT_EQ(cache.length(0), first + n);
    EXPECT_EQ(cache.length(1), first + n);
    EXPECT_EQ(cache.forward_tokens(), n);
    const Rows q = random_q(n, 1000 + f);
    std::vector<uint16_t> all;
    for (int layer = 0; layer < kLayers; ++layer) {
      cache.write(layer, kv_rows(v, layer, TensorKind::key, first, n).view(),
                  kv_rows(v, layer, TensorKind::value, first, n).view(), nullptr);
      Rows out{std::vector<uint16_t>(q.data.size(), 0xFFFF), kQHeads, n};
      cache.attend(layer, q.view(), out.mutable_view(), 0.0f, nullptr);
      all.insert(all.end(), out.data.begin(), out.data.end());
    }
    outs.push_back(std::move(all));
    first += n;
  }
  return outs;
}

TEST(HostBatchKvCache, ForwardsGiveTheBitsOfAttentionOverTheWholeCache) {
  const std::vector<int> sizes = {37, 1, 1, 11, 1, 20, 1, 1, 5, 1};
  int total = 0;
  for (const int n : sizes) total += n;
  const Values v = make_values(total);
  for (const CacheFormat format : {CacheFormat::gaac, CacheFormat::bf16}) {
    SCOPED_TRACE(to_string(format));
    const std::unique_ptr<BatchKvCache> cache = make_host_batch_kv_cache(config_for(v, format, total));
    EXPECT_FALSE(cache->in_device_memory());
    const auto outs = run_forwards(*cache, v, sizes);
    int first = 0;
    for (size_t f = 0; f < sizes.size(); ++f) {
      const std::vector<uint16_t> want = oracle(v, format, first, random_q(sizes[f], 1000 + f));
      EXPECT_EQ(outs[f], want) << "forward " << f << " of " << sizes[f] << " tokens";
      first += sizes[f];
    }
    EXPECT_EQ(cache->length(1), total);
    EXPECT_GT(cache->usage().compressed_tiles + cache->usage().raw_tiles, 0u);
  }
  // And the compressed cache attends with the twin's bits.
  const auto gaac = run_forwards(*make_host_batch_kv_cache(config_for(v, CacheFormat::gaac, total)), v, sizes);
  const auto twin = run_forwards(*make_host_batch_kv_cache(config_for(v, CacheFormat::bf16, total)), v, sizes);
  EXPECT_EQ(gaac, twin);
}

TEST(HostBatchKvCache, MisuseIsAnError) {
  const Values v = make_values(64);
  const std::unique_ptr<BatchKvCache> cache = make_host_batch_kv_cache(config_for(v, CacheFormat::gaac, 64));
  const Rows k = kv_rows(v, 0, TensorKind::key, 0, 4), val = kv_rows(v, 0, TensorKind::value, 0, 4);
  EXPECT_THROW(cache->write(0, k.view(), val.view(), nullptr), Error);  // no forward begun
  EXPECT_THROW(cache->begin(0, {}, nullptr), Error);
  cache->begin(4, {}, nullptr);
  EXPECT_THROW(cache->write(2, k.view(), val.view(), nullptr), Error);  // no such layer
  const Rows wrong = kv_rows(v, 0, TensorKind::key, 0, 3);
  EXPECT_THROW(cache->write(0, wrong.view(), val.view(), nullptr), Error);  // 3 tokens in a forward of 4
  const Rows q = random_q(4, 1);
  Rows out{std::vector<uint16_t>(q.data.size()), kQHeads, 4};
  EXPECT_THROW(cache->attend(0, q.view(), out.mutable_view(), 0.0f, nullptr), Error);  // layer 0 not written
  cache->write(0, k.view(), val.view(), nullptr);
  EXPECT_THROW(cache->write(0, k.view(), val.view(), nullptr), Error);  // written twice
  EXPECT_THROW(cache->begin(1, {}, nullptr), Error);                        // layer 1 never written
  EXPECT_THROW(cache->note_replayed(1), Error);                         // no graphs on the CPU
  EXPECT_THROW(cache->select(std::vector<int>{0}), Error);              // a forward is running
  EXPECT_THROW(cache->truncate(std::vector<int>{0, 0}), Error);
  cache->write(1, k.view(), val.view(), nullptr);
  EXPECT_THROW(cache->select(std::vector<int>{2}), Error);              // no sequence 2
  EXPECT_THROW(cache->select(std::vector<int>{}), Error);
  EXPECT_THROW(cache->truncate(std::vector<int>{5, 0}), Error);         // past its 4 tokens
  EXPECT_THROW(cache->truncate(std::vector<int>{0}), Error);            // one length for two sequences
  EXPECT_THROW(cache->begin(2, std::vector<uint8_t>{1, 1, 1}, nullptr), Error);  // 3 flags for 2 × 2 tokens
  EXPECT_THROW(cache->length(2), Error);
}

TEST(HostBatchKvCache, AFullBudgetSaysSoAndKeepsTheCache) {
  const Values v = make_values(64);
  BatchCacheConfig c = config_for(v, CacheFormat::gaac, 64);
  c.cache.budget_bytes = worst_case_budget(c.cache.geometry, CacheFormat::gaac, &v.table, 16, 1);  // one block of one sequence
  const std::unique_ptr<BatchKvCache> cache = make_host_batch_kv_cache(c);
  cache->begin(48, {}, nullptr);
  for (int layer = 0; layer < kLayers; ++layer)
    cache->write(layer, kv_rows(v, layer, TensorKind::key, 0, 48).view(),
                 kv_rows(v, layer, TensorKind::value, 0, 48).view(), nullptr);
  EXPECT_EQ(cache->length(0), 48);
  for (int attempt = 0; attempt < 2; ++attempt) {  // the rows still wait: trying again says the same
    try {
      cache->begin(1, {}, nullptr);  // appends the 48 tokens of two sequences: they do not fit one block
      FAIL() << "48 tokens of two sequences should not fit a budget of one block";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::out_of_space);
      EXPECT_NE(std::string(e.what()).find("the cache is unchanged"), std::string::npos) << e.what();
    }
    EXPECT_EQ(cache->length(0), 48);
    EXPECT_EQ(cache->usage().compressed_tiles + cache->usage().raw_tiles + cache->usage().tail_tiles, 0u);
  }
}

// ---------------------------------------------------------------------------------------------
// Pads and edits: every row of a batch is checked against a cache of its own sequence alone, fed the
// same tokens without pads, in forwards of its own.

/// One forward for a batch: per row, the tokens it forwards (indices into its source sequence's
/// values; -1 for a pad, whose rows and query are garbage).
struct Forward {
  std::vector<int> source;               // per row: the sequence of Values its values come from
  std::vector<std::vector<int>> tokens;  // per row, the same count
};

/// Query of token `t` of source sequence `s`: the same wherever the token is forwarded.
std::vector<uint16_t> query_of(int s, int t) {
  std::mt19937_64 rng(7000 + 131 * static_cast<uint64_t>(s) + static_cast<uint64_t>(t));
  std::normal_distribution<float> d(0.0f, 1.0f);
  std::vector<uint16_t> q(static_cast<size_t>(kQHeads) * kHeadDim);
  for (uint16_t& x : q) x = float_to_bf16(d(rng));
  return q;
}

/// Runs one forward; returns per layer, row and token the attention output (q_heads × head_dim).
std::vector<std::vector<std::vector<std::vector<uint16_t>>>> forward(BatchKvCache& cache, const Values& v,
                                                                      const Forward& f) {
  const int batch = static_cast<int>(f.source.size());
  const int n = static_cast<int>(f.tokens[0].size());
  std::vector<uint8_t> valid;
  for (const auto& row : f.tokens)
    for (const int t : row) valid.push_back(t >= 0 ? 1 : 0);
  cache.begin(n, valid, nullptr);
  const size_t kv_row = static_cast<size_t>(kKvHeads) * kHeadDim, q_row = static_cast<size_t>(kQHeads) * kHeadDim;
  const auto batch_rows = [&](const std::vector<uint16_t>& data, int heads) {
    return BatchRows{data.data(), batch, heads, n, kHeadDim, static_cast<int64_t>(n) * heads * kHeadDim, kHeadDim,
                     static_cast<int64_t>(heads) * kHeadDim};
  };
  std::vector<uint16_t> q;
  for (int b = 0; b < batch; ++b)
    for (const int t : f.tokens[static_cast<size_t>(b)]) {
      const std::vector<uint16_t> row = t >= 0 ? query_of(f.source[static_cast<size_t>(b)], t)
                                               : std::vector<uint16_t>(q_row, 0x7FC0);  // NaN: a pad's garbage
      q.insert(q.end(), row.begin(), row.end());
    }
  std::vector<std::vector<std::vector<std::vector<uint16_t>>>> outs(kLayers);
  for (int layer = 0; layer < kLayers; ++layer) {
    std::vector<uint16_t> k, val;
    for (int b = 0; b < batch; ++b)
      for (const int t : f.tokens[static_cast<size_t>(b)]) {
        const KvLayer& l = v.per_sequence[static_cast<size_t>(f.source[static_cast<size_t>(b)])].layers[static_cast<size_t>(layer)];
        for (auto [to, from] : {std::pair{&k, &l.k}, std::pair{&val, &l.v}}) {
          if (t < 0) {
            to->insert(to->end(), kv_row, 0x7FC0);
          } else {
            to->insert(to->end(), from->data.begin() + static_cast<std::ptrdiff_t>(t * kv_row),
                       from->data.begin() + static_cast<std::ptrdiff_t>((t + 1) * kv_row));
          }
        }
      }
    cache.write(layer, batch_rows(k, kKvHeads), batch_rows(val, kKvHeads), nullptr);
    std::vector<uint16_t> out(q.size(), 0xFFFF);
    cache.attend(layer, batch_rows(q, kQHeads),
                 MutableBatchRows{out.data(), batch, kQHeads, n, kHeadDim, static_cast<int64_t>(n) * kQHeads * kHeadDim,
                                  kHeadDim, static_cast<int64_t>(kQHeads) * kHeadDim},
                 0.0f, nullptr);
    outs[static_cast<size_t>(layer)].resize(static_cast<size_t>(batch));
    for (int b = 0; b < batch; ++b)
      for (int t = 0; t < n; ++t) {
        const auto at = out.begin() + static_cast<std::ptrdiff_t>((static_cast<size_t>(b) * n + t) * q_row);
        outs[static_cast<size_t>(layer)][static_cast<size_t>(b)].emplace_back(at, at + static_cast<std::ptrdiff_t>(q_row));
      }
  }
  return outs;
}

/// What row `b` of forward `f` must get: a one-sequence cache fed `history` (the row's tokens so far,
/// no pads) and then the row's real tokens, through its own forwards.
void expect_row(const Values& v, CacheFormat format, const std::vector<int>& history, const Forward& f, int b,
                const std::vector<std::vector<std::vector<std::vector<uint16_t>>>>& got) {
  BatchCacheConfig c = config_for(v, format, 200);
  c.batch = 1;
  const std::unique_ptr<BatchKvCache> alone = make_host_batch_kv_cache(c);
  const int s = f.source[static_cast<size_t>(b)];
  if (!history.empty()) forward(*alone, v, Forward{{s}, {history}});
  std::vector<int> real;
  for (const int t : f.tokens[static_cast<size_t>(b)])
    if (t >= 0) real.push_back(t);
  const auto want = real.empty() ? decltype(got){} : forward(*alone, v, Forward{{s}, {real}});
  for (int layer = 0; layer < kLayers; ++layer) {
    size_t i = 0;
    const auto& row = got[static_cast<size_t>(layer)][static_cast<size_t>(b)];
    for (size_t t = 0; t < row.size(); ++t) {
      if (f.tokens[static_cast<size_t>(b)][t] < 0) {
        EXPECT_EQ(row[t], std::vector<uint16_t>(row[t].size(), 0)) << "a pad's output is zero";
      } else {
        EXPECT_EQ(row[t], want[static_cast<size_t>(layer)][0][i++]) << "layer " << layer << " row " << b << " token " << t;
      }
    }
  }
}

TEST(HostBatchKvCache, PadTokensAreNeitherStoredNorRead) {
  const Values v = make_values(64);
  for (const CacheFormat format : {CacheFormat::gaac, CacheFormat::bf16}) {
    SCOPED_TRACE(to_string(format));
    BatchCacheConfig c = config_for(v, format, 200);
    const std::unique_ptr<BatchKvCache> cache = make_host_batch_kv_cache(c);
    std::vector<std::vector<int>> history(kBatch);
    // A left-padded prompt (row 1: 14 pads), decoding steps, a second turn with pads inside, more steps
    // past the sliding window: each row sees its own tokens only.
    std::vector<int> prompt0(34), prompt1(34, -1);
    for (int t = 0; t < 34; ++t) prompt0[static_cast<size_t>(t)] = t;
    for (int t = 14; t < 34; ++t) prompt1[static_cast<size_t>(t)] = t - 14;
    const std::vector<Forward> forwards = {
        {{0, 1}, {prompt0, prompt1}},
        {{0, 1}, {{34}, {20}}},
        {{0, 1}, {{35, 36, -1, -1}, {-1, 21, 22, 23}}},
        {{0, 1}, {{37}, {24}}},
        {{0, 1}, {{38, 39}, {25, 26}}},
    };
    for (const Forward& f : forwards) {
      const auto got = forward(*cache, v, f);
      for (int b = 0; b < kBatch; ++b) {
        expect_row(v, format, history[static_cast<size_t>(b)], f, b, got);
        for (const int t : f.tokens[static_cast<size_t>(b)])
          if (t >= 0) history[static_cast<size_t>(b)].push_back(t);
      }
      for (int b = 0; b < kBatch; ++b) EXPECT_EQ(cache->length(b), static_cast<int>(history[static_cast<size_t>(b)].size()));
    }
  }
}

TEST(HostBatchKvCache, SelectTruncateCloneAndResetKeepEveryRowItsOwn) {
  const Values v = make_values(64);
  for (const CacheFormat format : {CacheFormat::gaac, CacheFormat::bf16}) {
    SCOPED_TRACE(to_string(format));
    const std::unique_ptr<BatchKvCache> cache = make_host_batch_kv_cache(config_for(v, format, 200));
    std::vector<int> h0(21), h1(21);
    for (int t = 0; t < 21; ++t) h0[static_cast<size_t>(t)] = h1[static_cast<size_t>(t)] = t;
    forward(*cache, v, Forward{{0, 1}, {{h0.begin(), h0.end() - 1}, {h1.begin(), h1.end() - 1}}});
    forward(*cache, v, Forward{{0, 1}, {{20}, {20}}});
    const uint64_t used = cache->usage().units - cache->usage().units_free;
    // Beams: rows become (1, 1, 0); the repeated row is a fork, its complete block shared.
    cache->select(std::vector<int>{1, 1, 0});
    ASSERT_EQ(cache->batch(), 3);
    EXPECT_LT(cache->usage().units - cache->usage().units_free, used * 3 / 2) << "the fork copied complete blocks";
    Forward f{{1, 1, 0}, {{21, 22}, {23, 24}, {21, 22}}};
    auto got = forward(*cache, v, f);
    const std::vector<std::vector<int>> before = {h1, h1, h0};
    for (int b = 0; b < 3; ++b) expect_row(v, format, before[static_cast<size_t>(b)], f, b, got);
    std::vector<std::vector<int>> history = {h1, h1, h0};
    for (int b = 0; b < 3; ++b)
      for (const int t : f.tokens[static_cast<size_t>(b)]) history[static_cast<size_t>(b)].push_back(t);
    // Speculative tokens taken back: each row cut to its own length (inside compressed and open blocks).
    cache->truncate(std::vector<int>{22, 16, 5});
    for (auto& [b, n] : {std::pair{0, 22}, std::pair{1, 16}, std::pair{2, 5}}) history[static_cast<size_t>(b)].resize(static_cast<size_t>(n));
    f = Forward{{1, 1, 0}, {{30}, {31}, {32}}};
    const std::unique_ptr<BatchKvCache> copy = cache->clone();
    got = forward(*cache, v, f);
    for (int b = 0; b < 3; ++b) expect_row(v, format, history[static_cast<size_t>(b)], f, b, got);
    // The clone holds what the cache held before that forward, and goes its own way.
    const Forward g{{1, 1, 0}, {{40, 41}, {42, 43}, {44, 45}}};
    got = forward(*copy, v, g);
    for (int b = 0; b < 3; ++b) expect_row(v, format, history[static_cast<size_t>(b)], g, b, got);
    EXPECT_EQ(cache->length(2), 6);
    EXPECT_EQ(copy->length(2), 7);
    // Reset: empty rows, the whole budget free, and a forward as on a new cache.
    cache->reset();
    EXPECT_EQ(cache->usage().units_free, cache->usage().units);
    for (int b = 0; b < 3; ++b) EXPECT_EQ(cache->length(b), 0);
    got = forward(*cache, v, f);
    for (int b = 0; b < 3; ++b) expect_row(v, format, {}, f, b, got);
  }
}

}  // namespace
}  // namespace gaac
