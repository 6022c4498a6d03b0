// A host-memory paged cache built directly from KV dumps, laid out exactly as docs/format.md section 13
// says: the stand-in that fills the CUDA kernels' inputs until gaac::KvCache provides the same
// PagedCacheView and SequenceTableView. Only this file knows how the cache is filled; the kernels
// see nothing but the views.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "gaac/calibration.hpp"
#include "gaac/kv_dump.hpp"
#include "gaac/paged_layout.hpp"

namespace gaac::cuda {

/// How a cache stores its complete blocks.
enum class FillFormat : uint8_t {
  gaac,  ///< compressed slots; raw BF16 tiles (two units) where the escapes do not fit
  bf16,  ///< raw BF16 tiles, one unit each: the baseline of the same structure
};

/// What to build.
struct FillOptions {
  FillFormat format = FillFormat::gaac;
  /// Bases and capacities (required for FillFormat::gaac): every slot gets the table's largest
  /// capacity, so one unit size serves every layer and K/V.
  const CalibrationTable* calibration = nullptr;
  /// Escape capacity in bytes of every slot; 0 takes the calibration's largest. (Tests use it to make
  /// slots that are exactly full, or too small for every tile.)
  size_t escape_capacity = 0;
  bool escape_capacity_set = false;  ///< true: use escape_capacity even when it is 0
  /// Sliding window per layer in tokens (empty or 0: full attention). Blocks wholly before the window
  /// of a sequence's newest token are not held (absent entries), as the cache releases them.
  std::vector<int> windows;
  /// Nonzero: units are placed in a random order drawn from this seed (tests that kernels follow
  /// the indices, as in a fragmented pool); zero: in the order tiles are stored.
  uint64_t shuffle_seed = 0;
};

/// Counts of what a fill stored.
struct FillCounts {
  uint64_t compressed_tiles = 0;  ///< slots
  uint64_t exactly_full_slots = 0;  ///< slots whose escapes fill the capacity to the last byte
  uint64_t raw_tiles = 0;         ///< complete blocks' tiles held raw (all of them in a BF16 cache)
  uint64_t tail_tiles = 0;        ///< tiles of incomplete last blocks (raw BF16)
  uint64_t absent_tiles = 0;      ///< tiles released by a sliding window
};

/// A paged cache in host memory: the pool, the block table, the bases and the windows.
struct HostPagedCache {
  PagedGeometry geometry;
  std::vector<uint8_t> units;      ///< unit_count × unit_bytes
  uint32_t unit_count = 0;
  std::vector<uint32_t> entries;   ///< geometry.table_entries()
  std::vector<uint8_t> bases;      ///< geometry.bases_bytes(), empty for a BF16 cache
  std::vector<int32_t> windows;    ///< per layer
  FillCounts counts;

  /// Host pointers to all of it.
  PagedCacheView view() const;
};

/// The CSR sequence table of a batch, owned.
struct HostSequenceTable {
  std::vector<int32_t> indptr;
  std::vector<uint32_t> rows;
  std::vector<int32_t> lengths;

  /// Host pointers to all of it.
  SequenceTableView view() const;
};

/// Builds a cache holding each dump as one sequence (same layers, KV heads and head width in all),
/// and the table listing them in order. Block rows are numbered from 0 in sequence order. Throws
/// gaac::Error for mismatched dumps or options.
HostPagedCache fill_paged_cache(std::span<const KvDump* const> sequences, const FillOptions& options,
                                HostSequenceTable& table);

/// The calibration of one layer of `table`, as a one-layer table (for caches built from one layer).
CalibrationTable calibration_of_layer(const CalibrationTable& table, int layer);

}  // namespace gaac::cuda
