// The attention kernels alone, one block at a time, on 64 blocks of one KV head held in L2 (no
// memory traffic, no driver): the contract's key scores and value fold over BF16 rows (the raw
// kernels) and over compressed slots (fused), per kernel set, at the GQA shapes of the decode
// benchmark (attention_bench.cpp). `elements_per_second` counts the tile elements read (16 tokens ×
// head_dim per block); divide the core clock by it for cycles per element.
//
//   gaac_attention_kernels_bench --benchmark_repetitions=5 --benchmark_report_aggregates_only=true
#include <benchmark/benchmark.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "attention/tile_kernels.hpp"
#include "gaac/calibration.hpp"
#include "gaac/tile_codec.hpp"
#include "gaac/synthetic.hpp"

namespace {

using gaac::attention::BlockTask;
using gaac::attention::Kernels;
using gaac::attention::TileSource;

constexpr int kBlocks = 64;

/// 64 blocks of one kind of one KV head: slots and the same tiles as BF16 rows.
struct Tiles {
  std::vector<std::unique_ptr<gaac::TileCodec>> codecs;
  std::vector<uint8_t> slots;
  std::vector<uint16_t> rows;
  std::vector<TileSource> compressed, raw;  // [block][half], two halves per block
  int halves = 1, channels = 128;

  Tiles(gaac::TensorKind kind, int head_dim) {
    channels = head_dim == 64 ? 64 : 128;
    halves = head_dim / channels;
    gaac::SyntheticKvSpec spec;
    spec.layers = 1;
    spec.kv_heads = 1;
    spec.head_dim = head_dim;
    spec.tokens = kBlocks * gaac::kTileTokens;
    spec.seed = 3;
    const gaac::KvDump dump = gaac::make_synthetic_kv(spec);
    const gaac::KvDump* dumps[] = {&dump};
    const gaac::CalibrationTable table = gaac::calibrate(dumps);
    const gaac::TileShape shape{kind, channels};
    for (int h = 0; h < halves; ++h) {
      codecs.push_back(std::make_unique<gaac::TileCodec>(shape, table.tile_bases(kind, 0, 0, h), shape.max_slot_capacity()));
    }
    const size_t slot_bytes = codecs[0]->slot_bytes(), tile = static_cast<size_t>(shape.elements());
    slots.resize(slot_bytes * kBlocks * halves);
    rows.resize(tile * kBlocks * halves);
    compressed.resize(2 * kBlocks);
    raw.resize(2 * kBlocks);
    const gaac::KvTensor& src = dump.layers[0].of(kind);
    for (int b = 0; b < kBlocks; ++b) {
      for (int h = 0; h < halves; ++h) {
        const size_t i = static_cast<size_t>(b) * halves + h;
        const uint16_t* origin = src.data.data() + static_cast<size_t>(b) * gaac::kTileTokens * head_dim + h * channels;
        uint16_t* r = rows.data() + i * tile;
        for (int t = 0; t < gaac::kTileTokens; ++t) {
          for (int c = 0; c < channels; ++c) r[t * channels + c] = origin[t * head_dim + c];
        }
        codecs[static_cast<size_t>(h)]->encode_blocks(r, static_cast<size_t>(channels), 0, 1, slots.data() + i * slot_bytes, 0, nullptr);
        TileSource& cs = compressed[static_cast<size_t>(2 * b + h)];
        cs.codec = codecs[static_cast<size_t>(h)].get();
        cs.slot = slots.data() + i * slot_bytes;
        for (int t = 0; t < gaac::kTileTokens; ++t) raw[static_cast<size_t>(2 * b + h)].rows[t] = r + t * channels;
      }
    }
  }
};

/// Key scores or value folds of the 64 blocks, every token, `heads` query heads, with `kernels`.
void run(benchmark::State& state, const Kernels* kernels, gaac::TensorKind kind, int head_dim, int heads, bool compressed) {
  if (kernels == nullptr) {
    state.SkipWithError("kernel set not available on this machine");
    return;
  }
  const Tiles tiles(kind, head_dim);
  std::vector<float> q(static_cast<size_t>(heads) * head_dim, 0.5f), prepared(q.size()), scores(static_cast<size_t>(heads) * 16);
  std::vector<float> acc(q.size()), rescale(scores.size(), 1.0f), weight(scores.size(), 0.25f);
  if (compressed && kernels->prepare_compressed_query != nullptr) {
    kernels->prepare_compressed_query(heads, head_dim, q.data(), prepared.data());
  } else {
    prepared = q;
  }
  for (auto _ : state) {
    for (int b = 0; b < kBlocks; ++b) {
      const BlockTask task{(compressed ? tiles.compressed : tiles.raw).data() + 2 * b, tiles.halves, tiles.channels, 0, 16, heads};
      if (kind == gaac::TensorKind::key) {
        (compressed ? kernels->key_scores_compressed : kernels->key_scores_raw)(task, prepared.data(), 1.0f, scores.data());
      } else {
        (compressed ? kernels->fold_values_compressed : kernels->fold_values_raw)(task, rescale.data(), weight.data(), acc.data());
      }
    }
    benchmark::DoNotOptimize(scores.data());
    benchmark::DoNotOptimize(acc.data());
  }
  state.counters["elements_per_second"] = benchmark::Counter(static_cast<double>(kBlocks) * 16 * head_dim,
                                                             benchmark::Counter::kIsIterationInvariantRate, benchmark::Counter::kIs1000);
}

}  // namespace

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  struct Shape {
    const char* name;
    int head_dim, heads;
  };
  const Shape shapes[] = {{"smollm2", 64, 3}, {"gemma3", 256, 4}, {"32q8kv128", 128, 4}};
  const std::pair<const char*, const Kernels*> sets[] = {{"avx2", gaac::attention::avx2_kernels()},
                                                         {"avx512", gaac::attention::avx512_kernels()}};
  for (const Shape& s : shapes) {
    for (const gaac::TensorKind kind : {gaac::TensorKind::key, gaac::TensorKind::value}) {
      const std::string base = std::string("kernel/") + s.name + (kind == gaac::TensorKind::key ? "/keys/" : "/values/");
      benchmark::RegisterBenchmark((base + "raw").c_str(), run, sets[0].second, kind, s.head_dim, s.heads, false);
      for (const auto& [name, kernels] : sets) {
        benchmark::RegisterBenchmark((base + "fused_" + name).c_str(), run, kernels, kind, s.head_dim, s.heads, true);
      }
    }
  }
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
