// attend() with a chosen set of kernels (tests run every set against every other).
#pragma once

#include "attention/tile_kernels.hpp"
#include "gaac/attention.hpp"

namespace gaac::attention {

/// gaac::attend with `kernels` instead of the best available.
void attend_with(const Kernels& kernels, const KvCache& cache, int layer, std::span<const AttentionQuery> queries,
                 const AttentionOptions& options);

}  // namespace gaac::attention
