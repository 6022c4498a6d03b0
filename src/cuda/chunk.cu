// KV chunk objects coded on the device (docs/format.md, section 15): the same bytes as the CPU's
// gaac::ChunkCodec, from a chunk in device memory to an object in device memory and back, with no copy
// through the host. The host computes the layout (every place but the escape stream's is fixed by the
// geometry) and reads back a few words at the end, into pinned memory: the object's size and a status.
// A call works in a workspace the codec keeps (WorkspacePool): nothing is allocated once it has run.
//
// Encode, on one stream: every tile encoded by one warp, its fixed part in place, its escapes (or a raw
// tile's bytes past the fixed part) into a scratch place of its own, its stream size counted; in the
// same launch, a block per section writes the maps' padding, the tails and the metadata; one block
// scans the sizes (every tile's place in the escape section), writes the index and the object's size; every tile's escapes are copied to their
// place and the rest of the section zeroed; four threads (a quad) hash each 4 KiB checksum piece, a
// warp's eight pieces read together (quad_xxh64_staged); one block combines them per section and writes
// the table and the header. Five launches and one copy.
//
// Decode: one block checks the header, the table against the layout and the metadata byte for byte;
// the pieces are hashed and the checksums compared; every tile's stream size is counted from its tags
// (tag 3, an unknown storage kind or too many escapes: refused) and scanned by one block, which checks
// the index against the scan; the escape section's tail must be zero; every tile is rebuilt by one warp
// into the chunk and, in the same launch, a block per section copies the tails and checks every
// padding byte. Seven launches and one copy. Any problem sets a status bit;
// then the object is copied to the host and read by the CPU decoder, whose message (the same as on the
// CPU) is what is thrown.
//
// Up to kChunksInFlight chunks share those launches (Batch: a chunk a row of the grid, blockIdx.y), and
// the host waits once for them all: a batch's one-block kernels (the scans, the headers) run side by
// side instead of one after another, and the small chunks' launches are paid once, not once a chunk.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "cuda/check.hpp"
#include "cuda/dispatch.hpp"
#include "cuda/lane_bases.hpp"
#include "cuda/lane_decode.cuh"
#include "cuda/lane_encode.cuh"
#include "cuda/tile_rows.cuh"
#include "cuda/xxh64.cuh"
#include "gaac/chunk.hpp"
#include "gaac/cuda.hpp"
#include "gaac/error.hpp"
#include "gaac/paged_layout.hpp"
#include "io/container.hpp"

namespace gaac::cuda {
namespace {

constexpr int kWarps = 4;
constexpr uint32_t kPieceBytes = 4096;
constexpr int kMaxMetadata = 512;
constexpr uint32_t kMapRaw = 1;
constexpr uint64_t kMagic = 0x1A0A0D4341414789ull;  // "\x89GAAC\r\n\x1a", little-endian

// Status bits (result word 1).
constexpr uint64_t kTooLarge = 1;       ///< encode: the escapes do not fit the fixed object size
constexpr uint64_t kBadHeader = 2;      ///< decode: header, table or metadata not as the layout says
constexpr uint64_t kBadChecksum = 4;    ///< decode: a section's checksum
constexpr uint64_t kBadTile = 8;        ///< decode: a storage-map byte, tag 3, too many escapes
constexpr uint64_t kBadPadding = 16;    ///< decode: padding or the escape section's tail not zero
constexpr uint64_t kBadEscapes = 32;    ///< decode: the tiles need more escape bytes than the section has

/// The metadata section's bytes, as a kernel argument.
struct Metadata {
  uint32_t size = 0;
  uint8_t bytes[kMaxMetadata] = {};
};

/// Everything a kernel needs, by value.
struct Args {
  uint16_t* values = nullptr;  ///< the chunk (read by encode, written by decode)
  uint64_t kind_stride = 0, layer_stride = 0, token_stride = 0;
  int layers = 0, kv_heads = 0, head_dim = 0, tokens = 0;
  PagedGeometry bases_geometry;           ///< for lane_bases_index
  const uint32_t* lane_bases = nullptr;   ///< the bases as the lanes read them (lane_bases.hpp)
  uint8_t* object = nullptr;
  uint64_t buffer_bytes = 0;  ///< bytes at `object`
  // layout
  uint64_t tiles = 0, tiles_per_tensor = 0;
  uint32_t fixed_bytes = 0, map_bytes = 0, tail_bytes = 0, raw_rest = 0, max_escapes = 0;
  uint64_t tensor_bytes = 0, tensor_stride = 0, first_tensor = 0, metadata_offset = 0, index_offset = 0, escape_offset = 0;
  uint32_t metadata_bytes = 0, index_bytes = 0, sections = 0, tensors = 0;
  uint64_t fixed_end = 0;  ///< encode: the fixed object size, 0 for objects of their own size
  // pieces
  uint64_t metadata_pieces = 0, index_pieces = 0, tensor_pieces = 0, max_pieces = 0;
  // workspace
  uint8_t* scratch = nullptr;
  uint32_t scratch_stride = 0;
  uint32_t* sizes = nullptr;
  uint32_t* offsets = nullptr;
  uint64_t* hashes = nullptr;
  uint64_t* section_sums = nullptr;
  uint64_t* result = nullptr;  ///< [0] escape bytes, [1] status, [2] object bytes
};

/// The chunks one launch codes: up to kChunksInFlight, chunk blockIdx.y's arguments and metadata. A kernel
/// parameter (__grid_constant__: read where it lies, never copied per thread); a launch's x extent is the
/// largest any of its chunks needs, and the blocks past a chunk's own return.
struct Batch {
  Args args[ChunkCodec::kChunksInFlight];
  Metadata meta[ChunkCodec::kChunksInFlight];
};

__device__ __forceinline__ uint64_t pieces_of(uint64_t bytes) { return (bytes + kPieceBytes - 1) / kPieceBytes; }

/// Section s: 0 metadata, 1 index, 2 .. 2L + 1 tensors, 2L + 2 escapes. Its offset and size (the escape
/// section's from the object's end).
__device__ __forceinline__ void section_at(const Args& a, uint32_t s, uint64_t object_end, uint64_t& offset, uint64_t& bytes) {
  if (s == 0) {
    offset = a.metadata_offset, bytes = a.metadata_bytes;
  } else if (s == 1) {
    offset = a.index_offset, bytes = a.index_bytes;
  } else if (s + 1 < a.sections) {
    offset = a.first_tensor + (s - 2) * a.tensor_stride, bytes = a.tensor_bytes;
  } else {
    offset = a.escape_offset, bytes = object_end - a.escape_offset;
  }
}

/// Type and index of section s in the table.
__device__ __forceinline__ void section_kind(const Args& a, uint32_t s, uint32_t& type, uint32_t& index) {
  type = s == 0               ? io::kMetadataSection
         : s == 1             ? io::kChunkIndexSection
         : s + 1 < a.sections ? io::kChunkTensorSection
                              : io::kEscapeSection;
  index = type == io::kChunkTensorSection ? s - 2 : 0u;
}

/// First piece of section s (pieces numbered over all sections).
__device__ __forceinline__ uint64_t first_piece(const Args& a, uint32_t s) {
  if (s == 0) return 0;
  if (s == 1) return a.metadata_pieces;
  if (s + 1 < a.sections) return a.metadata_pieces + a.index_pieces + (s - 2) * a.tensor_pieces;
  return a.metadata_pieces + a.index_pieces + a.tensors * a.tensor_pieces;
}

/// Where tile g is: its tensor section s − 1 = 2·layer + kind, and (block, head, half).
struct TileAt {
  int layer, block, head, half;
  bool key;
  uint64_t tile;      ///< index in its tensor
  uint8_t* section;   ///< its tensor section
};
template <int P>
__device__ __forceinline__ TileAt tile_at(const Args& a, uint64_t g) {
  TileAt t;
  const uint64_t s = g / a.tiles_per_tensor;
  t.tile = g % a.tiles_per_tensor;
  t.layer = static_cast<int>(s / 2);
  t.key = s % 2 == 0;
  t.half = static_cast<int>(t.tile % P);
  t.head = static_cast<int>((t.tile / P) % a.kv_heads);
  t.block = static_cast<int>(t.tile / P / a.kv_heads);
  t.section = a.object + a.first_tensor + s * a.tensor_stride;
  return t;
}

template <int C, int P>
__device__ __forceinline__ uint16_t* tile_origin(const Args& a, const TileAt& t) {
  return a.values + (t.key ? 0 : a.kind_stride) + static_cast<uint64_t>(t.layer) * a.layer_stride +
         static_cast<uint64_t>(t.block) * kTileTokens * a.token_stride + static_cast<uint64_t>(t.head) * a.head_dim + t.half * C;
}

// ---- encode ---------------------------------------------------------------------------------------

/// For s < 2L: tensor section s's map padding, tail and padding after it; for s = 2L: the metadata
/// and the padding after it and after the index (whose entries come after the scan). By one block.
__device__ void fill_section(const Args& a, const Metadata& meta, uint32_t s) {
  if (s == static_cast<uint32_t>(2 * a.layers)) {
    for (uint64_t i = threadIdx.x; i < a.first_tensor - a.metadata_offset; i += blockDim.x) {
      a.object[a.metadata_offset + i] = i < meta.size ? meta.bytes[i] : 0;
    }
    return;
  }
  uint8_t* section = a.object + a.first_tensor + s * a.tensor_stride;
  for (uint64_t i = a.tiles_per_tensor + threadIdx.x; i < a.map_bytes; i += blockDim.x) section[i] = 0;
  for (uint64_t i = a.tensor_bytes + threadIdx.x; i < a.tensor_stride; i += blockDim.x) section[i] = 0;
  const int tail_rows = a.tokens % kTileTokens;
  const uint32_t row_bytes = static_cast<uint32_t>(a.kv_heads) * a.head_dim * 2;
  const uint16_t* tensor = a.values + (s % 2 == 0 ? 0 : a.kind_stride) + (s / 2) * a.layer_stride;
  uint8_t* tail = section + a.map_bytes + a.tiles_per_tensor * a.fixed_bytes;
  for (uint32_t v = threadIdx.x; v < tail_rows * (row_bytes / 16); v += blockDim.x) {
    const uint32_t r = v / (row_bytes / 16), piece = v % (row_bytes / 16);
    *reinterpret_cast<uint4*>(tail + r * row_bytes + piece * 16) =
        *reinterpret_cast<const uint4*>(tensor + (a.tokens - tail_rows + r) * a.token_stride + piece * 8);
  }
}

/// The lane's base words of tile t's kind (Key) from the lane bases, four words a 16-byte load as
/// decode_tile_to_rows reads them: b3's, and b4's as b3 + (b4 − b3).
template <int C, bool Key>
__device__ __forceinline__ void load_base_words(const Args& a, const TileAt& t, int lane, uint32_t (&b3)[lane::kBaseWords<C, Key>],
                                                uint32_t (&b4)[lane::kBaseWords<C, Key>]) {
  constexpr int kKeyWords = 32 * (C / 16), kValueWords = 32 * (C / 8);
  const uint32_t* words = a.lane_bases + detail::lane_bases_index(a.bases_geometry, t.layer, t.head) +
                          t.half * detail::lane_base_words_per_half(C) + (Key ? 0 : 2 * kKeyWords);
  const uint32_t* deltas = words + (Key ? kKeyWords : kValueWords);
#pragma unroll
  for (int w = 0; w < lane::kBaseWords<C, Key>; w += 4) {
    const uint4 w3 = reinterpret_cast<const uint4*>(words)[(w / 4) * 32 + lane];
    const uint4 dl = reinterpret_cast<const uint4*>(deltas)[(w / 4) * 32 + lane];
    b3[w] = w3.x, b3[w + 1] = w3.y, b3[w + 2] = w3.z, b3[w + 3] = w3.w;
    b4[w] = w3.x + dl.x, b4[w + 1] = w3.y + dl.y, b4[w + 2] = w3.z + dl.z, b4[w + 3] = w3.w + dl.w;
  }
}

/// Stages tile t (Key: its kind) and encodes it to its fixed place and its escapes to `escapes`, as
/// lane::encode_staged_tile_with; returns its escape bytes. The lane's base words are loaded before
/// the rows are staged, so that both loads are in flight at once.
template <int C, int P, bool Key>
__device__ __forceinline__ uint32_t stage_and_encode_tile(const Args& a, const TileAt& t, uint16_t* staged, uint8_t* fixed,
                                                          uint8_t* escapes, int lane) {
  uint32_t b3[lane::kBaseWords<C, Key>], b4[lane::kBaseWords<C, Key>];
  load_base_words<C, Key>(a, t, lane, b3, b4);
  lane::stage_rows<C>(tile_origin<C, P>(a, t), a.token_stride, 0, kTileTokens, staged, lane);
  __syncwarp();
  return lane::encode_staged_tile_with<C, Key>(
      staged, [&](int w) { return b3[w]; }, [&](int w) { return b4[w]; }, a.max_escapes, fixed, escapes, false, lane);
}

/// Blocks of the tile kernels: kWarps tiles each.
__device__ __forceinline__ uint64_t tile_blocks(const Args& a) { return (a.tiles + kWarps - 1) / kWarps; }

/// A warp per tile (tile_blocks() blocks), then a block per fill_section (2L + 1 blocks).
template <int C, int P>
__global__ void __launch_bounds__(kWarps * 32) encode_tiles_kernel(const __grid_constant__ Batch b) {
  const Args& a = b.args[blockIdx.y];
  __shared__ __align__(16) uint16_t staged[kWarps][kTileTokens * lane::kStagedRow<C>];
  if (blockIdx.x >= tile_blocks(a)) {
    const uint64_t s = blockIdx.x - tile_blocks(a);
    if (s <= static_cast<uint64_t>(2 * a.layers)) fill_section(a, b.meta[blockIdx.y], static_cast<uint32_t>(s));
    return;
  }
  const int warp = static_cast<int>(threadIdx.x) / 32, lane = static_cast<int>(threadIdx.x) % 32;
  const uint64_t g = static_cast<uint64_t>(blockIdx.x) * kWarps + warp;
  if (g >= a.tiles) return;
  const TileAt t = tile_at<P>(a, g);
  uint8_t* fixed = t.section + a.map_bytes + t.tile * a.fixed_bytes;
  uint8_t* escapes = a.scratch + g * a.scratch_stride;
  const uint32_t total = t.key ? stage_and_encode_tile<C, P, true>(a, t, staged[warp], fixed, escapes, lane)
                               : stage_and_encode_tile<C, P, false>(a, t, staged[warp], fixed, escapes, lane);
  const bool raw = total > a.max_escapes;
  if (raw) {  // the raw rows: the first fixed_bytes in place, the rest to the stream
    constexpr int kPieces = C * 2 / 16;
    for (int v = lane; v < kTileTokens * kPieces; v += 32) {
      const uint4 piece = *reinterpret_cast<const uint4*>(staged[warp] + (v / kPieces) * lane::kStagedRow<C> + (v % kPieces) * 8);
      const uint32_t at = static_cast<uint32_t>(v) * 16;
      *reinterpret_cast<uint4*>(at < a.fixed_bytes ? fixed + at : escapes + (at - a.fixed_bytes)) = piece;
    }
  }
  if (lane == 0) {
    t.section[t.tile] = raw ? kMapRaw : 0;
    a.sizes[g] = raw ? a.raw_rest : total;
  }
}

// ---- the escape stream ----------------------------------------------------------------------------

constexpr int kScanThreads = 1024;
constexpr int kScanPerThread = 8;

/// Stream bytes of all the tiles together (once the offsets are scanned).
__device__ __forceinline__ uint64_t stream_total(const Args& a) {
  return a.tiles == 0 ? 0 : static_cast<uint64_t>(a.offsets[a.tiles - 1]) + a.sizes[a.tiles - 1];
}

/// Every tile's place in the stream: offsets, the exclusive prefix sum of sizes (u32), by one block of
/// kScanThreads, kScanPerThread consecutive tiles a thread; the block's last __syncthreads follows the
/// last write, so its threads may read any offset after it.
__device__ void scan_sizes(const Args& a) {
  __shared__ uint32_t warp_sums[kScanThreads / 32];
  __shared__ uint32_t block_sum;
  const int lane = static_cast<int>(threadIdx.x) % 32, warp = static_cast<int>(threadIdx.x) / 32;
  uint32_t carry = 0;
  for (uint64_t first = 0; first < a.tiles; first += static_cast<uint64_t>(kScanThreads) * kScanPerThread) {
    const uint64_t mine = first + static_cast<uint64_t>(threadIdx.x) * kScanPerThread;
    uint32_t sizes[kScanPerThread], sum = 0;
#pragma unroll
    for (int k = 0; k < kScanPerThread; ++k) {
      sizes[k] = mine + k < a.tiles ? a.sizes[mine + k] : 0;
      sum += sizes[k];
    }
    const uint32_t in_warp = detail::warp_exclusive_scan(sum, lane);
    if (lane == 31) warp_sums[warp] = in_warp + sum;
    __syncthreads();
    if (warp == 0) {
      const uint32_t w = warp_sums[lane], before = detail::warp_exclusive_scan(w, lane);
      warp_sums[lane] = before;
      if (lane == 31) block_sum = before + w;
    }
    __syncthreads();
    uint32_t at = carry + warp_sums[warp] + in_warp;
#pragma unroll
    for (int k = 0; k < kScanPerThread; ++k) {
      if (mine + k < a.tiles) a.offsets[mine + k] = at;
      at += sizes[k];
    }
    carry += block_sum;
    __syncthreads();  // warp_sums and block_sum are rewritten by the next round
  }
}

/// One block: the tiles' places in the escape stream, the index (where each tensor section's escapes
/// start: its first tile's offset), the object's end and the result words.
__global__ void __launch_bounds__(kScanThreads) place_streams_kernel(const __grid_constant__ Batch b) {
  const Args& a = b.args[blockIdx.y];
  scan_sizes(a);
  const uint64_t total = stream_total(a);
  const uint64_t end = a.fixed_end != 0 ? a.fixed_end : a.escape_offset + (total + 63) / 64 * 64;
  for (uint32_t s = threadIdx.x; s < a.tensors; s += blockDim.x) {
    reinterpret_cast<uint64_t*>(a.object + a.index_offset)[s] = a.tiles_per_tensor == 0 ? 0 : a.offsets[s * a.tiles_per_tensor];
  }
  if (threadIdx.x == 0) {
    a.result[0] = total;
    a.result[1] = a.escape_offset + total > end ? kTooLarge : 0;
    a.result[2] = end;
  }
}

/// Copies each tile's stream bytes (a warp per tile) to its place in the escape section and zeroes the
/// section after the streams (every thread of the grid); nothing for an object too large (refused).
__global__ void __launch_bounds__(kWarps * 32) place_escapes_kernel(const __grid_constant__ Batch b) {
  const Args& a = b.args[blockIdx.y];
  if (a.result[1] != 0) return;
  const int warp = static_cast<int>(threadIdx.x) / 32, lane = static_cast<int>(threadIdx.x) % 32;
  const uint64_t g = static_cast<uint64_t>(blockIdx.x) * kWarps + warp;
  if (g < a.tiles) {
    uint8_t* to = a.object + a.escape_offset + a.offsets[g];
    const uint8_t* from = a.scratch + g * a.scratch_stride;
    const uint32_t n = a.sizes[g];
    for (uint32_t i = lane; i < n; i += 32) to[i] = from[i];  // tens of bytes a tile, at any alignment
  }
  const uint64_t threads = static_cast<uint64_t>(gridDim.x) * blockDim.x;
  for (uint64_t i = a.escape_offset + a.result[0] + static_cast<uint64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < a.result[2];
       i += threads) {
    a.object[i] = 0;
  }
}

// ---- checksums ------------------------------------------------------------------------------------

constexpr int kHashThreads = 256;
/// Threads of the one-block kernels that combine the section checksums: a quad per section, 128 at once.
constexpr int kHeaderThreads = 512;

/// Piece p's bytes in an object ending at `end`: `length` bytes at `from` (0 for a piece past its
/// section's end).
__device__ void piece_bytes(const Args& a, uint64_t p, uint64_t end, uint64_t& from, uint64_t& length) {
  uint32_t s;
  const uint64_t tensors_from = a.metadata_pieces + a.index_pieces;
  if (p < a.metadata_pieces) {
    s = 0;
  } else if (p < tensors_from) {
    s = 1;
  } else if (p < tensors_from + a.tensors * a.tensor_pieces) {
    s = 2 + static_cast<uint32_t>((p - tensors_from) / a.tensor_pieces);
  } else {
    s = a.sections - 1;
  }
  uint64_t offset, bytes;
  section_at(a, s, end, offset, bytes);
  const uint64_t piece = p - first_piece(a, s);
  from = offset + piece * kPieceBytes;
  length = piece < pieces_of(bytes) ? (bytes - piece * kPieceBytes < kPieceBytes ? bytes - piece * kPieceBytes : kPieceBytes) : 0;
}

/// A quad of lanes per piece of every section (the object's end from result[2]), each warp's eight pieces
/// read together (quad_xxh64_staged).
__global__ void __launch_bounds__(kHashThreads) hash_pieces_kernel(const __grid_constant__ Batch b) {
  const Args& a = b.args[blockIdx.y];
  __shared__ __align__(16) uint8_t staging[kHashThreads / 32][xxh::kStagedWarpBytes];
  if (a.result[1] != 0 || static_cast<uint64_t>(blockIdx.x) * (blockDim.x / 4) >= a.max_pieces) return;
  const int lane = static_cast<int>(threadIdx.x) % 32;
  const uint64_t p = (static_cast<uint64_t>(blockIdx.x) * blockDim.x + threadIdx.x) / 4;
  uint64_t from = 0, length = 0;
  if (p < a.max_pieces) piece_bytes(a, p, a.result[2], from, length);
  const uint64_t h = xxh::quad_xxh64_staged(a.object + from, length, 0, lane, staging[threadIdx.x / 32]);
  if (length > 0 && lane % 4 == 0) a.hashes[p] = h;
}

/// Section checksums from their pieces', a quad of lanes per section, into section_sums. Every thread
/// of the block calls it (blockDim.x a multiple of 32).
__device__ void combine_sections(const Args& a, uint64_t end) {
  const int lane = static_cast<int>(threadIdx.x) % 32;
  for (uint32_t first = 0; first < a.sections; first += blockDim.x / 4) {  // the same rounds in every lane
    const uint32_t s = first + threadIdx.x / 4;
    uint64_t offset = 0, bytes = 0;
    if (s < a.sections) section_at(a, s, end, offset, bytes);
    const uint8_t* pieces = reinterpret_cast<const uint8_t*>(a.hashes + (s < a.sections ? first_piece(a, s) : 0));
    const uint64_t h = xxh::quad_xxh64<true>(pieces, pieces_of(bytes) * 8, 0, lane);
    if (s < a.sections && lane % 4 == 0) a.section_sums[s] = h;
  }
}

/// The table's checksum (its a.sections entries at byte 32), by the quads of warp 0, for its lanes;
/// plain loads: the encoder's block has just written the table.
__device__ uint64_t table_checksum(const Args& a) {
  return xxh::quad_xxh64<false>(a.object + 32, 32ull * a.sections, 0, static_cast<int>(threadIdx.x));
}

/// One block: section checksums, the table and the header.
__global__ void write_header_kernel(const __grid_constant__ Batch b) {
  const Args& a = b.args[blockIdx.y];
  if (a.result[1] != 0) return;
  const uint64_t end = a.result[2];
  combine_sections(a, end);
  __syncthreads();
  uint8_t* table = a.object + 32;
  for (uint32_t s = threadIdx.x; s < a.sections; s += blockDim.x) {
    uint64_t offset, bytes;
    section_at(a, s, end, offset, bytes);
    uint32_t type, index;
    section_kind(a, s, type, index);
    uint32_t* e32 = reinterpret_cast<uint32_t*>(table + 32 * s);
    uint64_t* e64 = reinterpret_cast<uint64_t*>(table + 32 * s);
    e32[0] = type, e32[1] = index;
    e64[1] = offset, e64[2] = bytes, e64[3] = a.section_sums[s];
  }
  for (uint64_t i = 32 + 32ull * a.sections + threadIdx.x; i < a.metadata_offset; i += blockDim.x) a.object[i] = 0;
  __syncthreads();
  if (threadIdx.x >= 32) return;
  const uint64_t table_sum = table_checksum(a);
  if (threadIdx.x == 0) {
    *reinterpret_cast<uint64_t*>(a.object) = kMagic;
    *reinterpret_cast<uint16_t*>(a.object + 8) = kChunkVersion;
    *reinterpret_cast<uint16_t*>(a.object + 10) = static_cast<uint16_t>(kTileFormatVersion);
    *reinterpret_cast<uint32_t*>(a.object + 12) = a.sections;
    *reinterpret_cast<uint64_t*>(a.object + 16) = end;
    *reinterpret_cast<uint64_t*>(a.object + 24) = table_sum;
  }
}

// ---- decode ---------------------------------------------------------------------------------------

/// One block: the header, the table against the layout, the metadata byte for byte. Sets result[2]
/// (the object's size) and kBadHeader.
__global__ void check_header_kernel(const __grid_constant__ Batch b) {
  const Args& a = b.args[blockIdx.y];
  const Metadata& meta = b.meta[blockIdx.y];
  __shared__ int bad;
  __shared__ uint64_t end;
  const uint64_t table_sum = threadIdx.x < 32 ? table_checksum(a) : 0;
  if (threadIdx.x == 0) {
    bad = 0;
    end = *reinterpret_cast<const uint64_t*>(a.object + 16);
    bad |= *reinterpret_cast<const uint64_t*>(a.object) != kMagic;
    bad |= *reinterpret_cast<const uint16_t*>(a.object + 8) != kChunkVersion;
    bad |= *reinterpret_cast<const uint16_t*>(a.object + 10) != kTileFormatVersion;
    bad |= *reinterpret_cast<const uint32_t*>(a.object + 12) != a.sections;
    bad |= end > a.buffer_bytes || end < a.escape_offset || end % 64 != 0;
    bad |= *reinterpret_cast<const uint64_t*>(a.object + 24) != table_sum;
  }
  __syncthreads();
  const uint64_t object_end = bad ? a.escape_offset : end;
  int local = 0;
  for (uint32_t s = threadIdx.x; s < a.sections; s += blockDim.x) {
    uint64_t offset, bytes;
    section_at(a, s, object_end, offset, bytes);
    const uint8_t* e = a.object + 32 + 32ull * s;
    uint32_t type, index;
    section_kind(a, s, type, index);
    local |= reinterpret_cast<const uint32_t*>(e)[0] != type || reinterpret_cast<const uint32_t*>(e)[1] != index ||
             reinterpret_cast<const uint64_t*>(e)[1] != offset || reinterpret_cast<const uint64_t*>(e)[2] != bytes;
  }
  for (uint32_t i = threadIdx.x; i < meta.size; i += blockDim.x) local |= a.object[a.metadata_offset + i] != meta.bytes[i];
  if (local) atomicOr(&bad, 1);
  __syncthreads();
  if (threadIdx.x == 0) {
    a.result[1] = bad ? kBadHeader : 0;
    a.result[2] = bad ? a.escape_offset : end;
  }
}

/// One block: the section checksums against the table.
__global__ void check_checksums_kernel(const __grid_constant__ Batch b) {
  const Args& a = b.args[blockIdx.y];
  if (a.result[1] != 0) return;
  combine_sections(a, a.result[2]);
  __syncthreads();
  for (uint32_t s = threadIdx.x; s < a.sections; s += blockDim.x) {
    if (a.section_sums[s] != reinterpret_cast<const uint64_t*>(a.object + 32 + 32ull * s)[3]) atomicOr(reinterpret_cast<unsigned long long*>(a.result + 1), kBadChecksum);
  }
}

/// Thread per tile: its stream bytes from the map and its tags; refuses unknown map bytes, tag 3 and
/// more escapes than a tile may have.
template <int C, int P>
__global__ void count_streams_kernel(const __grid_constant__ Batch b) {
  const Args& a = b.args[blockIdx.y];
  const uint64_t g = static_cast<uint64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (g >= a.tiles) return;
  const TileAt t = tile_at<P>(a, g);
  const uint8_t kind = t.section[t.tile];
  uint32_t n = 0;
  bool bad = kind > kMapRaw;
  if (kind == kMapRaw) {
    n = a.raw_rest;
  } else if (!bad) {
    const uint32_t* tags = reinterpret_cast<const uint32_t*>(t.section + a.map_bytes + t.tile * a.fixed_bytes + TileShape{TensorKind::key, C}.tag_offset());
    for (int w = 0; w < C / 8; ++w) {  // C/2 bytes of tags
      const uint32_t x = tags[w], lo = x & 0x55555555u, hi = (x >> 1) & 0x55555555u;
      bad |= (lo & hi) != 0;
      n += static_cast<uint32_t>(__popc(lo & ~hi)) + 5u * static_cast<uint32_t>(__popc(hi & ~lo));
    }
    bad |= n > a.max_escapes;
  }
  a.sizes[g] = bad ? 0 : n;
  if (bad) atomicOr(reinterpret_cast<unsigned long long*>(a.result + 1), kBadTile);
}

/// One block: the tiles' places in the escape stream; the streams fit the section and the index is
/// where they start.
__global__ void __launch_bounds__(kScanThreads) check_streams_kernel(const __grid_constant__ Batch b) {
  const Args& a = b.args[blockIdx.y];
  if (a.result[1] != 0) return;
  scan_sizes(a);
  bool bad = a.escape_offset + stream_total(a) > a.result[2];
  for (uint32_t s = threadIdx.x; s < a.tensors; s += blockDim.x) {
    const uint64_t want = a.tiles_per_tensor == 0 ? 0 : a.offsets[s * a.tiles_per_tensor];
    bad |= reinterpret_cast<const uint64_t*>(a.object + a.index_offset)[s] != want;
  }
  if (bad) atomicOr(reinterpret_cast<unsigned long long*>(a.result + 1), kBadEscapes);
}

/// Blocks of check_escapes_kernel at most (two an SM): its grid-stride loop covers any tail, whose size
/// only the device knows; a grid sized to the largest escape section would be mostly empty blocks.
constexpr unsigned kMaxZeroCheckBlocks = 264;

/// The escape section's bytes after the streams are zero.
__global__ void check_escapes_kernel(const __grid_constant__ Batch b) {
  const Args& a = b.args[blockIdx.y];
  if (a.result[1] != 0) return;
  bool nonzero = false;
  for (uint64_t i = a.escape_offset + stream_total(a) + static_cast<uint64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < a.result[2];
       i += static_cast<uint64_t>(gridDim.x) * blockDim.x) {
    nonzero |= a.object[i] != 0;
  }
  if (nonzero) atomicOr(reinterpret_cast<unsigned long long*>(a.result + 1), kBadPadding);
}

/// For s < 2L: tensor section s's tail into the chunk, its map padding and the padding after it zero;
/// for s = 2L: the padding after the table and after the metadata zero. By one block.
__device__ void finish_section(const Args& a, uint32_t s) {
  bool nonzero = false;
  if (s == static_cast<uint32_t>(2 * a.layers)) {
    for (uint64_t i = 32 + 32ull * a.sections + threadIdx.x; i < a.metadata_offset; i += blockDim.x) nonzero |= a.object[i] != 0;
    for (uint64_t i = a.metadata_offset + a.metadata_bytes + threadIdx.x; i < a.index_offset; i += blockDim.x) nonzero |= a.object[i] != 0;
    for (uint64_t i = a.index_offset + a.index_bytes + threadIdx.x; i < a.first_tensor; i += blockDim.x) nonzero |= a.object[i] != 0;
  } else {
    const uint8_t* section = a.object + a.first_tensor + s * a.tensor_stride;
    for (uint64_t i = a.tiles_per_tensor + threadIdx.x; i < a.map_bytes; i += blockDim.x) nonzero |= section[i] != 0;
    for (uint64_t i = a.tensor_bytes + threadIdx.x; i < a.tensor_stride; i += blockDim.x) nonzero |= section[i] != 0;
    const int tail_rows = a.tokens % kTileTokens;
    const uint32_t row_bytes = static_cast<uint32_t>(a.kv_heads) * a.head_dim * 2;
    uint16_t* tensor = a.values + (s % 2 == 0 ? 0 : a.kind_stride) + (s / 2) * a.layer_stride;
    const uint8_t* tail = section + a.map_bytes + a.tiles_per_tensor * a.fixed_bytes;
    for (uint32_t v = threadIdx.x; v < tail_rows * (row_bytes / 16); v += blockDim.x) {
      const uint32_t r = v / (row_bytes / 16), piece = v % (row_bytes / 16);
      *reinterpret_cast<uint4*>(tensor + (a.tokens - tail_rows + r) * a.token_stride + piece * 8) =
          *reinterpret_cast<const uint4*>(tail + r * row_bytes + piece * 16);
    }
  }
  if (nonzero) atomicOr(reinterpret_cast<unsigned long long*>(a.result + 1), kBadPadding);
}

/// A warp per tile (tile_blocks() blocks), then a block per finish_section (2L + 1 blocks).
template <int C, int P>
__global__ void __launch_bounds__(kWarps * 32) decode_tiles_kernel(const __grid_constant__ Batch b) {
  const Args& a = b.args[blockIdx.y];
  constexpr int kEscapeRoom = 1216 + 32;  // the most a tile has, and the decoder's read-ahead
  __shared__ __align__(16) uint16_t tiles[kWarps][kTileTokens * kRow<C>];
  __shared__ __align__(16) uint8_t escapes[kWarps][kEscapeRoom];
  if (a.result[1] != 0) return;
  if (blockIdx.x >= tile_blocks(a)) {
    const uint64_t s = blockIdx.x - tile_blocks(a);
    if (s <= static_cast<uint64_t>(2 * a.layers)) finish_section(a, static_cast<uint32_t>(s));
    return;
  }
  const int warp = static_cast<int>(threadIdx.x) / 32, lane = static_cast<int>(threadIdx.x) % 32;
  const uint64_t g = static_cast<uint64_t>(blockIdx.x) * kWarps + warp;
  if (g >= a.tiles) return;
  const TileAt t = tile_at<P>(a, g);
  const uint8_t* fixed = t.section + a.map_bytes + t.tile * a.fixed_bytes;
  const uint8_t* stream = a.object + a.escape_offset + a.offsets[g];
  const uint32_t n = a.sizes[g];
  uint16_t* origin = tile_origin<C, P>(a, t);
  constexpr int kPieces = C * 2 / 16;
  if (t.section[t.tile] == kMapRaw) {
    // Row-major raw bytes: the first fixed_bytes (16-byte pieces) in place, the rest from the stream,
    // which has any alignment: element by element.
    for (int v = lane; v < kTileTokens * kPieces; v += 32) {
      const uint32_t at = static_cast<uint32_t>(v) * 16;
      if (at >= a.fixed_bytes) break;
      *reinterpret_cast<uint4*>(origin + (v / kPieces) * a.token_stride + (v % kPieces) * 8) = *reinterpret_cast<const uint4*>(fixed + at);
    }
    for (uint32_t e = a.fixed_bytes / 2 + lane; e < kTileTokens * C; e += 32) {
      const uint32_t at = 2 * e - a.fixed_bytes;
      origin[(e / C) * a.token_stride + e % C] = static_cast<uint16_t>(stream[at] | stream[at + 1] << 8);
    }
    return;
  }
  lane::LaneSlot<C> slot;
  lane::load_lane_slot<C>(fixed, lane, slot);
  const uint32_t padded = (n + 15) / 16 * 16 + 16;
  for (uint32_t i = lane; i < padded; i += 32) escapes[warp][i] = i < n ? stream[i] : 0;
  __syncwarp();
  const uint32_t* words = a.lane_bases + detail::lane_bases_index(a.bases_geometry, t.layer, t.head) +
                          t.half * detail::lane_base_words_per_half(C);
  constexpr int kKeyWords = 32 * (C / 16), kValueWords = 32 * (C / 8);
  if (t.key) {
    decode_tile_to_rows<C, true>(slot, escapes[warp], words, words + kKeyWords, lane, tiles[warp]);
  } else {
    decode_tile_to_rows<C, false>(slot, escapes[warp], words + 2 * kKeyWords, words + 2 * kKeyWords + kValueWords, lane, tiles[warp]);
  }
  __syncwarp();
  for (int v = lane; v < kTileTokens * kPieces; v += 32) {
    *reinterpret_cast<uint4*>(origin + (v / kPieces) * a.token_stride + (v % kPieces) * 8) =
        *reinterpret_cast<const uint4*>(tiles[warp] + (v / kPieces) * kRow<C> + (v % kPieces) * 8);
  }
}

// ---- host side ------------------------------------------------------------------------------------

size_t align_up(size_t n, size_t to) { return (n + to - 1) / to * to; }

/// The result words (kResultWords u64) in page-locked host memory, where a call reads them back with
/// a true asynchronous copy.
class PinnedResult {
 public:
  static constexpr size_t kResultWords = 3;
  PinnedResult() { check(cudaMallocHost(reinterpret_cast<void**>(&words_), kResultWords * 8), "cudaMallocHost"); }
  ~PinnedResult() { cudaFreeHost(words_); }
  PinnedResult(const PinnedResult&) = delete;
  PinnedResult& operator=(const PinnedResult&) = delete;
  uint64_t* words() const { return words_; }

 private:
  uint64_t* words_ = nullptr;
};

/// Device memory one call works in, on one device, and its pinned result words: allocated by the
/// first call that needs it (grown by a later one that needs more) and kept for the calls after.
struct Workspace {
  int device = 0;
  DeviceBuffer memory;
  PinnedResult result;
};

/// The workspaces no call holds. A call takes one of its device's (or a new one) and gives it back
/// when its stream is done with it, so that calls on many threads each have their own and no call
/// allocates once the codec has run.
class WorkspacePool {
 public:
  std::unique_ptr<Workspace> take(int device) {
    {
      const std::lock_guard lock(mutex_);
      for (auto it = idle_.begin(); it != idle_.end(); ++it) {
        if ((*it)->device != device) continue;
        std::unique_ptr<Workspace> w = std::move(*it);
        idle_.erase(it);
        return w;
      }
    }
    auto w = std::make_unique<Workspace>();
    w->device = device;
    return w;
  }
  void give_back(std::unique_ptr<Workspace> w) {
    const std::lock_guard lock(mutex_);
    idle_.push_back(std::move(w));
  }

 private:
  std::mutex mutex_;
  std::vector<std::unique_ptr<Workspace>> idle_;
};

}  // namespace

namespace {
/// A chunk size's layout and object size.
struct SizedLayout {
  ChunkLayout layout;
  size_t object_bytes = 0;
};
}  // namespace

/// The lane bases on each device a codec has run on, the workspaces of its calls, and the layouts of
/// the chunk sizes it has coded.
struct ChunkCodec::State {
  explicit State(const CalibrationTable& table, ChunkOptions options) : host(table, options) {}
  gaac::ChunkCodec host;
  PagedGeometry geometry;
  std::vector<uint32_t> lane_bases;
  std::mutex mutex;
  std::map<int, DeviceBuffer> on_device;  ///< device → lane bases
  std::map<int, SizedLayout> layouts;     ///< tokens → layout (a few sizes: LMCache's 256 and a last shorter one)
  WorkspacePool workspaces;

  /// The layout and object size of a chunk of `tokens`, computed once per size: they cost microseconds
  /// a chunk, a batch codes many. Kept for kMaxLayouts sizes at most.
  SizedLayout layout_for(int tokens) {
    static constexpr size_t kMaxLayouts = 64;
    const std::lock_guard lock(mutex);
    auto it = layouts.find(tokens);
    if (it != layouts.end()) return it->second;
    if (layouts.size() >= kMaxLayouts) layouts.clear();
    return layouts.emplace(tokens, SizedLayout{chunk_layout(host.geometry(tokens)), host.object_bytes(tokens)}).first->second;
  }

  /// The lane bases on the current device, copied there on first use.
  const uint32_t* current_lane_bases() {
    int device = 0;
    check(cudaGetDevice(&device), "cudaGetDevice");
    const std::lock_guard lock(mutex);
    auto it = on_device.find(device);
    if (it == on_device.end()) {
      DeviceBuffer l(lane_bases.size() * 4);
      l.upload(lane_bases.data(), lane_bases.size() * 4);
      it = on_device.emplace(device, std::move(l)).first;
    }
    return static_cast<const uint32_t*>(it->second.data());
  }
};

ChunkCodec::ChunkCodec(const CalibrationTable& calibration, ChunkOptions options)
    : state_(std::make_unique<State>(calibration, options)) {
  State& s = *state_;
  s.geometry.layers = calibration.layers();
  s.geometry.kv_heads = calibration.kv_heads();
  s.geometry.head_dim = calibration.head_dim();
  std::vector<uint8_t> bases(s.geometry.bases_bytes());
  for (int l = 0; l < calibration.layers(); ++l) {
    for (const TensorKind kind : {TensorKind::key, TensorKind::value}) {
      for (int which = 0; which < 2; ++which) {
        for (int h = 0; h < calibration.kv_heads(); ++h) {
          const auto src = which == 0 ? calibration.b3(kind, l, h) : calibration.b4(kind, l, h);
          std::copy(src.begin(), src.end(), bases.begin() + static_cast<std::ptrdiff_t>(s.geometry.bases_index(l, kind, which, h)));
        }
      }
    }
  }
  s.lane_bases.resize(detail::lane_bases_index(s.geometry, s.geometry.layers, 0));
  detail::fill_lane_bases(s.geometry, bases.data(), s.lane_bases.data());
}

ChunkCodec::~ChunkCodec() = default;

size_t ChunkCodec::object_bytes(int tokens) const { return state_->host.object_bytes(tokens); }

namespace {

/// The arguments every kernel shares, for a chunk view and an object buffer.
template <class Element>
Args make_args(const BasicChunkView<Element>& chunk, const ChunkLayout& layout, const PagedGeometry& geometry, uint8_t* object,
               size_t buffer_bytes, const char* what) {
  const auto aligned = [](const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; };
  if (!aligned(chunk.data) || !aligned(object)) throw Error(std::string(what) + ": the chunk and the object must be 16-byte aligned in device memory");
  const size_t strides[3] = {chunk.kind_stride, chunk.layer_stride, chunk.token_stride};
  for (const size_t stride : strides) {
    if (stride % 8 != 0) throw Error(std::string(what) + ": chunk strides must be multiples of 8 elements (16 bytes)");
  }
  Args a;
  a.values = const_cast<uint16_t*>(chunk.data);
  a.kind_stride = chunk.kind_stride, a.layer_stride = chunk.layer_stride, a.token_stride = chunk.token_stride;
  a.layers = layout.geometry.layers, a.kv_heads = layout.geometry.kv_heads, a.head_dim = layout.geometry.head_dim;
  a.tokens = layout.geometry.tokens;
  a.bases_geometry = geometry;
  a.object = object;
  a.buffer_bytes = buffer_bytes;
  a.tiles = layout.tiles(), a.tiles_per_tensor = layout.tiles_per_tensor;
  a.fixed_bytes = static_cast<uint32_t>(layout.fixed_bytes), a.map_bytes = static_cast<uint32_t>(layout.map_bytes);
  a.tail_bytes = static_cast<uint32_t>(layout.tail_bytes), a.raw_rest = static_cast<uint32_t>(layout.raw_stream_bytes());
  a.max_escapes = static_cast<uint32_t>(layout.shape.max_slot_capacity());
  a.tensor_bytes = layout.tensor_bytes, a.tensor_stride = layout.tensor_stride, a.first_tensor = layout.first_tensor_offset;
  a.metadata_offset = layout.metadata_offset, a.index_offset = layout.index_offset, a.escape_offset = layout.escape_offset;
  a.metadata_bytes = static_cast<uint32_t>(layout.metadata_bytes), a.index_bytes = static_cast<uint32_t>(layout.index_bytes);
  a.sections = static_cast<uint32_t>(layout.sections()), a.tensors = static_cast<uint32_t>(layout.tensors());
  a.metadata_pieces = (layout.metadata_bytes + kPieceBytes - 1) / kPieceBytes;
  a.index_pieces = (layout.index_bytes + kPieceBytes - 1) / kPieceBytes;
  a.tensor_pieces = (layout.tensor_bytes + kPieceBytes - 1) / kPieceBytes;
  const uint64_t escape_room = buffer_bytes > layout.escape_offset ? buffer_bytes - layout.escape_offset : 0;
  a.max_pieces = a.metadata_pieces + a.index_pieces + a.tensors * a.tensor_pieces + (escape_room + kPieceBytes - 1) / kPieceBytes;
  a.scratch_stride = static_cast<uint32_t>(align_up(layout.raw_stream_bytes(), 16));
  return a;
}

/// A workspace of the pool's, held by one call and carved for its arguments (scratch for encoding,
/// sizes, offsets, piece and section checksums, the result words); given back when the call ends,
/// after its stream has finished with it.
class WorkspaceLease {
 public:
  WorkspaceLease(WorkspacePool& pool, Args& a, bool scratch, cudaStream_t stream) : pool_(pool), stream_(stream) {
    int device = 0;
    check(cudaGetDevice(&device), "cudaGetDevice");
    size_t at = 0;
    const auto take = [&](size_t bytes) {
      const size_t here = at;
      at = align_up(at + bytes, 256);
      return here;
    };
    const size_t scratch_at = take(scratch ? a.tiles * a.scratch_stride : 0), sizes_at = take(a.tiles * 4 + 4),
                 offsets_at = take(a.tiles * 4 + 4), hashes_at = take(a.max_pieces * 8 + 8), sums_at = take(a.sections * 8),
                 result_at = take(PinnedResult::kResultWords * 8);
    workspace_ = pool.take(device);
    if (workspace_->memory.bytes() < at) workspace_->memory = DeviceBuffer(at);
    uint8_t* base = static_cast<uint8_t*>(workspace_->memory.data());
    a.scratch = base + scratch_at;
    a.sizes = reinterpret_cast<uint32_t*>(base + sizes_at);
    a.offsets = reinterpret_cast<uint32_t*>(base + offsets_at);
    a.hashes = reinterpret_cast<uint64_t*>(base + hashes_at);
    a.section_sums = reinterpret_cast<uint64_t*>(base + sums_at);
    a.result = reinterpret_cast<uint64_t*>(base + result_at);
  }
  ~WorkspaceLease() {
    if (!finished_) cudaStreamSynchronize(stream_);  // a launch failed: the stream may still be using it
    pool_.give_back(std::move(workspace_));
  }
  WorkspaceLease(const WorkspaceLease&) = delete;
  WorkspaceLease& operator=(const WorkspaceLease&) = delete;

  /// Enqueues the copy of the kernels' result words to the pinned words result() reads.
  void copy_result(const Args& a) {
    check(cudaMemcpyAsync(workspace_->result.words(), a.result, PinnedResult::kResultWords * 8, cudaMemcpyDeviceToHost, stream_),
          "cudaMemcpyAsync");
  }
  /// The result words, once the caller has synchronised the stream after copy_result().
  const uint64_t* result() {
    finished_ = true;
    return workspace_->result.words();
  }

 private:
  WorkspacePool& pool_;
  cudaStream_t stream_;
  std::unique_ptr<Workspace> workspace_;
  bool finished_ = false;
};

Metadata metadata_of(const std::string& text) {
  if (text.size() > kMaxMetadata) throw Error("chunk metadata longer than " + std::to_string(kMaxMetadata) + " bytes");
  Metadata m;
  m.size = static_cast<uint32_t>(text.size());
  std::memcpy(m.bytes, text.data(), text.size());
  return m;
}

unsigned blocks_for(uint64_t items, unsigned per_block) { return static_cast<unsigned>(std::max<uint64_t>((items + per_block - 1) / per_block, 1)); }

/// The grid of the tile kernels: tile_blocks() and one block per section it fills or finishes (2L + 1).
unsigned tile_and_section_blocks(const Args& a) {
  return static_cast<unsigned>((a.tiles + kWarps - 1) / kWarps + 2 * static_cast<uint64_t>(a.layers) + 1);
}

/// The grid of a launch over the batch's first `count` chunks: the most blocks `blocks(args)` gives any
/// of them across, a chunk a row.
template <class Blocks>
dim3 batch_grid(const Batch& b, size_t count, Blocks blocks) {
  unsigned x = 1;
  for (size_t k = 0; k < count; ++k) x = std::max(x, static_cast<unsigned>(blocks(b.args[k])));
  return {x, static_cast<unsigned>(count)};
}

/// The encode's five launches for the batch's first `count` chunks (head dimension `head_dim`).
void launch_encode(const Batch& b, size_t count, int head_dim, cudaStream_t stream, const char* what) {
  const auto one = [](const Args&) { return 1u; };
  detail::with_head_shape(head_dim, what, [&]<int C, int P>() {
    encode_tiles_kernel<C, P><<<batch_grid(b, count, tile_and_section_blocks), kWarps * 32, 0, stream>>>(b);
  });
  place_streams_kernel<<<batch_grid(b, count, one), kScanThreads, 0, stream>>>(b);
  place_escapes_kernel<<<batch_grid(b, count, [](const Args& a) { return blocks_for(a.tiles, kWarps); }), kWarps * 32, 0, stream>>>(b);
  hash_pieces_kernel<<<batch_grid(b, count, [](const Args& a) { return blocks_for(a.max_pieces, kHashThreads / 4); }), kHashThreads, 0,
                       stream>>>(b);
  write_header_kernel<<<batch_grid(b, count, one), kHeaderThreads, 0, stream>>>(b);
  check(cudaGetLastError(), std::string(what) + " launch");
}

/// The decode's seven launches for the batch's first `count` chunks.
void launch_decode(const Batch& b, size_t count, int head_dim, cudaStream_t stream, const char* what) {
  const auto one = [](const Args&) { return 1u; };
  check_header_kernel<<<batch_grid(b, count, one), 256, 0, stream>>>(b);
  hash_pieces_kernel<<<batch_grid(b, count, [](const Args& a) { return blocks_for(a.max_pieces, kHashThreads / 4); }), kHashThreads, 0,
                       stream>>>(b);
  check_checksums_kernel<<<batch_grid(b, count, one), kHeaderThreads, 0, stream>>>(b);
  detail::with_head_shape(head_dim, what, [&]<int C, int P>() {
    count_streams_kernel<C, P><<<batch_grid(b, count, [](const Args& a) { return blocks_for(a.tiles, 128); }), 128, 0, stream>>>(b);
  });
  check_streams_kernel<<<batch_grid(b, count, one), kScanThreads, 0, stream>>>(b);
  check_escapes_kernel<<<batch_grid(b, count,
                                    [](const Args& a) {
                                      return std::min(blocks_for(a.buffer_bytes - a.escape_offset, 256 * 8), kMaxZeroCheckBlocks);
                                    }),
                         256, 0, stream>>>(b);
  detail::with_head_shape(head_dim, what, [&]<int C, int P>() {
    decode_tiles_kernel<C, P><<<batch_grid(b, count, tile_and_section_blocks), kWarps * 32, 0, stream>>>(b);
  });
  check(cudaGetLastError(), std::string(what) + " launch");
}

}  // namespace

size_t ChunkCodec::encode(const ChunkView& chunk, std::string_view key, uint8_t* out, size_t out_bytes, Stream stream) const {
  return encode_batch({&chunk, 1}, {&key, 1}, {&out, 1}, {&out_bytes, 1}, stream)[0];
}

std::vector<size_t> ChunkCodec::encode_batch(std::span<const ChunkView> chunks, std::span<const std::string_view> keys,
                                             std::span<uint8_t* const> outs, std::span<const size_t> out_bytes,
                                             Stream stream) const {
  State& s = *state_;
  const char* what = "cuda::ChunkCodec::encode";
  if (keys.size() != chunks.size() || outs.size() != chunks.size() || out_bytes.size() != chunks.size()) {
    throw Error(std::string(what) + ": as many keys and outputs as chunks are needed");
  }
  std::vector<size_t> sizes(chunks.size());
  std::vector<std::unique_ptr<WorkspaceLease>> leases;
  const auto batch = std::make_unique<Batch>();  // several KiB: not on the stack
  for (size_t first = 0; first < chunks.size(); first += kChunksInFlight) {
    const size_t count = std::min(kChunksInFlight, chunks.size() - first);
    leases.clear();
    for (size_t k = 0; k < count; ++k) {
      const size_t i = first + k;
      const ChunkView& chunk = chunks[i];
      if (chunk.geometry != s.host.geometry(chunk.geometry.tokens)) {
        throw Error(std::string(what) + ": chunk of " + chunk.geometry.describe() + " does not match the calibration's geometry (" +
                    s.host.geometry(chunk.geometry.tokens).describe() + ")");
      }
      const SizedLayout sized = s.layout_for(chunk.geometry.tokens);
      const ChunkLayout& layout = sized.layout;
      const size_t object_bytes = sized.object_bytes;
      if (out_bytes[i] < object_bytes) {
        throw Error(std::string(what) + ": output of " + std::to_string(out_bytes[i]) + " bytes is smaller than the " +
                    std::to_string(object_bytes) + " a chunk object of " + layout.geometry.describe() + " may take");
      }
      Args& a = batch->args[k];
      a = make_args(chunk, layout, s.geometry, outs[i], object_bytes, what);
      a.fixed_end = s.host.options().object_ratio != 0 ? object_bytes : 0;
      a.lane_bases = s.current_lane_bases();
      batch->meta[k] = metadata_of(chunk_metadata(layout.geometry, s.host.calibration_id(), chunk_key_id(keys[i])));
      leases.push_back(std::make_unique<WorkspaceLease>(s.workspaces, a, true, stream));
    }
    launch_encode(*batch, count, s.geometry.head_dim, stream, what);
    for (size_t k = 0; k < count; ++k) leases[k]->copy_result(batch->args[k]);
    check(cudaStreamSynchronize(stream), what);
    for (size_t i = first; i < first + count; ++i) {
      const uint64_t* result = leases[i - first]->result();
      if (result[1] & kTooLarge) {
        const SizedLayout sized = s.layout_for(chunks[i].geometry.tokens);
        throw Error(ErrorCode::out_of_space, "chunk of " + sized.layout.geometry.describe() + " needs " +
                                                 std::to_string(sized.layout.escape_offset + result[0]) +
                                                 " bytes, more than the fixed object size of " + std::to_string(sized.object_bytes) +
                                                 " (object_ratio " + std::to_string(s.host.options().object_ratio) + ")");
      }
      sizes[i] = result[2];
    }
  }
  return sizes;
}

void ChunkCodec::decode(const uint8_t* object, size_t object_bytes, std::string_view key, const MutableChunkView& chunk,
                        Stream stream) const {
  decode_batch({&object, 1}, {&object_bytes, 1}, {&key, 1}, {&chunk, 1}, stream);
}

void ChunkCodec::decode_batch(std::span<const uint8_t* const> objects, std::span<const size_t> object_bytes,
                              std::span<const std::string_view> keys, std::span<const MutableChunkView> chunks,
                              Stream stream) const {
  State& s = *state_;
  const char* what = "cuda::ChunkCodec::decode";
  if (object_bytes.size() != objects.size() || keys.size() != objects.size() || chunks.size() != objects.size()) {
    throw Error(std::string(what) + ": as many sizes, keys and chunks as objects are needed");
  }
  const auto host_verdict = [&](size_t i, const std::string& device_finding) {
    // The object, read by the CPU decoder into a scratch chunk: its message says what is wrong.
    const ChunkLayout layout = chunk_layout(chunks[i].geometry);
    std::vector<uint8_t> bytes(object_bytes[i]);
    check(cudaMemcpyAsync(bytes.data(), objects[i], object_bytes[i], cudaMemcpyDeviceToHost, stream), "cudaMemcpyAsync");
    check(cudaStreamSynchronize(stream), what);
    std::vector<uint16_t> values(layout.geometry.elements());
    try {
      s.host.decode(bytes, keys[i], dense_chunk_view(values.data(), layout.geometry));
      throw Error(std::string(what) + ": " + device_finding + ", which the CPU reader does not find: a device fault");
    } catch (const Error& e) {
      if (objects.size() == 1) throw;
      throw e.with_context("object " + std::to_string(i) + " of " + std::to_string(objects.size()));
    }
  };
  std::vector<std::unique_ptr<WorkspaceLease>> leases;
  const auto batch = std::make_unique<Batch>();
  for (size_t first = 0; first < objects.size(); first += kChunksInFlight) {
    const size_t count = std::min(kChunksInFlight, objects.size() - first);
    leases.clear();
    for (size_t k = 0; k < count; ++k) {
      const size_t i = first + k;
      const MutableChunkView& chunk = chunks[i];
      if (chunk.geometry != s.host.geometry(chunk.geometry.tokens)) {
        throw Error(std::string(what) + ": destination of " + chunk.geometry.describe() +
                    " does not match the calibration's geometry (" + s.host.geometry(chunk.geometry.tokens).describe() + ")");
      }
      const SizedLayout sized = s.layout_for(chunk.geometry.tokens);
      const ChunkLayout& layout = sized.layout;
      if (object_bytes[i] < layout.escape_offset) host_verdict(i, "an object shorter than its fixed parts");
      Args& a = batch->args[k];
      a = make_args(chunk, layout, s.geometry, const_cast<uint8_t*>(objects[i]), object_bytes[i], what);
      a.lane_bases = s.current_lane_bases();
      batch->meta[k] = metadata_of(chunk_metadata(layout.geometry, s.host.calibration_id(), chunk_key_id(keys[i])));
      leases.push_back(std::make_unique<WorkspaceLease>(s.workspaces, a, false, stream));
    }
    launch_decode(*batch, count, s.geometry.head_dim, stream, what);
    for (size_t k = 0; k < count; ++k) leases[k]->copy_result(batch->args[k]);
    check(cudaStreamSynchronize(stream), what);
    for (size_t i = first; i < first + count; ++i) {
      const uint64_t status = leases[i - first]->result()[1];
      if (status != 0) host_verdict(i, "status " + std::to_string(status));
    }
  }
}

}  // namespace gaac::cuda
