// Decompression on the device. decompress(): every tile of a batch's blocks in one layer rebuilt as
// a raw BF16 tile, so the BF16 twin can run on the result (decompress-first). decompress_dense():
// every token of a batch's sequences, any layers, written where the caller's layout says.
//
// One tile loop serves both (they differ only in which tiles they take and where rows go): a warp
// loads a tile's slot (its lane parts and the whole escape slot at once, so a tile is one memory
// trip), rebuilds it with the fused kernel's per-lane decoder into shared memory and writes its rows
// with 16-byte stores; with kTilesPerWarp > 1 it loads the next tile while it rebuilds one.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <string>

#include "cuda/check.hpp"
#include "cuda/dispatch.hpp"
#include "cuda/lane_bases.hpp"
#include "cuda/lane_decode.cuh"
#include "cuda/tile_rows.cuh"
#include "cuda/warp.cuh"
#include "gaac/cuda.hpp"
#include "gaac/error.hpp"

namespace gaac::cuda {
namespace {

constexpr int kWarps = 4;
// Tiles per warp. Measured at 64K tokens (docs/performance.md, decompress versions): four tiles per
// warp with the next one in flight (v2) ran 187 µs, slower than one tile per warp with more warps
// resident (v1: 156 µs, two memory trips per tile); v3 keeps one tile per warp, in one memory trip.
constexpr int kTilesPerWarp = 1;
constexpr int kEscapePadding = 16;  // the decoder may read a few bytes past the escapes it uses

/// One tile to rebuild: where it is, what it is, and where its first `rows` rows go.
struct TileJob {
  uint32_t entry = kAbsentEntry;
  TensorKind kind = TensorKind::key;
  int layer = 0, head = 0, half = 0, rows = 0;
  uint16_t* dst = nullptr;
  int64_t dst_stride = 0;         ///< elements between rows at dst
  uint32_t* dst_entry = nullptr;  ///< the BF16 cache's entry to set (decompress-first), or null
  uint32_t dst_entry_value = 0;
};

/// What a lane holds of a compressed tile between its load and its rebuild.
template <int C, int Chunks>
struct InFlight {
  lane::LaneSlot<C> slot;
  uint4 escapes[Chunks];  ///< bytes 16·(lane + 32·k) .. + 15 of the escape slot
};

template <int C, int Chunks>
__device__ void start_tile(const DeviceCacheView& src, const TileJob& job, int lane, InFlight<C, Chunks>& f) {
  if (entry_class(job.entry) != TileClass::compressed) return;
  const uint8_t* slot = src.units + src.geometry.unit_offset(entry_unit(job.entry));
  lane::load_lane_slot<C>(slot, lane, f.slot);
  const auto capacity = static_cast<uint32_t>(src.geometry.escape_capacity());
#pragma unroll
  for (int k = 0; k < Chunks; ++k) {
    const uint32_t at = 16u * static_cast<uint32_t>(lane + 32 * k);
    f.escapes[k] = at < capacity ? *reinterpret_cast<const uint4*>(slot + lane::SlotShape<C>::kEscapeOffset + at)
                                 : make_uint4(0, 0, 0, 0);
  }
}

/// Writes rows 0 .. job.rows-1 of `tile` (rows kRow<C> elements apart) to job.dst, with streaming
/// stores: nothing will read them back before the call ends (2.5% faster than plain stores at 64K).
template <int C>
__device__ void write_rows(const TileJob& job, const uint16_t* tile, int lane) {
  constexpr int kPieces = C * 2 / 16;  // 16-byte pieces per row
  for (int v = lane; v < job.rows * kPieces; v += 32) {
    const int t = v / kPieces, piece = v % kPieces;
    __stcs(reinterpret_cast<uint4*>(job.dst + t * job.dst_stride + piece * 8),
           *reinterpret_cast<const uint4*>(tile + t * kRow<C> + piece * 8));
  }
}

template <int C, int Chunks>
__device__ void finish_tile(const DeviceCacheView& src, const TileJob& job, const InFlight<C, Chunks>& f, int lane,
                            uint16_t* tile, uint8_t* escapes) {
  const TileClass cls = entry_class(job.entry);
  if (cls != TileClass::compressed && cls != TileClass::raw) {
    if (job.dst_entry && lane == 0) *job.dst_entry = kAbsentEntry;
    return;
  }
  const uint8_t* first = src.units + src.geometry.unit_offset(entry_unit(job.entry));
  if (cls == TileClass::raw) {
    // Straight from the pool: tokens 0..7 in unit a, 8..15 in its partner (or after them, unsplit).
    const uint8_t* second = src.geometry.raw_split()
                                ? src.units + src.geometry.unit_offset(*reinterpret_cast<const uint32_t*>(first + src.geometry.partner_offset()))
                                : first + 16 * C;
    constexpr int kPieces = C * 2 / 16;
    for (int v = lane; v < job.rows * kPieces; v += 32) {
      const int t = v / kPieces, piece = v % kPieces;
      const uint8_t* from = (t < kTileTokens / 2 ? first + t * C * 2 : second + (t - kTileTokens / 2) * C * 2) + piece * 16;
      __stcs(reinterpret_cast<uint4*>(job.dst + t * job.dst_stride + piece * 8), *reinterpret_cast<const uint4*>(from));
    }
  } else {
#pragma unroll
    for (int k = 0; k < Chunks; ++k) reinterpret_cast<uint4*>(escapes)[lane + 32 * k] = f.escapes[k];
    __syncwarp();
    // The (layer, head, half) block of lane bases: key b3, key b4 − b3, value b3, value b4 − b3.
    const uint32_t* words = src.lane_bases + detail::lane_bases_index(src.geometry, job.layer, job.head) +
                            job.half * detail::lane_base_words_per_half(C);
    constexpr int kKeyWords = 32 * (C / 16), kValueWords = 32 * (C / 8);
    if (job.kind == TensorKind::key) {
      decode_tile_to_rows<C, true>(f.slot, escapes, words, words + kKeyWords, lane, tile);
    } else {
      decode_tile_to_rows<C, false>(f.slot, escapes, words + 2 * kKeyWords, words + 2 * kKeyWords + kValueWords, lane, tile);
    }
    __syncwarp();
    write_rows<C>(job, tile, lane);
    __syncwarp();  // the next tile overwrites the staging
  }
  if (job.dst_entry && lane == 0) *job.dst_entry = job.dst_entry_value;
}

/// The tile loop: warp w of CTA (x, y) rebuilds the target's tiles kTilesPerWarp·(x·kWarps + w) and
/// the next kTilesPerWarp − 1, two in flight.
template <int C, int P, int Chunks, class Target>
__global__ void __launch_bounds__(kWarps * 32) decompress_kernel(const DeviceCacheView src, const Target target) {
  __shared__ __align__(16) uint16_t tiles[kWarps][kTileTokens * kRow<C>];
  __shared__ __align__(16) uint8_t escapes[kWarps][Chunks * 512 + kEscapePadding];
  const int warp = static_cast<int>(threadIdx.x) / 32, lane = static_cast<int>(threadIdx.x) % 32;
  const long long first = (static_cast<long long>(blockIdx.x) * kWarps + warp) * kTilesPerWarp;
  TileJob jobs[2];
  InFlight<C, Chunks> flight[2];
  jobs[0] = target.template locate<C, P>(src, first);
  start_tile(src, jobs[0], lane, flight[0]);
#pragma unroll
  for (int k = 0; k < kTilesPerWarp; ++k) {
    if (k + 1 < kTilesPerWarp) {
      jobs[(k + 1) % 2] = target.template locate<C, P>(src, first + k + 1);
      start_tile(src, jobs[(k + 1) % 2], lane, flight[(k + 1) % 2]);
    }
    finish_tile(src, jobs[k % 2], flight[k % 2], lane, tiles[warp], escapes[warp]);
  }
}

/// decompress(): the tiles of one layer of a batch's block rows, into a one-layer BF16 cache with one
/// unit per entry.
struct PagedTarget {
  int layer = 0;
  DeviceCacheView dst;  ///< the one-layer BF16 cache
  const uint32_t* rows = nullptr;
  int total_rows = 0;

  template <int C, int P>
  __device__ TileJob locate(const DeviceCacheView& src, long long id) const {
    TileJob job;
    const int kv = src.geometry.kv_heads;
    if (id >= static_cast<long long>(total_rows) * kv * 2 * P) return job;
    const int j = static_cast<int>(id % (2 * P));
    job.head = static_cast<int>((id / (2 * P)) % kv);
    const uint32_t row = rows[id / (2 * P) / kv];
    if (row == kNoRow) return job;
    job.kind = j < P ? TensorKind::key : TensorKind::value;
    job.half = j % P;
    job.layer = layer;
    job.entry = src.entries[src.geometry.entry_index(layer, row, job.head, job.kind, job.half)];
    const size_t out = dst.geometry.entry_index(0, row, job.head, job.kind, job.half);
    job.dst = reinterpret_cast<uint16_t*>(dst.units + dst.geometry.unit_offset(static_cast<uint32_t>(out)));
    job.dst_stride = C;
    job.rows = kTileTokens;
    job.dst_entry = dst.entries + out;
    job.dst_entry_value = make_entry(TileClass::raw, static_cast<uint32_t>(out));
    return job;
  }
};

/// decompress_dense(): sequence blockIdx.y's blocks in layers first_layer.., into the caller's layout.
struct DenseTarget {
  DeviceBatchView seqs;
  int first_layer = 0, layers = 0;
  DenseLayout out;

  template <int C, int P>
  __device__ TileJob locate(const DeviceCacheView& src, long long id) const {
    TileJob job;
    const int s = static_cast<int>(blockIdx.y), kv = src.geometry.kv_heads;
    const int j = static_cast<int>(id % (2 * P));
    job.head = static_cast<int>((id / (2 * P)) % kv);
    job.layer = first_layer + static_cast<int>((id / (2 * P) / kv) % layers);
    const long long block = id / (2 * P) / kv / layers;
    const int begin = seqs.indptr[s];
    if (block >= seqs.indptr[s + 1] - begin) return job;
    const uint32_t row = seqs.rows[begin + block];
    if (row == kNoRow) return job;
    job.kind = j < P ? TensorKind::key : TensorKind::value;
    job.half = j % P;
    job.entry = src.entries[src.geometry.entry_index(job.layer, row, job.head, job.kind, job.half)];
    job.rows = static_cast<int>(min(static_cast<long long>(kTileTokens), seqs.lengths[s] - block * kTileTokens));
    job.dst = (job.kind == TensorKind::key ? out.k : out.v) + job.layer * out.layer_stride + job.head * out.head_stride +
              job.half * C +
              (out.paged ? static_cast<long long>(row) * out.outer_stride
                         : s * out.outer_stride + block * kTileTokens * out.token_stride);
    job.dst_stride = out.token_stride;
    return job;
  }
};

/// Launches the tile loop over `tiles` tiles (per sequence when `sequences` > 1).
template <class Target>
void launch(const DeviceCacheView& src, const Target& target, long long tiles, int sequences, cudaStream_t stream,
            const char* what) {
  if (tiles == 0) return;
  const long long per_cta = static_cast<long long>(kWarps) * kTilesPerWarp;
  const dim3 grid(static_cast<unsigned>((tiles + per_cta - 1) / per_cta), static_cast<unsigned>(sequences));
  const bool wide = src.geometry.escape_capacity() > 512;  // escape slots of more than one 16-byte piece per lane
  detail::with_head_shape(src.geometry.head_dim, what, [&]<int C, int P>() {
    if (wide) {
      decompress_kernel<C, P, 3, Target><<<grid, kWarps * 32, 0, stream>>>(src, target);
    } else {
      decompress_kernel<C, P, 1, Target><<<grid, kWarps * 32, 0, stream>>>(src, target);
    }
  });
  check(cudaGetLastError(), std::string(what) + " launch");
}

}  // namespace

void decompress(const CacheMemory& compressed, const BatchTable& batch, int layer, CacheMemory& bf16, Stream stream) {
  compressed.require_bf16("decompress");
  const PagedGeometry& src = compressed.geometry();
  const PagedGeometry& dst = bf16.geometry();
  if (!compressed.compressed() || bf16.compressed()) throw Error("decompress: needs a compressed source and a BF16 target");
  if (dst.kv_heads != src.kv_heads || dst.head_dim != src.head_dim || dst.row_capacity != src.row_capacity)
    throw Error("decompress: target was not made by CacheMemory::bf16_for for this cache");
  if (layer < 0 || layer >= src.layers) throw Error("decompress: layer out of range");
  PagedTarget target;
  target.layer = layer;
  target.dst = bf16.view();
  target.rows = batch.view().rows;
  target.total_rows = batch.total_blocks();
  launch(compressed.view(), target, static_cast<long long>(target.total_rows) * src.kv_heads * 2 * src.halves(), 1,
         stream, "decompress");
}

void decompress_dense(const CacheMemory& cache, const BatchTable& batch, int first_layer, int layers,
                      const DenseLayout& out, Stream stream) {
  cache.require_bf16("decompress_dense");
  const PagedGeometry& geo = cache.geometry();
  if (first_layer < 0 || layers < 0 || first_layer + layers > geo.layers)
    throw Error("decompress_dense: layers " + std::to_string(first_layer) + " + " + std::to_string(layers) +
                " out of range for a cache of " + std::to_string(geo.layers) + " layers");
  const auto aligned = [](const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; };
  if (!out.k || !out.v || !aligned(out.k) || !aligned(out.v))
    throw Error("decompress_dense: the K and V outputs must be device pointers aligned to 16 bytes");
  for (const int64_t stride : {out.layer_stride, out.outer_stride, out.token_stride, out.head_stride}) {
    if (stride < 0 || stride % 8 != 0)
      throw Error("decompress_dense: strides must be non-negative multiples of 8 elements (16 bytes), got " +
                  std::to_string(stride));
  }
  int longest = 0;
  for (int s = 0; s < batch.sequences(); ++s) longest = std::max(longest, batch.blocks(s));
  DenseTarget target;
  target.seqs = batch.view();
  target.first_layer = first_layer;
  target.layers = layers;
  target.out = out;
  launch(cache.view(), target, static_cast<long long>(longest) * layers * geo.kv_heads * 2 * geo.halves(),
         batch.sequences(), stream, "decompress_dense");
}

}  // namespace gaac::cuda
