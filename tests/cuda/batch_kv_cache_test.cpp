// The GPU batch cache (gaac::cuda::make_device_batch_kv_cache) and KvCacheMirror against the CPU batch
// cache: a prompt then decoding steps, every layer written and attended through the interface. The
// device cache holds what the host one holds (tile classes, free units, resident bytes), attends with
// the BF16 twin's bits and with a mirror's bits at the same split, and within bf16 rounding of the
// CPU; misuse is an error before anything runs. (Pads, forks, truncation, copies and forwards of several
// tokens: batch_kv_cache_modes_test.cpp.) Skipped without a GPU.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "gaac/batch_kv_cache.hpp"
#include "gaac/bf16.hpp"
#include "gaac/cuda.hpp"
#include "gaac/error.hpp"
#include "gaac/synthetic.hpp"

namespace gaac::cuda {
namespace {

constexpr int kBatch = 3, kPrompt = 70, kSteps = 25, kQHeads = 8, kSplit = 2;

struct Shape {
  int kv_heads, head_dim;
};

class BatchCacheOnDevice : public testing::TestWithParam<Shape> {
 protected:
  void SetUp() override {
    if (!device_available()) GTEST_SKIP() << "no CUDA device";
  }
};

/// [batch, heads, tokens, head_dim] rows in host memory ([batch][tokens][heads][dim] underneath) and the
/// same on the device.
struct Rows {
  std::vector<uint16_t> host;
  DeviceBuffer device;
  int heads = 0, tokens = 0, head_dim = 0;

  Rows(std::vector<uint16_t> data, int h, int t, int d) : host(std::move(data)), device(host.size() * 2), heads(h), tokens(t), head_dim(d) {
    device.upload(host.data(), host.size() * 2);
  }
  template <class R>
  R view(uint16_t* data) const {
    return {data, kBatch, heads, tokens, head_dim, static_cast<int64_t>(tokens) * heads * head_dim, head_dim,
            static_cast<int64_t>(heads) * head_dim};
  }
  BatchRows on_host() const { return view<BatchRows>(const_cast<uint16_t*>(host.data())); }
  BatchRows on_device() const { return view<BatchRows>(static_cast<uint16_t*>(device.data())); }
};

/// Tokens first .. first+n-1 of `kind` in `layer` for every sequence (sequence b is stretch b of `all`).
Rows kv_rows(const KvDump& all, int layer, TensorKind kind, int first, int n) {
  const KvTensor& t = all.layers[static_cast<size_t>(layer)].of(kind);
  const size_t row = static_cast<size_t>(t.kv_heads) * t.head_dim;
  std::vector<uint16_t> data;
  for (int b = 0; b < kBatch; ++b) {
    const size_t from = (static_cast<size_t>(b) * (kPrompt + kSteps) + first) * row;
    data.insert(data.end(), t.data.begin() + static_cast<std::ptrdiff_t>(from),
                t.data.begin() + static_cast<std::ptrdiff_t>(from + n * row));
  }
  return Rows(std::move(data), t.kv_heads, n, t.head_dim);
}

TEST_P(BatchCacheOnDevice, HoldsAndAttendsWhatTheHostCacheDoes) {
  const Shape shape = GetParam();
  SyntheticKvSpec spec;
  spec.layers = 2, spec.kv_heads = shape.kv_heads, spec.head_dim = shape.head_dim, spec.seed = 17;
  spec.tokens = kBatch * (kPrompt + kSteps) + 512;
  const KvDump all = make_synthetic_kv(spec);
  const KvDump calib_part = [&] {  // calibrated on tokens no sequence holds
    KvDump d;
    for (const KvLayer& l : all.layers) {
      KvLayer part;
      for (const TensorKind kind : {TensorKind::key, TensorKind::value}) {
        const KvTensor& src = l.of(kind);
        const size_t row = static_cast<size_t>(src.kv_heads) * src.head_dim;
        part.of(kind) = {512, src.kv_heads, src.head_dim,
                         std::vector<uint16_t>(src.data.end() - static_cast<std::ptrdiff_t>(512 * row), src.data.end())};
      }
      d.layers.push_back(std::move(part));
    }
    return d;
  }();
  const KvDump* calib_dumps[] = {&calib_part};
  const CalibrationTable table = calibrate(calib_dumps);

  const auto config = [&](CacheFormat format) {
    BatchCacheConfig c;
    c.cache.geometry = {2, shape.kv_heads, shape.head_dim, {0, 48}};
    c.cache.format = format;
    c.cache.calibration = &table;
    c.cache.budget_bytes = worst_case_budget(c.cache.geometry, format, &table, kPrompt + kSteps, kBatch);
    c.batch = kBatch;
    c.max_tokens = kPrompt + kSteps;
    c.blocks_per_split = kSplit;
    return c;
  };
  const auto host = make_host_batch_kv_cache(config(CacheFormat::gaac));
  const auto gpu = make_device_batch_kv_cache(config(CacheFormat::gaac));
  const auto twin = make_device_batch_kv_cache(config(CacheFormat::bf16));
  EXPECT_TRUE(gpu->in_device_memory());

  std::mt19937_64 rng(3);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  const int d = shape.head_dim;
  double worst = 0;
  int first = 0;
  for (int step = 0; step <= kSteps; ++step) {
    const int n = step == 0 ? kPrompt : 1;
    for (BatchKvCache* c : {host.get(), gpu.get(), twin.get()}) c->begin(n, {}, nullptr, step > 0);  // a prompt: SDPA's
    for (int layer = 0; layer < 2; ++layer) {
      const Rows k = kv_rows(all, layer, TensorKind::key, first, n), v = kv_rows(all, layer, TensorKind::value, first, n);
      host->write(layer, k.on_host(), v.on_host(), nullptr);
      gpu->write(layer, k.on_device(), v.on_device(), nullptr);
      twin->write(layer, k.on_device(), v.on_device(), nullptr);
      if (step == 0) continue;  // a prompt on an empty cache attends to its own rows (a prefill kernel's job)
      std::vector<uint16_t> q(static_cast<size_t>(kBatch) * kQHeads * d);
      for (uint16_t& x : q) x = float_to_bf16(normal(rng));
      const Rows qr(q, kQHeads, 1, d);
      Rows out_host(std::vector<uint16_t>(q.size(), 0xFFFF), kQHeads, 1, d);
      Rows out_gpu(out_host.host, kQHeads, 1, d), out_twin(out_host.host, kQHeads, 1, d);
      const auto mutable_host = out_host.view<MutableBatchRows>(out_host.host.data());
      host->attend(layer, qr.on_host(), mutable_host, 0.0f, nullptr);
      gpu->attend(layer, qr.on_device(), out_gpu.view<MutableBatchRows>(static_cast<uint16_t*>(out_gpu.device.data())),
                  0.0f, nullptr);
      twin->attend(layer, qr.on_device(),
                   out_twin.view<MutableBatchRows>(static_cast<uint16_t*>(out_twin.device.data())), 0.0f, nullptr);
      std::vector<uint16_t> got(q.size()), got_twin(q.size());
      out_gpu.device.download(got.data(), got.size() * 2);
      out_twin.device.download(got_twin.data(), got_twin.size() * 2);
      ASSERT_EQ(got, got_twin) << "step " << step << " layer " << layer << ": GAAC differs from its BF16 twin";
      for (size_t i = 0; i < got.size(); i += static_cast<size_t>(d)) {
        double err = 0, norm = 0;
        for (int c = 0; c < d; ++c) {
          const double a = bf16_to_float(got[i + c]), b = bf16_to_float(out_host.host[i + c]);
          ASSERT_FALSE(std::isnan(a)) << "unwritten or NaN output";
          err += (a - b) * (a - b), norm += b * b;
        }
        worst = std::max(worst, std::sqrt(err / std::max(norm, 1e-30)));
      }
    }
    first += n;
  }
  EXPECT_LT(worst, 1e-2) << "GPU against CPU, worst (sequence, head) relative L2 error";
  EXPECT_EQ(gpu->length(0), kPrompt + kSteps);

  // The same tokens, the same tiles: the host cache has appended the last step once the next begins.
  host->begin(1, {}, nullptr);
  const CacheUsage h = host->usage(), g = gpu->usage();
  EXPECT_EQ(g.compressed_tiles, h.compressed_tiles);
  EXPECT_EQ(g.raw_tiles, h.raw_tiles);
  EXPECT_EQ(g.tail_tiles, h.tail_tiles);
  EXPECT_EQ(g.units_free, h.units_free);
  EXPECT_EQ(g.elements, h.elements);
  EXPECT_GT(g.compressed_tiles, 0u);
}

INSTANTIATE_TEST_SUITE_P(Shapes, BatchCacheOnDevice, testing::Values(Shape{2, 128}, Shape{1, 256}, Shape{2, 64}),
                         [](const testing::TestParamInfo<Shape>& i) {
                           return "kv" + std::to_string(i.param.kv_heads) + "_d" + std::to_string(i.param.head_dim);
                         });

TEST(BatchCacheOnDeviceErrors, MisuseIsReportedBeforeAnythingRuns) {
  if (!device_available()) GTEST_SKIP() << "no CUDA device";
  BatchCacheConfig c;
  c.cache.geometry = {2, 2, 64, {}};
  c.cache.format = CacheFormat::bf16;
  c.cache.budget_bytes = worst_case_budget(c.cache.geometry, CacheFormat::bf16, nullptr, 64, 1);
  c.batch = 1;
  c.max_tokens = 64;
  const auto cache = make_device_batch_kv_cache(c);
  DeviceBuffer rows(2 * 2 * 16 * 64 * 2);
  const BatchRows r{static_cast<const uint16_t*>(rows.data()), 1, 2, 16, 64, 2 * 16 * 64, 16 * 64, 64};
  EXPECT_THROW(cache->write(0, r, r, nullptr), Error);  // no forward
  cache->begin(16, {}, nullptr);
  EXPECT_THROW(cache->write(2, r, r, nullptr), Error);  // no such layer
  BatchRows wrong = r;
  wrong.tokens = 15;
  EXPECT_THROW(cache->write(0, wrong, wrong, nullptr), Error);
  cache->write(0, r, r, nullptr);
  EXPECT_THROW(cache->write(0, r, r, nullptr), Error);  // twice
  EXPECT_THROW(cache->begin(1, {}, nullptr), Error);        // layer 1 not written
  cache->write(1, r, r, nullptr);
  const MutableBatchRows out{static_cast<uint16_t*>(rows.data()), 1, 4, 15, 64, 4 * 15 * 64, 15 * 64, 64};
  EXPECT_THROW(cache->attend(0, BatchRows{out.data, 1, 4, 15, 64, 4 * 15 * 64, 15 * 64, 64}, out, 0.0f, nullptr),
               Error);  // 15 queries for a forward of 16 tokens
  try {
    cache->begin(64, {}, nullptr);  // past max_tokens
    FAIL() << "64 more tokens should not fit a table of 64";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::out_of_space);
  }
  EXPECT_EQ(cache->length(0), 16);
}

TEST(BatchCacheOnDeviceEdits, ResetAndAnEmptyBatchResize) {
  if (!device_available()) GTEST_SKIP() << "no CUDA device";
  BatchCacheConfig c;
  c.cache.geometry = {2, 2, 64, {}};
  c.cache.format = CacheFormat::bf16;
  c.cache.budget_bytes = worst_case_budget(c.cache.geometry, CacheFormat::bf16, nullptr, 64, 3);
  c.batch = 1;
  c.max_tokens = 64;
  const auto cache = make_device_batch_kv_cache(c);
  cache->select(std::vector<int>{0, 0, 0});  // empty: a batch of three
  EXPECT_EQ(cache->batch(), 3);
  DeviceBuffer rows(3 * 2 * 16 * 64 * 2);
  const BatchRows r{static_cast<const uint16_t*>(rows.data()), 3, 2, 16, 64, 2 * 16 * 64, 16 * 64, 64};
  EXPECT_THROW(cache->begin(16, std::vector<uint8_t>(47, 1), nullptr), Error);  // 47 flags for 3 × 16 tokens
  cache->begin(16, {}, nullptr);
  cache->write(0, r, r, nullptr);
  EXPECT_THROW(cache->select(std::vector<int>{0, 1, 2}), Error);  // the forward did not write every layer
  cache->write(1, r, r, nullptr);
  EXPECT_EQ(cache->length(2), 16);
  cache->select(std::vector<int>{0, 1, 2});  // the same rows: nothing to do
  EXPECT_THROW(cache->select(std::vector<int>{0, 3}), Error);  // no sequence 3
  EXPECT_THROW(cache->truncate(std::vector<int>{8, 17, 16}), Error);  // past a length
  const uint64_t free_before = cache->usage().units_free;
  cache->reset();
  for (int b = 0; b < 3; ++b) EXPECT_EQ(cache->length(b), 0);
  EXPECT_GT(cache->usage().units_free, free_before);
  EXPECT_EQ(cache->usage().units_free, cache->usage().units);
}

}  // namespace
}  // namespace gaac::cuda
