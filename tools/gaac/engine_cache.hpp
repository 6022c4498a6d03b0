// The KV cache a command runs the engine on.
#pragma once

#include "gaac/kv_cache.hpp"
#include "model/model.hpp"

namespace gaac::cli {

/// A ParallelFor over the engine's pool.
ParallelFor parallel_on(model::ThreadPool& pool);

/// A BF16 cache for `model` that surely holds `tokens` tokens; with `keep_all`, sliding layers keep
/// every position (to write the whole cache out).
KvCache bf16_cache_for(const model::Model& model, int tokens, model::ThreadPool& pool, bool keep_all);

}  // namespace gaac::cli
