// What the host hands the decode-attention kernels: plain data shared by the launcher (.cu, host
// side) and the kernels. No device code.
#pragma once

#include <cstdint>

#include "gaac/cuda_views.hpp"
#include "gaac/paged_layout.hpp"

namespace gaac::cuda::detail {

/// Where a kernel's tiles come from: compressed slots (with raw tiles beside them) or an uncompressed
/// cache (its twin), of BF16 elements or of FP8 codes of one format.
enum class TileSource : uint8_t {
  gaac = 0,       ///< GAAC slots (BF16)
  bf16 = 1,       ///< a BF16 cache
  gaac_e4m3 = 2,  ///< GAAC-FP8 slots of E4M3 codes
  gaac_e5m2 = 3,  ///< GAAC-FP8 slots of E5M2 codes
  e4m3 = 4,       ///< a plain FP8 cache of E4M3 codes
  e5m2 = 5,       ///< a plain FP8 cache of E5M2 codes
};

/// True for the sources of compressed slots.
GAAC_HOST_DEVICE constexpr bool is_compressed(TileSource s) {
  return s == TileSource::gaac || s == TileSource::gaac_e4m3 || s == TileSource::gaac_e5m2;
}
/// The elements a source's tiles hold.
GAAC_HOST_DEVICE constexpr ElementFormat element_format(TileSource s) {
  return s == TileSource::gaac_e4m3 || s == TileSource::e4m3   ? ElementFormat::e4m3
         : s == TileSource::gaac_e5m2 || s == TileSource::e5m2 ? ElementFormat::e5m2
                                                               : ElementFormat::bf16;
}
/// True for the sources of FP8 codes.
GAAC_HOST_DEVICE constexpr bool is_fp8(TileSource s) { return element_format(s) != ElementFormat::bf16; }

/// Tiles of a warp's block (`warp_tiles`: its K and V tiles, or one where a pair splits them) that one copy
/// slot holds, completing on one mbarrier: one over BF16 caches (a key tile's buffer is refilled as soon as
/// the scores are taken); all over FP8 caches, whose small tiles make the second wait and copy call a block
/// cost more than the earlier refill saves (docs/performance.md).
GAAC_HOST_DEVICE constexpr int tiles_per_copy_slot(TileSource s, int warp_tiles) { return is_fp8(s) ? warp_tiles : 1; }
/// The source of a cache's tiles: its element format, compressed or not.
GAAC_HOST_DEVICE constexpr TileSource tile_source(ElementFormat f, bool compressed) {
  return f == ElementFormat::e4m3   ? (compressed ? TileSource::gaac_e4m3 : TileSource::e4m3)
         : f == ElementFormat::e5m2 ? (compressed ? TileSource::gaac_e5m2 : TileSource::e5m2)
                                    : (compressed ? TileSource::gaac : TileSource::bf16);
}


/// Arguments of one decode-attention launch (one layer, a batch of sequences, one query token each).
struct DecodeArgs {
  DeviceCacheView cache;   ///< the cache (device pointers)
  DeviceBatchView batch;   ///< the batch's sequence table; a sequence's query is its newest token
  int layer = 0;           ///< the layer attended
  int window = 0;          ///< sliding window of the layer in tokens, 0 for full attention
  // The problem.
  const uint16_t* q = nullptr;  ///< [sequences][q_heads][head_dim] bf16
  uint16_t* out = nullptr;      ///< [sequences][q_heads][head_dim] bf16
  int q_heads = 0;
  int group = 0;                ///< query heads per KV head (q_heads / kv_heads)
  /// CTAs that share each KV head's queries (grid.y = kv_heads · head_slices): slice i serves query heads
  /// [i·H, i·H + H) of the kernel's H, so a group of 9–16 runs on the 8-head instance.
  int head_slices = 1;
  float scale_log2 = 0.0f;      ///< softmax scale × log2(e) (FP8: softmax scale × the layer's K scale × log2(e))
  float out_scale = 1.0f;       ///< multiplies the output after its 1/S: the layer's V scale (FP8), else 1
  // The split of each sequence's blocks over CTAs.
  int blocks_per_split = 1;
  int max_splits = 1;           ///< partial results the workspace holds per (sequence, KV head), ≥ gridDim.x
  // Workspace (device). The splits of a (sequence, KV head) merge in two levels: the last CTA of each
  // merge group of `merge_group` consecutive splits merges the group, the last group merges the groups.
  int merge_group = 1;          ///< splits per merge group
  int max_groups = 1;           ///< merged groups the workspace holds per (sequence, KV head)
  float* partial_o = nullptr;   ///< [sequences][kv_heads][max_splits][group][head_dim]
  float* partial_ml = nullptr;  ///< [sequences][kv_heads][max_splits][group][2]: running max (log2), sum
  float* group_o = nullptr;     ///< [sequences][kv_heads][max_groups][group][head_dim]: merged groups
  float* group_ml = nullptr;    ///< [sequences][kv_heads][max_groups][group][2]
  uint32_t* counters = nullptr; ///< [sequences][kv_heads][head_slices][max_groups + 1], zero between launches
  // Shared-memory layout (bytes).
  uint32_t tile_stride = 0;     ///< bytes of one tile in a pipeline stage
  uint32_t sink_magic = 0;      ///< value the no_math / load_only sinks are compared with (never equal)
};

}  // namespace gaac::cuda::detail

namespace gaac::cuda::detail {

/// Warps per CTA of the decode kernels: each streams its own blocks through its own stages.
inline constexpr int kDecodeWarps = 4;
/// Largest number of blocks one CTA takes (its entries are staged in shared memory).
inline constexpr int kMaxBlocksPerSplit = 2048;
/// Largest number of splits per (sequence, KV head) the final merge handles.
inline constexpr int kMaxSplits = 1024;  // merge groups of at most 32, at most 32 groups
/// Padded row of a BF16 tile in shared memory: 2·C bytes + 16, so ldmatrix's eight rows of a matrix
/// fall in different banks.
GAAC_HOST_DEVICE constexpr uint32_t bf16_row_stride(int channels) { return 2u * static_cast<uint32_t>(channels) + 16u; }
/// Padded row of a plain FP8 tile in shared memory: C bytes + 16, for the same reason.
GAAC_HOST_DEVICE constexpr uint32_t fp8_row_stride(int channels) { return static_cast<uint32_t>(channels) + 16u; }
/// Bytes of one tile in a pipeline stage: a slot padded by 16 bytes (decoders read past its escapes)
/// for compressed sources, 16 padded rows for the others.
GAAC_HOST_DEVICE constexpr uint32_t stage_tile_bytes(TileSource source, int channels, uint32_t unit_bytes) {
  return is_compressed(source) ? unit_bytes + 16u
         : is_fp8(source)      ? 16u * fp8_row_stride(channels)
                               : 16u * bf16_row_stride(channels);
}

/// Whether a kernel of tiles of `halves` halves with room for `heads` query heads per KV head splits each
/// block's K and V tiles over a pair of warps (9–16 query heads of one tile: a warp holding both the
/// queries and the outputs of 16 heads would need more than 128 registers).
GAAC_HOST_DEVICE constexpr bool splits_key_value(int halves, int heads) { return halves == 1 && heads == 16; }

/// Whether such a kernel's warps take blocks in pairs: one warp per half of a head of two tiles, or one for
/// K and one for V (splits_key_value).
GAAC_HOST_DEVICE constexpr bool works_in_pairs(int halves, int heads) {
  return halves == 2 || splits_key_value(halves, heads);
}

/// Byte offsets of the parts of a decode CTA's dynamic shared memory.
struct SharedLayout {
  uint32_t stages = 0;   ///< NW × STAGES stages of a warp's tiles of a block: K and V, or one of them when
                         ///< pairs split K and V (reused by the merges afterwards)
  uint32_t bars = 0;     ///< one mbarrier per tile buffer of a stage; for pairs of warps, then two per pair (one per
                         ///< block parity)
  uint32_t exchange = 0; ///< pairs of warps: each warp's half (or the key warp's whole) of a block's scores, for two blocks
  uint32_t warp_merge = 0; ///< the units' softmax states and outputs at the end: the stage region, or, when pairs
                           ///< split K and V, a region of its own (value warps publish while key warps may still read)
  uint32_t entries = 0;  ///< block-table entries of the CTA's blocks
  uint32_t bases = 0;    ///< per half: key b3, key b4−b3, value b3, value b4−b3 words, lane-interleaved
                         ///< (GAAC-FP8: b2 and b3−b2)
  uint32_t widening = 0; ///< FP8 sources: the BF16 value of each of the 256 codes
  uint32_t spread = 0;   ///< GAAC-FP8 sources: the spread table of the escape planes (lane_fp8.cuh)
  uint32_t flag = 0;     ///< the last-CTA flag of the final merge
  uint32_t total = 0;
};

/// The shared-memory layout of a CTA of `warps` warps with `stages` stages of tiles of `tile_stride` bytes
/// and up to `blocks` blocks, tiles of C channels, P halves (two: the warps work in pairs, one half
/// each), room for `heads` query heads per KV head (16 of one tile: pairs too, splits_key_value).
GAAC_HOST_DEVICE constexpr SharedLayout shared_memory_layout(int channels, int halves, int heads, TileSource source, int warps,
                                                       int stages, uint32_t tile_stride, int blocks) {
  const auto align16 = [](uint32_t x) { return (x + 15u) & ~15u; };
  const uint32_t tiles = 2u * static_cast<uint32_t>(halves);
  const uint32_t head_dim = static_cast<uint32_t>(channels * halves);
  const uint32_t h = static_cast<uint32_t>(heads);
  const bool split_kv = splits_key_value(halves, heads);
  const bool paired = works_in_pairs(halves, heads);
  const uint32_t stage_bytes = static_cast<uint32_t>(warps * stages) * (split_kv ? 1u : 2u) * tile_stride;
  const uint32_t units = static_cast<uint32_t>(paired ? warps / 2 : warps);  // warps, or pairs of warps
  const uint32_t warp_merge = units * h * (2u + head_dim) * 4u;
  const uint32_t split_merge = h * 64u * 4u + h * 2u * 4u;  // weights of up to 64 partials per head, M and L
  const uint32_t overlaid = split_kv ? 0u : warp_merge;     // what the stage region is reused for, besides split_merge
  SharedLayout layout;
  layout.stages = 0;
  const uint32_t region = align16(stage_bytes > overlaid ? (stage_bytes > split_merge ? stage_bytes : split_merge)
                                                         : (overlaid > split_merge ? overlaid : split_merge));
  layout.bars = region;
  const uint32_t pair_bars = paired ? static_cast<uint32_t>(warps) : 0u;  // two for each of warps / 2 pairs
  const uint32_t warp_tiles = split_kv ? 1u : 2u;
  const uint32_t tile_bars =  // one per copy slot
      static_cast<uint32_t>(warps * stages) * warp_tiles / static_cast<uint32_t>(tiles_per_copy_slot(source, static_cast<int>(warp_tiles)));
  layout.exchange = layout.bars + (tile_bars + pair_bars) * 8u;
  // Per warp: two blocks × 32 lanes × (heads / 8) column blocks × 4 floats.
  const uint32_t exchange = paired ? static_cast<uint32_t>(warps) * 2u * 32u * (h / 8u) * 16u : 0u;
  layout.exchange = align16(layout.exchange);
  layout.entries = layout.exchange + exchange;
  layout.bases = align16(layout.entries + static_cast<uint32_t>(blocks) * tiles * 4u);
  const uint32_t base_words = is_compressed(source)
                                  ? static_cast<uint32_t>(halves) * 2u * static_cast<uint32_t>(channels / 16 + channels / 8)
                                  : 0u;
  layout.widening = layout.bases + base_words * 32u * 4u;
  layout.spread = layout.widening + (is_fp8(source) ? 512u : 0u);
  layout.flag = layout.spread + (is_fp8(source) && is_compressed(source) ? 1024u : 0u);
  layout.warp_merge = split_kv ? layout.flag + 16u : layout.stages;
  layout.total = split_kv ? layout.warp_merge + warp_merge : layout.flag + 16u;
  return layout;
}

}  // namespace gaac::cuda::detail
