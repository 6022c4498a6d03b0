// Decode attention on the GPU over FP8 caches (docs/format.md, section 13): a GAAC-FP8 cache and its
// plain FP8 twin give the same bits at the same plan, within BF16 rounding of an fp64 reference over the
// codes' exact values times their scales; every finite code is widened exactly (a window of one token
// returns a value row itself); tiles holding NaN or infinity codes go through the table and both caches
// still agree; the kernels that write or rebuild tiles refuse FP8 caches. E4M3 and E5M2, head widths 64,
// 128 and 256, groups of 1 to 16, raw and compressed tiles, splits and sliding windows. Skipped, with a
// message, where no CUDA device exists.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <span>
#include <vector>

#include "gaac/bf16.hpp"
#include "gaac/calibration.hpp"
#include "gaac/cuda.hpp"
#include "gaac/error.hpp"
#include "gaac/fp8_dump.hpp"
#include "gaac/synthetic.hpp"

namespace gaac {
namespace {

using namespace gaac::cuda;

class GpuFp8Decode : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!device_available()) GTEST_SKIP() << "no CUDA device: GPU FP8 decode-attention tests skipped";
  }
};

/// One pair of FP8 caches and a batch to check.
struct Fp8Case {
  ElementFormat format = ElementFormat::e4m3;
  int kv_heads = 2;
  int group = 4;
  int head_dim = 128;
  std::vector<int> lengths = {1000};
  int window = 0;
  int blocks_per_split = 0;  // 0: the planner's
  int heads_per_cta = 0;
  double outliers = 0.002;   // share of codes replaced by random finite codes (raw groups, raw tiles)
  double specials = 0.0;     // share of codes replaced by NaN (and, E5M2, infinity) codes
  bool every_code = false;   // V rows cycle through every finite code of the format
  bool zero_queries = false; // q = 0: every attended token weighs exactly 1
  uint64_t seed = 1;
};

/// The codes of every sequence of a case, one after another in one dump (one scale per K and V, as a
/// cache has per layer): sequence s is tokens first[s] .. first[s] + lengths[s] − 1.
struct Fp8Data {
  Fp8KvDump dump;
  std::vector<int> first;
};

uint8_t random_code(std::mt19937_64& rng, ElementFormat f, bool special) {
  for (;;) {
    const auto x = static_cast<uint8_t>(rng());
    if (std::isfinite(fp8_to_float(x, f)) != special) return x;
  }
}

Fp8Data make_data(const Fp8Case& c) {
  Fp8Data d;
  int total = 0;
  for (const int len : c.lengths) d.first.push_back(total), total += len;
  SyntheticKvSpec spec;
  spec.layers = 1, spec.kv_heads = c.kv_heads, spec.head_dim = c.head_dim, spec.tokens = total, spec.seed = c.seed;
  d.dump = convert_to_fp8(make_synthetic_kv(spec), c.format, Fp8Scaling::per_tensor);
  std::mt19937_64 rng(c.seed * 7 + 1);
  std::uniform_real_distribution<double> u(0, 1);
  for (Fp8KvTensor* t : {&d.dump.layers[0].k, &d.dump.layers[0].v}) {
    for (uint8_t& x : t->data) {
      if (u(rng) < c.outliers) x = random_code(rng, c.format, false);
      if (u(rng) < c.specials) x = random_code(rng, c.format, true);
    }
  }
  if (c.every_code) {
    std::vector<uint8_t> finite;
    for (int x = 0; x < 256; ++x)
      if (std::isfinite(fp8_to_float(static_cast<uint8_t>(x), c.format))) finite.push_back(static_cast<uint8_t>(x));
    std::vector<uint8_t>& v = d.dump.layers[0].v.data;
    for (size_t i = 0; i < v.size(); ++i) v[i] = finite[(i * 37 + i / 997) % finite.size()];
  }
  return d;
}

/// Tokens `first` .. `first + tokens − 1` of `t`.
Fp8KvTensor slice(const Fp8KvTensor& t, int first, int tokens) {
  Fp8KvTensor s;
  s.tokens = tokens, s.kv_heads = t.kv_heads, s.head_dim = t.head_dim;
  const size_t row = static_cast<size_t>(t.kv_heads) * t.head_dim;
  s.data.assign(t.data.begin() + static_cast<ptrdiff_t>(first * row), t.data.begin() + static_cast<ptrdiff_t>((first + tokens) * row));
  return s;
}

/// A host cache of `format` holding every sequence of `d`, appended in uneven steps (tails, prefills,
/// single tokens; tiles in units out of order), and the ids of its sequences.
KvCache fill(const Fp8Case& c, const Fp8Data& d, const CalibrationTable& table, CacheFormat format,
             std::vector<SequenceId>& ids) {
  CacheConfig config;
  config.geometry = {1, c.kv_heads, c.head_dim, {c.window}};
  config.format = format;
  size_t tokens = 0;
  for (const int len : c.lengths) tokens += static_cast<size_t>(len) + 32;
  config.budget_bytes = (size_t{8} << 20) + tokens * static_cast<size_t>(c.kv_heads) * c.head_dim * 4;
  config.calibration = &table;
  config.fp8 = {d.dump.format, d.dump.k_scales, d.dump.v_scales};
  KvCache cache(config);
  const int steps[] = {1, 37, 3, 16, 90, 2};
  for (size_t s = 0; s < c.lengths.size(); ++s) {
    const SequenceId id = cache.add_sequence();
    ids.push_back(id);
    const Fp8KvTensor k = slice(d.dump.layers[0].k, d.first[s], c.lengths[s]);
    const Fp8KvTensor v = slice(d.dump.layers[0].v, d.first[s], c.lengths[s]);
    for (int at = 0, i = 0; at < c.lengths[s]; ++i) {
      const int n = std::min(steps[(i + static_cast<int>(s)) % 6], c.lengths[s] - at);
      const Fp8KvView kv[] = {view_of(k).tokens_from(at, n)};
      const Fp8KvView vv[] = {view_of(v).tokens_from(at, n)};
      EXPECT_EQ(cache.append(id, kv, vv).status, CacheStatus::ok);
      at += n;
    }
  }
  return cache;
}

/// fp64 attention of query head h of sequence s over the codes' exact values times their scales.
std::vector<double> reference(const Fp8Case& c, const Fp8Data& d, const std::vector<uint16_t>& q, int s, int h) {
  const int len = c.lengths[static_cast<size_t>(s)], hd = c.head_dim, kvh = h / c.group, heads = c.kv_heads * c.group;
  const int first = first_attended(len - 1, c.window);
  const double scale = 1.0 / std::sqrt(static_cast<double>(hd));
  const auto value = [&](const Fp8KvTensor& t, float tensor_scale, int pos, int ch) {
    return static_cast<double>(fp8_to_float(t.at(d.first[static_cast<size_t>(s)] + pos, kvh, ch), c.format)) * tensor_scale;
  };
  std::vector<double> scores;
  double top = -INFINITY;
  for (int pos = first; pos < len; ++pos) {
    double dot = 0;
    for (int ch = 0; ch < hd; ++ch)
      dot += static_cast<double>(bf16_to_float(q[(static_cast<size_t>(s) * heads + h) * hd + ch])) *
             value(d.dump.layers[0].k, d.dump.k_scales[0], pos, ch);
    scores.push_back(dot * scale);
    top = std::max(top, dot * scale);
  }
  std::vector<double> out(static_cast<size_t>(hd), 0.0);
  double sum = 0;
  for (int pos = first; pos < len; ++pos) {
    const double p = std::exp(scores[static_cast<size_t>(pos - first)] - top);
    sum += p;
    for (int ch = 0; ch < hd; ++ch) out[static_cast<size_t>(ch)] += p * value(d.dump.layers[0].v, d.dump.v_scales[0], pos, ch);
  }
  for (double& x : out) x /= sum;
  return out;
}

struct Fp8Outputs {
  std::vector<uint16_t> gaac, twin, q;
  Fp8Data data;
  uint64_t compressed = 0, raw = 0;  // tiles of the GAAC-FP8 cache
};

/// Fills both caches, runs both kernels with the same split, and returns their outputs.
Fp8Outputs run_case(const Fp8Case& c) {
  Fp8Outputs o;
  o.data = make_data(c);
  const Fp8KvDump* dumps[] = {&o.data.dump};
  const CalibrationTable table = calibrate(std::span<const Fp8KvDump* const>(dumps));
  std::vector<SequenceId> ids_gaac, ids_plain;
  const KvCache host_gaac = fill(c, o.data, table, CacheFormat::gaac_fp8, ids_gaac);
  const KvCache host_plain = fill(c, o.data, table, CacheFormat::fp8, ids_plain);
  const CacheMemory dev_gaac = CacheMemory::upload(host_gaac);
  const CacheMemory dev_plain = CacheMemory::upload(host_plain);
  const BatchTable seqs_gaac = BatchTable::upload(host_gaac.sequence_table(ids_gaac).view());
  const BatchTable seqs_plain = BatchTable::upload(host_plain.sequence_table(ids_plain).view());
  const CacheMemory::TileCounts counts = dev_gaac.count_tiles();
  o.compressed = counts.compressed, o.raw = counts.raw;

  const int heads = c.kv_heads * c.group, n = static_cast<int>(c.lengths.size());
  std::mt19937_64 rng(c.seed + 99);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  o.q.resize(static_cast<size_t>(n) * heads * c.head_dim);
  for (uint16_t& x : o.q) x = c.zero_queries ? 0 : float_to_bf16(normal(rng));
  DeviceBuffer dq(o.q.size() * 2), dout(o.q.size() * 2);
  dq.upload(o.q.data(), o.q.size() * 2);

  DecodeConfig config;
  config.q_heads = heads;
  config.blocks_per_split = c.blocks_per_split;
  config.heads_per_cta = c.heads_per_cta;
  DecodePlan plan;
  plan.plan(dev_gaac, seqs_gaac, config);
  config.blocks_per_split = plan.split(0).blocks_per_split;  // the same split for both: the same bits
  const std::vector<uint16_t> poison(o.q.size(), 0x7FC1);   // a NaN no kernel writes
  const auto run = [&](const CacheMemory& cache, const BatchTable& batch) {
    dout.upload(poison.data(), poison.size() * 2);
    plan.plan(cache, batch, config);
    plan.run(cache, batch, 0, static_cast<const uint16_t*>(dq.data()), static_cast<uint16_t*>(dout.data()));
    std::vector<uint16_t> out(o.q.size());
    dout.download(out.data(), out.size() * 2);  // synchronises, and reports launch errors
    for (const uint16_t x : out) EXPECT_NE(x, 0x7FC1u) << "an output element was not written";
    return out;
  };
  o.gaac = run(dev_gaac, seqs_gaac);
  o.twin = run(dev_plain, seqs_plain);
  return o;
}

void expect_identical(const Fp8Outputs& o) {
  size_t differ = 0;
  for (size_t i = 0; i < o.gaac.size(); ++i) differ += o.gaac[i] != o.twin[i];
  EXPECT_EQ(differ, 0u) << "GAAC-FP8 and FP8-twin outputs differ in " << differ << " of " << o.gaac.size() << " elements";
}

/// Relative L2 error of the GAAC-FP8 output against the fp64 reference, the worst over heads.
double worst_error(const Fp8Case& c, const Fp8Outputs& o) {
  const int heads = c.kv_heads * c.group, hd = c.head_dim;
  double worst = 0;
  for (int s = 0; s < static_cast<int>(c.lengths.size()); ++s)
    for (int h = 0; h < heads; ++h) {
      const std::vector<double> ref = reference(c, o.data, o.q, s, h);
      double err = 0, norm = 0;
      for (int ch = 0; ch < hd; ++ch) {
        const double got = bf16_to_float(o.gaac[(static_cast<size_t>(s) * heads + h) * hd + ch]);
        err += (got - ref[static_cast<size_t>(ch)]) * (got - ref[static_cast<size_t>(ch)]);
        norm += ref[static_cast<size_t>(ch)] * ref[static_cast<size_t>(ch)];
      }
      worst = std::max(worst, std::sqrt(err / std::max(norm, 1e-30)));
    }
  return worst;
}

/// Runs `c` and checks what every case must hold: compressed tiles, the twins' same bits, fp64's values.
Fp8Outputs check(const Fp8Case& c) {
  Fp8Outputs o = run_case(c);
  EXPECT_GT(o.compressed, 0u) << "no compressed tile: the case does not test the slot decoder";
  expect_identical(o);
  EXPECT_LT(worst_error(c, o), 1e-2) << "relative L2 error against fp64";
  return o;
}

TEST_F(GpuFp8Decode, SmallCaseForTheSanitizers) {
  for (const ElementFormat f : {ElementFormat::e4m3, ElementFormat::e5m2}) {
    Fp8Case c;
    c.format = f, c.lengths = {17, 40}, c.blocks_per_split = 1;
    SCOPED_TRACE(to_string(f));
    check(c);
  }
}

TEST_F(GpuFp8Decode, BothFormatsHeadWidthsAndGroups) {
  for (const ElementFormat f : {ElementFormat::e4m3, ElementFormat::e5m2})
    for (const auto& [kv, group, hd] : {std::tuple{8, 4, 128}, std::tuple{3, 3, 64}, std::tuple{1, 4, 256},
                                       std::tuple{2, 16, 128}, std::tuple{1, 12, 64}, std::tuple{4, 1, 128}}) {
      Fp8Case c;
      c.format = f, c.kv_heads = kv, c.group = group, c.head_dim = hd, c.lengths = {33, 1234, 2049};
      SCOPED_TRACE(testing::Message() << to_string(f) << " kv " << kv << " group " << group << " head_dim " << hd);
      check(c);
    }
}

TEST_F(GpuFp8Decode, SplitsWindowsAndEightHeadCtas) {
  for (const ElementFormat f : {ElementFormat::e4m3, ElementFormat::e5m2}) {
    Fp8Case c;
    c.format = f, c.lengths = {1, 15, 16, 17, 100, 4097};
    for (const int bps : {1, 3, 0}) {
      c.blocks_per_split = bps;
      SCOPED_TRACE(testing::Message() << to_string(f) << " blocks per split " << bps);
      check(c);
    }
    c.blocks_per_split = 0, c.lengths = {1000, 77, 2500}, c.window = 300;
    check(c);
    c.window = 0, c.group = 12, c.heads_per_cta = 8;
    check(c);
  }
}

TEST_F(GpuFp8Decode, ManyRawGroupsAndRawTiles) {
  for (const ElementFormat f : {ElementFormat::e4m3, ElementFormat::e5m2}) {
    Fp8Case c;
    c.format = f, c.lengths = {700, 1500}, c.outliers = 0.05;
    SCOPED_TRACE(to_string(f));
    EXPECT_GT(check(c).raw, 0u);
  }
}

TEST_F(GpuFp8Decode, EveryFiniteCodeWidenedExactly) {
  // A window of one token and q = 0: each output row is the newest token's value row times the V scale,
  // rounded to BF16 (a zero's sign aside) — exactly, for codes from compressed tiles (lengths that are
  // multiples of 16), raw tiles and tails, every finite code of the format among them.
  for (const ElementFormat f : {ElementFormat::e4m3, ElementFormat::e5m2})
    for (const bool every_code : {false, true}) {
      Fp8Case c;
      c.format = f, c.kv_heads = 2, c.group = 2, c.window = 1, c.zero_queries = true, c.every_code = every_code;
      c.lengths.clear();
      for (int s = 0; s < 48; ++s) c.lengths.push_back(16 * (1 + s % 5) + (s % 3 == 0 ? 0 : s % 16));
      SCOPED_TRACE(testing::Message() << to_string(f) << (every_code ? " every code" : " real codes"));
      const Fp8Outputs o = run_case(c);
      expect_identical(o);
      const int heads = c.kv_heads * c.group;
      size_t wrong = 0, checked = 0;
      for (size_t s = 0; s < c.lengths.size(); ++s)
        for (int h = 0; h < heads; ++h)
          for (int ch = 0; ch < c.head_dim; ++ch) {
            const uint8_t code = o.data.dump.layers[0].v.at(o.data.first[s] + c.lengths[s] - 1, h / c.group, ch);
            const uint16_t want = float_to_bf16(fp8_to_float(code, f) * o.data.dump.v_scales[0]);
            const uint16_t got = o.gaac[(s * heads + static_cast<size_t>(h)) * c.head_dim + static_cast<size_t>(ch)];
            // The products' sum starts at +0 (and adds the other tokens' 0 · v): a −0 value comes out +0.
            wrong += got != want && !((got | want) == 0x8000u);
            ++checked;
          }
      EXPECT_EQ(wrong, 0u) << "of " << checked << " output elements";
    }
}

TEST_F(GpuFp8Decode, NanAndInfinityCodesAgreeBetweenTheTwins) {
  // Tiles holding NaN (and, E5M2, infinity) codes are widened through the table: both caches give the
  // same bits, and a head whose attended keys hold a NaN code gives NaN.
  for (const ElementFormat f : {ElementFormat::e4m3, ElementFormat::e5m2}) {
    Fp8Case c;
    c.format = f, c.lengths = {300, 900}, c.specials = 0.0005;
    SCOPED_TRACE(to_string(f));
    const Fp8Outputs o = run_case(c);
    expect_identical(o);
    size_t nan = 0;
    for (const uint16_t x : o.gaac) nan += std::isnan(bf16_to_float(x));
    EXPECT_GT(nan, 0u) << "no NaN output: the special codes were read as finite values";
  }
}

TEST_F(GpuFp8Decode, KernelsThatWriteTilesRefuseFp8Caches) {
  Fp8Case c;
  c.lengths = {40};
  const Fp8Data d = make_data(c);
  const Fp8KvDump* dumps[] = {&d.dump};
  const CalibrationTable table = calibrate(std::span<const Fp8KvDump* const>(dumps));
  std::vector<SequenceId> ids;
  const KvCache host = fill(c, d, table, CacheFormat::gaac_fp8, ids);
  CacheMemory dev = CacheMemory::upload(host);
  EXPECT_EQ(dev.element_format(), ElementFormat::e4m3);
  EXPECT_EQ(dev.scale(0, TensorKind::value), d.dump.v_scales[0]);
  const BatchTable batch = BatchTable::upload(host.sequence_table(ids).view());
  DeviceBuffer k(size_t{1} << 20), v(size_t{1} << 20);
  DenseLayout out;
  out.k = static_cast<uint16_t*>(k.data()), out.v = static_cast<uint16_t*>(v.data());
  EXPECT_THROW(decompress_dense(dev, batch, 0, 1, out), Error);
  EXPECT_THROW(BatchTable::reserve(dev, 1, 64), Error);
  EXPECT_THROW(finalize_blocks(dev, nullptr, 0, 0, 1), Error);
  CacheConfig config;
  config.geometry = {1, c.kv_heads, c.head_dim, {0}};
  config.format = CacheFormat::fp8;
  config.budget_bytes = size_t{8} << 20;
  config.fp8 = {d.dump.format, d.dump.k_scales, d.dump.v_scales};
  EXPECT_THROW(CacheMemory::create(config), Error);
}

}  // namespace
}  // namespace gaac
