#include "cache/layout.hpp"

#include <cmath>
#include <string>

#include "common/checked.hpp"
#include "gaac/error.hpp"

namespace gaac::cache {
namespace {

/// The largest escape capacity of a calibration table, over K/V and layers.
size_t largest_capacity(const CalibrationTable& table) {
  size_t capacity = 0;
  for (const TensorKind kind : {TensorKind::key, TensorKind::value}) {
    for (int l = 0; l < table.layers(); ++l) capacity = std::max(capacity, table.escape_capacity(kind, l));
  }
  return capacity;
}

}  // namespace

uint64_t Layout::bytes_for(uint64_t units) const {
  const uint64_t entries = checked_mul(rows_for(units), row_entries, "the KV cache's block table");
  return checked_add(checked_mul(units, unit_bytes, "the KV cache's units"), checked_mul(entries, 4, "the KV cache's block table"),
                     "the KV cache's budget");
}

uint64_t Layout::least_budget(uint64_t units, uint64_t rows) const {
  // rows_for(u) = u / resident_entries + 1 reaches `rows` from u = (rows - 1) · resident_entries on.
  const uint64_t for_rows = rows > 0 ? checked_mul(rows - 1, resident_entries, "the KV cache's block rows") : 0;
  return bytes_for(std::max({units, for_rows, row_entries * raw_units}));
}

uint64_t Layout::units_for(uint64_t budget) const {
  const double per_unit = unit_bytes + 4.0 * static_cast<double>(row_entries) / static_cast<double>(resident_entries);
  uint64_t units = static_cast<uint64_t>(static_cast<double>(budget) / per_unit) + 1;
  while (units > 0 && bytes_for(units) > budget) --units;
  return std::min<uint64_t>(units, kMaxUnits);
}

uint64_t Layout::cache_units(uint64_t budget, CacheFormat format) const {
  const uint64_t units = units_for(budget);
  const uint64_t block_units = row_entries * raw_units;
  if (units < block_units) {
    throw Error("a KV cache budget of " + std::to_string(budget) + " bytes holds less than one block of every layer (" +
                std::to_string(bytes_for(block_units)) + " bytes for a " + to_string(format) + " cache of this model)");
  }
  return units;
}

Layout layout_for(const CacheGeometry& g, CacheFormat format, const CalibrationTable* calibration, ElementFormat element) {
  const int channels = g.head_dim < kMaxTileChannels ? g.head_dim : kMaxTileChannels;
  Layout layout;
  layout.element = format == CacheFormat::fp8 ? element : ElementFormat::bf16;
  if (is_compressed(format)) {
    if (calibration == nullptr) throw Error(std::string("a ") + to_string(format) + " KV cache needs a calibration table");
    const CalibrationTable& table = *calibration;
    if (is_fp8(format) != is_fp8(table.element_format())) {
      throw Error(std::string("a ") + to_string(format) + " KV cache needs " + (is_fp8(format) ? "an FP8" : "a BF16") +
                  " calibration table, this one is for " + to_string(table.element_format()));
    }
    layout.element = table.element_format();
    if (table.layers() != g.layers || table.kv_heads() != g.kv_heads || table.head_dim() != g.head_dim) {
      throw Error("the calibration table is for " + std::to_string(table.layers()) + " layers × " +
                  std::to_string(table.kv_heads()) + " KV heads × head_dim " + std::to_string(table.head_dim()) +
                  ", the cache for " + std::to_string(g.layers) + " × " + std::to_string(g.kv_heads) + " × " +
                  std::to_string(g.head_dim));
    }
    layout.escape_capacity = largest_capacity(table);
    layout.raw_units = 2;
  }
  // Units of one raw tile, or of a slot of the layout's capacity (fixed bytes of the element's tile).
  PagedGeometry geo{g.layers, g.kv_heads, g.head_dim, 0, 0, layout.element};
  geo.unit_bytes = static_cast<uint32_t>(is_compressed(format) ? geo.slot_fixed_bytes() + layout.escape_capacity : geo.raw_tile_bytes());
  layout.unit_bytes = geo.unit_bytes;
  const uint64_t per_layer = static_cast<uint64_t>(g.kv_heads) * 2 * (g.head_dim / channels);
  layout.row_entries = per_layer * static_cast<uint64_t>(g.layers);
  int resident_layers = 0;
  for (int l = 0; l < g.layers; ++l) {
    resident_layers += g.sliding_window.empty() || g.sliding_window[static_cast<size_t>(l)] == 0 ? 1 : 0;
  }
  layout.resident_entries = per_layer * static_cast<uint64_t>(std::max(resident_layers, 1));
  return layout;
}

void fill_bases(const CalibrationTable& table, const PagedGeometry& geo, uint8_t* out) {
  for (int l = 0; l < geo.layers; ++l) {
    for (const TensorKind kind : {TensorKind::key, TensorKind::value}) {
      for (int which = 0; which < 2; ++which) {
        for (int h = 0; h < geo.kv_heads; ++h) {
          const auto src = which == 0 ? table.narrow(kind, l, h) : table.wide(kind, l, h);
          std::copy(src.begin(), src.end(), out + geo.bases_index(l, kind, which, h));
        }
      }
    }
  }
}

/// Throws unless the geometry is one a cache can be made for.
void check_geometry(const CacheGeometry& g) {
  if (g.layers <= 0 || g.kv_heads <= 0) {
    throw Error("KV cache geometry needs layers > 0 and kv_heads > 0, got " + std::to_string(g.layers) + " and " +
                std::to_string(g.kv_heads));
  }
  if (g.head_dim != 64 && g.head_dim != 128 && g.head_dim != 256) {
    throw Error("KV cache head_dim is " + std::to_string(g.head_dim) + "; gaac supports 64, 128 or 256");
  }
  if (!g.sliding_window.empty() && g.sliding_window.size() != static_cast<size_t>(g.layers)) {
    throw Error("sliding_window has " + std::to_string(g.sliding_window.size()) + " entries for " +
                std::to_string(g.layers) + " layers");
  }
  for (size_t l = 0; l < g.sliding_window.size(); ++l) {
    if (g.sliding_window[l] < 0) {
      throw Error("layer " + std::to_string(l) + " has a negative sliding window (" + std::to_string(g.sliding_window[l]) + ")");
    }
  }
}

void check_fp8_config(const CacheConfig& config) {
  if (!is_fp8(config.format)) return;
  const Fp8CacheConfig& f = config.fp8;
  if (!is_fp8(f.element)) throw Error(std::string("a ") + to_string(config.format) + " KV cache needs an FP8 element format (e4m3 or e5m2), got " + to_string(f.element));
  if (config.format == CacheFormat::gaac_fp8 && config.calibration != nullptr && config.calibration->element_format() != f.element) {
    throw Error(std::string("the KV cache holds ") + to_string(f.element) + " but its calibration table is for " +
                to_string(config.calibration->element_format()));
  }
  const auto layers = static_cast<size_t>(config.geometry.layers);
  for (const auto* scales : {&f.k_scales, &f.v_scales}) {
    const char* which = scales == &f.k_scales ? "K" : "V";
    if (scales->size() != layers) {
      throw Error(std::string("an FP8 KV cache needs one ") + which + " scale per layer (" + std::to_string(layers) + "), got " +
                  std::to_string(scales->size()));
    }
    for (size_t l = 0; l < layers; ++l) {
      const float x = (*scales)[l];
      if (!(std::isfinite(x) && x > 0.0f)) {
        throw Error(std::string("layer ") + std::to_string(l) + "'s " + which + " scale is " + std::to_string(x) +
                    "; an FP8 KV cache's scales must be finite and positive");
      }
    }
  }
}

}  // namespace gaac::cache

namespace gaac {

CacheCarving carve_cache(const CacheConfig& config) {
  const CacheGeometry& g = config.geometry;
  cache::check_geometry(g);
  const cache::Layout layout = cache::layout_for(g, config.format, config.calibration, config.fp8.element);
  cache::check_fp8_config(config);
  CacheCarving carving;
  carving.units = layout.cache_units(config.budget_bytes, config.format);
  carving.geometry = PagedGeometry{g.layers, g.kv_heads, g.head_dim, layout.unit_bytes,
                                   static_cast<uint32_t>(layout.rows_for(carving.units)), layout.element};
  carving.windows.assign(static_cast<size_t>(g.layers), 0);
  for (size_t l = 0; l < g.sliding_window.size(); ++l) carving.windows[l] = g.sliding_window[l];
  if (is_compressed(config.format)) {
    carving.bases.resize(carving.geometry.bases_bytes());
    cache::fill_bases(*config.calibration, carving.geometry, carving.bases.data());
  }
  return carving;
}

}  // namespace gaac
