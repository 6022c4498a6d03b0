// Sequences grown on the device (begin_tokens, write_tokens, finalize_completed on a cache made by
// CacheMemory::create) against the same tokens appended to a host KvCache: the same values held
// (decompressed bit for bit, sliding-window releases included), the same tile classes and free units,
// and decode attention with the same bits; the same when every decoding step is one CUDA graph replayed;
// and running out of units is reported, never written past. Skipped, with a message, without a device.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "cuda/cache_fill.hpp"
#include "gaac/calibration.hpp"
#include "gaac/cuda.hpp"
#include "gaac/synthetic.hpp"

namespace gaac {
namespace {

using namespace gaac::cuda;

class GpuGrow : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!device_available()) GTEST_SKIP() << "no CUDA device: GPU growth tests skipped";
  }
};

void ok(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw Error(std::string(what) + ": " + cudaGetErrorString(e));
}

struct Case {
  int layers, kv_heads, head_dim;
  std::vector<int> windows;
  int sequences, prefill, steps;
  CacheFormat format;
  bool graph = false;
};

std::string name(const Case& c) {
  return std::to_string(c.layers) + "x" + std::to_string(c.kv_heads) + "x" + std::to_string(c.head_dim) + " batch " +
         std::to_string(c.sequences) + " prefill " + std::to_string(c.prefill) + " + " + std::to_string(c.steps) +
         (c.format == CacheFormat::gaac ? " gaac" : " bf16") + (c.graph ? " graph" : "");
}

/// Every sequence's K and V of every layer in device memory as `[sequences][kv_heads][tokens][head_dim]`
/// (PyTorch's key-state layout), one buffer per layer and kind.
struct DeviceValues {
  std::vector<DeviceBuffer> k, v;
  int64_t seq_stride = 0, head_stride = 0;

  DeviceValues(const std::vector<KvDump>& seqs, int tokens) {
    const KvDump& d = seqs.front();
    const int kv = d.kv_heads(), hd = d.head_dim();
    head_stride = static_cast<int64_t>(tokens) * hd;
    seq_stride = head_stride * kv;
    for (size_t l = 0; l < d.layers.size(); ++l) {
      for (const TensorKind kind : {TensorKind::key, TensorKind::value}) {
        std::vector<uint16_t> host(static_cast<size_t>(seq_stride) * seqs.size());
        for (size_t s = 0; s < seqs.size(); ++s)
          for (int h = 0; h < kv; ++h)
            for (int p = 0; p < tokens; ++p)
              for (int c = 0; c < hd; ++c)
                host[s * seq_stride + h * head_stride + p * hd + c] = seqs[s].layers[l].of(kind).at(p, h, c);
        DeviceBuffer b(host.size() * 2);
        b.upload(host.data(), host.size() * 2);
        (kind == TensorKind::key ? k : v).push_back(std::move(b));
      }
    }
  }
  /// Rows of tokens `first` onwards of layer `l`.
  TokenRows rows(int l, int first, int head_dim) const {
    TokenRows r;
    r.k = static_cast<const uint16_t*>(k[static_cast<size_t>(l)].data()) + static_cast<int64_t>(first) * head_dim;
    r.v = static_cast<const uint16_t*>(v[static_cast<size_t>(l)].data()) + static_cast<int64_t>(first) * head_dim;
    r.sequence_stride = seq_stride, r.head_stride = head_stride, r.token_stride = head_dim;
    return r;
  }
};

/// Decompresses every layer of `cache` for `seqs` (longest `tokens`) over a sentinel; returns K then V.
std::vector<uint16_t> decompressed(const CacheMemory& cache, const BatchTable& seqs, int tokens) {
  const PagedGeometry& g = cache.geometry();
  const size_t row = static_cast<size_t>(g.kv_heads) * g.head_dim;
  const size_t per_layer = row * tokens * seqs.sequences();
  const std::vector<uint16_t> sentinel(per_layer * g.layers, 0x7FC1);
  DeviceBuffer k(sentinel.size() * 2), v(sentinel.size() * 2);
  k.upload(sentinel.data(), sentinel.size() * 2);
  v.upload(sentinel.data(), sentinel.size() * 2);
  DenseLayout out;
  out.k = static_cast<uint16_t*>(k.data()), out.v = static_cast<uint16_t*>(v.data());
  out.head_stride = g.head_dim, out.token_stride = static_cast<int64_t>(row);
  out.outer_stride = static_cast<int64_t>(row) * tokens, out.layer_stride = static_cast<int64_t>(per_layer);
  decompress_dense(cache, seqs, 0, g.layers, out);
  std::vector<uint16_t> all(2 * sentinel.size());
  k.download(all.data(), sentinel.size() * 2);
  v.download(all.data() + sentinel.size(), sentinel.size() * 2);
  return all;
}

/// Decode attention of every layer (query = the newest token, fixed values) with a fixed split.
std::vector<uint16_t> attention(const CacheMemory& cache, const BatchTable& seqs, int q_heads) {
  const PagedGeometry& g = cache.geometry();
  const size_t n = static_cast<size_t>(seqs.sequences()) * q_heads * g.head_dim;
  std::vector<uint16_t> q(n);
  for (size_t i = 0; i < n; ++i) q[i] = static_cast<uint16_t>(0x3C00 + (i * 2654435761u >> 20) % 0x300);
  DeviceBuffer dq(n * 2), dout(n * 2);
  dq.upload(q.data(), n * 2);
  DecodeConfig config;
  config.q_heads = q_heads, config.blocks_per_split = 8;
  DecodePlan plan;
  plan.plan(cache, seqs, config);
  std::vector<uint16_t> all;
  for (int l = 0; l < g.layers; ++l) {
    plan.run(cache, seqs, l, static_cast<const uint16_t*>(dq.data()), static_cast<uint16_t*>(dout.data()));
    std::vector<uint16_t> out(n);
    dout.download(out.data(), n * 2);
    all.insert(all.end(), out.begin(), out.end());
  }
  return all;
}

void run_case(const Case& c) {
  SCOPED_TRACE(name(c));
  const int tokens = c.prefill + c.steps;
  SyntheticKvSpec spec;
  spec.layers = c.layers, spec.kv_heads = c.kv_heads, spec.head_dim = c.head_dim, spec.seed = 11;
  spec.tokens = tokens * c.sequences + 1024;
  const KvDump all = make_synthetic_kv(spec);
  std::vector<KvDump> seqs;
  for (int s = 0; s < c.sequences; ++s) seqs.push_back(test::stretch(all, s * tokens, tokens));
  const KvDump calib_kv = test::stretch(all, c.sequences * tokens, 1024);
  const KvDump* cp = &calib_kv;
  const CalibrationTable table = calibrate(std::span<const KvDump* const>(&cp, 1));

  CacheConfig config;
  config.geometry = {c.layers, c.kv_heads, c.head_dim, c.windows};
  config.format = c.format;
  config.calibration = c.format == CacheFormat::gaac ? &table : nullptr;
  config.budget_bytes = worst_case_budget(config.geometry, c.format, config.calibration, tokens, c.sequences);

  // The host reference: the same tokens appended in the same steps.
  KvCache host(config);
  std::vector<SequenceId> ids;
  for (int s = 0; s < c.sequences; ++s) ids.push_back(host.add_sequence());
  const auto host_append = [&](int first, int n) {
    for (int s = 0; s < c.sequences; ++s) {
      std::vector<KvView> k, v;
      for (const KvLayer& l : seqs[static_cast<size_t>(s)].layers) {
        k.push_back(view_of(l.k).tokens_from(first, n));
        v.push_back(view_of(l.v).tokens_from(first, n));
      }
      ASSERT_EQ(host.append(ids[static_cast<size_t>(s)], k, v).status, CacheStatus::ok);
    }
  };
  host_append(0, c.prefill);
  for (int i = 0; i < c.steps; ++i) host_append(c.prefill + i, 1);

  // The device: a prefill, then single tokens (each step one graph replay when c.graph).
  CacheMemory dev = CacheMemory::create(config);
  BatchTable dseqs = BatchTable::reserve(dev, c.sequences, tokens);
  const DeviceValues values(seqs, tokens);
  const auto step = [&](int first, int n, cudaStream_t stream) {
    begin_tokens(dev, dseqs, n, stream);
    for (int l = 0; l < c.layers; ++l) write_tokens(dev, dseqs, l, values.rows(l, first, c.head_dim), stream);
    finalize_completed(dev, dseqs, stream);
  };
  step(0, c.prefill, nullptr);
  if (!c.graph) {
    for (int i = 0; i < c.steps; ++i) step(c.prefill + i, 1, nullptr);
  } else if (c.steps > 0) {
    // One graph of a whole step reading its rows from a staging buffer, replayed once per token.
    const size_t row_elems = static_cast<size_t>(c.sequences) * c.kv_heads * c.head_dim;
    std::vector<DeviceBuffer> sk, sv;
    for (int l = 0; l < c.layers; ++l) sk.emplace_back(row_elems * 2), sv.emplace_back(row_elems * 2);
    cudaStream_t stream;
    ok(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreate");
    cudaGraph_t graph;
    ok(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal), "cudaStreamBeginCapture");
    begin_tokens(dev, dseqs, 1, stream);
    for (int l = 0; l < c.layers; ++l) {
      TokenRows r;
      r.k = static_cast<const uint16_t*>(sk[static_cast<size_t>(l)].data());
      r.v = static_cast<const uint16_t*>(sv[static_cast<size_t>(l)].data());
      r.head_stride = c.head_dim, r.sequence_stride = static_cast<int64_t>(c.kv_heads) * c.head_dim, r.token_stride = c.head_dim;
      write_tokens(dev, dseqs, l, r, stream);
    }
    finalize_completed(dev, dseqs, stream);
    ok(cudaStreamEndCapture(stream, &graph), "cudaStreamEndCapture");
    cudaGraphExec_t exec;
    ok(cudaGraphInstantiate(&exec, graph, 0), "cudaGraphInstantiate");
    for (int i = 0; i < c.steps; ++i) {
      for (int l = 0; l < c.layers; ++l) {
        // Token prefill + i of every sequence, [sequences][kv_heads][head_dim].
        for (const bool key : {true, false}) {
          const DeviceBuffer& from = key ? values.k[static_cast<size_t>(l)] : values.v[static_cast<size_t>(l)];
          ok(cudaMemcpy2DAsync((key ? sk : sv)[static_cast<size_t>(l)].data(), c.head_dim * 2,
                               static_cast<const uint16_t*>(from.data()) + static_cast<int64_t>(c.prefill + i) * c.head_dim,
                               static_cast<size_t>(tokens) * c.head_dim * 2, c.head_dim * 2,
                               static_cast<size_t>(c.sequences) * c.kv_heads, cudaMemcpyDeviceToDevice, stream),
             "cudaMemcpy2DAsync");
        }
      }
      ok(cudaGraphLaunch(exec, stream), "cudaGraphLaunch");
      if (i > 0) dseqs.note_begin(1);  // the capture counted the first
    }
    ok(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
    cudaGraphExecDestroy(exec);
    cudaGraphDestroy(graph);
    cudaStreamDestroy(stream);
  }
  ok(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
  ASSERT_EQ(dev.status(), 0u);

  const CacheMemory up = CacheMemory::upload(host);
  const SequenceTable table_view = host.sequence_table(ids);
  const BatchTable useqs = BatchTable::upload(table_view.view());
  for (int s = 0; s < c.sequences; ++s) ASSERT_EQ(dseqs.length(s), tokens);

  const std::vector<uint16_t> grown = decompressed(dev, dseqs, tokens), hosted = decompressed(up, useqs, tokens);
  ASSERT_EQ(grown.size(), hosted.size());
  size_t differ = 0;
  for (size_t i = 0; i < grown.size(); ++i) differ += grown[i] != hosted[i];
  EXPECT_EQ(differ, 0u) << "values differ from the host cache's";
  // Full-attention layers hold every value.
  const size_t per_layer = static_cast<size_t>(c.kv_heads) * c.head_dim * tokens * c.sequences;
  for (int l = 0; l < c.layers; ++l) {
    if (!c.windows.empty() && c.windows[static_cast<size_t>(l)] > 0) continue;
    for (int s = 0; s < c.sequences; ++s)
      for (int p = 0; p < tokens; p += 7)
        for (int h = 0; h < c.kv_heads; ++h)
          ASSERT_EQ(grown[l * per_layer + ((static_cast<size_t>(s) * tokens + p) * c.kv_heads + h) * c.head_dim + 3],
                    seqs[static_cast<size_t>(s)].layers[static_cast<size_t>(l)].k.at(p, h, 3));
  }

  const CacheUsage u = host.usage();
  const CacheMemory::TileCounts t = dev.count_tiles();
  EXPECT_EQ(t.compressed, u.compressed_tiles);
  EXPECT_EQ(t.raw, u.raw_tiles + u.tail_tiles);
  EXPECT_EQ(dev.free_unit_count(), u.units_free);
  if (c.format == CacheFormat::gaac) {
    EXPECT_GT(t.compressed, 0u);
  }

  EXPECT_EQ(attention(dev, dseqs, 2 * c.kv_heads), attention(up, useqs, 2 * c.kv_heads)) << "attention bits differ";
}

TEST_F(GpuGrow, EqualsHostAppend) {
  for (const CacheFormat f : {CacheFormat::gaac, CacheFormat::bf16}) {
    run_case({3, 2, 128, {0, 40, 0}, 3, 203, 45, f});
    run_case({2, 1, 256, {24, 0}, 2, 16, 33, f});
    run_case({2, 4, 64, {}, 1, 1, 40, f});
    run_case({2, 2, 128, {}, 4, 0 + 32, 0, f});
  }
}

TEST_F(GpuGrow, GraphReplaysEqualHostAppend) {
  for (const CacheFormat f : {CacheFormat::gaac, CacheFormat::bf16}) {
    run_case({3, 2, 128, {0, 40, 0}, 3, 100, 37, f, true});
    run_case({2, 1, 256, {24, 0}, 2, 15, 20, f, true});
  }
}

TEST_F(GpuGrow, RunningOutOfUnitsIsReported) {
  // A small BF16 cache (8 units a block): fill every whole block it has room for; the next cannot open.
  CacheConfig config;
  config.geometry = {2, 2, 128, {}};
  config.format = CacheFormat::bf16;
  config.budget_bytes = worst_case_budget(config.geometry, config.format, nullptr, 40, 1);
  CacheMemory dev = CacheMemory::create(config);
  const int blocks = static_cast<int>(dev.units() / 8);
  ASSERT_GE(blocks, 2);
  BatchTable seqs = BatchTable::reserve(dev, 1, kTileTokens * (blocks + 1));
  begin_tokens(dev, seqs, kTileTokens * blocks);
  ASSERT_EQ(dev.status(), 0u);
  EXPECT_EQ(dev.free_unit_count(), dev.units() - 8u * static_cast<uint32_t>(blocks));
  begin_tokens(dev, seqs, 1);
  EXPECT_EQ(dev.status(), CacheMemory::kOutOfUnits);
  EXPECT_EQ(dev.free_unit_count(), dev.units() - 8u * static_cast<uint32_t>(blocks));  // nothing taken
  EXPECT_THROW(begin_tokens(dev, seqs, kTileTokens), Error);  // past the reserved tokens
  EXPECT_THROW(BatchTable::reserve(dev, 1000, 1 << 20), Error);  // more rows than the table has
}

}  // namespace
}  // namespace gaac
