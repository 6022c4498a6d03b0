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
  /// The element format of the tensors counted: BF16, or an FP8 one (then `groups` are indexed by
  /// Fp8GroupMode: 2-bit, 3-bit, raw; and the exponents are FP8 exponents).
  ElementFormat format = ElementFormat::bf16;
  uint64_t elements = 0;        ///< elements
  uint64_t tiles = 0;           ///< complete tiles
  uint64_t fallback_tiles = 0;  ///< tiles whose escapes overflow the slot (stored raw)
  uint64_t tail_elements = 0;   ///< elements of incomplete final blocks (stored raw)
  std::array<uint64_t, 3> groups{};             ///< groups per GroupMode, complete tiles only
  std::array<uint64_t, 256> exponents{};        ///< histogram of exponents, every element
  uint64_t escape_bytes = 0;    ///< escape bytes of all complete tiles
  uint64_t codec_bytes = 0;     ///< compressed size with slots packed exactly, tail raw
  uint64_t resident_bytes = 0;  ///< size in a cache: fixed slots, raw fallbacks, block-table entries, tail

  /// Bytes of the elements as BF16.
  uint64_t bf16_bytes() const { return 2 * elements; }
  /// Bytes of the elements in their own format (BF16: 2 each, FP8: 1 each).
  uint64_t source_bytes() const { return static_cast<uint64_t>(element_bytes(format)) * elements; }
  /// source_bytes / codec_bytes: what the codec saves over the format it codes.
  double ratio() const;
  /// source_bytes / resident_bytes.
  double resident_ratio() const;
  /// bf16_bytes / codec_bytes (for FP8: the FP8 conversion and the codec together, the paper's Table 7).
  double ratio_vs_bf16() const;
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
/// The same for an FP8 dump and an FP8 table of its format.
GAAC_API DumpStats measure(const Fp8KvDump& dump, const CalibrationTable& table, const Progress& progress = {});

}  // namespace gaac
