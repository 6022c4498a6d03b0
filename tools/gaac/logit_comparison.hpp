// What `gaac validate` measures: how the engine's logits compare with a reference's, position by
// position.
#pragma once

#include <cstddef>
#include <span>

namespace gaac::cli {

/// Running totals over the positions compared so far.
struct LogitComparison {
  size_t positions = 0;
  size_t agreeing = 0;  ///< positions whose top-1 token (arg-max, lowest id on ties) is the same
  size_t values = 0;
  double max_delta = 0;  ///< largest |ours - reference| over every logit
  double sum_delta = 0;

  /// Compares one position's logits. Throws gaac::Error naming the position and token when either
  /// side holds a NaN, which has no order and no distance: it is never an agreement of any size.
  /// Equal values (infinities included) differ by 0.
  void add(std::span<const float> ours, std::span<const float> reference);

  /// Percentage of positions whose top-1 tokens agree (0 when there are none).
  double agreement_percent() const;
  /// Mean |ours - reference| over every logit.
  double mean_delta() const;
};

}  // namespace gaac::cli
