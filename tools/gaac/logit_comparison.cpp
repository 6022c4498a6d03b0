#include "logit_comparison.hpp"

#include <cmath>
#include <string>

#include "gaac/error.hpp"

namespace gaac::cli {

void LogitComparison::add(std::span<const float> ours, std::span<const float> reference) {
  if (ours.size() != reference.size() || ours.empty()) {
    throw Error("logit comparison: " + std::to_string(ours.size()) + " logits against " +
                std::to_string(reference.size()) + " in the reference");
  }
  size_t our_arg = 0, ref_arg = 0;
  for (size_t v = 0; v < ours.size(); ++v) {
    const float o = ours[v], r = reference[v];
    if (std::isnan(r) || std::isnan(o)) {
      throw Error(std::string(std::isnan(r) ? "the reference's" : "the engine's") + " logit of token " +
                  std::to_string(v) + " at position " + std::to_string(positions) + " is NaN");
    }
    const double delta = o == r ? 0.0 : std::fabs(static_cast<double>(o) - static_cast<double>(r));
    if (delta > max_delta) max_delta = delta;
    sum_delta += delta;
    if (r > reference[ref_arg]) ref_arg = v;
    if (o > ours[our_arg]) our_arg = v;
  }
  values += ours.size();
  agreeing += our_arg == ref_arg;
  ++positions;
}

double LogitComparison::agreement_percent() const {
  return positions == 0 ? 0.0 : 100.0 * static_cast<double>(agreeing) / static_cast<double>(positions);
}

double LogitComparison::mean_delta() const { return values == 0 ? 0.0 : sum_delta / static_cast<double>(values); }

}  // namespace gaac::cli
