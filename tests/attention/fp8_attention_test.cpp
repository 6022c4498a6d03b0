// CPU attention over the FP8 caches: a gaac-fp8 cache and its plain fp8 twin give the same bits through
// every kernel set, path and range split; with one range those are the dense oracle's over the codes
// widened exactly to BF16, with the softmax scale times the K scale and the output times the V scale
// (docs/format.md, section 13), and they stay within FP8 rounding of a float64 reference over the codes'
// exact values times their scales. E4M3 and E5M2, GQA shapes, block edges, sliding
// windows, raw and compressed tiles, prefill query tiles.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "attention/attention_internal.hpp"
#include "gaac/attention.hpp"
#include "gaac/bf16.hpp"
#include "gaac/error.hpp"
#include "gaac/fp8_dump.hpp"
#include "gaac/synthetic.hpp"
#include "attention_support.hpp"
#include "support/ggml_attention.hpp"

namespace gaac {
namespace {

using test::random_q;
using test::same_bits;
using test::Shape;


/// One layer of FP8 KV (converted from synthetic BF16 with per-tensor scales, a share of its codes and
/// one block of K and of V replaced by random finite bytes so that some tiles stay raw), both FP8 caches holding it as one
/// sequence, and the dense BF16 operands attention must read.
struct Fp8Filled {
  Shape shape;
  int window;  ///< the cache's sliding window (0: none)
  Fp8KvDump dump;
  CalibrationTable table;
  KvCache compressed, plain;
  SequenceId compressed_id = 0, plain_id = 0;
  std::vector<uint16_t> k_bf16, v_bf16;  ///< every code widened: fp8_to_float(x) as BF16 (exact)

  static Fp8KvDump make_dump(Shape s, ElementFormat format, int tokens, uint64_t seed, double outliers) {
    Fp8KvDump d = convert_to_fp8(test::synthetic_layer(s, tokens, seed), format, Fp8Scaling::per_tensor);
    std::mt19937_64 rng(seed + 1);
    std::uniform_real_distribution<double> u(0, 1);
    const size_t row = static_cast<size_t>(s.kv_heads) * s.head_dim;
    for (Fp8KvTensor* t : {&d.layers[0].k, &d.layers[0].v}) {
      // With outliers, one whole block (K: the third, V: the fifth) of them too: tiles that surely stay raw.
      const size_t block = t == &d.layers[0].k ? 2 : 4, from = block * kTileTokens * row, to = from + kTileTokens * row;
      for (size_t i = 0; i < t->data.size(); ++i) {
        if (u(rng) >= outliers && !(outliers > 0 && i >= from && i < to)) continue;
        uint8_t& x = t->data[i];
        do x = static_cast<uint8_t>(rng());
        while (!std::isfinite(fp8_to_float(x, format)));
      }
    }
    return d;
  }

  static CalibrationTable calibrated(Shape s, ElementFormat format, int tokens, uint64_t seed) {
    const Fp8KvDump calib = make_dump(s, format, tokens, seed, 0.0);  // the same KV without its outliers
    const Fp8KvDump* dumps[] = {&calib};
    return calibrate(dumps);
  }

  CacheConfig config(CacheFormat format) const {
    CacheConfig c;
    c.geometry = {1, shape.kv_heads, shape.head_dim, {window}};
    c.format = format;
    c.budget_bytes = size_t{16} << 20;
    c.calibration = &table;
    c.fp8 = {dump.format, dump.k_scales, dump.v_scales};
    return c;
  }

  Fp8Filled(Shape s, ElementFormat format, int tokens, uint64_t seed, double outliers, int cache_window = 0)
      : shape(s),
        window(cache_window),
        dump(make_dump(s, format, tokens, seed, outliers)),
        table(calibrated(s, format, tokens, seed)),
        compressed(config(CacheFormat::gaac_fp8)),
        plain(config(CacheFormat::fp8)) {
    compressed_id = compressed.add_sequence();
    plain_id = plain.add_sequence();
    test::fill_twins(compressed, compressed_id, plain, plain_id, dump.layers[0].k, dump.layers[0].v, tokens);
    for (const auto& [codes, out] : {std::pair{&dump.layers[0].k, &k_bf16}, std::pair{&dump.layers[0].v, &v_bf16}}) {
      for (const uint8_t x : codes->data) {
        const uint16_t widened = float_to_bf16(fp8_to_float(x, dump.format));
        EXPECT_TRUE(std::isnan(fp8_to_float(x, dump.format)) || bf16_to_float(widened) == fp8_to_float(x, dump.format))
            << "code " << int{x} << " is not a BF16 value";
        out->push_back(widened);
      }
    }
  }

  /// The dense query of query head `h` at `position` over the widened operands, sliding window `w`: the
  /// softmax scale times the K scale, the output times the V scale.
  test::DenseQuery dense(const std::vector<float>& q, int h, int position, int w) const {
    test::DenseQuery dq = test::dense_query(shape, q, k_bf16.data(), v_bf16.data(), h, position, w);
    dq.scale *= dump.k_scales[0];
    dq.output_scale = dump.v_scales[0];
    return dq;
  }

  /// Float64 attention of query head `h` over the codes' exact values times their scales (q rounded
  /// to BF16, as every path rounds it), and the largest |value| it attends.
  std::pair<std::vector<double>, double> exact(const std::vector<float>& q, int h, int position, int w) const {
    const test::DenseQuery dq = test::dense_query(shape, q, k_bf16.data(), v_bf16.data(), h, position, w);  // scales below
    const size_t d = static_cast<size_t>(shape.head_dim), offset = static_cast<size_t>(dq.keys - k_bf16.data());
    const auto value = [&](const Fp8KvTensor& t, float scale, int p, size_t c) {
      return static_cast<double>(fp8_to_float(t.data[offset + static_cast<size_t>(p) * dq.stride + c], dump.format)) * scale;
    };
    std::vector<double> scores;
    double top = -INFINITY, vmax = 0;
    for (int p = dq.first; p <= dq.last; ++p) {
      double s = 0;
      for (size_t c = 0; c < d; ++c) s += static_cast<double>(bf16_to_float(float_to_bf16(dq.q[c]))) * value(dump.layers[0].k, dump.k_scales[0], p, c);
      scores.push_back(s * dq.scale);
      top = std::max(top, scores.back());
    }
    std::vector<double> out(d, 0.0);
    double sum = 0;
    for (int p = dq.first; p <= dq.last; ++p) {
      const double weight = std::exp(scores[static_cast<size_t>(p - dq.first)] - top);
      sum += weight;
      for (size_t c = 0; c < d; ++c) {
        const double v = value(dump.layers[0].v, dump.v_scales[0], p, c);
        out[c] += weight * v;
        vmax = std::max(vmax, std::abs(v));
      }
    }
    for (double& x : out) x /= sum;
    return {out, vmax};
  }
};

/// Output of one attention call over `cache` for the queries at `positions` (one call: consecutive
/// positions go as a query tile), each query's q the same.
std::vector<float> run(const attention::Kernels& kernels, const KvCache& cache, SequenceId id, const Fp8Filled& f,
                       const std::vector<float>& q, const std::vector<int>& positions, AttentionPath path, int splits, int window) {
  const size_t n = q.size();
  std::vector<float> out(n * positions.size(), std::nanf(""));
  std::vector<AttentionQuery> queries;
  for (size_t i = 0; i < positions.size(); ++i) queries.push_back({id, positions[i], q.data(), out.data() + i * n, {}, {}});
  attention::attend_with(kernels, cache, 0, queries, test::options_for(f.shape, path, splits, window));
  return out;
}

/// Every kernel set, path and cache at `position` (window −1: the cache's): the same bits; with one
/// range the oracle's over the widened operands; within FP8 rounding of the float64 reference.
void check_position(const Fp8Filled& f, int position, int splits, int window, uint64_t seed) {
  const std::vector<float> q = random_q(static_cast<size_t>(f.shape.q_heads) * f.shape.head_dim, seed);
  std::vector<std::pair<std::string, std::vector<float>>> results;
  for (const auto& [name, k] : test::kernel_sets()) {
    for (const AttentionPath path : {AttentionPath::fused, AttentionPath::reference}) {
      results.emplace_back(std::string("gaac-fp8 ") + to_string(path) + " " + name,
                           run(*k, f.compressed, f.compressed_id, f, q, {position}, path, splits, window));
    }
    results.emplace_back(std::string("fp8 ") + name, run(*k, f.plain, f.plain_id, f, q, {position}, AttentionPath::fused, splits, window));
  }
  const std::vector<float>& first = results.front().second;
  for (const auto& [name, out] : results) {
    for (size_t i = 0; i < out.size(); ++i) {
      ASSERT_TRUE(same_bits(out[i], first[i])) << name << " differs from " << results.front().first << " at " << i << " (position "
                                               << position << ", splits " << splits << ")";
    }
  }
  const int w = window < 0 ? f.window : window;
  for (int h = 0; h < f.shape.q_heads; ++h) {
    const float* got = first.data() + static_cast<size_t>(h) * f.shape.head_dim;
    if (splits == 1) {
      const std::vector<float> want = test::ggml_attention(f.dense(q, h, position, w));
      for (size_t c = 0; c < want.size(); ++c) ASSERT_TRUE(same_bits(got[c], want[c])) << "head " << h << " channel " << c << " vs the oracle";
    }
    const auto [reference, vmax] = f.exact(q, h, position, w);
    const double tolerance = vmax / 32;  // FP8 rounding: E4M3 keeps 4 significant bits, E5M2 3
    for (size_t c = 0; c < reference.size(); ++c) {
      ASSERT_NEAR(got[c], reference[c], tolerance) << "head " << h << " channel " << c << " position " << position;
    }
  }
}

TEST(Fp8Attention, TwinsGiveTheSameBitsAsTheOracleOverWidenedOperands) {
  for (const ElementFormat format : {ElementFormat::e4m3, ElementFormat::e5m2}) {
    for (const Shape shape : {Shape{9, 3, 64}, Shape{4, 1, 256}, Shape{8, 2, 128}}) {
      SCOPED_TRACE(std::string(to_string(format)) + " head_dim " + std::to_string(shape.head_dim));
      const Fp8Filled f(shape, format, 150, 17 + static_cast<uint64_t>(shape.head_dim), 0.004);
      const CacheUsage u = f.compressed.usage();
      EXPECT_GT(u.compressed_tiles, 0u);
      EXPECT_GT(u.raw_tiles, 0u);
      for (const int position : {0, 1, 15, 16, 17, 63, 64, 100, 149}) {
        for (const int splits : {1, 3}) ASSERT_NO_FATAL_FAILURE(check_position(f, position, splits, -1, 5 + static_cast<uint64_t>(position)));
      }
    }
  }
}

TEST(Fp8Attention, SlidingWindows) {
  // The cache's own window of 40 (its early blocks released), and narrower windows asked for.
  const Fp8Filled sliding(Shape{4, 2, 128}, ElementFormat::e4m3, 200, 3, 0.01, 40);
  ASSERT_NO_FATAL_FAILURE(check_position(sliding, 199, 1, -1, 9));
  for (const int position : {176, 185, 199}) ASSERT_NO_FATAL_FAILURE(check_position(sliding, position, 2, 16, 10));
  // A window over a cache that holds everything: across block edges from the first position on.
  const Fp8Filled full(Shape{4, 2, 128}, ElementFormat::e5m2, 130, 4, 0.01);
  for (const int position : {39, 40, 41, 120}) ASSERT_NO_FATAL_FAILURE(check_position(full, position, 1, 40, 11));
}

TEST(Fp8Attention, PrefillQueryTilesEqualQueriesAlone) {
  const Fp8Filled f(Shape{6, 2, 64}, ElementFormat::e5m2, 120, 7, 0.01);
  const std::vector<float> q = random_q(static_cast<size_t>(f.shape.q_heads) * f.shape.head_dim, 11);
  std::vector<int> positions;
  for (int p = 90; p < 110; ++p) positions.push_back(p);
  for (const KvCache* cache : {&f.compressed, &f.plain}) {
    const SequenceId id = cache == &f.compressed ? f.compressed_id : f.plain_id;
    const std::vector<float> together = run(attention::best_kernels(), *cache, id, f, q, positions, AttentionPath::fused, 1, -1);
    for (size_t i = 0; i < positions.size(); ++i) {
      const std::vector<float> alone = run(attention::best_kernels(), *cache, id, f, q, {positions[i]}, AttentionPath::fused, 1, -1);
      for (size_t c = 0; c < alone.size(); ++c) ASSERT_TRUE(same_bits(together[i * q.size() + c], alone[c])) << "query " << i;
    }
  }
}

TEST(Fp8Attention, RefusesExtraRows) {
  const Fp8Filled f(Shape{2, 1, 64}, ElementFormat::e4m3, 20, 1, 0.0);
  const std::vector<float> q = random_q(128, 1);
  std::vector<float> out(128);
  const std::vector<uint16_t> rows(64, 0);
  AttentionQuery query{f.plain_id, 20, q.data(), out.data(), {}, {}};
  query.extra_k = query.extra_v = KvView{rows.data(), 1, 1, 64, 64, 64};
  AttentionOptions o;
  o.q_heads = 2;
  EXPECT_THROW(attend(f.plain, 0, std::span(&query, 1), o), Error);
}

}  // namespace
}  // namespace gaac
