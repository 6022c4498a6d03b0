// What gaac_chunk_fuzz and its seed corpus share: the codecs an input is decoded with, and how an
// input names one. Input: byte 0 picks the tile width (head_dim 64, 128 or 256, modulo 3), bytes 1
// and 2 the chunk's tokens (little-endian, modulo 301), the rest is the object.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

#include "gaac/chunk.hpp"
#include "gaac/synthetic.hpp"

namespace gaac::fuzz {

inline constexpr size_t kChunkInputHeader = 3;
inline constexpr int kChunkLayers = 2;
inline constexpr int kChunkKvHeads = 2;
inline constexpr const char* kChunkKey = "fuzz@0x0@0@00";

/// The head width input byte 0 picks.
inline int chunk_head_dim(uint8_t selector) { return 64 << (selector % 3); }
/// The token count bytes 1 and 2 give.
inline int chunk_tokens(uint8_t low, uint8_t high) { return (low | high << 8) % 301; }

/// The codec for a head width: calibrated on seeded synthetic KV, made once.
inline const ChunkCodec& chunk_codec(int head_dim) {
  static const auto make = [](int d) {
    const KvDump dump = make_synthetic_kv({.layers = kChunkLayers, .kv_heads = kChunkKvHeads, .head_dim = d, .tokens = 64, .seed = 5});
    const KvDump* dumps[] = {&dump};
    return std::make_unique<ChunkCodec>(calibrate(dumps));
  };
  static const std::unique_ptr<ChunkCodec> codecs[3] = {make(64), make(128), make(256)};
  return *codecs[head_dim == 64 ? 0 : head_dim == 128 ? 1 : 2];
}

}  // namespace gaac::fuzz
