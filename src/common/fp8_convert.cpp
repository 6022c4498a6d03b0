// FP8 element conversions and the conversion of a BF16 dump to FP8 (docs/format.md, section 14.8).
#include <algorithm>
#include <cmath>
#include <string>

#include "gaac/bf16.hpp"
#include "gaac/error.hpp"
#include "gaac/fp8_dump.hpp"

namespace gaac {
namespace {

/// The exponent bias: 7 (E4M3) or 15 (E5M2).
int bias(ElementFormat f) { return (1 << (exponent_bits(f) - 1)) - 1; }

void require_fp8(ElementFormat f) {
  if (!is_fp8(f)) throw Error(std::string("not an FP8 format: ") + to_string(f));
}

/// The FP8 element of a finite magnitude that is exactly representable and at most the largest finite one.
uint8_t encode_magnitude(float a, ElementFormat f) {
  const int m = mantissa_bits(f);
  const int min_normal_exponent = 1 - bias(f);
  if (a < std::ldexp(1.0f, min_normal_exponent)) {  // subnormal (or zero): e = 0, a = mantissa · 2^(emin − M)
    return static_cast<uint8_t>(std::ldexp(a, m - min_normal_exponent));
  }
  int exponent = 0;
  const float fraction = std::frexp(a, &exponent);  // a = fraction · 2^exponent, fraction in [0.5, 1)
  const int e = exponent - 1 + bias(f);
  const auto mantissa = static_cast<int>(std::ldexp(fraction, m + 1)) - (1 << m);
  return static_cast<uint8_t>(e << m | mantissa);
}

}  // namespace

const char* to_string(Fp8Scaling scaling) { return scaling == Fp8Scaling::per_tensor ? "per-tensor" : "none"; }

float fp8_max_finite(ElementFormat format) {
  require_fp8(format);
  return format == ElementFormat::e4m3 ? 448.0f : 57344.0f;
}

uint8_t fp8_from_float(float x, ElementFormat format) {
  const float max = fp8_max_finite(format);
  const auto sign = static_cast<uint8_t>(std::signbit(x) ? 0x80 : 0);
  if (std::isnan(x)) return sign | 0x7F;
  const float a = std::fabs(x);
  if (a >= max) return sign | encode_magnitude(max, format);
  // The spacing of FP8 values around a: 2^(emin − M) below the normal range, else 2^(floor(log2 a) − M).
  // a / step is exact (a power of two), and rounding it to an integer ties to even, as the conversion does.
  const int m = mantissa_bits(format);
  const int min_normal_exponent = 1 - bias(format);
  int exponent = 0;
  std::frexp(a, &exponent);
  const int step_exponent = std::max(exponent - 1, min_normal_exponent) - m;
  const float rounded = std::ldexp(std::nearbyint(std::ldexp(a, -step_exponent)), step_exponent);
  return sign | encode_magnitude(rounded, format);  // rounding never passes max: a < max and max is on the grid
}

float fp8_to_float(uint8_t x, ElementFormat format) {
  require_fp8(format);
  const int m = mantissa_bits(format);
  const int e = fp8_exponent(x, format);
  const int mantissa = x & ((1 << m) - 1);
  const float sign = (x & 0x80) != 0 ? -1.0f : 1.0f;
  const int top = (1 << exponent_bits(format)) - 1;
  if (format == ElementFormat::e4m3 && e == top && mantissa == (1 << m) - 1) return std::copysign(NAN, sign);
  if (format == ElementFormat::e5m2 && e == top) return mantissa == 0 ? sign * INFINITY : std::copysign(NAN, sign);
  if (e == 0) return sign * std::ldexp(static_cast<float>(mantissa), 1 - bias(format) - m);
  return sign * std::ldexp(static_cast<float>((1 << m) + mantissa), e - bias(format) - m);
}

float fp8_per_tensor_scale(std::span<const uint16_t> bf16, ElementFormat format) {
  const float max = fp8_max_finite(format);
  float amax = 0;
  for (const uint16_t x : bf16) {
    const float a = std::fabs(bf16_to_float(x));
    if (std::isfinite(a) && a > amax) amax = a;
  }
  return amax == 0 ? 1.0f : amax / max;
}

Fp8KvDump convert_to_fp8(const KvDump& dump, ElementFormat format, Fp8Scaling scaling) {
  require_fp8(format);
  validate_dump(dump);
  Fp8KvDump out;
  out.format = format;
  for (const KvLayer& layer : dump.layers) {
    Fp8KvLayer converted;
    for (const TensorKind kind : {TensorKind::key, TensorKind::value}) {
      const KvTensor& t = layer.of(kind);
      const float scale = scaling == Fp8Scaling::per_tensor ? fp8_per_tensor_scale(t.data, format) : 1.0f;
      Fp8KvTensor& c = converted.of(kind);
      c.tokens = t.tokens;
      c.kv_heads = t.kv_heads;
      c.head_dim = t.head_dim;
      c.data.resize(t.data.size());
      for (size_t i = 0; i < t.data.size(); ++i) c.data[i] = fp8_from_float(bf16_to_float(t.data[i]) / scale, format);
      (kind == TensorKind::key ? out.k_scales : out.v_scales).push_back(scale);
    }
    out.layers.push_back(std::move(converted));
  }
  for (const auto& entry : dump.metadata) {
    if (entry.first != "fp8_scaling") out.metadata.push_back(entry);
  }
  out.metadata.emplace_back("fp8_scaling", to_string(scaling));
  return out;
}

}  // namespace gaac
