// The paged KV cache: sequences of 16-token blocks kept compressed in fixed-size units of one pool,
// filled through a raw tail (BF16, or FP8 codes) and finalized once per block (fill-then-finalize), with a block table
// that attention kernels walk in place. docs/format.md, section 13, gives the memory layout;
// docs/design.md the lifecycle.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <vector>

#include "gaac/calibration.hpp"
#include "gaac/fp8_codec.hpp"
#include "gaac/tile_codec.hpp"
#include "gaac/export.h"
#include "gaac/paged_layout.hpp"
#include "gaac/tensor_view.hpp"

namespace gaac {

/// How a cache stores finalized blocks (docs/format.md, section 13).
enum class CacheFormat : uint8_t {
  gaac,      ///< compressed slots, raw BF16 tiles where a tile's escapes do not fit
  bf16,      ///< raw BF16 tiles only: the baseline of the same structure
  gaac_fp8,  ///< FP8 elements: compressed FP8 slots, raw FP8 tiles where a tile's escapes do not fit
  fp8,       ///< raw FP8 tiles only: the twin of gaac_fp8, as bf16 is gaac's
};

/// Name of a format ("gaac", "bf16", "gaac-fp8", "fp8").
GAAC_API const char* to_string(CacheFormat format);
/// True for the formats whose elements are FP8 codes (gaac_fp8, fp8).
constexpr bool is_fp8(CacheFormat format) { return format == CacheFormat::gaac_fp8 || format == CacheFormat::fp8; }
/// True for the formats that compress finalized tiles (gaac, gaac_fp8); they need a calibration table.
constexpr bool is_compressed(CacheFormat format) { return format == CacheFormat::gaac || format == CacheFormat::gaac_fp8; }

/// The model geometry a cache is laid out for.
struct CacheGeometry {
  int layers = 0;
  int kv_heads = 0;
  int head_dim = 0;                  ///< 64, 128 or 256
  std::vector<int> sliding_window;   ///< per layer, in tokens; 0 (or an empty vector) for full attention
};

/// Runs body(begin, end) over chunks covering [0, n), possibly on several threads, and returns when
/// all are done. The cache encodes with it; without one it works on the calling thread.
using ParallelFor = std::function<void(size_t n, const std::function<void(size_t begin, size_t end)>& body)>;

/// What the elements of an FP8 cache (gaac_fp8, fp8) are and what they stand for.
struct Fp8CacheConfig {
  ElementFormat element = ElementFormat::e4m3;  ///< e4m3 or e5m2, for every tensor of the cache
  /// Per layer, the scale of K and of V: code x of layer l's K stands for fp8_to_float(x) · k_scales[l]
  /// (vLLM's k_scale / v_scale). One finite positive value per layer each; 1 for unscaled values.
  std::vector<float> k_scales;
  std::vector<float> v_scales;
};

/// Everything a cache is made from.
struct CacheConfig {
  CacheGeometry geometry;
  CacheFormat format = CacheFormat::gaac;
  /// Bytes for the unit pool and the block table together; both are carved from it once.
  size_t budget_bytes = 0;
  /// Exponent windows and capacities (required for the compressed formats, ignored otherwise): a BF16
  /// table for gaac, an FP8 table of `fp8.element` for gaac_fp8. The cache's units hold slots of the
  /// table's largest escape capacity. The cache copies what it needs: the table need not outlive it.
  const CalibrationTable* calibration = nullptr;
  /// The element format and scales of an FP8 cache (required for gaac_fp8 and fp8, ignored otherwise).
  Fp8CacheConfig fp8;
  Backend backend = Backend::automatic;
  ParallelFor parallel;  ///< optional
};

/// Identifies a sequence of a cache.
using SequenceId = uint32_t;

/// Result of an operation that needs space.
enum class CacheStatus : uint8_t {
  ok = 0,
  out_of_space,  ///< not enough free units (or block rows); the cache is unchanged
};

/// What an append needed when it failed, for a message that says how much is needed.
struct AppendOutcome {
  CacheStatus status = CacheStatus::ok;
  uint64_t bytes_needed = 0;  ///< bytes of units and table entries the operation would have taken
  uint64_t bytes_free = 0;    ///< bytes that were free (and releasable by it) when it was tried
  /// The smallest budget with which a cache of this config, holding what this one holds, would
  /// have taken the append (carved exactly as the constructor carves). Exact when `measured`;
  /// otherwise the append, which completes tiles, could not fit even with every one of them
  /// compressed, was refused before any was encoded, and this is the budget that best case would
  /// need (a lower bound).
  uint64_t budget_needed = 0;
  bool measured = true;  ///< whether the tiles were encoded, so that `budget_needed` is exact
};

/// Where the cache's memory goes, and what it holds.
struct CacheUsage {
  uint64_t budget_bytes = 0;
  uint64_t unit_bytes = 0;         ///< bytes per unit
  uint64_t raw_units = 1;          ///< units per raw tile (2 in a compressed cache)
  uint64_t element_bytes = 2;      ///< bytes per element: 2 (BF16) or 1 (FP8)
  uint64_t units = 0;              ///< units in the pool
  uint64_t units_free = 0;
  uint64_t rows = 0;               ///< block rows the table has room for
  uint64_t rows_used = 0;
  uint64_t table_bytes = 0;        ///< the whole block table (entries of every row)
  uint64_t compressed_tiles = 0;   ///< finalized tiles held as slots
  uint64_t raw_tiles = 0;          ///< finalized tiles held raw (escapes did not fit; every tile of a bf16 or fp8 cache)
  uint64_t tail_tiles = 0;         ///< tiles of open blocks
  uint64_t unused_slot_bytes = 0;  ///< escape capacity that compressed tiles leave empty
  uint64_t elements = 0;           ///< elements held (BF16 or FP8), blocks shared by forks counted once
  uint64_t sequences = 0;

  /// Bytes of the units in use.
  uint64_t unit_bytes_used() const { return (units - units_free) * unit_bytes; }
  /// Bytes held per storage class: compressed slots, finalized raw tiles, open blocks' tails.
  uint64_t compressed_bytes() const { return compressed_tiles * unit_bytes; }
  uint64_t raw_bytes() const { return raw_tiles * raw_units * unit_bytes; }
  uint64_t tail_bytes() const { return tail_tiles * raw_units * unit_bytes; }
  /// Bytes held for the elements: units in use plus the block-table entries of the rows in use.
  uint64_t resident_bytes() const;
  /// 2 bytes per element held: what a dense BF16 cache needs for the same values.
  uint64_t bf16_bytes() const { return 2 * elements; }
  /// element_bytes per element held: what a dense cache of the same element format needs.
  uint64_t dense_bytes() const { return element_bytes * elements; }
  /// Resident bits per element held (0 when empty).
  double bits_per_element() const;
  /// Share of finalized tiles held raw (0 when none is finalized); in a gaac cache, the tiles whose
  /// escapes did not fit their slot.
  double raw_fraction() const {
    return raw_tiles == 0 ? 0.0 : static_cast<double>(raw_tiles) / static_cast<double>(raw_tiles + compressed_tiles);
  }
};

/// The blocks of a batch of sequences in CSR form, owned; view() gives the pointers kernels walk.
struct SequenceTable {
  std::vector<int32_t> indptr;
  std::vector<uint32_t> rows;
  std::vector<int32_t> lengths;

  SequenceTableView view() const {
    return {static_cast<int>(lengths.size()), indptr.data(), rows.data(), lengths.data()};
  }
};

/// The smallest budget with which a cache of `format` surely holds `sequences` sequences of `tokens`
/// tokens each, whatever their values (every block counted raw). Throws gaac::Error like KvCache's
/// constructor for a bad geometry or calibration, for negative counts, and when the budget would
/// pass 2^64 bytes.
GAAC_API uint64_t worst_case_budget(const CacheGeometry& geometry, CacheFormat format, const CalibrationTable* calibration,
                                    int tokens, int sequences = 1);

/// The smallest budget with which a cache of `format` could hold sequences of `tokens[i]` tokens
/// together at all: every block they complete counted compressed (one unit per tile), every open
/// block raw, sliding layers holding only their window. A smaller budget surely runs out before
/// they are stored; between this and worst_case_budget() it depends on the values. For a bf16 or
/// fp8 cache it is the exact need. Throws like worst_case_budget().
GAAC_API uint64_t least_budget(const CacheGeometry& geometry, CacheFormat format, const CalibrationTable* calibration,
                               std::span<const int> tokens);

/// How a budget is carved for a cache of `config`, exactly as KvCache's constructor carves it: the
/// layout numbers (unit size, block rows, element format), the units of the pool, every layer's sliding
/// window and, for a compressed cache, the calibrated bases in the kernels' order (PagedGeometry::bases_index). What a cache
/// made elsewhere (on a GPU) needs to be laid out as a KvCache of the same config. Throws gaac::Error
/// like KvCache's constructor.
struct CacheCarving {
  PagedGeometry geometry;
  uint64_t units = 0;
  std::vector<int32_t> windows;
  std::vector<uint8_t> bases;  ///< geometry.bases_bytes() bytes; empty for a bf16 or fp8 cache
};
/// Carves `config` (see CacheCarving).
GAAC_API CacheCarving carve_cache(const CacheConfig& config);

/// A paged KV cache for one model geometry. Not thread-safe: one caller at a time (reads — views,
/// tables, read, attention — may run concurrently with each other, not with a change).
class GAAC_API KvCache {
 public:
  /// Carves the pool and the table from the budget. The pool's memory is reserved, not committed: its
  /// pages are touched as units are first taken; the block table and the bookkeeping (about 4 bytes
  /// per unit, a few times that with sliding windows) are committed at once. Throws gaac::Error for a
  /// bad geometry, a missing or mismatched calibration (an FP8 format needs an FP8 table of its element
  /// format, a BF16 one a BF16 table), missing or bad FP8 scales, a budget too small for one block of
  /// every layer, or one larger than this machine's memory or than the system will reserve.
  explicit KvCache(CacheConfig config);
  ~KvCache();
  KvCache(KvCache&&) noexcept;
  KvCache& operator=(KvCache&&) noexcept;
  KvCache(const KvCache&) = delete;
  KvCache& operator=(const KvCache&) = delete;

  /// A new, empty sequence (takes no memory until tokens arrive).
  SequenceId add_sequence();
  /// A new sequence holding the same tokens as `parent`: its complete blocks are shared (reference
  /// counted), its open block copied. out_of_space (nothing changed) when the copy does not fit.
  CacheStatus fork(SequenceId parent, SequenceId& child);
  /// Frees a sequence and every block no other sequence shares.
  void free_sequence(SequenceId sequence);
  /// Cuts `sequence` back to its first `tokens` tokens, leaving it as appending only them would have:
  /// blocks past them are released (what a fork shares stays with the fork), and a finalized block cut
  /// inside becomes the open block again, its tiles decoded back into a BF16 tail, bit for bit (copied
  /// first when a fork shares it). out_of_space (nothing changed) when that needs more units or rows
  /// than are free. Throws gaac::Error for a count outside 0 .. length, or when a sliding window has
  /// already released positions the new newest token attends (cutting to 0 always works).
  CacheStatus truncate(SequenceId sequence, int tokens);
  /// A deep copy: the same sequences (the same ids), blocks, units and free lists, in memory of its own.
  KvCache clone() const;
  /// True while `sequence` names a sequence of this cache.
  bool contains(SequenceId sequence) const;
  /// Tokens held for a sequence.
  int length(SequenceId sequence) const;

  /// True when appending `tokens` tokens to `sequence` cannot fail whatever their values (counting
  /// every block they complete as raw): the admission check of a scheduler. For one decoding token
  /// it is exact.
  bool can_append(SequenceId sequence, int tokens) const;

  /// Appends the same number of tokens to every layer: `k[l]` and `v[l]` are layer l's new K and V
  /// rows, `[tokens, kv_heads, head_dim]`. Tokens join the open block's BF16 tail; each block they
  /// complete is encoded once (or kept raw when its escapes do not fit); complete blocks that arrive
  /// whole are encoded directly. Blocks that fall wholly out of a sliding window are released. On
  /// out_of_space nothing changed (the pool, the table and every count are as before). Throws
  /// gaac::Error for views of the wrong shape, an unknown sequence, or an FP8 cache (which takes codes).
  AppendOutcome append(SequenceId sequence, std::span<const KvView> k, std::span<const KvView> v);
  /// The same for an FP8 cache: the rows are FP8 codes of the cache's element format, stored as they
  /// are (every byte pattern; nothing is converted). Throws gaac::Error for a BF16 cache.
  AppendOutcome append(SequenceId sequence, std::span<const Fp8KvView> k, std::span<const Fp8KvView> v);

  /// Decodes positions first .. first+out.tokens-1 of (sequence, layer, kind) into `out`
  /// (`[tokens, kv_heads, head_dim]`). Positions released by a sliding window are an error, and so is
  /// an FP8 cache (read its codes with the uint8_t overload).
  void read(SequenceId sequence, int layer, TensorKind kind, int first, const MutableKvView& out) const;
  /// The same for an FP8 cache: the codes appended, bit for bit. Throws gaac::Error for a BF16 cache.
  void read(SequenceId sequence, int layer, TensorKind kind, int first, const BasicKvView<uint8_t>& out) const;
  /// The whole sequence as a KV dump (every layer; a sliding layer must still hold every position).
  /// Throws gaac::Error for an FP8 cache.
  KvDump dump(SequenceId sequence) const;

  /// The layout numbers of this cache.
  const PagedGeometry& geometry() const;
  CacheFormat format() const;
  /// The scale of layer `layer`'s K or V codes in an FP8 cache (1 in a BF16 cache).
  float scale(int layer, TensorKind kind) const;
  /// The memory kernels walk: units, block table, bases, sliding windows.
  PagedCacheView view() const;
  /// The CSR table of the given sequences, in that order.
  SequenceTable sequence_table(std::span<const SequenceId> sequences) const;
  /// The tile codecs the cache encodes with (null but for a gaac cache); fused kernels decode with them.
  const CalibratedCodecs* codecs() const;
  /// The FP8 tile codecs of a gaac_fp8 cache (null for any other).
  const Fp8CalibratedCodecs* fp8_codecs() const;
  /// The free units of the pool, in the order they will be taken last to first (so a mirror of the
  /// pool elsewhere, such as the GPU's, can keep taking and giving them the same way).
  std::span<const uint32_t> free_units() const;
  /// Memory and contents (walks the table: for reports, not for every step).
  CacheUsage usage() const;
  /// CacheUsage::resident_bytes() without the walk: units in use and the entries of rows in use.
  uint64_t resident_bytes() const;
  /// Checks every internal invariant (reference counts, free units, entries, accounting) and throws
  /// gaac::Error naming the first one broken. For tests; costs a walk over the whole table.
  void check_invariants() const;

 private:
  struct State;
  explicit KvCache(std::unique_ptr<State> state);
  std::unique_ptr<State> state_;
};

}  // namespace gaac
