// FP8 conversions: every FP8 value decodes exactly and converts back to itself; float → FP8 is the
// nearest value with ties to even and saturation, checked against a search over all 256 patterns; the
// per-tensor scale and the conversion of whole dumps; FP8 dumps' validation.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>

#include "gaac/bf16.hpp"
#include "gaac/error.hpp"
#include "gaac/fp8_dump.hpp"
#include "gaac/synthetic.hpp"

namespace gaac {
namespace {

constexpr ElementFormat kFormats[] = {ElementFormat::e4m3, ElementFormat::e5m2};

/// The nearest finite FP8 value of x's sign by searching all patterns (ties to an even mantissa), or
/// the largest finite one beyond it; NaN to 0x7F with x's sign.
uint8_t nearest_by_search(float x, ElementFormat f) {
  const uint8_t sign = std::signbit(x) ? 0x80 : 0;
  if (std::isnan(x)) return sign | 0x7F;
  // Beyond the largest finite value (where double distances would round) it saturates.
  if (std::fabs(x) >= fp8_max_finite(f)) return sign | (f == ElementFormat::e4m3 ? 0x7E : 0x7B);
  int best = -1;
  double best_distance = 0;
  for (int m = 0; m < 128; ++m) {
    const float v = fp8_to_float(static_cast<uint8_t>(m), f);
    if (!std::isfinite(v)) continue;
    const double distance = std::fabs(static_cast<double>(std::fabs(x)) - static_cast<double>(v));
    if (best < 0 || distance < best_distance || (distance == best_distance && (m & 1) == 0)) {
      best = m;
      best_distance = distance;
    }
  }
  return static_cast<uint8_t>(sign | best);
}

TEST(Fp8Convert, EveryFiniteValueDecodesExactlyAndConvertsBackToItself) {
  for (const ElementFormat f : kFormats) {
    int finite = 0;
    for (int x = 0; x < 256; ++x) {
      const float v = fp8_to_float(static_cast<uint8_t>(x), f);
      if (std::isnan(v)) continue;
      if (std::isinf(v)) {
        ASSERT_EQ(f, ElementFormat::e5m2);
        ASSERT_EQ(fp8_from_float(v, f), (x & 0x80) | 0x7B);  // infinities saturate
        continue;
      }
      ++finite;
      ASSERT_EQ(fp8_from_float(v, f), x) << to_string(f) << " " << x;
    }
    EXPECT_EQ(finite, f == ElementFormat::e4m3 ? 254 : 248);
  }
  EXPECT_EQ(fp8_to_float(0x7E, ElementFormat::e4m3), 448.0f);
  EXPECT_EQ(fp8_to_float(0x01, ElementFormat::e4m3), std::ldexp(1.0f, -9));
  EXPECT_EQ(fp8_to_float(0x7B, ElementFormat::e5m2), 57344.0f);
  EXPECT_EQ(fp8_to_float(0x01, ElementFormat::e5m2), std::ldexp(1.0f, -16));
  EXPECT_TRUE(std::isnan(fp8_to_float(0xFF, ElementFormat::e4m3)));
  EXPECT_EQ(fp8_to_float(0xFC, ElementFormat::e5m2), -INFINITY);
}

TEST(Fp8Convert, FromFloatIsTheNearestValueTiesToEvenSaturated) {
  std::mt19937 rng(1);
  std::uniform_real_distribution<float> mantissa(1.0f, 2.0f);
  for (const ElementFormat f : kFormats) {
    // Every BF16 value (zeros, subnormals, both infinities, NaNs, every magnitude) as a float.
    for (uint32_t b = 0; b < 65536; ++b) {
      const float x = bf16_to_float(static_cast<uint16_t>(b));
      ASSERT_EQ(fp8_from_float(x, f), nearest_by_search(x, f)) << to_string(f) << " bf16 " << b;
    }
    // Random floats around every binade, and the midpoints between neighbouring FP8 values.
    for (int i = 0; i < 20000; ++i) {
      const float x = std::ldexp(mantissa(rng), static_cast<int>(rng() % 40) - 24) * ((rng() & 1) ? -1.0f : 1.0f);
      ASSERT_EQ(fp8_from_float(x, f), nearest_by_search(x, f)) << to_string(f) << " " << x;
    }
    for (int x = 0; x < 126; ++x) {
      const float a = fp8_to_float(static_cast<uint8_t>(x), f), b = fp8_to_float(static_cast<uint8_t>(x + 1), f);
      if (!std::isfinite(b)) continue;
      const float mid = (a + b) / 2;  // exact: neighbours differ in one bit below float's precision
      ASSERT_EQ(fp8_from_float(mid, f), (x & 1) == 0 ? x : x + 1) << to_string(f) << " between " << x << " and " << x + 1;
    }
  }
  EXPECT_EQ(fp8_from_float(1e6f, ElementFormat::e4m3), 0x7E);
  EXPECT_EQ(fp8_from_float(-460.0f, ElementFormat::e4m3), 0xFE);
  EXPECT_EQ(fp8_from_float(std::numeric_limits<float>::quiet_NaN(), ElementFormat::e5m2), 0x7F);
  EXPECT_THROW(fp8_from_float(1.0f, ElementFormat::bf16), Error);
}

TEST(Fp8Convert, PerTensorScaleIsAmaxOverTheLargestFiniteValue) {
  const std::vector<uint16_t> values = {float_to_bf16(1.5f), float_to_bf16(-3.0f), float_to_bf16(INFINITY), 0x7FC1};
  EXPECT_EQ(fp8_per_tensor_scale(values, ElementFormat::e4m3), 3.0f / 448.0f);
  EXPECT_EQ(fp8_per_tensor_scale(values, ElementFormat::e5m2), 3.0f / 57344.0f);
  const std::vector<uint16_t> zeros = {0, 0x8000};
  EXPECT_EQ(fp8_per_tensor_scale(zeros, ElementFormat::e4m3), 1.0f);
}

TEST(Fp8Convert, ADumpConvertsElementByElementWithItsTensorsScales) {
  const KvDump dump = make_synthetic_kv({.layers = 2, .kv_heads = 2, .head_dim = 64, .tokens = 37});
  for (const ElementFormat f : kFormats) {
    for (const Fp8Scaling scaling : {Fp8Scaling::per_tensor, Fp8Scaling::none}) {
      const Fp8KvDump fp8 = convert_to_fp8(dump, f, scaling);
      ASSERT_NO_THROW(validate_dump(fp8));
      ASSERT_EQ(fp8.layers.size(), 2u);
      EXPECT_EQ(fp8.metadata.back(), (std::pair<std::string, std::string>{"fp8_scaling", to_string(scaling)}));
      for (size_t l = 0; l < 2; ++l) {
        for (const TensorKind kind : {TensorKind::key, TensorKind::value}) {
          const KvTensor& t = dump.layers[l].of(kind);
          const float scale = (kind == TensorKind::key ? fp8.k_scales : fp8.v_scales)[l];
          EXPECT_EQ(scale, scaling == Fp8Scaling::none ? 1.0f : fp8_per_tensor_scale(t.data, f));
          const Fp8KvTensor& c = fp8.layers[l].of(kind);
          ASSERT_EQ(c.data.size(), t.data.size());
          for (size_t i = 0; i < t.data.size(); ++i) ASSERT_EQ(c.data[i], fp8_from_float(bf16_to_float(t.data[i]) / scale, f));
        }
      }
    }
  }
}

TEST(Fp8Convert, Fp8DumpsRefuseBadScalesAndFormats) {
  Fp8KvDump dump;
  dump.layers.resize(1);
  for (Fp8KvTensor* t : {&dump.layers[0].k, &dump.layers[0].v}) {
    t->tokens = 1;
    t->kv_heads = 1;
    t->head_dim = 64;
    t->data.assign(64, 0x38);
  }
  EXPECT_NO_THROW(validate_dump(dump));
  dump.k_scales = {1.0f};
  EXPECT_THROW(validate_dump(dump), Error);  // K without V
  dump.v_scales = {0.0f};
  EXPECT_THROW(validate_dump(dump), Error);  // not positive
  dump.v_scales = {NAN};
  EXPECT_THROW(validate_dump(dump), Error);
  dump.v_scales = {0.5f};
  EXPECT_NO_THROW(validate_dump(dump));
  dump.format = ElementFormat::bf16;
  EXPECT_THROW(validate_dump(dump), Error);
}

}  // namespace
}  // namespace gaac
