// Bindings of the paged cache and decode attention (cache.cpp) and of its GPU mirror (cuda.cpp).
#pragma once

#include <nanobind/nanobind.h>

#include "gaac/error.hpp"

namespace gaac::python {

/// Raised (as gaac.CacheFullError) when an operation does not fit.
struct CacheFull : Error {
  using Error::Error;
};

/// Adds KvCache, CacheFullError (a subclass of `gaac_error`) and attend to `m`.
void bind_cache(nanobind::module_& m, nanobind::handle gaac_error);

/// Adds DeviceCache, DeviceKvCache and cuda_available to `m` (cuda.cpp; without CUDA, a DeviceCache that says so).
void bind_cuda(nanobind::module_& m);

}  // namespace gaac::python
