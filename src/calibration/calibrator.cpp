#include <algorithm>
#include <cstdio>
#include <numeric>
#include <string>

#include "gaac/calibration.hpp"
#include "gaac/error.hpp"
#include "gaac/tile_codec.hpp"

namespace gaac {
namespace {

constexpr int kExponents = 256;

size_t kind_index(TensorKind kind) { return kind == TensorKind::key ? 0 : 1; }

}  // namespace

uint8_t best_exponent_window(std::span<const uint32_t> counts, int width) {
  if (counts.size() != kExponents || width < 1 || width > kExponents) {
    throw Error("best_exponent_window: need 256 counts and a width in 1..256");
  }
  uint64_t covered = std::accumulate(counts.begin(), counts.begin() + width, uint64_t{0});
  uint64_t best = covered;
  int best_base = 0;
  for (int base = 1; base + width <= kExponents; ++base) {
    covered += counts[static_cast<size_t>(base + width - 1)];
    covered -= counts[static_cast<size_t>(base - 1)];
    if (covered > best) {
      best = covered;
      best_base = base;
    }
  }
  return static_cast<uint8_t>(best_base);
}

Calibrator::Calibrator(int layers, int kv_heads, int head_dim)
    : layers_(layers), kv_heads_(kv_heads), head_dim_(head_dim) {
  (void)CalibrationTable(layers, kv_heads, head_dim);  // validates the geometry
  histograms_.assign(2 * static_cast<size_t>(layers) * kv_heads * head_dim * kExponents, 0);
  const TileShape shape = tile_shape_for(TensorKind::key, head_dim);
  escape_sizes_.assign(2 * static_cast<size_t>(layers) * (shape.max_escape_bytes() + 1), 0);
}

std::span<uint32_t> Calibrator::histogram(TensorKind kind, int layer, int head, int channel) {
  const size_t i = ((kind_index(kind) * layers_ + layer) * kv_heads_ + head) * head_dim_ + channel;
  return std::span(histograms_).subspan(i * kExponents, kExponents);
}
std::span<const uint32_t> Calibrator::histogram(TensorKind kind, int layer, int head, int channel) const {
  return const_cast<Calibrator*>(this)->histogram(kind, layer, head, channel);
}

std::span<uint64_t> Calibrator::escape_histogram(TensorKind kind, int layer) {
  const size_t per = escape_sizes_.size() / (2 * static_cast<size_t>(layers_));
  return std::span(escape_sizes_).subspan((kind_index(kind) * layers_ + layer) * per, per);
}
std::span<const uint64_t> Calibrator::escape_histogram(TensorKind kind, int layer) const {
  return const_cast<Calibrator*>(this)->escape_histogram(kind, layer);
}

void Calibrator::add_exponents(const KvDump& dump, const Progress& progress) {
  CalibrationTable(layers_, kv_heads_, head_dim_).check_matches(dump);
  validate_dump(dump);
  for (int l = 0; l < layers_; ++l) {
    for (const TensorKind kind : {TensorKind::key, TensorKind::value}) {
      const KvTensor& t = dump.layers[static_cast<size_t>(l)].of(kind);
      // Histograms of one layer are contiguous: [head][channel][256], indexed by token-row position.
      uint32_t* counts = histogram(kind, l, 0, 0).data();
      const size_t row = view_of(t).token_stride;
      for (int token = 0; token < t.tokens; ++token) {
        const uint16_t* x = t.data.data() + static_cast<size_t>(token) * row;
        for (size_t i = 0; i < row; ++i) ++counts[i * kExponents + bf16_exponent(x[i])];
      }
    }
    tokens_seen_ += static_cast<uint64_t>(dump.layers[static_cast<size_t>(l)].k.tokens);
    if (progress) progress(static_cast<size_t>(l) + 1, static_cast<size_t>(layers_));
  }
}

CalibrationTable Calibrator::choose_windows() const {
  CalibrationTable table(layers_, kv_heads_, head_dim_);
  for (const TensorKind kind : {TensorKind::key, TensorKind::value}) {
    const TileShape shape = tile_shape_for(kind, head_dim_);
    for (int l = 0; l < layers_; ++l) {
      for (int h = 0; h < kv_heads_; ++h) {
        auto b3 = table.b3(kind, l, h);
        auto b4 = table.b4(kind, l, h);
        for (int c = 0; c < head_dim_; ++c) {
          const auto counts = histogram(kind, l, h, c);
          b3[static_cast<size_t>(c)] = best_exponent_window(counts, 8);
          b4[static_cast<size_t>(c)] = best_exponent_window(counts, 16);
        }
      }
      table.set_escape_capacity(kind, l, shape.max_slot_capacity());
    }
  }
  table.metadata()["tokens"] = std::to_string(tokens_seen_);
  return table;
}

uint8_t Calibrator::window_base(TensorKind kind, int layer, int head, int channel, int width) const {
  if (layer < 0 || layer >= layers_ || head < 0 || head >= kv_heads_ || channel < 0 || channel >= head_dim_) {
    throw Error("window_base: layer, head or channel outside the calibration's geometry");
  }
  return best_exponent_window(histogram(kind, layer, head, channel), width);
}

void Calibrator::add_escape_sizes(const KvDump& dump, const CalibrationTable& table, const Progress& progress) {
  table.check_matches(dump);
  validate_dump(dump);
  // The largest capacity makes every tile's escape size exact.
  const CalibratedCodecs measuring(table, tile_shape_for(TensorKind::key, head_dim_).max_slot_capacity());
  for (int l = 0; l < layers_; ++l) {
    for (const TensorKind kind : {TensorKind::key, TensorKind::value}) {
      auto counts = escape_histogram(kind, l);
      encode_each_tile(view_of(dump.layers[static_cast<size_t>(l)].of(kind)), measuring.tensor_codecs(kind, l),
                       [&](size_t, TilePosition, const TileEncoding& enc, auto) { ++counts[enc.escape_bytes]; });
    }
    if (progress) progress(static_cast<size_t>(l) + 1, static_cast<size_t>(layers_));
  }
}

void Calibrator::choose_capacities(CalibrationTable& table) const {
  size_t largest = 0;
  for (const TensorKind kind : {TensorKind::key, TensorKind::value}) {
    const TileShape shape = tile_shape_for(kind, head_dim_);
    for (int l = 0; l < layers_; ++l) {
      table.set_escape_capacity(kind, l, best_escape_capacity(shape, escape_histogram(kind, l)));
      largest = std::max(largest, table.escape_capacity(kind, l));
    }
  }
  // What a KvCache, whose units all hold the largest capacity, would keep raw: for capacity estimates.
  for (const TensorKind kind : {TensorKind::key, TensorKind::value}) {
    std::string fractions = "[";
    for (int l = 0; l < layers_; ++l) {
      const auto counts = escape_histogram(kind, l);
      const uint64_t all = std::accumulate(counts.begin(), counts.end(), uint64_t{0});
      const uint64_t over = std::accumulate(counts.begin() + static_cast<std::ptrdiff_t>(std::min(largest + 1, counts.size())), counts.end(), uint64_t{0});
      char number[32];
      std::snprintf(number, sizeof number, "%s%.6g", l == 0 ? "" : ", ", all == 0 ? 0.0 : static_cast<double>(over) / static_cast<double>(all));
      fractions += number;
    }
    table.metadata()[std::string(kind == TensorKind::key ? "k" : "v") + ".cache_fallback_fraction"] = fractions + "]";
  }
}

size_t best_escape_capacity(TileShape shape, std::span<const uint64_t> counts) {
  // Expected resident bytes (times the tile count) for capacity c: tiles needing ≤ c escape bytes
  // take a slot, the others a raw tile. Scan c upward keeping the running count of fitting tiles.
  const uint64_t total = std::accumulate(counts.begin(), counts.end(), uint64_t{0});
  if (total == 0) return 0;
  uint64_t fitting = 0;
  size_t next = 0;
  size_t best_capacity = 0;
  double best_cost = -1;
  for (size_t c = 0; c <= shape.max_slot_capacity(); c += kSlotAlignment) {
    for (; next <= c && next < counts.size(); ++next) fitting += counts[next];
    const double cost = static_cast<double>(fitting) * static_cast<double>(shape.slot_bytes(c)) +
                        static_cast<double>(total - fitting) * static_cast<double>(shape.raw_bytes());
    if (best_cost < 0 || cost < best_cost) {
      best_cost = cost;
      best_capacity = c;
    }
  }
  return best_capacity;
}

CalibrationTable calibrate(std::span<const KvDump* const> dumps, const Progress& progress) {
  if (dumps.empty()) throw Error("calibration needs at least one KV dump");
  const KvDump& first = *dumps.front();
  if (first.layers.empty()) throw Error("calibration needs a KV dump with at least one layer");
  Calibrator calibrator(static_cast<int>(first.layers.size()), first.kv_heads(), first.head_dim());
  const size_t steps = 2 * dumps.size() * first.layers.size();
  size_t done = 0;
  auto step = [&](size_t, size_t) {
    if (progress) progress(++done, steps);
  };
  for (const KvDump* d : dumps) calibrator.add_exponents(*d, step);
  CalibrationTable table = calibrator.choose_windows();
  for (const KvDump* d : dumps) calibrator.add_escape_sizes(*d, table, step);
  calibrator.choose_capacities(table);
  return table;
}

}  // namespace gaac
