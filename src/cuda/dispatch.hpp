// The one switch from a head width to the template arguments of the kernels (C channels per tile, P
// tiles per head), as FlashInfer's DISPATCH macros turn runtime values into compile-time ones. Host
// code: the launchers call it, the kernels are instantiated inside.
#pragma once

#include <string>

#include "gaac/error.hpp"

namespace gaac::cuda::detail {

/// Calls `f.template operator()<C, P>()` for heads of `head_dim` channels: 64 → <64, 1>, 128 → <128, 1>,
/// 256 → <128, 2> (two 128-channel half-heads); throws gaac::Error naming `what` for any other width.
template <class F>
decltype(auto) with_head_shape(int head_dim, const char* what, F&& f) {
  switch (head_dim) {
    case 64: return f.template operator()<64, 1>();
    case 128: return f.template operator()<128, 1>();
    case 256: return f.template operator()<128, 2>();
    default: break;
  }
  throw Error(std::string(what) + ": head width " + std::to_string(head_dim) + " is not 64, 128 or 256");
}

}  // namespace gaac::cuda::detail
