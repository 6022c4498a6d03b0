// What the attention tests share: shapes, random queries, the bit-for-bit comparison of outputs, and
// the filling of two caches (a compressed one and its uncompressed twin) with the same rows.
#pragma once

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include <gtest/gtest.h>

#include "attention/attention_internal.hpp"
#include "gaac/attention.hpp"
#include "gaac/kv_cache.hpp"
#include "gaac/synthetic.hpp"
#include "support/ggml_attention.hpp"

namespace gaac::test {

/// Shapes: query heads, KV heads, head width.
struct Shape {
  int q_heads, kv_heads, head_dim;
};

/// True when two floats have the same bit pattern (NaNs included).
inline bool same_bits(float a, float b) { return std::bit_cast<uint32_t>(a) == std::bit_cast<uint32_t>(b); }

/// `n` query values drawn from a standard normal distribution, seeded.
inline std::vector<float> random_q(size_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> d(0.0f, 1.0f);
  std::vector<float> q(n);
  for (float& x : q) x = d(rng);
  return q;
}

/// One layer of synthetic BF16 KV of `shape`: `tokens` tokens, seeded.
inline KvDump synthetic_layer(Shape shape, int tokens, uint64_t seed) {
  SyntheticKvSpec spec;
  spec.layers = 1;
  spec.kv_heads = shape.kv_heads;
  spec.head_dim = shape.head_dim;
  spec.tokens = tokens;
  spec.seed = seed;
  return make_synthetic_kv(spec);
}

/// The oracle's query of query head `h` of `q` at `position`, sliding window `window`, over dense BF16
/// `keys` and `values` (`[tokens, kv_heads, head_dim]`), scaled by 1/sqrt(head_dim).
inline DenseQuery dense_query(Shape shape, const std::vector<float>& q, const uint16_t* keys, const uint16_t* values, int h,
                              int position, int window) {
  const size_t head = static_cast<size_t>(h / (shape.q_heads / shape.kv_heads)) * shape.head_dim;
  DenseQuery dq;
  dq.q = q.data() + static_cast<size_t>(h) * shape.head_dim;
  dq.keys = keys + head;
  dq.values = values + head;
  dq.stride = static_cast<size_t>(shape.kv_heads) * shape.head_dim;
  dq.head_dim = shape.head_dim;
  dq.first = first_attended(position, window);
  dq.last = position;
  dq.scale = 1.0f / std::sqrt(static_cast<float>(shape.head_dim));
  return dq;
}

/// Options for `shape` (scores scaled by 1/sqrt(head_dim)) with the given path, splits and window.
inline AttentionOptions options_for(Shape shape, AttentionPath path, int splits, int window) {
  AttentionOptions o;
  o.q_heads = shape.q_heads;
  o.scale = 1.0f / std::sqrt(static_cast<float>(shape.head_dim));
  o.path = path;
  o.splits = splits;
  o.window = window;
  return o;
}

/// Every kernel set this build and CPU have, by name: scalar, and AVX2 and AVX-512 where available.
inline std::vector<std::pair<std::string, const attention::Kernels*>> kernel_sets() {
  std::vector<std::pair<std::string, const attention::Kernels*>> kernels{{"scalar", &attention::scalar_kernels()}};
  if (attention::avx2_kernels() != nullptr) kernels.emplace_back("avx2", attention::avx2_kernels());
  if (attention::avx512_kernels() != nullptr) kernels.emplace_back("avx512", attention::avx512_kernels());
  return kernels;
}

/// Appends tokens 0 .. tokens−1 of `k` and `v` (one layer) to sequence `a_id` of `a` and `b_id` of `b`
/// in uneven steps (1, 37, 3, 16, 90, 2, ...), so that the caches have tails, prefills and single tokens.
template <class Element>
void fill_twins(KvCache& a, SequenceId a_id, KvCache& b, SequenceId b_id, const BasicKvTensor<Element>& k,
                const BasicKvTensor<Element>& v, int tokens) {
  const int steps[] = {1, 37, 3, 16, 90, 2};
  for (int at = 0, i = 0; at < tokens; ++i) {
    const int n = std::min(steps[i % 6], tokens - at);
    const BasicKvView<const Element> kv[] = {view_of(k).tokens_from(at, n)};
    const BasicKvView<const Element> vv[] = {view_of(v).tokens_from(at, n)};
    EXPECT_EQ(a.append(a_id, kv, vv).status, CacheStatus::ok);
    EXPECT_EQ(b.append(b_id, kv, vv).status, CacheStatus::ok);
    at += n;
  }
}

}  // namespace gaac::test
