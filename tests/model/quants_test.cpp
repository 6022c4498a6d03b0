// Quantized weight formats: the K-quant scale unpacking and the scalar reference against
// hand-computed blocks, an exhaustive fp16 check; the AVX2 path against the reference
// (dequantization bit for bit, matmul_rows within the stated summation-order bound); both on the
// real models' tensors; argument errors.
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <map>
#include <random>
#include <set>
#include <string>
#include <vector>

#if defined(__x86_64__) || defined(_M_X64)
#include <immintrin.h>
#endif

#include "common/cpu.hpp"
#include "gaac/error.hpp"
#include "model/gguf.hpp"
#include "model/k_quant_scales.hpp"
#include "model/quants.hpp"
#include "support/models.hpp"

namespace gaac::model {
namespace {

const std::vector<GgmlType> kAllTypes = {GgmlType::f32,  GgmlType::f16,  GgmlType::bf16, GgmlType::q8_0,
                                         GgmlType::q4_0, GgmlType::q4_1, GgmlType::q5_0, GgmlType::q5_1,
                                         GgmlType::q4_k, GgmlType::q5_k, GgmlType::q6_k};

std::string name(GgmlType type) { return ggml_type_info(type).name; }
uint32_t bits_of(float v) { return std::bit_cast<uint32_t>(v); }
int64_t block_of(GgmlType type) { return ggml_type_info(type).block_elements; }
size_t bytes_of(GgmlType type) { return ggml_type_info(type).block_bytes; }

void put16(std::vector<uint8_t>& b, size_t at, uint16_t v) {
  b[at] = static_cast<uint8_t>(v & 0xFF);
  b[at + 1] = static_cast<uint8_t>(v >> 8);
}

std::vector<float> ref_dequant(GgmlType type, const std::vector<uint8_t>& bytes, int64_t n) {
  std::vector<float> out(static_cast<size_t>(n));
  scalar::dequantize_row(type, bytes.data(), out.data(), n);
  return out;
}

/// Element-wise equality: same bits, or both NaN.
::testing::AssertionResult same_floats(const std::vector<float>& a, const std::vector<float>& b, bool nan_any_bits) {
  if (a.size() != b.size()) return ::testing::AssertionFailure() << "sizes " << a.size() << " vs " << b.size();
  for (size_t i = 0; i < a.size(); ++i) {
    if (bits_of(a[i]) == bits_of(b[i])) continue;
    if (nan_any_bits && std::isnan(a[i]) && std::isnan(b[i])) continue;
    char text[160];
    std::snprintf(text, sizeof text, "element %zu: %.9g (0x%08x) vs %.9g (0x%08x)", i, static_cast<double>(a[i]),
                  bits_of(a[i]), static_cast<double>(b[i]), bits_of(b[i]));
    return ::testing::AssertionFailure() << text;
  }
  return ::testing::AssertionSuccess();
}

// ----------------------------------------------------------------------------------------------
// FP16

/// A second, independent half → float: from the IEEE definition with ldexp.
float half_by_definition(uint16_t h) {
  const bool negative = (h & 0x8000) != 0;
  const int e = (h >> 10) & 31, m = h & 1023;
  double v;
  if (e == 0) {
    v = std::ldexp(static_cast<double>(m), -24);
  } else if (e == 31) {
    v = m == 0 ? INFINITY : NAN;
  } else {
    v = std::ldexp(static_cast<double>(1024 + m), e - 25);
  }
  return static_cast<float>(negative ? -v : v);
}

#if defined(__x86_64__) || defined(_M_X64)
__attribute__((target("f16c"))) float half_by_f16c(uint16_t h) { return _cvtsh_ss(h); }
bool have_f16c() { return cpu_features().f16c; }
#else
float half_by_f16c(uint16_t) { return 0.0f; }
bool have_f16c() { return false; }
#endif

TEST(Fp16, ExhaustiveAgainstDefinitionAndF16c) {
  const bool f16c = have_f16c();
  for (uint32_t h = 0; h < 65536; ++h) {
    const auto bits = static_cast<uint16_t>(h);
    const float got = fp16_to_float(bits);
    const float want = half_by_definition(bits);
    if (std::isnan(want)) {
      ASSERT_TRUE(std::isnan(got)) << std::hex << h;
      // Sign and payload kept, quiet bit set.
      const uint32_t expect = (static_cast<uint32_t>(h & 0x8000) << 16) | 0x7FC00000u | (static_cast<uint32_t>(h & 0x3FF) << 13);
      ASSERT_EQ(bits_of(got), expect) << std::hex << h;
    } else {
      ASSERT_EQ(bits_of(got), bits_of(want)) << std::hex << h;  // also tells +0 from −0
    }
    if (f16c) {
      ASSERT_EQ(bits_of(got), bits_of(half_by_f16c(bits))) << std::hex << h;
    }
  }
}

TEST(Fp16, KnownValues) {
  EXPECT_EQ(fp16_to_float(0x3C00), 1.0f);
  EXPECT_EQ(fp16_to_float(0xC000), -2.0f);
  EXPECT_EQ(fp16_to_float(0x3555), 0.333251953125f);
  EXPECT_EQ(fp16_to_float(0x7BFF), 65504.0f);
  EXPECT_EQ(fp16_to_float(0x0001), 5.9604644775390625e-8f);   // smallest subnormal, 2^-24
  EXPECT_EQ(fp16_to_float(0x03FF), 6.0975551605224609e-5f);   // largest subnormal, 1023·2^-24
  EXPECT_EQ(fp16_to_float(0x0400), 6.103515625e-5f);          // smallest normal, 2^-14
  EXPECT_EQ(bits_of(fp16_to_float(0x8000)), 0x80000000u);     // −0
  EXPECT_EQ(fp16_to_float(0x7C00), INFINITY);
  EXPECT_EQ(fp16_to_float(0xFC00), -INFINITY);
  EXPECT_EQ(bits_of(fp16_to_float(0x7C01)), 0x7FC02000u);     // signalling NaN comes out quiet
}

// ----------------------------------------------------------------------------------------------
// The reference on hand-built blocks (expected values worked out by hand from the formats)

TEST(ReferenceDequant, PlainFloatTypes) {
  std::vector<uint8_t> f32(8);
  const float a = 1.5f, b = -3.25e-5f;
  std::memcpy(f32.data(), &a, 4);
  std::memcpy(f32.data() + 4, &b, 4);
  EXPECT_EQ(ref_dequant(GgmlType::f32, f32, 2), (std::vector<float>{1.5f, -3.25e-5f}));

  std::vector<uint8_t> f16(8);
  put16(f16, 0, 0x3C00);
  put16(f16, 2, 0xC500);  // −5
  put16(f16, 4, 0x0002);  // 2^-23
  put16(f16, 6, 0x7C00);
  EXPECT_EQ(ref_dequant(GgmlType::f16, f16, 4), (std::vector<float>{1.0f, -5.0f, 1.1920928955078125e-7f, INFINITY}));

  std::vector<uint8_t> bf16(6);
  put16(bf16, 0, 0x3F80);  // 1
  put16(bf16, 2, 0x4049);  // 3.140625
  put16(bf16, 4, 0xC2F7);  // −123.5
  EXPECT_EQ(ref_dequant(GgmlType::bf16, bf16, 3), (std::vector<float>{1.0f, 3.140625f, -123.5f}));
}

TEST(ReferenceDequant, Q8_0) {
  std::vector<uint8_t> b(68, 0);
  put16(b, 0, 0x3800);  // d = 0.5
  for (int j = 0; j < 32; ++j) b[static_cast<size_t>(2 + j)] = 3;
  b[2] = 0x80;  // −128
  b[3] = 127;
  b[4] = 0xFF;  // −1
  put16(b, 34, 0x0001);  // second block: d = 2^-24 (subnormal)
  b[36] = 127;
  b[37] = 0x81;  // −127
  const std::vector<float> y = ref_dequant(GgmlType::q8_0, b, 64);
  EXPECT_EQ(y[0], -64.0f);
  EXPECT_EQ(y[1], 63.5f);
  EXPECT_EQ(y[2], -0.5f);
  for (int j = 3; j < 32; ++j) EXPECT_EQ(y[static_cast<size_t>(j)], 1.5f) << j;
  EXPECT_EQ(y[32], 7.569789886474609375e-6f);  // 127·2^-24
  EXPECT_EQ(y[33], -7.569789886474609375e-6f);
  for (int j = 34; j < 64; ++j) EXPECT_EQ(bits_of(y[static_cast<size_t>(j)]), 0u) << j;  // 0·d = +0
}

TEST(ReferenceDequant, Q4_0) {
  std::vector<uint8_t> b(18, 0x88);
  put16(b, 0, 0x4000);  // d = 2
  b[2] = 0x1F;          // qs[0]: low 15, high 1
  b[3] = 0x80;          // qs[1]: low 0, high 8
  const std::vector<float> y = ref_dequant(GgmlType::q4_0, b, 32);
  for (int j = 0; j < 32; ++j) {
    float want = 0.0f;
    if (j == 0) want = 14.0f;        // (15−8)·2
    if (j == 16) want = -14.0f;      // (1−8)·2
    if (j == 1) want = -16.0f;       // (0−8)·2
    EXPECT_EQ(y[static_cast<size_t>(j)], want) << j;
  }
}

TEST(ReferenceDequant, Q4_1) {
  std::vector<uint8_t> b(20, 0);
  put16(b, 0, 0x3800);  // d = 0.5
  put16(b, 2, 0xBC00);  // m = −1
  b[4] = 0xF0;          // qs[0]: low 0, high 15
  b[9] = 0x37;          // qs[5]: low 7, high 3
  const std::vector<float> y = ref_dequant(GgmlType::q4_1, b, 32);
  for (int j = 0; j < 32; ++j) {
    float want = -1.0f;
    if (j == 16) want = 6.5f;  // 15·0.5 − 1
    if (j == 5) want = 2.5f;   // 7·0.5 − 1
    if (j == 21) want = 0.5f;  // 3·0.5 − 1
    EXPECT_EQ(y[static_cast<size_t>(j)], want) << j;
  }
}

// qh = 0x80020001: fifth bits of elements 0, 17 and 31. qs[0] = 0x21, qs[1] = 0xF3, qs[15] = 0x40.
std::vector<uint8_t> q5_block(size_t qh_at, size_t qs_at, size_t size) {
  std::vector<uint8_t> b(size, 0);
  b[qh_at + 0] = 0x01;
  b[qh_at + 2] = 0x02;
  b[qh_at + 3] = 0x80;
  b[qs_at + 0] = 0x21;
  b[qs_at + 1] = 0xF3;
  b[qs_at + 15] = 0x40;
  return b;
}

TEST(ReferenceDequant, Q5_0) {
  std::vector<uint8_t> b = q5_block(2, 6, 22);
  put16(b, 0, 0x3C00);  // d = 1
  const std::vector<float> y = ref_dequant(GgmlType::q5_0, b, 32);
  const std::map<int, float> special = {{0, 1.0f},    // (1|16)−16
                                        {16, -14.0f},  // 2−16
                                        {1, -13.0f},   // 3−16
                                        {17, 15.0f},   // (15|16)−16
                                        {31, 4.0f}};   // (4|16)−16
  for (int j = 0; j < 32; ++j) {
    const auto it = special.find(j);
    EXPECT_EQ(y[static_cast<size_t>(j)], it == special.end() ? -16.0f : it->second) << j;
  }
}

TEST(ReferenceDequant, Q5_1) {
  std::vector<uint8_t> b = q5_block(4, 8, 24);
  put16(b, 0, 0x4000);  // d = 2
  put16(b, 2, 0x3800);  // m = 0.5
  const std::vector<float> y = ref_dequant(GgmlType::q5_1, b, 32);
  const std::map<int, float> special = {{0, 34.5f}, {16, 4.5f}, {1, 6.5f}, {17, 62.5f}, {31, 40.5f}};
  for (int j = 0; j < 32; ++j) {
    const auto it = special.find(j);
    EXPECT_EQ(y[static_cast<size_t>(j)], it == special.end() ? 0.5f : it->second) << j;
  }
}

// Q4_K / Q5_K scales: sc = {1, 2, 3, 63, 17, 33, 48, 5}, m = {0, 4, 63, 1, 20, 40, 2, 63}, packed by hand:
// bytes 0..3 = sc[0..3] | top two bits of sc[4..7] << 6; bytes 4..7 = m[0..3] | top bits of m[4..7] << 6;
// bytes 8..11 = low nibble of sc[4..7] | low nibble of m[4..7] << 4.
constexpr uint8_t kScales[12] = {0x41, 0x82, 0xC3, 0x3F, 0x40, 0x84, 0x3F, 0xC1, 0x41, 0x81, 0x20, 0xF5};
// With d = 0.5 and dmin = 0.25, a zero quant in sub-block s gives −0.25·m[s]:
constexpr float kKBase[8] = {0.0f, -1.0f, -15.75f, -0.25f, -5.0f, -10.0f, -0.5f, -15.75f};

TEST(KQuantScales, UnpacksTheHandPackedBytes) {
  const KQuantScales s = unpack_k_quant_scales(kScales);
  std::vector<int> scales, mins;
  for (int j = 0; j < 8; ++j) {
    scales.push_back(s.scale(j));
    mins.push_back(s.min(j));
  }
  EXPECT_EQ(scales, (std::vector<int>{1, 2, 3, 63, 17, 33, 48, 5}));
  EXPECT_EQ(mins, (std::vector<int>{0, 4, 63, 1, 20, 40, 2, 63}));
}

TEST(KQuantScales, EveryPackedBitLandsInOneResultBit) {
  // 12 bytes hold 8 + 8 six-bit values: each of the 96 bits must reach exactly one of the 96 result
  // bits: no bit dropped, none used twice.
  std::set<int> reached;
  for (int bit = 0; bit < 96; ++bit) {
    uint8_t packed[12] = {};
    packed[bit / 8] = static_cast<uint8_t>(1u << (bit % 8));
    const KQuantScales s = unpack_k_quant_scales(packed);
    std::vector<int> set_bits;
    for (int v = 0; v < 16; ++v) {
      const int value = v < 8 ? s.scale(v) : s.min(v - 8);
      ASSERT_LT(value, 64) << "bit " << bit;
      for (int b = 0; b < 6; ++b) {
        if ((value >> b) & 1) set_bits.push_back(6 * v + b);
      }
    }
    ASSERT_EQ(set_bits.size(), 1u) << "bit " << bit;
    reached.insert(set_bits[0]);
  }
  EXPECT_EQ(reached.size(), 96u);
  // ggml's placement, one example of each rule: byte 0's low six bits are scale 0, its top two the
  // top of scale 4; byte 8's low nibble is the bottom of scale 4, its high nibble that of min 4.
  uint8_t packed[12] = {};
  packed[0] = 0xC5;
  packed[8] = 0x9A;
  const KQuantScales s = unpack_k_quant_scales(packed);
  EXPECT_EQ(s.scale(0), 0x05);
  EXPECT_EQ(s.scale(4), 0x3A);
  EXPECT_EQ(s.min(4), 0x09);
}

std::vector<uint8_t> k_block(size_t size, size_t qs_at) {
  std::vector<uint8_t> b(size, 0);
  put16(b, 0, 0x3800);  // d = 0.5
  put16(b, 2, 0x3400);  // dmin = 0.25
  std::memcpy(b.data() + 4, kScales, 12);
  for (size_t c = 0; c < 4; ++c) {
    b[qs_at + 32 * c] = 0xA3;       // element 64c: 3; element 64c+32: 10
    b[qs_at + 32 * c + 31] = 0x5F;  // element 64c+31: 15; element 64c+63: 5
  }
  return b;
}

void expect_k(const std::vector<float>& y, const std::map<int, float>& special) {
  for (int j = 0; j < 256; ++j) {
    const auto it = special.find(j);
    const float want = it == special.end() ? kKBase[j / 32] : it->second;
    EXPECT_EQ(y[static_cast<size_t>(j)], want) << j;
  }
}

// (d·sc)·q − dmin·m, worked out for the quants placed by k_block.
const std::map<int, float> kQ4KSpecial = {
    {0, 1.5f},     {31, 7.5f},    {32, 9.0f},     {63, 4.0f},     // sc 1, 2; m 0, 4
    {64, -11.25f}, {95, 6.75f},   {96, 314.75f},  {127, 157.25f},  // sc 3, 63; m 63, 1
    {128, 20.5f},  {159, 122.5f}, {160, 155.0f},  {191, 72.5f},    // sc 17, 33; m 20, 40
    {192, 71.5f},  {223, 359.5f}, {224, 9.25f},   {255, -3.25f},   // sc 48, 5; m 2, 63
};

TEST(ReferenceDequant, Q4_K) { expect_k(ref_dequant(GgmlType::q4_k, k_block(144, 16), 256), kQ4KSpecial); }

TEST(ReferenceDequant, Q5_K) {
  std::vector<uint8_t> b = k_block(176, 48);
  b[16 + 0] = 0x01;   // qh[0] bit 0: element 0 gets +16
  b[16 + 1] = 0x14;   // qh[1] bits 2, 4: elements 64+1 and 128+1
  b[16 + 31] = 0x80;  // qh[31] bit 7: element 192+32+31 = 255
  std::map<int, float> special = kQ4KSpecial;
  special[0] = 9.5f;      // 0.5·1·19
  special[65] = 8.25f;    // 1.5·16 − 15.75
  special[129] = 131.0f;  // 8.5·16 − 5
  special[255] = 36.75f;  // 2.5·21 − 15.75
  expect_k(ref_dequant(GgmlType::q5_k, b, 256), special);
}

TEST(ReferenceDequant, Q6_K) {
  std::vector<uint8_t> b(210, 0);
  const int8_t scales[16] = {1, -1, 2, -2, 3, -3, 4, -4, 5, -5, 6, -6, 7, -7, 127, -128};
  std::memcpy(b.data() + 192, scales, 16);
  put16(b, 208, 0x3800);  // d = 0.5
  // First half, l = 0.
  b[0] = 0x7A;    // ql[0]: low 10, high 7
  b[32] = 0x5C;   // ql[32]: low 12, high 5
  b[128] = 0xE4;  // qh[0]: 2-bit fields 0, 1, 2, 3
  // Second half, l = 31: every field all ones (q = 63).
  b[64 + 31] = 0xFF;
  b[64 + 32 + 31] = 0xFF;
  b[128 + 32 + 31] = 0xFF;
  const std::vector<float> y = ref_dequant(GgmlType::q6_k, b, 256);
  // All-zero quants are −32: 0.5·sc·(−32) = −16·sc for sub-block j/16.
  const float base[16] = {-16, 16, -32, 32, -48, 48, -64, 64, -80, 80, -96, 96, -112, 112, -2032, 2048};
  const std::map<int, float> special = {
      {0, -11.0f},  // 0.5·1·(10−32)
      {32, -4.0f},  // 0.5·2·((12|16)−32)
      {64, 10.5f},  // 0.5·3·((7|32)−32)
      {96, 42.0f},  // 0.5·4·((5|48)−32)
      {159, -77.5f}, {191, -93.0f}, {223, -108.5f}, {255, -1984.0f},  // 0.5·{−5, −6, −7, −128}·31
  };
  for (int j = 0; j < 256; ++j) {
    const auto it = special.find(j);
    EXPECT_EQ(y[static_cast<size_t>(j)], it == special.end() ? base[j / 16] : it->second) << j;
  }
}

TEST(ReferenceDequant, MultipleBlocksAreIndependent) {
  // Two different blocks in a row decode as each alone.
  for (GgmlType type : kAllTypes) {
    const size_t bytes = bytes_of(type);
    const int64_t n = block_of(type);
    std::mt19937 rng(7);
    std::vector<uint8_t> two(2 * bytes);
    for (auto& v : two) v = static_cast<uint8_t>(rng());
    const std::vector<float> both = ref_dequant(type, two, 2 * n);
    const std::vector<float> first = ref_dequant(type, std::vector<uint8_t>(two.begin(), two.begin() + static_cast<long>(bytes)), n);
    const std::vector<float> second = ref_dequant(type, std::vector<uint8_t>(two.begin() + static_cast<long>(bytes), two.end()), n);
    std::vector<float> joined = first;
    joined.insert(joined.end(), second.begin(), second.end());
    EXPECT_TRUE(same_floats(both, joined, true)) << name(type);
  }
}

// ----------------------------------------------------------------------------------------------
// Random blocks

/// Byte offsets of the fp16 scale fields in one block of `type`.
std::vector<size_t> scale_fields(GgmlType type) {
  switch (type) {
    case GgmlType::q8_0: case GgmlType::q4_0: case GgmlType::q5_0: return {0};
    case GgmlType::q4_1: case GgmlType::q5_1: case GgmlType::q4_k: case GgmlType::q5_k: return {0, 2};
    case GgmlType::q6_k: return {208};
    default: return {};
  }
}

/// Random fp16 bits with the exponent field in [lo, hi] (15 is 2^0).
uint16_t random_half(std::mt19937& rng, int lo, int hi) {
  const int e = std::uniform_int_distribution<int>(lo, hi)(rng);
  return static_cast<uint16_t>((rng() & 0x8000) | (static_cast<uint32_t>(e) << 10) | (rng() & 0x3FF));
}

/// `n` elements of random encoded data. `finite`: scales (and plain float values) are finite fp16/bf16/f32
/// with exponents in a realistic range; otherwise every byte is random (NaN and infinite scales included).
std::vector<uint8_t> random_tensor(GgmlType type, int64_t n, std::mt19937& rng, bool finite) {
  const int64_t block = block_of(type);
  const size_t bytes = bytes_of(type);
  const auto blocks = static_cast<size_t>(n / block);
  std::vector<uint8_t> out(blocks * bytes);
  for (auto& v : out) v = static_cast<uint8_t>(rng());
  if (!finite) return out;
  if (type == GgmlType::f32) {
    std::normal_distribution<float> normal(0.0f, 1.0f);
    for (size_t i = 0; i < blocks; ++i) {
      const float v = normal(rng);
      std::memcpy(out.data() + 4 * i, &v, 4);
    }
  } else if (type == GgmlType::f16) {
    for (size_t i = 0; i < blocks; ++i) put16(out, 2 * i, random_half(rng, 0, 17));  // subnormals included
  } else if (type == GgmlType::bf16) {
    for (size_t i = 0; i < blocks; ++i) put16(out, 2 * i, static_cast<uint16_t>((rng() & 0x807F) | (static_cast<uint32_t>(std::uniform_int_distribution<int>(100, 130)(rng)) << 7)));
  } else {
    for (size_t i = 0; i < blocks; ++i) {
      for (size_t at : scale_fields(type)) put16(out, i * bytes + at, random_half(rng, 0, 13));
    }
  }
  return out;
}

class Avx2 : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!avx2::available()) GTEST_SKIP() << "AVX2/FMA/F16C path not available on this machine";
  }
};

TEST_F(Avx2, IsTheActiveBackend) { EXPECT_STREQ(active_backend(), "avx2"); }

TEST_F(Avx2, DequantizeBitExactOnRandomBlocks) {
  std::mt19937 rng(1234);
  for (GgmlType type : kAllTypes) {
    const int64_t block = block_of(type);
    std::vector<int64_t> counts = {block, 2 * block, 7 * block, 64 * block};
    if (block == 1) counts = {1, 7, 8, 31, 32, 33, 100, 1000, 4099};
    for (bool finite : {true, false}) {
      for (int64_t n : counts) {
        for (int rep = 0; rep < 20; ++rep) {
          const std::vector<uint8_t> data = random_tensor(type, n, rng, finite);
          const std::vector<float> want = ref_dequant(type, data, n);
          std::vector<float> got(static_cast<size_t>(n));
          avx2::dequantize_row(type, data.data(), got.data(), n);
          // Finite inputs: every bit. Random bytes: every bit too, except that NaN payloads may differ
          // (x86 picks which NaN operand's payload a product keeps).
          ASSERT_TRUE(same_floats(got, want, !finite)) << name(type) << " n=" << n << " finite=" << finite;
          std::vector<float> dispatched(static_cast<size_t>(n));
          dequantize_row(type, data.data(), dispatched.data(), n);
          ASSERT_TRUE(same_floats(dispatched, got, false)) << name(type);
        }
      }
    }
  }
}

TEST_F(Avx2, DequantizeEveryQuantValue) {
  // Sweep every byte value through every quant byte position of a block, scales fixed.
  for (GgmlType type : kAllTypes) {
    if (block_of(type) == 1) continue;
    const size_t bytes = bytes_of(type);
    for (int v = 0; v < 256; ++v) {
      std::vector<uint8_t> b(bytes, static_cast<uint8_t>(v));
      for (size_t at : scale_fields(type)) put16(b, at, 0x2E66);  // ~0.1
      if (type == GgmlType::q4_k || type == GgmlType::q5_k) {
        for (size_t i = 4; i < 16; ++i) b[i] = static_cast<uint8_t>(v * 37 + static_cast<int>(i));
      }
      const std::vector<float> want = ref_dequant(type, b, block_of(type));
      std::vector<float> got(want.size());
      avx2::dequantize_row(type, b.data(), got.data(), block_of(type));
      ASSERT_TRUE(same_floats(got, want, false)) << name(type) << " byte " << v;
    }
  }
}

/// |a − b| ≤ 2·γ(n)·Σ|w·x|, γ(n) = n·u/(1 − n·u), u = 2^-24: the two results are each within γ(n)·Σ|w·x|
/// of the exact sum, whatever the order of the additions (Higham, Accuracy and Stability, §3.1).
double pair_bound(int64_t n, double abs_sum) {
  const double u = std::ldexp(1.0, -24), nu = static_cast<double>(n + 1) * u;
  return 2.0 * nu / (1.0 - nu) * abs_sum + 1e-37;
}

struct MatmulCase {
  GgmlType type;
  int64_t cols;
};

void check_matmul(GgmlType type, int64_t cols, int64_t rows, int64_t row_begin, int64_t row_end, int64_t tokens,
                  std::mt19937& rng, double& worst_ratio) {
  const std::vector<uint8_t> w = random_tensor(type, cols * rows, rng, true);
  const size_t row_bytes = static_cast<size_t>(cols / block_of(type)) * bytes_of(type);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> x(static_cast<size_t>(tokens * cols));
  for (auto& v : x) v = normal(rng);
  const int64_t y_stride = rows + 3;
  const float sentinel = -12345.0f;
  std::vector<float> y_ref(static_cast<size_t>(tokens * y_stride), sentinel), y_fast = y_ref, y_disp = y_ref;
  scalar::matmul_rows(type, w.data(), row_bytes, cols, row_begin, row_end, x.data(), tokens, y_ref.data(), y_stride);
  avx2::matmul_rows(type, w.data(), row_bytes, cols, row_begin, row_end, x.data(), tokens, y_fast.data(), y_stride);
  matmul_rows(type, w.data(), row_bytes, cols, row_begin, row_end, x.data(), tokens, y_disp.data(), y_stride);
  ASSERT_TRUE(same_floats(y_disp, y_fast, false));
  std::vector<float> row(static_cast<size_t>(cols));
  for (int64_t r = 0; r < rows; ++r) {
    const bool inside = r >= row_begin && r < row_end;
    if (inside) scalar::dequantize_row(type, w.data() + static_cast<size_t>(r) * row_bytes, row.data(), cols);
    for (int64_t t = 0; t < tokens; ++t) {
      const auto at = static_cast<size_t>(t * y_stride + r);
      if (!inside) {
        ASSERT_EQ(y_fast[at], sentinel) << "row " << r << " outside the range was written";
        ASSERT_EQ(y_ref[at], sentinel);
        continue;
      }
      double abs_sum = 0.0, exact = 0.0;
      for (int64_t c = 0; c < cols; ++c) {
        const double p = static_cast<double>(row[static_cast<size_t>(c)]) * x[static_cast<size_t>(t * cols + c)];
        abs_sum += std::fabs(p);
        exact += p;
      }
      const double bound = pair_bound(cols, abs_sum);
      const double diff = std::fabs(static_cast<double>(y_fast[at]) - y_ref[at]);
      ASSERT_LE(diff, bound) << name(type) << " cols=" << cols << " row " << r << " token " << t << " of " << tokens;
      ASSERT_LE(std::fabs(y_fast[at] - exact), bound / 2) << name(type) << " vs exact";
      ASSERT_LE(std::fabs(y_ref[at] - exact), bound / 2) << name(type) << " reference vs exact";
      if (abs_sum > 0) worst_ratio = std::max(worst_ratio, diff / (std::ldexp(1.0, -24) * abs_sum));
    }
  }
  for (int64_t t = 0; t < tokens; ++t) {
    for (int64_t r = rows; r < y_stride; ++r) ASSERT_EQ(y_fast[static_cast<size_t>(t * y_stride + r)], sentinel);
  }
}

TEST_F(Avx2, MatmulWithinSummationBound) {
  std::mt19937 rng(99);
  for (GgmlType type : kAllTypes) {
    const int64_t block = block_of(type);
    std::vector<int64_t> col_counts;
    if (block == 1) {
      col_counts = {1, 7, 37, 1030, 2051};  // tails, and more than one 1024-column chunk
    } else if (block == 32) {
      col_counts = {32, 96, 1056};
    } else {
      col_counts = {256, 1280};
    }
    double worst = 0.0;
    for (int64_t cols : col_counts) {
      for (int64_t tokens : {1, 2, 3, 4, 17, 64, 130}) {
        for (auto [b, e] : {std::pair<int64_t, int64_t>{0, 13}, {3, 10}, {5, 6}, {1, 12}, {4, 4}}) {
          check_matmul(type, cols, 13, b, e, tokens, rng, worst);
          if (HasFatalFailure()) return;
        }
      }
    }
    std::printf("  %-5s worst |avx2 - reference| = %.2f u * sum|w x|\n", name(type).c_str(), worst);
  }
}

TEST_F(Avx2, MatmulOfZeroColumnsIsZero) {
  std::vector<float> y(6, 7.0f);
  const uint8_t w = 0;
  const float x = 0;
  avx2::matmul_rows(GgmlType::q4_k, &w, 0, 0, 0, 3, &x, 2, y.data(), 3);
  scalar::matmul_rows(GgmlType::q4_k, &w, 0, 0, 0, 3, &x, 2, y.data() + 0, 3);
  for (float v : y) EXPECT_EQ(v, 0.0f);
}

// ----------------------------------------------------------------------------------------------
// Real models

void check_model_tensors(const std::string& path, const std::vector<GgmlType>& expected_types) {
  const GgufFile file = GgufFile::open(path);
  std::map<GgmlType, int> checked;
  std::mt19937 rng(5);
  for (const GgufTensor& t : file.tensors()) {
    ASSERT_TRUE(supported_type(t.type)) << t.name << " " << name(t.type);
    if (checked[t.type] >= 4) continue;
    ++checked[t.type];
    const int64_t cols = t.row_elements();
    const int64_t rows = std::min<int64_t>(t.rows(), 48);
    const size_t row_bytes = t.row_bytes();
    std::vector<float> want(static_cast<size_t>(cols)), got(want.size());
    for (int64_t r = 0; r < rows; ++r) {
      const uint8_t* row = t.bytes.data() + static_cast<size_t>(r) * row_bytes;
      scalar::dequantize_row(t.type, row, want.data(), cols);
      for (float v : want) ASSERT_TRUE(std::isfinite(v)) << t.name;
      if (!avx2::available()) continue;
      avx2::dequantize_row(t.type, row, got.data(), cols);
      ASSERT_TRUE(same_floats(got, want, false)) << t.name << " row " << r;
    }
    if (!avx2::available() || t.ne.size() != 2) continue;
    // Products of those rows with random activations.
    const int64_t tokens = 5;
    std::normal_distribution<float> normal(0.0f, 1.0f);
    std::vector<float> x(static_cast<size_t>(tokens * cols));
    for (auto& v : x) v = normal(rng);
    std::vector<float> y_ref(static_cast<size_t>(tokens * rows)), y_fast(y_ref.size());
    scalar::matmul_rows(t.type, t.bytes.data(), row_bytes, cols, 0, rows, x.data(), tokens, y_ref.data(), rows);
    avx2::matmul_rows(t.type, t.bytes.data(), row_bytes, cols, 0, rows, x.data(), tokens, y_fast.data(), rows);
    std::vector<float> y_one(static_cast<size_t>(rows));
    avx2::matmul_rows(t.type, t.bytes.data(), row_bytes, cols, 0, rows, x.data(), 1, y_one.data(), rows);
    for (int64_t r = 0; r < rows; ++r) {
      scalar::dequantize_row(t.type, t.bytes.data() + static_cast<size_t>(r) * row_bytes, want.data(), cols);
      for (int64_t k = 0; k < tokens; ++k) {
        double abs_sum = 0.0;
        for (int64_t c = 0; c < cols; ++c) abs_sum += std::fabs(static_cast<double>(want[static_cast<size_t>(c)]) * x[static_cast<size_t>(k * cols + c)]);
        const auto at = static_cast<size_t>(k * rows + r);
        ASSERT_LE(std::fabs(static_cast<double>(y_fast[at]) - y_ref[at]), pair_bound(cols, abs_sum)) << t.name;
        if (k == 0) {
          ASSERT_LE(std::fabs(static_cast<double>(y_one[static_cast<size_t>(r)]) - y_ref[at]), pair_bound(cols, abs_sum))
              << t.name;
        }
      }
    }
  }
  for (GgmlType type : expected_types) EXPECT_GT(checked[type], 0) << path << " has no " << name(type) << " tensor";
}

TEST(RealModels, SmolLM2Tensors) {
  GAAC_REQUIRE_MODEL(path, "smollm2");
  check_model_tensors(path, {GgmlType::f32, GgmlType::q4_1, GgmlType::q8_0});
}

TEST(RealModels, Gemma3Tensors) {
  GAAC_REQUIRE_MODEL(path, "gemma3");
  check_model_tensors(path, {GgmlType::f32, GgmlType::q8_0, GgmlType::q5_0, GgmlType::q4_k, GgmlType::q6_k});
}

// ----------------------------------------------------------------------------------------------
// Arguments

TEST(QuantArguments, SupportedTypes) {
  for (GgmlType type : kAllTypes) EXPECT_TRUE(supported_type(type)) << name(type);
  EXPECT_FALSE(supported_type(static_cast<GgmlType>(10)));  // Q2_K
  EXPECT_FALSE(supported_type(static_cast<GgmlType>(4)));   // removed Q4_2
  EXPECT_FALSE(supported_type(static_cast<GgmlType>(999)));
}

using Dequantize = void (*)(GgmlType, const uint8_t*, float*, int64_t);
using Matmul = void (*)(GgmlType, const uint8_t*, size_t, int64_t, int64_t, int64_t, const float*, int64_t, float*, int64_t);

void expect_argument_errors(Dequantize dq, Matmul mm) {
  std::vector<uint8_t> w(144 * 8, 0);
  std::vector<float> out(2048), x(2048), y(64);
  EXPECT_THROW(dq(static_cast<GgmlType>(10), w.data(), out.data(), 256), Error);
  EXPECT_THROW(dq(GgmlType::q4_k, w.data(), out.data(), 100), Error);
  EXPECT_THROW(dq(GgmlType::q8_0, w.data(), out.data(), 33), Error);
  EXPECT_THROW(dq(GgmlType::q8_0, w.data(), out.data(), -32), Error);
  EXPECT_THROW(dq(GgmlType::q8_0, nullptr, out.data(), 32), Error);
  EXPECT_THROW(dq(GgmlType::q8_0, w.data(), nullptr, 32), Error);
  EXPECT_NO_THROW(dq(GgmlType::q8_0, nullptr, nullptr, 0));
  EXPECT_NO_THROW(dq(GgmlType::f16, w.data(), out.data(), 3));

  // A valid call: 2 rows of 256 Q4_K.
  EXPECT_NO_THROW(mm(GgmlType::q4_k, w.data(), 144, 256, 0, 2, x.data(), 2, y.data(), 2));
  EXPECT_THROW(mm(static_cast<GgmlType>(11), w.data(), 144, 256, 0, 2, x.data(), 2, y.data(), 2), Error);
  EXPECT_THROW(mm(GgmlType::q4_k, w.data(), 144, 128, 0, 2, x.data(), 2, y.data(), 2), Error);   // cols
  EXPECT_THROW(mm(GgmlType::q4_k, w.data(), 143, 256, 0, 2, x.data(), 2, y.data(), 2), Error);   // row_bytes
  EXPECT_THROW(mm(GgmlType::q4_k, w.data(), 144, 256, 2, 1, x.data(), 2, y.data(), 2), Error);   // reversed
  EXPECT_THROW(mm(GgmlType::q4_k, w.data(), 144, 256, -1, 1, x.data(), 2, y.data(), 2), Error);  // negative
  EXPECT_THROW(mm(GgmlType::q4_k, w.data(), 144, 256, 0, 2, x.data(), -1, y.data(), 2), Error);  // tokens
  EXPECT_THROW(mm(GgmlType::q4_k, w.data(), 144, 256, 0, 2, x.data(), 2, y.data(), 1), Error);   // y_stride
  EXPECT_THROW(mm(GgmlType::q4_k, nullptr, 144, 256, 0, 2, x.data(), 2, y.data(), 2), Error);
  EXPECT_THROW(mm(GgmlType::q4_k, w.data(), 144, 256, 0, 2, nullptr, 2, y.data(), 2), Error);
  EXPECT_THROW(mm(GgmlType::q4_k, w.data(), 144, 256, 0, 2, x.data(), 2, nullptr, 2), Error);
  EXPECT_NO_THROW(mm(GgmlType::q4_k, nullptr, 144, 256, 1, 1, nullptr, 2, nullptr, 2));  // no rows
  EXPECT_NO_THROW(mm(GgmlType::q4_k, nullptr, 144, 256, 0, 2, nullptr, 0, nullptr, 0));  // no tokens
}

TEST(QuantArguments, ReferenceThrows) { expect_argument_errors(scalar::dequantize_row, scalar::matmul_rows); }
TEST(QuantArguments, DispatchThrows) { expect_argument_errors(dequantize_row, matmul_rows); }
TEST_F(Avx2, Throws) { expect_argument_errors(avx2::dequantize_row, avx2::matmul_rows); }

}  // namespace
}  // namespace gaac::model
