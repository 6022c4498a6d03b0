// matmul_rows throughput for the quantized weight formats the real models use, scalar reference
// against the AVX2 path, single-threaded, at the models' FFN down-projection shapes (SmolLM2-135M:
// 576 rows × 1536 columns; Gemma 3 270M: 640 × 2048), for one token (decode) and 64 (prefill).
// `GFLOPs` counts 2·rows·cols·tokens per call; `wGB/s` is the weight bytes read per call.
//
//   gaac_quants_bench --benchmark_min_time=0.2
#include <benchmark/benchmark.h>

#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "model/quants.hpp"

namespace {

using gaac::model::GgmlType;

struct Problem {
  std::vector<uint8_t> w;
  size_t row_bytes;
  std::vector<float> x, y;
};

/// Random weights with realistic fp16 scales (exponent 2^-10 .. 2^-4) and unit-normal activations.
Problem make_problem(GgmlType type, int64_t rows, int64_t cols, int64_t tokens) {
  const gaac::model::GgmlTypeInfo& info = gaac::model::ggml_type_info(type);
  Problem p;
  p.row_bytes = static_cast<size_t>(cols / info.block_elements) * info.block_bytes;
  p.w.resize(p.row_bytes * static_cast<size_t>(rows));
  std::mt19937 rng(42);
  for (auto& b : p.w) b = static_cast<uint8_t>(rng());
  std::vector<size_t> scales;
  switch (type) {
    case GgmlType::q8_0: case GgmlType::q4_0: case GgmlType::q5_0: scales = {0}; break;
    case GgmlType::q4_1: case GgmlType::q5_1: case GgmlType::q4_k: case GgmlType::q5_k: scales = {0, 2}; break;
    case GgmlType::q6_k: scales = {208}; break;
    default: break;
  }
  const size_t blocks = p.w.size() / info.block_bytes;
  for (size_t i = 0; i < blocks; ++i) {
    for (size_t at : scales) {
      const auto h = static_cast<uint16_t>((rng() & 0x83FF) | ((5 + rng() % 7) << 10));
      std::memcpy(p.w.data() + i * info.block_bytes + at, &h, 2);
    }
  }
  std::normal_distribution<float> normal(0.0f, 1.0f);
  p.x.resize(static_cast<size_t>(tokens * cols));
  for (auto& v : p.x) v = normal(rng);
  p.y.resize(static_cast<size_t>(tokens * rows));
  return p;
}

void run(benchmark::State& state, GgmlType type, int64_t rows, int64_t cols, int64_t tokens, bool fast) {
  if (fast && !gaac::model::avx2::available()) {
    state.SkipWithError("AVX2 path not available");
    return;
  }
  Problem p = make_problem(type, rows, cols, tokens);
  const auto fn = fast ? gaac::model::avx2::matmul_rows : gaac::model::scalar::matmul_rows;
  for (auto _ : state) {
    fn(type, p.w.data(), p.row_bytes, cols, 0, rows, p.x.data(), tokens, p.y.data(), rows);
    benchmark::DoNotOptimize(p.y.data());
    benchmark::ClobberMemory();
  }
  const double flops = 2.0 * static_cast<double>(rows * cols * tokens);
  state.counters["GFLOPs"] = benchmark::Counter(flops * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
  state.counters["wGB/s"] =
      benchmark::Counter(static_cast<double>(p.w.size()) * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
}

}  // namespace

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  const GgmlType types[] = {GgmlType::q4_1, GgmlType::q8_0, GgmlType::q5_0, GgmlType::q4_k, GgmlType::q6_k};
  const int64_t shapes[][2] = {{576, 1536}, {640, 2048}};
  for (GgmlType type : types) {
    for (const auto& shape : shapes) {
      for (int64_t tokens : {1, 64}) {
        for (bool fast : {false, true}) {
          const std::string name = std::string("matmul/") + gaac::model::ggml_type_info(type).name + "/" + std::to_string(shape[0]) +
                                   "x" + std::to_string(shape[1]) + "/t" + std::to_string(tokens) + "/" +
                                   (fast ? "avx2" : "reference");
          benchmark::RegisterBenchmark(name.c_str(), [=](benchmark::State& s) { run(s, type, shape[0], shape[1], tokens, fast); })
              ->Unit(benchmark::kMicrosecond);
        }
      }
    }
  }
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
