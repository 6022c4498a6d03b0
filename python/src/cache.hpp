// Bindings of the paged cache and decode attention (cache.cpp) and of its GPU mirror (cuda.cpp).
#pragma once

#include <nanobind/nanobind.h>

namespace gaac::python {

/// Adds KvCache, CacheFullError (a subclass of `gaac_error`) and attend to `m`.
void bind_cache(nanobind::module_& m, nanobind::handle gaac_error);

/// Adds DeviceCache and cuda_available to `m` (cuda.cpp; without CUDA, a DeviceCache that says so).
void bind_cuda(nanobind::module_& m);

}  // namespace gaac::python
