// An in-memory KV dump: every layer's K and V as BF16 bit patterns, shaped like an engine's cache.
// (FP8 dumps, gaac/fp8_dump.hpp, share the tensor and layer types.)
#pragma once

#include "gaac/export.h"

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "gaac/format.hpp"

namespace gaac {

/// One cached tensor: `[tokens, kv_heads, head_dim]` elements, row-major (head_dim fastest). `T` is the
/// element's bit pattern: uint16_t for BF16 (KvTensor), uint8_t for FP8 (Fp8KvTensor, gaac/fp8_dump.hpp).
template <class T>
struct BasicKvTensor {
  int tokens = 0;
  int kv_heads = 0;
  int head_dim = 0;
  std::vector<T> data;

  /// Number of elements (tokens × kv_heads × head_dim).
  size_t elements() const { return static_cast<size_t>(tokens) * kv_heads * head_dim; }
  /// Element (token, head, channel).
  T at(int token, int head, int channel) const {
    return data[(static_cast<size_t>(token) * kv_heads + head) * head_dim + channel];
  }
};

/// One BF16 tensor (bit patterns).
using KvTensor = BasicKvTensor<uint16_t>;

/// One layer's cache. K is post-RoPE as an engine stores it. K and V share token count and shape.
template <class T>
struct BasicKvLayer {
  BasicKvTensor<T> k;
  BasicKvTensor<T> v;

  /// K or V.
  const BasicKvTensor<T>& of(TensorKind kind) const { return kind == TensorKind::key ? k : v; }
  BasicKvTensor<T>& of(TensorKind kind) { return kind == TensorKind::key ? k : v; }
};

/// One BF16 layer.
using KvLayer = BasicKvLayer<uint16_t>;

/// A whole KV dump (stored as the `k.<layer>` / `v.<layer>` tensors of a safetensors file, docs/format.md).
struct GAAC_API KvDump {
  std::vector<KvLayer> layers;
  /// Free-form metadata carried through (the safetensors `__metadata__` map).
  std::vector<std::pair<std::string, std::string>> metadata;

  /// KV heads shared by every tensor (0 for an empty dump).
  int kv_heads() const { return layers.empty() ? 0 : layers.front().k.kv_heads; }
  /// Head width shared by every tensor (0 for an empty dump).
  int head_dim() const { return layers.empty() ? 0 : layers.front().k.head_dim; }
  /// Total BF16 bytes of all K and V tensors.
  size_t bf16_bytes() const;
};

/// Throws gaac::Error unless every tensor has the same kv_heads and head_dim, K and V of a layer have
/// the same token count, each tensor's data matches its shape, and head_dim is 64, 128 or 256.
GAAC_API void validate_dump(const KvDump& dump);

}  // namespace gaac
