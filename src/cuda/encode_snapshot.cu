// .gaac snapshot tensor sections encoded on the device (docs/format.md, section 11). Three steps on
// one stream: every tile encoded by one warp into a slot-sized staging place, with a flag when it
// falls back to raw; an exclusive scan of the flags (CUB) gives every tile its place in storage
// order; a second pass writes the storage map and each tile (its slot, or its raw rows) there. The
// incomplete final block's rows follow as they are. The container (header, checksums) is the host's.
#include <cuda_runtime.h>

#include <cub/device/device_scan.cuh>

#include <algorithm>
#include <string>
#include <vector>

#include "cuda/check.hpp"
#include "cuda/dispatch.hpp"
#include "cuda/lane_encode.cuh"
#include "gaac/calibration.hpp"
#include "gaac/cuda.hpp"
#include "gaac/error.hpp"
#include "gaac/snapshot.hpp"

namespace gaac::cuda {
namespace {

constexpr int kWarps = 4;

struct SectionArgs {
  const uint16_t* tensor = nullptr;
  size_t token_stride = 0;
  int kv_heads = 0, head_dim = 0;
  long long tiles = 0;
  const uint8_t* bases = nullptr;  ///< b3 [kv_heads][head_dim], then b4 likewise
  uint32_t capacity = 0;
  size_t slot_bytes = 0, raw_bytes = 0, map_bytes = 0;
  uint8_t* staging = nullptr;     ///< tiles × slot_bytes
  uint32_t* raw = nullptr;        ///< per tile: 1 when stored raw
  const uint32_t* raw_before = nullptr;  ///< exclusive scan of `raw`
  uint8_t* out = nullptr;
};

/// Tile `id` in storage order (block, head, half): its first element in the tensor.
template <int C, int P>
__device__ const uint16_t* tile_origin(const SectionArgs& a, long long id, int& head, int& half) {
  half = static_cast<int>(id % P);
  head = static_cast<int>((id / P) % a.kv_heads);
  const long long block = id / P / a.kv_heads;
  return a.tensor + static_cast<size_t>(block) * kTileTokens * a.token_stride + static_cast<size_t>(head) * a.head_dim +
         static_cast<size_t>(half) * C;
}

template <int C, int P, bool Key>
__global__ void __launch_bounds__(kWarps * 32) encode_tiles_kernel(const SectionArgs a) {
  __shared__ __align__(16) uint16_t staged[kWarps][kTileTokens * lane::kStagedRow<C>];
  const int warp = static_cast<int>(threadIdx.x) / 32, lane = static_cast<int>(threadIdx.x) % 32;
  const long long id = static_cast<long long>(blockIdx.x) * kWarps + warp;
  if (id >= a.tiles) return;
  int head = 0, half = 0;
  const uint16_t* origin = tile_origin<C, P>(a, id, head, half);
  lane::stage_rows<C>(origin, a.token_stride, 0, kTileTokens, staged[warp], lane);
  __syncwarp();
  const uint8_t* b3 = a.bases + static_cast<size_t>(head) * a.head_dim + half * C;
  const uint8_t* b4 = b3 + static_cast<size_t>(a.kv_heads) * a.head_dim;
  const uint32_t escapes =
      lane::encode_staged_tile<C, Key>(staged[warp], b3, b4, a.capacity, a.staging + static_cast<size_t>(id) * a.slot_bytes, lane);
  if (lane == 0) a.raw[id] = escapes > a.capacity ? 1u : 0u;
}

template <int C, int P>
__global__ void __launch_bounds__(kWarps * 32) place_tiles_kernel(const SectionArgs a) {
  const int warp = static_cast<int>(threadIdx.x) / 32, lane = static_cast<int>(threadIdx.x) % 32;
  const long long id = static_cast<long long>(blockIdx.x) * kWarps + warp;
  if (id >= a.tiles) return;
  const uint32_t before = a.raw_before[id];
  const bool raw = a.raw[id] != 0;
  uint8_t* dst = a.out + a.map_bytes + static_cast<size_t>(id - before) * a.slot_bytes + static_cast<size_t>(before) * a.raw_bytes;
  if (lane == 0) a.out[id] = raw ? 1 : 0;
  if (raw) {
    int head = 0, half = 0;
    const uint16_t* origin = tile_origin<C, P>(a, id, head, half);
    constexpr int kPieces = C * 2 / 16;
    for (int v = lane; v < kTileTokens * kPieces; v += 32) {
      const int row = v / kPieces, piece = v % kPieces;
      reinterpret_cast<uint4*>(dst)[v] = *reinterpret_cast<const uint4*>(origin + row * a.token_stride + piece * 8);
    }
  } else {
    const uint8_t* slot = a.staging + static_cast<size_t>(id) * a.slot_bytes;
    for (size_t v = static_cast<size_t>(lane); v < a.slot_bytes / 16; v += 32) {
      reinterpret_cast<uint4*>(dst)[v] = reinterpret_cast<const uint4*>(slot)[v];
    }
  }
}

template <int C, int P>
void launch(const SectionArgs& a, TensorKind kind, cudaStream_t stream, bool place) {
  const unsigned grid = static_cast<unsigned>((a.tiles + kWarps - 1) / kWarps);
  if (place) {
    place_tiles_kernel<C, P><<<grid, kWarps * 32, 0, stream>>>(a);
  } else if (kind == TensorKind::key) {
    encode_tiles_kernel<C, P, true><<<grid, kWarps * 32, 0, stream>>>(a);
  } else {
    encode_tiles_kernel<C, P, false><<<grid, kWarps * 32, 0, stream>>>(a);
  }
}

}  // namespace

std::vector<uint8_t> encode_snapshot_section(const uint16_t* tensor, int tokens, size_t token_stride,
                                             const CalibrationTable& calibration, TensorKind kind, int layer,
                                             Stream stream) {
  const int kv = calibration.kv_heads(), head_dim = calibration.head_dim();
  if (layer < 0 || layer >= calibration.layers()) throw Error("encode_snapshot_section: layer " + std::to_string(layer) + " out of range");
  // Throws for a head width the kernels do not take, before anything is allocated.
  detail::with_head_shape(head_dim, "encode_snapshot_section", [&]<int C, int P>() { return C * P; });
  if (tokens < 0) throw Error("encode_snapshot_section: negative token count");
  const size_t row = static_cast<size_t>(kv) * head_dim;
  if (token_stride < row || token_stride % 8 != 0 || reinterpret_cast<uintptr_t>(tensor) % 16 != 0)
    throw Error("encode_snapshot_section: the tensor must be 16-byte aligned with a token stride of at least " +
                std::to_string(row) + " elements, a multiple of 8");
  const int channels = head_dim < kMaxTileChannels ? head_dim : kMaxTileChannels;
  const int halves = head_dim / channels;
  const TileShape shape{kind, channels};
  SectionArgs a;
  a.tensor = tensor;
  a.token_stride = token_stride;
  a.kv_heads = kv;
  a.head_dim = head_dim;
  a.tiles = static_cast<long long>(tokens / kTileTokens) * kv * halves;
  a.capacity = static_cast<uint32_t>(calibration.escape_capacity(kind, layer));
  a.slot_bytes = shape.slot_bytes(a.capacity);
  a.raw_bytes = shape.raw_bytes();
  a.map_bytes = (static_cast<size_t>(a.tiles) + 15) / 16 * 16;
  const int tail_rows = tokens % kTileTokens;
  const size_t tail_bytes = static_cast<size_t>(tail_rows) * row * 2;
  const size_t most = a.map_bytes + static_cast<size_t>(a.tiles) * a.raw_bytes + tail_bytes;

  std::vector<uint8_t> bases(2 * row);
  for (int h = 0; h < kv; ++h) {
    std::ranges::copy(calibration.b3(kind, layer, h), bases.begin() + static_cast<long>(h) * head_dim);
    std::ranges::copy(calibration.b4(kind, layer, h), bases.begin() + static_cast<long>(row + h * static_cast<size_t>(head_dim)));
  }
  DeviceBuffer bases_buffer(bases.size()), out(std::max<size_t>(most, 16));
  bases_buffer.upload(bases.data(), bases.size());
  a.bases = static_cast<const uint8_t*>(bases_buffer.data());
  a.out = static_cast<uint8_t*>(out.data());
  check(cudaMemsetAsync(out.data(), 0, a.map_bytes, stream), "cudaMemsetAsync");

  uint32_t raw_tiles = 0;
  if (a.tiles > 0) {
    const auto n = static_cast<size_t>(a.tiles);
    DeviceBuffer staging(n * a.slot_bytes), flags(n * 4), before(n * 4);
    a.staging = static_cast<uint8_t*>(staging.data());
    a.raw = static_cast<uint32_t*>(flags.data());
    a.raw_before = static_cast<const uint32_t*>(before.data());
    const auto run = [&](bool place) {
      detail::with_head_shape(head_dim, "encode_snapshot_section",
                              [&]<int C, int P>() { launch<C, P>(a, kind, stream, place); });
      check(cudaGetLastError(), "encode_snapshot_section launch");
    };
    run(false);
    size_t scratch_bytes = 0;
    check(cub::DeviceScan::ExclusiveSum(nullptr, scratch_bytes, a.raw, static_cast<uint32_t*>(before.data()),
                                        static_cast<int>(n), stream),
          "cub scan");
    DeviceBuffer scratch(std::max<size_t>(scratch_bytes, 16));
    check(cub::DeviceScan::ExclusiveSum(scratch.data(), scratch_bytes, a.raw, static_cast<uint32_t*>(before.data()),
                                        static_cast<int>(n), stream),
          "cub scan");
    run(true);
    uint32_t last[2] = {0, 0};
    check(cudaMemcpyAsync(&last[0], a.raw_before + n - 1, 4, cudaMemcpyDeviceToHost, stream), "cudaMemcpyAsync");
    check(cudaMemcpyAsync(&last[1], a.raw + n - 1, 4, cudaMemcpyDeviceToHost, stream), "cudaMemcpyAsync");
    check(cudaStreamSynchronize(stream), "encode_snapshot_section");
    raw_tiles = last[0] + last[1];
  }
  const size_t tiles_end = a.map_bytes + (static_cast<size_t>(a.tiles) - raw_tiles) * a.slot_bytes +
                           static_cast<size_t>(raw_tiles) * a.raw_bytes;
  if (tail_rows > 0) {
    const uint16_t* tail = tensor + static_cast<size_t>(tokens - tail_rows) * token_stride;
    check(cudaMemcpy2DAsync(a.out + tiles_end, row * 2, tail, token_stride * 2, row * 2, static_cast<size_t>(tail_rows),
                            cudaMemcpyDeviceToDevice, stream),
          "cudaMemcpy2DAsync");
  }
  std::vector<uint8_t> section(tiles_end + tail_bytes);
  check(cudaMemcpyAsync(section.data(), out.data(), section.size(), cudaMemcpyDeviceToHost, stream), "cudaMemcpyAsync");
  check(cudaStreamSynchronize(stream), "encode_snapshot_section");
  return section;
}

std::vector<uint8_t> snapshot_image(const KvDump& dump, const CalibrationTable& calibration, const Progress& progress) {
  DeviceBuffer tensor;
  const TensorSectionEncoder encode = [&](int layer, TensorKind kind) {
    const KvTensor& t = dump.layers.at(static_cast<size_t>(layer)).of(kind);
    const size_t bytes = t.data.size() * 2;
    if (tensor.bytes() < bytes) tensor = DeviceBuffer(bytes);
    tensor.upload(t.data.data(), bytes);
    return encode_snapshot_section(static_cast<const uint16_t*>(tensor.data()), t.tokens,
                                   static_cast<size_t>(t.kv_heads) * t.head_dim, calibration, kind, layer);
  };
  return gaac::snapshot_image(dump, calibration, encode, progress);
}

}  // namespace gaac::cuda
