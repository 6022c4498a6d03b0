// Sequences that grow on the device (docs/format.md, section 13): opening tails from the free stack,
// releasing the blocks a sliding window leaves behind, writing new K/V rows into the tails, and
// finalizing the blocks a step completes, each sequence by its own real tokens (pads never stored).
// Every kernel finds its work from the device lengths and the forward's counts (none when every token
// is real), so a decode step made of them can be captured once in a CUDA graph and replayed while the
// sequences grow.
#include <cuda_runtime.h>

#include <algorithm>
#include <string>

#include "cuda/check.hpp"
#include "cuda/unit_pool.cuh"
#include "gaac/cuda.hpp"
#include "gaac/error.hpp"

namespace gaac::cuda {
namespace {

using detail::blocks_for;
using detail::first_kept_block;
using detail::raw_units;

constexpr int kThreads = 128;

/// What the growth kernels read and write.
struct GrowArgs {
  DeviceCacheView cache;
  DeviceBatchView batch;
  DeviceForwardView forward;
};

/// Real tokens sequence `seq` adds in the forward.
__device__ int count_of(const DeviceForwardView& f, int seq) { return f.counts ? f.counts[seq] : f.tokens; }

/// Rank of token j of sequence `seq` among its real ones (−1: a pad).
__device__ int rank_of(const DeviceForwardView& f, int seq, int j) { return f.ranks ? f.ranks[seq * f.tokens + j] : j; }

/// The length whose newest token's windows sequence `seq` keeps once the forward has begun (see
/// DeviceForwardView::held); BatchTable::note_begin computes the same on the host.
__device__ int held_after(const DeviceForwardView& f, int seq, int old_len) {
  const int count = count_of(f, seq);
  const int keep = f.unattended ? old_len + count : old_len + (count > 0 ? 1 : 0);
  return max(f.held[seq], keep);
}

/// One CTA per (sequence, layer): drops the tiles of the blocks this forward's first query no longer
/// sees (for an unattended forward: its newest one).
__global__ void __launch_bounds__(kThreads) release_kernel(const GrowArgs a) {
  const int seq = static_cast<int>(blockIdx.x), layer = static_cast<int>(blockIdx.y);
  const PagedGeometry& geo = a.cache.geometry;
  const int window = a.cache.windows[layer];
  if (window == 0) return;
  const int old_len = a.batch.lengths[seq];
  const int begin = first_kept_block(a.forward.held[seq], window);
  const int end = min(first_kept_block(held_after(a.forward, seq, old_len), window), blocks_for(old_len));
  const int tiles = geo.entries_per_layer_row();
  for (int i = static_cast<int>(threadIdx.x); i < (end - begin) * tiles; i += kThreads) {
    const uint32_t row = a.batch.rows[a.batch.indptr[seq] + begin + i / tiles];
    if (row == kNoRow) continue;
    uint32_t& entry = a.cache.entries[geo.entry_index(layer, row, 0, TensorKind::key, 0) + i % tiles];
    if (entry_class(entry) == TileClass::absent) continue;
    detail::release_tile(a.cache, entry);
    entry = kAbsentEntry;
  }
}

/// One CTA per (sequence, layer, new block): pops the units of the block's tiles in the layer, zeroes
/// them, links split raw tiles and writes their entries (raw).
__global__ void __launch_bounds__(kThreads) open_kernel(const GrowArgs a) {
  __shared__ uint32_t first_unit;
  const int seq = static_cast<int>(blockIdx.x), layer = static_cast<int>(blockIdx.y);
  const PagedGeometry& geo = a.cache.geometry;
  const int old_len = a.batch.lengths[seq], new_len = old_len + count_of(a.forward, seq);
  const int block = blocks_for(old_len) + static_cast<int>(blockIdx.z);
  if (block >= blocks_for(new_len)) return;
  const int window = a.cache.windows[layer];
  if (window > 0 && block < first_kept_block(held_after(a.forward, seq, old_len), window)) return;  // out of the window
  const uint32_t row = a.batch.rows[a.batch.indptr[seq] + block];
  const int tiles = geo.entries_per_layer_row();
  const int per_tile = raw_units(geo);
  const uint32_t need = static_cast<uint32_t>(tiles * per_tile);
  if (threadIdx.x == 0) first_unit = detail::pop_units(a.cache, need);
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
    a.cache.refs[unit] = 1;
    entries[t] = make_entry(TileClass::raw, unit);
  }
}

/// Per sequence: the held length, then the length, grown by the forward's real tokens.
__global__ void grow_lengths_kernel(const GrowArgs a) {
  const int s = static_cast<int>(blockIdx.x * blockDim.x + threadIdx.x);
  if (s >= a.batch.sequences) return;
  const int old_len = a.batch.lengths[s];
  a.forward.held[s] = held_after(a.forward, s, old_len);
  a.batch.lengths[s] = old_len + count_of(a.forward, s);
}

/// What write_kernel reads.
struct WriteArgs {
  DeviceCacheView cache;
  DeviceBatchView batch;
  DeviceForwardView forward;
  int layer = 0;
  TokenRows src;
};

/// One CTA per (token, sequence): 16 bytes of one row of K or V per thread, into the tile that holds it
/// (nothing for a pad).
__global__ void __launch_bounds__(kThreads) write_kernel(const WriteArgs a) {
  const int j = static_cast<int>(blockIdx.x), seq = static_cast<int>(blockIdx.y);
  const int rank = rank_of(a.forward, seq, j);
  if (rank < 0) return;
  const PagedGeometry& geo = a.cache.geometry;
  const int position = a.batch.lengths[seq] - count_of(a.forward, seq) + rank;
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
    const uint16_t* from = (kind == 0 ? a.src.k : a.src.v) + seq * a.src.sequence_stride + head * a.src.head_stride +
                           j * a.src.token_stride + channel;
    uint4* to = reinterpret_cast<uint4*>(detail::raw_row(a.cache, entry_unit(entry), t) + (channel % c) * 2);
    *to = *reinterpret_cast<const uint4*>(from);
  }
}

/// Per sequence, the rows of the blocks the forward's real tokens completed (k slots, kNoRow beyond).
__global__ void completed_rows_kernel(const DeviceBatchView batch, const DeviceForwardView forward, int k, uint32_t* out) {
  const int i = static_cast<int>(blockIdx.x * blockDim.x + threadIdx.x);
  if (i >= batch.sequences * k) return;
  const int seq = i / k, j = i % k;
  const int new_len = batch.lengths[seq], old_len = new_len - count_of(forward, seq);
  const int block = old_len / kTileTokens + j;
  out[i] = block < new_len / kTileTokens ? batch.rows[batch.indptr[seq] + block] : kNoRow;
}

}  // namespace

void begin_tokens(CacheMemory& cache, BatchTable& batch, int count, Stream stream) {
  begin_tokens(cache, batch, count, {}, false, stream);
}

void begin_tokens(CacheMemory& cache, BatchTable& batch, int tokens, std::span<const uint8_t> valid, bool attended,
                  Stream stream) {
  cache.require_bf16("begin_tokens");
  if (batch.scratch_rows() == nullptr)
    throw Error("begin_tokens: needs a batch made by BatchTable::reserve");
  const bool pads = std::find(valid.begin(), valid.end(), 0) != valid.end();
  if (pads) {
    cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
    check(cudaStreamIsCapturing(stream, &status), "cudaStreamIsCapturing");
    if (status != cudaStreamCaptureStatusNone)
      throw Error("begin_tokens: a forward with pad tokens cannot be captured in a CUDA graph (its counts are copied "
                  "from the host); capture decoding steps, whose tokens are all real");
  }
  batch.note_begin(tokens, valid, attended);  // throws before anything is launched
  if (pads) batch.upload_forward(stream);
  const GrowArgs a{cache.view(), batch.view(), batch.forward_view()};
  const auto n = static_cast<unsigned>(batch.sequences());
  const auto layers = static_cast<unsigned>(cache.geometry().layers);
  const bool windows = std::any_of(cache.windows().begin(), cache.windows().end(), [](int w) { return w > 0; });
  if (windows) release_kernel<<<dim3(n, layers), kThreads, 0, stream>>>(a);
  // A forward of `tokens` tokens starts at most tokens/16 + 1 blocks of a sequence.
  const auto opened = static_cast<unsigned>(tokens / kTileTokens + 1);
  open_kernel<<<dim3(n, layers, opened), kThreads, 0, stream>>>(a);
  grow_lengths_kernel<<<(n + 127) / 128, 128, 0, stream>>>(a);
  check(cudaGetLastError(), "begin_tokens launch");
}

void write_tokens(CacheMemory& cache, const BatchTable& batch, int layer, const TokenRows& rows, Stream stream) {
  cache.require_bf16("write_tokens");
  const PagedGeometry& geo = cache.geometry();
  if (layer < 0 || layer >= geo.layers) throw Error("write_tokens: layer " + std::to_string(layer) + " out of range");
  if (batch.last_count() < 1) throw Error("write_tokens: no begin_tokens before it");
  const auto aligned = [](const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; };
  if (!aligned(rows.k) || !aligned(rows.v) || rows.sequence_stride % 8 || rows.head_stride % 8 || rows.token_stride % 8)
    throw Error("write_tokens: K and V need 16-byte aligned rows (strides that are multiples of 8 elements)");
  const WriteArgs a{cache.view(), batch.view(), batch.forward_view(), layer, rows};
  write_kernel<<<dim3(static_cast<unsigned>(batch.last_count()), static_cast<unsigned>(batch.sequences())), kThreads, 0,
                 stream>>>(a);
  check(cudaGetLastError(), "write_tokens launch");
}

void finalize_completed(CacheMemory& cache, BatchTable& batch, Stream stream) {
  if (!cache.compressed() || batch.last_count() < 1) return;
  const int count = batch.last_count();
  const int k = count / kTileTokens + 1;
  const int slots = batch.sequences() * k;
  completed_rows_kernel<<<(slots + 127) / 128, 128, 0, stream>>>(batch.view(), batch.forward_view(), k,
                                                                  batch.scratch_rows());
  check(cudaGetLastError(), "finalize_completed launch");
  finalize_blocks(cache, batch.scratch_rows(), slots, 0, cache.geometry().layers, stream);
}

}  // namespace gaac::cuda
