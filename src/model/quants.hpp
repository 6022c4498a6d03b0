// ggml weight formats: dequantization and products of quantized weight rows with float activations.
// Each operation has a scalar reference and an AVX2 fast path tested bit-for-bit against it where
// the arithmetic is the same, and to a stated tolerance where summation order differs.
#pragma once

#include <cstddef>
#include <cstdint>

#include "model/gguf.hpp"

namespace gaac::model {

/// True when gaac can dequantize and multiply tensors of this type
/// (F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q5_K, Q6_K).
bool supported_type(GgmlType type);

/// Converts `n` elements (a multiple of the type's block size) at `src` to floats at `dst`.
void dequantize_row(GgmlType type, const uint8_t* src, float* dst, int64_t n);

/// Y[t][r] = Σ_c W[r][c] · X[t][c] for rows r in [row_begin, row_end) and tokens t in [0, tokens):
/// W has rows of `cols` elements of `type` stored contiguously (`row_bytes` apart), X is `tokens` ×
/// `cols` floats (row stride `cols`), Y is `tokens` × `y_stride` floats. Single-threaded; callers
/// split rows across threads.
void matmul_rows(GgmlType type, const uint8_t* w, size_t row_bytes, int64_t cols, int64_t row_begin, int64_t row_end,
                 const float* x, int64_t tokens, float* y, int64_t y_stride);

namespace reference {
/// Scalar dequantization: the oracle for every fast path.
void dequantize_row(GgmlType type, const uint8_t* src, float* dst, int64_t n);
/// Scalar matmul_rows (dequantize each row, then plain dot products in index order).
void matmul_rows(GgmlType type, const uint8_t* w, size_t row_bytes, int64_t cols, int64_t row_begin, int64_t row_end,
                 const float* x, int64_t tokens, float* y, int64_t y_stride);
}  // namespace reference

}  // namespace gaac::model
