// CPU attention over the paged cache: every path (fused scalar, fused AVX2 and AVX-512 where the CPU
// has them, reference; a BF16 cache with every kernel set) gives the same bits, and with one range they are llama.cpp's bits
// (the dense oracle of tests/support); with several ranges they agree with each other and stay within
// float tolerance of float64. Lengths around block edges, long contexts, GQA shapes of both real
// models, sliding windows, rows not yet cached, raw and exactly-full tiles, batches.
#include <gtest/gtest.h>

#include <bit>
#include <cstring>
#include <cmath>
#include <random>
#include <functional>
#include <string>
#include <tuple>
#include <vector>

#include "attention/attention_internal.hpp"
#include "attention/expf.hpp"
#include "gaac/attention.hpp"
#include "gaac/bf16.hpp"
#include "gaac/error.hpp"
#include "gaac/synthetic.hpp"
#include "attention_support.hpp"
#include "support/ggml_attention.hpp"

namespace gaac {
namespace {

using test::random_q;
using test::same_bits;
using test::Shape;

constexpr Shape kSmolLM2{9, 3, 64};
constexpr Shape kGemma3{4, 1, 256};
constexpr Shape kLlama8B{32, 8, 128};

/// One layer of KV, its calibration, and both caches holding it as one sequence (filled in appends
/// of uneven sizes, so there are tails, prefills and single tokens), the last `extra` rows left out.
struct Filled {
  Shape shape;
  KvDump dump;  // one layer, every token
  CalibrationTable table;
  KvCache gaac, bf16;
  SequenceId gaac_id = 0, bf16_id = 0;
  int cached = 0;

  static KvDump make_dump(Shape s, int tokens, uint64_t seed, double outliers) {
    KvDump d = test::synthetic_layer(s, tokens, seed);
    std::mt19937_64 rng(seed + 1);
    std::uniform_real_distribution<double> u(0, 1);
    for (KvTensor* t : {&d.layers[0].k, &d.layers[0].v}) {
      for (uint16_t& x : t->data) {
        if (u(rng) < outliers) x = static_cast<uint16_t>((x & 0x807F) | ((rng() % 2 ? 0x60 : 0x98) << 7));
      }
    }
    return d;
  }

  static CacheConfig config(const KvDump& d, const CalibrationTable& t, CacheFormat format, int window) {
    CacheConfig c;
    c.geometry = {1, d.kv_heads(), d.head_dim(), {window}};
    c.format = format;
    c.budget_bytes = size_t{16} << 20;
    c.calibration = &t;
    return c;
  }

  /// Windows learnt on the same KV without its outliers.
  static CalibrationTable calibrated(Shape s, int tokens, uint64_t seed) {
    const KvDump calib = make_dump(s, tokens, seed, 0.0);
    const KvDump* dumps[] = {&calib};
    return calibrate(dumps);
  }

  /// Random KV (with a share of outliers far outside every window), calibrated on other random KV.
  Filled(Shape s, int tokens, int extra, uint64_t seed, double outliers = 0.0, int window = 0)
      : Filled(s, make_dump(s, tokens, seed, outliers), extra, calibrated(s, tokens, seed), window) {}

  /// The given KV and calibration.
  Filled(Shape s, KvDump kv, int extra, CalibrationTable calibration, int window = 0)
      : shape(s),
        dump(std::move(kv)),
        table(std::move(calibration)),
        gaac(config(dump, table, CacheFormat::gaac, window)),
        bf16(config(dump, table, CacheFormat::bf16, window)) {
    gaac_id = gaac.add_sequence();
    bf16_id = bf16.add_sequence();
    const int tokens = dump.layers[0].k.tokens;
    cached = tokens - extra;
    test::fill_twins(gaac, gaac_id, bf16, bf16_id, dump.layers[0].k, dump.layers[0].v, cached);
  }

  KvView extra_k() const { return view_of(dump.layers[0].k).tokens_from(cached, dump.layers[0].k.tokens - cached); }
  KvView extra_v() const { return view_of(dump.layers[0].v).tokens_from(cached, dump.layers[0].v.tokens - cached); }

  /// The oracle's output for every query head at `position`, window `window`.
  std::vector<float> oracle(const std::vector<float>& q, int position, int window) const {
    std::vector<float> out;
    for (int h = 0; h < shape.q_heads; ++h) {
      const test::DenseQuery dq = test::dense_query(shape, q, dump.layers[0].k.data.data(), dump.layers[0].v.data.data(), h, position, window);
      const std::vector<float> o = test::ggml_attention(dq);
      out.insert(out.end(), o.begin(), o.end());
    }
    return out;
  }
};

/// Output of one attention call over `cache` at `position`.
std::vector<float> run(const attention::Kernels& kernels, const KvCache& cache, SequenceId id, const Filled& f,
                       const std::vector<float>& q, int position, AttentionPath path, int splits, int window = -1) {
  std::vector<float> out(q.size(), std::nanf(""));
  AttentionQuery query{id, position, q.data(), out.data(), {}, {}};
  if (position >= f.cached) {
    query.extra_k = f.extra_k();
    query.extra_v = f.extra_v();
  }
  attention::attend_with(kernels, cache, 0, std::span(&query, 1), test::options_for(f.shape, path, splits, window));
  return out;
}

/// Every path and cache format at `position`; all equal to each other, and with one range equal to
/// the oracle bit for bit. Returns the common output.
std::vector<float> check_every_path(const Filled& f, int position, int splits, uint64_t seed, int window = -1) {
  const std::vector<float> q = random_q(static_cast<size_t>(f.shape.q_heads) * f.shape.head_dim, seed);
  std::vector<std::pair<std::string, std::vector<float>>> results;
  for (const auto& [name, k] : test::kernel_sets()) {
    results.emplace_back("gaac fused " + name, run(*k, f.gaac, f.gaac_id, f, q, position, AttentionPath::fused, splits, window));
    results.emplace_back("gaac reference " + name, run(*k, f.gaac, f.gaac_id, f, q, position, AttentionPath::reference, splits, window));
    results.emplace_back("bf16 " + name, run(*k, f.bf16, f.bf16_id, f, q, position, AttentionPath::fused, splits, window));
  }
  const std::vector<float>& first = results.front().second;
  for (const auto& [name, out] : results) {
    for (size_t i = 0; i < out.size(); ++i) {
      EXPECT_TRUE(same_bits(out[i], first[i])) << name << " differs from " << results.front().first << " at " << i
                                                << " (position " << position << ", splits " << splits << ")";
      if (!same_bits(out[i], first[i])) return first;
    }
  }
  const int w = window < 0 ? 0 : window;
  if (splits == 1) {
    const std::vector<float> want = f.oracle(q, position, w);
    for (size_t i = 0; i < want.size(); ++i) {
      EXPECT_TRUE(same_bits(first[i], want[i])) << "position " << position << " element " << i << ": " << first[i] << " vs oracle " << want[i];
      if (!same_bits(first[i], want[i])) break;
    }
  }
  return first;
}

TEST(Attention, VectorExpMatchesTheCLibraryBitForBit) {
  std::vector<float> x;
  for (uint32_t bits = 0x80000000u; bits < 0xC2E00000u; bits += 1031) x.push_back(std::bit_cast<float>(bits));
  for (float v : {0.0f, -0.0f, -INFINITY, INFINITY, NAN, -87.99f, -88.0f, -88.5f, -103.5f, -104.0f, -150.0f, 1e-30f,
                  -1e-30f, -1e-45f, 0.5f, 1.0f, 10.0f, 88.5f}) {
    x.push_back(v);
  }
#if defined(__GLIBC__) && defined(__x86_64__)
  // glibc's expf is the algorithm the vector version reproduces: the start-up check must accept it.
  if (attention::avx2_kernels() != nullptr) {
    EXPECT_TRUE(attention::expf_vectorised());
  }
#endif
  std::vector<float> got = x;
  attention::expf_in_place(got.data(), got.size());
  for (size_t i = 0; i < x.size(); ++i) {
    const float want = std::exp(x[i]);
    ASSERT_TRUE(same_bits(got[i], want) || (std::isnan(got[i]) && std::isnan(want))) << "x = " << x[i];
  }
}

TEST(Attention, EveryPathGivesLlamaCppsBitsAtBlockEdges) {
  for (const Shape s : {kSmolLM2, kGemma3, kLlama8B}) {
    for (const int length : {1, 15, 16, 17, 33}) {
      SCOPED_TRACE("shape " + std::to_string(s.q_heads) + "/" + std::to_string(s.kv_heads) + "/" + std::to_string(s.head_dim) +
                   ", length " + std::to_string(length));
      const Filled f(s, length, 0, 10 + static_cast<uint64_t>(length));
      if (length >= 16) {
        EXPECT_GT(f.gaac.usage().compressed_tiles, 0u);
      }
      for (int position = 0; position < length; ++position) check_every_path(f, position, 1, 1000 + static_cast<uint64_t>(position));
    }
  }
}

TEST(Attention, EveryPathGivesLlamaCppsBitsOnALongContext) {
  for (const Shape s : {kSmolLM2, kGemma3, kLlama8B}) {
    const Filled f(s, 1003, 0, 3, 0.0005);
    EXPECT_GT(f.gaac.usage().compressed_tiles, 10 * f.gaac.usage().raw_tiles);
    check_every_path(f, 1002, 1, 5);
    check_every_path(f, 517, 1, 6);
  }
}

TEST(Attention, SplitRangesAgreeAcrossPathsAndStayNearFloat64) {
  for (const Shape s : {kSmolLM2, kGemma3, kLlama8B}) {
    const Filled f(s, 1003, 0, 4, 0.0005);
    for (const int splits : {2, 5, 64, 100}) {  // 100 splits leave some ranges empty
      const std::vector<float> q = random_q(static_cast<size_t>(s.q_heads) * s.head_dim, 77);
      const std::vector<float> got = check_every_path(f, 1002, splits, 77);
      const int group = s.q_heads / s.kv_heads;
      for (int h = 0; h < s.q_heads; ++h) {
        test::DenseQuery dq{q.data() + static_cast<size_t>(h) * s.head_dim,
                            f.dump.layers[0].k.data.data() + static_cast<size_t>(h / group) * s.head_dim,
                            f.dump.layers[0].v.data.data() + static_cast<size_t>(h / group) * s.head_dim,
                            static_cast<size_t>(s.kv_heads) * s.head_dim, s.head_dim, 0, 1002,
                            1.0f / std::sqrt(static_cast<float>(s.head_dim))};
        const std::vector<double> want = test::attention_in_double(dq);
        double err = 0, norm = 0;
        for (int c = 0; c < s.head_dim; ++c) {
          const double d = got[static_cast<size_t>(h) * s.head_dim + c] - want[static_cast<size_t>(c)];
          err += d * d;
          norm += want[static_cast<size_t>(c)] * want[static_cast<size_t>(c)];
        }
        EXPECT_LT(std::sqrt(err / norm), 1e-5) << "head " << h << ", splits " << splits;
      }
    }
  }
}

TEST(Attention, RowsNotYetCachedContinueTheCache) {
  // The last 21 rows are given with the query: the result is that of a cache holding them all.
  for (const Shape s : {kSmolLM2, kGemma3}) {
    const Filled f(s, 100, 21, 8);
    for (const int position : {78, 79, 80, 95, 99}) check_every_path(f, position, 1, 30 + static_cast<uint64_t>(position));
    check_every_path(f, 99, 3, 31);
  }
}

TEST(Attention, SlidingWindow) {
  // The cache releases blocks wholly before the window of its newest token: at 300 tokens, window
  // 40, it holds positions 256 on, enough for queries at 295 and later.
  const Filled f(kGemma3, 300, 0, 12, 0.0, 40);
  EXPECT_EQ(f.gaac.usage().elements, 44u * 256 * 2);
  for (const int position : {295, 297, 299}) check_every_path(f, position, 1, 40 + static_cast<uint64_t>(position), 40);
  // Rows not cached yet, under a window.
  const Filled g(kSmolLM2, 300, 30, 13, 0.0, 64);
  for (const int position : {270, 285, 299}) check_every_path(g, position, 1, 42 + static_cast<uint64_t>(position), 64);
  // The cache's own window is the default.
  const std::vector<float> q41 = random_q(4 * 256, 41);
  const std::vector<float> own = run(attention::scalar_kernels(), f.gaac, f.gaac_id, f, q41, 299, AttentionPath::fused, 1, -1);
  const std::vector<float> forty = run(attention::scalar_kernels(), f.gaac, f.gaac_id, f, q41, 299, AttentionPath::fused, 1, 40);
  EXPECT_EQ(std::memcmp(own.data(), forty.data(), own.size() * sizeof(float)), 0);
  // An explicit window that reaches released blocks is an error.
  const std::vector<float> q = random_q(4 * 256, 1);
  EXPECT_THROW(run(attention::scalar_kernels(), f.gaac, f.gaac_id, f, q, 299, AttentionPath::fused, 1, 0), Error);
}

TEST(Attention, RawFallbackTilesAndEveryMode) {
  // Many outliers: most tiles overflow their slots and stay raw; the others carry raw and 4-bit groups.
  for (const Shape s : {kSmolLM2, kGemma3, kLlama8B}) {
    const Filled f(s, 200, 0, 14, 0.001);
    const CacheUsage u = f.gaac.usage();
    EXPECT_GT(u.raw_tiles, 0u);
    EXPECT_GT(u.compressed_tiles, 0u);
    check_every_path(f, 199, 1, 50);
    check_every_path(f, 100, 3, 51);
  }
}

/// A calibration whose every channel has windows [120, 127] and [116, 131] and escape capacity 16.
CalibrationTable fixed_windows(int heads, int head_dim) {
  CalibrationTable t(1, heads, head_dim);
  for (const TensorKind kind : {TensorKind::key, TensorKind::value}) {
    for (int h = 0; h < heads; ++h) {
      for (uint8_t& b : t.b3(kind, 0, h)) b = 120;
      for (uint8_t& b : t.b4(kind, 0, h)) b = 116;
    }
    t.set_escape_capacity(kind, 0, 16);
  }
  return t;
}

TEST(Attention, SlotsExactlyFullAndOneByteOver) {
  // Block 0 of head 0: 16 groups in 4-bit mode (16 escape bytes: the slot exactly full); block 1: 17
  // (one byte over: raw). Every other element in the 3-bit window.
  const Shape s{4, 2, 128};
  KvDump dump = Filled::make_dump(s, 40, 21, 0.0);
  std::mt19937_64 rng(5);
  for (const TensorKind kind : {TensorKind::key, TensorKind::value}) {
    KvTensor& t = dump.layers[0].of(kind);
    for (uint16_t& x : t.data) x = static_cast<uint16_t>((rng() & 0x807F) | ((120 + rng() % 8) << 7));
    const TileShape shape{kind, 128};
    for (int b = 0; b < 2; ++b) {
      for (int g = 0; g < 16 + b; ++g) {  // one element of group g at exponent 130: 4-bit, not 3-bit
        const ElementSlot at = element_slot(shape, g / shape.groups_per_lane(), 2 * (g % shape.groups_per_lane()), 0);
        uint16_t& x = t.data[(static_cast<size_t>(16 * b + at.token) * 2) * 128 + at.channel];
        x = static_cast<uint16_t>((x & 0x807F) | (130 << 7));
      }
    }
  }
  const Filled f(s, std::move(dump), 0, fixed_windows(2, 128));
  const CacheUsage u = f.gaac.usage();
  EXPECT_EQ(u.compressed_tiles, 6u);  // block 0: all four; block 1: head 1's K and V
  EXPECT_EQ(u.raw_tiles, 2u);         // block 1: head 0's K and V
  EXPECT_EQ(u.tail_tiles, 4u);
  for (const int position : {15, 31, 39}) check_every_path(f, position, 1, 60 + static_cast<uint64_t>(position));
}

TEST(Attention, ABatchEqualsOneCallPerSequence) {
  const Filled a(kSmolLM2, 70, 0, 1), b(kSmolLM2, 3, 0, 2);
  // Both sequences in one cache.
  KvCache cache(Filled::config(a.dump, a.table, CacheFormat::gaac, 0));
  const SequenceId ia = cache.add_sequence(), ib = cache.add_sequence();
  for (const auto& [id, f] : {std::pair{ia, &a}, std::pair{ib, &b}}) {
    const KvView k[] = {view_of(f->dump.layers[0].k)};
    const KvView v[] = {view_of(f->dump.layers[0].v)};
    ASSERT_EQ(cache.append(id, k, v).status, CacheStatus::ok);
  }
  const std::vector<float> q = random_q(2 * 9 * 64, 9);
  std::vector<float> out(q.size());
  const AttentionQuery queries[] = {{ia, 69, q.data(), out.data(), {}, {}}, {ib, 2, q.data() + 9 * 64, out.data() + 9 * 64, {}, {}}};
  AttentionOptions o;
  o.q_heads = 9;
  o.scale = 0.125f;
  attend(cache, 0, queries, o);
  for (int i = 0; i < 2; ++i) {
    const Filled& f = i == 0 ? a : b;
    const std::vector<float> want = f.oracle(std::vector<float>(q.begin() + i * 576, q.begin() + (i + 1) * 576), i == 0 ? 69 : 2, 0);
    for (size_t j = 0; j < want.size(); ++j) ASSERT_TRUE(same_bits(out[static_cast<size_t>(i) * 576 + j], want[j])) << i << " " << j;
  }
}

/// Queries at positions `first` .. `last` of `f`'s sequence in one call (those from f.cached on with
/// the extra rows), through every kernel set and cache: each query's output equals the oracle's bit
/// for bit, as when it is attended alone. Consecutive queries are attended together as tiles.
void check_consecutive_queries(const Filled& f, int first, int last, int window, uint64_t seed) {
  const size_t width = static_cast<size_t>(f.shape.q_heads) * f.shape.head_dim;
  const int n = last - first + 1;
  const std::vector<float> q = random_q(static_cast<size_t>(n) * width, seed);
  std::vector<std::vector<float>> want;
  for (int i = 0; i < n; ++i) {
    want.push_back(f.oracle(std::vector<float>(q.begin() + static_cast<ptrdiff_t>(i * width), q.begin() + static_cast<ptrdiff_t>((i + 1) * width)),
                            first + i, window));
  }
  for (const auto& [name, k] : test::kernel_sets()) {
    for (const auto& [cache_name, cache, id, path] :
         {std::tuple{"gaac fused", &f.gaac, f.gaac_id, AttentionPath::fused}, std::tuple{"gaac reference", &f.gaac, f.gaac_id, AttentionPath::reference},
          std::tuple{"bf16", &f.bf16, f.bf16_id, AttentionPath::fused}}) {
      std::vector<float> out(q.size(), std::nanf(""));
      std::vector<AttentionQuery> queries;
      for (int i = 0; i < n; ++i) {
        AttentionQuery query{id, first + i, q.data() + i * width, out.data() + i * width, {}, {}};
        if (first + i >= f.cached) {
          query.extra_k = f.extra_k();
          query.extra_v = f.extra_v();
        }
        queries.push_back(query);
      }
      AttentionOptions o;
      o.q_heads = f.shape.q_heads;
      o.scale = 1.0f / std::sqrt(static_cast<float>(f.shape.head_dim));
      o.path = path;
      o.window = window;
      o.parallel = [](size_t jobs, const std::function<void(size_t, size_t)>& body) {
        for (size_t j = jobs; j-- > 0;) body(j, j + 1);  // one job at a time, last first
      };
      attention::attend_with(*k, *cache, 0, queries, o);
      for (int i = 0; i < n; ++i) {
        for (size_t c = 0; c < width; ++c) {
          const float got = out[static_cast<size_t>(i) * width + c];
          ASSERT_TRUE(same_bits(got, want[static_cast<size_t>(i)][c]))
              << name << ", " << cache_name << ": position " << first + i << " element " << c << ": " << got << " vs oracle "
              << want[static_cast<size_t>(i)][c];
        }
      }
    }
  }
}

TEST(Attention, ConsecutiveQueriesInOneCallGiveEachQuerysBits) {
  for (const Shape s : {kSmolLM2, kGemma3, kLlama8B}) {
    SCOPED_TRACE("shape " + std::to_string(s.q_heads) + "/" + std::to_string(s.kv_heads) + "/" + std::to_string(s.head_dim));
    // 75 cached tokens (blocks of compressed tiles, a tail), 45 given with the queries: tiles that
    // start off a block edge and cross the cache's end, blocks attended whole and in part.
    const Filled f(s, 120, 45, 90, 0.0005);
    check_consecutive_queries(f, 0, 119, 0, 91);
    check_consecutive_queries(f, 70, 89, 0, 92);
    check_consecutive_queries(f, 99, 99, 0, 93);
  }
  // Sliding windows: each query of a tile starts elsewhere.
  const Filled w(kSmolLM2, 150, 60, 94, 0.0, 40);
  check_consecutive_queries(w, 110, 149, 40, 95);
}

TEST(Attention, ConsecutiveQueriesWithZerosAndExtremes) {
  // Zero and negative-zero keys, values and queries, huge and tiny values: the tiles' lane-wise
  // reductions and softmax take the oracle's steps for every one of them.
  KvDump dump = Filled::make_dump(kSmolLM2, 80, 96, 0.0);
  std::mt19937_64 rng(97);
  for (KvTensor* t : {&dump.layers[0].k, &dump.layers[0].v}) {
    for (uint16_t& x : t->data) {
      switch (rng() % 16) {
        case 0: x = 0x0000; break;
        case 1: x = 0x8000; break;
        case 2: x = static_cast<uint16_t>(0x4780 | (rng() & 0x807F)); break;  // about ±2^16
        case 3: x = static_cast<uint16_t>(0x0080 | (rng() & 0x807F)); break;  // near the smallest normal
        default: break;
      }
    }
  }
  const KvDump* dumps[] = {&dump};
  // Calibrated before the dump moves: the order in which a call's arguments are evaluated is unspecified.
  CalibrationTable table = calibrate(dumps);
  const Filled f(kSmolLM2, std::move(dump), 30, std::move(table));
  check_consecutive_queries(f, 0, 79, 0, 98);
}

TEST(Attention, RejectsBadArguments) {
  const Filled f(kSmolLM2, 20, 0, 1);
  const std::vector<float> q = random_q(9 * 64, 1);
  std::vector<float> out(q.size());
  AttentionOptions o;
  o.q_heads = 9;
  AttentionQuery query{f.gaac_id, 19, q.data(), out.data(), {}, {}};
  EXPECT_NO_THROW(attend(f.gaac, 0, std::span(&query, 1), o));
  o.q_heads = 8;  // does not divide over 3 KV heads
  EXPECT_THROW(attend(f.gaac, 0, std::span(&query, 1), o), Error);
  o.q_heads = 9;
  EXPECT_THROW(attend(f.gaac, 1, std::span(&query, 1), o), Error);  // no such layer
  query.position = 20;                                               // past the cache, no extra rows
  EXPECT_THROW(attend(f.gaac, 0, std::span(&query, 1), o), Error);
  query.position = 19;
  query.sequence = 99;
  EXPECT_THROW(attend(f.gaac, 0, std::span(&query, 1), o), Error);
  query.sequence = f.gaac_id;
  o.splits = 0;
  EXPECT_THROW(attend(f.gaac, 0, std::span(&query, 1), o), Error);
}

}  // namespace
}  // namespace gaac
