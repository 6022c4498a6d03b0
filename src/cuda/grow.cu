// Sequences that grow on the device (docs/format.md, section 13): opening tails from the free stack,
// releasing the blocks a sliding window leaves behind, writing new K/V rows into the tails, and
// finalizing the blocks a step completes. Every kernel finds its work from the device lengths, so a
// decode step made of them can be captured once in a CUDA graph and replayed while the sequences grow.
#include <cuda_runtime.h>

#include <algorithm>
#include <string>

#include "cuda/check.hpp"
#include "gaac/cuda.hpp"
#include "gaac/error.hpp"

namespace gaac::cuda {
namespace {

constexpr int kThreads = 128;

/// What the growth kernels read and write.
struct GrowArgs {
  DeviceCacheView cache;
  DeviceBatchView batch;
  int count = 0;  ///< tokens the step adds to every sequence
};

/// Units per raw tile: 2 in a cache of compressed slots, 1 in a BF16 cache.
__device__ int raw_units(const PagedGeometry& geo) { return geo.raw_split() ? 2 : 1; }

__device__ int blocks_for(int tokens) { return (tokens + kTileTokens - 1) / kTileTokens; }

/// First block a sequence of `tokens` tokens still attends in a layer with window `window`.
__device__ int first_kept_block(int tokens, int window) {
  return tokens > 0 ? first_attended(tokens - 1, window) / kTileTokens : 0;
}

/// Pushes `unit` on the free stack.
__device__ void push_unit(const DeviceCacheView& c, uint32_t unit) { c.free_stack[atomicAdd(c.free_count, 1u)] = unit; }

/// One CTA per (sequence, layer): frees the tiles of the blocks this step's newest token no longer sees.
__global__ void __launch_bounds__(kThreads) release_kernel(const GrowArgs a) {
  const int seq = static_cast<int>(blockIdx.x), layer = static_cast<int>(blockIdx.y);
  const PagedGeometry& geo = a.cache.geometry;
  const int window = a.cache.windows[layer];
  if (window == 0) return;
  const int old_len = a.batch.lengths[seq], new_len = old_len + a.count;
  const int begin = first_kept_block(old_len, window);
  const int end = min(first_kept_block(new_len, window), blocks_for(old_len));
  const int tiles = geo.entries_per_layer_row();
  for (int i = static_cast<int>(threadIdx.x); i < (end - begin) * tiles; i += kThreads) {
    const uint32_t row = a.batch.rows[a.batch.indptr[seq] + begin + i / tiles];
    if (row == kNoRow) continue;
    uint32_t& entry = a.cache.entries[geo.entry_index(layer, row, 0, TensorKind::key, 0) + i % tiles];
    const TileClass cls = entry_class(entry);
    if (cls == TileClass::absent) continue;
    const uint32_t unit = entry_unit(entry);
    if (cls == TileClass::raw && geo.raw_split())
      push_unit(a.cache, *reinterpret_cast<const uint32_t*>(a.cache.units + geo.unit_offset(unit) + geo.partner_offset()));
    push_unit(a.cache, unit);
    entry = kAbsentEntry;
  }
}

/// One CTA per (sequence, layer, new block): pops the units of the block's tiles in the layer, zeroes
/// them, links split raw tiles and writes their entries (raw).
__global__ void __launch_bounds__(kThreads) open_kernel(const GrowArgs a) {
  __shared__ uint32_t first_unit;
  const int seq = static_cast<int>(blockIdx.x), layer = static_cast<int>(blockIdx.y);
  const PagedGeometry& geo = a.cache.geometry;
  const int old_len = a.batch.lengths[seq], new_len = old_len + a.count;
  const int block = blocks_for(old_len) + static_cast<int>(blockIdx.z);
  if (block >= blocks_for(new_len)) return;
  const int window = a.cache.windows[layer];
  if (window > 0 && block < first_kept_block(new_len, window)) return;  // out of the window already
  const uint32_t row = a.batch.rows[a.batch.indptr[seq] + block];
  const int tiles = geo.entries_per_layer_row();
  const int per_tile = raw_units(geo);
  const uint32_t need = static_cast<uint32_t>(tiles * per_tile);
  if (threadIdx.x == 0) {
    uint32_t have = *reinterpret_cast<volatile uint32_t*>(a.cache.free_count);
    first_unit = kNoRow;
    while (have >= need) {
      const uint32_t seen = atomicCAS(a.cache.free_count, have, have - need);
      if (seen == have) {
        first_unit = have - need;  // stack positions first_unit .. have - 1
        break;
      }
      have = seen;
    }
    if (first_unit == kNoRow) atomicOr(a.cache.status, CacheMemory::kOutOfUnits);
  }
  __syncthreads();
  if (first_unit == kNoRow) return;
  const uint32_t* popped = a.cache.free_stack + first_unit;
  // Zero every unit (16 bytes a thread at a time), then link and enter the tiles.
  const uint32_t words = geo.unit_bytes / 16;
  for (uint32_t i = threadIdx.x; i < need * words; i += kThreads) {
    uint4* unit = reinterpret_cast<uint4*>(a.cache.units + geo.unit_offset(popped[i / words]));
    unit[i % words] = make_uint4(0, 0, 0, 0);
  }
  __syncthreads();
  uint32_t* entries = a.cache.entries + geo.entry_index(layer, row, 0, TensorKind::key, 0);
  for (int t = static_cast<int>(threadIdx.x); t < tiles; t += kThreads) {
    const uint32_t unit = popped[t * per_tile];
    if (per_tile == 2)
      *reinterpret_cast<uint32_t*>(a.cache.units + geo.unit_offset(unit) + geo.partner_offset()) = popped[t * 2 + 1];
    entries[t] = make_entry(TileClass::raw, unit);
  }
}

__global__ void grow_lengths_kernel(int32_t* lengths, int sequences, int count) {
  const int s = static_cast<int>(blockIdx.x * blockDim.x + threadIdx.x);
  if (s < sequences) lengths[s] += count;
}

/// What write_kernel reads.
struct WriteArgs {
  DeviceCacheView cache;
  DeviceBatchView batch;
  int layer = 0, count = 0;
  TokenRows src;
};

/// One CTA per (token, sequence): 16 bytes of one row of K or V per thread, into the tile that holds it.
__global__ void __launch_bounds__(kThreads) write_kernel(const WriteArgs a) {
  const int j = static_cast<int>(blockIdx.x), seq = static_cast<int>(blockIdx.y);
  const PagedGeometry& geo = a.cache.geometry;
  const int position = a.batch.lengths[seq] - a.count + j;
  const uint32_t row = a.batch.rows[a.batch.indptr[seq] + position / kTileTokens];
  const int t = position % kTileTokens;
  const int d = geo.head_dim, c = geo.tile_channels();
  const int per_kind = geo.kv_heads * d / 8;  // 16-byte pieces of one token's K (or V)
  for (int i = static_cast<int>(threadIdx.x); i < 2 * per_kind; i += kThreads) {
    const int kind = i / per_kind, piece = i % per_kind;
    const int head = piece / (d / 8), channel = piece % (d / 8) * 8;
    const int half = channel / c;
    const uint32_t entry = a.cache.entries[geo.entry_index(a.layer, row, head, static_cast<TensorKind>(kind), half)];
    if (entry_class(entry) != TileClass::raw) continue;  // released by a window, or never opened
    const uint8_t* tile = a.cache.units + geo.unit_offset(entry_unit(entry));
    int r = t;
    if (geo.raw_split() && t >= kTileTokens / 2) {
      tile = a.cache.units + geo.unit_offset(*reinterpret_cast<const uint32_t*>(tile + geo.partner_offset()));
      r = t - kTileTokens / 2;
    }
    const uint16_t* from = (kind == 0 ? a.src.k : a.src.v) + seq * a.src.sequence_stride + head * a.src.head_stride +
                           j * a.src.token_stride + channel;
    uint4* to = reinterpret_cast<uint4*>(const_cast<uint8_t*>(tile) + (static_cast<size_t>(r) * c + channel % c) * 2);
    *to = *reinterpret_cast<const uint4*>(from);
  }
}

/// Per sequence, the rows of the blocks the last `count` tokens completed (k slots, kNoRow beyond).
__global__ void completed_rows_kernel(const DeviceBatchView batch, int count, int k, uint32_t* out) {
  const int i = static_cast<int>(blockIdx.x * blockDim.x + threadIdx.x);
  if (i >= batch.sequences * k) return;
  const int seq = i / k, j = i % k;
  const int new_len = batch.lengths[seq], old_len = new_len - count;
  const int block = old_len / kTileTokens + j;
  out[i] = block < new_len / kTileTokens ? batch.rows[batch.indptr[seq] + block] : kNoRow;
}

}  // namespace

void begin_tokens(CacheMemory& cache, BatchTable& batch, int count, Stream stream) {
  if (batch.scratch_rows() == nullptr)
    throw Error("begin_tokens: needs a batch made by BatchTable::reserve");
  batch.note_begin(count);  // throws before anything is launched
  const GrowArgs a{cache.view(), batch.view(), count};
  const auto n = static_cast<unsigned>(batch.sequences());
  const auto layers = static_cast<unsigned>(cache.geometry().layers);
  const bool windows = std::any_of(cache.windows().begin(), cache.windows().end(), [](int w) { return w > 0; });
  if (windows) release_kernel<<<dim3(n, layers), kThreads, 0, stream>>>(a);
  // A step of `count` tokens starts at most count/16 + 1 blocks of a sequence.
  const auto opened = static_cast<unsigned>(count / kTileTokens + 1);
  open_kernel<<<dim3(n, layers, opened), kThreads, 0, stream>>>(a);
  grow_lengths_kernel<<<(n + 127) / 128, 128, 0, stream>>>(batch.view().lengths, batch.sequences(), count);
  check(cudaGetLastError(), "begin_tokens launch");
}

void write_tokens(CacheMemory& cache, const BatchTable& batch, int layer, const TokenRows& rows, Stream stream) {
  const PagedGeometry& geo = cache.geometry();
  if (layer < 0 || layer >= geo.layers) throw Error("write_tokens: layer " + std::to_string(layer) + " out of range");
  if (batch.last_count() < 1) throw Error("write_tokens: no begin_tokens before it");
  const auto aligned = [](const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; };
  if (!aligned(rows.k) || !aligned(rows.v) || rows.sequence_stride % 8 || rows.head_stride % 8 || rows.token_stride % 8)
    throw Error("write_tokens: K and V need 16-byte aligned rows (strides that are multiples of 8 elements)");
  const WriteArgs a{cache.view(), batch.view(), layer, batch.last_count(), rows};
  write_kernel<<<dim3(static_cast<unsigned>(a.count), static_cast<unsigned>(batch.sequences())), kThreads, 0, stream>>>(a);
  check(cudaGetLastError(), "write_tokens launch");
}

void finalize_completed(CacheMemory& cache, BatchTable& batch, Stream stream) {
  if (!cache.compressed() || batch.last_count() < 1) return;
  const int count = batch.last_count();
  const int k = count / kTileTokens + 1;
  const int slots = batch.sequences() * k;
  completed_rows_kernel<<<(slots + 127) / 128, 128, 0, stream>>>(batch.view(), count, k, batch.scratch_rows());
  check(cudaGetLastError(), "finalize_completed launch");
  finalize_blocks(cache, batch.scratch_rows(), slots, 0, cache.geometry().layers, stream);
}

}  // namespace gaac::cuda
