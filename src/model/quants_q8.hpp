// Products of quantized weight rows with quantized activations, computed as llama.cpp's CPU backend
// computes them.
//
// ggml does not multiply a quantized weight by float activations: it first converts the activation
// row to the weight type's "vec_dot_type" and then takes integer block dot products:
//
//   weight type               activations        per-block arithmetic (w: weight block, x: activation block)
//   Q4_0, Q5_0, Q8_0          Q8_0 (32/block)    d_w·d_x·Σ q_w·q_x          (q_w signed: q−8, q−16, q)
//   Q4_1, Q5_1                Q8_1 (32/block)    d_w·d_x·Σ q_w·q_x + m_w·s_x (q_w unsigned)
//   Q4_K, Q5_K, Q6_K          Q8_K (256/block)   d_w·d_x·Σ_j sc_j·Σ q_w·q_x − dmin_w·d_x·Σ_j m_j·bsum_j
//   F16 / BF16 / F32          F16 / BF16 / F32   the activations rounded to the weight's float type
//
// Activation block layouts (little-endian, packed, as ggml's block_q8_0 / block_q8_1 / block_q8_K):
//   Q8_0: fp16 d; int8 qs[32]                          34 bytes, x ≈ d·qs
//   Q8_1: fp16 d; fp16 s; int8 qs[32]                  36 bytes, s = fp16(d·Σ qs) (d before its fp16 rounding)
//   Q8_K: float d; int8 qs[256]; int16 bsums[16]       292 bytes, bsums[j] = Σ qs[16j .. 16j+15]
//
// The quantizers follow ggml's reference quantizers (quantize_row_q8_0_ref, quantize_row_q8_1_ref,
// quantize_row_q8_K_ref in ggml-quants.c) operation for operation, rounding included:
//   Q8_0/Q8_1: amax = max|x|, d = amax/127, id = d ≠ 0 ? 1/d : 0, q = roundf(x·id) (ties away from 0)
//   Q8_K: max = the first element of largest magnitude (signed), iscale = −127/max,
//         q = min(127, round_half_even(iscale·x)), d = 1/iscale; an all-zero block gives d = 0.
// Q8Rounding::x86 selects instead the Q8_0/Q8_1 quantizers of ggml-cpu's x86 build, which llama.cpp
// runs on x86 CPUs (the engine uses those). fp16 stores round to nearest even; F16/BF16 activations
// round to nearest even (ggml's GGML_FP32_TO_FP16 / GGML_FP32_TO_BF16). The one deliberate
// departure: where ggml's behaviour is undefined (non-finite inputs, or a block whose largest
// magnitude is so small that 1/d overflows), quants saturate to [−127, 127] and NaN quantizes to 0.
//
// The scalar reference computes each row·token dot exactly as ggml's generic C kernels do
// (ggml_vec_dot_*_generic in ggml-cpu/quants.c): integer block sums, then the same float
// expressions in the same order, each operation rounded on its own (built with -ffp-contract=off;
// compiled with contraction, as ggml itself is, it reproduces those kernels bit for bit).
// The AVX2 path quantizes bit-identically and computes the same integer block sums; its float
// combination follows ggml's x86 AVX2 kernels (ggml_vec_dot_*_q8_* in ggml-cpu/arch/x86/quants.c,
// as built in llama-cpp-python 0.3.36): same lanes, same fused multiply-adds, same order, so its
// results equal those kernels' bit for bit. It differs from the reference only in float summation
// order, within the bound stated at avx2::matmul_rows_quantized.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "model/ggml_types.hpp"

namespace gaac::model {

/// Which of ggml's two Q8_0/Q8_1 activation quantizers to follow (Q8_K has one):
///   reference: quantize_row_q8_0_ref / _q8_1_ref: id = 1/(amax/127), q = roundf(x·id) (ties away from 0).
///   x86: ggml-cpu's x86 quantize_row_q8_0 / _q8_1 (AVX/AVX2 builds; what llama.cpp's CPU backend runs
///        on such machines): id = 127/amax, q rounded half to even. d = amax/127 in both.
/// The two differ in about one quant per 500,000.
enum class Q8Rounding { reference, x86 };

/// ggml's vec_dot_type of a weight type (the type table's). Throws gaac::Error for a type
/// supported_type() rejects.
ActivationType activation_type(GgmlType weight_type);
/// Elements per block of an activation type (1 for the float types). The formats that weights have
/// too (F32, F16, BF16, Q8_0) read the type table; Q8_1 and Q8_K are activation formats only.
constexpr int64_t activation_block_elements(ActivationType type) {
  switch (type) {
    case ActivationType::f32: return ggml_type_info(GgmlType::f32).block_elements;
    case ActivationType::f16: return ggml_type_info(GgmlType::f16).block_elements;
    case ActivationType::bf16: return ggml_type_info(GgmlType::bf16).block_elements;
    case ActivationType::q8_0: return ggml_type_info(GgmlType::q8_0).block_elements;
    case ActivationType::q8_1: return 32;
    case ActivationType::q8_k: return 256;
  }
  return 0;
}
/// Bytes per block of an activation type (as activation_block_elements, the shared formats from the table).
constexpr size_t activation_block_bytes(ActivationType type) {
  switch (type) {
    case ActivationType::f32: return ggml_type_info(GgmlType::f32).block_bytes;
    case ActivationType::f16: return ggml_type_info(GgmlType::f16).block_bytes;
    case ActivationType::bf16: return ggml_type_info(GgmlType::bf16).block_bytes;
    case ActivationType::q8_0: return ggml_type_info(GgmlType::q8_0).block_bytes;
    case ActivationType::q8_1: return 36;
    case ActivationType::q8_k: return 292;
  }
  return 0;
}

/// fp32 → IEEE binary16 bit pattern, round to nearest even (overflow → ±infinity, subnormals
/// exact), NaN → sign | 0x7E00 (as ggml's software conversion). Matches F16C's vcvtps2ph on every
/// non-NaN input.
uint16_t float_to_fp16(float value);

/// Quantizes one activation row of `cols` elements (a multiple of the weight type's block size) to
/// the vec_dot_type of `weight_type`, in ggml's block layout (for the float types: the raw fp32,
/// fp16 or bf16 values). `out` is resized to the encoded size. Uses the AVX2 path when available
/// (bit-identical to scalar::quantize_activations for finite inputs). Throws gaac::Error for an unsupported type,
/// a bad column count or a null `x` with cols > 0.
void quantize_activations(GgmlType weight_type, const float* x, int64_t cols, std::vector<uint8_t>& out,
                          Q8Rounding rounding = Q8Rounding::reference);

/// The activation rows of several tokens, converted once for one weight type and then shared,
/// read-only, by every thread that multiplies rows of that weight. Fill it with
/// quantize_activations (all tokens), or with prepare_activations then quantize_activation_rows over
/// disjoint token ranges (which may run on several threads at once).
struct QuantizedActivations {
  GgmlType weight_type = GgmlType::f32;
  ActivationType type = ActivationType::f32;
  Q8Rounding rounding = Q8Rounding::reference;
  int64_t cols = 0;
  int64_t tokens = 0;
  /// Bytes of one token's row in `blocks` (Q8 types).
  size_t row_bytes = 0;
  /// Q8 types: tokens × row_bytes bytes of ggml blocks, token t at t·row_bytes.
  std::vector<uint8_t> blocks;
  /// Float types: tokens × cols floats, the activations after rounding to F16/BF16 (widened back).
  std::vector<float> values;
  /// Q8_0/Q8_1: each block's d widened to float, block-major (block b of token t at
  /// scales[b·tokens + t], plus 4 floats of padding); Q8_1 also s, in `sums`, laid out alike. A
  /// cache of values in `blocks`, for the AVX2 kernels (which read 4 tokens of a block at once).
  std::vector<float> scales;
  std::vector<float> sums;
  /// Q8_0/Q8_1: the quants again, contiguous (token t's row of `cols` at quants[quants_offset +
  /// t·cols]), the offset chosen so that they start 32-byte aligned. Also a cache for the AVX2 kernels.
  std::vector<int8_t> quants;
  size_t quants_offset = 0;
};

/// Sizes `out` for `tokens` rows of `cols` activations for weights of `weight_type` (no conversion).
/// Throws like quantize_activations; negative `tokens` is an error.
void prepare_activations(GgmlType weight_type, int64_t cols, int64_t tokens, QuantizedActivations& out,
                         Q8Rounding rounding = Q8Rounding::reference);
/// Converts rows [t_begin, t_end) of X (`out.tokens` × `out.cols` floats, row stride `out.cols`)
/// into a prepared `out`. Calls on disjoint ranges may run concurrently. Throws gaac::Error for a
/// bad range or a null `x`.
void quantize_activation_rows(const float* x, int64_t t_begin, int64_t t_end, QuantizedActivations& out);
/// prepare_activations + quantize_activation_rows over all tokens.
void quantize_activations(GgmlType weight_type, const float* x, int64_t cols, int64_t tokens,
                          QuantizedActivations& out, Q8Rounding rounding = Q8Rounding::reference);

/// Y[t·y_stride + r] = row r of W · token t of X, for r in [row_begin, row_end) and t < tokens, as
/// llama.cpp computes it: the activations converted to the weight's vec_dot_type, then ggml's
/// per-block arithmetic. Same arguments, checks and layout as matmul_rows (quants.hpp); this overload
/// converts X itself (once per call, before the row loop), so callers that split rows across threads
/// should convert once and use the overload below. Single-threaded.
void matmul_rows_quantized(GgmlType type, const uint8_t* w, size_t row_bytes, int64_t cols, int64_t row_begin,
                           int64_t row_end, const float* x, int64_t tokens, float* y, int64_t y_stride);
/// The same with X already converted (`x.weight_type` must be `type` and `x.cols` must be `cols`;
/// the token count is `x.tokens`). Does not modify `x`, so threads can share it.
void matmul_rows_quantized(GgmlType type, const uint8_t* w, size_t row_bytes, int64_t cols, int64_t row_begin,
                           int64_t row_end, const QuantizedActivations& x, float* y, int64_t y_stride);
/// One tile of that product: rows [row_begin, row_end) by tokens [token_begin, token_end) of `x`
/// (0 ≤ token_begin ≤ token_end ≤ x.tokens), each value the same bits as matmul_rows_quantized
/// gives it; nothing else of Y is written. A product with many tokens is cut into tiles that
/// threads take as they become free. Throws like matmul_rows_quantized, and on a bad token range.
void matmul_tile_quantized(GgmlType type, const uint8_t* w, size_t row_bytes, int64_t cols, int64_t row_begin,
                           int64_t row_end, const QuantizedActivations& x, int64_t token_begin, int64_t token_end,
                           float* y, int64_t y_stride);

namespace scalar {
/// Scalar quantizers (the oracle for the AVX2 ones).
void quantize_activations(GgmlType weight_type, const float* x, int64_t cols, std::vector<uint8_t>& out,
                          Q8Rounding rounding = Q8Rounding::reference);
void quantize_activation_rows(const float* x, int64_t t_begin, int64_t t_end, QuantizedActivations& out);
/// ggml's generic dot of one encoded weight row with one encoded activation row of `cols`
/// elements (`xq` in the layout quantize_activations writes). Quantized weight types only.
float dot_row(GgmlType type, const uint8_t* w, const uint8_t* xq, int64_t cols);
/// Scalar matmul_rows_quantized: dot_row for each row and token (float types: the activations
/// rounded, then scalar::matmul_rows).
void matmul_rows_quantized(GgmlType type, const uint8_t* w, size_t row_bytes, int64_t cols, int64_t row_begin,
                           int64_t row_end, const QuantizedActivations& x, float* y, int64_t y_stride);
/// Scalar matmul_tile_quantized.
void matmul_tile_quantized(GgmlType type, const uint8_t* w, size_t row_bytes, int64_t cols, int64_t row_begin,
                           int64_t row_end, const QuantizedActivations& x, int64_t token_begin, int64_t token_end,
                           float* y, int64_t y_stride);
}  // namespace scalar

namespace avx2 {
/// AVX2 quantizers, bit-identical to the reference for finite inputs (throw gaac::Error when
/// !available()).
void quantize_activations(GgmlType weight_type, const float* x, int64_t cols, std::vector<uint8_t>& out,
                          Q8Rounding rounding = Q8Rounding::reference);
void quantize_activation_rows(const float* x, int64_t t_begin, int64_t t_end, QuantizedActivations& out);
/// AVX2 products. The integer block sums are exact, as in the reference; the float part adds the
/// same per-block terms in another grouping (8 lanes, FMAs). The reference lies within
/// γ(blocks + 16)·M and the AVX2 result within γ(2·blocks + 16)·M of the exact value of ggml's
/// formula over the quantized data, where γ(n) = n·2⁻²⁴/(1 − n·2⁻²⁴) and M is the formula evaluated
/// on magnitudes: Σ_blocks |d_w·d_x|·Σ_i |sc_i·q_w,i·q_x,i| (+ |m_w·s_x|, or |dmin_w·d_x|·Σ_j m_j·|bsum_j|,
/// where the type has a min term). Float types: avx2::matmul_rows on the rounded X.
void matmul_rows_quantized(GgmlType type, const uint8_t* w, size_t row_bytes, int64_t cols, int64_t row_begin,
                           int64_t row_end, const QuantizedActivations& x, float* y, int64_t y_stride);
/// AVX2 matmul_tile_quantized.
void matmul_tile_quantized(GgmlType type, const uint8_t* w, size_t row_bytes, int64_t cols, int64_t row_begin,
                           int64_t row_end, const QuantizedActivations& x, int64_t token_begin, int64_t token_end,
                           float* y, int64_t y_stride);
}  // namespace avx2

namespace detail {
/// Argument checks shared by the implementations (throw gaac::Error naming the problem).
void check_quantized_matmul(GgmlType type, const uint8_t* w, size_t row_bytes, int64_t cols, int64_t row_begin,
                            int64_t row_end, const QuantizedActivations& x, const float* y, int64_t y_stride);
/// check_quantized_matmul, and that [token_begin, token_end) lies within x's tokens.
void check_quantized_tile(GgmlType type, const uint8_t* w, size_t row_bytes, int64_t cols, int64_t row_begin,
                          int64_t row_end, const QuantizedActivations& x, int64_t token_begin, int64_t token_end,
                          const float* y, int64_t y_stride);
void check_activation_rows(const float* x, int64_t t_begin, int64_t t_end, const QuantizedActivations& out);
}  // namespace detail

}  // namespace gaac::model
