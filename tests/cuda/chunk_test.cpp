// KV chunk objects on the GPU against the CPU's gaac::ChunkCodec: the same bytes for every tile width,
// chunks with and without a BF16 tail and raw tiles, objects of their own size and of a fixed size;
// decoding back bit for bit, strided chunks included; a chunk too large for the fixed size refused;
// every corruption the CPU reader refuses refused with its message; and more tiles than one round of
// the device's scan, with one codec's workspaces reused across chunk sizes and by threads on their own
// streams; batches of chunks enqueued together giving the one-by-one objects, a wrong one named. GPU tests
// skip without a device.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <array>
#include <map>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "gaac/chunk.hpp"
#include "gaac/cuda.hpp"
#include "gaac/error.hpp"
#include "gaac/synthetic.hpp"

namespace gaac {
namespace {

class GpuChunk : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!cuda::device_available()) GTEST_SKIP() << "no CUDA device: GPU chunk tests skipped";
  }
};

/// A dense chunk of synthetic KV with block 1 of every raw_every-th (layer, head) incompressible.
std::vector<uint16_t> make_chunk(const ChunkGeometry& g, uint64_t seed, int raw_every) {
  const KvDump dump = make_synthetic_kv({.layers = g.layers, .kv_heads = g.kv_heads, .head_dim = g.head_dim,
                                         .tokens = std::max(g.tokens, 1), .seed = seed});
  std::vector<uint16_t> values(g.elements());
  const MutableChunkView v = dense_chunk_view(values.data(), g);
  std::mt19937_64 rng(seed);
  for (int l = 0; l < g.layers; ++l) {
    for (const TensorKind kind : {TensorKind::key, TensorKind::value}) {
      for (int t = 0; t < g.tokens; ++t) {
        for (int h = 0; h < g.kv_heads; ++h) {
          for (int c = 0; c < g.head_dim; ++c) {
            const bool wild = raw_every > 0 && (l * g.kv_heads + h) % raw_every == 0 && t / 16 == 1;
            v.tensor(kind, l).at(t, h)[c] = wild ? static_cast<uint16_t>(rng()) : dump.layers[static_cast<size_t>(l)].of(kind).at(t, h, c);
          }
        }
      }
    }
  }
  return values;
}

CalibrationTable calibration_for(const ChunkGeometry& g) {
  const std::vector<uint16_t> sample = make_chunk({g.layers, g.kv_heads, g.head_dim, 64}, 77, 0);
  return calibrate_chunk(dense_chunk_view(sample.data(), ChunkGeometry{g.layers, g.kv_heads, g.head_dim, 64}));
}

template <class T>
std::vector<T> download(const cuda::DeviceBuffer& b, size_t count) {
  std::vector<T> out(count);
  b.download(out.data(), count * sizeof(T));
  return out;
}

TEST_F(GpuChunk, SameBytesAsTheCpuAndBackBitExactly) {
  for (const int head_dim : {64, 128, 256}) {
    for (const int tokens : {256, 40, 15}) {
      const ChunkGeometry g{3, 2, head_dim, tokens};
      const std::vector<uint16_t> values = make_chunk(g, 5 + static_cast<uint64_t>(tokens), 3);
      const CalibrationTable table = calibration_for(g);
      for (const double ratio : {0.0, 1.05}) {
        const ChunkCodec cpu(table, {.threads = 2, .object_ratio = ratio});
        const cuda::ChunkCodec gpu(table, {.object_ratio = ratio});
        std::vector<uint8_t> expected(cpu.object_bytes(tokens));
        expected.resize(cpu.encode(dense_chunk_view(values.data(), g), "key", expected));
        ASSERT_EQ(gpu.object_bytes(tokens), cpu.object_bytes(tokens));

        cuda::DeviceBuffer chunk(values.size() * 2), object(gpu.object_bytes(tokens));
        chunk.upload(values.data(), values.size() * 2);
        const ChunkView device_view = dense_chunk_view(static_cast<const uint16_t*>(chunk.data()), g);
        const size_t n = gpu.encode(device_view, "key", static_cast<uint8_t*>(object.data()), object.bytes());
        ASSERT_EQ(n, expected.size()) << "head_dim " << head_dim << ", tokens " << tokens << ", ratio " << ratio;
        ASSERT_EQ(download<uint8_t>(object, n), expected) << "head_dim " << head_dim << ", tokens " << tokens;

        cuda::DeviceBuffer back(values.size() * 2);
        gpu.decode(static_cast<const uint8_t*>(object.data()), object.bytes(), "key",
                   dense_chunk_view(static_cast<uint16_t*>(back.data()), g));
        ASSERT_EQ(download<uint16_t>(back, values.size()), values);
      }
    }
  }
}

TEST_F(GpuChunk, StridedChunksAndObjectsFromTheCpu) {
  const ChunkGeometry g{2, 4, 128, 64};
  const std::vector<uint16_t> values = make_chunk(g, 9, 5);
  const CalibrationTable table = calibration_for(g);
  const ChunkCodec cpu(table);
  const cuda::ChunkCodec gpu(table);
  std::vector<uint8_t> object(cpu.object_bytes(64));
  object.resize(cpu.encode(dense_chunk_view(values.data(), g), "k", object));
  // [layers, 2, tokens, row + 16]: every stride differs from the dense one.
  const size_t row = 4 * 128, token_stride = row + 16, kind_stride = 64 * token_stride, layer_stride = 2 * kind_stride;
  cuda::DeviceBuffer device_object(object.size()), strided(2 * layer_stride * 2);
  device_object.upload(object.data(), object.size());
  gpu.decode(static_cast<const uint8_t*>(device_object.data()), object.size(), "k",
             MutableChunkView{static_cast<uint16_t*>(strided.data()), g, kind_stride, layer_stride, token_stride});
  const std::vector<uint16_t> back = download<uint16_t>(strided, 2 * layer_stride);
  const ChunkView want = dense_chunk_view(values.data(), g);
  const ChunkView got{back.data(), g, kind_stride, layer_stride, token_stride};
  for (int l = 0; l < 2; ++l) {
    for (const TensorKind kind : {TensorKind::key, TensorKind::value}) {
      for (int t = 0; t < 64; ++t) {
        ASSERT_TRUE(std::equal(want.tensor(kind, l).at(t, 0), want.tensor(kind, l).at(t, 0) + row, got.tensor(kind, l).at(t, 0)));
      }
    }
  }
}

TEST_F(GpuChunk, RefusesWhatTheCpuRefusesWithItsMessage) {
  const ChunkGeometry g{2, 2, 64, 48};
  const std::vector<uint16_t> values = make_chunk(g, 13, 2);
  const CalibrationTable table = calibration_for(g);
  const ChunkCodec cpu(table);
  const cuda::ChunkCodec gpu(table);
  std::vector<uint8_t> object(cpu.object_bytes(48));
  object.resize(cpu.encode(dense_chunk_view(values.data(), g), "k", object));
  cuda::DeviceBuffer device_object(object.size()), back(values.size() * 2);
  const MutableChunkView out = dense_chunk_view(static_cast<uint16_t*>(back.data()), g);
  std::vector<uint16_t> host_back(values.size());
  std::mt19937_64 rng(3);
  for (int round = 0; round < 200; ++round) {
    std::vector<uint8_t> bad = object;
    const size_t at = round < 100 ? static_cast<size_t>(rng() % bad.size()) : static_cast<size_t>(round - 100);  // anywhere; the header
    bad[at] = static_cast<uint8_t>(bad[at] ^ (1u << (rng() % 8)));
    std::string cpu_error, gpu_error;
    try {
      cpu.decode(bad, "k", dense_chunk_view(host_back.data(), g));
    } catch (const Error& e) {
      cpu_error = e.what();
    }
    device_object.upload(bad.data(), bad.size());
    try {
      gpu.decode(static_cast<const uint8_t*>(device_object.data()), bad.size(), "k", out);
    } catch (const Error& e) {
      gpu_error = e.what();
    }
    ASSERT_FALSE(cpu_error.empty()) << "byte " << at;
    ASSERT_EQ(gpu_error, cpu_error) << "byte " << at;
  }
  // Another key, another calibration.
  device_object.upload(object.data(), object.size());
  EXPECT_THROW(gpu.decode(static_cast<const uint8_t*>(device_object.data()), object.size(), "other", out), Error);
  const std::vector<uint16_t> sample = make_chunk(g, 99, 0);
  const cuda::ChunkCodec other(calibrate_chunk(dense_chunk_view(sample.data(), g)));
  std::string message;
  try {
    other.decode(static_cast<const uint8_t*>(device_object.data()), object.size(), "k", out);
  } catch (const Error& e) {
    message = e.what();
  }
  EXPECT_NE(message.find("was made with calibration"), std::string::npos) << message;
}

TEST_F(GpuChunk, FixedSizeObjectsRefuseWhatDoesNotFit) {
  const ChunkGeometry g{2, 2, 128, 64};
  const std::vector<uint16_t> wild = make_chunk(g, 21, 1);
  const cuda::ChunkCodec gpu(calibration_for(g), {.object_ratio = 1.35});
  cuda::DeviceBuffer chunk(wild.size() * 2), object(gpu.object_bytes(64));
  chunk.upload(wild.data(), wild.size() * 2);
  try {
    gpu.encode(dense_chunk_view(static_cast<const uint16_t*>(chunk.data()), g), "k", static_cast<uint8_t*>(object.data()), object.bytes());
    FAIL() << "a chunk larger than the fixed size was encoded";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::out_of_space);
  }
}

TEST_F(GpuChunk, ManyTilesAndWorkspacesReusedAcrossSizesAndThreads) {
  // 256 tokens: 2 × 9 layers × 16 blocks × 32 heads = 9,216 tiles, two rounds of the one-block scan
  // (8,192 tiles a round); 40 tokens: 1,152 tiles and a tail; 15 tokens: no tile, the escape section alone.
  const ChunkGeometry full{9, 32, 64, 256};
  const CalibrationTable table = calibration_for(full);
  const ChunkCodec cpu(table, {.threads = 2});
  const cuda::ChunkCodec gpu(table);
  struct Case {
    std::vector<uint16_t> values;
    std::vector<uint8_t> object;
  };
  std::map<int, Case> cases;
  for (const int tokens : {256, 40, 15}) {
    const ChunkGeometry g{full.layers, full.kv_heads, full.head_dim, tokens};
    Case& c = cases[tokens];
    c.values = make_chunk(g, 31 + static_cast<uint64_t>(tokens), 7);
    c.object.resize(cpu.object_bytes(tokens));
    c.object.resize(cpu.encode(dense_chunk_view(static_cast<const uint16_t*>(c.values.data()), g), "key", c.object));
  }
  // One call's check: empty when the object and the values came back as the CPU's.
  const auto round_trip = [&](int tokens, cudaStream_t stream) -> std::string {
    const ChunkGeometry g{full.layers, full.kv_heads, full.head_dim, tokens};
    const Case& c = cases.at(tokens);
    cuda::DeviceBuffer chunk(c.values.size() * 2), object(gpu.object_bytes(tokens)), back(c.values.size() * 2);
    chunk.upload(c.values.data(), c.values.size() * 2);
    const size_t n = gpu.encode(dense_chunk_view(static_cast<const uint16_t*>(chunk.data()), g), "key",
                                static_cast<uint8_t*>(object.data()), object.bytes(), stream);
    if (n != c.object.size() || download<uint8_t>(object, n) != c.object) return "object of " + std::to_string(tokens) + " tokens";
    gpu.decode(static_cast<const uint8_t*>(object.data()), n, "key", dense_chunk_view(static_cast<uint16_t*>(back.data()), g), stream);
    if (download<uint16_t>(back, c.values.size()) != c.values) return "values of " + std::to_string(tokens) + " tokens";
    return "";
  };
  // One thread: the workspace grows (15 → 256 tokens) and is reused (40, 256 again).
  for (const int tokens : {15, 256, 40, 256}) EXPECT_EQ(round_trip(tokens, nullptr), "");
  // Threads on their own streams at once: a workspace each.
  std::vector<std::string> failures(3);
  std::vector<std::thread> threads;
  for (size_t t = 0; t < failures.size(); ++t) {
    threads.emplace_back([&, t] {
      cudaStream_t stream = nullptr;
      if (cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking) != cudaSuccess) {
        failures[t] = "cudaStreamCreate";
        return;
      }
      try {
        for (const int tokens : {256, 40, 15, 256}) {
          if (failures[t].empty()) failures[t] = round_trip(tokens, stream);
        }
      } catch (const std::exception& e) {
        failures[t] = e.what();
      }
      cudaStreamDestroy(stream);
    });
  }
  for (std::thread& thread : threads) thread.join();
  for (const std::string& failure : failures) EXPECT_EQ(failure, "");
}

TEST_F(GpuChunk, BatchesEnqueuedTogetherAreTheOneByOneObjects) {
  // 19 chunks: more than two rounds of kChunksInFlight, chunks of three sizes (one with no tile) in turn,
  // each under its own key; objects of a fixed size, so the escapes' zero fill is in every one.
  const ChunkGeometry full{3, 4, 128, 256};
  const CalibrationTable table = calibration_for(full);
  const ChunkCodec cpu(table, {.threads = 2, .object_ratio = 1.05});
  const cuda::ChunkCodec gpu(table, {.object_ratio = 1.05});
  constexpr size_t kChunks = 2 * cuda::ChunkCodec::kChunksInFlight + 3;
  std::vector<std::vector<uint16_t>> values;
  std::vector<std::vector<uint8_t>> expected;
  std::vector<std::string> key_text;
  std::vector<cuda::DeviceBuffer> chunks, objects, backs;
  std::vector<ChunkView> views;
  std::vector<MutableChunkView> back_views;
  std::vector<uint8_t*> outs;
  std::vector<size_t> out_bytes;
  for (size_t i = 0; i < kChunks; ++i) {
    const int tokens = std::array{256, 40, 15}[i % 3];
    const ChunkGeometry g{full.layers, full.kv_heads, full.head_dim, tokens};
    values.push_back(make_chunk(g, 100 + i, 2 + static_cast<int>(i % 4)));
    key_text.push_back("key " + std::to_string(i));
    expected.emplace_back(cpu.object_bytes(tokens));
    expected.back().resize(
        cpu.encode(dense_chunk_view(static_cast<const uint16_t*>(values.back().data()), g), key_text.back(), expected.back()));
    chunks.emplace_back(values.back().size() * 2);
    chunks.back().upload(values.back().data(), values.back().size() * 2);
    objects.emplace_back(gpu.object_bytes(tokens));
    backs.emplace_back(values.back().size() * 2);
  }
  for (size_t i = 0; i < kChunks; ++i) {
    const ChunkGeometry g{full.layers, full.kv_heads, full.head_dim, std::array{256, 40, 15}[i % 3]};
    views.push_back(dense_chunk_view(static_cast<const uint16_t*>(chunks[i].data()), g));
    back_views.push_back(dense_chunk_view(static_cast<uint16_t*>(backs[i].data()), g));
    outs.push_back(static_cast<uint8_t*>(objects[i].data()));
    out_bytes.push_back(objects[i].bytes());
  }
  const std::vector<std::string_view> keys(key_text.begin(), key_text.end());
  const std::vector<size_t> sizes = gpu.encode_batch(views, keys, outs, out_bytes);
  ASSERT_EQ(sizes.size(), kChunks);
  for (size_t i = 0; i < kChunks; ++i) {
    ASSERT_EQ(sizes[i], expected[i].size()) << "chunk " << i;
    ASSERT_EQ(download<uint8_t>(objects[i], sizes[i]), expected[i]) << "chunk " << i;
  }
  const std::vector<const uint8_t*> reads(outs.begin(), outs.end());
  gpu.decode_batch(reads, sizes, keys, back_views);
  for (size_t i = 0; i < kChunks; ++i) ASSERT_EQ(download<uint16_t>(backs[i], values[i].size()), values[i]) << "chunk " << i;

  // One object of the batch read under another's key: refused, and named.
  std::vector<std::string_view> swapped = keys;
  std::swap(swapped[kChunks - 2], swapped[kChunks - 1]);
  try {
    gpu.decode_batch(reads, sizes, swapped, back_views);
    FAIL() << "a batch with objects under the wrong keys was decoded";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("object " + std::to_string(kChunks - 2) + " of " + std::to_string(kChunks)), std::string::npos)
        << e.what();
  }
  // Spans of different lengths are refused before anything runs.
  EXPECT_THROW(gpu.encode_batch(views, std::span(keys).first(kChunks - 1), outs, out_bytes), Error);
  EXPECT_THROW(gpu.decode_batch(reads, sizes, keys, std::span(back_views).first(1)), Error);
}

}  // namespace
}  // namespace gaac
