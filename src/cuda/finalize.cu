// Finalize on the device: the open blocks a decode step completes are encoded where they lie. One
// warp per tile stages the raw tile's two units in shared memory, encodes it (lane_encode.cuh) and,
// when it fits, writes the slot over its first unit; each CTA then pushes the second units of its
// tiles that compressed on the free stack with one atomic (docs/format.md, section 13).
#include <cuda_runtime.h>

#include <string>

#include "cuda/check.hpp"
#include "cuda/dispatch.hpp"
#include "cuda/lane_encode.cuh"
#include "gaac/cuda.hpp"
#include "gaac/error.hpp"

namespace gaac::cuda {
namespace {

constexpr int kWarps = 4;
constexpr uint32_t kNothing = 0xFFFFFFFFu;

/// What finalize_kernel reads and writes: the cache, and `count` block rows of layers first_layer ...
struct FinalizeArgs {
  DeviceCacheView cache;
  const uint32_t* rows = nullptr;
  int count = 0, first_layer = 0, layers = 0;
};

/// Encodes the raw tile of `entry` in place; returns its second unit when it became a slot, else kNothing.
template <int C, int P>
__device__ uint32_t finalize_tile(const FinalizeArgs& a, long long id, uint16_t* staged, int lane) {
  constexpr int kTiles = 2 * P;
  const PagedGeometry& geo = a.cache.geometry;
  const int kv = geo.kv_heads;
  const int j = static_cast<int>(id % kTiles), head = static_cast<int>((id / kTiles) % kv);
  const int layer = a.first_layer + static_cast<int>((id / kTiles / kv) % a.layers);
  const uint32_t row = a.rows[id / kTiles / kv / a.layers];
  if (row == kNoRow) return kNothing;
  const TensorKind kind = j < P ? TensorKind::key : TensorKind::value;
  const int half = j % P;
  const size_t index = geo.entry_index(layer, row, head, kind, half);
  const uint32_t entry = a.cache.entries[index];
  if (entry_class(entry) != TileClass::raw) return kNothing;  // finalized already, or not held
  uint8_t* first = a.cache.units + geo.unit_offset(entry_unit(entry));
  const uint32_t second = *reinterpret_cast<const uint32_t*>(first + geo.partner_offset());
  lane::stage_rows<C>(reinterpret_cast<const uint16_t*>(first), C, 0, kTileTokens / 2, staged, lane);
  lane::stage_rows<C>(reinterpret_cast<const uint16_t*>(a.cache.units + geo.unit_offset(second)), C, kTileTokens / 2,
                      kTileTokens / 2, staged, lane);
  __syncwarp();
  const uint8_t* b3 = a.cache.bases + geo.bases_index(layer, kind, 0, head) + half * C;
  const uint8_t* b4 = a.cache.bases + geo.bases_index(layer, kind, 1, head) + half * C;
  const auto capacity = static_cast<uint32_t>(geo.escape_capacity());
  const uint32_t escapes = kind == TensorKind::key ? lane::encode_staged_tile<C, true>(staged, b3, b4, capacity, first, lane)
                                                   : lane::encode_staged_tile<C, false>(staged, b3, b4, capacity, first, lane);
  if (escapes > capacity) return kNothing;
  if (lane == 0) a.cache.entries[index] = make_entry(TileClass::compressed, entry_unit(entry));
  return second;
}

template <int C, int P>
__global__ void __launch_bounds__(kWarps * 32) finalize_kernel(const FinalizeArgs a) {
  __shared__ __align__(16) uint16_t staged[kWarps][kTileTokens * lane::kStagedRow<C>];
  __shared__ uint32_t released[kWarps];
  __shared__ uint32_t stack_base;
  const int warp = static_cast<int>(threadIdx.x) / 32, lane = static_cast<int>(threadIdx.x) % 32;
  const long long id = static_cast<long long>(blockIdx.x) * kWarps + warp;
  const long long tiles = static_cast<long long>(a.count) * a.layers * a.cache.geometry.kv_heads * 2 * P;
  const uint32_t second = id < tiles ? finalize_tile<C, P>(a, id, staged[warp], lane) : kNothing;
  if (lane == 0) released[warp] = second;
  __syncthreads();
  if (threadIdx.x == 0) {
    uint32_t n = 0;
    for (int w = 0; w < kWarps; ++w) n += released[w] != kNothing ? 1 : 0;
    stack_base = n > 0 ? atomicAdd(a.cache.free_count, n) : 0;
    for (int w = 0; w < kWarps; ++w) {
      if (released[w] != kNothing) a.cache.free_stack[stack_base++] = released[w];
    }
  }
}

}  // namespace

void finalize_blocks(CacheMemory& cache, const uint32_t* rows, int count, int first_layer, int layers, Stream stream) {
  cache.require_bf16("finalize_blocks");
  const PagedGeometry& geo = cache.geometry();
  if (!cache.compressed()) throw Error("finalize_blocks: a BF16 cache has nothing to finalize");
  if (count < 0 || layers < 0 || first_layer < 0 || first_layer + layers > geo.layers)
    throw Error("finalize_blocks: layers " + std::to_string(first_layer) + " + " + std::to_string(layers) +
                " or count " + std::to_string(count) + " out of range for a cache of " + std::to_string(geo.layers) +
                " layers");
  const FinalizeArgs a{cache.view(), rows, count, first_layer, layers};
  const long long tiles = static_cast<long long>(count) * layers * geo.kv_heads * 2 * geo.halves();
  if (tiles == 0) return;
  const auto grid = static_cast<unsigned>((tiles + kWarps - 1) / kWarps);
  detail::with_head_shape(geo.head_dim, "finalize_blocks", [&]<int C, int P>() {
    finalize_kernel<C, P><<<grid, kWarps * 32, 0, stream>>>(a);
  });
  check(cudaGetLastError(), "finalize_blocks launch");
}

}  // namespace gaac::cuda
