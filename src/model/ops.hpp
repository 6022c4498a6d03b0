// The float arithmetic of the forward pass outside the matrix products: normalisation, rotary
// embedding and gated activations.
//
// Each function computes what its name says with the same operations, in the same order and with the
// same roundings as llama.cpp's CPU backend (ggml-cpu, x86 build with AVX2/FMA) computes it, so that the
// engine's logits can be compared with llama.cpp's bit for bit rather than within a tolerance (an 8-bit
// activation quantizer downstream turns a one-ulp difference here into a different quant, and a
// different quant into a visibly different logit). The choices this entails, op by op:
//   rms_norm   Σ of float squares accumulated in double; the mean rounded to float; scale = 1/sqrtf(mean+eps);
//              y = (x·scale)·w.
//   rope       angles advance by repeated multiplication (θ·base^(−2/d)); each pair rotated with one fused
//              multiply-add per output: x0·c − x1·s and x0·s + x1·c.
//   swiglu     silu(g)·u with silu(x) = x / (1 + e^−x) and e^x by the polynomial ggml vectorises
//              (Arm optimized-routines' expf, ≤ 1 ulp from the true value in the range that matters).
//   geglu      gelu-tanh looked up through fp16: gelu(x) = fp16(gelu_f32(fp16(x))) for −10 < x < 10,
//              0 below, x above; times u. gelu_f32 fuses 1 + c·x·x into one multiply-add, as ggml's
//              compiler does (one table entry in 65,536 rounds differently otherwise).
//   attention  lives in the library (gaac::attend, include/gaac/attention.hpp), over the paged cache,
//              with ggml's flash-attention arithmetic.
// Validated end to end: the engine's logits equal llama.cpp's bit for bit on 512 positions of both
// models (docs/results.md).
// Every function has a scalar version and an AVX2+FMA version that returns the same bits;
// the fast one is used when the CPU has it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace gaac::model::ops {

/// y = x / sqrt(mean(x²) + eps) · w over `n` elements. `y` may alias `x`.
void rms_norm(const float* x, const float* w, int n, float eps, float* y);

/// Rotates one head of `d` elements in place for position `pos` with rotary base `base`: pairs
/// (2i, 2i+1), or (i, i + d/2) when `neox`. The same as rope_angles then rope_rotate.
void rope(float* x, int d, int pos, float base, bool neox);

/// The angles rope() turns the pairs of a `d`-element head by at position `pos`: cs[2i] = cos θ_i and
/// cs[2i + 1] = sin θ_i for i < d/2. They depend on the position only, so a pass computes them once
/// per token and rotates every head with them.
void rope_angles(int d, int pos, float base, float* cs);
/// Rotates one head of `d` elements in place by the angles of rope_angles.
void rope_rotate(float* x, int d, const float* cs, bool neox);

/// e^x by ggml's vectorised polynomial (exposed for tests; the activations use it).
float exp_polynomial(float x);

/// gate[i] = silu(gate[i]) · up[i] for i < n.
void swiglu(float* gate, const float* up, size_t n);

/// gate[i] = gelu_tanh(gate[i]) · up[i] for i < n, through ggml's fp16 GELU table.
void geglu(float* gate, const float* up, size_t n);

/// The scalar versions, always available: same results bit for bit (tests compare them).
namespace scalar {
void swiglu(float* gate, const float* up, size_t n);
}  // namespace scalar

}  // namespace gaac::model::ops
