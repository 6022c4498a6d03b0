// The inside of a KvCache, shared by the files that implement it: the pool, the block table, the
// block rows with their reference counts, and the sequences.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "cache/layout.hpp"
#include "cache/unit_pool.hpp"
#include "gaac/error.hpp"
#include "gaac/kv_cache.hpp"

namespace gaac {

struct KvCache::State {
  /// One sequence: its blocks' rows in order, its length, and per window class how many of its
  /// leading blocks it no longer needs.
  struct Sequence {
    bool alive = false;
    int length = 0;
    std::vector<uint32_t> rows;
    std::vector<int> dropped;
  };

  CacheConfig config;
  cache::Layout layout;  ///< how the budget was carved (for the budget an append would need)
  PagedGeometry geo;
  int channels = 0;          ///< per tile
  int halves = 1;            ///< tiles per head
  uint32_t raw_units = 1;    ///< units per raw tile: 2 in a compressed cache, 1 in a bf16 or fp8 cache
  std::optional<CalibratedCodecs> codecs;        ///< a gaac cache's
  std::optional<Fp8CalibratedCodecs> fp8_codecs;  ///< a gaac_fp8 cache's
  std::vector<uint8_t> bases;     ///< the kernels' bases array (empty for bf16 and fp8)
  std::vector<int32_t> windows;   ///< per layer, 0 for full attention
  std::vector<int> class_window;  ///< the distinct sliding windows ("window classes")
  std::vector<int> layer_class;   ///< per layer: its window class, or -1
  cache::UnitPool pool;
  std::vector<uint32_t> entries;  ///< the block table
  std::vector<uint32_t> free_rows;
  std::vector<uint32_t> row_refs;         ///< sequences holding the row
  std::vector<uint16_t> row_window_refs;  ///< [row][class]: sequences still needing its tiles of that class
  std::vector<uint8_t> row_tokens;        ///< tokens written in the row (16 once finalized)
  std::vector<Sequence> sequences;
  std::vector<SequenceId> free_ids;

  bool compressed() const { return is_compressed(config.format); }
  int classes() const { return static_cast<int>(class_window.size()); }
  /// Bytes of one token's row of a tile.
  size_t row_bytes() const { return geo.row_bytes(); }

  /// Encodes one tile (element (t, c) at src[t·row_stride + c]) with the codec of (kind, layer, head,
  /// half) into `slot`: BF16 rows in a gaac cache, FP8 codes in a gaac_fp8 cache.
  TileEncoding encode_tile(const uint16_t* src, size_t row_stride, TensorKind kind, int layer, int head, int half, uint8_t* slot) const;
  TileEncoding encode_tile(const uint8_t* src, size_t row_stride, TensorKind kind, int layer, int head, int half, uint8_t* slot) const;
  /// Decodes the compressed tile of `entry` into 16 rows of row_bytes() bytes at `out` (BF16 or FP8).
  DecodeStatus decode_tile(uint32_t entry, TensorKind kind, int layer, int head, int half, void* out) const;
  /// KvCache::append for rows of `Element` (uint16_t BF16, uint8_t FP8), the cache's element type.
  template <class Element>
  AppendOutcome append(SequenceId sequence, std::span<const BasicKvView<const Element>> k, std::span<const BasicKvView<const Element>> v);
  /// KvCache::read into `Element` rows.
  template <class Element>
  void read(SequenceId sequence, int layer, TensorKind kind, int first, const BasicKvView<Element>& out) const;
  /// Throws gaac::Error unless the cache holds elements of type `Element` (`what`: the operation).
  template <class Element>
  void require_element(const char* what) const {
    if (is_fp8(geo.element_format) != (sizeof(Element) == 1)) {
      throw Error(std::string(what) + ": this KV cache holds " + to_string(geo.element_format) + " elements, not " +
                  (sizeof(Element) == 1 ? "FP8 codes" : "BF16 values"));
    }
  }

  /// The live sequence `id`; throws gaac::Error otherwise.
  Sequence& sequence(SequenceId id);
  const Sequence& sequence(SequenceId id) const;

  uint32_t& entry(int layer, uint32_t row, int head, TensorKind kind, int half) {
    return entries[geo.entry_index(layer, row, head, kind, half)];
  }
  uint32_t entry(int layer, uint32_t row, int head, TensorKind kind, int half) const {
    return entries[geo.entry_index(layer, row, head, kind, half)];
  }

  /// Units the tile of `entry` holds.
  uint32_t units_of(uint32_t entry) const {
    switch (entry_class(entry)) {
      case TileClass::compressed: return 1;
      case TileClass::raw: return raw_units;
      default: return 0;
    }
  }
  /// Second unit of a split raw tile whose first unit is `unit`.
  uint32_t partner(uint32_t unit) const;
  /// Token `token`'s row (C BF16 values) inside the raw tile of `entry`.
  uint8_t* raw_row(uint32_t entry, int token);
  const uint8_t* raw_row(uint32_t entry, int token) const;
  /// Takes the units of a raw tile, zeroed (and linked); the caller has checked there are enough.
  uint32_t take_raw_tile();
  /// Gives the tile's units back and marks it absent.
  void free_tile(uint32_t& entry);
  /// Frees the tiles of `row` in the layers of window class `cls`.
  void free_class_tiles(uint32_t row, int cls);
  /// Units that `q` giving up its reference to its block `b` frees (the tiles no other sequence, or no
  /// other sequence's window, still needs).
  uint64_t units_released(const Sequence& q, size_t b) const;
  /// Gives up `q`'s reference to its block `b`: window references, then the row's, freeing the tiles
  /// and the row nobody needs any more. The caller removes the row from `q.rows`.
  void release_block(const Sequence& q, size_t b);
  /// Window-class reference of (row, class).
  uint16_t& window_refs(uint32_t row, int cls) { return row_window_refs[static_cast<size_t>(row) * classes() + cls]; }
  uint16_t window_refs(uint32_t row, int cls) const { return row_window_refs[static_cast<size_t>(row) * classes() + cls]; }
  /// Leading blocks a sequence of `length` tokens no longer needs in window class `cls`.
  int needed_from(int length, int cls) const {
    const int w = class_window[static_cast<size_t>(cls)];
    return length > w ? (length - w) / kTileTokens : 0;
  }
  /// Calls f(layer, head, kind, half) for every tile of a block row.
  template <class F>
  void for_each_tile(F&& f) const {
    for (int l = 0; l < geo.layers; ++l) {
      for (int h = 0; h < geo.kv_heads; ++h) {
        for (const TensorKind kind : {TensorKind::key, TensorKind::value}) {
          for (int half = 0; half < halves; ++half) f(l, h, kind, half);
        }
      }
    }
  }
};

}  // namespace gaac
