// The scalar reference kernels of each ggml block format, one function per type, which the type
// table (ggml_types.hpp) points to:
//   dequantize_<type>: `blocks` consecutive blocks at `src` to block_elements floats each at `dst`,
//     ggml's dequantize_row_* expression for expression, every operation rounded to float on its own
//     (quants_scalar.cpp, built with -ffp-contract=off);
//   dot_<type>: weight blocks times blocks of the type's vec_dot_type, as ggml's generic kernels
//     (ggml_vec_dot_*_generic) compute it (quants_q8.cpp; quants_q8.hpp describes the activation blocks).
// Blocks are little-endian and packed; "f16" is an IEEE binary16 scale. The kernels check nothing:
// callers (dequantize_row, matmul_rows, dot_row) check their arguments first.
#pragma once

#include <cstdint>

namespace gaac::model::scalar {

/// F32 blocks: one float each, as stored.
void dequantize_f32(const uint8_t* src, float* dst, int64_t blocks);
/// F16 blocks: one IEEE binary16 each, widened exactly.
void dequantize_f16(const uint8_t* src, float* dst, int64_t blocks);
/// BF16 blocks: one bfloat16 each, widened exactly.
void dequantize_bf16(const uint8_t* src, float* dst, int64_t blocks);
/// Q8_0 blocks (f16 d; i8 qs[32]), each to 32 floats q·d.
void dequantize_q8_0(const uint8_t* src, float* dst, int64_t blocks);
/// Q4_0 blocks (f16 d; u8 qs[16]: element j in the low nibble of qs[j], element j + 16 in its high
/// nibble), each to 32 floats (q − 8)·d.
void dequantize_q4_0(const uint8_t* src, float* dst, int64_t blocks);
/// Q4_1 blocks (f16 d, m; u8 qs[16], nibbles as Q4_0), each to 32 floats q·d + m.
void dequantize_q4_1(const uint8_t* src, float* dst, int64_t blocks);
/// Q5_0 blocks (f16 d; u8 qh[4]: bit j the fifth bit of element j; u8 qs[16], nibbles as Q4_0),
/// each to 32 floats (q − 16)·d.
void dequantize_q5_0(const uint8_t* src, float* dst, int64_t blocks);
/// Q5_1 blocks (f16 d, m; u8 qh[4]; u8 qs[16], bits as Q5_0), each to 32 floats q·d + m.
void dequantize_q5_1(const uint8_t* src, float* dst, int64_t blocks);
/// Q4_K blocks (f16 d, dmin; u8 scales[12]: eight 6-bit scales and mins, k_quant_scales.hpp;
/// u8 qs[128]: 32-byte chunk c holds sub-block 2c in its low nibbles, 2c + 1 in its high ones), each
/// to 256 floats (d·sc)·q − dmin·m, sc and m those of the element's 32-element sub-block.
void dequantize_q4_k(const uint8_t* src, float* dst, int64_t blocks);
/// Q5_K blocks (f16 d, dmin; u8 scales[12] as Q4_K; u8 qh[32]: bit s of qh[l] the fifth bit of
/// element 32s + l; u8 qs[128] as Q4_K), each to 256 floats (d·sc)·q − dmin·m.
void dequantize_q5_k(const uint8_t* src, float* dst, int64_t blocks);
/// Q6_K blocks (u8 ql[128] low nibbles; u8 qh[64] 2-bit high parts; i8 scales[16], one per 16
/// elements; f16 d), each to 256 floats (d·sc)·(q − 32).
void dequantize_q6_k(const uint8_t* src, float* dst, int64_t blocks);

/// Σ over `blocks` Q4_0 weight blocks at `w` and Q8_0 activation blocks at `xq` (ggml_vec_dot_q4_0_q8_0).
float dot_q4_0(const uint8_t* w, const uint8_t* xq, int64_t blocks);
/// Σ over `blocks` Q4_1 weight blocks and Q8_1 activation blocks (ggml_vec_dot_q4_1_q8_1).
float dot_q4_1(const uint8_t* w, const uint8_t* xq, int64_t blocks);
/// Σ over `blocks` Q5_0 weight blocks and Q8_0 activation blocks (ggml_vec_dot_q5_0_q8_0).
float dot_q5_0(const uint8_t* w, const uint8_t* xq, int64_t blocks);
/// Σ over `blocks` Q5_1 weight blocks and Q8_1 activation blocks (ggml_vec_dot_q5_1_q8_1).
float dot_q5_1(const uint8_t* w, const uint8_t* xq, int64_t blocks);
/// Σ over `blocks` Q8_0 weight blocks and Q8_0 activation blocks (ggml_vec_dot_q8_0_q8_0).
float dot_q8_0(const uint8_t* w, const uint8_t* xq, int64_t blocks);
/// Σ over `blocks` Q4_K weight blocks and Q8_K activation blocks (ggml_vec_dot_q4_K_q8_K).
float dot_q4_k(const uint8_t* w, const uint8_t* xq, int64_t blocks);
/// Σ over `blocks` Q5_K weight blocks and Q8_K activation blocks (ggml_vec_dot_q5_K_q8_K).
float dot_q5_k(const uint8_t* w, const uint8_t* xq, int64_t blocks);
/// Σ over `blocks` Q6_K weight blocks and Q8_K activation blocks (ggml_vec_dot_q6_K_q8_K).
float dot_q6_k(const uint8_t* w, const uint8_t* xq, int64_t blocks);

}  // namespace gaac::model::scalar
