// Bindings of the paged cache and CPU attention (cache.cpp), the batch cache on either device
// (batch_cache.cpp) and the GPU mirror of a cache (cuda.cpp).
#pragma once

#include <nanobind/nanobind.h>

#include <optional>
#include <string>
#include <vector>

#include "gaac/attention.hpp"
#include "gaac/kv_cache.hpp"

namespace gaac::python {

/// The cache format named "gaac" or "bf16" (gaac::Error for another name).
CacheFormat format_of(const std::string& name);
/// The CPU attention path named "fused" or "reference".
AttentionPath path_of(const std::string& name);
/// A cache geometry; `windows` gives each layer's sliding window (none: full attention everywhere).
CacheGeometry geometry_of(int layers, int kv_heads, int head_dim, const std::optional<std::vector<int>>& windows);

/// A cache's accounting as the dict KvCache.usage() and BatchKvCache.usage() return.
nanobind::dict usage_dict(const CacheUsage& usage);

/// Adds KvCache and attend to `m`.
void bind_cache(nanobind::module_& m);

/// Adds BatchKvCache (on the CPU, or on a GPU where gaac was built with CUDA) to `m`.
void bind_batch_cache(nanobind::module_& m);

/// Adds KvCacheMirror and cuda_available to `m` (cuda.cpp; without CUDA, a KvCacheMirror that says so).
void bind_cuda(nanobind::module_& m);

/// gaac.ChunkCodec and gaac.calibrate_chunk (python/src/chunk.cpp).
void bind_chunk(nanobind::module_& m);

}  // namespace gaac::python
