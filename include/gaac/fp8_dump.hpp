// An in-memory FP8 KV dump (E4M3 or E5M2 bytes shaped like an engine's cache, with the scale of each
// tensor), the FP8 element conversions, and the conversion of a BF16 dump to FP8 as serving engines
// write their FP8 caches (docs/format.md, section 14.8).
#pragma once

#include "gaac/export.h"

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "gaac/fp8_format.hpp"
#include "gaac/kv_dump.hpp"

namespace gaac {

/// One FP8 tensor: `[tokens, kv_heads, head_dim]` bytes.
using Fp8KvTensor = BasicKvTensor<uint8_t>;
/// One layer's FP8 K and V.
using Fp8KvLayer = BasicKvLayer<uint8_t>;

/// A whole FP8 KV dump (the `k.<layer>` / `v.<layer>` F8_E4M3 or F8_E5M2 tensors of a safetensors file,
/// and optionally `k_scale` / `v_scale`).
struct GAAC_API Fp8KvDump {
  /// E4M3 or E5M2, shared by every tensor.
  ElementFormat format = ElementFormat::e4m3;
  std::vector<Fp8KvLayer> layers;
  /// Per layer, the scale of K and of V (real value = FP8 value × scale): both empty when the dump records
  /// none, else one finite positive float per layer each.
  std::vector<float> k_scales;
  std::vector<float> v_scales;
  /// Free-form metadata carried through (the safetensors `__metadata__` map).
  std::vector<std::pair<std::string, std::string>> metadata;

  /// KV heads shared by every tensor (0 for an empty dump).
  int kv_heads() const { return layers.empty() ? 0 : layers.front().k.kv_heads; }
  /// Head width shared by every tensor (0 for an empty dump).
  int head_dim() const { return layers.empty() ? 0 : layers.front().k.head_dim; }
  /// Total FP8 bytes of all K and V tensors.
  size_t fp8_bytes() const;
};

/// Throws gaac::Error unless the format is FP8, the tensors are shaped as validate_dump(KvDump) requires
/// of a BF16 dump, and the scales are absent or one finite positive value per layer for K and for V.
GAAC_API void validate_dump(const Fp8KvDump& dump);

/// How convert_to_fp8 scales each tensor.
enum class Fp8Scaling : uint8_t {
  per_tensor = 0,  ///< scale = amax / largest finite FP8 value, per K and per V tensor of each layer
  none = 1,        ///< scale 1: the values as they are, saturated to the format's range
};

/// "per-tensor" or "none".
GAAC_API const char* to_string(Fp8Scaling scaling);

/// The largest finite magnitude of an FP8 format: 448 (E4M3) or 57344 (E5M2).
GAAC_API float fp8_max_finite(ElementFormat format);

/// `x` converted to FP8 as CUDA's `__nv_cvt_float_to_fp8(x, __NV_SATFINITE, ...)` does (what vLLM's FP8
/// cache write calls): rounded to the nearest FP8 value, ties to even; magnitudes beyond the largest
/// finite value, infinities included, saturated to it; NaN to the NaN 0x7F with x's sign bit.
GAAC_API uint8_t fp8_from_float(float x, ElementFormat format);

/// The exact value of an FP8 element as a float (NaN for NaNs, ±Inf for E5M2's infinities).
GAAC_API float fp8_to_float(uint8_t x, ElementFormat format);

/// The per-tensor scale of BF16 values: `amax / fp8_max_finite(format)` in float, amax the largest finite
/// magnitude among them; 1 when that is 0 (or there is no finite value).
GAAC_API float fp8_per_tensor_scale(std::span<const uint16_t> bf16, ElementFormat format);

/// A BF16 dump converted to FP8: every element `fp8_from_float(float(x) / scale)` with the scale of its
/// tensor (`scaling`), the scales recorded in the result, the metadata carried over with
/// `fp8_scaling` set. Throws gaac::Error for a bad dump or a non-FP8 format.
GAAC_API Fp8KvDump convert_to_fp8(const KvDump& dump, ElementFormat format, Fp8Scaling scaling);

}  // namespace gaac
