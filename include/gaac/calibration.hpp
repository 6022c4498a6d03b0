// Calibration: per-channel exponent windows (bases b3, b4 for BF16; b2, b3 for FP8) and per-layer
// escape-slot capacities, learnt from sample KV and stored as safetensors.
#pragma once

#include "gaac/export.h"

#include <array>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <span>
#include <string>
#include <vector>

#include "gaac/codec.hpp"
#include "gaac/fp8_dump.hpp"
#include "gaac/fp8_format.hpp"
#include "gaac/kv_dump.hpp"

namespace gaac {

/// Bases and slot capacities for every (layer, K/V, KV head, channel) of one model's cache, for BF16
/// elements or for one FP8 format. Every table has two windows per channel: the *narrow* one (BF16: 8
/// exponents, base b3; FP8: 4 exponents, base b2) and the *wide* one (BF16: 16, b4; FP8: 8, b3).
class GAAC_API CalibrationTable {
 public:
  CalibrationTable() = default;
  /// A table for the given geometry and element format with every base 0 and every capacity 0.
  CalibrationTable(int layers, int kv_heads, int head_dim, ElementFormat format = ElementFormat::bf16);

  int layers() const { return layers_; }
  int kv_heads() const { return kv_heads_; }
  int head_dim() const { return head_dim_; }
  /// The element format whose tiles the table codes.
  ElementFormat element_format() const { return format_; }

  /// The `head_dim` bases of one head's narrow window (BF16 b3, FP8 b2).
  std::span<uint8_t> narrow(TensorKind kind, int layer, int head);
  std::span<const uint8_t> narrow(TensorKind kind, int layer, int head) const;
  /// The `head_dim` bases of one head's wide window (BF16 b4, FP8 b3).
  std::span<uint8_t> wide(TensorKind kind, int layer, int head);
  std::span<const uint8_t> wide(TensorKind kind, int layer, int head) const;
  /// Exponents in the narrow and wide windows: 8 and 16 (BF16), 4 and 8 (FP8).
  int narrow_window() const { return is_fp8(format_) ? 4 : 8; }
  int wide_window() const { return is_fp8(format_) ? 8 : 16; }

  /// The BF16 names of the windows: the 3-bit-window bases (narrow) of one head. Throws gaac::Error
  /// for an FP8 table, whose b3 is its wide window.
  std::span<uint8_t> b3(TensorKind kind, int layer, int head);
  std::span<const uint8_t> b3(TensorKind kind, int layer, int head) const;
  /// The 4-bit-window bases (wide) of one head of a BF16 table; throws for an FP8 table.
  std::span<uint8_t> b4(TensorKind kind, int layer, int head);
  std::span<const uint8_t> b4(TensorKind kind, int layer, int head) const;
  /// Bases of the tile covering half `half` (0 unless head_dim is 256) of a head; throws for an FP8 table.
  TileBases tile_bases(TensorKind kind, int layer, int head, int half) const;
  /// The same for an FP8 table (b2 narrow, b3 wide); throws for a BF16 table.
  Fp8TileBases fp8_tile_bases(TensorKind kind, int layer, int head, int half) const;

  /// Escape-slot capacity in bytes of every tile of (kind, layer).
  size_t escape_capacity(TensorKind kind, int layer) const { return capacity_[index(kind)][static_cast<size_t>(layer)]; }
  /// Sets the capacity (a multiple of 16 no larger than the tile shape's maximum).
  void set_escape_capacity(TensorKind kind, int layer, size_t bytes);

  /// Free-form provenance (tokens seen, source files); saved as safetensors metadata.
  std::map<std::string, std::string>& metadata() { return metadata_; }
  const std::map<std::string, std::string>& metadata() const { return metadata_; }

  /// Throws gaac::Error unless geometry, bases and capacities are all valid.
  void validate() const;
  /// Throws gaac::Error unless the dump has this table's layer count, KV heads and head width, and the
  /// table is for BF16.
  void check_matches(const KvDump& dump) const;
  /// The same for an FP8 dump: the geometry, and the table for the dump's FP8 format.
  void check_matches(const Fp8KvDump& dump) const;
  /// Bytes the bases occupy (counted as overhead in resident figures).
  size_t bases_bytes() const { return 4 * per_kind_; }

 private:
  static size_t index(TensorKind kind) { return kind == TensorKind::key ? 0 : 1; }
  size_t offset(int layer, int head) const;
  void require_format(bool fp8, const char* what) const;
  void check_geometry_matches(size_t layers, int kv_heads, int head_dim) const;
  int layers_ = 0, kv_heads_ = 0, head_dim_ = 0;
  ElementFormat format_ = ElementFormat::bf16;
  size_t per_kind_ = 0;
  std::array<std::vector<uint8_t>, 2> narrow_, wide_;
  std::array<std::vector<size_t>, 2> capacity_;
  std::map<std::string, std::string> metadata_;
};

/// Reads a calibration table from safetensors (`k.b3`, `k.b4`, `v.b3`, `v.b4` as U8
/// [layers, kv_heads, head_dim]; for an FP8 table `.b2` and `.b3`, and `element_format` in the metadata;
/// capacities in the metadata). Throws gaac::Error when malformed.
GAAC_API CalibrationTable load_calibration(const std::string& path);
/// Writes a calibration table as safetensors, never over any of `inputs` (as save_kv_dump does).
GAAC_API void save_calibration(const CalibrationTable& table, const std::string& path, std::span<const std::string> inputs = {});

/// Progress callback for long operations: units done out of total.
using Progress = std::function<void(size_t done, size_t total)>;

/// Streaming calibration. Pass 1 accumulates exponent histograms per channel over any number of
/// dumps; the windows follow from them. Pass 2 encodes the same (or other) dumps with those
/// windows to learn the distribution of escape bytes per tile, which fixes each layer's slot
/// capacity.
class GAAC_API Calibrator {
 public:
  /// Starts an empty calibration for dumps of this geometry and element format.
  Calibrator(int layers, int kv_heads, int head_dim, ElementFormat format = ElementFormat::bf16);

  /// Pass 1: counts the exponents of every element of `dump` (the calibrator must be for BF16).
  void add_exponents(const KvDump& dump, const Progress& progress = {});
  /// Pass 1 for an FP8 dump (the calibrator must be for its format).
  void add_exponents(const Fp8KvDump& dump, const Progress& progress = {});
  /// Bases from the histograms so far: per channel, the narrow and wide exponent windows (BF16: 8 and
  /// 16 exponents, FP8: 4 and 8) covering the most values (lowest base on ties, inside the format's
  /// exponent range). Capacities are left at each shape's maximum.
  CalibrationTable choose_windows() const;
  /// The base of the `width`-long window of one channel from the histograms so far, as
  /// choose_windows picks them (best_exponent_window); any width, for studies of other mode widths.
  uint8_t window_base(TensorKind kind, int layer, int head, int channel, int width) const;

  /// Pass 2: records the escape bytes every complete tile of `dump` needs under `table`'s bases.
  void add_escape_sizes(const KvDump& dump, const CalibrationTable& table, const Progress& progress = {});
  /// Pass 2 for an FP8 dump.
  void add_escape_sizes(const Fp8KvDump& dump, const CalibrationTable& table, const Progress& progress = {});
  /// Sets in `table` the capacity of each (kind, layer) minimising the expected resident bytes per
  /// tile: P(fits)·slot_bytes(c) + P(does not fit)·raw_bytes, over the tiles seen in pass 2.
  void choose_capacities(CalibrationTable& table) const;

  /// Tokens seen in pass 1 (summed over layers).
  uint64_t tokens_seen() const { return tokens_seen_; }

 private:
  std::span<uint32_t> histogram(TensorKind kind, int layer, int head, int channel);
  std::span<const uint32_t> histogram(TensorKind kind, int layer, int head, int channel) const;
  std::span<uint64_t> escape_histogram(TensorKind kind, int layer);
  std::span<const uint64_t> escape_histogram(TensorKind kind, int layer) const;
  void check_format(ElementFormat format) const;
  template <class Dump>
  void count_exponents(const Dump& dump, const Progress& progress);
  template <class Dump, class Codecs>
  void measure_escape_sizes(const Dump& dump, const Codecs& measuring, const Progress& progress);
  int layers_, kv_heads_, head_dim_;
  ElementFormat format_;
  std::vector<uint32_t> histograms_;       // [kind][layer][head][channel][256]
  std::vector<uint64_t> escape_sizes_;     // [kind][layer][max_escape_bytes + 1]
  uint64_t tokens_seen_ = 0;
};

/// Both passes over the given dumps: the usual way to calibrate in memory.
GAAC_API CalibrationTable calibrate(std::span<const KvDump* const> dumps, const Progress& progress = {});
/// Both passes over FP8 dumps (all of one format): an FP8 table.
GAAC_API CalibrationTable calibrate(std::span<const Fp8KvDump* const> dumps, const Progress& progress = {});

/// The lowest base of the `width`-long window of exponents holding the most of `counts` (256
/// per-exponent counts; the window stays inside 0..255). Throws gaac::Error on a bad width or size.
GAAC_API uint8_t best_exponent_window(std::span<const uint32_t> counts, int width);

/// Chooses the capacity (multiple of 16) minimising expected resident bytes for one tile shape,
/// given counts[n] = tiles needing n escape bytes.
GAAC_API size_t best_escape_capacity(TileShape shape, std::span<const uint64_t> counts);
/// The same for an FP8 tile shape.
GAAC_API size_t best_escape_capacity(Fp8TileShape shape, std::span<const uint64_t> counts);

}  // namespace gaac
