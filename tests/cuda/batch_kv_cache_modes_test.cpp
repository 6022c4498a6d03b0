// Every way a model's generate drives the GPU batch cache, against the CPU batch cache on the same
// inputs: left-padded prompts of unequal lengths, decoding steps with and without pads, forwards of
// several tokens on a non-empty cache (every query at its own position, within sliding windows), forks
// (beam search: complete blocks shared, then released under sliding windows), truncation into
// compressed and shared blocks, deep copies, and freeing. At every attention the GAAC cache gives its
// BF16 twin's bits, the CPU's output within bf16 rounding, and zero for pads; at the end it holds the
// host's tiles and free units. Skipped without a GPU.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cmath>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "cuda/forward_attention.hpp"
#include "gaac/batch_kv_cache.hpp"
#include "gaac/bf16.hpp"
#include "gaac/cuda.hpp"
#include "gaac/error.hpp"
#include "gaac/synthetic.hpp"

namespace gaac::cuda {
namespace {

constexpr int kLayers = 2, kQHeads = 8, kSplit = 2, kMaxTokens = 240, kCalibTokens = 512;

struct Shape {
  int kv_heads, head_dim;
  std::vector<int> windows;
};

/// `[batch, heads, tokens, head_dim]` BF16 values, contiguous, on the host and (when asked) the device.
struct Tensor {
  int batch = 0, heads = 0, tokens = 0, head_dim = 0;
  std::vector<uint16_t> host;
  DeviceBuffer device;

  Tensor(int b, int h, int t, int d, uint16_t fill) : batch(b), heads(h), tokens(t), head_dim(d), host(static_cast<size_t>(b) * h * t * d, fill) {}
  size_t at(int b, int h, int t) const { return ((static_cast<size_t>(b) * heads + h) * tokens + t) * head_dim; }
  void to_device() {
    device = DeviceBuffer(host.size() * 2);
    device.upload(host.data(), host.size() * 2);
  }
  void from_device() { device.download(host.data(), host.size() * 2); }
  template <class Rows, class Element>
  Rows rows(Element* data) const {
    return {data, batch, heads, tokens, head_dim, static_cast<int64_t>(heads) * tokens * head_dim,
            static_cast<int64_t>(tokens) * head_dim, head_dim};
  }
  BatchRows on_host() const { return rows<BatchRows>(host.data()); }
  BatchRows on_device() const { return rows<BatchRows>(static_cast<const uint16_t*>(device.data())); }
  MutableBatchRows out_host() { return rows<MutableBatchRows>(host.data()); }
  MutableBatchRows out_device() { return rows<MutableBatchRows>(static_cast<uint16_t*>(device.data())); }
};

/// The same operations on a CPU batch cache, a GPU one and the GPU's BF16 twin, compared at every
/// attention.
class Trio {
 public:
  Trio(const Shape& shape, const KvDump& values, const CalibrationTable& table, int batch, int sequences_budgeted)
      : shape_(shape), values_(&values) {
    const auto config = [&](CacheFormat format) {
      BatchCacheConfig c;
      c.cache.geometry = {kLayers, shape.kv_heads, shape.head_dim, shape.windows};
      c.cache.format = format;
      c.cache.calibration = &table;
      c.cache.budget_bytes = worst_case_budget(c.cache.geometry, format, &table, kMaxTokens, sequences_budgeted);
      c.batch = batch;
      c.max_tokens = kMaxTokens;
      c.blocks_per_split = kSplit;
      return c;
    };
    host_ = make_host_batch_kv_cache(config(CacheFormat::gaac));
    gpu_ = make_device_batch_kv_cache(config(CacheFormat::gaac));
    twin_ = make_device_batch_kv_cache(config(CacheFormat::bf16));
  }

  /// A forward of `tokens` tokens per sequence (`valid`: empty, or batch × tokens flags) whose K and V
  /// rows are the next ones of the synthetic values; attended at every layer unless `attend` is false
  /// (then begun unattended, as transformers' prompt that begins a cache).
  void forward(int tokens, const std::vector<uint8_t>& valid, bool attend = true) {
    const int batch = host_->batch(), d = shape_.head_dim;
    SCOPED_TRACE("forward " + std::to_string(forwards_) + " of " + std::to_string(tokens) + " tokens");
    for (BatchKvCache* c : all()) c->begin(tokens, valid, nullptr, attend);
    for (int layer = 0; layer < kLayers; ++layer) {
      Tensor k(batch, shape_.kv_heads, tokens, d, 0), v(batch, shape_.kv_heads, tokens, d, 0);
      for (int b = 0; b < batch; ++b)
        for (int t = 0; t < tokens; ++t) {
          const int token = (cursor_ + b * tokens + t) % (values_->layers[0].k.tokens - kCalibTokens);
          for (int h = 0; h < shape_.kv_heads; ++h)
            for (int c = 0; c < d; ++c) {
              k.host[k.at(b, h, t) + c] = values_->layers[static_cast<size_t>(layer)].k.at(token, h, c);
              v.host[v.at(b, h, t) + c] = values_->layers[static_cast<size_t>(layer)].v.at(token, h, c);
            }
        }
      k.to_device(), v.to_device();
      host_->write(layer, k.on_host(), v.on_host(), nullptr);
      for (BatchKvCache* c : {gpu_.get(), twin_.get()}) c->write(layer, k.on_device(), v.on_device(), nullptr);
      if (attend) attend_and_compare(layer, tokens, valid);
    }
    cursor_ += batch * tokens;
    ++forwards_;
  }

  void select(const std::vector<int>& sources) {
    for (BatchKvCache* c : all()) c->select(sources);
  }
  void truncate(const std::vector<int>& lengths) {
    for (BatchKvCache* c : all()) c->truncate(lengths);
  }
  /// Deep copies of all three, continuing from the same values.
  Trio clone() const {
    Trio t(*this);
    t.host_ = host_->clone(), t.gpu_ = gpu_->clone(), t.twin_ = twin_->clone();
    return t;
  }

  BatchKvCache& host() { return *host_; }
  BatchKvCache& gpu() { return *gpu_; }
  void skip_values(int tokens) { cursor_ += tokens; }
  double worst() const { return worst_; }

  /// Every sequence's length equal on all three.
  void expect_lengths() const {
    ASSERT_EQ(gpu_->batch(), host_->batch());
    ASSERT_EQ(twin_->batch(), host_->batch());
    for (int b = 0; b < host_->batch(); ++b) {
      EXPECT_EQ(gpu_->length(b), host_->length(b)) << "sequence " << b;
      EXPECT_EQ(twin_->length(b), host_->length(b)) << "sequence " << b;
    }
  }

 private:
  Trio(const Trio&) = default;
  std::vector<BatchKvCache*> all() const { return {host_.get(), gpu_.get(), twin_.get()}; }

  void attend_and_compare(int layer, int tokens, const std::vector<uint8_t>& valid) {
    const int batch = host_->batch(), d = shape_.head_dim;
    std::normal_distribution<float> normal(0.0f, 1.0f);
    Tensor q(batch, kQHeads, tokens, d, 0);
    for (uint16_t& x : q.host) x = float_to_bf16(normal(rng_));
    q.to_device();
    Tensor on_host(batch, kQHeads, tokens, d, 0xFFFF), on_gpu(batch, kQHeads, tokens, d, 0xFFFF),
        on_twin(batch, kQHeads, tokens, d, 0xFFFF);  // NaN: unwritten
    on_gpu.to_device(), on_twin.to_device();
    host_->attend(layer, q.on_host(), on_host.out_host(), 0.0f, nullptr);
    gpu_->attend(layer, q.on_device(), on_gpu.out_device(), 0.0f, nullptr);
    twin_->attend(layer, q.on_device(), on_twin.out_device(), 0.0f, nullptr);
    on_gpu.from_device(), on_twin.from_device();
    ASSERT_EQ(on_gpu.host, on_twin.host) << "layer " << layer << ": GAAC differs from its BF16 twin";
    for (int b = 0; b < batch; ++b)
      for (int t = 0; t < tokens; ++t) {
        const bool pad = !valid.empty() && valid[static_cast<size_t>(b) * tokens + t] == 0;
        for (int h = 0; h < kQHeads; ++h) {
          const size_t at = on_gpu.at(b, h, t);
          double err = 0, norm = 0;
          for (int c = 0; c < d; ++c) {
            const double a = bf16_to_float(on_gpu.host[at + c]), e = bf16_to_float(on_host.host[at + c]);
            ASSERT_FALSE(std::isnan(a)) << "unwritten or NaN output: sequence " << b << ", token " << t;
            if (pad) {
              ASSERT_EQ(on_gpu.host[at + c], 0u) << "a pad's output is zero: sequence " << b << ", token " << t;
            }
            err += (a - e) * (a - e), norm += e * e;
          }
          const double rel = std::sqrt(err / std::max(norm, 1e-30));
          EXPECT_LT(rel, 1e-2) << "layer " << layer << ", sequence " << b << ", token " << t << ", head " << h;
          worst_ = std::max(worst_, rel);
        }
      }
  }

  Shape shape_;
  const KvDump* values_;
  std::shared_ptr<BatchKvCache> host_, gpu_, twin_;
  std::mt19937_64 rng_{11};
  int cursor_ = 0, forwards_ = 0;
  double worst_ = 0;
};

/// Flags for a batch of `tokens` tokens per sequence where sequence b's first pads[b] tokens are pads.
std::vector<uint8_t> left_padded(int tokens, const std::vector<int>& pads) {
  std::vector<uint8_t> valid;
  for (const int p : pads)
    for (int t = 0; t < tokens; ++t) valid.push_back(t >= p ? 1 : 0);
  return valid;
}

/// The shortest length of at least len − `most` that the batch cache lets sequence b be cut back to,
/// inside a complete block when one is in reach (a sliding window forbids cutting back before what it
/// released: the newest token's window).
int cut_length(int len, int most, const std::vector<int>& windows) {
  for (int n = std::max(1, len - most); n < len; ++n) {
    if (n % kTileTokens == 0 || n >= len / kTileTokens * kTileTokens) continue;
    bool allowed = true;
    for (const int w : windows) allowed = allowed && first_attended(n - 1, w) / kTileTokens >= first_attended(len - 1, w) / kTileTokens;
    if (allowed) return n;
  }
  return len - 1;
}

/// Synthetic values for `shape`, and a calibration learnt on their last tokens (which no sequence holds).
void make_values(const Shape& shape, KvDump& values, CalibrationTable& table) {
  SyntheticKvSpec spec;
  spec.layers = kLayers, spec.kv_heads = shape.kv_heads, spec.head_dim = shape.head_dim, spec.seed = 23;
  spec.tokens = 4000 + kCalibTokens;
  values = make_synthetic_kv(spec);
  KvDump part;
  for (const KvLayer& l : values.layers) {
    KvLayer p;
    for (const TensorKind kind : {TensorKind::key, TensorKind::value}) {
      const KvTensor& src = l.of(kind);
      const size_t row = static_cast<size_t>(src.kv_heads) * src.head_dim;
      p.of(kind) = {kCalibTokens, src.kv_heads, src.head_dim,
                    std::vector<uint16_t>(src.data.end() - static_cast<std::ptrdiff_t>(kCalibTokens * row), src.data.end())};
    }
    part.layers.push_back(std::move(p));
  }
  const KvDump* dumps[] = {&part};
  table = calibrate(dumps);
}

class BatchCacheModes : public testing::TestWithParam<Shape> {
 protected:
  void SetUp() override {
    if (!device_available()) GTEST_SKIP() << "no CUDA device";
    make_values(GetParam(), values_, table_);
  }

  KvDump values_;
  CalibrationTable table_;
};

/// Two KV heads of 128 channels, a full-attention layer and one of a 40-token window.
class BatchCacheModeLimits : public testing::Test {
 protected:
  void SetUp() override {
    if (!device_available()) GTEST_SKIP() << "no CUDA device";
    make_values(shape_, values_, table_);
  }

  const Shape shape_{2, 128, {0, 40}};
  KvDump values_;
  CalibrationTable table_;
};

TEST_P(BatchCacheModes, EveryGenerateModeMatchesTheHostCache) {
  const Shape& shape = GetParam();
  Trio trio(shape, values_, table_, 3, 6);
  // A left-padded prompt of unequal lengths that begins the cache (attended elsewhere, as transformers' SDPA).
  trio.forward(50, left_padded(50, {0, 20, 7}), false);
  trio.expect_lengths();
  EXPECT_EQ(trio.gpu().length(1), 30);
  for (int i = 0; i < 12; ++i) trio.forward(1, {});         // decoding: one query per sequence
  trio.forward(1, {1, 0, 1});                                // a pad in a decoding step
  trio.forward(7, left_padded(7, {0, 3, 0}));                // several tokens on a non-empty cache, with pads
  trio.expect_lengths();

  trio.select({0, 0, 2, 1});  // beams: sequence 0 forked (complete blocks shared, the open one copied)
  trio.expect_lengths();
  for (int i = 0; i < 30; ++i) trio.forward(1, {});  // the forks diverge; sliding windows release shared tiles
  std::vector<int> cut;
  for (int b = 0; b < 4; ++b) cut.push_back(cut_length(trio.host().length(b), 40, shape.windows));
  cut[3] = 0;
  trio.truncate(cut);  // candidates taken back: blocks cut inside (compressed, shared by the forks) become tails
  trio.expect_lengths();
  for (int i = 0; i < 20; ++i) trio.forward(1, {});  // the cut blocks refill and finalize again

  Trio copy = trio.clone();  // a deep copy continues on its own
  for (int i = 0; i < 5; ++i) copy.forward(1, {});
  copy.skip_values(1000);
  trio.forward(20, left_padded(20, {0, 20, 5, 0}));  // a second turn: 20 tokens (one sequence all pads)
  for (int i = 0; i < 5; ++i) trio.forward(1, {});
  trio.expect_lengths();
  copy.forward(3, {});
  copy.expect_lengths();

  trio.select({2, 0});  // sequences 1 and 3 freed
  for (int i = 0; i < 18; ++i) trio.forward(1, {});
  trio.expect_lengths();
  EXPECT_LT(trio.worst(), 1e-2);

  // The same tiles and free units as the host's (which appends the last forward when the next begins).
  trio.host().begin(1, {}, nullptr);
  const CacheUsage h = trio.host().usage(), g = trio.gpu().usage();
  EXPECT_EQ(g.compressed_tiles, h.compressed_tiles);
  EXPECT_EQ(g.raw_tiles, h.raw_tiles);
  EXPECT_EQ(g.tail_tiles, h.tail_tiles);
  EXPECT_EQ(g.units_free, h.units_free);
  EXPECT_EQ(g.elements, h.elements);
  EXPECT_GT(g.compressed_tiles, 0u);
}

INSTANTIATE_TEST_SUITE_P(Shapes, BatchCacheModes,
                         testing::Values(Shape{2, 128, {0, 40}}, Shape{1, 256, {100, 0}}, Shape{2, 64, {}}),
                         [](const testing::TestParamInfo<Shape>& i) {
                           return "kv" + std::to_string(i.param.kv_heads) + "_d" + std::to_string(i.param.head_dim) +
                                  (i.param.windows.empty() ? "" : "_w" + std::to_string(i.param.windows[0] + i.param.windows[1]));
                         });

TEST_P(BatchCacheModes, APromptAttendedFromTheCache) {
  // A left-padded prompt that begins the cache, attended through it: each query at its own position, within
  // the sliding windows (the blocks its first queries see are kept until the next forward).
  Trio trio(GetParam(), values_, table_, 2, 2);
  trio.forward(80, left_padded(80, {0, 23}));
  for (int i = 0; i < 3; ++i) trio.forward(1, {});
  trio.expect_lengths();
}

TEST_P(BatchCacheModes, BeamsReorderedInAFullBlockTable) {
  // A table with rows for the batch alone (beam search's cache): forks take the rows of the sequences let go.
  Trio trio(GetParam(), values_, table_, 4, 4);
  trio.forward(37, {}, false);
  for (int i = 0; i < 4; ++i) trio.forward(1, {});
  trio.select({0, 0, 3, 3});
  trio.expect_lengths();
  for (int i = 0; i < 20; ++i) trio.forward(1, {});
  trio.select({1, 1, 1, 2});
  for (int i = 0; i < 5; ++i) trio.forward(1, {});
  trio.expect_lengths();
  EXPECT_LT(trio.worst(), 1e-2);
}

TEST_F(BatchCacheModeLimits, WhatCannotBeDoneRaisesChangingNothing) {
  const Shape& shape = shape_;
  // A forward begun unattended that passes a sliding window: its first queries' blocks were never kept.
  Trio trio(shape, values_, table_, 2, 2);
  trio.forward(80, {}, false);
  Tensor q(2, kQHeads, 80, 128, 0), out(2, kQHeads, 80, 128, 0);
  q.to_device(), out.to_device();
  trio.gpu().attend(0, q.on_device(), out.out_device(), 0.0f, nullptr);  // full attention: every block kept
  EXPECT_THROW(trio.gpu().attend(1, q.on_device(), out.out_device(), 0.0f, nullptr), Error);
  // Pads cannot be captured in a CUDA graph (their counts come from the host).
  cudaStream_t stream = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
  ASSERT_EQ(cudaStreamBeginCapture(stream, cudaStreamCaptureModeRelaxed), cudaSuccess);
  EXPECT_THROW(trio.gpu().begin(1, std::vector<uint8_t>{1, 0}, stream), Error);
  cudaGraph_t graph = nullptr;
  ASSERT_EQ(cudaStreamEndCapture(stream, &graph), cudaSuccess);
  if (graph != nullptr) cudaGraphDestroy(graph);
  cudaStreamDestroy(stream);
  trio.forward(1, {});  // and nothing changed
  // Cutting back past what a sliding window released.
  EXPECT_THROW(trio.gpu().truncate(std::vector<int>{40, 81}), Error);
  trio.expect_lengths();
  // Forks whose open blocks do not fit: a budget of one sequence of 48 tokens, 40 of them held.
  BatchCacheConfig c;
  c.cache.geometry = {kLayers, shape.kv_heads, shape.head_dim, {}};
  c.cache.format = CacheFormat::gaac;
  c.cache.calibration = &table_;
  c.cache.budget_bytes = worst_case_budget(c.cache.geometry, c.cache.format, &table_, 48, 1);
  c.max_tokens = 48;
  const auto small = make_device_batch_kv_cache(c);
  Tensor rows(1, shape.kv_heads, 40, shape.head_dim, 0);
  for (size_t i = 0; i < rows.host.size(); ++i) rows.host[i] = values_.layers[0].k.data[i];
  rows.to_device();
  small->begin(40, {}, nullptr);
  for (int l = 0; l < kLayers; ++l) small->write(l, rows.on_device(), rows.on_device(), nullptr);
  const uint64_t free_before = small->usage().units_free;
  try {
    small->select(std::vector<int>{0, 0, 0});
    FAIL() << "two forks of an open block should not fit";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::out_of_space);
  }
  EXPECT_EQ(small->batch(), 1);
  EXPECT_EQ(small->length(0), 40);
  EXPECT_EQ(small->usage().units_free, free_before);
  small->truncate(std::vector<int>{21});  // and it still works: cut inside its second block
  EXPECT_EQ(small->length(0), 21);
}

TEST_F(BatchCacheModeLimits, ForwardAttentionInChunksGivesTheBitsOfOneLaunch) {
  // The queries of a long forward in many chunks (a tiny workspace bound) and in one: the same bits.
  const Shape& shape = shape_;
  CacheConfig config;
  config.geometry = {kLayers, shape.kv_heads, shape.head_dim, shape.windows};
  config.format = CacheFormat::gaac;
  config.calibration = &table_;
  config.budget_bytes = worst_case_budget(config.geometry, config.format, &table_, kMaxTokens, 2);
  CacheMemory memory = CacheMemory::create(config);
  BatchTable batch = BatchTable::reserve(memory, 2, kMaxTokens);
  const int d = shape.head_dim;
  const auto step = [&](int tokens, const std::vector<uint8_t>& valid, bool attended) {
    begin_tokens(memory, batch, tokens, valid, attended, nullptr);
    Tensor rows(2, shape.kv_heads, tokens, d, 0);
    for (size_t i = 0; i < rows.host.size(); ++i) rows.host[i] = values_.layers[0].k.data[(i * 7 + batch.length(0)) % values_.layers[0].k.data.size()];
    rows.to_device();
    TokenRows r;
    r.k = r.v = static_cast<const uint16_t*>(rows.device.data());
    r.token_stride = d, r.head_stride = static_cast<int64_t>(tokens) * d, r.sequence_stride = r.head_stride * shape.kv_heads;
    for (int l = 0; l < kLayers; ++l) write_tokens(memory, batch, l, r, nullptr);
    finalize_completed(memory, batch, nullptr);
  };
  step(70, {}, false);
  step(60, left_padded(60, {0, 9}), true);
  Tensor q(2, kQHeads, 60, d, 0);
  std::mt19937_64 rng(5);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (uint16_t& x : q.host) x = float_to_bf16(normal(rng));
  q.to_device();
  DecodeConfig decode;
  decode.q_heads = kQHeads;
  decode.blocks_per_split = kSplit;
  for (int layer = 0; layer < kLayers; ++layer) {
    std::vector<uint16_t> got[2];
    for (const size_t bound : {size_t{0}, size_t{1}}) {
      detail::ForwardAttention attention(bound);  // 0: the default bound; 1: one token per chunk
      attention.prepare(memory, batch, decode, nullptr);
      Tensor out(2, kQHeads, 60, d, 0xFFFF);
      out.to_device();
      attention.run(memory, batch, layer, q.on_device(), out.out_device(), 0.0f, nullptr);
      out.from_device();
      got[bound] = out.host;
    }
    EXPECT_EQ(got[0], got[1]) << "layer " << layer;
    for (int h = 0; h < kQHeads; ++h)
      for (int t = 0; t < 9; ++t) EXPECT_EQ(got[0][((static_cast<size_t>(1) * kQHeads + h) * 60 + t) * d], 0u) << "a pad";
  }
}

}  // namespace
}  // namespace gaac::cuda
