// Scalar reference dequantization and matmul_rows: the oracle for the fast paths.
// Each block format is decoded exactly as ggml's dequantize_row_* writes it (ggml-quants.c), every
// multiplication and addition rounded to float on its own (this file is compiled with
// -ffp-contract=off so the compiler cannot fuse them).
#include <bit>
#include <vector>

#include "gaac/bf16.hpp"
#include "model/k_quant_scales.hpp"
#include "model/quants.hpp"

namespace gaac::model {

float fp16_to_float(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exponent = (h >> 10) & 0x1Fu;
  uint32_t mantissa = h & 0x3FFu;
  uint32_t bits;
  if (exponent == 0) {
    if (mantissa == 0) {
      bits = sign;  // ±0
    } else {
      // Subnormal: mantissa · 2^-24. Normalise so that the leading one lands on bit 10.
      const int shift = std::countl_zero(mantissa) - 21;
      mantissa <<= shift;
      const auto float_exponent = static_cast<uint32_t>(1 - shift + 112);
      bits = sign | (float_exponent << 23) | ((mantissa & 0x3FFu) << 13);
    }
  } else if (exponent == 31) {
    bits = sign | 0x7F800000u | (mantissa << 13);  // infinity, or NaN with its payload...
    if (mantissa != 0) bits |= 0x00400000u;         // ...made quiet
  } else {
    bits = sign | ((exponent + 112) << 23) | (mantissa << 13);
  }
  return std::bit_cast<float>(bits);
}

namespace {

uint16_t le16(const uint8_t* p) { return static_cast<uint16_t>(p[0] | (p[1] << 8)); }
uint32_t le32(const uint8_t* p) {
  return static_cast<uint32_t>(p[0]) | (static_cast<uint32_t>(p[1]) << 8) | (static_cast<uint32_t>(p[2]) << 16) |
         (static_cast<uint32_t>(p[3]) << 24);
}
float half_at(const uint8_t* p) { return fp16_to_float(le16(p)); }
float f(int v) { return static_cast<float>(v); }

// One block of each format (scalar_kernels.hpp lays them out).

void f32(const uint8_t* b, float* y) { y[0] = std::bit_cast<float>(le32(b)); }

void f16(const uint8_t* b, float* y) { y[0] = half_at(b); }

void bf16(const uint8_t* b, float* y) { y[0] = bf16_to_float(le16(b)); }

void q8_0(const uint8_t* b, float* y) {  // f16 d; i8 qs[32]
  const float d = half_at(b);
  for (int j = 0; j < 32; ++j) y[j] = f(static_cast<int8_t>(b[2 + j])) * d;
}

void q4_0(const uint8_t* b, float* y) {  // f16 d; u8 qs[16]
  const float d = half_at(b);
  const uint8_t* qs = b + 2;
  for (int j = 0; j < 16; ++j) {
    y[j] = f((qs[j] & 15) - 8) * d;
    y[j + 16] = f((qs[j] >> 4) - 8) * d;
  }
}

void q4_1(const uint8_t* b, float* y) {  // f16 d, m; u8 qs[16]
  const float d = half_at(b), m = half_at(b + 2);
  const uint8_t* qs = b + 4;
  for (int j = 0; j < 16; ++j) {
    y[j] = f(qs[j] & 15) * d + m;
    y[j + 16] = f(qs[j] >> 4) * d + m;
  }
}

void q5_0(const uint8_t* b, float* y) {  // f16 d; u8 qh[4]; u8 qs[16]
  const float d = half_at(b);
  const uint32_t h = le32(b + 2);
  const uint8_t* qs = b + 6;
  for (int j = 0; j < 16; ++j) {
    const int hi0 = static_cast<int>((h >> j) & 1u) << 4, hi1 = static_cast<int>((h >> (j + 16)) & 1u) << 4;
    y[j] = f(((qs[j] & 15) | hi0) - 16) * d;
    y[j + 16] = f(((qs[j] >> 4) | hi1) - 16) * d;
  }
}

void q5_1(const uint8_t* b, float* y) {  // f16 d, m; u8 qh[4]; u8 qs[16]
  const float d = half_at(b), m = half_at(b + 2);
  const uint32_t h = le32(b + 4);
  const uint8_t* qs = b + 8;
  for (int j = 0; j < 16; ++j) {
    const int hi0 = static_cast<int>((h >> j) & 1u) << 4, hi1 = static_cast<int>((h >> (j + 16)) & 1u) << 4;
    y[j] = f((qs[j] & 15) | hi0) * d + m;
    y[j + 16] = f((qs[j] >> 4) | hi1) * d + m;
  }
}

void q4_k(const uint8_t* b, float* y) {  // f16 d, dmin; u8 scales[12]; u8 qs[128]
  const float d = half_at(b), dmin = half_at(b + 2);
  const KQuantScales scales = unpack_k_quant_scales(b + 4);
  const uint8_t* q = b + 16;
  for (int c = 0; c < 4; ++c, q += 32, y += 64) {
    const float d1 = d * f(scales.scale(2 * c)), m1 = dmin * f(scales.min(2 * c));
    const float d2 = d * f(scales.scale(2 * c + 1)), m2 = dmin * f(scales.min(2 * c + 1));
    for (int l = 0; l < 32; ++l) y[l] = d1 * f(q[l] & 15) - m1;
    for (int l = 0; l < 32; ++l) y[32 + l] = d2 * f(q[l] >> 4) - m2;
  }
}

void q5_k(const uint8_t* b, float* y) {  // f16 d, dmin; u8 scales[12]; u8 qh[32]; u8 qs[128]
  const float d = half_at(b), dmin = half_at(b + 2);
  const KQuantScales scales = unpack_k_quant_scales(b + 4);
  const uint8_t* qh = b + 16;
  const uint8_t* q = b + 48;
  for (int c = 0; c < 4; ++c, q += 32, y += 64) {
    const float d1 = d * f(scales.scale(2 * c)), m1 = dmin * f(scales.min(2 * c));
    const float d2 = d * f(scales.scale(2 * c + 1)), m2 = dmin * f(scales.min(2 * c + 1));
    for (int l = 0; l < 32; ++l) y[l] = d1 * f((q[l] & 15) | (((qh[l] >> (2 * c)) & 1) << 4)) - m1;
    for (int l = 0; l < 32; ++l) y[32 + l] = d2 * f((q[l] >> 4) | (((qh[l] >> (2 * c + 1)) & 1) << 4)) - m2;
  }
}

void q6_k(const uint8_t* b, float* y) {  // u8 ql[128]; u8 qh[64]; i8 scales[16]; f16 d
  const float d = half_at(b + 208);
  const uint8_t* ql = b;
  const uint8_t* qh = b + 128;
  const auto* sc = reinterpret_cast<const int8_t*>(b + 192);
  for (int half = 0; half < 2; ++half, ql += 64, qh += 32, sc += 8, y += 128) {
    for (int l = 0; l < 32; ++l) {
      const int is = l / 16;
      const int q1 = ((ql[l] & 15) | (((qh[l] >> 0) & 3) << 4)) - 32;
      const int q2 = ((ql[l + 32] & 15) | (((qh[l] >> 2) & 3) << 4)) - 32;
      const int q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
      const int q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
      y[l] = d * f(sc[is]) * f(q1);
      y[l + 32] = d * f(sc[is + 2]) * f(q2);
      y[l + 64] = d * f(sc[is + 4]) * f(q3);
      y[l + 96] = d * f(sc[is + 6]) * f(q4);
    }
  }
}

/// `blocks` consecutive blocks of type T, each decoded by `block`.
template <GgmlType T, void (*block)(const uint8_t*, float*)>
void each_block(const uint8_t* src, float* dst, int64_t blocks) {
  constexpr size_t kBytes = ggml_type_info(T).block_bytes;
  constexpr int64_t kElements = ggml_type_info(T).block_elements;
  for (int64_t i = 0; i < blocks; ++i) block(src + static_cast<size_t>(i) * kBytes, dst + i * kElements);
}

/// Converts `n` elements (a whole number of blocks, checked by the caller).
void dequantize_unchecked(GgmlType type, const uint8_t* src, float* dst, int64_t n) {
  const GgmlTypeInfo& info = ggml_type_info(type);
  info.dequantize_blocks(src, dst, n / info.block_elements);
}

}  // namespace

namespace scalar {

void dequantize_f32(const uint8_t* src, float* dst, int64_t blocks) { each_block<GgmlType::f32, f32>(src, dst, blocks); }
void dequantize_f16(const uint8_t* src, float* dst, int64_t blocks) { each_block<GgmlType::f16, f16>(src, dst, blocks); }
void dequantize_bf16(const uint8_t* src, float* dst, int64_t blocks) { each_block<GgmlType::bf16, bf16>(src, dst, blocks); }
void dequantize_q8_0(const uint8_t* src, float* dst, int64_t blocks) { each_block<GgmlType::q8_0, q8_0>(src, dst, blocks); }
void dequantize_q4_0(const uint8_t* src, float* dst, int64_t blocks) { each_block<GgmlType::q4_0, q4_0>(src, dst, blocks); }
void dequantize_q4_1(const uint8_t* src, float* dst, int64_t blocks) { each_block<GgmlType::q4_1, q4_1>(src, dst, blocks); }
void dequantize_q5_0(const uint8_t* src, float* dst, int64_t blocks) { each_block<GgmlType::q5_0, q5_0>(src, dst, blocks); }
void dequantize_q5_1(const uint8_t* src, float* dst, int64_t blocks) { each_block<GgmlType::q5_1, q5_1>(src, dst, blocks); }
void dequantize_q4_k(const uint8_t* src, float* dst, int64_t blocks) { each_block<GgmlType::q4_k, q4_k>(src, dst, blocks); }
void dequantize_q5_k(const uint8_t* src, float* dst, int64_t blocks) { each_block<GgmlType::q5_k, q5_k>(src, dst, blocks); }
void dequantize_q6_k(const uint8_t* src, float* dst, int64_t blocks) { each_block<GgmlType::q6_k, q6_k>(src, dst, blocks); }

void dequantize_row(GgmlType type, const uint8_t* src, float* dst, int64_t n) {
  detail::check_dequantize(type, src, dst, n);
  dequantize_unchecked(type, src, dst, n);
}

void matmul_rows(GgmlType type, const uint8_t* w, size_t row_bytes, int64_t cols, int64_t row_begin, int64_t row_end,
                 const float* x, int64_t tokens, float* y, int64_t y_stride) {
  detail::check_matmul(type, w, row_bytes, cols, row_begin, row_end, x, tokens, y, y_stride);
  if (tokens == 0) return;
  std::vector<float> row(static_cast<size_t>(cols));
  for (int64_t r = row_begin; r < row_end; ++r) {
    dequantize_unchecked(type, w + static_cast<size_t>(r) * row_bytes, row.data(), cols);
    for (int64_t t = 0; t < tokens; ++t) {
      const float* xt = x + t * cols;
      float sum = 0.0f;
      for (int64_t c = 0; c < cols; ++c) {
        const float product = row[static_cast<size_t>(c)] * xt[c];
        sum += product;
      }
      y[t * y_stride + r] = sum;
    }
  }
}

}  // namespace scalar
}  // namespace gaac::model
