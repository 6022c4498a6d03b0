// The ggml tensor types gaac knows, and every fact about each, in one table (kGgmlTypes): the GGUF
// reader, the weight kernels and the engine all read it through ggml_type_info(); a type's name,
// block size and vec_dot_type are stated nowhere else.
#pragma once

#include <cstddef>
#include <cstdint>
#include <iterator>

#include "model/scalar_kernels.hpp"

namespace gaac::model {

/// ggml tensor types gaac knows (ids as in ggml's enum ggml_type).
enum class GgmlType : uint32_t {
  f32 = 0, f16 = 1, q4_0 = 2, q4_1 = 3, q5_0 = 6, q5_1 = 7, q8_0 = 8,
  q4_k = 12, q5_k = 13, q6_k = 14, bf16 = 30,
};

/// The format activations are converted to for products with weights of a given type (ggml's
/// vec_dot_type; quants_q8.hpp lays each out).
enum class ActivationType { f32, f16, bf16, q8_0, q8_1, q8_k };

/// What gaac knows about one ggml tensor type.
struct GgmlTypeInfo {
  /// The type (its ggml id); in kUnknownGgmlType, no type's id.
  GgmlType type;
  /// ggml's name of the type ("Q4_K"), as messages and `gaac inspect` print it; "unknown" in kUnknownGgmlType.
  const char* name;
  /// Elements per block (1 for the plain float types F32, F16, BF16); 0 in kUnknownGgmlType.
  int64_t block_elements;
  /// Bytes of one encoded block; 0 in kUnknownGgmlType.
  size_t block_bytes;
  /// ggml's vec_dot_type: what activation rows are converted to before products with weights of this type.
  ActivationType vec_dot_type;
  /// Scalar reference decoding of `blocks` consecutive blocks into `block_elements` floats each;
  /// null in kUnknownGgmlType.
  void (*dequantize_blocks)(const uint8_t* src, float* dst, int64_t blocks);
  /// ggml's generic product of `blocks` weight blocks with as many blocks of vec_dot_type; null for
  /// the plain float types (their products are float matmuls) and in kUnknownGgmlType.
  float (*dot_blocks)(const uint8_t* w, const uint8_t* xq, int64_t blocks);
};

/// Every type gaac reads, dequantizes and multiplies, in id order.
inline constexpr GgmlTypeInfo kGgmlTypes[] = {
    // type          name    elements bytes vec_dot_type          dequantize_blocks            dot_blocks
    {GgmlType::f32,  "F32",  1,       4,    ActivationType::f32,  scalar::dequantize_f32,  nullptr},
    {GgmlType::f16,  "F16",  1,       2,    ActivationType::f16,  scalar::dequantize_f16,  nullptr},
    {GgmlType::q4_0, "Q4_0", 32,      18,   ActivationType::q8_0, scalar::dequantize_q4_0, scalar::dot_q4_0},
    {GgmlType::q4_1, "Q4_1", 32,      20,   ActivationType::q8_1, scalar::dequantize_q4_1, scalar::dot_q4_1},
    {GgmlType::q5_0, "Q5_0", 32,      22,   ActivationType::q8_0, scalar::dequantize_q5_0, scalar::dot_q5_0},
    {GgmlType::q5_1, "Q5_1", 32,      24,   ActivationType::q8_1, scalar::dequantize_q5_1, scalar::dot_q5_1},
    {GgmlType::q8_0, "Q8_0", 32,      34,   ActivationType::q8_0, scalar::dequantize_q8_0, scalar::dot_q8_0},
    {GgmlType::q4_k, "Q4_K", 256,     144,  ActivationType::q8_k, scalar::dequantize_q4_k, scalar::dot_q4_k},
    {GgmlType::q5_k, "Q5_K", 256,     176,  ActivationType::q8_k, scalar::dequantize_q5_k, scalar::dot_q5_k},
    {GgmlType::q6_k, "Q6_K", 256,     210,  ActivationType::q8_k, scalar::dequantize_q6_k, scalar::dot_q6_k},
    {GgmlType::bf16, "BF16", 1,       2,    ActivationType::bf16, scalar::dequantize_bf16, nullptr},
};

static_assert(
    [] {
      for (size_t i = 1; i < std::size(kGgmlTypes); ++i) {
        if (kGgmlTypes[i - 1].type >= kGgmlTypes[i].type) return false;
      }
      return true;
    }(),
    "kGgmlTypes lists each type once, in id order");

/// What ggml_type_info() answers for an id that is not in kGgmlTypes.
inline constexpr GgmlTypeInfo kUnknownGgmlType = {
    static_cast<GgmlType>(UINT32_MAX), "unknown", 0, 0, ActivationType::f32, nullptr, nullptr};

/// The facts of `type`: its entry in kGgmlTypes, or kUnknownGgmlType for any other id.
constexpr const GgmlTypeInfo& ggml_type_info(GgmlType type) {
  for (const GgmlTypeInfo& info : kGgmlTypes) {
    if (info.type == type) return info;
  }
  return kUnknownGgmlType;
}

/// True when `type` is in kGgmlTypes: the GGUF reader accepts tensors of it and the engine
/// dequantizes and multiplies them.
constexpr bool supported_type(GgmlType type) { return ggml_type_info(type).block_elements != 0; }

}  // namespace gaac::model
