// The GPU decodes what the CPU cache holds: a gaac::KvCache filled on the CPU with KvCache::append
// (realistic synthetic KV: the sequences are different stretches of one model's KV, calibrated on
// another stretch, so 3-bit, 4-bit and raw groups all occur; several sequences of different lengths;
// GQA; two layers, the second with a sliding window)
// is copied to the device as it is and decoded there, and gaac::attend (fused path) decodes the same
// cache on the CPU.
//
// What must hold: the GPU's GAAC output is its BF16 twin's, bit for bit; the GPU and the CPU agree
// within bf16 rounding, not bit for bit, because they sum in different orders: the CPU follows
// llama.cpp (channel lanes reduced in a fixed tree, one online softmax position by position with the C
// library's expf, fp32 probabilities), the GPU multiplies on tensor cores (fp32 sums of bf16 products
// in the MMA's order), runs the softmax one 16-token block at a time with exp2, rounds the
// probabilities to bf16 before P·V and merges the context's splits at the end.
// Skipped, with a message, where no CUDA device exists.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <random>
#include <vector>

#include "cuda/cache_fill.hpp"
#include "gaac/attention.hpp"
#include "gaac/bf16.hpp"
#include "gaac/calibration.hpp"
#include "gaac/cuda.hpp"
#include "gaac/synthetic.hpp"

namespace gaac {
namespace {

using namespace gaac::cuda;

struct CrossCase {
  int q_heads, kv_heads, head_dim;
  std::vector<int> lengths;
  int window;  // of layer 1; layer 0 attends to everything
};

KvDump synthetic(const CrossCase& c, int tokens, uint64_t seed) {
  SyntheticKvSpec spec;
  spec.layers = 2, spec.kv_heads = c.kv_heads, spec.head_dim = c.head_dim, spec.tokens = tokens, spec.seed = seed;
  return make_synthetic_kv(spec);
}

void cross_check(const CrossCase& c) {
  int total = 0;
  for (const int n : c.lengths) total += n;
  constexpr int kCalibrationTokens = 2048;
  const KvDump all = synthetic(c, total + kCalibrationTokens, 1000);
  std::vector<KvDump> seqs;
  for (int s = 0, at = 0; s < static_cast<int>(c.lengths.size()); at += c.lengths[static_cast<size_t>(s)], ++s)
    seqs.push_back(test::stretch(all, at, c.lengths[static_cast<size_t>(s)]));
  const KvDump calibration_kv = test::stretch(all, total, kCalibrationTokens);  // windows learnt on other KV
  const KvDump* calibration_ptr = &calibration_kv;
  const CalibrationTable table = calibrate(std::span<const KvDump* const>(&calibration_ptr, 1));
  const std::vector<int> windows = {0, c.window};
  KvCache gaac_cache(test::cache_config_for(seqs, CacheFormat::gaac, &table, windows));
  KvCache bf16_cache(test::cache_config_for(seqs, CacheFormat::bf16, &table, windows));
  const std::vector<SequenceId> ids = test::fill_cache(gaac_cache, seqs);
  const std::vector<SequenceId> bf16_ids = test::fill_cache(bf16_cache, seqs);
  const SequenceTable batch = gaac_cache.sequence_table(ids);
  const SequenceTable bf16_batch = bf16_cache.sequence_table(bf16_ids);
  const CacheUsage usage = gaac_cache.usage();
  EXPECT_GT(usage.compressed_tiles, 0u);
  EXPECT_GT(usage.raw_tiles, 0u) << "the case should hold raw tiles too";
  EXPECT_GT(usage.tail_tiles, 0u) << "the case should hold open blocks too";

  const CacheMemory dev_gaac = CacheMemory::upload(gaac_cache);
  const CacheMemory dev_bf16 = CacheMemory::upload(bf16_cache);
  const BatchTable dev_batch = BatchTable::upload(batch.view());
  const BatchTable dev_bf16_batch = BatchTable::upload(bf16_batch.view());

  const int n = static_cast<int>(seqs.size()), hd = c.head_dim;
  std::mt19937_64 rng(5);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<uint16_t> q(static_cast<size_t>(n) * c.q_heads * hd);
  for (uint16_t& x : q) x = float_to_bf16(normal(rng));
  std::vector<float> qf(q.size());
  for (size_t i = 0; i < q.size(); ++i) qf[i] = bf16_to_float(q[i]);
  DeviceBuffer dq(q.size() * 2), dout(q.size() * 2);
  dq.upload(q.data(), q.size() * 2);
  const std::vector<uint16_t> poison(q.size(), 0xFFFF);

  for (int layer = 0; layer < 2; ++layer) {
    SCOPED_TRACE(testing::Message() << "layer " << layer);
    DecodeConfig config;
    config.q_heads = c.q_heads;
    DecodePlan plan;
    plan.plan(dev_gaac, dev_batch, config);
    config.blocks_per_split = plan.split(layer).blocks_per_split;  // the twin takes GAAC's split
    const auto gpu = [&](const CacheMemory& cache, const BatchTable& b) {
      dout.upload(poison.data(), poison.size() * 2);
      plan.plan(cache, b, config);
      plan.run(cache, b, layer, static_cast<const uint16_t*>(dq.data()), static_cast<uint16_t*>(dout.data()));
      std::vector<uint16_t> out(q.size());
      dout.download(out.data(), out.size() * 2);
      return out;
    };
    const std::vector<uint16_t> gpu_gaac = gpu(dev_gaac, dev_batch);
    const std::vector<uint16_t> gpu_twin = gpu(dev_bf16, dev_bf16_batch);
    EXPECT_EQ(gpu_gaac, gpu_twin) << "GPU GAAC differs from its BF16 twin";

    std::vector<float> cpu(q.size());
    std::vector<AttentionQuery> queries;
    for (int s = 0; s < n; ++s) {
      const size_t at = static_cast<size_t>(s) * c.q_heads * hd;
      queries.push_back({ids[static_cast<size_t>(s)], c.lengths[static_cast<size_t>(s)] - 1, qf.data() + at, cpu.data() + at, {}, {}});
    }
    AttentionOptions options;
    options.q_heads = c.q_heads;
    options.scale = 1.0f / std::sqrt(static_cast<float>(hd));
    options.path = AttentionPath::fused;
    attend(gaac_cache, layer, queries, options);

    double worst = 0;
    for (int s = 0; s < n; ++s)
      for (int h = 0; h < c.q_heads; ++h) {
        double err = 0, norm = 0;
        for (int ch = 0; ch < hd; ++ch) {
          const size_t i = (static_cast<size_t>(s) * c.q_heads + h) * hd + ch;
          const double g = bf16_to_float(gpu_gaac[i]), r = cpu[i];
          ASSERT_FALSE(std::isnan(g)) << "sequence " << s << " head " << h << " channel " << ch << " not written";
          err += (g - r) * (g - r);
          norm += r * r;
        }
        worst = std::max(worst, std::sqrt(err / std::max(norm, 1e-30)));
      }
    EXPECT_LT(worst, 1e-2) << "GPU against CPU, relative L2 error of the worst (sequence, head)";
    ::testing::Test::RecordProperty(("worst_relative_error_layer" + std::to_string(layer)).c_str(), std::to_string(worst));
    std::printf("[ cross-check ] q %d kv %d d %d layer %d: worst relative L2 error GPU vs CPU %.2e\n", c.q_heads,
                c.kv_heads, hd, layer, worst);
  }
}

class GpuCrossCheck : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!device_available()) GTEST_SKIP() << "no CUDA device: GPU-against-CPU cross-check skipped";
  }
};

TEST_F(GpuCrossCheck, Llama8BShape) { cross_check({32, 8, 128, {1, 17, 700, 2049, 3001}, 512}); }

TEST_F(GpuCrossCheck, SmolLM2Shape) { cross_check({9, 3, 64, {15, 16, 1337, 4000}, 1024}); }

TEST_F(GpuCrossCheck, Gemma3Shape) { cross_check({4, 1, 256, {33, 999, 2500}, 512}); }

}  // namespace
}  // namespace gaac
