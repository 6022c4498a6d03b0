// KV chunk objects (docs/format.md, section 15): one chunk of a model's cache, K and V of every layer
// for a run of tokens, as a storage or transfer system such as LMCache holds it, compressed
// losslessly into one self-describing, checksummed object in the .gaac container.
//
// Every tile's fixed part (sign+mantissa, codes, tags) has a fixed place, every tile's escape bytes
// go to one stream at the end, and an index gives where each tensor's escapes start, so an object is
// written and read by many threads (or a GPU) at once, each tensor in one pass, and is as small as
// the tiles packed exactly. Objects are of their own size, or all of one
// fixed size (an adapter that reads back exactly as many bytes as it was told an object takes).
#pragma once

#include "gaac/export.h"

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "gaac/calibration.hpp"
#include "gaac/format.hpp"
#include "gaac/tensor_view.hpp"
#include "gaac/tile_codec.hpp"

namespace gaac {

/// Container version of KV chunk objects: the .gaac container with section checksums over 4 KiB pieces
/// (docs/format.md, sections 12 and 15; versions 1 and 2 are snapshots).
inline constexpr uint16_t kChunkVersion = 3;

/// What a chunk holds: K and V of `layers` layers, `tokens` tokens each, `kv_heads` heads of `head_dim`
/// channels per token.
struct GAAC_API ChunkGeometry {
  int layers = 0;
  int kv_heads = 0;
  int head_dim = 0;
  int tokens = 0;

  /// Elements of K and V together.
  size_t elements() const { return 2 * static_cast<size_t>(layers) * tokens * kv_heads * head_dim; }
  /// Bytes of K and V as BF16.
  size_t bf16_bytes() const { return 2 * elements(); }
  /// "L layers × T tokens × H KV heads × D channels".
  std::string describe() const;
  bool operator==(const ChunkGeometry&) const = default;
};

/// Throws gaac::Error unless layers is 1..100,000, kv_heads 1..4,096, head_dim 64, 128 or 256 and
/// tokens 0..2^31−1.
GAAC_API void validate(const ChunkGeometry& geometry);

/// A chunk in memory: element (kind k — 0 K, 1 V —, layer l, token t, head h, channel c) at
/// `data[k·kind_stride + l·layer_stride + t·token_stride + h·head_dim + c]` (strides in elements, the
/// heads of a token consecutive). LMCache's `[2, layers, tokens, kv_heads · head_dim]` tensor is
/// dense_chunk_view().
template <class Element>
struct BasicChunkView {
  Element* data = nullptr;
  ChunkGeometry geometry;
  size_t kind_stride = 0;
  size_t layer_stride = 0;
  size_t token_stride = 0;

  /// K or V of one layer as a `[tokens, kv_heads, head_dim]` view.
  BasicKvView<Element> tensor(TensorKind kind, int layer) const {
    return {data + (kind == TensorKind::key ? 0 : kind_stride) + static_cast<size_t>(layer) * layer_stride,
            geometry.tokens,
            geometry.kv_heads,
            geometry.head_dim,
            token_stride,
            static_cast<size_t>(geometry.head_dim)};
  }
};
/// A read view of a chunk.
using ChunkView = BasicChunkView<const uint16_t>;
/// A write view of a chunk.
using MutableChunkView = BasicChunkView<uint16_t>;

/// The view of a dense `[2, layers, tokens, kv_heads · head_dim]` array at `data`.
template <class Element>
BasicChunkView<Element> dense_chunk_view(Element* data, const ChunkGeometry& g) {
  const size_t row = static_cast<size_t>(g.kv_heads) * g.head_dim;
  return {data, g, static_cast<size_t>(g.layers) * g.tokens * row, static_cast<size_t>(g.tokens) * row, row};
}

/// Where everything of a chunk object lies (docs/format.md, section 15): a function of the geometry
/// alone, so that every executor (CPU threads, the GPU) places every byte without looking at others.
struct GAAC_API ChunkLayout {
  ChunkGeometry geometry;
  TileShape shape;             ///< channels of a tile (K's shape; V's has the same sizes)
  size_t tiles_per_tensor = 0;  ///< tiles of one (layer, K/V): blocks × heads × halves
  size_t fixed_bytes = 0;       ///< fixed part of a tile: 22.5 bytes per channel
  size_t map_bytes = 0;         ///< storage map of a tensor section: one byte per tile, padded to 16
  size_t tail_bytes = 0;        ///< the last (tokens mod 16) tokens of one (layer, K/V), BF16
  size_t tensor_bytes = 0;      ///< bytes of one tensor section
  size_t metadata_bytes = 0;    ///< bytes of the metadata section
  uint64_t metadata_offset = 0;  ///< offset of the metadata section (right after the table)
  uint64_t index_offset = 0;     ///< offset of the index section: where each tensor's escapes start
  size_t index_bytes = 0;        ///< bytes of the index section: a u64 per tensor section
  uint64_t first_tensor_offset = 0;  ///< offset of the first tensor section (layer 0, K)
  uint64_t tensor_stride = 0;    ///< from one tensor section to the next (tensor_bytes, 64-aligned)
  uint64_t escape_offset = 0;    ///< offset of the escape section, the last one

  /// Sections: metadata, index, 2 × layers tensor sections, the escape section.
  size_t sections() const { return 3 + 2 * static_cast<size_t>(geometry.layers); }
  /// Tensor sections: 2 × layers, number 2·layer + kind.
  size_t tensors() const { return 2 * static_cast<size_t>(geometry.layers); }
  /// Tiles of the whole chunk.
  size_t tiles() const { return 2 * static_cast<size_t>(geometry.layers) * tiles_per_tensor; }
  /// Offset of the tensor section of (layer, kind): number 2·layer + kind after the metadata.
  uint64_t tensor_offset(int layer, TensorKind kind) const {
    return first_tensor_offset + (2 * static_cast<uint64_t>(layer) + (kind == TensorKind::key ? 0 : 1)) * tensor_stride;
  }
  /// Offset of tile `tile`'s fixed part in its tensor section's: after the map, tile by tile.
  uint64_t fixed_offset(size_t tile) const { return map_bytes + tile * fixed_bytes; }
  /// Escape-stream bytes of a raw tile (its bytes past the fixed part): the most any tile takes.
  size_t raw_stream_bytes() const { return shape.raw_bytes() - fixed_bytes; }
  /// The most an object can take: every tile raw.
  uint64_t max_object_bytes() const { return escape_offset + align(tiles() * raw_stream_bytes()); }

 private:
  static uint64_t align(uint64_t n) { return (n + 63) / 64 * 64; }
};

/// The layout of a chunk of `geometry` (validated).
GAAC_API ChunkLayout chunk_layout(const ChunkGeometry& geometry);

/// The metadata section of a chunk object: UTF-8 JSON, keys in this order: calibration, format
/// ("gaac-chunk"), head_dim, key, kv_heads, layers, tokens; the two ids as 16 lowercase hex digits.
GAAC_API std::string chunk_metadata(const ChunkGeometry& geometry, uint64_t calibration_id, uint64_t key_id);

/// The identity of a calibration table: XXH64 (seed 0) of its bases and capacities as a .gaac
/// snapshot's calibration section holds them.
GAAC_API uint64_t calibration_id(const CalibrationTable& calibration);
/// The identity of the key a chunk is stored under (any bytes): XXH64 (seed 0) of them.
GAAC_API uint64_t chunk_key_id(std::string_view key);

/// How objects are made.
struct GAAC_API ChunkOptions {
  /// Threads that code one chunk (the caller's thread among them): 1..256.
  int threads = 1;
  /// 0: every object takes its own size (encode() needs room for the most it can take). Otherwise
  /// every object of a geometry takes exactly ⌈BF16 bytes / object_ratio⌉ rounded up to whole 4 KiB
  /// pages (for O_DIRECT; the tokens of an incomplete last 16-token block, stored as BF16, counted at
  /// their own size), but never less than the tiles' fixed parts and the container take (chunks of a
  /// few tokens) nor more than an object can (the escape section padded with zeros); a chunk that does
  /// not fit is refused (ErrorCode::out_of_space). At least 1.
  double object_ratio = 0;
};

/// Bytes an object of a chunk of `geometry` takes under `options`: the fixed size (object_ratio > 0),
/// or the most it can take (every tile raw), a true upper bound. Needs no calibration.
GAAC_API size_t chunk_object_bytes(const ChunkGeometry& geometry, const ChunkOptions& options);

/// Encodes and decodes the chunk objects of one model's cache with one calibration, on the CPU
/// (the fastest tile codec it has). Thread-safe: any number of threads may call it at once.
class GAAC_API ChunkCodec {
 public:
  /// A codec for chunks of `calibration`'s geometry. Throws gaac::Error for a bad table or options.
  ChunkCodec(const CalibrationTable& calibration, ChunkOptions options = {});

  const CalibrationTable& calibration() const { return calibration_; }
  const ChunkOptions& options() const { return options_; }
  /// calibration_id() of the table, computed once.
  uint64_t calibration_id() const { return calibration_id_; }
  /// The geometry of a chunk of `tokens` tokens.
  ChunkGeometry geometry(int tokens) const;
  /// Bytes to hand encode() for a chunk of `tokens` tokens: the fixed object size, or the most an
  /// object can take (every tile raw), a true upper bound.
  size_t object_bytes(int tokens) const;

  /// Writes the object of `chunk` (its geometry must be this codec's) stored under `key` to `out`
  /// (at least object_bytes() long) and returns its size. Throws gaac::Error for a bad argument,
  /// and with ErrorCode::out_of_space for a chunk that does not fit the fixed object size.
  size_t encode(const ChunkView& chunk, std::string_view key, std::span<uint8_t> out) const;

  /// Reads the object at the start of `object` (bytes past its end are not looked at) into `chunk`,
  /// after checking everything: container, checksums, that it was made with this calibration, under
  /// `key`, for `chunk`'s geometry, every storage-map byte, tile and padding byte. Throws gaac::Error
  /// saying what is wrong; `chunk` then holds unspecified values.
  void decode(std::span<const uint8_t> object, std::string_view key, const MutableChunkView& chunk) const;

 private:
  CalibrationTable calibration_;
  ChunkOptions options_;
  uint64_t calibration_id_ = 0;
  CalibratedCodecs codecs_;
};

/// Learns a calibration from one chunk (both passes of gaac::calibrate over its values).
GAAC_API CalibrationTable calibrate_chunk(const ChunkView& chunk);

}  // namespace gaac
