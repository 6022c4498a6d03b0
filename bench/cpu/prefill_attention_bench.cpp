// CPU prefill attention: one layer of a prompt's queries over the pass's own K and V (an empty cache,
// the rows given with the queries, as the engine's first pass has them), in one gaac::attend call on
// one thread. "tiles": the queries in position order, so consecutive ones go as query tiles;
// "one_per_job": the same queries in reverse order, so that each is a job of its own (the path of a
// decoding step). Both give the same bits. Counter pairs_per_second: (query, query head, position)
// triples scored, softmaxed and folded per second; ns_per_pair is its inverse.
//
// Shape: SmolLM2-135M (9 query / 3 KV heads, head_dim 64). K, V and q are N(0, 1).
//
//   gaac_prefill_attention_bench --benchmark_repetitions=5 --benchmark_report_aggregates_only=true
#include <benchmark/benchmark.h>

#include <algorithm>
#include <random>
#include <vector>

#include "gaac/attention.hpp"
#include "gaac/bf16.hpp"
#include "gaac/kv_cache.hpp"

namespace {

void prefill_attention(benchmark::State& state, bool tiles) {
  const int tokens = static_cast<int>(state.range(0)), q_heads = 9, kv_heads = 3, head_dim = 64;
  std::mt19937 rng(1);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<uint16_t> k(static_cast<size_t>(tokens) * kv_heads * head_dim), v(k.size());
  for (uint16_t& x : k) x = gaac::float_to_bf16(normal(rng));
  for (uint16_t& x : v) x = gaac::float_to_bf16(normal(rng));
  std::vector<float> q(static_cast<size_t>(tokens) * q_heads * head_dim), out(q.size());
  for (float& x : q) x = normal(rng);
  gaac::CacheConfig config;
  config.geometry = {1, kv_heads, head_dim, {0}};
  config.format = gaac::CacheFormat::bf16;
  config.budget_bytes = size_t{1} << 20;
  gaac::KvCache cache(std::move(config));
  const gaac::SequenceId id = cache.add_sequence();
  const size_t stride = static_cast<size_t>(kv_heads) * head_dim;
  const gaac::KvView kv{k.data(), tokens, kv_heads, head_dim, stride, static_cast<size_t>(head_dim)};
  const gaac::KvView vv{v.data(), tokens, kv_heads, head_dim, stride, static_cast<size_t>(head_dim)};
  std::vector<gaac::AttentionQuery> queries;
  for (int t = 0; t < tokens; ++t) {
    const size_t at = static_cast<size_t>(t) * q_heads * head_dim;
    queries.push_back({id, t, q.data() + at, out.data() + at, kv, vv});
  }
  if (!tiles) std::reverse(queries.begin(), queries.end());
  gaac::AttentionOptions options;
  options.q_heads = q_heads;
  options.scale = 0.125f;
  for (auto _ : state) {
    gaac::attend(cache, 0, queries, options);
    benchmark::DoNotOptimize(out.data());
  }
  const double pairs = static_cast<double>(tokens) * (tokens + 1) / 2 * q_heads;
  state.counters["pairs_per_second"] = benchmark::Counter(pairs, benchmark::Counter::kIsIterationInvariantRate);
}

BENCHMARK_CAPTURE(prefill_attention, tiles, true)->Arg(512)->Arg(2048)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK_CAPTURE(prefill_attention, one_per_job, false)->Arg(512)->Arg(2048)->Unit(benchmark::kMillisecond)->UseRealTime();

}  // namespace

BENCHMARK_MAIN();
