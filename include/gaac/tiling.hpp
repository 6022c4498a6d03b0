// How a cached tensor splits into tiles: full 16-token blocks × KV heads × 128-channel halves.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>

#include "gaac/format.hpp"
#include "gaac/kv_dump.hpp"

namespace gaac {

/// The tile shape of a tensor kind with the given head width (64 → 64 channels, 128 and 256 → 128).
constexpr TileShape tile_shape_for(TensorKind kind, int head_dim) {
  return {kind, std::min(head_dim, kMaxTileChannels)};
}

/// Tiles across one head: 1, or 2 half-heads for head_dim 256.
constexpr int tiles_per_head(int head_dim) { return head_dim > kMaxTileChannels ? head_dim / kMaxTileChannels : 1; }

/// Complete 16-token blocks in `tokens` tokens; the rest forms the raw tail.
constexpr int full_blocks(int tokens) { return tokens / kTileTokens; }

/// Tiles in the complete blocks of a tensor, in storage order (block, then head, then half).
constexpr size_t tile_count(const KvTensor& t) {
  return static_cast<size_t>(full_blocks(t.tokens)) * t.kv_heads * tiles_per_head(t.head_dim);
}

/// Position of tile `index` (storage order) of a tensor.
struct TilePosition {
  int block;
  int head;
  int half;
};

/// Inverse of the storage order: which block, head and half tile `index` covers.
constexpr TilePosition tile_position(const KvTensor& t, size_t index) {
  const auto per_head = static_cast<size_t>(tiles_per_head(t.head_dim));
  const auto per_block = per_head * static_cast<size_t>(t.kv_heads);
  return {static_cast<int>(index / per_block), static_cast<int>(index % per_block / per_head),
          static_cast<int>(index % per_head)};
}

/// Distance in elements between consecutive tokens of a tensor.
constexpr size_t token_stride(const KvTensor& t) { return static_cast<size_t>(t.kv_heads) * t.head_dim; }

/// Offset (in elements) of a tile's token 0, channel 0 inside the tensor's data.
constexpr size_t tile_origin(const KvTensor& t, TilePosition p) {
  return static_cast<size_t>(p.block) * kTileTokens * token_stride(t) + static_cast<size_t>(p.head) * t.head_dim +
         static_cast<size_t>(p.half) * kMaxTileChannels;
}

}  // namespace gaac
