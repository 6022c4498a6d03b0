// Decode attention on the GPU: the fused GAAC kernel gives the same bits as its BF16 twin on the same
// values, decompress-first gives them too, and all are within bf16 rounding of an fp64 reference —
// on realistic caches and adversarial ones (all raw, slots exactly full, every mode in one lane,
// short and odd lengths, splits that do not divide the context, sliding windows). Every cache is a
// gaac::KvCache filled by appends of uneven sizes, so tiles sit in units out of order. Skipped, with a
// message, where no CUDA device exists.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <span>
#include <vector>

#include "cuda/cache_fill.hpp"
#include "gaac/bf16.hpp"
#include "gaac/calibration.hpp"
#include "gaac/cuda.hpp"
#include "gaac/error.hpp"
#include "gaac/synthetic.hpp"

namespace gaac {
namespace {

using namespace gaac::cuda;

class GpuDecode : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!device_available()) GTEST_SKIP() << "no CUDA device: GPU decode-attention tests skipped";
  }
};

/// One cache and batch to check.
struct Case {
  int kv_heads = 8;
  int group = 4;
  int head_dim = 128;
  std::vector<int> lengths = {1000};
  int window = 0;
  int blocks_per_split = 0;  // 0: the planner's
  int warps = 0;             // warps per CTA; 0: the kernel's default
  int heads_per_cta = 0;     // DecodeConfig::heads_per_cta
  int plan_tokens = 0;       // DecodeConfig::plan_tokens
  enum class Data { synthetic, every_mode } data = Data::synthetic;
  bool zero_bases = false;           // every group raw: every tile falls back to raw
  int escape_capacity = -1;          // -1: the calibration's
  uint64_t seed = 1;
};

/// A one-layer dump whose exponents lie, per group of channels, in the 3-bit window with
/// probability p3, else the 4-bit one with p4, else anywhere in [100, 140]: every mode in every lane.
KvDump every_mode_dump(int tokens, int kv, int hd, uint64_t seed) {
  std::mt19937_64 rng(seed);
  KvDump d;
  d.layers.resize(1);
  for (KvTensor* t : {&d.layers[0].k, &d.layers[0].v}) {
    t->tokens = tokens, t->kv_heads = kv, t->head_dim = hd;
    t->data.resize(t->elements());
    for (size_t i = 0; i < t->data.size(); ++i) {
      const double u = std::uniform_real_distribution<double>(0, 1)(rng);
      const int centre = 118 + static_cast<int>(i % static_cast<size_t>(hd)) % 5;
      const int e = u < 0.6 ? centre + static_cast<int>(rng() % 8)
                    : u < 0.97 ? centre - 4 + static_cast<int>(rng() % 16)
                               : 100 + static_cast<int>(rng() % 41);
      t->data[i] = static_cast<uint16_t>((rng() & 1) << 15 | e << 7 | (rng() & 0x7F));
    }
  }
  return d;
}

std::vector<KvDump> make_sequences(const Case& c) {
  std::vector<KvDump> seqs;
  for (size_t s = 0; s < c.lengths.size(); ++s) {
    if (c.data == Case::Data::every_mode) {
      seqs.push_back(every_mode_dump(c.lengths[s], c.kv_heads, c.head_dim, c.seed * 977 + s));
    } else {
      SyntheticKvSpec spec;
      spec.layers = 1, spec.kv_heads = c.kv_heads, spec.head_dim = c.head_dim, spec.tokens = c.lengths[s];
      spec.seed = c.seed * 131 + s;
      seqs.push_back(make_synthetic_kv(spec));
    }
  }
  return seqs;
}

/// fp64 attention of sequence s, query head h over positions first..len-1.
std::vector<double> reference(const KvDump& d, const std::vector<uint16_t>& q, int s, int h, const Case& c) {
  const int len = d.layers[0].k.tokens, hd = c.head_dim, kvh = h / c.group, heads = c.kv_heads * c.group;
  const int first = first_attended(len - 1, c.window);
  const double scale = 1.0 / std::sqrt(static_cast<double>(hd));
  std::vector<double> scores;
  double mx = -INFINITY;
  for (int pos = first; pos < len; ++pos) {
    double dot = 0;
    for (int ch = 0; ch < hd; ++ch)
      dot += static_cast<double>(bf16_to_float(q[(static_cast<size_t>(s) * heads + h) * hd + ch])) *
             bf16_to_float(d.layers[0].k.at(pos, kvh, ch));
    scores.push_back(dot * scale);
    mx = std::max(mx, dot * scale);
  }
  std::vector<double> out(static_cast<size_t>(hd), 0.0);
  double sum = 0;
  for (int pos = first; pos < len; ++pos) {
    const double p = std::exp(scores[static_cast<size_t>(pos - first)] - mx);
    sum += p;
    for (int ch = 0; ch < hd; ++ch) out[static_cast<size_t>(ch)] += p * bf16_to_float(d.layers[0].v.at(pos, kvh, ch));
  }
  for (double& x : out) x /= sum;
  return out;
}

struct Outputs {
  std::vector<uint16_t> gaac, twin, decompress_first;
  test::TileCounts counts;
  int blocks_per_split = 0;  // the split the three paths ran with
};

/// Fills both caches, runs the three paths with the same split, checks the decompressed tiles and
/// the fp64 tolerance, and returns the outputs for the bit-exactness checks.
Outputs run_case(const Case& c) {
  const std::vector<KvDump> seqs = make_sequences(c);
  std::vector<const KvDump*> ptrs;
  for (const KvDump& d : seqs) ptrs.push_back(&d);
  CalibrationTable table = calibrate(ptrs);
  if (c.zero_bases) {
    for (const TensorKind kind : {TensorKind::key, TensorKind::value})
      for (int h = 0; h < c.kv_heads; ++h) {
        std::ranges::fill(table.b3(kind, 0, h), uint8_t{0});
        std::ranges::fill(table.b4(kind, 0, h), uint8_t{0});
      }
  }
  if (c.escape_capacity >= 0)
    for (const TensorKind kind : {TensorKind::key, TensorKind::value})
      table.set_escape_capacity(kind, 0, static_cast<size_t>(c.escape_capacity));
  KvCache host_gaac(test::cache_config_for(seqs, CacheFormat::gaac, &table, {c.window}));
  KvCache host_bf16(test::cache_config_for(seqs, CacheFormat::bf16, &table, {c.window}));
  const std::vector<SequenceId> ids_gaac = test::fill_cache(host_gaac, seqs);
  const std::vector<SequenceId> ids_bf16 = test::fill_cache(host_bf16, seqs);
  const SequenceTable table_gaac = host_gaac.sequence_table(ids_gaac);
  const SequenceTable table_bf16 = host_bf16.sequence_table(ids_bf16);

  const CacheMemory dev_gaac = CacheMemory::upload(host_gaac);
  const CacheMemory dev_bf16 = CacheMemory::upload(host_bf16);
  const BatchTable dev_seqs = BatchTable::upload(table_gaac.view());
  const BatchTable dev_seqs_bf16 = BatchTable::upload(table_bf16.view());
  CacheMemory dev_decompressed = CacheMemory::bf16_for(host_gaac.geometry(), c.window);

  const int heads = c.kv_heads * c.group, hd = c.head_dim, n = static_cast<int>(c.lengths.size());
  std::mt19937_64 rng(c.seed + 99);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<uint16_t> q(static_cast<size_t>(n) * heads * hd);
  for (uint16_t& x : q) x = float_to_bf16(normal(rng));
  DeviceBuffer dq(q.size() * 2), dout(q.size() * 2);
  dq.upload(q.data(), q.size() * 2);

  // One split for every cache (the GAAC cache's planned one unless the case sets it): same bits.
  DecodeConfig config;
  config.q_heads = heads;
  config.blocks_per_split = c.blocks_per_split;
  config.warps = c.warps;
  config.heads_per_cta = c.heads_per_cta;
  config.plan_tokens = c.plan_tokens;
  DecodePlan plan;
  plan.plan(dev_gaac, dev_seqs, config);
  config.blocks_per_split = plan.split(0).blocks_per_split;
  const std::vector<uint16_t> poison(q.size(), 0xFFFF);  // NaN: any element left unwritten fails
  const auto run = [&](const CacheMemory& cache, const BatchTable& batch) {
    dout.upload(poison.data(), poison.size() * 2);
    plan.plan(cache, batch, config);
    plan.run(cache, batch, 0, static_cast<const uint16_t*>(dq.data()), static_cast<uint16_t*>(dout.data()));
    std::vector<uint16_t> out(q.size());
    dout.download(out.data(), out.size() * 2);  // synchronises, and reports launch errors
    return out;
  };
  Outputs o;
  o.blocks_per_split = config.blocks_per_split;
  o.counts = test::count_tiles(host_gaac, table_gaac, 0);
  o.gaac = run(dev_gaac, dev_seqs);
  o.twin = run(dev_bf16, dev_seqs_bf16);
  decompress(dev_gaac, dev_seqs, 0, dev_decompressed);
  o.decompress_first = run(dev_decompressed, dev_seqs);

  // The decompressed tiles are the BF16 cache's tiles, bit for bit (block b of sequence s is row
  // table_gaac.rows[b] of the decompressed cache and table_bf16.rows[b] of the BF16 cache).
  std::vector<uint8_t> units;
  std::vector<uint32_t> entries;
  dev_decompressed.download(units, entries);
  const PagedGeometry& dg = dev_decompressed.geometry();
  const PagedCacheView bv = host_bf16.view();
  const PagedGeometry& bg = bv.geometry;
  for (size_t b = 0; b < table_bf16.rows.size(); ++b)
    for (int h = 0; h < c.kv_heads; ++h)
      for (const TensorKind kind : {TensorKind::key, TensorKind::value})
        for (int half = 0; half < dg.halves(); ++half) {
          const uint32_t want = bv.entries[bg.entry_index(0, table_bf16.rows[b], h, kind, half)];
          const uint32_t got = entries[dg.entry_index(0, table_gaac.rows[b], h, kind, half)];
          EXPECT_EQ(entry_class(got), entry_class(want)) << "block " << b << " head " << h;
          if (entry_class(want) != TileClass::raw || entry_class(got) != TileClass::raw) continue;
          EXPECT_EQ(0, std::memcmp(units.data() + dg.unit_offset(entry_unit(got)), bv.units + bg.unit_offset(entry_unit(want)),
                                   bg.unit_bytes))
              << "decompressed tile differs: block " << b << " head " << h << " kind " << int(kind) << " half " << half;
        }

  // Within bf16 rounding of fp64 attention (P and the output are rounded to bf16).
  double worst = 0;
  for (int s = 0; s < n; ++s)
    for (int h = 0; h < heads; ++h) {
      const std::vector<double> ref = reference(seqs[static_cast<size_t>(s)], q, s, h, c);
      double err = 0, norm = 0;
      for (int ch = 0; ch < hd; ++ch) {
        const double got = bf16_to_float(o.gaac[(static_cast<size_t>(s) * heads + h) * hd + ch]);
        EXPECT_FALSE(std::isnan(got)) << "seq " << s << " head " << h << " channel " << ch << " not written or NaN";
        err += (got - ref[static_cast<size_t>(ch)]) * (got - ref[static_cast<size_t>(ch)]);
        norm += ref[static_cast<size_t>(ch)] * ref[static_cast<size_t>(ch)];
      }
      worst = std::max(worst, std::sqrt(err / std::max(norm, 1e-30)));
    }
  EXPECT_LT(worst, 1e-2) << "relative L2 error against fp64";
  return o;
}

void expect_identical(const Outputs& o) {
  ASSERT_EQ(o.gaac.size(), o.twin.size());
  size_t differ = 0;
  for (size_t i = 0; i < o.gaac.size(); ++i) differ += o.gaac[i] != o.twin[i];
  EXPECT_EQ(differ, 0u) << "GAAC and BF16-twin outputs differ in " << differ << " of " << o.gaac.size() << " elements";
  EXPECT_EQ(o.decompress_first, o.twin) << "decompress-first differs from the twin";
}

TEST_F(GpuDecode, SmallCaseForTheSanitizers) {
  Case c;
  c.kv_heads = 2, c.lengths = {17, 40}, c.blocks_per_split = 1;
  expect_identical(run_case(c));
  // Heads of 256 channels: pairs of warps exchanging scores over several blocks each.
  Case pairs;
  pairs.kv_heads = 1, pairs.head_dim = 256, pairs.lengths = {17, 300};
  expect_identical(run_case(pairs));
  // 16 query heads of one tile: pairs of a key warp handing its scores to a value warp.
  Case split;
  split.kv_heads = 1, split.group = 16, split.lengths = {17, 300};
  expect_identical(run_case(split));
}

TEST_F(GpuDecode, RealisticMixHeadDim128) {
  Case c;
  c.lengths = {3000};
  const Outputs o = run_case(c);
  EXPECT_GT(o.counts.compressed, 0u);
  expect_identical(o);
}

TEST_F(GpuDecode, HeadDims64And256AndGroupSizes) {
  for (const auto& [kv, group, hd] : {std::tuple{3, 3, 64}, std::tuple{1, 4, 256}, std::tuple{2, 8, 128},
                                     std::tuple{4, 1, 128}, std::tuple{1, 5, 64}}) {
    Case c;
    c.kv_heads = kv, c.group = group, c.head_dim = hd, c.lengths = {700, 1234};
    SCOPED_TRACE(testing::Message() << "kv " << kv << " group " << group << " head_dim " << hd);
    expect_identical(run_case(c));
  }
}

TEST_F(GpuDecode, GroupsOfOneToSixteenQueryHeads) {
  for (const auto& [kv, group, hd] : {std::tuple{2, 16, 128}, std::tuple{1, 12, 64}, std::tuple{1, 16, 256},
                                     std::tuple{4, 9, 128}, std::tuple{8, 1, 128}, std::tuple{2, 2, 256}}) {
    Case c;
    c.kv_heads = kv, c.group = group, c.head_dim = hd, c.lengths = {33, 900, 2049};
    SCOPED_TRACE(testing::Message() << "kv " << kv << " group " << group << " head_dim " << hd);
    expect_identical(run_case(c));
  }
}

TEST_F(GpuDecode, HeadsOfTwoTilesInPairsOfWarps) {
  // Heads of 256 channels: a pair of warps per block, one tile each, adding their halves of the scores.
  // Splits of 1, 3 and 5 blocks leave some pairs of a CTA without work; every mode in every lane makes
  // the two halves' escapes differ; a sliding window masks the first blocks of the long sequences.
  for (const int bps : {1, 3, 5, 0}) {
    for (const int window : {0, 200}) {
      Case c;
      c.kv_heads = 2, c.group = 3, c.head_dim = 256, c.lengths = {1, 17, 300, 1111}, c.window = window;
      c.blocks_per_split = bps, c.data = Case::Data::every_mode;
      SCOPED_TRACE(testing::Message() << "bps " << bps << " window " << window);
      expect_identical(run_case(c));
    }
  }
}

TEST_F(GpuDecode, NineToSixteenQueryHeadsInPairsSplittingKeyAndValue) {
  // 9-16 query heads of one tile: a pair of warps per block, the key warp's scores handed to the value
  // warp. Splits of 1, 3 and 5 blocks leave some pairs without work; every mode in every lane; a sliding
  // window masks the first blocks of the long sequences.
  for (const auto& [group, hd] : {std::pair{16, 128}, std::pair{9, 128}, std::pair{12, 64}}) {
    for (const int bps : {1, 3, 5, 0}) {
      for (const int window : {0, 200}) {
        Case c;
        c.kv_heads = 2, c.group = group, c.head_dim = hd, c.lengths = {1, 17, 300, 1111}, c.window = window;
        c.blocks_per_split = bps, c.data = Case::Data::every_mode;
        SCOPED_TRACE(testing::Message() << "group " << group << " head_dim " << hd << " bps " << bps << " window " << window);
        expect_identical(run_case(c));
      }
    }
  }
}

TEST_F(GpuDecode, GroupsOfNineToSixteenInCtasOfEightQueryHeads) {
  // Each KV head's queries served by two CTAs (the second with 1-8 heads), splits merged per CTA.
  for (const auto& [kv, group, hd] : {std::tuple{2, 16, 128}, std::tuple{1, 12, 64}, std::tuple{1, 16, 256},
                                     std::tuple{4, 9, 128}, std::tuple{2, 8, 128}}) {
    for (const int bps : {0, 1}) {
      Case c;
      c.kv_heads = kv, c.group = group, c.head_dim = hd, c.lengths = {33, 900, 2049}, c.heads_per_cta = 8;
      c.blocks_per_split = bps;
      SCOPED_TRACE(testing::Message() << "kv " << kv << " group " << group << " head_dim " << hd << " bps " << bps);
      expect_identical(run_case(c));
    }
  }
}

TEST_F(GpuDecode, MoreThanSixteenQueryHeadsPerKvHeadIsRefused) {
  SyntheticKvSpec spec;
  spec.layers = 1, spec.kv_heads = 1, spec.head_dim = 128, spec.tokens = 64;
  const std::vector<KvDump> seqs = {make_synthetic_kv(spec)};
  const KvDump* ptr = &seqs[0];
  const CalibrationTable table = calibrate(std::span<const KvDump* const>(&ptr, 1));
  KvCache host(test::cache_config_for(seqs, CacheFormat::gaac, &table, {0}));
  const std::vector<SequenceId> ids = test::fill_cache(host, seqs);
  const CacheMemory dev = CacheMemory::upload(host);
  const BatchTable batch = BatchTable::upload(host.sequence_table(ids).view());
  DecodeConfig config;
  config.q_heads = 17;
  DecodePlan plan;
  EXPECT_THROW(plan.plan(dev, batch, config), Error);
  config.q_heads = 16;
  plan.plan(dev, batch, config);
  EXPECT_EQ(plan.split(0).planned_blocks, 4);
  config.heads_per_cta = 4;  // only 0 and 8
  EXPECT_THROW(plan.plan(dev, batch, config), Error);
}

TEST_F(GpuDecode, CtasOfFourAndEightWarps) {
  for (const int warps : {4, 8}) {
    Case c;
    c.kv_heads = 2, c.warps = warps, c.lengths = {1, 33, 1000, 4097};
    SCOPED_TRACE(testing::Message() << warps << " warps per CTA");
    expect_identical(run_case(c));
    c.blocks_per_split = 5;
    expect_identical(run_case(c));
  }
}

TEST_F(GpuDecode, OddLengthsAndSplitsThatDoNotDivide) {
  Case c;
  c.kv_heads = 2;
  c.lengths = {1, 15, 16, 17, 33, 100, 1000, 4097};
  for (const int bps : {1, 3, 7, 0}) {
    c.blocks_per_split = bps;
    SCOPED_TRACE(testing::Message() << "blocks per split " << bps);
    expect_identical(run_case(c));
  }
}

TEST_F(GpuDecode, AllTilesRaw) {
  Case c;
  c.kv_heads = 2, c.lengths = {300, 517}, c.zero_bases = true;
  const Outputs o = run_case(c);
  EXPECT_EQ(o.counts.compressed, 0u);
  EXPECT_GT(o.counts.raw, 0u);
  expect_identical(o);
}

TEST_F(GpuDecode, SlotsExactlyFull) {
  // Capacities at which some tiles need exactly every escape byte of their slot.
  for (const int cap : {16, 32, 48}) {
    Case c;
    c.kv_heads = 4, c.lengths = {2000}, c.escape_capacity = cap;
    SCOPED_TRACE(testing::Message() << "capacity " << cap);
    const Outputs o = run_case(c);
    EXPECT_GT(o.counts.exactly_full, 0u);
    EXPECT_GT(o.counts.raw, 0u);
    expect_identical(o);
  }
}

TEST_F(GpuDecode, EveryModeInEveryLane) {
  for (const int hd : {64, 128}) {
    Case c;
    c.kv_heads = 2, c.head_dim = hd, c.lengths = {999}, c.data = Case::Data::every_mode;
    c.escape_capacity = static_cast<int>(TileShape{TensorKind::key, hd}.max_slot_capacity());
    SCOPED_TRACE(testing::Message() << "head_dim " << hd);
    const Outputs o = run_case(c);
    EXPECT_GT(o.counts.compressed, 0u);
    expect_identical(o);
  }
}

// A large batch planned for long sequences: one split a (sequence, KV head) would be 2,048 blocks, whose
// entries and a CTA of 16 warps' stages of two 128-channel tiles need more shared memory than an SM has; the
// plan takes fewer blocks a split instead (it used to refuse the batch).
TEST_F(GpuDecode, LongSplitsOfALargeBatchFitSharedMemory) {
  Case c;
  c.kv_heads = 1, c.group = 4, c.head_dim = 256, c.plan_tokens = 32768;
  for (int s = 0; s < 200; ++s) c.lengths.push_back(16 + (s * 7) % 41);
  c.lengths.erase(c.lengths.begin());  // the default's 1000 tokens
  const Outputs o = run_case(c);
  EXPECT_LT(o.blocks_per_split, 2048);
  expect_identical(o);
}

TEST_F(GpuDecode, SlidingWindow) {
  Case c;
  c.kv_heads = 2, c.lengths = {1000, 77, 2500}, c.window = 300;
  const Outputs o = run_case(c);
  EXPECT_GT(o.counts.absent, 0u);
  expect_identical(o);
}

}  // namespace
}  // namespace gaac
