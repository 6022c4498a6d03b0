#include "gaac/stats.hpp"

#include <cmath>

#include "gaac/fp8_codec.hpp"
#include "gaac/tile_codec.hpp"

namespace gaac {
namespace {

double safe_div(double a, double b) { return b == 0 ? 0.0 : a / b; }

/// The exponent of an element, BF16 or FP8.
uint8_t exponent_of(uint16_t x, ElementFormat) { return bf16_exponent(x); }
uint8_t exponent_of(uint8_t x, ElementFormat format) { return fp8_exponent(x, format); }

/// `measuring`: codecs with the largest capacity, so every escape size is exact; the fit is then
/// judged against the table's capacity. `shape` is a TileShape or an Fp8TileShape.
template <class T, class Shape, class Codecs>
TensorStats measure_tensor(const BasicKvTensor<T>& t, TensorKind kind, int layer, Shape shape, const CalibrationTable& table,
                           const Codecs& measuring) {
  TensorStats s;
  s.format = table.element_format();
  const size_t capacity = table.escape_capacity(kind, layer);
  s.elements = t.elements();
  for (const T x : t.data) ++s.exponents[exponent_of(x, s.format)];
  const auto view = view_of(t);
  s.tiles = tile_count(view);
  s.tail_elements = s.elements - s.tiles * static_cast<uint64_t>(shape.elements());
  encode_each_tile(view, measuring.tensor_codecs(kind, layer), [&](size_t, TilePosition, const TileEncoding& enc, auto) {
    for (size_t m = 0; m < 3; ++m) s.groups[m] += enc.groups_by_mode[m];
    s.escape_bytes += enc.escape_bytes;
    s.codec_bytes += shape.fixed_bytes() + enc.escape_bytes;
    const bool fits = enc.escape_bytes <= capacity;
    if (!fits) ++s.fallback_tiles;
    s.resident_bytes += (fits ? shape.slot_bytes(capacity) : shape.raw_bytes()) + kBlockTableEntryBytes;
  });
  s.codec_bytes += sizeof(T) * s.tail_elements;
  s.resident_bytes += sizeof(T) * s.tail_elements;
  return s;
}

/// Statistics of every layer and the totals; `measure_layer(l)` gives a layer's K and V.
template <class MeasureLayer>
DumpStats measure_layers(size_t layers, const CalibrationTable& table, const Progress& progress, MeasureLayer&& measure_layer) {
  DumpStats stats;
  for (TensorStats* total : {&stats.k_total, &stats.v_total, &stats.total}) total->format = table.element_format();
  for (size_t l = 0; l < layers; ++l) {
    const LayerStats ls = measure_layer(l);
    stats.k_total.add(ls.k);
    stats.v_total.add(ls.v);
    stats.layers.push_back(ls);
    if (progress) progress(l + 1, layers);
  }
  stats.total.add(stats.k_total);
  stats.total.add(stats.v_total);
  stats.total.resident_bytes += table.bases_bytes();
  return stats;
}

}  // namespace

double TensorStats::ratio() const { return safe_div(static_cast<double>(source_bytes()), static_cast<double>(codec_bytes)); }

double TensorStats::resident_ratio() const {
  return safe_div(static_cast<double>(source_bytes()), static_cast<double>(resident_bytes));
}

double TensorStats::ratio_vs_bf16() const { return safe_div(static_cast<double>(bf16_bytes()), static_cast<double>(codec_bytes)); }

double TensorStats::bits_per_element() const {
  return safe_div(8.0 * static_cast<double>(codec_bytes), static_cast<double>(elements));
}

double TensorStats::exponent_entropy_bits() const {
  double total = 0;
  for (const uint64_t c : exponents) total += static_cast<double>(c);
  double h = 0;
  for (const uint64_t c : exponents) {
    if (c == 0) continue;
    const double p = static_cast<double>(c) / total;
    h -= p * std::log2(p);
  }
  return h;
}

double TensorStats::mode_fraction(GroupMode mode) const {
  const double all = static_cast<double>(groups[0] + groups[1] + groups[2]);
  return safe_div(static_cast<double>(groups[static_cast<size_t>(mode)]), all);
}

double TensorStats::fallback_fraction() const { return safe_div(static_cast<double>(fallback_tiles), static_cast<double>(tiles)); }

void TensorStats::add(const TensorStats& o) {
  elements += o.elements;
  tiles += o.tiles;
  fallback_tiles += o.fallback_tiles;
  tail_elements += o.tail_elements;
  for (size_t m = 0; m < 3; ++m) groups[m] += o.groups[m];
  for (size_t e = 0; e < exponents.size(); ++e) exponents[e] += o.exponents[e];
  escape_bytes += o.escape_bytes;
  codec_bytes += o.codec_bytes;
  resident_bytes += o.resident_bytes;
}

DumpStats measure(const KvDump& dump, const CalibrationTable& table, const Progress& progress) {
  table.check_matches(dump);
  validate_dump(dump);
  const CalibratedCodecs measuring(table, tile_shape_for(TensorKind::key, table.head_dim()).max_slot_capacity());
  return measure_layers(dump.layers.size(), table, progress, [&](size_t l) {
    LayerStats ls;
    for (const TensorKind kind : {TensorKind::key, TensorKind::value}) {
      const KvTensor& t = dump.layers[l].of(kind);
      (kind == TensorKind::key ? ls.k : ls.v) = measure_tensor(t, kind, static_cast<int>(l), tile_shape_for(kind, t.head_dim), table, measuring);
    }
    return ls;
  });
}

DumpStats measure(const Fp8KvDump& dump, const CalibrationTable& table, const Progress& progress) {
  table.check_matches(dump);
  validate_dump(dump);
  const Fp8TileShape widest{dump.format, tile_shape_for(TensorKind::key, table.head_dim())};
  const Fp8CalibratedCodecs measuring(table, widest.max_slot_capacity());
  return measure_layers(dump.layers.size(), table, progress, [&](size_t l) {
    LayerStats ls;
    for (const TensorKind kind : {TensorKind::key, TensorKind::value}) {
      const Fp8KvTensor& t = dump.layers[l].of(kind);
      const Fp8TileShape shape{dump.format, tile_shape_for(kind, t.head_dim)};
      (kind == TensorKind::key ? ls.k : ls.v) = measure_tensor(t, kind, static_cast<int>(l), shape, table, measuring);
    }
    return ls;
  });
}

}  // namespace gaac
