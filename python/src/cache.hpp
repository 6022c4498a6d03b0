// Bindings of the paged cache and decode attention (cache.cpp).
#pragma once

#include <nanobind/nanobind.h>

namespace gaac::python {

/// Adds KvCache, CacheFullError (a subclass of `gaac_error`) and attend to `m`.
void bind_cache(nanobind::module_& m, nanobind::handle gaac_error);

}  // namespace gaac::python
