// How much a memory budget holds: sequences of a given length, or the longest sequence, for a GAAC
// cache and for a BF16 cache of the same block size (the paper's equal-memory comparison). Estimated
// from calibration statistics, and measured by filling a real cache.
#pragma once

#include <cstdint>

#include "gaac/export.h"
#include "gaac/kv_cache.hpp"

namespace gaac {

/// What a budget is expected to hold.
struct CapacityEstimate {
  CacheFormat format = CacheFormat::gaac;
  uint64_t budget_bytes = 0;
  uint64_t units = 0;             ///< units the budget is carved into
  uint64_t unit_bytes = 0;
  double raw_fraction = 0;        ///< expected share of finalized tiles kept raw (mean over layers)
  double bytes_per_token = 0;     ///< resident bytes a token of a long sequence adds (units and entries)
  int64_t max_tokens = 0;         ///< the longest single sequence expected to fit
  int64_t sequence_tokens = 0;    ///< the length asked about
  int64_t max_sequences = 0;      ///< sequences of sequence_tokens tokens expected to fit together
};

/// Expected capacity of a cache of `format` with `budget` bytes. For a gaac or gaac_fp8 cache the share
/// of tiles kept raw comes from the calibration's metadata (`k.cache_fallback_fraction` and
/// `v.cache_fallback_fraction`, written by gaac calibrate; 0 when absent); a bf16 or fp8 cache is exact.
/// Open blocks count raw; sliding layers hold only their window.
GAAC_API CapacityEstimate estimate_capacity(const CacheGeometry& geometry, CacheFormat format,
                                            const CalibrationTable* calibration, uint64_t budget, int sequence_tokens);

/// What a real fill held.
struct CapacityMeasurement {
  int64_t sequences = 0;  ///< sequences of the asked length stored completely
  CacheUsage usage;       ///< the cache when the next one no longer fitted
};

/// Fills a cache of `budget` bytes with sequences of `sequence_tokens` tokens, their rows taken in turn
/// from `sample` (a KV dump of the geometry, repeated as needed) and appended 64 tokens at a time, until
/// one no longer fits. Throws gaac::Error for an FP8 format (whose caches take FP8 codes, not BF16 rows).
GAAC_API CapacityMeasurement measure_capacity(const CacheGeometry& geometry, CacheFormat format,
                                              const CalibrationTable* calibration, uint64_t budget, int sequence_tokens,
                                              const KvDump& sample);

}  // namespace gaac
