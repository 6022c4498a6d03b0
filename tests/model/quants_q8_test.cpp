// Quantized activations and integer block products (quants_q8.hpp): the quantizers against
// hand-computed blocks; the reference products against an exact (double) evaluation of ggml's
// formulas over the same quantized values, written here independently of the implementation; the
// AVX2 path against the reference (quantizers bit for bit, products within the stated bound, and
// invariant to how tokens and rows are grouped); values produced by ggml itself (llama.cpp's CPU
// backend); real GGUF rows; argument errors.
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "gaac/bf16.hpp"
#include "gaac/error.hpp"
#include "model/gguf.hpp"
#include "model/quants.hpp"
#include "model/quants_q8.hpp"
#include "support/models.hpp"

namespace gaac::model {
namespace {

const std::vector<GgmlType> kQuantTypes = {GgmlType::q4_0, GgmlType::q4_1, GgmlType::q5_0, GgmlType::q5_1,
                                           GgmlType::q8_0, GgmlType::q4_k, GgmlType::q5_k, GgmlType::q6_k};
const std::vector<GgmlType> kFloatTypes = {GgmlType::f32, GgmlType::f16, GgmlType::bf16};

std::string name(GgmlType type) { return ggml_type_info(type).name; }
bool k_quant(GgmlType type) { return type == GgmlType::q4_k || type == GgmlType::q5_k || type == GgmlType::q6_k; }
int64_t block_of(GgmlType type) { return ggml_type_info(type).block_elements; }
uint32_t bits_of(float v) { return std::bit_cast<uint32_t>(v); }

uint16_t le16(const uint8_t* p) { return static_cast<uint16_t>(p[0] | (p[1] << 8)); }
uint32_t le32(const uint8_t* p) {
  return static_cast<uint32_t>(p[0]) | (static_cast<uint32_t>(p[1]) << 8) | (static_cast<uint32_t>(p[2]) << 16) |
         (static_cast<uint32_t>(p[3]) << 24);
}

/// γ(n) = n·u/(1 − n·u), u = 2⁻²⁴: the relative error bound of n float roundings.
double gamma(int64_t n) {
  const double nu = static_cast<double>(n) * 0x1p-24;
  return nu / (1.0 - nu);
}

// ----------------------------------------------------------------------------------------------
// Deterministic inputs (splitmix64). The llama.cpp values below were produced from exactly these.

uint64_t next(uint64_t& s) {
  uint64_t z = (s += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

/// Multiples of 2^-12 in [−8, 8), one in 64 of them times 16: exact in float.
std::vector<float> golden_activations(uint64_t seed, int64_t n) {
  std::vector<float> x(static_cast<size_t>(n));
  for (auto& v : x) {
    v = std::ldexp(static_cast<float>(static_cast<int>(next(seed) >> 48) - 32768), -12);
    if (next(seed) % 64 == 0) v *= 16.0f;
  }
  return x;
}

/// Random block bytes with scales set to normal fp16 values of magnitude 2^-8 .. 2^-4 (signed where
/// the format's scale may be negative).
std::vector<uint8_t> golden_weights(GgmlType type, uint64_t seed, int64_t rows, int64_t cols) {
  const GgmlTypeInfo& info = ggml_type_info(type);
  std::vector<uint8_t> w(static_cast<size_t>(rows * cols / info.block_elements) * info.block_bytes);
  for (auto& b : w) b = static_cast<uint8_t>(next(seed) >> 56);
  const auto half = [&](bool negative) {
    return static_cast<uint16_t>((negative && (next(seed) & 1) ? 0x8000u : 0u) | (0x1C00u + (next(seed) >> 52)));
  };
  for (size_t at = 0; at < w.size(); at += info.block_bytes) {
    uint16_t a = 0, b = 0;
    size_t pa = 0, pb = SIZE_MAX;
    switch (type) {
      case GgmlType::q4_0:
      case GgmlType::q5_0:
      case GgmlType::q8_0: a = half(true); break;
      case GgmlType::q4_1:
      case GgmlType::q5_1:
        a = half(false);
        b = half(true);
        pb = 2;
        break;
      case GgmlType::q4_k:
      case GgmlType::q5_k:
        a = half(false);
        b = half(false);
        pb = 2;
        break;
      case GgmlType::q6_k:
        a = half(true);
        pa = 208;
        break;
      default: break;
    }
    w[at + pa] = static_cast<uint8_t>(a);
    w[at + pa + 1] = static_cast<uint8_t>(a >> 8);
    if (pb != SIZE_MAX) {
      w[at + pb] = static_cast<uint8_t>(b);
      w[at + pb + 1] = static_cast<uint8_t>(b >> 8);
    }
  }
  return w;
}

uint64_t fnv1a(const std::vector<uint8_t>& bytes) {
  uint64_t h = 0xCBF29CE484222325ull;
  for (uint8_t c : bytes) {
    h ^= c;
    h *= 0x100000001B3ull;
  }
  return h;
}

/// Activation rows of several kinds: normal, with outliers, with exact ties, with zero blocks,
/// tiny, huge.
std::vector<float> activations(int kind, int64_t n, std::mt19937& rng) {
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> x(static_cast<size_t>(n));
  for (auto& v : x) v = normal(rng);
  switch (kind) {
    case 1:
      for (size_t i = 0; i < x.size(); i += 37) x[i] *= 60.0f;
      break;
    case 2:
      for (auto& v : x) v = std::round(v * 8.0f) / 16.0f;
      break;
    case 3:
      for (size_t i = 0; i < x.size(); ++i) {
        if ((i / 32) % 3 == 1 || (i / 256) % 4 == 2) x[i] = 0.0f;
      }
      break;
    case 4:
      for (auto& v : x) v *= 1e-30f;
      break;
    case 5:
      for (auto& v : x) v *= 1e30f;
      break;
    default: break;
  }
  return x;
}
constexpr int kKinds = 6;

// ----------------------------------------------------------------------------------------------
// ggml's formulas evaluated exactly, from the block formats (independent of the implementation)

struct Exact {
  double value = 0;      // the formula in exact arithmetic (doubles; every product and sum here is exact or within 2^-50)
  double magnitude = 0;  // the same with every term's magnitude: the scale of the float rounding errors
};

double half(const uint8_t* p) { return static_cast<double>(fp16_to_float(le16(p))); }

/// 32 quants of a 32-element weight block (signed values), with d and m.
void weight_block32(GgmlType type, const uint8_t* b, int (&q)[32], double& d, double& m) {
  m = 0;
  d = half(b);
  switch (type) {
    case GgmlType::q4_0:
      for (int j = 0; j < 16; ++j) {
        q[j] = (b[2 + j] & 15) - 8;
        q[j + 16] = (b[2 + j] >> 4) - 8;
      }
      return;
    case GgmlType::q4_1:
      m = half(b + 2);
      for (int j = 0; j < 16; ++j) {
        q[j] = b[4 + j] & 15;
        q[j + 16] = b[4 + j] >> 4;
      }
      return;
    case GgmlType::q5_0:
    case GgmlType::q5_1: {
      const bool one = type == GgmlType::q5_1;
      if (one) m = half(b + 2);
      const uint32_t qh = le32(b + (one ? 4 : 2));
      const uint8_t* qs = b + (one ? 8 : 6);
      for (int j = 0; j < 32; ++j) {
        const int low = j < 16 ? (qs[j] & 15) : (qs[j - 16] >> 4);
        q[j] = (low | static_cast<int>(((qh >> j) & 1u) << 4)) - (one ? 0 : 16);
      }
      return;
    }
    case GgmlType::q8_0:
      for (int j = 0; j < 32; ++j) q[j] = static_cast<int8_t>(b[2 + j]);
      return;
    default: FAIL() << "not a 32-element type";
  }
}

/// Quants (element order; Q6_K without its −32), per-element scale and per-32 min of a K-quant
/// super-block, with d and dmin.
void weight_block256(GgmlType type, const uint8_t* b, int (&q)[256], int (&sc)[256], int (&mn)[8], double& d,
                     double& dmin) {
  if (type == GgmlType::q6_k) {
    d = half(b + 208);
    dmin = 0;
    for (int e = 0; e < 256; ++e) {
      const int h = e / 128, quarter = (e % 128) / 32, l = e % 32;
      const uint8_t lq = b[64 * h + 32 * (quarter & 1) + l];
      const int low = quarter < 2 ? (lq & 15) : (lq >> 4);
      const int high = (b[128 + 32 * h + l] >> (2 * quarter)) & 3;
      q[e] = low | (high << 4);
      sc[e] = static_cast<int8_t>(b[192 + e / 16]);
    }
    for (int& v : mn) v = 0;
    return;
  }
  d = half(b);
  dmin = half(b + 2);
  // The 12 scale bytes as ggml unpacks them: 8 six-bit scales, then 8 six-bit mins.
  uint32_t u[4];
  std::memcpy(u, b + 4, 12);
  u[3] = ((u[2] >> 4) & 0x0F0F0F0Fu) | (((u[1] >> 6) & 0x03030303u) << 4);
  const uint32_t aux = u[1] & 0x3F3F3F3Fu;
  u[1] = (u[2] & 0x0F0F0F0Fu) | (((u[0] >> 6) & 0x03030303u) << 4);
  u[2] = aux;
  u[0] &= 0x3F3F3F3Fu;
  uint8_t unpacked[16];
  std::memcpy(unpacked, u, 16);
  const bool five = type == GgmlType::q5_k;
  const uint8_t* qs = b + (five ? 48 : 16);
  for (int e = 0; e < 256; ++e) {
    const int c = e / 64, l = e % 32;
    const bool upper = (e % 64) >= 32;
    int v = upper ? (qs[32 * c + l] >> 4) : (qs[32 * c + l] & 15);
    if (five) v |= ((b[16 + l] >> (2 * c + (upper ? 1 : 0))) & 1) << 4;
    q[e] = v;
    sc[e] = unpacked[e / 32];
  }
  for (int j = 0; j < 8; ++j) mn[j] = unpacked[8 + j];
}

Exact exact_dot(GgmlType type, const uint8_t* w, const uint8_t* xq, int64_t cols) {
  Exact r;
  const ActivationType at = activation_type(type);
  if (!k_quant(type)) {
    const size_t wbytes = ggml_type_info(type).block_bytes, xbytes = at == ActivationType::q8_1 ? 36 : 34;
    for (int64_t b = 0; b < cols / 32; ++b, w += wbytes, xq += xbytes) {
      int q[32];
      double dw, mw;
      weight_block32(type, w, q, dw, mw);
      const double dx = half(xq);
      const double sx = at == ActivationType::q8_1 ? half(xq + 2) : 0.0;
      const auto* qx = reinterpret_cast<const int8_t*>(xq + (at == ActivationType::q8_1 ? 4 : 2));
      int64_t sum = 0, sum_abs = 0;
      for (int j = 0; j < 32; ++j) {
        sum += q[j] * qx[j];
        sum_abs += std::abs(q[j] * qx[j]);
      }
      r.value += dw * dx * static_cast<double>(sum) + mw * sx;
      r.magnitude += std::fabs(dw * dx) * static_cast<double>(sum_abs) + std::fabs(mw * sx);
    }
    return r;
  }
  const size_t wbytes = ggml_type_info(type).block_bytes;
  for (int64_t b = 0; b < cols / 256; ++b, w += wbytes, xq += 292) {
    int q[256], sc[256], mn[8];
    double dw, dmin;
    weight_block256(type, w, q, sc, mn, dw, dmin);
    const double dx = static_cast<double>(std::bit_cast<float>(le32(xq)));
    const auto* qx = reinterpret_cast<const int8_t*>(xq + 4);
    const int offset = type == GgmlType::q6_k ? 32 : 0;
    int64_t sum = 0, sum_abs = 0;
    for (int e = 0; e < 256; ++e) {
      sum += static_cast<int64_t>(sc[e]) * (q[e] - offset) * qx[e];
      // Q6_K: the AVX2 kernels sum unsigned quants and subtract 32·bsums, so bound both parts.
      sum_abs += static_cast<int64_t>(std::abs(sc[e])) * (std::abs(q[e] - offset) + 2 * offset) * std::abs(qx[e]);
    }
    int64_t mins = 0, mins_abs = 0;
    for (int j = 0; j < 8; ++j) {
      const int s = static_cast<int16_t>(le16(xq + 260 + 4 * j)) + static_cast<int16_t>(le16(xq + 262 + 4 * j));
      mins += static_cast<int64_t>(mn[j]) * s;
      mins_abs += static_cast<int64_t>(mn[j]) * std::abs(s);
    }
    r.value += dw * dx * static_cast<double>(sum) - dmin * dx * static_cast<double>(mins);
    r.magnitude += std::fabs(dw * dx) * static_cast<double>(sum_abs) + std::fabs(dmin * dx) * static_cast<double>(mins_abs);
  }
  return r;
}

double reference_bound(GgmlType type, int64_t cols, const Exact& e) { return gamma(cols / block_of(type) + 16) * e.magnitude; }
double avx2_bound(GgmlType type, int64_t cols, const Exact& e) { return gamma(2 * (cols / block_of(type)) + 16) * e.magnitude; }

// ----------------------------------------------------------------------------------------------
// Formats and conversions

TEST(QuantsQ8, ActivationTypes) {
  EXPECT_EQ(activation_type(GgmlType::f32), ActivationType::f32);
  EXPECT_EQ(activation_type(GgmlType::f16), ActivationType::f16);
  EXPECT_EQ(activation_type(GgmlType::bf16), ActivationType::bf16);
  for (GgmlType t : {GgmlType::q4_0, GgmlType::q5_0, GgmlType::q8_0}) EXPECT_EQ(activation_type(t), ActivationType::q8_0);
  for (GgmlType t : {GgmlType::q4_1, GgmlType::q5_1}) EXPECT_EQ(activation_type(t), ActivationType::q8_1);
  for (GgmlType t : {GgmlType::q4_k, GgmlType::q5_k, GgmlType::q6_k}) EXPECT_EQ(activation_type(t), ActivationType::q8_k);
  EXPECT_THROW(activation_type(static_cast<GgmlType>(10)), Error);
  EXPECT_EQ(activation_block_elements(ActivationType::q8_0), 32);
  EXPECT_EQ(activation_block_bytes(ActivationType::q8_0), 34u);
  EXPECT_EQ(activation_block_bytes(ActivationType::q8_1), 36u);
  EXPECT_EQ(activation_block_elements(ActivationType::q8_k), 256);
  EXPECT_EQ(activation_block_bytes(ActivationType::q8_k), 292u);
  EXPECT_EQ(activation_block_bytes(ActivationType::f16), 2u);
}

/// float_to_fp16 is the nearest fp16, ties to even: checked against fp16_to_float's values.
void expect_nearest_fp16(float v) {
  const uint16_t h = float_to_fp16(v);
  const double x = v, got = fp16_to_float(h);
  if (std::fabs(x) >= 65520.0) {
    ASSERT_EQ(h & 0x7FFFu, 0x7C00u) << v;
    return;
  }
  ASSERT_TRUE(std::isfinite(got)) << v;
  ASSERT_EQ(std::signbit(got), std::signbit(x)) << v;
  const uint16_t mag = h & 0x7FFFu, sign = h & 0x8000u;
  for (int step : {-1, 1}) {
    const int other = static_cast<int>(mag) + step;
    if (other < 0 || other > 0x7BFF) continue;
    const double alt = fp16_to_float(static_cast<uint16_t>(sign | other));
    const double dg = std::fabs(got - x), da = std::fabs(alt - x);
    ASSERT_LE(dg, da) << v << " → " << std::hex << h;
    if (dg == da) {
      ASSERT_EQ(mag & 1u, 0u) << "tie not to even: " << v;
    }
  }
}

TEST(QuantsQ8, Fp16RoundingIsNearestEven) {
  // Every fp16 value round-trips; every midpoint between neighbours goes to the even one.
  for (uint32_t h = 0; h < 0x7C00; ++h) {
    const auto bits = static_cast<uint16_t>(h);
    ASSERT_EQ(float_to_fp16(fp16_to_float(bits)), bits) << std::hex << h;
    ASSERT_EQ(float_to_fp16(-fp16_to_float(bits)), bits | 0x8000u) << std::hex << h;
    if (h + 1 < 0x7C00) {
      const float mid = static_cast<float>((static_cast<double>(fp16_to_float(bits)) + fp16_to_float(static_cast<uint16_t>(h + 1))) / 2);
      ASSERT_EQ(float_to_fp16(mid), (h & 1u) ? h + 1 : h) << std::hex << h;
    }
  }
  // All float exponents, with mantissas around the rounding boundaries and random ones.
  std::mt19937 rng(3);
  for (uint32_t top = 0; top < 0x10000; ++top) {
    for (uint32_t low : {0u, 1u, 0x0FFFu, 0x1000u, 0x1001u, 0x1FFFu, 0x2000u, 0xFFFFu, static_cast<uint32_t>(rng()) & 0xFFFFu}) {
      const float v = std::bit_cast<float>((top << 16) | low);
      if (std::isnan(v)) continue;
      expect_nearest_fp16(v);
      if (HasFatalFailure()) return;
    }
  }
  EXPECT_EQ(float_to_fp16(1.0f), 0x3C00u);
  EXPECT_EQ(float_to_fp16(65504.0f), 0x7BFFu);
  EXPECT_EQ(float_to_fp16(65519.99f), 0x7BFFu);
  EXPECT_EQ(float_to_fp16(65520.0f), 0x7C00u);
  EXPECT_EQ(float_to_fp16(-INFINITY), 0xFC00u);
  EXPECT_EQ(float_to_fp16(0x1p-25f), 0x0000u);          // half the smallest subnormal: tie to zero
  EXPECT_EQ(float_to_fp16(0x1.8p-25f), 0x0001u);
  EXPECT_EQ(float_to_fp16(0x1.8p-24f), 0x0002u);        // 1.5 subnormal steps: tie to even 2
  EXPECT_EQ(float_to_fp16(-0.0f), 0x8000u);
  EXPECT_EQ(float_to_fp16(NAN) & 0x7FFFu, 0x7E00u);
}

// ----------------------------------------------------------------------------------------------
// Quantizers on hand-computed blocks

using QuantizeRow = void (*)(GgmlType, const float*, int64_t, std::vector<uint8_t>&, Q8Rounding);

std::vector<std::pair<std::string, QuantizeRow>> quantizers() {
  std::vector<std::pair<std::string, QuantizeRow>> q = {{"reference", &scalar::quantize_activations},
                                                       {"dispatch", &quantize_activations}};
  if (avx2::available()) q.emplace_back("avx2", &avx2::quantize_activations);
  return q;
}

std::vector<int> quants_of(const std::vector<uint8_t>& bytes, size_t at, int n) {
  std::vector<int> q(static_cast<size_t>(n));
  for (int j = 0; j < n; ++j) q[static_cast<size_t>(j)] = static_cast<int8_t>(bytes[at + static_cast<size_t>(j)]);
  return q;
}

/// Three blocks: (A) amax 127, so d = 1 and the quants are the inputs rounded; (B) zeros; (C) amax 254.
std::vector<float> q8_blocks() {
  std::vector<float> x(96, 0.0f);
  const float a[] = {127, 0.5f, 1.5f, 2.5f, -0.5f, -1.5f, -2.5f, 63.5f, -127, 3.49f, -3.51f};
  std::copy(std::begin(a), std::end(a), x.begin());
  const float c[] = {-254, 1, 3, -1, 253};
  std::copy(std::begin(c), std::end(c), x.begin() + 64);
  return x;
}

std::vector<int> padded(std::vector<int> v) {
  v.resize(32, 0);
  return v;
}

TEST(QuantsQ8, Q8_0HandComputed) {
  const std::vector<float> x = q8_blocks();
  for (const auto& [label, quantize] : quantizers()) {
    SCOPED_TRACE(label);
    std::vector<uint8_t> out;
    quantize(GgmlType::q4_0, x.data(), 96, out, Q8Rounding::reference);
    ASSERT_EQ(out.size(), 3u * 34u);
    EXPECT_EQ(le16(&out[0]), 0x3C00u);  // d = 127/127
    EXPECT_EQ(quants_of(out, 2, 32), padded({127, 1, 2, 3, -1, -2, -3, 64, -127, 3, -4}));  // roundf: ties away from 0
    EXPECT_EQ(le16(&out[34]), 0u);
    EXPECT_EQ(quants_of(out, 36, 32), padded({}));
    EXPECT_EQ(le16(&out[68]), 0x4000u);  // d = 254/127 = 2
    EXPECT_EQ(quants_of(out, 70, 32), padded({-127, 1, 2, -1, 127}));

    quantize(GgmlType::q8_0, x.data(), 96, out, Q8Rounding::x86);
    EXPECT_EQ(le16(&out[0]), 0x3C00u);
    EXPECT_EQ(quants_of(out, 2, 32), padded({127, 0, 2, 2, 0, -2, -2, 64, -127, 3, -4}));  // ties to even
    EXPECT_EQ(quants_of(out, 70, 32), padded({-127, 0, 2, 0, 126}));
  }
}

TEST(QuantsQ8, Q8_1HandComputed) {
  const std::vector<float> x = q8_blocks();
  for (const auto& [label, quantize] : quantizers()) {
    SCOPED_TRACE(label);
    std::vector<uint8_t> out;
    quantize(GgmlType::q4_1, x.data(), 96, out, Q8Rounding::reference);
    ASSERT_EQ(out.size(), 3u * 36u);
    EXPECT_EQ(le16(&out[0]), 0x3C00u);
    EXPECT_EQ(le16(&out[2]), 0x53E0u);  // s = 63·1 = 63
    EXPECT_EQ(quants_of(out, 4, 32), padded({127, 1, 2, 3, -1, -2, -3, 64, -127, 3, -4}));
    EXPECT_EQ(le16(&out[36]), 0u);
    EXPECT_EQ(le16(&out[38]), 0u);
    EXPECT_EQ(le16(&out[72]), 0x4000u);
    EXPECT_EQ(le16(&out[74]), 0x4400u);  // s = (−127 + 1 + 2 − 1 + 127)·2 = 4
    quantize(GgmlType::q5_1, x.data(), 96, out, Q8Rounding::x86);
    EXPECT_EQ(le16(&out[2]), 0x53E0u);   // 127 + 0 + 2 + 2 + 0 − 2 − 2 + 64 − 127 + 3 − 4 = 63
    EXPECT_EQ(le16(&out[74]), 0x4000u);  // s = (−127 + 0 + 2 + 0 + 126)·2 = 2
    EXPECT_EQ(quants_of(out, 76, 32), padded({-127, 0, 2, 0, 126}));
  }
}

TEST(QuantsQ8, Q8_KHandComputed) {
  std::vector<float> x(768, 0.0f);
  // Block 0: the first largest magnitude is −127, so iscale = 1 and d = 1; quants round half to even.
  x[0] = 0.5f, x[1] = 1.5f, x[2] = 2.5f, x[3] = -0.5f, x[4] = 3.5f, x[5] = -127, x[6] = 100.25f, x[20] = 127, x[255] = -2.5f;
  // Block 1: the first largest magnitude is +254, so iscale = −0.5 and d = −2.
  x[256] = 254, x[257] = -254, x[258] = 3, x[259] = 1, x[260] = -1, x[261] = 5;
  // Block 2: zeros.
  for (const auto& [label, quantize] : quantizers()) {
    SCOPED_TRACE(label);
    std::vector<uint8_t> out;
    quantize(GgmlType::q6_k, x.data(), 768, out, Q8Rounding::reference);
    ASSERT_EQ(out.size(), 3u * 292u);
    EXPECT_EQ(le32(&out[0]), bits_of(1.0f));
    std::vector<int> want(256, 0);
    const int q0[] = {0, 2, 2, 0, 4, -127, 100};
    std::copy(std::begin(q0), std::end(q0), want.begin());
    want[20] = 127;
    want[255] = -2;
    EXPECT_EQ(quants_of(out, 4, 256), want);
    std::vector<int> bsums(16, 0);
    for (int j = 0; j < 16; ++j) bsums[static_cast<size_t>(j)] = static_cast<int16_t>(le16(&out[260 + 2 * static_cast<size_t>(j)]));
    std::vector<int> want_sums(16, 0);
    want_sums[0] = -19, want_sums[1] = 127, want_sums[15] = -2;
    EXPECT_EQ(bsums, want_sums);

    EXPECT_EQ(le32(&out[292]), bits_of(-2.0f));
    std::fill(want.begin(), want.end(), 0);
    const int q1[] = {-127, 127, -2, 0, 0, -2};
    std::copy(std::begin(q1), std::end(q1), want.begin());
    EXPECT_EQ(quants_of(out, 296, 256), want);
    EXPECT_EQ(static_cast<int16_t>(le16(&out[292 + 260])), -4);

    EXPECT_TRUE(std::all_of(out.begin() + 584, out.end(), [](uint8_t b) { return b == 0; }));
    // Q8_K has one rounding: the x86 choice does not apply.
    std::vector<uint8_t> again;
    quantize(GgmlType::q4_k, x.data(), 768, again, Q8Rounding::x86);
    EXPECT_EQ(again, out);
  }
}

TEST(QuantsQ8, FloatActivations) {
  const std::vector<float> x = {1.0f, 65504.0f, 65520.0f, 1.0f + 0x1p-11f, 1.0f + 0x3p-11f, 0x1p-25f, 0x1.8p-25f, -0.0f,
                                1.0f + 0x1p-8f, 1.0f + 0x3p-8f, -INFINITY};
  for (const auto& [label, quantize] : quantizers()) {
    SCOPED_TRACE(label);
    std::vector<uint8_t> out;
    quantize(GgmlType::f16, x.data(), static_cast<int64_t>(x.size()), out, Q8Rounding::reference);
    ASSERT_EQ(out.size(), 2 * x.size());
    const uint16_t f16[] = {0x3C00, 0x7BFF, 0x7C00, 0x3C00, 0x3C02, 0x0000, 0x0001, 0x8000, 0x3C04, 0x3C0C, 0xFC00};
    for (size_t i = 0; i < x.size(); ++i) EXPECT_EQ(le16(&out[2 * i]), f16[i]) << i;
    quantize(GgmlType::bf16, x.data(), static_cast<int64_t>(x.size()), out, Q8Rounding::reference);
    const uint16_t b16[] = {0x3F80, 0x4780, 0x4780, 0x3F80, 0x3F80, 0x3300, 0x3340, 0x8000, 0x3F80, 0x3F82, 0xFF80};
    for (size_t i = 0; i < x.size(); ++i) EXPECT_EQ(le16(&out[2 * i]), b16[i]) << i;
    quantize(GgmlType::f32, x.data(), static_cast<int64_t>(x.size()), out, Q8Rounding::reference);
    ASSERT_EQ(out.size(), 4 * x.size());
    for (size_t i = 0; i < x.size(); ++i) EXPECT_EQ(le32(&out[4 * i]), bits_of(x[i])) << i;
  }
  // Several tokens: the rounded values, widened back.
  for (GgmlType type : kFloatTypes) {
    QuantizedActivations q;
    quantize_activations(type, x.data(), static_cast<int64_t>(x.size()), 1, q);
    ASSERT_EQ(q.values.size(), x.size());
    for (size_t i = 0; i < x.size(); ++i) {
      const float want = type == GgmlType::f16    ? fp16_to_float(float_to_fp16(x[i]))
                         : type == GgmlType::bf16 ? bf16_to_float(float_to_bf16(x[i]))
                                                  : x[i];
      EXPECT_EQ(bits_of(q.values[i]), bits_of(want)) << name(type) << " " << i;
    }
  }
}

TEST(QuantsQ8, NonFiniteInputsStayDefined) {
  std::vector<float> x(256, 1.0f);
  x[3] = INFINITY;
  x[40] = NAN;
  x[100] = -INFINITY;
  for (const auto& [label, quantize] : quantizers()) {
    for (GgmlType type : {GgmlType::q8_0, GgmlType::q4_1, GgmlType::q4_k}) {
      for (Q8Rounding rounding : {Q8Rounding::reference, Q8Rounding::x86}) {
        std::vector<uint8_t> out;
        EXPECT_NO_THROW(quantize(type, x.data(), 256, out, rounding)) << label;
      }
    }
  }
}

// ----------------------------------------------------------------------------------------------
// AVX2 quantizers: bit-identical to the reference

TEST(QuantsQ8, Avx2QuantizersMatchReference) {
  if (!avx2::available()) GTEST_SKIP() << "no AVX2";
  std::mt19937 rng(11);
  for (GgmlType type : {GgmlType::q8_0, GgmlType::q4_1, GgmlType::q4_k, GgmlType::f16, GgmlType::bf16, GgmlType::f32}) {
    for (Q8Rounding rounding : {Q8Rounding::reference, Q8Rounding::x86}) {
      for (int kind = 0; kind < kKinds; ++kind) {
        SCOPED_TRACE(name(type) + " kind " + std::to_string(kind));
        const int64_t cols = 2048, tokens = 5;
        const std::vector<float> x = activations(kind, cols * tokens, rng);
        std::vector<uint8_t> a, b;
        scalar::quantize_activations(type, x.data(), cols, a, rounding);
        avx2::quantize_activations(type, x.data(), cols, b, rounding);
        ASSERT_EQ(a, b);
        QuantizedActivations qa, qb;
        prepare_activations(type, cols, tokens, qa, rounding);
        prepare_activations(type, cols, tokens, qb, rounding);
        scalar::quantize_activation_rows(x.data(), 0, tokens, qa);
        avx2::quantize_activation_rows(x.data(), 0, 2, qb);  // in two ranges, as threads would
        avx2::quantize_activation_rows(x.data(), 2, tokens, qb);
        ASSERT_EQ(qa.blocks, qb.blocks);
        ASSERT_EQ(qa.scales, qb.scales);
        ASSERT_EQ(qa.sums, qb.sums);
        ASSERT_EQ(qa.values.size(), qb.values.size());
        for (size_t i = 0; i < qa.values.size(); ++i) ASSERT_EQ(bits_of(qa.values[i]), bits_of(qb.values[i])) << i;
        if (!qa.blocks.empty()) {
          ASSERT_EQ(std::vector<uint8_t>(qa.blocks.begin(), qa.blocks.begin() + static_cast<ptrdiff_t>(qa.row_bytes)), a);
        }
      }
    }
  }
}

// ----------------------------------------------------------------------------------------------
// Products

/// Random weights (golden_weights), random activations, quantized, for one type.
struct Case {
  GgmlType type;
  int64_t rows, cols, tokens;
  std::vector<uint8_t> w;
  std::vector<float> x;
  QuantizedActivations q;
  size_t row_bytes() const { return w.size() / static_cast<size_t>(rows); }
};

Case make_case(GgmlType type, int64_t rows, int64_t cols, int64_t tokens, uint64_t seed, int kind,
               Q8Rounding rounding = Q8Rounding::reference) {
  Case c{type, rows, cols, tokens, golden_weights(type, seed, rows, cols), {}, {}};
  std::mt19937 rng(static_cast<uint32_t>(seed));
  c.x = activations(kind, cols * tokens, rng);
  quantize_activations(type, c.x.data(), cols, tokens, c.q, rounding);
  return c;
}

TEST(QuantsQ8, ReferenceWithinBoundOfExactFormula) {
  for (GgmlType type : kQuantTypes) {
    for (int64_t cols : {block_of(type), 8 * block_of(type), int64_t{4096}}) {
      for (int kind : {0, 1, 2, 3, 4}) {
        SCOPED_TRACE(name(type) + " cols " + std::to_string(cols) + " kind " + std::to_string(kind));
        const Case c = make_case(type, 6, cols, 2, static_cast<uint64_t>(cols * 10 + kind), kind);
        for (int64_t r = 0; r < c.rows; ++r) {
          for (int64_t t = 0; t < c.tokens; ++t) {
            const uint8_t* w = c.w.data() + static_cast<size_t>(r) * c.row_bytes();
            const uint8_t* xq = c.q.blocks.data() + static_cast<size_t>(t) * c.q.row_bytes;
            const Exact e = exact_dot(type, w, xq, cols);
            const double got = scalar::dot_row(type, w, xq, cols);
            ASSERT_LE(std::fabs(got - e.value), reference_bound(type, cols, e)) << "row " << r << " token " << t;
          }
        }
      }
    }
  }
}

using QuantizedMatmul = void (*)(GgmlType, const uint8_t*, size_t, int64_t, int64_t, int64_t, const QuantizedActivations&,
                                 float*, int64_t);

TEST(QuantsQ8, MatmulAgreesWithDotsAndBounds) {
  std::vector<std::pair<std::string, QuantizedMatmul>> impls = {{"reference", &scalar::matmul_rows_quantized},
                                                               {"dispatch", &matmul_rows_quantized}};
  if (avx2::available()) impls.emplace_back("avx2", &avx2::matmul_rows_quantized);
  for (GgmlType type : kQuantTypes) {
    for (int64_t tokens : {1, 2, 3, 5, 8, 70}) {
      const int64_t cols = k_quant(type) ? 1024 : 640, rows = 7, stride = 11;
      const Case c = make_case(type, rows, cols, tokens, static_cast<uint64_t>(tokens) * 31 + 5, static_cast<int>(tokens % 3));
      for (const auto& [label, mm] : impls) {
        SCOPED_TRACE(name(type) + " " + label + " tokens " + std::to_string(tokens));
        const float sentinel = 12345.0f;
        std::vector<float> y(static_cast<size_t>(tokens * stride), sentinel);
        mm(type, c.w.data(), c.row_bytes(), cols, 1, rows, c.q, y.data(), stride);
        for (int64_t t = 0; t < tokens; ++t) {
          for (int64_t r = 0; r < stride; ++r) {
            const float got = y[static_cast<size_t>(t * stride + r)];
            if (r < 1 || r >= rows) {
              ASSERT_EQ(got, sentinel) << "wrote outside the rows, t " << t << " r " << r;
              continue;
            }
            const uint8_t* w = c.w.data() + static_cast<size_t>(r) * c.row_bytes();
            const uint8_t* xq = c.q.blocks.data() + static_cast<size_t>(t) * c.q.row_bytes;
            const float ref = scalar::dot_row(type, w, xq, cols);
            if (label == "reference") {
              ASSERT_EQ(bits_of(got), bits_of(ref)) << "t " << t << " r " << r;
            } else {
              const Exact e = exact_dot(type, w, xq, cols);
              ASSERT_LE(std::fabs(got - e.value), avx2_bound(type, cols, e)) << "t " << t << " r " << r;
              ASSERT_LE(std::fabs(got - ref), avx2_bound(type, cols, e) + reference_bound(type, cols, e));
            }
          }
        }
      }
    }
  }
}

TEST(QuantsQ8, Avx2ResultsIndependentOfGrouping) {
  if (!avx2::available()) GTEST_SKIP() << "no AVX2";
  // The same row·token product whatever the token count, token position or row range (as ggml's
  // products are): llama.cpp's logits do not depend on its batch size, and neither may ours.
  for (GgmlType type : kQuantTypes) {
    SCOPED_TRACE(name(type));
    const int64_t cols = 512, rows = 9, tokens = 67;
    const Case c = make_case(type, rows, cols, tokens, 77, 1);
    std::vector<float> all(static_cast<size_t>(tokens * rows));
    avx2::matmul_rows_quantized(type, c.w.data(), c.row_bytes(), cols, 0, rows, c.q, all.data(), rows);
    for (int64_t t = 0; t < tokens; t += 5) {
      QuantizedActivations one;
      quantize_activations(type, c.x.data() + t * cols, cols, 1, one);
      for (int64_t r = 0; r < rows; ++r) {
        std::vector<float> y(static_cast<size_t>(r + 1));
        avx2::matmul_rows_quantized(type, c.w.data(), c.row_bytes(), cols, r, r + 1, one, y.data(), r + 1);
        ASSERT_EQ(bits_of(y[static_cast<size_t>(r)]), bits_of(all[static_cast<size_t>(t * rows + r)])) << "t " << t << " r " << r;
      }
    }
  }
}

using QuantizedTile = void (*)(GgmlType, const uint8_t*, size_t, int64_t, int64_t, int64_t, const QuantizedActivations&, int64_t,
                               int64_t, float*, int64_t);

TEST(QuantsQ8, TilesGiveTheWholeProductsBits) {
  // A product cut into tiles of tokens by rows (as the engine's threads take them) writes each value
  // once, with the bits of the whole product, and nothing outside its tile.
  std::vector<std::pair<std::string, QuantizedTile>> impls = {{"reference", &scalar::matmul_tile_quantized},
                                                             {"dispatch", &matmul_tile_quantized}};
  if (avx2::available()) impls.emplace_back("avx2", &avx2::matmul_tile_quantized);
  std::vector<GgmlType> types(std::begin(kQuantTypes), std::end(kQuantTypes));
  types.insert(types.end(), std::begin(kFloatTypes), std::end(kFloatTypes));
  for (GgmlType type : types) {
    const int64_t cols = k_quant(type) ? 512 : 256, rows = 13, tokens = 150;
    Case c = make_case(type, rows, cols, tokens, 41, 2);
    if (ggml_type_info(type).block_elements == 1) {
      for (uint8_t& b : c.w) b &= 0x3F;  // float weights: small, finite values in every format
    }
    for (const auto& [label, tile] : impls) {
      SCOPED_TRACE(name(type) + " " + label);
      std::vector<float> whole(static_cast<size_t>(tokens * rows)), tiled(whole.size(), std::nanf(""));
      tile(type, c.w.data(), c.row_bytes(), cols, 0, rows, c.q, 0, tokens, whole.data(), rows);
      for (int64_t t0 = 0; t0 < tokens; t0 += 64) {
        for (int64_t r0 = 0; r0 < rows; r0 += 5) {
          tile(type, c.w.data(), c.row_bytes(), cols, r0, std::min(rows, r0 + 5), c.q, t0, std::min(tokens, t0 + 64), tiled.data(), rows);
        }
      }
      for (size_t i = 0; i < whole.size(); ++i) ASSERT_EQ(bits_of(tiled[i]), bits_of(whole[i])) << i;
      std::vector<float> y(whole.size(), 7.0f);
      tile(type, c.w.data(), c.row_bytes(), cols, 2, 4, c.q, 10, 12, y.data(), rows);
      for (int64_t t = 0; t < tokens; ++t) {
        for (int64_t r = 0; r < rows; ++r) {
          const bool inside = t >= 10 && t < 12 && r >= 2 && r < 4;
          const float want = inside ? whole[static_cast<size_t>(t * rows + r)] : 7.0f;
          ASSERT_EQ(bits_of(y[static_cast<size_t>(t * rows + r)]), bits_of(want)) << "t " << t << " r " << r;
        }
      }
      EXPECT_THROW(tile(type, c.w.data(), c.row_bytes(), cols, 0, rows, c.q, 10, 9, y.data(), rows), Error);
      EXPECT_THROW(tile(type, c.w.data(), c.row_bytes(), cols, 0, rows, c.q, 0, tokens + 1, y.data(), rows), Error);
      EXPECT_THROW(tile(type, c.w.data(), c.row_bytes(), cols, 0, rows, c.q, -1, 3, y.data(), rows), Error);
    }
  }
}

TEST(QuantsQ8, FloatWeightsRoundTheActivations) {
  std::mt19937 rng(5);
  for (GgmlType type : kFloatTypes) {
    const int64_t rows = 5, cols = 77, tokens = 3;
    const size_t row_bytes = static_cast<size_t>(cols) * ggml_type_info(type).block_bytes;
    std::vector<uint8_t> w(row_bytes * rows);
    for (auto& b : w) b = static_cast<uint8_t>(rng() & 0x3F);  // small, finite values in every format
    const std::vector<float> x = activations(1, cols * tokens, rng);
    std::vector<float> rounded(x.size());
    for (size_t i = 0; i < x.size(); ++i) {
      rounded[i] = type == GgmlType::f16    ? fp16_to_float(float_to_fp16(x[i]))
                   : type == GgmlType::bf16 ? bf16_to_float(float_to_bf16(x[i]))
                                            : x[i];
    }
    QuantizedActivations q;
    quantize_activations(type, x.data(), cols, tokens, q);
    std::vector<float> want(static_cast<size_t>(rows * tokens)), got(want.size());
    scalar::matmul_rows(type, w.data(), row_bytes, cols, 0, rows, rounded.data(), tokens, want.data(), rows);
    scalar::matmul_rows_quantized(type, w.data(), row_bytes, cols, 0, rows, q, got.data(), rows);
    for (size_t i = 0; i < want.size(); ++i) EXPECT_EQ(bits_of(got[i]), bits_of(want[i])) << name(type) << " " << i;
    if (avx2::available()) {
      avx2::matmul_rows(type, w.data(), row_bytes, cols, 0, rows, rounded.data(), tokens, want.data(), rows);
      avx2::matmul_rows_quantized(type, w.data(), row_bytes, cols, 0, rows, q, got.data(), rows);
      for (size_t i = 0; i < want.size(); ++i) EXPECT_EQ(bits_of(got[i]), bits_of(want[i])) << name(type) << " " << i;
    }
    // The overload that converts X itself gives the same.
    std::vector<float> direct(want.size());
    matmul_rows_quantized(type, w.data(), row_bytes, cols, 0, rows, x.data(), tokens, direct.data(), rows);
    matmul_rows_quantized(type, w.data(), row_bytes, cols, 0, rows, q, got.data(), rows);
    for (size_t i = 0; i < want.size(); ++i) EXPECT_EQ(bits_of(direct[i]), bits_of(got[i])) << name(type) << " " << i;
  }
}

TEST(QuantsQ8, ConvertingOverloadEqualsPrequantized) {
  for (GgmlType type : kQuantTypes) {
    const Case c = make_case(type, 4, 512, 6, 9, 0);
    std::vector<float> a(24), b(24);
    matmul_rows_quantized(type, c.w.data(), c.row_bytes(), c.cols, 0, 4, c.x.data(), 6, a.data(), 4);
    matmul_rows_quantized(type, c.w.data(), c.row_bytes(), c.cols, 0, 4, c.q, b.data(), 4);
    for (size_t i = 0; i < a.size(); ++i) EXPECT_EQ(bits_of(a[i]), bits_of(b[i])) << name(type) << " " << i;
  }
}

// ----------------------------------------------------------------------------------------------
// Against ggml itself. Produced during development by calling the ggml of llama-cpp-python 0.3.36
// (libggml-base / libggml-cpu, x86 AVX2 build) on golden_activations / golden_weights: hashes of
// its activation blocks (quantize_row_*_ref and the CPU backend's from_float), and the float bits
// of its AVX2 dot products (what llama.cpp runs) and of its generic C ones (built with FMA
// contraction, so they may differ from our non-contracted reference in the last bits).

struct Golden {
  GgmlType type;
  uint64_t hash_reference, hash_cpu;
  uint32_t avx2[8], generic[8];
};

const Golden kGolden[] = {
    {GgmlType::q4_0, 0x9d934bec15ff1411ull, 0x9d934bec15ff1411ull, {0xc2ec8accu, 0x3fdaec00u, 0xc2efd7a6u, 0xc21715acu, 0xc1db1398u, 0xc2d6528du, 0xc2aaa1fau, 0xc2be16f4u}, {0xc2ec8ad0u, 0x3fdaec18u, 0xc2efd7afu, 0xc21715b0u, 0xc1db1389u, 0xc2d6528au, 0xc2aaa1f2u, 0xc2be16f6u}},
    {GgmlType::q4_1, 0xddb92ba14357dcbaull, 0xddb92ba14357dcbaull, {0xc287004au, 0xc2dc7084u, 0x41a6877cu, 0xc2ba6deau, 0xc31ff044u, 0xc3d60d64u, 0xc32578e5u, 0xc30d184du}, {0xc2870044u, 0xc2dc7083u, 0x41a6875au, 0xc2ba6de5u, 0xc31ff040u, 0xc3d60d61u, 0xc32578e5u, 0xc30d1850u}},
    {GgmlType::q5_0, 0xcc8007689d544e06ull, 0xcc8007689d544e06ull, {0xc323fcabu, 0x41af6f08u, 0x4246b0d4u, 0xc31de36du, 0x43868400u, 0x429494c2u, 0x4389f064u, 0x3e0bd800u}, {0xc323fcabu, 0x41af6f0cu, 0x4246b0ddu, 0xc31de36fu, 0x438683fcu, 0x429494b7u, 0x4389f063u, 0x3e0bd3afu}},
    {GgmlType::q5_1, 0x6f8576e1ab383fedull, 0x6f8576e1ab383fedull, {0xc32cd105u, 0xc399b10fu, 0xc3a5e941u, 0xc3d22959u, 0x42555ba1u, 0x430281ccu, 0xc3b7a66bu, 0xc3b906e7u}, {0xc32cd106u, 0xc399b10eu, 0xc3a5e93eu, 0xc3d22955u, 0x42555b8au, 0x430281c4u, 0xc3b7a664u, 0xc3b906e1u}},
    {GgmlType::q8_0, 0xf8853d69a44f3608ull, 0xf8853d69a44f3608ull, {0xc4f30a89u, 0x43e55eadu, 0x4512bd3fu, 0xc40c352du, 0xc3882219u, 0xc4ad0feeu, 0x452ff51bu, 0x450189e6u}, {0xc4f30a86u, 0x43e55eb2u, 0x4512bd41u, 0xc40c352bu, 0xc3882215u, 0xc4ad0ff2u, 0x452ff51cu, 0x450189e5u}},
    {GgmlType::q4_k, 0x97fb2e23b2b806ddull, 0x97fb2e23b2b806ddull, {0xc5086afau, 0xc64465fcu, 0xc592aac3u, 0xc58a25f8u, 0xc5173fbfu, 0xc63288a3u, 0xc64419c9u, 0x4504067cu}, {0xc5086afau, 0xc64465fcu, 0xc592aac4u, 0xc58a25f9u, 0xc5173fc4u, 0xc63288a4u, 0xc64419cau, 0x4504067bu}},
    {GgmlType::q5_k, 0xcacd0ad1f642d8dcull, 0xcacd0ad1f642d8dcull, {0x453c063cu, 0x4597b51du, 0xc58c9245u, 0xc5e935d9u, 0xc5cf7754u, 0x464a793eu, 0x45bf34f7u, 0xc411339cu}, {0x453c0636u, 0x4597b51bu, 0xc58c9247u, 0xc5e935dcu, 0xc5cf7752u, 0x464a793du, 0x45bf34f8u, 0xc41133bcu}},
    {GgmlType::q6_k, 0xec4092cb68e1dd0aull, 0xec4092cb68e1dd0aull, {0x460ae9d2u, 0xc73f457cu, 0xc683cefau, 0xc60872f4u, 0x4730a3dbu, 0x44f517a0u, 0x458a72c0u, 0x466a5ea0u}, {0x460ae9d2u, 0xc73f457bu, 0xc683ceffu, 0xc60872feu, 0x4730a3dau, 0x44f517a8u, 0x458a72d0u, 0x466a5e99u}},
};

TEST(QuantsQ8, MatchesGgml) {
  const int64_t cols = 4096, rows = 8;
  uint64_t index = 0;
  for (const Golden& g : kGolden) {
    ++index;
    SCOPED_TRACE(name(g.type));
    const std::vector<float> x = golden_activations(1000 + index, cols);
    const std::vector<uint8_t> w = golden_weights(g.type, 2000 + index, rows, cols);
    const size_t row_bytes = w.size() / rows;
    for (const auto& [label, quantize] : quantizers()) {
      std::vector<uint8_t> q;
      quantize(g.type, x.data(), cols, q, Q8Rounding::reference);
      EXPECT_EQ(fnv1a(q), g.hash_reference) << label;
      quantize(g.type, x.data(), cols, q, Q8Rounding::x86);
      EXPECT_EQ(fnv1a(q), g.hash_cpu) << label;
    }
    QuantizedActivations q;
    quantize_activations(g.type, x.data(), cols, 1, q);
    float ref[rows] = {}, fast[rows] = {};
    scalar::matmul_rows_quantized(g.type, w.data(), row_bytes, cols, 0, rows, q, ref, rows);
    if (avx2::available()) avx2::matmul_rows_quantized(g.type, w.data(), row_bytes, cols, 0, rows, q, fast, rows);
    for (int64_t r = 0; r < rows; ++r) {
      const Exact e = exact_dot(g.type, w.data() + static_cast<size_t>(r) * row_bytes, q.blocks.data(), cols);
      const float ggml_avx2 = std::bit_cast<float>(g.avx2[r]), ggml_generic = std::bit_cast<float>(g.generic[r]);
      // ggml's own results satisfy the bounds too (a check of the bounds and of exact_dot).
      EXPECT_LE(std::fabs(ggml_avx2 - e.value), avx2_bound(g.type, cols, e)) << r;
      EXPECT_LE(std::fabs(ggml_generic - e.value), reference_bound(g.type, cols, e)) << r;
      EXPECT_LE(std::fabs(ref[r] - ggml_generic), 2 * reference_bound(g.type, cols, e)) << r;
      if (avx2::available()) {
        EXPECT_EQ(bits_of(fast[r]), g.avx2[r]) << "row " << r << ": not ggml's AVX2 result";
      }
    }
  }
  // A block of ties, where ggml's two Q8_0/Q8_1 quantizers differ.
  std::vector<float> ties(32);
  for (int j = 0; j < 32; ++j) ties[static_cast<size_t>(j)] = (j % 2 ? -1.0f : 1.0f) * (static_cast<float>(j) + 0.5f);
  ties[31] = 127.0f;
  for (const auto& [label, quantize] : quantizers()) {
    std::vector<uint8_t> q;
    quantize(GgmlType::q8_0, ties.data(), 32, q, Q8Rounding::reference);
    EXPECT_EQ(fnv1a(q), 0x76b6bcbc70c8c854ull) << label;
    quantize(GgmlType::q8_0, ties.data(), 32, q, Q8Rounding::x86);
    EXPECT_EQ(fnv1a(q), 0x1331059fed9d85b4ull) << label;
    quantize(GgmlType::q4_1, ties.data(), 32, q, Q8Rounding::reference);
    EXPECT_EQ(fnv1a(q), 0x95a5c6bbe523217cull) << label;
    quantize(GgmlType::q4_1, ties.data(), 32, q, Q8Rounding::x86);
    EXPECT_EQ(fnv1a(q), 0x5e329d098dce3b39ull) << label;
  }
}

// ----------------------------------------------------------------------------------------------
// Real models

/// For each quantized type in the model: a few rows of a few tensors against activations drawn like
/// a hidden state. Checks AVX2 against the reference and both against the exact formula, and the
/// quantized product against the float product (matmul_rows) within the activations' quantization
/// error: |Σ w·(x̂ − x)| ≤ Σ_blocks 0.6·|d_x|·Σ|w| (rounding to d_x/2, plus fp16 rounding of d_x),
/// plus |m_w|·|s_x − d_x·Σq_x| ≤ 4·|m_w|·|d_x| for Q4_1/Q5_1.
void check_model(const std::string& path, const std::vector<GgmlType>& expected) {
  const GgufFile file = GgufFile::open(path);
  std::mt19937 rng(99);
  std::vector<GgmlType> seen;
  for (GgmlType type : kQuantTypes) {
    int tensors = 0;
    for (const GgufTensor& tensor : file.tensors()) {
      if (tensor.type != type || tensor.ne.size() != 2 || tensors == 3) continue;
      ++tensors;
      const int64_t cols = tensor.row_elements(), rows = std::min<int64_t>(tensor.rows(), 6);
      const size_t row_bytes = tensor.row_bytes();
      SCOPED_TRACE(tensor.name);
      const std::vector<float> x = activations(1, cols * 2, rng);
      QuantizedActivations q;
      quantize_activations(type, x.data(), cols, 2, q);
      std::vector<float> ref(static_cast<size_t>(rows * 2)), fast(ref.size()), flt(ref.size());
      scalar::matmul_rows_quantized(type, tensor.bytes.data(), row_bytes, cols, 0, rows, q, ref.data(), rows);
      if (avx2::available()) avx2::matmul_rows_quantized(type, tensor.bytes.data(), row_bytes, cols, 0, rows, q, fast.data(), rows);
      scalar::matmul_rows(type, tensor.bytes.data(), row_bytes, cols, 0, rows, x.data(), 2, flt.data(), rows);
      std::vector<float> w(static_cast<size_t>(cols));
      const int64_t xblock = activation_block_elements(q.type);
      for (int64_t r = 0; r < rows; ++r) {
        const uint8_t* wr = tensor.bytes.data() + static_cast<size_t>(r) * row_bytes;
        scalar::dequantize_row(type, wr, w.data(), cols);
        for (int64_t t = 0; t < 2; ++t) {
          const size_t i = static_cast<size_t>(t * rows + r);
          const uint8_t* xq = q.blocks.data() + static_cast<size_t>(t) * q.row_bytes;
          const Exact e = exact_dot(type, wr, xq, cols);
          ASSERT_LE(std::fabs(ref[i] - e.value), reference_bound(type, cols, e)) << "row " << r;
          if (avx2::available()) {
            ASSERT_LE(std::fabs(fast[i] - e.value), avx2_bound(type, cols, e)) << "row " << r;
          }
          double allowed = 0, magnitude = 0;
          for (int64_t b = 0; b < cols / xblock; ++b) {
            const uint8_t* xb = xq + static_cast<size_t>(b) * activation_block_bytes(q.type);
            const double dx = q.type == ActivationType::q8_k ? std::fabs(static_cast<double>(std::bit_cast<float>(le32(xb))))
                                                             : std::fabs(half(xb));
            double wsum = 0;
            for (int64_t i2 = b * xblock; i2 < (b + 1) * xblock; ++i2) {
              wsum += std::fabs(static_cast<double>(w[static_cast<size_t>(i2)]));
              magnitude += std::fabs(static_cast<double>(w[static_cast<size_t>(i2)]) * x[static_cast<size_t>(t * cols + i2)]);
            }
            allowed += 0.6 * dx * wsum;
            if (type == GgmlType::q4_1 || type == GgmlType::q5_1) {
              allowed += 4.0 * dx * std::fabs(half(wr + static_cast<size_t>(b) * ggml_type_info(type).block_bytes + 2));
            }
          }
          allowed += gamma(cols + 1) * magnitude + reference_bound(type, cols, e);
          ASSERT_LE(std::fabs(ref[i] - flt[i]), allowed) << "row " << r << ": quantized " << ref[i] << " float " << flt[i];
        }
      }
    }
    if (tensors > 0) seen.push_back(type);
  }
  EXPECT_EQ(seen, expected);
}

TEST(QuantsQ8RealModels, SmolLM2Rows) {
  GAAC_REQUIRE_MODEL(path, "smollm2");
  check_model(path, {GgmlType::q4_1, GgmlType::q8_0});
}

TEST(QuantsQ8RealModels, Gemma3Rows) {
  GAAC_REQUIRE_MODEL(path, "gemma3");
  check_model(path, {GgmlType::q5_0, GgmlType::q8_0, GgmlType::q4_k, GgmlType::q6_k});
}

// ----------------------------------------------------------------------------------------------
// Arguments

TEST(QuantsQ8Arguments, Quantizers) {
  std::vector<float> x(512, 1.0f);
  for (const auto& [label, quantize] : quantizers()) {
    SCOPED_TRACE(label);
    std::vector<uint8_t> out;
    EXPECT_THROW(quantize(static_cast<GgmlType>(10), x.data(), 256, out, Q8Rounding::reference), Error);
    EXPECT_THROW(quantize(GgmlType::q4_k, x.data(), 128, out, Q8Rounding::reference), Error);
    EXPECT_THROW(quantize(GgmlType::q8_0, x.data(), 33, out, Q8Rounding::reference), Error);
    EXPECT_THROW(quantize(GgmlType::q8_0, x.data(), -32, out, Q8Rounding::reference), Error);
    EXPECT_THROW(quantize(GgmlType::q8_0, nullptr, 32, out, Q8Rounding::reference), Error);
    EXPECT_NO_THROW(quantize(GgmlType::q8_0, nullptr, 0, out, Q8Rounding::reference));
    EXPECT_TRUE(out.empty());
    EXPECT_NO_THROW(quantize(GgmlType::f16, x.data(), 3, out, Q8Rounding::reference));
    EXPECT_EQ(out.size(), 6u);
  }
  QuantizedActivations q;
  EXPECT_THROW(prepare_activations(GgmlType::q4_k, 100, 1, q), Error);
  EXPECT_THROW(prepare_activations(GgmlType::q8_0, 64, -1, q), Error);
  EXPECT_THROW(prepare_activations(static_cast<GgmlType>(11), 256, 1, q), Error);
  EXPECT_THROW(quantize_activation_rows(x.data(), 0, 1, q), Error);  // not prepared for a token
  prepare_activations(GgmlType::q8_0, 64, 4, q);
  EXPECT_THROW(quantize_activation_rows(x.data(), 2, 5, q), Error);
  EXPECT_THROW(quantize_activation_rows(x.data(), 3, 2, q), Error);
  EXPECT_THROW(quantize_activation_rows(x.data(), -1, 2, q), Error);
  EXPECT_THROW(quantize_activation_rows(nullptr, 0, 2, q), Error);
  EXPECT_NO_THROW(quantize_activation_rows(nullptr, 2, 2, q));
  EXPECT_NO_THROW(quantize_activation_rows(x.data(), 0, 4, q));
  q.blocks.pop_back();
  EXPECT_THROW(quantize_activation_rows(x.data(), 0, 4, q), Error);
  EXPECT_THROW(scalar::quantize_activation_rows(x.data(), 0, 4, q), Error);
}

TEST(QuantsQ8Arguments, Products) {
  std::vector<QuantizedMatmul> impls = {&scalar::matmul_rows_quantized, &matmul_rows_quantized};
  if (avx2::available()) impls.push_back(&avx2::matmul_rows_quantized);
  std::vector<uint8_t> w(144 * 8, 0);
  std::vector<float> x(1024, 0.5f), y(64);
  QuantizedActivations q;
  quantize_activations(GgmlType::q4_k, x.data(), 256, 2, q);
  for (QuantizedMatmul mm : impls) {
    EXPECT_NO_THROW(mm(GgmlType::q4_k, w.data(), 144, 256, 0, 2, q, y.data(), 2));
    EXPECT_THROW(mm(GgmlType::q5_k, w.data(), 176, 256, 0, 2, q, y.data(), 2), Error);          // converted for Q4_K
    EXPECT_THROW(mm(GgmlType::q4_k, w.data(), 288, 512, 0, 2, q, y.data(), 2), Error);          // columns differ
    EXPECT_THROW(mm(static_cast<GgmlType>(10), w.data(), 144, 256, 0, 2, q, y.data(), 2), Error);
    EXPECT_THROW(mm(GgmlType::q4_k, w.data(), 143, 256, 0, 2, q, y.data(), 2), Error);          // row bytes
    EXPECT_THROW(mm(GgmlType::q4_k, w.data(), 144, 256, 2, 1, q, y.data(), 2), Error);          // reversed rows
    EXPECT_THROW(mm(GgmlType::q4_k, w.data(), 144, 256, -1, 1, q, y.data(), 2), Error);
    EXPECT_THROW(mm(GgmlType::q4_k, w.data(), 144, 256, 0, 2, q, y.data(), 1), Error);          // y stride
    EXPECT_THROW(mm(GgmlType::q4_k, nullptr, 144, 256, 0, 2, q, y.data(), 2), Error);
    EXPECT_THROW(mm(GgmlType::q4_k, w.data(), 144, 256, 0, 2, q, nullptr, 2), Error);
    EXPECT_NO_THROW(mm(GgmlType::q4_k, nullptr, 144, 256, 1, 1, q, y.data(), 2));              // no rows
    QuantizedActivations broken = q;
    broken.blocks.resize(10);
    EXPECT_THROW(mm(GgmlType::q4_k, w.data(), 144, 256, 0, 2, broken, y.data(), 2), Error);
  }
  // The converting overload checks before converting.
  EXPECT_THROW(matmul_rows_quantized(GgmlType::q4_k, w.data(), 144, 256, 0, 2, nullptr, 2, y.data(), 2), Error);
  EXPECT_THROW(matmul_rows_quantized(GgmlType::q4_k, w.data(), 144, 100, 0, 2, x.data(), 2, y.data(), 2), Error);
  EXPECT_NO_THROW(matmul_rows_quantized(GgmlType::q4_k, w.data(), 144, 256, 0, 0, nullptr, 2, y.data(), 2));
  EXPECT_NO_THROW(matmul_rows_quantized(GgmlType::q4_k, w.data(), 144, 256, 0, 2, nullptr, 0, nullptr, 2));
}

}  // namespace
}  // namespace gaac::model
