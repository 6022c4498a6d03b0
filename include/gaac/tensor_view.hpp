// Non-owning views of BF16 or FP8 tensors shaped like an engine's cache: [tokens, heads, channels].
#pragma once

#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "gaac/kv_dump.hpp"

namespace gaac {

/// A view of element bit patterns (BF16: uint16_t, FP8: uint8_t) shaped `[tokens, heads, head_dim]` with any strides (in elements, as
/// ggml's `nb` are in bytes): element (t, h, c) is `data[t·token_stride + h·head_stride + c]`. Channels
/// of one head are contiguous. `Element` is const (a read view) or not (a write view).
template <class Element>
struct BasicKvView {
  Element* data = nullptr;
  int tokens = 0;
  int heads = 0;
  int head_dim = 0;
  size_t token_stride = 0;  ///< elements from token t to token t+1
  size_t head_stride = 0;   ///< elements from head h to head h+1

  /// The first channel of (token, head).
  constexpr Element* at(int token, int head) const {
    return data + static_cast<size_t>(token) * token_stride + static_cast<size_t>(head) * head_stride;
  }
  /// The same view restricted to tokens first .. first+count-1.
  constexpr BasicKvView tokens_from(int first, int count) const {
    BasicKvView v = *this;
    v.data = at(first, 0);
    v.tokens = count;
    return v;
  }
  /// A read view of the same elements.
  template <class Other>
    requires(std::is_same_v<Other, const Element> && !std::is_const_v<Element>)
  constexpr operator BasicKvView<Other>() const {  // NOLINT: implicit by design, like T* → const T*
    return {data, tokens, heads, head_dim, token_stride, head_stride};
  }
};

/// A read view of BF16.
using KvView = BasicKvView<const uint16_t>;
/// A write view of BF16.
using MutableKvView = BasicKvView<uint16_t>;
/// A read view of FP8 bytes.
using Fp8KvView = BasicKvView<const uint8_t>;

/// A tensor's data in its dense `[tokens, kv_heads, head_dim]` order (BF16 or FP8).
template <class T>
BasicKvView<const T> view_of(const BasicKvTensor<T>& t) {
  return {t.data.data(), t.tokens, t.kv_heads, t.head_dim, static_cast<size_t>(t.kv_heads) * t.head_dim,
          static_cast<size_t>(t.head_dim)};
}
/// A write view of a tensor's data (sized to its shape).
template <class T>
BasicKvView<T> mutable_view_of(BasicKvTensor<T>& t) {
  return {t.data.data(), t.tokens, t.kv_heads, t.head_dim, static_cast<size_t>(t.kv_heads) * t.head_dim,
          static_cast<size_t>(t.head_dim)};
}

}  // namespace gaac
