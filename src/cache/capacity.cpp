#include "gaac/capacity.hpp"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <string>
#include <vector>

#include "cache/layout.hpp"
#include "gaac/error.hpp"
#include "gaac/tiling.hpp"

namespace gaac {
namespace {

/// Per layer and K/V, the share of finalized tiles a gaac cache keeps raw, from the table's metadata.
std::vector<double> fallback_fractions(const CalibrationTable& table, TensorKind kind) {
  std::vector<double> out(static_cast<size_t>(table.layers()), 0.0);
  const auto it = table.metadata().find(std::string(kind == TensorKind::key ? "k" : "v") + ".cache_fallback_fraction");
  if (it == table.metadata().end()) return out;
  const nlohmann::json list = nlohmann::json::parse(it->second, nullptr, false);
  if (!list.is_array() || list.size() != out.size()) return out;
  for (size_t l = 0; l < out.size(); ++l) {
    if (list[l].is_number()) out[l] = std::clamp(list[l].get<double>(), 0.0, 1.0);
  }
  return out;
}

/// Expected units and rows of one sequence of `tokens` tokens.
struct Footprint {
  double units = 0;
  uint64_t rows = 0;
};

class Model {
 public:
  Model(const CacheGeometry& g, CacheFormat format, const CalibrationTable* calibration)
      : g_(g), layout_(cache::layout_for(g, format, calibration)) {
    const int channels = g.head_dim < kMaxTileChannels ? g.head_dim : kMaxTileChannels;
    const double tiles = static_cast<double>(g.kv_heads) * (g.head_dim / channels);
    layer_units_.assign(static_cast<size_t>(g.layers), 2 * tiles);
    if (is_compressed(format)) {
      const auto k = fallback_fractions(*calibration, TensorKind::key), v = fallback_fractions(*calibration, TensorKind::value);
      for (size_t l = 0; l < layer_units_.size(); ++l) {
        layer_units_[l] = tiles * ((1 - k[l]) + k[l] * layout_.raw_units) + tiles * ((1 - v[l]) + v[l] * layout_.raw_units);
        raw_fraction_ += (k[l] + v[l]) / (2.0 * static_cast<double>(g.layers));
      }
    }
    tail_units_ = static_cast<double>(layout_.row_entries * layout_.raw_units);
  }

  const cache::Layout& layout() const { return layout_; }
  double raw_fraction() const { return raw_fraction_; }

  Footprint of(int64_t tokens) const {
    Footprint f;
    if (tokens <= 0) return f;
    const int64_t blocks = (tokens + kTileTokens - 1) / kTileTokens;
    const bool open = tokens % kTileTokens != 0;
    f.rows = static_cast<uint64_t>(blocks);
    for (int l = 0; l < g_.layers; ++l) {
      const int w = g_.sliding_window.empty() ? 0 : g_.sliding_window[static_cast<size_t>(l)];
      const int64_t released = w > 0 && tokens > w ? (tokens - w) / kTileTokens : 0;
      const int64_t finalized = blocks - released - (open ? 1 : 0);
      f.units += static_cast<double>(finalized) * layer_units_[static_cast<size_t>(l)];
    }
    if (open) f.units += tail_units_;
    return f;
  }

  /// Bytes a token adds to a long sequence: the full-attention layers' tiles and a row's entries.
  double bytes_per_token() const {
    double units = 0;
    for (int l = 0; l < g_.layers; ++l) {
      const bool sliding = !g_.sliding_window.empty() && g_.sliding_window[static_cast<size_t>(l)] > 0;
      if (!sliding) units += layer_units_[static_cast<size_t>(l)];
    }
    return (units * layout_.unit_bytes + static_cast<double>(layout_.row_entries) * 4) / kTileTokens;
  }

 private:
  CacheGeometry g_;
  cache::Layout layout_;
  std::vector<double> layer_units_;  // expected units of one finalized block row of each layer
  double tail_units_ = 0;
  double raw_fraction_ = 0;
};

}  // namespace

CapacityEstimate estimate_capacity(const CacheGeometry& geometry, CacheFormat format, const CalibrationTable* calibration,
                                   uint64_t budget, int sequence_tokens) {
  cache::check_geometry(geometry);
  if (sequence_tokens <= 0) throw Error("estimate_capacity: the sequence length must be positive, got " + std::to_string(sequence_tokens));
  const Model model(geometry, format, calibration);
  const cache::Layout& layout = model.layout();
  CapacityEstimate e;
  e.format = format;
  e.budget_bytes = budget;
  e.units = layout.units_for(budget);
  e.unit_bytes = layout.unit_bytes;
  e.raw_fraction = model.raw_fraction();
  e.bytes_per_token = model.bytes_per_token();
  e.sequence_tokens = sequence_tokens;
  const double units = static_cast<double>(e.units);
  const uint64_t rows = layout.rows_for(e.units);
  const auto fits = [&](int64_t tokens, int64_t sequences) {
    const Footprint f = model.of(tokens);
    return f.units * static_cast<double>(sequences) <= units && f.rows * static_cast<uint64_t>(sequences) <= rows;
  };
  int64_t low = 0, high = int64_t{1} << 40;  // the longest sequence: fits(low), not fits(high)
  while (high - low > 1) {
    const int64_t mid = low + (high - low) / 2;
    (fits(mid, 1) ? low : high) = mid;
  }
  e.max_tokens = low;
  const Footprint one = model.of(sequence_tokens);
  e.max_sequences = one.units <= 0 ? 0
                                   : std::min(static_cast<int64_t>(units / one.units),
                                              static_cast<int64_t>(rows / std::max<uint64_t>(one.rows, 1)));
  return e;
}

CapacityMeasurement measure_capacity(const CacheGeometry& geometry, CacheFormat format, const CalibrationTable* calibration,
                                     uint64_t budget, int sequence_tokens, const KvDump& sample) {
  if (sequence_tokens <= 0) throw Error("measure_capacity: the sequence length must be positive");
  if (is_fp8(format)) throw Error(std::string("measure_capacity fills with BF16 rows; a ") + to_string(format) + " cache takes FP8 codes");
  validate_dump(sample);
  if (static_cast<int>(sample.layers.size()) != geometry.layers || sample.kv_heads() != geometry.kv_heads ||
      sample.head_dim() != geometry.head_dim || sample.layers.front().k.tokens == 0) {
    throw Error("measure_capacity: the sample KV does not have the cache's geometry (or has no tokens)");
  }
  CacheConfig config;
  config.geometry = geometry;
  config.format = format;
  config.budget_bytes = budget;
  config.calibration = calibration;
  KvCache cache(std::move(config));
  const int sample_tokens = sample.layers.front().k.tokens;
  CapacityMeasurement m;
  constexpr int kChunk = 64;
  for (bool full = false; !full;) {
    const SequenceId id = cache.add_sequence();
    for (int at = 0; at < sequence_tokens && !full;) {
      // The next rows of the sample, cyclically: as many as fit before its end.
      const int from = at % sample_tokens;
      const int n = std::min({kChunk, sequence_tokens - at, sample_tokens - from});
      std::vector<KvView> k, v;
      for (const KvLayer& layer : sample.layers) {
        k.push_back(view_of(layer.k).tokens_from(from, n));
        v.push_back(view_of(layer.v).tokens_from(from, n));
      }
      full = cache.append(id, k, v).status != CacheStatus::ok;
      at += n;
    }
    if (!full) ++m.sequences;
  }
  m.usage = cache.usage();
  return m;
}

}  // namespace gaac
