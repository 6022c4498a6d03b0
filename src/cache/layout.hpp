// How a cache's budget splits into units and block rows, for one geometry and format: shared by
// the cache, the budget bound and the capacity estimate.
#pragma once

#include <algorithm>
#include <cstdint>

#include "gaac/kv_cache.hpp"
#include "gaac/paged_layout.hpp"

namespace gaac::cache {

/// The numbers of a cache layout that follow from geometry and format alone.
struct Layout {
  ElementFormat element = ElementFormat::bf16;  ///< of every tile
  uint32_t unit_bytes = 0;
  uint32_t raw_units = 1;         ///< units per raw tile
  size_t escape_capacity = 0;     ///< of every slot (0 for bf16 and fp8)
  uint64_t row_entries = 0;       ///< entries of a block row
  uint64_t resident_entries = 1;  ///< entries a block row keeps for good (layers without a window)

  /// Rows for `units` units: enough that the table never runs out before the pool does (every kept
  /// tile takes at least one unit; rows of sliding layers give their tiles back).
  uint64_t rows_for(uint64_t units) const { return units / resident_entries + 1; }
  /// Bytes of `units` units and the rows that go with them (gaac::Error when that passes 2^64).
  uint64_t bytes_for(uint64_t units) const;
  /// The smallest budget whose carving has at least `units` units, `rows` block rows and one block of
  /// every layer: exact, since carving takes the most units a budget affords.
  uint64_t least_budget(uint64_t units, uint64_t rows) const;
  /// The most units a budget affords (at most kMaxUnits).
  uint64_t units_for(uint64_t budget) const;
  /// The units a cache of `format` carves from `budget`; throws gaac::Error, saying how many bytes one
  /// block of every layer needs, when that is fewer than one block's.
  uint64_t cache_units(uint64_t budget, CacheFormat format) const;
};

/// The calibrated bases of `table` (narrow and wide windows, BF16 or FP8) in the layout kernels read
/// (PagedGeometry::bases_index), into `out` (geo.bases_bytes() bytes).
void fill_bases(const CalibrationTable& table, const PagedGeometry& geo, uint8_t* out);

/// Throws gaac::Error unless a cache can be made for the geometry.
void check_geometry(const CacheGeometry& g);
/// The layout of a cache of `format` (throws for a missing or mismatched calibration). A plain fp8
/// cache's layout is the same for E4M3 and E5M2; `element` says which it holds (ignored for the other
/// formats: BF16, or the calibration's).
Layout layout_for(const CacheGeometry& g, CacheFormat format, const CalibrationTable* calibration,
                  ElementFormat element = ElementFormat::e4m3);
/// Throws gaac::Error unless `config` is a complete FP8 config for `layers` layers (an FP8 element
/// format, one finite positive K and V scale per layer); nothing is checked for a BF16 format.
void check_fp8_config(const CacheConfig& config);

}  // namespace gaac::cache
