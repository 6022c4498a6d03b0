// What budget a cache needs: the worst case (every block raw) and the least (every block it completes
// compressed), both carved exactly as KvCache's constructor carves.
#include <string>

#include "cache/layout.hpp"
#include "common/checked.hpp"
#include "gaac/error.hpp"
#include "gaac/kv_cache.hpp"

namespace gaac {

uint64_t worst_case_budget(const CacheGeometry& geometry, CacheFormat format, const CalibrationTable* calibration, int tokens,
                           int sequences) {
  cache::check_geometry(geometry);
  if (tokens < 0 || sequences < 0) throw Error("worst_case_budget: negative tokens or sequences");
  const cache::Layout layout = cache::layout_for(geometry, format, calibration);
  const uint64_t blocks = (static_cast<uint64_t>(tokens) + kTileTokens - 1) / kTileTokens;
  const uint64_t rows = checked_mul(static_cast<uint64_t>(sequences), blocks, "worst_case_budget: the block rows");
  const uint64_t units = checked_mul(checked_mul(std::max<uint64_t>(rows, 1), layout.row_entries, "worst_case_budget: the tiles"),
                                     layout.raw_units, "worst_case_budget: the units");
  return layout.bytes_for(units);
}

uint64_t least_budget(const CacheGeometry& geometry, CacheFormat format, const CalibrationTable* calibration,
                      std::span<const int> tokens) {
  cache::check_geometry(geometry);
  const cache::Layout layout = cache::layout_for(geometry, format, calibration);
  const uint64_t layer_entries = layout.row_entries / static_cast<uint64_t>(geometry.layers);
  uint64_t units = 0, rows = 0;
  for (const int n : tokens) {
    if (n < 0) throw Error("least_budget: a negative number of tokens (" + std::to_string(n) + ")");
    const uint64_t complete = static_cast<uint64_t>(n) / kTileTokens;
    const bool open = n % kTileTokens != 0;
    rows += complete + (open ? 1 : 0);
    for (int l = 0; l < geometry.layers; ++l) {
      const int w = geometry.sliding_window.empty() ? 0 : geometry.sliding_window[static_cast<size_t>(l)];
      const uint64_t released = w > 0 && n > w ? static_cast<uint64_t>(n - w) / kTileTokens : 0;
      // A finalized tile takes one unit at best (a raw one in a bf16 or fp8 cache, whose raw tiles are one unit).
      units = checked_add(units, checked_mul(complete - released, layer_entries, "least_budget: the tiles"), "least_budget: the units");
    }
    if (open) units = checked_add(units, checked_mul(layout.row_entries, layout.raw_units, "least_budget: the tiles"), "least_budget: the units");
  }
  return layout.least_budget(units, rows);
}

}  // namespace gaac
