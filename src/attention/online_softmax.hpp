// The online softmax of the attention contract (include/gaac/attention.hpp), one query head over a
// run of positions in order: shared by the attention loop and the query-tile kernels, so that every
// path takes the same steps.
#pragma once

#include <cmath>

#include "attention/expf.hpp"

namespace gaac::attention {

/// The running state of the online softmax of one query head.
struct Partial {
  float max = -INFINITY;
  float sum = 0.0f;
};

/// Advances `part` over the scores score[t0 .. t1) and writes each position's factors: the
/// accumulator is first multiplied by rescale[t] (1 leaves it as it is), then value row t is added
/// with weight[t]. A score above the running maximum M becomes the maximum, rescales by e^(M − s)
/// and weighs its row by 1; any other weighs its row by e^(s − M). The exponentials' arguments are
/// found first against the running maximum and taken all at once (expf_in_place), then the factors
/// and the sum: S = fma(S, rescale, weight).
inline void online_softmax(const float* score, int t0, int t1, Partial& part, float* rescale, float* weight) {
  float m = part.max;
  for (int t = t0; t < t1; ++t) {
    if (score[t] > m) {
      rescale[t] = m - score[t];
      m = score[t];
    } else {
      rescale[t] = score[t] - m;
    }
  }
  expf_in_place(rescale + t0, static_cast<size_t>(t1 - t0));
  m = part.max;
  float sum = part.sum;  // a local: the stores below may not alias it
  for (int t = t0; t < t1; ++t) {
    float r = 1.0f, w = 1.0f;
    if (score[t] > m) {
      m = score[t];
      r = rescale[t];
    } else {
      w = rescale[t];
    }
    rescale[t] = r;
    weight[t] = w;
    sum = std::fma(sum, r, w);
  }
  part.max = m;
  part.sum = sum;
}

}  // namespace gaac::attention
