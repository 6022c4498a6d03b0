#include "engine_cache.hpp"

namespace gaac::cli {

ParallelFor parallel_on(model::ThreadPool& pool) {
  return [&pool](size_t n, const std::function<void(size_t, size_t)>& body) {
    pool.parallel_for(static_cast<int64_t>(n), 1, [&](int64_t b, int64_t e) { body(static_cast<size_t>(b), static_cast<size_t>(e)); });
  };
}

KvCache bf16_cache_for(const model::Model& model, int tokens, model::ThreadPool& pool, bool keep_all) {
  CacheConfig config;
  config.geometry = model::cache_geometry(model.config(), !keep_all);
  config.format = CacheFormat::bf16;
  config.budget_bytes = worst_case_budget(config.geometry, CacheFormat::bf16, nullptr, tokens);
  config.parallel = parallel_on(pool);
  return KvCache(std::move(config));
}

}  // namespace gaac::cli
