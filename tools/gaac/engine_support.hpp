// What the commands that run the engine share: loading a model, the KV cache it runs on and the
// options that choose it.
#pragma once

#include <CLI/CLI.hpp>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>

#include "gaac/kv_cache.hpp"
#include "model/model.hpp"

namespace gaac::cli {

/// Tokens per forward pass of a long prompt: a progress bar follows the prefill pass by pass and
/// a pass's activations stay bounded. The logits and the cache do not depend on it, bit for bit.
inline constexpr size_t kPrefillChunk = 512;

/// Loads a model, saying so while it takes time.
std::unique_ptr<model::Model> load_model(const std::string& path);

/// A whole text file.
std::string read_text(const std::string& path);

/// Refuses text that a KV dump's metadata (safetensors JSON) cannot hold, before any work is done.
void check_metadata_text(const std::string& text, const std::string& what);

/// A ParallelFor over the engine's pool.
ParallelFor parallel_on(model::ThreadPool& pool);

/// What `--kv`, `--kv-budget`, `--calib`, `--attention` and `--attention-splits` say.
struct CacheOptions {
  std::string format = "gaac";
  uint64_t budget = 0;  ///< 0: enough for the tokens asked, whatever their values
  std::string calib;    ///< empty: the model's default calibration (learnt once, cached)
  std::string attention = "fused";
  int splits = 1;
};

/// Adds those options to a command.
void add_cache_options(CLI::App* cmd, CacheOptions& o);

/// A cache chosen by the options, for `sequences` sequences of up to `tokens` tokens of `model` (read
/// from `model_path`), with the calibration it was made with.
struct EngineCache {
  CalibrationTable calibration;  ///< empty for a bf16 cache
  std::string calibration_source;
  std::unique_ptr<KvCache> cache;
};

/// Builds the cache for sequences of `lengths[i]` tokens (prompt and answer); with `keep_all`, sliding
/// layers keep every position (to write the whole cache out). Without --kv-budget the budget holds them
/// whatever their values. A given budget too small for even one block, or for those sequences with
/// every block compressed (least_budget), is an error before any work, naming the sequence ("prompt 3")
/// that alone does not fit, or else the total needed and the budget given.
EngineCache make_engine_cache(const model::Model& model, const std::string& model_path, const CacheOptions& o,
                              std::span<const int> lengths, model::ThreadPool& pool, bool keep_all = false);

/// The attention settings the options ask for.
model::AttentionSettings attention_settings(const CacheOptions& o);

/// A BF16 cache for `model` that surely holds `tokens` tokens; with `keep_all`, sliding layers keep
/// every position (to write the whole cache out).
KvCache bf16_cache_for(const model::Model& model, int tokens, model::ThreadPool& pool, bool keep_all);

}  // namespace gaac::cli
