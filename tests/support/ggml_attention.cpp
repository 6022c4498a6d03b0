// Built with -ffp-contract=off: the fused multiply-adds are the ones written.
#include "support/ggml_attention.hpp"

#include <algorithm>
#include <cmath>

#include "gaac/bf16.hpp"

namespace gaac::test {
namespace {

/// Q·K as ggml's AVX2 BF16 dot: 32 lanes (four 8-lane accumulators) over 32-element chunks, reduced
/// pairwise in a fixed order.
float dot_bf16(const uint16_t* k, const float* q, int n) {
  float lanes[32] = {};
  for (int i = 0; i + 32 <= n; i += 32) {
    for (int l = 0; l < 32; ++l) lanes[l] = bf16_to_float(k[i + l]) * q[i + l] + lanes[l];
  }
  float v[8];
  for (int l = 0; l < 8; ++l) v[l] = (lanes[l] + lanes[16 + l]) + (lanes[8 + l] + lanes[24 + l]);
  float h[4];
  for (int l = 0; l < 4; ++l) h[l] = v[4 + l] + v[l];
  return (h[0] + h[2]) + (h[1] + h[3]);
}

}  // namespace

std::vector<float> ggml_attention(const DenseQuery& query) {
  const int hd = query.head_dim;
  std::vector<float> q(static_cast<size_t>(hd)), acc(static_cast<size_t>(hd), 0.0f), out(static_cast<size_t>(hd));
  for (int i = 0; i < hd; ++i) q[static_cast<size_t>(i)] = bf16_to_float(float_to_bf16(query.q[i]));
  float max = -INFINITY, sum = 0.0f;
  for (int p = query.first; p <= query.last; ++p) {
    const size_t at = static_cast<size_t>(p) * query.stride;
    const float s = dot_bf16(query.keys + at, q.data(), hd) * query.scale;
    float rescale = 1.0f, weight = 1.0f;
    if (s > max) {
      rescale = std::exp(max - s);
      max = s;
      for (float& a : acc) a *= rescale;
    } else {
      weight = std::exp(s - max);
    }
    for (int i = 0; i < hd; ++i) acc[static_cast<size_t>(i)] = std::fma(bf16_to_float(query.values[at + static_cast<size_t>(i)]), weight, acc[static_cast<size_t>(i)]);
    sum = std::fma(sum, rescale, weight);
  }
  const float inverse = (sum == 0.0f ? 0.0f : 1.0f / sum) * query.output_scale;
  for (int i = 0; i < hd; ++i) out[static_cast<size_t>(i)] = acc[static_cast<size_t>(i)] * inverse;
  return out;
}

std::vector<double> attention_in_double(const DenseQuery& query) {
  std::vector<double> scores;
  double top = -INFINITY;
  for (int p = query.first; p <= query.last; ++p) {
    double s = 0;
    for (int i = 0; i < query.head_dim; ++i) {
      s += static_cast<double>(bf16_to_float(float_to_bf16(query.q[i]))) *
           bf16_to_float(query.keys[static_cast<size_t>(p) * query.stride + static_cast<size_t>(i)]);
    }
    scores.push_back(s * query.scale);
    top = std::max(top, scores.back());
  }
  std::vector<double> out(static_cast<size_t>(query.head_dim), 0.0);
  double total = 0;
  for (double& s : scores) total += (s = std::exp(s - top));
  for (int p = query.first; p <= query.last; ++p) {
    const double w = scores[static_cast<size_t>(p - query.first)] / total;
    for (int i = 0; i < query.head_dim; ++i) {
      out[static_cast<size_t>(i)] += w * bf16_to_float(query.values[static_cast<size_t>(p) * query.stride + static_cast<size_t>(i)]);
    }
  }
  for (double& x : out) x *= query.output_scale;
  return out;
}

}  // namespace gaac::test
