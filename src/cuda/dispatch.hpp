// The switches from runtime shapes to the template arguments of the kernels — a head width to C
// channels per tile and P tiles per head, a GQA group to the query heads an instance has room for — as
// FlashInfer's DISPATCH macros turn runtime values into compile-time ones. Host code: the launchers call
// them, the kernels are instantiated inside.
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

/// Calls `f.template operator()<H>()` with H the query heads per KV head a kernel instance has room for
/// (8: one n8 column block of the products; 16: two) for `group` of them; throws gaac::Error naming
/// `what` past 16.
template <class F>
decltype(auto) with_query_heads(int group, const char* what, F&& f) {
  if (group >= 1 && group <= 8) return f.template operator()<8>();
  if (group > 8 && group <= 16) return f.template operator()<16>();
  throw Error(std::string(what) + ": " + std::to_string(group) + " query heads per KV head; 1 to 16 are supported");
}

}  // namespace gaac::cuda::detail
