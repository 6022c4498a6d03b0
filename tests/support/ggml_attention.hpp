// The oracle of the attention tests: one query head against a dense BF16 cache, written as plain
// loops in llama.cpp's order of operations (the arithmetic docs/design.md describes and the engine's
// logits were validated with), and a float64 softmax for tolerance checks.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace gaac::test {

/// One query head over a dense cache: key/value of position p at keys/values + p·stride.
struct DenseQuery {
  const float* q = nullptr;  ///< head_dim floats (rounded to BF16 here)
  const uint16_t* keys = nullptr;
  const uint16_t* values = nullptr;
  size_t stride = 0;
  int head_dim = 0;
  int first = 0, last = 0;  ///< positions attended, inclusive
  float scale = 1.0f;
  float output_scale = 1.0f;  ///< factor of the output's 1/S (an FP8 cache's V scale)
};

/// softmax(scale · q·K)·V over first..last in llama.cpp's order: one position at a time; the output
/// acc · ((1/S) · output_scale).
std::vector<float> ggml_attention(const DenseQuery& query);
/// The same in float64 (q rounded to BF16), for tolerance checks.
std::vector<double> attention_in_double(const DenseQuery& query);

}  // namespace gaac::test
