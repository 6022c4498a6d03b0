// Decompression on the device. decompress(): every tile of a batch's blocks in one layer rebuilt as
// a raw BF16 tile, so the BF16 twin can run on the result (decompress-first). decompress_dense():
// every token of a batch's sequences, any layers, written where the caller's layout says. One warp
// per tile in both: the same per-lane decoder as the fused kernel, the tile assembled row-major in
// shared memory, then written with 16-byte stores.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <string>

#include "cuda/check.hpp"
#include "cuda/lane_decode.cuh"
#include "cuda/warp.cuh"
#include "gaac/cuda.hpp"
#include "gaac/error.hpp"

namespace gaac::cuda {
namespace {

constexpr int kWarps = 4;

struct DecompressArgs {
  PagedGeometry src;  ///< compressed cache
  const uint8_t* units = nullptr;
  const uint32_t* entries = nullptr;
  const uint8_t* bases = nullptr;
  int layer = 0;
  PagedGeometry dst;  ///< one-layer BF16 cache, one unit per entry
  uint8_t* dst_units = nullptr;
  uint32_t* dst_entries = nullptr;
  const uint32_t* rows = nullptr;  ///< the batch's block rows
  int total_rows = 0;
};

/// Rebuilds one compressed tile into `tile` (row-major, 16 × C BF16, shared memory).
template <int C, bool Key>
__device__ void decode_tile_to_rows(const uint8_t* slot, const uint8_t* b3, const uint8_t* b4, int lane, uint16_t* tile) {
  using S = lane::SlotShape<C>;
  constexpr int kWords = lane::kBaseWords<C, Key>;
  lane::LaneSlot<C> s;
  lane::load_lane_slot<C>(slot, lane, s);
  const uint32_t offset = detail::warp_exclusive_scan(lane::escape_bytes_of_lane(s.tags), lane);
  uint32_t w3[kWords], dl[kWords];
#pragma unroll
  for (int w = 0; w < kWords; ++w) {
    w3[w] = lane::base_word<C, Key>(b3, lane, w);
    dl[w] = lane::base_word<C, Key>(b4, lane, w) - w3[w];
  }
  uint32_t exponents[S::kQuads];
  const auto base3_at = [&](int w) { return lane::base_word<C, Key>(b3, lane, w); };
  lane::lane_exponents<C, Key, lane::EscapePath::wide>(s, slot + S::kEscapeOffset, offset, w3, dl, base3_at, exponents);
  const int g = lane / 4, t = lane % 4;
#pragma unroll
  for (int q = 0; q < S::kQuads; ++q) {
    uint32_t r0, r1;
    lane::compose(s.sm[q], exponents[q], r0, r1);
    if (Key) {
      // Quad h·(C/16) + s: token 8h + g, channels 16s + 2t + {0, 1} (r0) and + {8, 9} (r1).
      const int token = 8 * (q / (C / 16)) + g, channel = 16 * (q % (C / 16)) + 2 * t;
      *reinterpret_cast<uint32_t*>(tile + token * C + channel) = r0;
      *reinterpret_cast<uint32_t*>(tile + token * C + channel + 8) = r1;
    } else {
      // Quad c: channel 8c + g, tokens 2t, 2t+1 (r0) and 2t+8, 2t+9 (r1).
      const int channel = 8 * q + g;
      tile[(2 * t) * C + channel] = static_cast<uint16_t>(r0);
      tile[(2 * t + 1) * C + channel] = static_cast<uint16_t>(r0 >> 16);
      tile[(2 * t + 8) * C + channel] = static_cast<uint16_t>(r1);
      tile[(2 * t + 9) * C + channel] = static_cast<uint16_t>(r1 >> 16);
    }
  }
}

/// Brings the tile of `entry` (compressed or raw) to `tile` (row-major, 16 × C BF16, shared memory).
template <int C>
__device__ void stage_tile(const PagedGeometry& geo, const uint8_t* units, uint32_t entry, TensorKind kind,
                           const uint8_t* b3, const uint8_t* b4, int lane, uint16_t* tile) {
  const uint8_t* first = units + geo.unit_offset(entry_unit(entry));
  constexpr int kVectors = 16 * C * 2 / 16;  // 16-byte pieces of a raw tile
  if (entry_class(entry) == TileClass::raw) {
    const uint8_t* second =
        geo.raw_split() ? units + geo.unit_offset(*reinterpret_cast<const uint32_t*>(first + geo.partner_offset())) : first + 16 * C;
    for (int v = lane; v < kVectors; v += 32) {
      const uint8_t* src = v < kVectors / 2 ? first + 16 * v : second + 16 * (v - kVectors / 2);
      reinterpret_cast<uint4*>(tile)[v] = *reinterpret_cast<const uint4*>(src);
    }
  } else if (kind == TensorKind::key) {
    decode_tile_to_rows<C, true>(first, b3, b4, lane, tile);
  } else {
    decode_tile_to_rows<C, false>(first, b3, b4, lane, tile);
  }
  __syncwarp();
}

template <int C, int P>
__global__ void __launch_bounds__(kWarps * 32) decompress_kernel(const DecompressArgs a) {
  constexpr int kTiles = 2 * P;
  __shared__ __align__(16) uint16_t tiles[kWarps][16 * C];
  const int warp = static_cast<int>(threadIdx.x) / 32, lane = static_cast<int>(threadIdx.x) % 32;
  const long long id = static_cast<long long>(blockIdx.x) * kWarps + warp;
  const int kv = a.src.kv_heads;
  if (id >= static_cast<long long>(a.total_rows) * kv * kTiles) return;
  const int j = static_cast<int>(id % kTiles), head = static_cast<int>((id / kTiles) % kv);
  const uint32_t row = a.rows[id / kTiles / kv];
  if (row == kNoRow) return;
  const TensorKind kind = j < P ? TensorKind::key : TensorKind::value;
  const int half = j % P;
  const uint32_t entry = a.entries[a.src.entry_index(a.layer, row, head, kind, half)];
  const size_t out_index = a.dst.entry_index(0, row, head, kind, half);
  const TileClass cls = entry_class(entry);
  if (cls != TileClass::compressed && cls != TileClass::raw) {
    if (lane == 0) a.dst_entries[out_index] = kAbsentEntry;
    return;
  }
  const uint8_t* b3 = a.bases + a.src.bases_index(a.layer, kind, 0, head) + half * C;
  const uint8_t* b4 = a.bases + a.src.bases_index(a.layer, kind, 1, head) + half * C;
  stage_tile<C>(a.src, a.units, entry, kind, b3, b4, lane, tiles[warp]);
  uint4* dst = reinterpret_cast<uint4*>(a.dst_units + a.dst.unit_offset(static_cast<uint32_t>(out_index)));
  for (int v = lane; v < 16 * C * 2 / 16; v += 32) dst[v] = reinterpret_cast<const uint4*>(tiles[warp])[v];
  if (lane == 0) a.dst_entries[out_index] = make_entry(TileClass::raw, static_cast<uint32_t>(out_index));
}

struct DenseArgs {
  PagedGeometry geo;
  const uint8_t* units = nullptr;
  const uint32_t* entries = nullptr;
  const uint8_t* bases = nullptr;
  SequenceTableView seqs;
  int first_layer = 0, layers = 0;
  DenseLayout out;
};

/// One warp per tile of (sequence blockIdx.y, block, layer, head, K/V, half): the tile staged in
/// shared memory, then its rows written with 16-byte stores.
template <int C, int P>
__global__ void __launch_bounds__(kWarps * 32) decompress_dense_kernel(const DenseArgs a) {
  constexpr int kTiles = 2 * P;
  __shared__ __align__(16) uint16_t tiles[kWarps][16 * C];
  const int warp = static_cast<int>(threadIdx.x) / 32, lane = static_cast<int>(threadIdx.x) % 32;
  const int s = static_cast<int>(blockIdx.y);
  const long long id = static_cast<long long>(blockIdx.x) * kWarps + warp;
  const int kv = a.geo.kv_heads;
  const int j = static_cast<int>(id % kTiles), head = static_cast<int>((id / kTiles) % kv);
  const int layer = a.first_layer + static_cast<int>((id / kTiles / kv) % a.layers);
  const long long block = id / kTiles / kv / a.layers;
  const int first = a.seqs.indptr[s];
  if (block >= a.seqs.indptr[s + 1] - first) return;
  const uint32_t row = a.seqs.rows[first + block];
  if (row == kNoRow) return;
  const TensorKind kind = j < P ? TensorKind::key : TensorKind::value;
  const int half = j % P;
  const uint32_t entry = a.entries[a.geo.entry_index(layer, row, head, kind, half)];
  const TileClass cls = entry_class(entry);
  if (cls != TileClass::compressed && cls != TileClass::raw) return;
  const uint8_t* b3 = a.bases ? a.bases + a.geo.bases_index(layer, kind, 0, head) + half * C : nullptr;
  const uint8_t* b4 = a.bases ? a.bases + a.geo.bases_index(layer, kind, 1, head) + half * C : nullptr;
  stage_tile<C>(a.geo, a.units, entry, kind, b3, b4, lane, tiles[warp]);
  const long long rows = min(static_cast<long long>(kTileTokens), a.seqs.lengths[s] - block * kTileTokens);
  uint16_t* base = (kind == TensorKind::key ? a.out.k : a.out.v) + layer * a.out.layer_stride +
                   head * a.out.head_stride + half * C;
  base += a.out.paged ? static_cast<long long>(row) * a.out.outer_stride
                      : s * a.out.outer_stride + block * kTileTokens * a.out.token_stride;
  constexpr int kPieces = C * 2 / 16;  // 16-byte pieces per row
  for (int v = lane; v < rows * kPieces; v += 32) {
    const int t = v / kPieces, piece = v % kPieces;
    *reinterpret_cast<uint4*>(base + t * a.out.token_stride + piece * 8) = reinterpret_cast<const uint4*>(tiles[warp])[v];
  }
}

}  // namespace

void decompress(const DeviceCache& compressed, const DeviceSequences& sequences, int layer, DeviceCache& bf16,
                Stream stream) {
  const PagedGeometry& src = compressed.view().geometry;
  const PagedGeometry& dst = bf16.view().geometry;
  if (!compressed.compressed() || bf16.compressed()) throw Error("decompress: needs a compressed source and a BF16 target");
  if (dst.kv_heads != src.kv_heads || dst.head_dim != src.head_dim || dst.row_capacity != src.row_capacity)
    throw Error("decompress: target was not made by DeviceCache::bf16_for for this cache");
  if (layer < 0 || layer >= src.layers) throw Error("decompress: layer out of range");
  DecompressArgs a;
  a.src = src;
  a.units = compressed.view().units;
  a.entries = compressed.view().entries;
  a.bases = compressed.view().bases;
  a.layer = layer;
  a.dst = dst;
  a.dst_units = bf16.units_data();
  a.dst_entries = bf16.entries_data();
  a.rows = sequences.view().rows;
  a.total_rows = sequences.total_blocks();
  const long long tiles = static_cast<long long>(a.total_rows) * src.kv_heads * 2 * src.halves();
  if (tiles == 0) return;
  const unsigned grid = static_cast<unsigned>((tiles + kWarps - 1) / kWarps);
  switch (src.head_dim) {
    case 64: decompress_kernel<64, 1><<<grid, kWarps * 32, 0, stream>>>(a); break;
    case 128: decompress_kernel<128, 1><<<grid, kWarps * 32, 0, stream>>>(a); break;
    case 256: decompress_kernel<128, 2><<<grid, kWarps * 32, 0, stream>>>(a); break;
    default: throw Error("decompress: head width " + std::to_string(src.head_dim) + " is not 64, 128 or 256");
  }
  check(cudaGetLastError(), "decompress launch");
}

void decompress_dense(const DeviceCache& cache, const DeviceSequences& sequences, int first_layer, int layers,
                      const DenseLayout& out, Stream stream) {
  const PagedGeometry& geo = cache.view().geometry;
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
  for (int s = 0; s < sequences.sequences(); ++s) longest = std::max(longest, sequences.blocks(s));
  const long long tiles = static_cast<long long>(longest) * layers * geo.kv_heads * 2 * geo.halves();
  if (tiles == 0) return;
  DenseArgs a;
  a.geo = geo;
  a.units = cache.view().units;
  a.entries = cache.view().entries;
  a.bases = cache.view().bases;
  a.seqs = sequences.view();
  a.first_layer = first_layer;
  a.layers = layers;
  a.out = out;
  const dim3 grid(static_cast<unsigned>((tiles + kWarps - 1) / kWarps), static_cast<unsigned>(sequences.sequences()));
  switch (geo.head_dim) {
    case 64: decompress_dense_kernel<64, 1><<<grid, kWarps * 32, 0, stream>>>(a); break;
    case 128: decompress_dense_kernel<128, 1><<<grid, kWarps * 32, 0, stream>>>(a); break;
    case 256: decompress_dense_kernel<128, 2><<<grid, kWarps * 32, 0, stream>>>(a); break;
    default: throw Error("decompress_dense: head width " + std::to_string(geo.head_dim) + " is not 64, 128 or 256");
  }
  check(cudaGetLastError(), "decompress_dense launch");
}

}  // namespace gaac::cuda
