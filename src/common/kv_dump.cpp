// The KV dump's value types: sizes and the shape checks every consumer of a dump relies on.
#include "gaac/kv_dump.hpp"

#include <cmath>

#include <string>

#include "gaac/error.hpp"
#include "gaac/fp8_dump.hpp"

namespace gaac {
namespace {

/// Head widths the tile format handles (docs/format.md, section 2).
bool supported_head_dim(int head_dim) { return head_dim == 64 || head_dim == 128 || head_dim == 256; }

/// "k.3", "v.0".
std::string tensor_name(char kind, size_t layer) { return std::string(1, kind) + "." + std::to_string(layer); }

/// Checks the shape fields of one tensor and returns its element count, without overflow.
template <class T>
size_t checked_elements(const BasicKvTensor<T>& t, const std::string& name) {
  if (t.tokens < 0 || t.kv_heads <= 0) {
    throw Error(name + ": needs tokens >= 0 and kv_heads > 0, got tokens " + std::to_string(t.tokens) +
                ", kv_heads " + std::to_string(t.kv_heads));
  }
  if (!supported_head_dim(t.head_dim)) {
    throw Error(name + ": head_dim is " + std::to_string(t.head_dim) + "; gaac supports head_dim 64, 128 or 256");
  }
  size_t elements = 0;
  if (__builtin_mul_overflow(static_cast<size_t>(t.tokens), static_cast<size_t>(t.kv_heads), &elements) ||
      __builtin_mul_overflow(elements, static_cast<size_t>(t.head_dim), &elements)) {
    throw Error(name + ": element count overflows");
  }
  return elements;
}

/// Checks one tensor's shape, data size, and agreement with the dump's first tensor.
template <class T>
void validate_tensor(const BasicKvTensor<T>& t, const std::string& name, const BasicKvTensor<T>& reference) {
  const size_t elements = checked_elements(t, name);
  if (t.data.size() != elements) {
    throw Error(name + ": holds " + std::to_string(t.data.size()) + " values but its shape [" +
                std::to_string(t.tokens) + ", " + std::to_string(t.kv_heads) + ", " + std::to_string(t.head_dim) +
                "] needs " + std::to_string(elements));
  }
  if (t.kv_heads != reference.kv_heads || t.head_dim != reference.head_dim) {
    throw Error(name + ": has kv_heads " + std::to_string(t.kv_heads) + " and head_dim " + std::to_string(t.head_dim) +
                " but k.0 has " + std::to_string(reference.kv_heads) + " and " + std::to_string(reference.head_dim) +
                "; every tensor of a dump must share them");
  }
}

/// The shape checks of validate_dump, for BF16 and FP8 layers alike.
template <class T>
void validate_layers(const std::vector<BasicKvLayer<T>>& layers) {
  if (layers.empty()) return;
  const BasicKvTensor<T>& reference = layers.front().k;
  for (size_t i = 0; i < layers.size(); ++i) {
    const BasicKvLayer<T>& layer = layers[i];
    validate_tensor(layer.k, tensor_name('k', i), reference);
    validate_tensor(layer.v, tensor_name('v', i), reference);
    if (layer.k.tokens != layer.v.tokens) {
      throw Error(tensor_name('k', i) + " has " + std::to_string(layer.k.tokens) + " tokens but " + tensor_name('v', i) +
                  " has " + std::to_string(layer.v.tokens) + "; K and V of a layer must have the same token count");
    }
  }
}

}  // namespace

size_t KvDump::bf16_bytes() const {
  size_t bytes = 0;
  for (const KvLayer& layer : layers) bytes += (layer.k.elements() + layer.v.elements()) * 2;
  return bytes;
}

void validate_dump(const KvDump& dump) { validate_layers(dump.layers); }

size_t Fp8KvDump::fp8_bytes() const {
  size_t bytes = 0;
  for (const Fp8KvLayer& layer : layers) bytes += layer.k.elements() + layer.v.elements();
  return bytes;
}

void validate_dump(const Fp8KvDump& dump) {
  if (!is_fp8(dump.format)) throw Error("an FP8 dump must be E4M3 or E5M2");
  validate_layers(dump.layers);
  if (dump.k_scales.empty() && dump.v_scales.empty()) return;
  if (dump.k_scales.size() != dump.layers.size() || dump.v_scales.size() != dump.layers.size()) {
    throw Error("an FP8 dump of " + std::to_string(dump.layers.size()) + " layers has " + std::to_string(dump.k_scales.size()) +
                " K scales and " + std::to_string(dump.v_scales.size()) + " V scales; it needs one per layer for each, or none");
  }
  for (size_t i = 0; i < dump.layers.size(); ++i) {
    for (const auto& [name, scale] : {std::pair{'k', dump.k_scales[i]}, std::pair{'v', dump.v_scales[i]}}) {
      if (!std::isfinite(scale) || !(scale > 0)) {
        throw Error("the scale of " + tensor_name(name, i) + " is " + std::to_string(scale) + "; scales must be finite and positive");
      }
    }
  }
}

}  // namespace gaac
