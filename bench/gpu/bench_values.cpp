#include "bench_values.hpp"

#include <algorithm>
#include <cstring>
#include <functional>
#include <span>
#include <thread>

#include "gaac/error.hpp"
#include "gaac/synthetic.hpp"
#include "gaac/tensor_view.hpp"
#include "io/kv_dump_file.hpp"

namespace gaac::bench {
namespace {

/// The calibration of one layer of `table`, as a one-layer table (for caches of one layer).
CalibrationTable calibration_of_layer(const CalibrationTable& table, int layer) {
  CalibrationTable one(1, table.kv_heads(), table.head_dim());
  for (const TensorKind kind : {TensorKind::key, TensorKind::value}) {
    for (int h = 0; h < table.kv_heads(); ++h) {
      std::ranges::copy(table.b3(kind, layer, h), one.b3(kind, 0, h).begin());
      std::ranges::copy(table.b4(kind, layer, h), one.b4(kind, 0, h).begin());
    }
    one.set_escape_capacity(kind, 0, table.escape_capacity(kind, layer));
  }
  one.metadata() = table.metadata();
  return one;
}

/// `src` repeated along tokens to `tokens` tokens, starting at token `shift`.
template <class T>
BasicKvTensor<T> tiled_tensor(const BasicKvTensor<T>& src, int tokens, int shift) {
  BasicKvTensor<T> dst{tokens, src.kv_heads, src.head_dim, {}};
  const size_t row = static_cast<size_t>(src.kv_heads) * src.head_dim;
  dst.data.resize(static_cast<size_t>(tokens) * row);
  for (int t = 0; t < tokens; ++t)
    std::memcpy(dst.data.data() + static_cast<size_t>(t) * row,
                src.data.data() + static_cast<size_t>((t + shift) % src.tokens) * row, row * sizeof(T));
  return dst;
}

/// Runs body over [0, n) in one chunk per core.
void on_every_core(size_t n, const std::function<void(size_t, size_t)>& body) {
  const size_t threads = std::max<size_t>(1, std::min<size_t>(std::thread::hardware_concurrency(), n));
  std::vector<std::thread> pool;
  for (size_t i = 0; i < threads; ++i) pool.emplace_back([&, i] { body(n * i / threads, n * (i + 1) / threads); });
  for (std::thread& t : pool) t.join();
}

/// A cache of one layer made from `config` (its format, calibration and FP8 settings; the geometry and
/// a budget that surely holds them are set here) holding each of `sequences` as one sequence, appended
/// whole, and their table.
template <class Dump>
KvCache fill_cache(const std::vector<Dump>& sequences, CacheConfig config, int window, SequenceTable& batch) {
  const Dump& first = sequences.front();
  config.geometry = {1, first.kv_heads(), first.head_dim(), {window}};
  config.budget_bytes = worst_case_budget(config.geometry, config.format, config.calibration, first.layers[0].k.tokens,
                                          static_cast<int>(sequences.size()));
  config.parallel = on_every_core;
  KvCache cache(std::move(config));
  using View = decltype(view_of(first.layers[0].k));  // KvView or Fp8KvView
  std::vector<SequenceId> ids;
  for (const Dump& d : sequences) {
    ids.push_back(cache.add_sequence());
    const View k[] = {view_of(d.layers[0].k)};
    const View v[] = {view_of(d.layers[0].v)};
    if (cache.append(ids.back(), k, v).status != CacheStatus::ok) throw Error("bench: the cache is full");
  }
  batch = cache.sequence_table(ids);
  return cache;
}

}  // namespace

std::string& last_error() {
  thread_local std::string message;
  return message;
}

void base_values(const std::string& source, int layer, const std::string& calibration, int kv_heads, int head_dim,
                 uint64_t seed, KvDump& out, CalibrationTable& table) {
  if (source == "synthetic") {
    SyntheticKvSpec spec;
    spec.layers = 1, spec.kv_heads = kv_heads, spec.head_dim = head_dim, spec.tokens = 4096, spec.seed = seed;
    out = make_synthetic_kv(spec);
    const KvDump* b = &out;
    table = calibrate(std::span<const KvDump* const>(&b, 1));
    return;
  }
  KvDump all = io::load_kv_dump(source);
  const bool has_table = !calibration.empty();
  const CalibrationTable file = has_table ? load_calibration(calibration) : CalibrationTable();
  out = KvDump();
  if (all.head_dim() == head_dim) {
    out.layers.push_back(std::move(all.layers.at(static_cast<size_t>(layer))));
    if (out.kv_heads() != kv_heads)
      throw Error("bench: the dump has " + std::to_string(out.kv_heads()) + " KV heads, the case " + std::to_string(kv_heads));
    if (has_table) {
      table = calibration_of_layer(file, layer);
    } else {
      const KvDump* b = &out;
      table = calibrate(std::span<const KvDump* const>(&b, 1));
    }
    return;
  }
  const int narrow = all.head_dim(), heads = all.kv_heads();
  if (2 * narrow != head_dim || static_cast<int>(all.layers.size()) * heads < 2 * kv_heads)
    throw Error("bench: cannot build " + std::to_string(kv_heads) + " heads of width " + std::to_string(head_dim) +
                " from the dump's " + std::to_string(all.layers.size()) + " layers of " + std::to_string(heads) +
                " heads of width " + std::to_string(narrow));
  const int tokens = all.layers.front().k.tokens;
  out.layers.resize(1);
  table = CalibrationTable(1, kv_heads, head_dim);
  for (int kind = 0; kind < 2; ++kind) {
    KvTensor& dst = kind ? out.layers[0].v : out.layers[0].k;
    dst.tokens = tokens, dst.kv_heads = kv_heads, dst.head_dim = head_dim;
    dst.data.resize(dst.elements());
    const TensorKind tk = kind ? TensorKind::value : TensorKind::key;
    for (int h = 0; h < kv_heads; ++h)
      for (int part = 0; part < 2; ++part) {
        const int pair = 2 * h + part, l = pair / heads, hh = pair % heads;
        const KvTensor& src = kind ? all.layers[static_cast<size_t>(l)].v : all.layers[static_cast<size_t>(l)].k;
        for (int t = 0; t < tokens; ++t)
          for (int c = 0; c < narrow; ++c)
            dst.data[(static_cast<size_t>(t) * kv_heads + h) * head_dim + part * narrow + c] = src.at(t, hh, c);
        if (has_table) {
          std::ranges::copy(file.b3(tk, l, hh), table.b3(tk, 0, h).begin() + part * narrow);
          std::ranges::copy(file.b4(tk, l, hh), table.b4(tk, 0, h).begin() + part * narrow);
        }
      }
  }
  const KvDump* b = &out;
  if (!has_table) {
    table = calibrate(std::span<const KvDump* const>(&b, 1));
    return;
  }
  Calibrator capacities(1, kv_heads, head_dim);
  capacities.add_escape_sizes(out, table);
  capacities.choose_capacities(table);
}

KvDump tiled(const KvDump& base, int tokens, int shift) {
  KvDump d;
  d.layers.push_back({tiled_tensor(base.layers[0].k, tokens, shift), tiled_tensor(base.layers[0].v, tokens, shift)});
  return d;
}

Fp8KvDump tiled(const Fp8KvDump& base, int tokens, int shift) {
  Fp8KvDump d;
  d.format = base.format, d.k_scales = base.k_scales, d.v_scales = base.v_scales;
  d.layers.push_back({tiled_tensor(base.layers[0].k, tokens, shift), tiled_tensor(base.layers[0].v, tokens, shift)});
  return d;
}

KvCache fill(const std::vector<KvDump>& sequences, CacheFormat format, const CalibrationTable& table, int window,
             SequenceTable& batch) {
  CacheConfig config;
  config.format = format;
  config.calibration = &table;
  return fill_cache(sequences, std::move(config), window, batch);
}

KvCache fill(const std::vector<Fp8KvDump>& sequences, CacheFormat format, const CalibrationTable& table, int window,
             SequenceTable& batch) {
  const Fp8KvDump& first = sequences.front();
  CacheConfig config;
  config.format = format;
  config.calibration = &table;
  config.fp8 = {first.format, first.k_scales, first.v_scales};
  return fill_cache(sequences, std::move(config), window, batch);
}

}  // namespace gaac::bench
