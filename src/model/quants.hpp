// ggml weight formats: dequantization and products of quantized weight rows with float activations.
// Each operation has a scalar reference and an AVX2 fast path tested bit-for-bit against it where
// the arithmetic is the same, and to a stated tolerance where summation order differs.
//
// Dequantization follows ggml's dequantize_row_* expression for expression, every operation rounded
// to float on its own (no fused multiply-add; the sources are built with -ffp-contract=off); the
// block formats and their formulas are listed with their reference kernels (scalar_kernels.hpp).
// The types supported are those of the type table (ggml_types.hpp: supported_type).
#pragma once

#include <cstddef>
#include <cstdint>

#include "model/ggml_types.hpp"

namespace gaac::model {

/// Converts `n` elements (a multiple of the type's block size) at `src` to floats at `dst`.
/// Throws gaac::Error for an unsupported type or a bad count.
void dequantize_row(GgmlType type, const uint8_t* src, float* dst, int64_t n);

/// Y[t][r] = Σ_c W[r][c] · X[t][c] for rows r in [row_begin, row_end) and tokens t in [0, tokens):
/// W has rows of `cols` elements of `type` stored contiguously (`row_bytes` apart; row r starts at
/// `w + r·row_bytes`), X is `tokens` × `cols` floats (row stride `cols`), Y is `tokens` × `y_stride`
/// floats (Y[t][r] at `y[t·y_stride + r]`, so y_stride ≥ row_end). Single-threaded; callers split
/// rows across threads. Throws gaac::Error for an unsupported type, `cols` not a multiple of the block
/// size, `row_bytes` smaller than a row's encoded size, a negative or reversed row range, negative
/// `tokens`, y_stride < row_end, or a null pointer where data is needed.
void matmul_rows(GgmlType type, const uint8_t* w, size_t row_bytes, int64_t cols, int64_t row_begin, int64_t row_end,
                 const float* x, int64_t tokens, float* y, int64_t y_stride);

/// Name of the implementation dequantize_row and matmul_rows use on this machine: "avx2" (AVX2,
/// FMA and F16C present at run time and compiled in) or "reference".
const char* active_backend();

/// IEEE binary16 bit pattern → float, exact (subnormals, infinities; NaNs keep sign and payload and
/// come out quiet, as F16C's vcvtph2ps gives them).
float fp16_to_float(uint16_t bits);

namespace scalar {
/// Scalar dequantization: the oracle for every fast path. Checks its arguments like dequantize_row.
void dequantize_row(GgmlType type, const uint8_t* src, float* dst, int64_t n);
/// Scalar matmul_rows (dequantize each row, then plain dot products in index order: float
/// accumulator, each product rounded to float before it is added). Checks its arguments.
void matmul_rows(GgmlType type, const uint8_t* w, size_t row_bytes, int64_t cols, int64_t row_begin, int64_t row_end,
                 const float* x, int64_t tokens, float* y, int64_t y_stride);
}  // namespace scalar

namespace avx2 {
/// True when the AVX2 path is compiled in and the CPU has AVX2, FMA and F16C.
bool available();
/// The AVX2 paths (throw gaac::Error when !available()). Dequantization is bit-identical to the
/// reference; matmul_rows sums in another order (8 lanes, fused multiply-adds, column chunks), so
/// each result is within 2·γ(cols + 1)·Σ_c |W[r][c]·X[t][c]| of the reference's, where
/// γ(n) = n·2⁻²⁴/(1 − n·2⁻²⁴): both are within γ of the exact sum, whatever the order of additions.
void dequantize_row(GgmlType type, const uint8_t* src, float* dst, int64_t n);
void matmul_rows(GgmlType type, const uint8_t* w, size_t row_bytes, int64_t cols, int64_t row_begin, int64_t row_end,
                 const float* x, int64_t tokens, float* y, int64_t y_stride);
}  // namespace avx2

namespace detail {
/// Argument checks shared by every implementation; throw gaac::Error naming the problem.
void check_dequantize(GgmlType type, const uint8_t* src, const float* dst, int64_t n);
void check_matmul(GgmlType type, const uint8_t* w, size_t row_bytes, int64_t cols, int64_t row_begin, int64_t row_end,
                  const float* x, int64_t tokens, const float* y, int64_t y_stride);
}  // namespace detail

}  // namespace gaac::model
