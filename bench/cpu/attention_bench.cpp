// CPU decode attention: one query token per sequence attending every layer of a paged cache (a decode
// step), GAAC read fused (slots rebuilt in registers; the best kernels, and the AVX2 ones where
// AVX-512 is the best) against the BF16 cache through the same driver and kernels and against
// decompress-first (each slot decoded to a BF16 tile, then read as one), on one thread and on all
// threads of the engine's pool. Also what finalizing a block costs (the append that
// completes it encodes the block of every layer) and what memory is resident per token.
//
// Shapes: SmolLM2-135M (9 query / 3 KV heads, head_dim 64, 30 layers), Gemma 3 270M (4 / 1 / 256,
// 18 layers), and 32 / 8 / 128 with 32 layers (Llama 3 8B); every layer attends the whole context
// (Gemma's sliding-window layers included). KV: synthetic (gaac's generator, 512 tokens calibrated on
// themselves) and, when scripts/bench_kv.sh has written them to $GAAC_KV_DIR (default
// ~/.cache/gaac/kv), the real caches of SmolLM2 and Gemma 3 (2,048 tokens, tables calibrated on
// another text); both tiled to the context length. Queries are N(0, 1) for real KV and N(0, 1/64)
// for synthetic KV: the generator's outlier channels spread N(0, 1) scores so far that ~5% of the
// softmax weights are subnormal, and every multiply-add with a subnormal operand takes a microcode
// assist (~100× slower), which would time the assists rather than the reads.
//
// Counters: bytes_per_second, the cache bytes a step reads (slots, raw tiles and the tail for GAAC,
// BF16 rows for BF16); resident_B/token, the cache's resident bytes per token (all layers);
// splits, the ranges each (query, KV head) is cut into. One configuration (shape, KV, context) is
// built at a time and its variants run together, so `--benchmark_enable_random_interleaving=true`
// interleaves them within one process:
//
//   gaac_attention_bench --benchmark_repetitions=5 --benchmark_enable_random_interleaving=true
//                        --benchmark_report_aggregates_only=true --benchmark_min_time=1
#include <benchmark/benchmark.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <functional>
#include <memory>
#include <numeric>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "attention/attention_internal.hpp"
#include "gaac/attention.hpp"
#include "gaac/calibration.hpp"
#include "gaac/kv_cache.hpp"
#include "gaac/synthetic.hpp"
#include "io/kv_dump_file.hpp"
#include "model/thread_pool.hpp"

namespace {

/// A model's attention geometry.
struct ModelShape {
  const char* name;
  int q_heads, kv_heads, head_dim, layers;
  const char* real;  ///< name of its real dump in $GAAC_KV_DIR, or null
};

constexpr ModelShape kShapes[] = {
    {"smollm2", 9, 3, 64, 30, "smollm2"},
    {"gemma3", 4, 1, 256, 18, "gemma3"},
    {"32q8kv128", 32, 8, 128, 32, nullptr},
};
constexpr int kContexts[] = {1024, 4096, 16384, 32768};
constexpr int kSyntheticTokens = 512;

gaac::model::ThreadPool& pool() {
  static gaac::model::ThreadPool p(0);
  return p;
}

gaac::ParallelFor pool_parallel() {
  return [](size_t n, const std::function<void(size_t, size_t)>& body) {
    pool().parallel_for(static_cast<int64_t>(n), 1, [&](int64_t b, int64_t e) { body(static_cast<size_t>(b), static_cast<size_t>(e)); });
  };
}

std::filesystem::path kv_dir() {
  const char* env = std::getenv("GAAC_KV_DIR");
  const char* home = std::getenv("HOME");
  return env ? env : std::string(home ? home : ".") + "/.cache/gaac/kv";
}

bool real_kv_present(const ModelShape& s) {
  return s.real != nullptr && std::filesystem::exists(kv_dir() / (std::string(s.real) + "-gpl3-2048.safetensors")) &&
         std::filesystem::exists(kv_dir() / (std::string(s.real) + "-calibration.safetensors"));
}

/// The KV a configuration tiles: one dump covering every layer and its calibration.
struct Source {
  std::string key;
  gaac::KvDump dump;
  gaac::CalibrationTable table;
};

/// The source of (shape, real): the last one asked for is kept (finalize and every context of a
/// shape share it).
const Source& source(const ModelShape& s, bool real);

Source load_source(const ModelShape& s, bool real) {
  Source src;
  src.key = std::string(s.name) + (real ? "/real" : "/synthetic");
  if (real) {
    src.dump = gaac::io::load_kv_dump((kv_dir() / (std::string(s.real) + "-gpl3-2048.safetensors")).string());
    src.table = gaac::load_calibration((kv_dir() / (std::string(s.real) + "-calibration.safetensors")).string());
  } else {
    gaac::SyntheticKvSpec spec;
    spec.layers = s.layers;
    spec.kv_heads = s.kv_heads;
    spec.head_dim = s.head_dim;
    spec.tokens = kSyntheticTokens;
    spec.seed = 7;
    src.dump = gaac::make_synthetic_kv(spec);
    const gaac::KvDump* dumps[] = {&src.dump};
    src.table = gaac::calibrate(dumps);
  }
  return src;
}

/// Appends positions [from, to) of the source, tiled (position p is source token p mod its length),
/// to every layer of `cache`.
gaac::AppendOutcome append_tiled(gaac::KvCache& cache, gaac::SequenceId id, const Source& src, int from, int to) {
  const int period = src.dump.layers[0].k.tokens;
  for (int at = from; at < to;) {
    const int offset = at % period, n = std::min(to - at, period - offset);
    std::vector<gaac::KvView> k, v;
    for (const gaac::KvLayer& layer : src.dump.layers) {
      k.push_back(gaac::view_of(layer.k).tokens_from(offset, n));
      v.push_back(gaac::view_of(layer.v).tokens_from(offset, n));
    }
    const gaac::AppendOutcome outcome = cache.append(id, k, v);
    if (outcome.status != gaac::CacheStatus::ok) return outcome;
    at += n;
  }
  return {};
}

gaac::CacheConfig cache_config(const ModelShape& s, const Source& src, gaac::CacheFormat format, size_t budget) {
  gaac::CacheConfig c;
  c.geometry = {s.layers, s.kv_heads, s.head_dim, {}};
  c.format = format;
  c.budget_bytes = budget;
  c.calibration = &src.table;
  c.parallel = pool_parallel();
  return c;
}

/// A cache of the given format holding one sequence of `tokens` tiled source tokens, its budget
/// (memory is zeroed and resident) grown until the sequence fits.
std::unique_ptr<gaac::KvCache> filled_cache(const ModelShape& s, const Source& src, gaac::CacheFormat format, int tokens,
                                            gaac::SequenceId& id) {
  const double bf16 = 4.0 * s.layers * s.kv_heads * s.head_dim * static_cast<double>(tokens);
  double budget = (format == gaac::CacheFormat::gaac ? 0.78 : 1.02) * bf16 + (8 << 20);
  for (;;) {
    auto cache = std::make_unique<gaac::KvCache>(cache_config(s, src, format, static_cast<size_t>(budget)));
    id = cache->add_sequence();
    const gaac::AppendOutcome outcome = append_tiled(*cache, id, src, 0, tokens);
    if (outcome.status == gaac::CacheStatus::ok) return cache;
    budget = budget * 1.1 + static_cast<double>(outcome.bytes_needed);
  }
}

/// The ranges a (query, KV head) is cut into on `threads` threads: the fewest that give every thread
/// the same number of jobs (the pool hands out contiguous equal shares), no more than the blocks.
int choose_splits(int kv_heads, int threads, int tokens) {
  if (threads <= 1) return 1;
  const int splits = threads / std::gcd(kv_heads, threads);
  return std::max(1, std::min(splits, tokens / gaac::kTileTokens));
}

/// One configuration: both caches at one context length, a query, and the output buffer.
struct Config {
  std::string key;
  ModelShape shape;
  std::unique_ptr<gaac::KvCache> gaac_cache, bf16_cache;
  gaac::SequenceId gaac_id = 0, bf16_id = 0;
  int tokens = 0;
  std::vector<float> q, out;
};

std::unique_ptr<Source> current_source;

const Source& source(const ModelShape& s, bool real) {
  const std::string key = std::string(s.name) + (real ? "/real" : "/synthetic");
  if (!current_source || current_source->key != key) {
    current_source.reset();
    current_source = std::make_unique<Source>(load_source(s, real));
  }
  return *current_source;
}

std::unique_ptr<Config> current_config;

/// The configuration benchmarks run on: built when first asked for, the previous one freed first.
Config& config(const ModelShape& s, bool real, int tokens) {
  const std::string key = std::string(s.name) + (real ? "/real/" : "/synthetic/") + std::to_string(tokens);
  if (current_config && current_config->key == key) return *current_config;
  current_config.reset();
  const Source& src = source(s, real);
  auto c = std::make_unique<Config>();
  c->key = key;
  c->shape = s;
  c->tokens = tokens;
  c->gaac_cache = filled_cache(s, src, gaac::CacheFormat::gaac, tokens, c->gaac_id);
  c->bf16_cache = filled_cache(s, src, gaac::CacheFormat::bf16, tokens, c->bf16_id);
  std::mt19937 rng(1);
  std::normal_distribution<float> normal(0.0f, real ? 1.0f : 0.125f);
  c->q.resize(static_cast<size_t>(s.q_heads) * s.head_dim);
  for (float& x : c->q) x = normal(rng);
  c->out.resize(c->q.size());
  current_config = std::move(c);
  return *current_config;
}

enum class Variant { gaac_fused, gaac_fused_avx2, bf16, decompress_first };

const char* to_string(Variant v) {
  switch (v) {
    case Variant::gaac_fused: return "gaac_fused";
    case Variant::gaac_fused_avx2: return "gaac_fused_avx2";
    case Variant::bf16: return "bf16";
    case Variant::decompress_first: return "decompress_first";
  }
  return "?";
}

void attend_step(benchmark::State& state, const ModelShape& s, bool real, int tokens, Variant variant, int threads) {
  Config& c = config(s, real, tokens);
  const bool bf16 = variant == Variant::bf16;
  const gaac::KvCache& cache = bf16 ? *c.bf16_cache : *c.gaac_cache;
  gaac::AttentionQuery query{bf16 ? c.bf16_id : c.gaac_id, tokens - 1, c.q.data(), c.out.data(), {}, {}};
  gaac::AttentionOptions o;
  o.q_heads = s.q_heads;
  o.scale = 1.0f / std::sqrt(static_cast<float>(s.head_dim));
  o.window = 0;
  o.path = variant == Variant::decompress_first ? gaac::AttentionPath::reference : gaac::AttentionPath::fused;
  o.splits = choose_splits(s.kv_heads, threads, tokens);
  if (threads > 1) o.parallel = pool_parallel();
  const gaac::attention::Kernels& kernels =
      variant == Variant::gaac_fused_avx2 ? *gaac::attention::avx2_kernels() : gaac::attention::best_kernels();
  state.SetLabel(kernels.name);
  for (auto _ : state) {
    for (int layer = 0; layer < s.layers; ++layer) gaac::attention::attend_with(kernels, cache, layer, std::span(&query, 1), o);
    benchmark::DoNotOptimize(c.out.data());
    benchmark::ClobberMemory();
  }
  const gaac::CacheUsage u = cache.usage();
  state.counters["bytes_per_second"] =
      benchmark::Counter(static_cast<double>(u.unit_bytes_used()), benchmark::Counter::kIsIterationInvariantRate, benchmark::Counter::kIs1000);
  state.counters["resident_B/token"] = static_cast<double>(u.resident_bytes()) / tokens;
  state.counters["splits"] = o.splits;
}

/// The append of a block's 16th token (every layer's tiles of the block encoded, or kept raw).
void finalize_block(benchmark::State& state, const ModelShape& s, bool real, gaac::CacheFormat format, int threads) {
  const Source& src = source(s, real);
  gaac::CacheConfig cfg = cache_config(s, src, format, size_t{64} << 20);
  if (threads <= 1) cfg.parallel = nullptr;
  gaac::KvCache cache(cfg);
  int at = 0;
  for (auto _ : state) {
    state.PauseTiming();
    const gaac::SequenceId id = cache.add_sequence();
    const int first = at;
    at = (at + gaac::kTileTokens) % src.dump.layers[0].k.tokens;  // a different block each time
    append_tiled(cache, id, src, first, first + gaac::kTileTokens - 1);
    state.ResumeTiming();
    if (append_tiled(cache, id, src, first + gaac::kTileTokens - 1, first + gaac::kTileTokens).status != gaac::CacheStatus::ok) {
      state.SkipWithError("out of space");
      break;
    }
    state.PauseTiming();
    cache.free_sequence(id);
    state.ResumeTiming();
  }
  state.counters["tiles"] = 2.0 * s.layers * s.kv_heads * (s.head_dim / std::min(s.head_dim, 128));
}

/// Two 1 GiB buffers for the bandwidth benchmarks, freed once they have run.
std::unique_ptr<std::vector<uint64_t>> bandwidth_buffers[2];

/// Memory bandwidth of this machine: `threads` threads reading (summing) or copying 1 GiB.
void memory_bandwidth(benchmark::State& state, bool copy, int threads) {
  constexpr size_t kWords = (size_t{1} << 30) / sizeof(uint64_t);
  for (auto& b : bandwidth_buffers) {
    if (!b) b = std::make_unique<std::vector<uint64_t>>(kWords, 1);
  }
  const size_t share = kWords / static_cast<size_t>(threads);
  const auto work = [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      const uint64_t* x = bandwidth_buffers[0]->data() + static_cast<size_t>(i) * share;
      if (copy) {
        std::memcpy(bandwidth_buffers[1]->data() + static_cast<size_t>(i) * share, x, share * sizeof(uint64_t));
      } else {
        uint64_t sum = 0;
        for (size_t k = 0; k < share; ++k) sum += x[k];
        benchmark::DoNotOptimize(sum);
      }
    }
  };
  for (auto _ : state) {
    if (threads > 1) {
      pool().parallel_for(threads, 1, work);
    } else {
      work(0, 1);
    }
    benchmark::ClobberMemory();
  }
  state.counters["bytes_per_second"] =
      benchmark::Counter(static_cast<double>((copy ? 2 : 1) * kWords * sizeof(uint64_t)), benchmark::Counter::kIsIterationInvariantRate,
                         benchmark::Counter::kIs1000);
}

}  // namespace

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  const int all = pool().size();
  std::vector<int> threads{1};
  if (all > 1) threads.push_back(all);
  // One configuration per run: its variants interleave, and only it is in memory. One reporter for
  // every run (the library's default one does not survive a run that matches nothing).
  const std::unique_ptr<benchmark::BenchmarkReporter> reporter(benchmark::CreateDefaultDisplayReporter());
  const auto run = [&](const std::function<void()>& add) {
    benchmark::ClearRegisteredBenchmarks();
    add();
    benchmark::RunSpecifiedBenchmarks(reporter.get());
  };
  run([&] {
    for (const int t : threads) {
      for (const bool copy : {false, true}) {
        benchmark::RegisterBenchmark((std::string("memory/") + (copy ? "copy" : "read") + "/threads:" + std::to_string(t)).c_str(),
                                     memory_bandwidth, copy, t)->UseRealTime()->Unit(benchmark::kMillisecond);
      }
    }
  });
  for (auto& b : bandwidth_buffers) b.reset();
  for (const ModelShape& s : kShapes) {
    for (const bool real : {false, true}) {
      if (real && !real_kv_present(s)) continue;
      const std::string kv = std::string(s.name) + (real ? "/real" : "/synthetic");
      run([&] {
        for (const int t : threads) {
          for (const gaac::CacheFormat f : {gaac::CacheFormat::gaac, gaac::CacheFormat::bf16}) {
            benchmark::RegisterBenchmark(("finalize/" + kv + "/" + gaac::to_string(f) + "/threads:" + std::to_string(t)).c_str(),
                                         finalize_block, s, real, f, t)->UseRealTime()->Unit(benchmark::kMicrosecond);
          }
        }
      });
      for (const int tokens : kContexts) {
        run([&] {
          for (const int t : threads) {
            for (const Variant v : {Variant::gaac_fused, Variant::gaac_fused_avx2, Variant::bf16, Variant::decompress_first}) {
              if (v == Variant::gaac_fused_avx2 && &gaac::attention::best_kernels() == gaac::attention::avx2_kernels()) continue;
              benchmark::RegisterBenchmark(
                  ("attend/" + kv + "/" + std::to_string(tokens) + "/" + to_string(v) + "/threads:" + std::to_string(t)).c_str(),
                  attend_step, s, real, tokens, v, t)->UseRealTime()->Unit(benchmark::kMicrosecond);
            }
          }
        });
      }
    }
  }
  benchmark::Shutdown();
  return 0;
}
