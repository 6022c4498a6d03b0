// The device unit pool's bookkeeping, shared by the kernels that grow and edit sequences
// (docs/format.md, section 13): the free stack (pushes and pops never in the same kernel: a pop reads
// the slots below the count, which a push in flight may not have written yet) and the per-unit
// reference counts of tiles that forks share.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "gaac/cuda.hpp"
#include "gaac/cuda_views.hpp"

namespace gaac::cuda::detail {

/// Units per raw tile: 2 in a cache of compressed slots, 1 in a BF16 cache.
__device__ inline int raw_units(const PagedGeometry& geo) { return geo.raw_split() ? 2 : 1; }

/// Blocks that `tokens` tokens fill or start.
__host__ __device__ inline int blocks_for(int tokens) { return (tokens + kTileTokens - 1) / kTileTokens; }

/// First block a sequence whose newest token makes it `tokens` long attends in a layer of window `window`.
__device__ inline int first_kept_block(int tokens, int window) {
  return tokens > 0 ? first_attended(tokens - 1, window) / kTileTokens : 0;
}

/// The second unit of the split raw tile whose first unit is `unit`.
__device__ inline uint32_t partner_of(const DeviceCacheView& c, uint32_t unit) {
  return *reinterpret_cast<const uint32_t*>(c.units + c.geometry.unit_offset(unit) + c.geometry.partner_offset());
}

/// Pushes `unit` on the free stack.
__device__ inline void push_unit(const DeviceCacheView& c, uint32_t unit) { c.free_stack[atomicAdd(c.free_count, 1u)] = unit; }

/// Drops one entry's hold on the tile `entry` names (not absent): when it was the last, the tile's
/// units go back on the free stack.
__device__ inline void release_tile(const DeviceCacheView& c, uint32_t entry) {
  const uint32_t unit = entry_unit(entry);
  if (atomicSub(&c.refs[unit], 1u) != 1u) return;
  if (entry_class(entry) == TileClass::raw && c.geometry.raw_split()) push_unit(c, partner_of(c, unit));
  push_unit(c, unit);
}

/// Reserves `need` units of the free stack with one compare-and-swap loop (one thread): returns the
/// stack position of the first (they are free_stack[first .. first + need − 1]), or kNoRow, with
/// kOutOfUnits in the status word, when fewer are free.
__device__ inline uint32_t pop_units(const DeviceCacheView& c, uint32_t need) {
  uint32_t have = *reinterpret_cast<volatile uint32_t*>(c.free_count);
  while (have >= need) {
    const uint32_t seen = atomicCAS(c.free_count, have, have - need);
    if (seen == have) return have - need;
    have = seen;
  }
  atomicOr(c.status, CacheMemory::kOutOfUnits);
  return kNoRow;
}

/// Where row `token` of a raw tile whose first unit is `unit` lies (the second unit holds tokens 8..15
/// of a split tile).
__device__ inline uint8_t* raw_row(const DeviceCacheView& c, uint32_t unit, int token) {
  const PagedGeometry& geo = c.geometry;
  const size_t row_bytes = static_cast<size_t>(geo.tile_channels()) * 2;
  if (geo.raw_split() && token >= kTileTokens / 2) return c.units + geo.unit_offset(partner_of(c, unit)) + (token - kTileTokens / 2) * row_bytes;
  return c.units + geo.unit_offset(unit) + token * row_bytes;
}

}  // namespace gaac::cuda::detail
