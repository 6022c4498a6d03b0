// Measurements behind the paper's design arguments, on any KV dump: how much each choice of coding
// modes would store (Table 4) and how escape bytes evolve with token position (Table 8).
#pragma once

#include "gaac/export.h"

#include <array>
#include <span>
#include <string>
#include <vector>

#include "gaac/calibration.hpp"
#include "gaac/kv_dump.hpp"

namespace gaac {

/// One mode scheme: offsets of the given widths (bits, ascending) from calibrated per-channel bases,
/// and raw exponents (8 bits for BF16, X for FP8) for groups no window holds.
struct GAAC_API ModeScheme {
  std::string name;
  std::vector<int> widths;
};

/// The paper's three schemes: 2+3+4+raw, 3+4+raw (GAAC's), 4+raw.
GAAC_API std::vector<ModeScheme> paper_mode_schemes();
/// The schemes docs/format.md (section 14.3) compares for an FP8 format: GAAC-FP8's 2+3+raw among them.
GAAC_API std::vector<ModeScheme> fp8_mode_schemes(ElementFormat format);

/// What a scheme stores for the complete tiles of a dump.
struct GAAC_API ModeSchemeResult {
  ModeScheme scheme;
  std::vector<double> fractions;  ///< groups per width of `scheme.widths`, then raw
  double bits_per_element = 0;    ///< M + 1 (sign, mantissa) + 2/8 (tag) + the group's exponent width
  double ratio = 0;               ///< element bits (16 or 8) / bits_per_element
};

/// Windows of every width the schemes use (2^w exponents for w bits), chosen per (K/V, layer, head,
/// channel) as the calibrator chooses GAAC's (the window covering the most exponents of the
/// calibration dumps), then every group of the complete tiles of `evaluated` coded with the narrowest
/// window of its scheme holding all eight exponents. Groups are the format's (docs/format.md), and the
/// sizes are exact bit counts of such a stream, without slots, block tables or bases. Throws
/// gaac::Error if the dumps' geometries differ or no calibration dump is given.
GAAC_API std::vector<ModeSchemeResult> compare_mode_schemes(std::span<const KvDump* const> calibration, const KvDump& evaluated,
                                                   std::span<const ModeScheme> schemes);
/// The same on FP8 dumps (all of one format): windows and groups the same, widths below the format's
/// exponent bits X, raw groups X bits.
GAAC_API std::vector<ModeSchemeResult> compare_mode_schemes(std::span<const Fp8KvDump* const> calibration, const Fp8KvDump& evaluated,
                                                   std::span<const ModeScheme> schemes);

/// Escape bytes of the tiles of one range of token positions.
struct GAAC_API SegmentEscapes {
  int first_token = 0;  ///< first position of the segment
  int end_token = 0;    ///< one past its last position
  /// Mean escape bytes per tile, by tensor kind (0 = K, 1 = V), indexed layer·kv_heads + head.
  std::array<std::vector<double>, 2> mean_escape_bytes;
};

/// Encodes every complete tile of `dump` with `table` and averages the escape bytes each tile needs
/// (whatever the slot capacity) over consecutive segments of `segment_tokens` positions (a multiple
/// of 16; the last segment may be shorter). Throws gaac::Error on a bad segment length or a table
/// that does not match the dump.
GAAC_API std::vector<SegmentEscapes> escape_bytes_by_segment(const KvDump& dump, const CalibrationTable& table, int segment_tokens);
/// The same for an FP8 dump and an FP8 table.
GAAC_API std::vector<SegmentEscapes> escape_bytes_by_segment(const Fp8KvDump& dump, const CalibrationTable& table, int segment_tokens);

}  // namespace gaac
