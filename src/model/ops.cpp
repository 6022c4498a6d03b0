// Portable versions of the forward-pass arithmetic (see ops.hpp for what each follows) and the choice
// of the AVX2 versions. Built with -ffp-contract=off: every fused multiply-add here is written as one.
#include "model/ops.hpp"

#include <array>
#include <bit>
#include <cmath>
#include <memory>
#include <vector>

#include "gaac/bf16.hpp"
#include "model/ops_avx2.hpp"
#include "model/quants.hpp"
#include "model/quants_q8.hpp"

namespace gaac::model::ops {
namespace {

bool use_avx2() {
  static const bool available = avx2::available();
  return available;
}

float silu(float x) { return x / (1.0f + exp_polynomial(0.0f - x)); }

float gelu_tanh(float x) {
  constexpr float kSqrt2OverPi = 0.79788456080286535587989211986876f;
  constexpr float kCoefficient = 0.044715f;
  // As ggml's compiler contracts it: 1 + c·x·x is one fused multiply-add.
  return 0.5f * x * (1.0f + std::tanh(kSqrt2OverPi * x * std::fma(kCoefficient * x, x, 1.0f)));
}

/// gelu_tanh of every fp16 value, rounded to fp16 and widened back: ggml's GELU table.
const std::array<float, 65536>& gelu_table() {
  static const auto table = [] {
    auto t = std::make_unique<std::array<float, 65536>>();
    for (uint32_t h = 0; h < 65536; ++h) {
      (*t)[h] = fp16_to_float(float_to_fp16(gelu_tanh(fp16_to_float(static_cast<uint16_t>(h)))));
    }
    return t;
  }();
  return *table;
}

}  // namespace

void rms_norm(const float* x, const float* w, int n, float eps, float* y) {
  double sum = 0;
  for (int i = 0; i < n; ++i) sum += static_cast<double>(x[i] * x[i]);
  const auto mean = static_cast<float>(sum / n);
  const float scale = 1.0f / std::sqrt(mean + eps);
  for (int i = 0; i < n; ++i) y[i] = x[i] * scale * w[i];
}

void rope(float* x, int d, int pos, float base, bool neox) {
  std::vector<float> cs(static_cast<size_t>(d / 2) * 2);
  rope_angles(d, pos, base, cs.data());
  rope_rotate(x, d, cs.data(), neox);
}

void rope_angles(int d, int pos, float base, float* cs) {
  const float theta_scale = std::pow(base, -2.0f / static_cast<float>(d));
  float theta = static_cast<float>(pos);
  for (int i = 0; i < d / 2; ++i, theta *= theta_scale) {
    cs[2 * i] = std::cos(theta);
    cs[2 * i + 1] = std::sin(theta);
  }
}

void rope_rotate(float* x, int d, const float* cs, bool neox) {
  for (int i = 0; i < d / 2; ++i) {
    const float c = cs[2 * i], s = cs[2 * i + 1];
    float& a = neox ? x[i] : x[2 * i];
    float& b = neox ? x[i + d / 2] : x[2 * i + 1];
    const float a0 = a, b0 = b;
    a = std::fma(a0, c, -(b0 * s));
    b = std::fma(a0, s, b0 * c);
  }
}

float exp_polynomial(float x) {
  // e^x = 2^n · (1 + j) with n = round(x / ln 2) and j a degree-5 polynomial in the remainder b.
  const float shift = 0x1.8p23f;
  const float z = std::fma(x, 0x1.715476p+0f, shift);
  const float n = z - shift;
  const float b = std::fma(-n, 0x1.7f7d1cp-20f, std::fma(-n, 0x1.62e4p-1f, x));
  const uint32_t e = std::bit_cast<uint32_t>(z) << 23;
  const float k = std::bit_cast<float>(e + std::bit_cast<uint32_t>(1.0f));
  const float u = b * b;
  const float j = std::fma(std::fma(std::fma(0x1.0e4020p-7f, b, 0x1.573e2ep-5f), u, std::fma(0x1.555e66p-3f, b, 0x1.fffdb6p-2f)),
                           u, 0x1.ffffecp-1f * b);
  if (!(std::fabs(n) > 126.0f)) return std::fma(k, j, k);
  // |n| > 126: 2^n is split in two factors so that neither over- nor underflows on its own.
  const uint32_t d = n <= 0.0f ? 0x82000000u : 0u;
  const float s1 = std::bit_cast<float>(d + 0x7f000000u);
  const float s2 = std::bit_cast<float>(e - d);
  if (std::fabs(n) > 192.0f) return s1 * s1;
  return std::fma(s2, j, s2) * s1;
}

void geglu(float* gate, const float* up, size_t n) {
  const auto& table = gelu_table();
  for (size_t i = 0; i < n; ++i) {
    const float x = gate[i];
    if (x <= -10.0f) {
      gate[i] = 0.0f;
    } else if (x >= 10.0f) {
      gate[i] = x * up[i];
    } else {
      gate[i] = table[float_to_fp16(x)] * up[i];
    }
  }
}

void swiglu(float* gate, const float* up, size_t n) {
  if (use_avx2()) return avx2::swiglu(gate, up, n);
  scalar::swiglu(gate, up, n);
}


namespace scalar {

void swiglu(float* gate, const float* up, size_t n) {
  for (size_t i = 0; i < n; ++i) gate[i] = silu(gate[i]) * up[i];
}

}  // namespace scalar
}  // namespace gaac::model::ops
