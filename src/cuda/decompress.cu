// Decompress-first: every tile of a batch's blocks in one layer rebuilt as a raw BF16 tile, so the
// BF16 twin can run on the result. One warp per tile: the same per-lane decoder as the fused kernel,
// the tile assembled row-major in shared memory, then written with 16-byte stores.
#include <cuda_runtime.h>

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
  uint4* dst = reinterpret_cast<uint4*>(a.dst_units + a.dst.unit_offset(static_cast<uint32_t>(out_index)));
  const uint8_t* first = a.units + a.src.unit_offset(entry_unit(entry));
  constexpr int kVectors = 16 * C * 2 / 16;  // 16-byte pieces of a raw tile
  if (cls == TileClass::raw) {
    const uint8_t* second =
        a.src.raw_split() ? a.units + a.src.unit_offset(*reinterpret_cast<const uint32_t*>(first + 16 * C)) : first + 16 * C;
    for (int v = lane; v < kVectors; v += 32) {
      const uint8_t* src = v < kVectors / 2 ? first + 16 * v : second + 16 * (v - kVectors / 2);
      dst[v] = *reinterpret_cast<const uint4*>(src);
    }
  } else {
    uint16_t* tile = tiles[warp];
    const uint8_t* b3 = a.bases + a.src.bases_index(a.layer, kind, 0, head) + half * C;
    const uint8_t* b4 = a.bases + a.src.bases_index(a.layer, kind, 1, head) + half * C;
    if (kind == TensorKind::key) decode_tile_to_rows<C, true>(first, b3, b4, lane, tile);
    else decode_tile_to_rows<C, false>(first, b3, b4, lane, tile);
    __syncwarp();
    for (int v = lane; v < kVectors; v += 32) dst[v] = reinterpret_cast<const uint4*>(tile)[v];
  }
  if (lane == 0) a.dst_entries[out_index] = make_entry(TileClass::raw, static_cast<uint32_t>(out_index));
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

}  // namespace gaac::cuda
