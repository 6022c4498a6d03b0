// Turns a run-time tile shape into compile-time template arguments: the one switch over
// kind × width, so no kernel writes its own.
#pragma once

#include "gaac/format.hpp"

namespace gaac::detail {

/// Calls `f.template operator()<Kind, Channels>()` for the shape's kind and width (64 or 128; the
/// caller has validated it) and returns what it returns.
template <class F>
decltype(auto) dispatch_shape(TileShape shape, F&& f) {
  if (shape.kind == TensorKind::key) {
    if (shape.channels == 64) return f.template operator()<TensorKind::key, 64>();
    return f.template operator()<TensorKind::key, 128>();
  }
  if (shape.channels == 64) return f.template operator()<TensorKind::value, 64>();
  return f.template operator()<TensorKind::value, 128>();
}

}  // namespace gaac::detail
