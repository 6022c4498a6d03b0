#include <algorithm>
#include <cstdio>
#include <numeric>
#include <string>

#include "gaac/calibration.hpp"
#include "gaac/error.hpp"
#include "gaac/fp8_codec.hpp"
#include "gaac/tile_codec.hpp"

namespace gaac {
namespace {

constexpr int kExponents = 256;

size_t kind_index(TensorKind kind) { return kind == TensorKind::key ? 0 : 1; }

/// The exponent of an element: BF16 or FP8 of the calibrator's format.
uint8_t exponent_of(uint16_t x, ElementFormat) { return bf16_exponent(x); }
uint8_t exponent_of(uint8_t x, ElementFormat format) { return fp8_exponent(x, format); }


/// Largest escape bytes a tile of this format can need (for the histogram of pass 2).
size_t max_escape_bytes(ElementFormat format, int head_dim) {
  const TileShape shape = tile_shape_for(TensorKind::key, head_dim);
  return is_fp8(format) ? Fp8TileShape{format, shape}.max_escape_bytes() : shape.max_escape_bytes();
}

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

Calibrator::Calibrator(int layers, int kv_heads, int head_dim, ElementFormat format)
    : layers_(layers), kv_heads_(kv_heads), head_dim_(head_dim), format_(format) {
  (void)CalibrationTable(layers, kv_heads, head_dim, format);  // validates the geometry and format
  histograms_.assign(2 * static_cast<size_t>(layers) * kv_heads * head_dim * kExponents, 0);
  escape_sizes_.assign(2 * static_cast<size_t>(layers) * (max_escape_bytes(format, head_dim) + 1), 0);
}

void Calibrator::check_format(ElementFormat format) const {
  if (format != format_) {
    throw Error(std::string("the calibrator is for ") + to_string(format_) + " elements, the KV dump is " + to_string(format));
  }
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

template <class Dump>
void Calibrator::count_exponents(const Dump& dump, const Progress& progress) {
  CalibrationTable(layers_, kv_heads_, head_dim_, format_).check_matches(dump);
  validate_dump(dump);
  for (int l = 0; l < layers_; ++l) {
    for (const TensorKind kind : {TensorKind::key, TensorKind::value}) {
      const auto& t = dump.layers[static_cast<size_t>(l)].of(kind);
      // Histograms of one layer are contiguous: [head][channel][256], indexed by token-row position.
      uint32_t* counts = histogram(kind, l, 0, 0).data();
      const size_t row = view_of(t).token_stride;
      for (int token = 0; token < t.tokens; ++token) {
        const auto* x = t.data.data() + static_cast<size_t>(token) * row;
        for (size_t i = 0; i < row; ++i) ++counts[i * kExponents + exponent_of(x[i], format_)];
      }
    }
    tokens_seen_ += static_cast<uint64_t>(dump.layers[static_cast<size_t>(l)].k.tokens);
    if (progress) progress(static_cast<size_t>(l) + 1, static_cast<size_t>(layers_));
  }
}

void Calibrator::add_exponents(const KvDump& dump, const Progress& progress) {
  check_format(ElementFormat::bf16);
  count_exponents(dump, progress);
}

void Calibrator::add_exponents(const Fp8KvDump& dump, const Progress& progress) {
  check_format(dump.format);
  count_exponents(dump, progress);
}

CalibrationTable Calibrator::choose_windows() const {
  CalibrationTable table(layers_, kv_heads_, head_dim_, format_);
  for (const TensorKind kind : {TensorKind::key, TensorKind::value}) {
    const TileShape shape = tile_shape_for(kind, head_dim_);
    for (int l = 0; l < layers_; ++l) {
      for (int h = 0; h < kv_heads_; ++h) {
        auto narrow = table.narrow(kind, l, h);
        auto wide = table.wide(kind, l, h);
        // FP8 exponents stop at 2^X − 1: a window reaching past it covers no more than the one ending
        // there, whose base is lower, so the lowest best base keeps the window inside the format's range.
        for (int c = 0; c < head_dim_; ++c) {
          const auto counts = histogram(kind, l, h, c);
          narrow[static_cast<size_t>(c)] = best_exponent_window(counts, table.narrow_window());
          wide[static_cast<size_t>(c)] = best_exponent_window(counts, table.wide_window());
        }
      }
      table.set_escape_capacity(kind, l, is_fp8(format_) ? Fp8TileShape{format_, shape}.max_slot_capacity() : shape.max_slot_capacity());
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

/// Pass 2's loop for either element format: each complete tile encoded by `measuring` (codecs of the
/// largest capacity, so every escape size is exact), its escape bytes counted per (kind, layer).
template <class Dump, class Codecs>
void Calibrator::measure_escape_sizes(const Dump& dump, const Codecs& measuring, const Progress& progress) {
  for (int l = 0; l < layers_; ++l) {
    for (const TensorKind kind : {TensorKind::key, TensorKind::value}) {
      auto counts = escape_histogram(kind, l);
      encode_each_tile(view_of(dump.layers[static_cast<size_t>(l)].of(kind)), measuring.tensor_codecs(kind, l),
                       [&](size_t, TilePosition, const TileEncoding& enc, auto) { ++counts[enc.escape_bytes]; });
    }
    if (progress) progress(static_cast<size_t>(l) + 1, static_cast<size_t>(layers_));
  }
}

void Calibrator::add_escape_sizes(const KvDump& dump, const CalibrationTable& table, const Progress& progress) {
  check_format(ElementFormat::bf16);
  table.check_matches(dump);
  validate_dump(dump);
  // The largest capacity makes every tile's escape size exact.
  const CalibratedCodecs measuring(table, tile_shape_for(TensorKind::key, head_dim_).max_slot_capacity());
  measure_escape_sizes(dump, measuring, progress);
}

void Calibrator::add_escape_sizes(const Fp8KvDump& dump, const CalibrationTable& table, const Progress& progress) {
  check_format(dump.format);
  table.check_matches(dump);
  validate_dump(dump);
  const Fp8CalibratedCodecs measuring(table, Fp8TileShape{format_, tile_shape_for(TensorKind::key, head_dim_)}.max_slot_capacity());
  measure_escape_sizes(dump, measuring, progress);
}

void Calibrator::choose_capacities(CalibrationTable& table) const {
  size_t largest = 0;
  for (const TensorKind kind : {TensorKind::key, TensorKind::value}) {
    const TileShape shape = tile_shape_for(kind, head_dim_);
    for (int l = 0; l < layers_; ++l) {
      const auto counts = escape_histogram(kind, l);
      table.set_escape_capacity(kind, l, is_fp8(format_) ? best_escape_capacity(Fp8TileShape{format_, shape}, counts)
                                                         : best_escape_capacity(shape, counts));
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

namespace {

/// Expected resident bytes (times the tile count) for capacity c: tiles needing ≤ c escape bytes take a
/// slot, the others a raw tile. Scans c upward keeping the running count of fitting tiles.
template <class Shape>
size_t cheapest_capacity(const Shape& shape, std::span<const uint64_t> counts) {
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

/// Both passes over dumps of one kind (KvDump or Fp8KvDump).
template <class Dump>
CalibrationTable calibrate_dumps(std::span<const Dump* const> dumps, ElementFormat format, const Progress& progress) {
  if (dumps.empty()) throw Error("calibration needs at least one KV dump");
  const Dump& first = *dumps.front();
  if (first.layers.empty()) throw Error("calibration needs a KV dump with at least one layer");
  Calibrator calibrator(static_cast<int>(first.layers.size()), first.kv_heads(), first.head_dim(), format);
  const size_t steps = 2 * dumps.size() * first.layers.size();
  size_t done = 0;
  auto step = [&](size_t, size_t) {
    if (progress) progress(++done, steps);
  };
  for (const Dump* d : dumps) calibrator.add_exponents(*d, step);
  CalibrationTable table = calibrator.choose_windows();
  for (const Dump* d : dumps) calibrator.add_escape_sizes(*d, table, step);
  calibrator.choose_capacities(table);
  return table;
}

}  // namespace

size_t best_escape_capacity(TileShape shape, std::span<const uint64_t> counts) { return cheapest_capacity(shape, counts); }

size_t best_escape_capacity(Fp8TileShape shape, std::span<const uint64_t> counts) { return cheapest_capacity(shape, counts); }

CalibrationTable calibrate(std::span<const KvDump* const> dumps, const Progress& progress) {
  return calibrate_dumps(dumps, ElementFormat::bf16, progress);
}

CalibrationTable calibrate(std::span<const Fp8KvDump* const> dumps, const Progress& progress) {
  if (dumps.empty()) throw Error("calibration needs at least one KV dump");
  return calibrate_dumps(dumps, dumps.front()->format, progress);
}

}  // namespace gaac
