// How a cached tensor splits into tiles: full 16-token blocks × KV heads × 128-channel halves.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>

#include "gaac/format.hpp"
#include "gaac/tensor_view.hpp"

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
template <class E>
constexpr size_t tile_count(const BasicKvView<E>& t) {
  return static_cast<size_t>(full_blocks(t.tokens)) * t.heads * tiles_per_head(t.head_dim);
}

/// Position of one tile in a tensor.
struct TilePosition {
  int block;
  int head;
  int half;
};

/// Inverse of the storage order: which block, head and half tile `index` covers.
template <class E>
constexpr TilePosition tile_position(const BasicKvView<E>& t, size_t index) {
  const auto per_head = static_cast<size_t>(tiles_per_head(t.head_dim));
  const auto per_block = per_head * static_cast<size_t>(t.heads);
  return {static_cast<int>(index / per_block), static_cast<int>(index % per_block / per_head),
          static_cast<int>(index % per_head)};
}

/// Token 0, channel 0 of a tile; its rows are `t.token_stride` elements apart.
template <class E>
constexpr E* tile_origin(const BasicKvView<E>& t, TilePosition p) {
  return t.at(p.block * kTileTokens, p.head) + static_cast<size_t>(p.half) * kMaxTileChannels;
}

}  // namespace gaac
