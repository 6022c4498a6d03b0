// The forward-pass arithmetic: the AVX2 versions return the portable versions' bits, and each
// function computes what it claims to within the accuracy of its float arithmetic.
#include "model/ops.hpp"

#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <random>
#include <vector>

#include "gaac/bf16.hpp"
#include "model/ops_avx2.hpp"

namespace gaac::model::ops {
namespace {

std::vector<float> random_floats(size_t n, float scale, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, scale);
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng);
  return v;
}


bool same_bits(float a, float b) { return std::bit_cast<uint32_t>(a) == std::bit_cast<uint32_t>(b); }

TEST(Ops, ExpPolynomialIsWithinTwoUlpsOfExp) {
  // Every float in [−87, 88] at a stride, plus the overflow and underflow ends.
  for (float x = -87.0f; x <= 88.0f; x += 0.000731f) {
    const double want = std::exp(static_cast<double>(x));
    const float got = exp_polynomial(x);
    const double ulp = std::ldexp(1.0, std::ilogb(want) - 23);
    ASSERT_LE(std::fabs(got - want), 2 * ulp) << "x = " << x;
  }
  EXPECT_EQ(exp_polynomial(0.0f), 1.0f);
  EXPECT_EQ(exp_polynomial(-200.0f), 0.0f);
  EXPECT_EQ(exp_polynomial(200.0f), INFINITY);
  EXPECT_EQ(exp_polynomial(-INFINITY), 0.0f);
}

TEST(Ops, Avx2SwigluMatchesPortableBitForBit) {
  if (!avx2::available()) GTEST_SKIP() << "no AVX2/FMA on this CPU";
  // Ordinary activations, the polynomial's large-exponent branches (|x| > 126·ln 2 and > 192·ln 2),
  // infinities and NaN, and a length that leaves a scalar tail.
  std::vector<float> gate = random_floats(4099, 4.0f, 1);
  const float specials[] = {0.0f, -0.0f, 87.5f, -87.5f, 90.0f, -90.0f, 104.0f, -104.0f, 140.0f, -140.0f,
                            INFINITY, -INFINITY, NAN, 1e-40f, -1e-40f, 88.72f, -103.97f};
  for (size_t i = 0; i < std::size(specials); ++i) gate[i * 13] = specials[i];
  const std::vector<float> up = random_floats(gate.size(), 1.0f, 2);
  std::vector<float> portable_out = gate, avx2_out = gate;
  scalar::swiglu(portable_out.data(), up.data(), gate.size());
  avx2::swiglu(avx2_out.data(), up.data(), gate.size());
  for (size_t i = 0; i < gate.size(); ++i) {
    ASSERT_TRUE(same_bits(portable_out[i], avx2_out[i]) || (std::isnan(portable_out[i]) && std::isnan(avx2_out[i])))
        << "gate " << gate[i] << ": " << portable_out[i] << " vs " << avx2_out[i];
  }
}

TEST(Ops, SwigluIsSiluTimesUp) {
  std::vector<float> gate = random_floats(1000, 3.0f, 3);
  const std::vector<float> up = random_floats(gate.size(), 1.0f, 4);
  std::vector<float> out = gate;
  swiglu(out.data(), up.data(), out.size());
  for (size_t i = 0; i < gate.size(); ++i) {
    const double want = gate[i] / (1.0 + std::exp(-static_cast<double>(gate[i]))) * up[i];
    ASSERT_NEAR(out[i], want, 1e-6 * (1.0 + std::fabs(want))) << i;
  }
}

TEST(Ops, GegluFollowsTheFp16TableAndItsCutoffs) {
  const std::vector<float> gate = {-11.0f, -10.0f, -2.0f, -0.5f, 0.0f, 0.5f, 1.0f, 3.0f, 10.0f, 12.0f};
  const std::vector<float> up(gate.size(), 2.0f);
  std::vector<float> out = gate;
  geglu(out.data(), up.data(), out.size());
  EXPECT_EQ(out[0], 0.0f);   // x ≤ −10: 0
  EXPECT_EQ(out[1], 0.0f);
  EXPECT_EQ(out[8], 20.0f);  // x ≥ 10: x·up
  EXPECT_EQ(out[9], 24.0f);
  EXPECT_EQ(out[4], 0.0f);
  for (size_t i = 2; i < 8; ++i) {
    const double x = gate[i];
    const double want = 0.5 * x * (1.0 + std::tanh(std::sqrt(2.0 / M_PI) * (x + 0.044715 * x * x * x))) * 2.0;
    EXPECT_NEAR(out[i], want, 2e-3 * std::fabs(want)) << "x = " << x;  // fp16 table: ~11 significant bits
  }
}

TEST(Ops, RmsNormScalesToUnitMeanSquare) {
  const std::vector<float> x = random_floats(640, 7.0f, 5);
  const std::vector<float> w(x.size(), 1.0f);
  std::vector<float> y(x.size());
  rms_norm(x.data(), w.data(), static_cast<int>(x.size()), 1e-6f, y.data());
  double sum = 0;
  for (float v : y) sum += static_cast<double>(v) * v;
  EXPECT_NEAR(sum / static_cast<double>(y.size()), 1.0, 1e-5);
  // In place gives the same result.
  std::vector<float> z = x;
  rms_norm(z.data(), w.data(), static_cast<int>(z.size()), 1e-6f, z.data());
  EXPECT_EQ(z, y);
}

TEST(Ops, RopeRotatesPairsByPositionAngles) {
  for (const bool neox : {false, true}) {
    const std::vector<float> x = random_floats(64, 1.0f, 6);
    std::vector<float> y = x;
    rope(y.data(), 64, 5, 10000.0f, neox);
    for (int i = 0; i < 32; ++i) {
      const int a = neox ? i : 2 * i, b = neox ? i + 32 : 2 * i + 1;
      const double theta = 5.0 * std::pow(10000.0, -2.0 * i / 64.0);
      EXPECT_NEAR(y[a], x[a] * std::cos(theta) - x[b] * std::sin(theta), 1e-4) << i;
      EXPECT_NEAR(y[b], x[a] * std::sin(theta) + x[b] * std::cos(theta), 1e-4) << i;
    }
    std::vector<float> z = x;
    rope(z.data(), 64, 0, 10000.0f, neox);
    EXPECT_EQ(z, x) << "position 0 is the identity";
  }
}

}  // namespace
}  // namespace gaac::model::ops
