#include "gaac/stats.hpp"

#include <cmath>

#include "gaac/tile_codec.hpp"

namespace gaac {
namespace {

double safe_div(double a, double b) { return b == 0 ? 0.0 : a / b; }

/// `measuring`: codecs with the largest capacity, so every escape size is exact; the fit is then
/// judged against the table's capacity.
TensorStats measure_tensor(const KvTensor& t, TensorKind kind, int layer, const CalibrationTable& table,
                           const CalibratedCodecs& measuring) {
  TensorStats s;
  const TileShape shape = tile_shape_for(kind, t.head_dim);
  const size_t capacity = table.escape_capacity(kind, layer);
  s.elements = t.elements();
  for (const uint16_t x : t.data) ++s.exponents[bf16_exponent(x)];
  const KvView view = view_of(t);
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
  s.codec_bytes += 2 * s.tail_elements;
  s.resident_bytes += 2 * s.tail_elements;
  return s;
}

}  // namespace

double TensorStats::ratio() const { return safe_div(static_cast<double>(bf16_bytes()), static_cast<double>(codec_bytes)); }

double TensorStats::resident_ratio() const {
  return safe_div(static_cast<double>(bf16_bytes()), static_cast<double>(resident_bytes));
}

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
  DumpStats stats;
  const CalibratedCodecs measuring(table, tile_shape_for(TensorKind::key, table.head_dim()).max_slot_capacity());
  for (size_t l = 0; l < dump.layers.size(); ++l) {
    LayerStats ls;
    ls.k = measure_tensor(dump.layers[l].k, TensorKind::key, static_cast<int>(l), table, measuring);
    ls.v = measure_tensor(dump.layers[l].v, TensorKind::value, static_cast<int>(l), table, measuring);
    stats.k_total.add(ls.k);
    stats.v_total.add(ls.v);
    stats.layers.push_back(ls);
    if (progress) progress(l + 1, dump.layers.size());
  }
  stats.total.add(stats.k_total);
  stats.total.add(stats.v_total);
  stats.total.resident_bytes += table.bases_bytes();
  return stats;
}

}  // namespace gaac
