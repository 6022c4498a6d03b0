// Compression statistics of a KV dump under a calibration: what `gaac stats` reports.
#pragma once

#include "gaac/export.h"

#include <array>
#include <cstdint>
#include <vector>

#include "gaac/calibration.hpp"
#include "gaac/kv_dump.hpp"

namespace gaac {

/// Bytes of one block-table entry (storage mode + physical index) per tile in a resident cache.
inline constexpr uint64_t kBlockTableEntryBytes = 4;

/// Counts for one tensor (or a sum of tensors).
struct GAAC_API TensorStats {
  uint64_t elements = 0;        ///< BF16 elements
  uint64_t tiles = 0;           ///< complete tiles
  uint64_t fallback_tiles = 0;  ///< tiles whose escapes overflow the slot (stored raw)
  uint64_t tail_elements = 0;   ///< elements of incomplete final blocks (stored raw)
  std::array<uint64_t, 3> groups{};             ///< groups per GroupMode, complete tiles only
  std::array<uint64_t, 256> exponents{};        ///< histogram of exponents, every element
  uint64_t escape_bytes = 0;    ///< escape bytes of all complete tiles
  uint64_t codec_bytes = 0;     ///< compressed size with slots packed exactly, tail raw
  uint64_t resident_bytes = 0;  ///< size in a cache: fixed slots, raw fallbacks, block-table entries, tail

  /// BF16 bytes of the elements.
  uint64_t bf16_bytes() const { return 2 * elements; }
  /// bf16_bytes / codec_bytes.
  double ratio() const;
  /// bf16_bytes / resident_bytes.
  double resident_ratio() const;
  /// Codec bits per element.
  double bits_per_element() const;
  /// Empirical (Shannon) entropy of the exponents in bits.
  double exponent_entropy_bits() const;
  /// Fraction of groups in `mode`.
  double mode_fraction(GroupMode mode) const;
  /// Fraction of complete tiles that fall back to raw (0 without tiles).
  double fallback_fraction() const;
  /// Adds another tensor's counts.
  void add(const TensorStats& other);
};

/// K and V of one layer.
struct GAAC_API LayerStats {
  TensorStats k;
  TensorStats v;
};

/// Statistics of a whole dump.
struct GAAC_API DumpStats {
  std::vector<LayerStats> layers;
  TensorStats k_total;  ///< all layers' K
  TensorStats v_total;  ///< all layers' V
  TensorStats total;    ///< K and V, plus the calibration bases in resident_bytes
};

/// Encodes every complete tile of `dump` with `table` and gathers the statistics.
GAAC_API DumpStats measure(const KvDump& dump, const CalibrationTable& table, const Progress& progress = {});

}  // namespace gaac
