// KV chunk objects on the CPU: gaac::ChunkCodec encode and decode of 256-token chunks, on 1, 2 and 4
// threads, counting BF16 bytes as processed; `ratio` is BF16 bytes / object bytes. Chunks:
//   synthetic_8b      the 8B geometry (32 layers × 8 KV heads × 128 channels: 32 MiB), synthetic
//   smollm2, gemma3   the first 256 tokens of the real caches scripts/bench_kv.sh writes, with their
//                     calibration tables (learnt on another text), when present in $GAAC_KV_DIR
//                     (default ~/.cache/gaac/kv)
// Buffers are written once before timing (no first-touch page faults in the figures).
//
//   gaac_chunk_bench --benchmark_min_time=0.5
#include <benchmark/benchmark.h>

#include <cstdlib>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "gaac/chunk.hpp"
#include "gaac/synthetic.hpp"
#include "io/kv_dump_file.hpp"

namespace {

constexpr int kTokens = 256;

struct Chunk {
  gaac::ChunkGeometry geometry;
  std::vector<uint16_t> values;
  gaac::CalibrationTable table;
};

/// The first kTokens tokens of every layer of `dump` as a dense chunk.
std::vector<uint16_t> chunk_of(const gaac::KvDump& dump, const gaac::ChunkGeometry& g) {
  std::vector<uint16_t> values(g.elements());
  const gaac::MutableChunkView view = gaac::dense_chunk_view(values.data(), g);
  for (int l = 0; l < g.layers; ++l) {
    for (const gaac::TensorKind kind : {gaac::TensorKind::key, gaac::TensorKind::value}) {
      const gaac::KvTensor& t = dump.layers[static_cast<size_t>(l)].of(kind);
      for (int tok = 0; tok < g.tokens; ++tok) {
        for (int h = 0; h < g.kv_heads; ++h) {
          for (int c = 0; c < g.head_dim; ++c) view.tensor(kind, l).at(tok, h)[c] = t.at(tok, h, c);
        }
      }
    }
  }
  return values;
}

std::unique_ptr<Chunk> synthetic_8b() {
  const gaac::KvDump dump = gaac::make_synthetic_kv({.layers = 32, .kv_heads = 8, .head_dim = 128, .tokens = kTokens, .seed = 3});
  const gaac::ChunkGeometry g{32, 8, 128, kTokens};
  const gaac::KvDump* dumps[] = {&dump};
  return std::make_unique<Chunk>(Chunk{g, chunk_of(dump, g), gaac::calibrate(dumps)});
}

std::unique_ptr<Chunk> real(const std::string& model) {
  const char* env = std::getenv("GAAC_KV_DIR");
  const char* home = std::getenv("HOME");
  const std::filesystem::path dir = env ? env : std::filesystem::path(home ? home : ".") / ".cache/gaac/kv";
  const auto dump_path = dir / (model + "-gpl3-2048.safetensors"), table_path = dir / (model + "-calibration.safetensors");
  if (!std::filesystem::exists(dump_path) || !std::filesystem::exists(table_path)) return nullptr;
  const gaac::KvDump dump = gaac::io::load_kv_dump(dump_path.string());
  const gaac::ChunkGeometry g{static_cast<int>(dump.layers.size()), dump.kv_heads(), dump.head_dim(), kTokens};
  return std::make_unique<Chunk>(Chunk{g, chunk_of(dump, g), gaac::load_calibration(table_path.string())});
}

void run(benchmark::State& state, const Chunk* chunk, bool encode) {
  if (chunk == nullptr) {
    state.SkipWithError("no KV dump (scripts/bench_kv.sh, GAAC_KV_DIR)");
    return;
  }
  const gaac::ChunkCodec codec(chunk->table, {.threads = static_cast<int>(state.range(0))});
  std::vector<uint8_t> object(codec.object_bytes(kTokens), 1);
  const gaac::ChunkView view = gaac::dense_chunk_view(static_cast<const uint16_t*>(chunk->values.data()), chunk->geometry);
  const size_t bytes = codec.encode(view, "bench", object);
  std::vector<uint16_t> back(chunk->values.size(), 1);
  const gaac::MutableChunkView out = gaac::dense_chunk_view(back.data(), chunk->geometry);
  for (auto _ : state) {
    if (encode) {
      benchmark::DoNotOptimize(codec.encode(view, "bench", object));
    } else {
      codec.decode(std::span<const uint8_t>(object.data(), bytes), "bench", out);
    }
    benchmark::ClobberMemory();
  }
  if (back != chunk->values && !encode) state.SkipWithError("decode is not bit-exact");
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) * static_cast<int64_t>(chunk->geometry.bf16_bytes()));
  state.counters["ratio"] = static_cast<double>(chunk->geometry.bf16_bytes()) / static_cast<double>(bytes);
}

const Chunk* corpus(const std::string& name) {
  static const std::unique_ptr<Chunk> synthetic = synthetic_8b(), smollm2 = real("smollm2"), gemma3 = real("gemma3");
  return name == "synthetic_8b" ? synthetic.get() : name == "smollm2" ? smollm2.get() : gemma3.get();
}

}  // namespace

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  for (const std::string name : {"synthetic_8b", "smollm2", "gemma3"}) {
    for (const bool encode : {true, false}) {
      benchmark::RegisterBenchmark((std::string(encode ? "encode/" : "decode/") + name).c_str(),
                                   [name, encode](benchmark::State& s) { run(s, corpus(name), encode); })
          ->ArgName("threads")
          ->Arg(1)
          ->Arg(2)
          ->Arg(4)
          ->UseRealTime()
          ->Unit(benchmark::kMillisecond);
    }
  }
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
