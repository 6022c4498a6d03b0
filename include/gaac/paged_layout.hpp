// The paged KV cache as memory: a pool of fixed-size units, a block table of 4-byte tile entries, and
// per-sequence tables in CSR form. Every executor (the CPU attention, the CUDA kernels) walks exactly
// these structures; docs/format.md, section 13, is their normative description.
//
// Plain data and constexpr arithmetic only, like format.hpp: includable from device code.
#pragma once

#include <cstddef>
#include <cstdint>

#include "gaac/format.hpp"
#include "gaac/fp8_format.hpp"

namespace gaac {

/// Storage class of one tile of a block, held in the top two bits of its block-table entry.
enum class TileClass : uint8_t {
  compressed = 0,  ///< one unit holding a slot (docs/format.md, section 5; FP8: section 14.5)
  raw = 1,         ///< 16 tokens × channels elements: one unit, or two when units are smaller than a raw tile
  absent = 2,      ///< not held: released by a sliding window (or never written)
};

/// Bits of an entry that hold the unit index; the two above them hold the class.
inline constexpr int kEntryIndexBits = 30;
/// Mask of the unit index in an entry.
inline constexpr uint32_t kEntryIndexMask = (1u << kEntryIndexBits) - 1;
/// Largest number of units a pool may have (indices must fit the entry).
inline constexpr uint32_t kMaxUnits = 1u << kEntryIndexBits;
/// The entry of a tile that is not held.
inline constexpr uint32_t kAbsentEntry = static_cast<uint32_t>(TileClass::absent) << kEntryIndexBits;
/// Row id, in a sequence table, of a block none of whose tiles is held any more.
inline constexpr uint32_t kNoRow = 0xFFFFFFFFu;
/// Alignment in bytes of the unit pool's first byte (units themselves are multiples of 16 bytes).
inline constexpr size_t kPoolAlignment = 256;

/// A block-table entry: storage class and unit index.
GAAC_HOST_DEVICE constexpr uint32_t make_entry(TileClass cls, uint32_t unit) {
  return static_cast<uint32_t>(cls) << kEntryIndexBits | (unit & kEntryIndexMask);
}
/// Storage class of an entry.
GAAC_HOST_DEVICE constexpr TileClass entry_class(uint32_t entry) {
  return static_cast<TileClass>(entry >> kEntryIndexBits);
}
/// Unit index of an entry (for a raw tile in two units: its first unit).
GAAC_HOST_DEVICE constexpr uint32_t entry_unit(uint32_t entry) { return entry & kEntryIndexMask; }

/// The numbers that place every entry and tile of a paged cache.
///
/// A block row covers one 16-token block of a sequence, for every layer, KV head, K/V and half-head.
/// Its entries are grouped by layer: the table is `[layers][row_capacity][kv_heads][2 (K, V)][halves]`
/// u32, so a kernel working on one layer and one head reads its K and V entries of a block with one
/// 8- or 16-byte load.
struct PagedGeometry {
  int layers = 0;
  int kv_heads = 0;
  int head_dim = 0;             ///< 64, 128 or 256
  uint32_t unit_bytes = 0;      ///< bytes per unit (a multiple of 16)
  uint32_t row_capacity = 0;    ///< block rows the table has room for
  /// The elements the tiles hold: BF16, or E4M3 / E5M2 in an FP8 cache (docs/format.md, section 13).
  ElementFormat element_format = ElementFormat::bf16;

  /// Channels per tile: 64 for head_dim 64, else 128.
  GAAC_HOST_DEVICE constexpr int tile_channels() const { return head_dim < kMaxTileChannels ? head_dim : kMaxTileChannels; }
  /// Tiles per head: 1, or 2 half-heads for head_dim 256.
  GAAC_HOST_DEVICE constexpr int halves() const { return head_dim / tile_channels(); }
  /// Entries of one layer in one block row.
  GAAC_HOST_DEVICE constexpr int entries_per_layer_row() const { return kv_heads * 2 * halves(); }
  /// Entries of one block row over all layers.
  GAAC_HOST_DEVICE constexpr size_t entries_per_row() const { return static_cast<size_t>(layers) * entries_per_layer_row(); }
  /// Entries in the whole table.
  GAAC_HOST_DEVICE constexpr size_t table_entries() const { return entries_per_row() * row_capacity; }

  /// Index in the table of the entry of (layer, row, head, kind, half).
  GAAC_HOST_DEVICE constexpr size_t entry_index(int layer, uint32_t row, int head, TensorKind kind, int half) const {
    return (static_cast<size_t>(layer) * row_capacity + row) * static_cast<size_t>(entries_per_layer_row()) +
           (static_cast<size_t>(head) * 2 + static_cast<size_t>(kind)) * static_cast<size_t>(halves()) +
           static_cast<size_t>(half);
  }

  /// Bytes of one element: 2 (BF16) or 1 (FP8).
  GAAC_HOST_DEVICE constexpr size_t element_size() const { return static_cast<size_t>(element_bytes(element_format)); }
  /// Bytes of one token's row of a tile (tile_channels elements).
  GAAC_HOST_DEVICE constexpr size_t row_bytes() const { return static_cast<size_t>(tile_channels()) * element_size(); }
  /// Bytes of a raw tile (16 tokens × tile_channels elements, row-major).
  GAAC_HOST_DEVICE constexpr size_t raw_tile_bytes() const { return static_cast<size_t>(kTileTokens) * row_bytes(); }
  /// Bytes of half a raw tile: 8 tokens, what each unit of a split raw tile holds.
  GAAC_HOST_DEVICE constexpr size_t raw_half_bytes() const { return raw_tile_bytes() / 2; }
  /// True when a raw tile takes two units (units smaller than a raw tile: a cache of compressed
  /// slots); false when it takes one (a BF16 or plain FP8 cache, units of a whole raw tile).
  GAAC_HOST_DEVICE constexpr bool raw_split() const { return unit_bytes < raw_tile_bytes(); }
  /// Offset, inside the first unit of a split raw tile, of the u32 index of its second unit.
  GAAC_HOST_DEVICE constexpr size_t partner_offset() const { return raw_half_bytes(); }
  /// Bytes of a slot before its escape slot: the fixed sections of the element format's tile.
  GAAC_HOST_DEVICE constexpr size_t slot_fixed_bytes() const {
    const TileShape shape{TensorKind::key, tile_channels()};
    return is_fp8(element_format) ? Fp8TileShape{element_format, shape}.fixed_bytes() : shape.fixed_bytes();
  }
  /// Escape capacity of the slots a unit holds (0 for a BF16 or plain FP8 cache, whose units hold no slots).
  GAAC_HOST_DEVICE constexpr size_t escape_capacity() const { return raw_split() ? unit_bytes - slot_fixed_bytes() : 0; }
  /// Byte offset in the pool of unit `unit`.
  GAAC_HOST_DEVICE constexpr size_t unit_offset(uint32_t unit) const { return static_cast<size_t>(unit) * unit_bytes; }

  /// Index in the bases array of the `which` (0: narrow, b3 or FP8's b2; 1: wide, b4 or FP8's b3) bases
  /// of (layer, kind, head): head_dim bytes there, channel by channel. The array is
  /// `[layers][2 (K, V)][2 (narrow, wide)][kv_heads][head_dim]`.
  GAAC_HOST_DEVICE constexpr size_t bases_index(int layer, TensorKind kind, int which, int head) const {
    return ((static_cast<size_t>(layer) * 2 + static_cast<size_t>(kind)) * 2 + static_cast<size_t>(which)) *
               static_cast<size_t>(kv_heads) * head_dim +
           static_cast<size_t>(head) * head_dim;
  }
  /// Bytes of the bases array.
  GAAC_HOST_DEVICE constexpr size_t bases_bytes() const { return static_cast<size_t>(layers) * 4 * kv_heads * head_dim; }
};

/// A paged cache's memory, as pointers: host memory for the CPU cache, device memory for its CUDA
/// mirror. Nothing here is owned.
struct PagedCacheView {
  PagedGeometry geometry;
  const uint8_t* units = nullptr;     ///< the unit pool (kPoolAlignment-aligned)
  const uint32_t* entries = nullptr;  ///< the block table, geometry.table_entries() entries
  const uint8_t* bases = nullptr;     ///< calibrated exponent bases (geometry.bases_bytes()); null for a BF16 or plain FP8 cache
  const int32_t* windows = nullptr;   ///< per layer: sliding-window length in tokens, 0 for full attention
};

/// The blocks of a batch of sequences, in CSR form (as FlashInfer's indptr / indices / last page):
/// sequence s has blocks indptr[s] .. indptr[s+1]-1, block b of it is block row rows[indptr[s] + b]
/// (kNoRow when none of its tiles is held), and it holds lengths[s] tokens, so its last block holds
/// lengths[s] - 16·(blocks - 1) of them. A kernel walks it with no help from the host.
struct SequenceTableView {
  int sequences = 0;
  const int32_t* indptr = nullptr;   ///< sequences + 1 block offsets
  const uint32_t* rows = nullptr;    ///< indptr[sequences] block rows
  const int32_t* lengths = nullptr;  ///< tokens per sequence
};

/// First position a query at `position` attends to in a layer with sliding window `window` (0: all).
GAAC_HOST_DEVICE constexpr int first_attended(int position, int window) {
  return window > 0 && position - window + 1 > 0 ? position - window + 1 : 0;
}

}  // namespace gaac
