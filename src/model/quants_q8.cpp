// Activation quantizers and quantized products: scalar reference (ggml's reference quantizers and
// generic dot kernels, expression for expression), argument checks and the choice of implementation.
// Built with -ffp-contract=off: every float multiplication and addition is rounded on its own, as
// the reference's expressions are written.
#include <bit>
#include <cmath>
#include <cstring>
#include <string>

#include "gaac/bf16.hpp"
#include "gaac/error.hpp"
#include "model/k_quant_scales.hpp"
#include "model/quants.hpp"
#include "model/quants_q8.hpp"

namespace gaac::model {

// ----------------------------------------------------------------------------------------------
// Formats

ActivationType activation_type(GgmlType weight_type) {
  if (!supported_type(weight_type)) {
    throw Error("quantized activations: unsupported weight type " + std::to_string(static_cast<uint32_t>(weight_type)));
  }
  return ggml_type_info(weight_type).vec_dot_type;
}

uint16_t float_to_fp16(float value) {
  const uint32_t bits = std::bit_cast<uint32_t>(value);
  const auto sign = static_cast<uint16_t>((bits >> 16) & 0x8000u);
  const uint32_t magnitude = bits & 0x7FFFFFFFu;
  if (magnitude > 0x7F800000u) return static_cast<uint16_t>(sign | 0x7E00u);  // NaN
  if (magnitude >= 0x477FF000u) return static_cast<uint16_t>(sign | 0x7C00u);  // ≥ 65520 rounds to infinity
  if (magnitude >= 0x38800000u) {
    // Normal in fp16 (≥ 2^-14): rebias the exponent, round the 23-bit mantissa to 10 bits (a carry
    // into the exponent is the correct result).
    const uint32_t rebiased = magnitude - 0x38000000u;
    return static_cast<uint16_t>(sign | ((rebiased + 0x0FFFu + ((rebiased >> 13) & 1u)) >> 13));
  }
  if (magnitude < 0x33000000u) return sign;  // below 2^-25: rounds to zero (2^-25 itself ties to zero, below)
  // Subnormal in fp16: the value in units of 2^-24, rounded to nearest even.
  const uint32_t exponent = magnitude >> 23;  // 102 .. 112
  const uint32_t mantissa = (magnitude & 0x7FFFFFu) | 0x800000u;
  const uint32_t shift = 126 - exponent;  // 14 .. 24
  uint32_t q = mantissa >> shift;
  const uint32_t rest = mantissa & ((1u << shift) - 1u), half = 1u << (shift - 1u);
  if (rest > half || (rest == half && (q & 1u))) ++q;
  return static_cast<uint16_t>(sign | q);
}

namespace {

std::string weight_name(GgmlType type) { return ggml_type_info(type).name; }

uint16_t le16(const uint8_t* p) { return static_cast<uint16_t>(p[0] | (p[1] << 8)); }
uint32_t le32(const uint8_t* p) {
  return static_cast<uint32_t>(p[0]) | (static_cast<uint32_t>(p[1]) << 8) | (static_cast<uint32_t>(p[2]) << 16) |
         (static_cast<uint32_t>(p[3]) << 24);
}
void put16(uint8_t* p, uint16_t v) {
  p[0] = static_cast<uint8_t>(v & 0xFFu);
  p[1] = static_cast<uint8_t>(v >> 8);
}
void put32(uint8_t* p, uint32_t v) {
  for (int i = 0; i < 4; ++i) p[i] = static_cast<uint8_t>(v >> (8 * i));
}
float half_at(const uint8_t* p) { return fp16_to_float(le16(p)); }
float float_at(const uint8_t* p) { return std::bit_cast<float>(le32(p)); }
float f(int v) { return static_cast<float>(v); }

/// A rounded value as a quant: NaN → 0, saturated to [−127, 127] (only reachable where ggml's own
/// conversion is undefined).
int8_t to_quant(float rounded) {
  if (std::isnan(rounded)) return 0;
  if (rounded > 127.0f) return 127;
  if (rounded < -127.0f) return -127;
  return static_cast<int8_t>(rounded);
}

/// ggml's nearest_int: round half to even by adding 1.5·2^23 (exact for |v| ≤ 2^22); outside that
/// range (where ggml asserts) the value saturates.
int nearest_int(float v) {
  if (std::isnan(v)) return 0;
  if (!(std::fabs(v) <= 4194303.0f)) return v > 0 ? 127 : -127;
  const float shifted = v + 12582912.0f;
  return static_cast<int>(std::bit_cast<uint32_t>(shifted) & 0x007FFFFFu) - 0x00400000;
}

// ---- quantizers (quantize_row_q8_0_ref, quantize_row_q8_1_ref, quantize_row_q8_K_ref)

/// d and the inverse scale of a Q8_0/Q8_1 block whose largest magnitude is `amax`.
void q8_scales(float amax, Q8Rounding rounding, float& d, float& id) {
  d = amax / 127.0f;
  if (rounding == Q8Rounding::reference) {
    id = d != 0.0f ? 1.0f / d : 0.0f;
  } else {
    id = amax != 0.0f ? 127.0f / amax : 0.0f;
  }
}

/// roundf (reference) or round half to even (x86: vroundps; std::nearbyint in the default rounding mode).
int8_t q8_quant(float scaled, Q8Rounding rounding) {
  return to_quant(rounding == Q8Rounding::reference ? std::round(scaled) : std::nearbyint(scaled));
}

float block_amax(const float* x) {
  float amax = 0.0f;
  for (int j = 0; j < 32; ++j) {
    const float a = std::fabs(x[j]);
    amax = amax > a ? amax : a;  // ggml's MAX(amax, a)
  }
  return amax;
}

void quantize_q8_0(const float* x, uint8_t* out, int64_t blocks, Q8Rounding rounding) {
  for (int64_t i = 0; i < blocks; ++i, x += 32, out += activation_block_bytes(ActivationType::q8_0)) {
    float d, id;
    q8_scales(block_amax(x), rounding, d, id);
    put16(out, float_to_fp16(d));
    for (int j = 0; j < 32; ++j) out[2 + j] = static_cast<uint8_t>(q8_quant(x[j] * id, rounding));
  }
}

void quantize_q8_1(const float* x, uint8_t* out, int64_t blocks, Q8Rounding rounding) {
  for (int64_t i = 0; i < blocks; ++i, x += 32, out += activation_block_bytes(ActivationType::q8_1)) {
    float d, id;
    q8_scales(block_amax(x), rounding, d, id);
    put16(out, float_to_fp16(d));
    int sum = 0;
    for (int j = 0; j < 32; ++j) {
      const int8_t q = q8_quant(x[j] * id, rounding);
      out[4 + j] = static_cast<uint8_t>(q);
      sum += q;
    }
    put16(out + 2, float_to_fp16(f(sum) * d));
  }
}

void quantize_q8_k(const float* x, uint8_t* out, int64_t blocks) {
  constexpr size_t kBytes = activation_block_bytes(ActivationType::q8_k);
  for (int64_t i = 0; i < blocks; ++i, x += 256, out += kBytes) {
    float max = 0.0f, amax = 0.0f;
    for (int j = 0; j < 256; ++j) {
      const float a = std::fabs(x[j]);
      if (a > amax) {
        amax = a;
        max = x[j];
      }
    }
    if (amax == 0.0f) {
      std::memset(out, 0, kBytes);  // d = 0, quants and sums 0
      continue;
    }
    const float iscale = -127.0f / max;
    int8_t q[256];
    for (int j = 0; j < 256; ++j) {
      const int v = nearest_int(iscale * x[j]);
      q[j] = static_cast<int8_t>(v < 127 ? (v > -127 ? v : -127) : 127);
    }
    std::memcpy(out + 4, q, 256);
    for (int j = 0; j < 16; ++j) {
      int sum = 0;
      for (int l = 0; l < 16; ++l) sum += q[16 * j + l];
      put16(out + 260 + 2 * j, static_cast<uint16_t>(static_cast<int16_t>(sum)));
    }
    put32(out, std::bit_cast<uint32_t>(1.0f / iscale));
  }
}

void quantize_row_unchecked(ActivationType type, const float* x, int64_t cols, uint8_t* out, Q8Rounding rounding) {
  switch (type) {
    case ActivationType::f32: std::memcpy(out, x, static_cast<size_t>(cols) * sizeof(float)); return;
    case ActivationType::f16:
      for (int64_t i = 0; i < cols; ++i) put16(out + 2 * i, float_to_fp16(x[i]));
      return;
    case ActivationType::bf16:
      for (int64_t i = 0; i < cols; ++i) put16(out + 2 * i, float_to_bf16(x[i]));
      return;
    case ActivationType::q8_0: quantize_q8_0(x, out, cols / 32, rounding); return;
    case ActivationType::q8_1: quantize_q8_1(x, out, cols / 32, rounding); return;
    case ActivationType::q8_k: quantize_q8_k(x, out, cols / 256); return;
  }
}

/// Checks a type and column count for quantization; returns the activation type.
ActivationType check_row(GgmlType weight_type, const float* x, int64_t cols) {
  if (!supported_type(weight_type)) {
    throw Error("quantize activations: unsupported weight type " + std::to_string(static_cast<uint32_t>(weight_type)));
  }
  const int64_t block = ggml_type_info(weight_type).block_elements;
  if (cols < 0 || cols % block != 0) {
    throw Error("quantize activations for " + weight_name(weight_type) + ": " + std::to_string(cols) +
                " columns is not a multiple of the block size " + std::to_string(block));
  }
  if (cols > 0 && x == nullptr) throw Error("quantize activations: null input");
  return activation_type(weight_type);
}

/// The F16/BF16 rounding ggml applies to activations for float weights, widened back to float.
float round_for(ActivationType type, float v) {
  if (type == ActivationType::f16) return fp16_to_float(float_to_fp16(v));
  if (type == ActivationType::bf16) return bf16_to_float(float_to_bf16(v));
  return v;
}

}  // namespace

// ----------------------------------------------------------------------------------------------
// Dots of each format (ggml_vec_dot_*_generic; scalar_kernels.hpp)

namespace {

/// The dots' strides for weights of type T.
template <GgmlType T>
struct Strides {
  /// Bytes of one weight block.
  static constexpr size_t weight = ggml_type_info(T).block_bytes;
  /// Bytes of one block of the activations it multiplies (its vec_dot_type).
  static constexpr size_t activation = activation_block_bytes(ggml_type_info(T).vec_dot_type);
};

/// Σ over 32-element groups g of scale[g]·Σ q8·a, split into ggml's eight lanes (lane l takes
/// elements ≡ l mod 8), as the generic K-quant kernels accumulate it.
void lane_sums(const int8_t* a, const int8_t* q8, const int* scale, int group, int32_t (&aux32)[8]) {
  for (int l = 0; l < 8; ++l) aux32[l] = 0;
  for (int j = 0; j < 256 / group; ++j) {
    for (int k = 0; k < group / 8; ++k) {
      for (int l = 0; l < 8; ++l) {
        const int e = j * group + 8 * k + l;
        const auto product = static_cast<int16_t>(q8[e] * a[e]);
        aux32[l] += scale[j] * product;
      }
    }
  }
}

/// Q4_K (T = q4_k) and Q5_K (T = q5_k) against Q8_K.
template <GgmlType T>
float dot_q45_k(const uint8_t* w, const uint8_t* x, int64_t blocks) {
  constexpr bool five_bits = T == GgmlType::q5_k;
  using S = Strides<T>;
  float sums[8] = {};
  float sumf = 0.0f;
  for (int64_t i = 0; i < blocks; ++i, w += S::weight, x += S::activation) {
    const KQuantScales scales = unpack_k_quant_scales(w + 4);
    const uint8_t* qh = w + 16;
    const uint8_t* qs = w + (five_bits ? 48 : 16);
    int8_t a[256];
    for (int c = 0; c < 4; ++c) {
      for (int l = 0; l < 32; ++l) {
        int lo = qs[32 * c + l] & 15, hi = qs[32 * c + l] >> 4;
        if (five_bits) {
          lo |= ((qh[l] >> (2 * c)) & 1) << 4;
          hi |= ((qh[l] >> (2 * c + 1)) & 1) << 4;
        }
        a[64 * c + l] = static_cast<int8_t>(lo);
        a[64 * c + 32 + l] = static_cast<int8_t>(hi);
      }
    }
    int sc[8];
    for (int j = 0; j < 8; ++j) sc[j] = scales.scale(j);
    int sumi = 0;
    for (int j = 0; j < 16; ++j) sumi += static_cast<int16_t>(le16(x + 260 + 2 * j)) * scales.min(j / 2);
    int32_t aux32[8];
    lane_sums(a, reinterpret_cast<const int8_t*>(x + 4), sc, 32, aux32);
    const float xd = float_at(x);
    const float d = half_at(w) * xd;
    for (int l = 0; l < 8; ++l) sums[l] += d * static_cast<float>(aux32[l]);
    const float dmin = half_at(w + 2) * xd;
    sumf -= dmin * f(sumi);
  }
  for (float s : sums) sumf += s;
  return sumf;
}

}  // namespace

namespace scalar {

float dot_q4_0(const uint8_t* w, const uint8_t* x, int64_t blocks) {
  using S = Strides<GgmlType::q4_0>;
  float sumf = 0.0f;
  for (int64_t i = 0; i < blocks; ++i, w += S::weight, x += S::activation) {
    const uint8_t* qs = w + 2;
    const auto* q8 = reinterpret_cast<const int8_t*>(x + 2);
    int sumi0 = 0, sumi1 = 0;
    for (int j = 0; j < 16; ++j) {
      sumi0 += ((qs[j] & 15) - 8) * q8[j];
      sumi1 += ((qs[j] >> 4) - 8) * q8[j + 16];
    }
    const int sumi = sumi0 + sumi1;
    sumf += f(sumi) * half_at(w) * half_at(x);
  }
  return sumf;
}

float dot_q4_1(const uint8_t* w, const uint8_t* x, int64_t blocks) {
  using S = Strides<GgmlType::q4_1>;
  float sumf = 0.0f;
  for (int64_t i = 0; i < blocks; ++i, w += S::weight, x += S::activation) {
    const uint8_t* qs = w + 4;
    const auto* q8 = reinterpret_cast<const int8_t*>(x + 4);
    int sumi0 = 0, sumi1 = 0;
    for (int j = 0; j < 16; ++j) {
      sumi0 += (qs[j] & 15) * q8[j];
      sumi1 += (qs[j] >> 4) * q8[j + 16];
    }
    const int sumi = sumi0 + sumi1;
    sumf += (half_at(w) * half_at(x)) * f(sumi) + half_at(w + 2) * half_at(x + 2);
  }
  return sumf;
}

float dot_q5_0(const uint8_t* w, const uint8_t* x, int64_t blocks) {
  using S = Strides<GgmlType::q5_0>;
  float sumf = 0.0f;
  for (int64_t i = 0; i < blocks; ++i, w += S::weight, x += S::activation) {
    const uint32_t qh = le32(w + 2);
    const uint8_t* qs = w + 6;
    const auto* q8 = reinterpret_cast<const int8_t*>(x + 2);
    int sumi0 = 0, sumi1 = 0;
    for (int j = 0; j < 16; ++j) {
      const int h0 = static_cast<int>((qh >> j) & 1u) << 4, h1 = static_cast<int>((qh >> (j + 16)) & 1u) << 4;
      sumi0 += (((qs[j] & 15) | h0) - 16) * q8[j];
      sumi1 += (((qs[j] >> 4) | h1) - 16) * q8[j + 16];
    }
    const int sumi = sumi0 + sumi1;
    sumf += (half_at(w) * half_at(x)) * f(sumi);
  }
  return sumf;
}

float dot_q5_1(const uint8_t* w, const uint8_t* x, int64_t blocks) {
  using S = Strides<GgmlType::q5_1>;
  float sumf = 0.0f;
  for (int64_t i = 0; i < blocks; ++i, w += S::weight, x += S::activation) {
    const uint32_t qh = le32(w + 4);
    const uint8_t* qs = w + 8;
    const auto* q8 = reinterpret_cast<const int8_t*>(x + 4);
    int sumi0 = 0, sumi1 = 0;
    for (int j = 0; j < 16; ++j) {
      const int h0 = static_cast<int>((qh >> j) & 1u) << 4, h1 = static_cast<int>((qh >> (j + 16)) & 1u) << 4;
      sumi0 += ((qs[j] & 15) | h0) * q8[j];
      sumi1 += ((qs[j] >> 4) | h1) * q8[j + 16];
    }
    const int sumi = sumi0 + sumi1;
    sumf += (half_at(w) * half_at(x)) * f(sumi) + half_at(w + 2) * half_at(x + 2);
  }
  return sumf;
}

float dot_q8_0(const uint8_t* w, const uint8_t* x, int64_t blocks) {
  using S = Strides<GgmlType::q8_0>;
  float sumf = 0.0f;
  for (int64_t i = 0; i < blocks; ++i, w += S::weight, x += S::activation) {
    const auto* qw = reinterpret_cast<const int8_t*>(w + 2);
    const auto* q8 = reinterpret_cast<const int8_t*>(x + 2);
    int sumi = 0;
    for (int j = 0; j < 32; ++j) sumi += qw[j] * q8[j];
    sumf += f(sumi) * (half_at(w) * half_at(x));
  }
  return sumf;
}

float dot_q4_k(const uint8_t* w, const uint8_t* x, int64_t blocks) { return dot_q45_k<GgmlType::q4_k>(w, x, blocks); }

float dot_q5_k(const uint8_t* w, const uint8_t* x, int64_t blocks) { return dot_q45_k<GgmlType::q5_k>(w, x, blocks); }

float dot_q6_k(const uint8_t* w, const uint8_t* x, int64_t blocks) {
  using S = Strides<GgmlType::q6_k>;
  float sums[8] = {};
  for (int64_t i = 0; i < blocks; ++i, w += S::weight, x += S::activation) {
    int8_t a[256];
    const uint8_t* ql = w;
    const uint8_t* qh = w + 128;
    for (int h = 0; h < 2; ++h, ql += 64, qh += 32) {
      for (int l = 0; l < 32; ++l) {
        a[128 * h + l] = static_cast<int8_t>(((ql[l] & 15) | (((qh[l] >> 0) & 3) << 4)) - 32);
        a[128 * h + l + 32] = static_cast<int8_t>(((ql[l + 32] & 15) | (((qh[l] >> 2) & 3) << 4)) - 32);
        a[128 * h + l + 64] = static_cast<int8_t>(((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32);
        a[128 * h + l + 96] = static_cast<int8_t>(((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32);
      }
    }
    int sc[16];
    for (int j = 0; j < 16; ++j) sc[j] = static_cast<int8_t>(w[192 + j]);
    int32_t aux32[8];
    lane_sums(a, reinterpret_cast<const int8_t*>(x + 4), sc, 16, aux32);
    const float d = half_at(w + 208) * float_at(x);
    for (int l = 0; l < 8; ++l) sums[l] += d * static_cast<float>(aux32[l]);
  }
  float sumf = 0.0f;
  for (float s : sums) sumf += s;
  return sumf;
}

}  // namespace scalar

// ----------------------------------------------------------------------------------------------
// Checks

namespace detail {

void check_activation_rows(const float* x, int64_t t_begin, int64_t t_end, const QuantizedActivations& out) {
  if (t_begin < 0 || t_end < t_begin || t_end > out.tokens) {
    throw Error("quantize activations: bad token range [" + std::to_string(t_begin) + ", " + std::to_string(t_end) +
                ") of " + std::to_string(out.tokens));
  }
  if (t_end > t_begin && out.cols > 0 && x == nullptr) throw Error("quantize activations: null input");
  const auto n = static_cast<size_t>(out.tokens);
  const bool plain = activation_block_elements(out.type) == 1;
  const bool sized = plain ? out.values.size() == n * static_cast<size_t>(out.cols)
                           : out.blocks.size() == n * out.row_bytes;
  if (!sized) throw Error("quantize activations: the destination was not prepared");
}

void check_quantized_matmul(GgmlType type, const uint8_t* w, size_t row_bytes, int64_t cols, int64_t row_begin,
                            int64_t row_end, const QuantizedActivations& x, const float* y, int64_t y_stride) {
  if (supported_type(type)) {
    if (x.weight_type != type) {
      throw Error(std::string("quantized matmul: activations converted for ") + weight_name(x.weight_type) +
                  ", weights are " + weight_name(type));
    }
    if (x.cols != cols) {
      throw Error("quantized matmul: activations have " + std::to_string(x.cols) + " columns, weights " +
                  std::to_string(cols));
    }
  }
  // The activations' storage, or null where it is empty (check_matmul then reports a null buffer).
  const float* data = nullptr;
  static const float kPresent = 0.0f;
  if (x.tokens > 0 && x.cols > 0) {
    const auto n = static_cast<size_t>(x.tokens);
    const bool plain = activation_block_elements(x.type) == 1;
    const bool cached = x.type == ActivationType::q8_0 || x.type == ActivationType::q8_1;
    const size_t cells = n * static_cast<size_t>(x.cols / activation_block_elements(x.type));
    const bool sized = plain ? x.values.size() == n * static_cast<size_t>(x.cols)
                             : x.blocks.size() == n * x.row_bytes &&
                                   (!cached || (x.scales.size() == cells + 4 &&
                                                (x.type == ActivationType::q8_0 || x.sums.size() == cells + 4) &&
                                                x.quants_offset < 32 && x.quants.size() == n * static_cast<size_t>(x.cols) + 32));
    if (!sized) throw Error("quantized matmul: the activations were not prepared");
    data = &kPresent;
  }
  check_matmul(type, w, row_bytes, cols, row_begin, row_end, data, x.tokens, y, y_stride);
}

void check_quantized_tile(GgmlType type, const uint8_t* w, size_t row_bytes, int64_t cols, int64_t row_begin,
                          int64_t row_end, const QuantizedActivations& x, int64_t token_begin, int64_t token_end,
                          const float* y, int64_t y_stride) {
  check_quantized_matmul(type, w, row_bytes, cols, row_begin, row_end, x, y, y_stride);
  if (token_begin < 0 || token_end < token_begin || token_end > x.tokens) {
    throw Error("quantized matmul: bad token range [" + std::to_string(token_begin) + ", " + std::to_string(token_end) +
                ") of " + std::to_string(x.tokens) + " tokens");
  }
}

}  // namespace detail

// ----------------------------------------------------------------------------------------------
// Preparation (shared by both implementations)

void prepare_activations(GgmlType weight_type, int64_t cols, int64_t tokens, QuantizedActivations& out,
                         Q8Rounding rounding) {
  static const float kAny = 0.0f;
  const ActivationType type = check_row(weight_type, &kAny, cols);
  if (tokens < 0) throw Error("quantize activations: negative token count " + std::to_string(tokens));
  out.weight_type = weight_type;
  out.type = type;
  out.rounding = rounding;
  out.cols = cols;
  out.tokens = tokens;
  const int64_t block = activation_block_elements(type);
  const auto n = static_cast<size_t>(tokens);
  if (block == 1) {
    out.row_bytes = 0;
    out.blocks.clear();
    out.values.resize(n * static_cast<size_t>(cols));
    out.scales.clear();
    out.sums.clear();
    out.quants.clear();
    out.quants_offset = 0;
  } else {
    const auto blocks = static_cast<size_t>(cols / block);
    out.row_bytes = blocks * activation_block_bytes(type);
    out.blocks.resize(n * out.row_bytes);
    out.values.clear();
    const bool cached = type == ActivationType::q8_0 || type == ActivationType::q8_1;
    out.scales.assign(cached ? n * blocks + 4 : 0, 0.0f);
    out.sums.assign(type == ActivationType::q8_1 ? n * blocks + 4 : 0, 0.0f);
    out.quants.resize(cached ? n * static_cast<size_t>(cols) + 32 : 0);
    out.quants_offset = cached ? (32 - reinterpret_cast<uintptr_t>(out.quants.data()) % 32) % 32 : 0;
  }
}

// ----------------------------------------------------------------------------------------------
// Reference

namespace scalar {

void quantize_activations(GgmlType weight_type, const float* x, int64_t cols, std::vector<uint8_t>& out,
                          Q8Rounding rounding) {
  const ActivationType type = check_row(weight_type, x, cols);
  const int64_t block = activation_block_elements(type);
  out.resize(static_cast<size_t>(cols / block) * activation_block_bytes(type));
  if (cols > 0) quantize_row_unchecked(type, x, cols, out.data(), rounding);
}

void quantize_activation_rows(const float* x, int64_t t_begin, int64_t t_end, QuantizedActivations& out) {
  detail::check_activation_rows(x, t_begin, t_end, out);
  if (out.cols == 0) return;
  const auto cols = static_cast<size_t>(out.cols);
  for (int64_t t = t_begin; t < t_end; ++t) {
    const float* row = x + static_cast<size_t>(t) * cols;
    if (activation_block_elements(out.type) == 1) {
      float* dst = out.values.data() + static_cast<size_t>(t) * cols;
      for (size_t i = 0; i < cols; ++i) dst[i] = round_for(out.type, row[i]);
      continue;
    }
    uint8_t* dst = out.blocks.data() + static_cast<size_t>(t) * out.row_bytes;
    quantize_row_unchecked(out.type, row, out.cols, dst, out.rounding);
    if (out.type == ActivationType::q8_0 || out.type == ActivationType::q8_1) {
      const size_t bytes = activation_block_bytes(out.type);
      const size_t blocks = cols / 32;
      for (size_t b = 0; b < blocks; ++b) {
        const size_t at = b * static_cast<size_t>(out.tokens) + static_cast<size_t>(t);
        out.scales[at] = half_at(dst + b * bytes);
        if (out.type == ActivationType::q8_1) out.sums[at] = half_at(dst + b * bytes + 2);
        std::memcpy(out.quants.data() + out.quants_offset + static_cast<size_t>(t) * cols + 32 * b, dst + b * bytes + (bytes - 32), 32);
      }
    }
  }
}

float dot_row(GgmlType type, const uint8_t* w, const uint8_t* xq, int64_t cols) {
  const GgmlTypeInfo& info = ggml_type_info(type);
  if (info.dot_blocks == nullptr) throw Error("quantized dot: " + weight_name(type) + " is not a quantized type");
  return info.dot_blocks(w, xq, cols / info.block_elements);
}

void matmul_rows_quantized(GgmlType type, const uint8_t* w, size_t row_bytes, int64_t cols, int64_t row_begin,
                           int64_t row_end, const QuantizedActivations& x, float* y, int64_t y_stride) {
  scalar::matmul_tile_quantized(type, w, row_bytes, cols, row_begin, row_end, x, 0, x.tokens, y, y_stride);
}

void matmul_tile_quantized(GgmlType type, const uint8_t* w, size_t row_bytes, int64_t cols, int64_t row_begin,
                           int64_t row_end, const QuantizedActivations& x, int64_t token_begin, int64_t token_end,
                           float* y, int64_t y_stride) {
  detail::check_quantized_tile(type, w, row_bytes, cols, row_begin, row_end, x, token_begin, token_end, y, y_stride);
  if (activation_block_elements(x.type) == 1) {
    const auto first = static_cast<size_t>(token_begin) * static_cast<size_t>(cols);
    scalar::matmul_rows(type, w, row_bytes, cols, row_begin, row_end, x.values.data() + first, token_end - token_begin,
                        y + token_begin * y_stride, y_stride);
    return;
  }
  for (int64_t r = row_begin; r < row_end; ++r) {
    for (int64_t t = token_begin; t < token_end; ++t) {
      y[t * y_stride + r] = cols == 0 ? 0.0f
                                      : dot_row(type, w + static_cast<size_t>(r) * row_bytes,
                                                x.blocks.data() + static_cast<size_t>(t) * x.row_bytes, cols);
    }
  }
}

}  // namespace scalar

// ----------------------------------------------------------------------------------------------
// Dispatch

namespace {
bool use_avx2() {
  static const bool available = avx2::available();
  return available;
}
}  // namespace

void quantize_activations(GgmlType weight_type, const float* x, int64_t cols, std::vector<uint8_t>& out,
                          Q8Rounding rounding) {
  if (use_avx2()) {
    avx2::quantize_activations(weight_type, x, cols, out, rounding);
  } else {
    scalar::quantize_activations(weight_type, x, cols, out, rounding);
  }
}

void quantize_activation_rows(const float* x, int64_t t_begin, int64_t t_end, QuantizedActivations& out) {
  if (use_avx2()) {
    avx2::quantize_activation_rows(x, t_begin, t_end, out);
  } else {
    scalar::quantize_activation_rows(x, t_begin, t_end, out);
  }
}

void quantize_activations(GgmlType weight_type, const float* x, int64_t cols, int64_t tokens,
                          QuantizedActivations& out, Q8Rounding rounding) {
  prepare_activations(weight_type, cols, tokens, out, rounding);
  quantize_activation_rows(x, 0, tokens, out);
}

void matmul_rows_quantized(GgmlType type, const uint8_t* w, size_t row_bytes, int64_t cols, int64_t row_begin,
                           int64_t row_end, const QuantizedActivations& x, float* y, int64_t y_stride) {
  matmul_tile_quantized(type, w, row_bytes, cols, row_begin, row_end, x, 0, x.tokens, y, y_stride);
}

void matmul_tile_quantized(GgmlType type, const uint8_t* w, size_t row_bytes, int64_t cols, int64_t row_begin,
                           int64_t row_end, const QuantizedActivations& x, int64_t token_begin, int64_t token_end,
                           float* y, int64_t y_stride) {
  if (use_avx2()) {
    avx2::matmul_tile_quantized(type, w, row_bytes, cols, row_begin, row_end, x, token_begin, token_end, y, y_stride);
  } else {
    scalar::matmul_tile_quantized(type, w, row_bytes, cols, row_begin, row_end, x, token_begin, token_end, y, y_stride);
  }
}

void matmul_rows_quantized(GgmlType type, const uint8_t* w, size_t row_bytes, int64_t cols, int64_t row_begin,
                           int64_t row_end, const float* x, int64_t tokens, float* y, int64_t y_stride) {
  // The same checks as matmul_rows, before any conversion.
  detail::check_matmul(type, w, row_bytes, cols, row_begin, row_end, x, tokens, y, y_stride);
  if (row_end == row_begin || tokens == 0) return;
  QuantizedActivations q;
  quantize_activations(type, x, cols, tokens, q);
  matmul_rows_quantized(type, w, row_bytes, cols, row_begin, row_end, q, y, y_stride);
}

}  // namespace gaac::model
