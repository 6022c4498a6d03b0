#include "engine_support.hpp"

#include <fmt/core.h>

#include <algorithm>

#include "activity.hpp"
#include "common.hpp"
#include "common/utf8.hpp"
#include "io/files.hpp"
#include "gaac/error.hpp"
#include "model/default_calibration.hpp"
#include "numbers.hpp"

namespace gaac::cli {

std::unique_ptr<model::Model> load_model(const std::string& path) {
  const Activity activity("loading the model " + path);
  return model::Model::load(path);
}

std::string read_text(const std::string& path) {
  const std::vector<uint8_t> bytes = io::read_file(path);
  return {bytes.begin(), bytes.end()};
}

void check_metadata_text(const std::string& text, const std::string& what) {
  const size_t bad = first_invalid_utf8(text);
  if (bad != std::string::npos) {
    throw Error(fmt::format("{} is not valid UTF-8 (byte {}), so the KV dump's metadata cannot record it", what, bad));
  }
}

ParallelFor parallel_on(model::ThreadPool& pool) {
  return [&pool](size_t n, const std::function<void(size_t, size_t)>& body) {
    pool.parallel_for(static_cast<int64_t>(n), 1, [&](int64_t b, int64_t e) { body(static_cast<size_t>(b), static_cast<size_t>(e)); });
  };
}

void add_cache_options(CLI::App* cmd, CacheOptions& o) {
  cmd->add_option("--kv", o.format, "KV cache: gaac (compressed) or bf16 (the same paged structure, uncompressed)")
      ->capture_default_str()
      ->check(CLI::IsMember({"gaac", "bf16"}));
  cmd->add_option("--kv-budget", o.budget,
                  "KV cache memory in bytes (suffixes K, M, G, T: powers of 1024; default: enough for the tokens asked)")
      ->transform(bytes_in(1, uint64_t{1} << 50));
  cmd->add_option("--calib", o.calib,
                  "Calibration table for --kv gaac (default: learnt once for the model on a built-in text and cached)")
      ->check(CLI::ExistingFile);
  cmd->add_option("--attention", o.attention,
                  "How compressed tiles are read: fused (rebuilt in registers) or reference (decoded first); same results")
      ->capture_default_str()
      ->check(CLI::IsMember({"fused", "reference"}));
  cmd->add_option("--attention-splits", o.splits,
                  "Context ranges per token and KV head, worked on in parallel (1: llama.cpp's order and logits)")
      ->capture_default_str()
      ->transform(number_in(1, 1024));
}

namespace {

/// Refuses a budget that cannot hold sequences of `lengths` tokens even with every block compressed.
void check_budget(const CacheConfig& config, std::span<const int> lengths) {
  const auto least = [&](std::span<const int> some) { return least_budget(config.geometry, config.format, config.calibration, some); };
  const uint64_t all = least(lengths);
  if (all <= config.budget_bytes) return;
  const std::string best = config.format == CacheFormat::gaac ? " even with every block compressed" : "";
  const std::string needs = fmt::format("a {} cache needs a budget of at least {} bytes for them", to_string(config.format), all);
  if (lengths.size() == 1) {
    throw Error(fmt::format("--kv-budget {} bytes cannot hold the {} tokens asked{}: {}", config.budget_bytes, lengths[0], best, needs));
  }
  uint64_t tokens = 0;
  std::string alone;  // the prompts that do not fit even alone
  for (size_t i = 0; i < lengths.size(); ++i) {
    tokens += static_cast<uint64_t>(lengths[i]);
    const uint64_t one = least(lengths.subspan(i, 1));
    if (one > config.budget_bytes && alone.size() < 200) alone += fmt::format("{}prompt {} alone needs {}", alone.empty() ? "" : ", ", i + 1, one);
  }
  throw Error(fmt::format("--kv-budget {} bytes cannot hold the {} prompts and their answers ({} tokens in all, each prompt and -n){}: {}{}",
                          config.budget_bytes, lengths.size(), tokens, best, needs, alone.empty() ? "" : " (" + alone + ")"));
}

}  // namespace

EngineCache make_engine_cache(const model::Model& model, const std::string& model_path, const CacheOptions& o,
                              std::span<const int> lengths, model::ThreadPool& pool, bool keep_all) {
  EngineCache out;
  const CacheFormat format = o.format == "bf16" ? CacheFormat::bf16 : CacheFormat::gaac;
  if (format == CacheFormat::gaac) {
    if (!o.calib.empty()) {
      out.calibration = load_calibration(o.calib);
      out.calibration_source = o.calib;
      const model::ModelConfig& c = model.config();
      if (out.calibration.layers() != c.layers || out.calibration.kv_heads() != c.kv_heads || out.calibration.head_dim() != c.head_dim) {
        throw Error(o.calib + ": the calibration is for " +
                    geometry_text(static_cast<size_t>(out.calibration.layers()), out.calibration.kv_heads(), out.calibration.head_dim()) +
                    ", but " + model_path + " has " + geometry_text(static_cast<size_t>(c.layers), c.kv_heads, c.head_dim));
      }
    } else {
      out.calibration = model::default_calibration(
          model, model_path, pool, [](const std::string& what) { fmt::print(stderr, "gaac: {}\n", what); }, &out.calibration_source);
    }
  }
  CacheConfig config;
  config.geometry = model::cache_geometry(model.config(), !keep_all);
  config.format = format;
  config.calibration = format == CacheFormat::gaac ? &out.calibration : nullptr;
  config.parallel = parallel_on(pool);
  if (o.budget == 0) {
    const int longest = lengths.empty() ? 0 : *std::max_element(lengths.begin(), lengths.end());
    config.budget_bytes = worst_case_budget(config.geometry, format, config.calibration, longest, static_cast<int>(lengths.size()));
  } else {
    config.budget_bytes = o.budget;
    check_budget(config, lengths);
  }
  out.cache = std::make_unique<KvCache>(std::move(config));
  return out;
}

model::AttentionSettings attention_settings(const CacheOptions& o) {
  return {o.attention == "reference" ? AttentionPath::reference : AttentionPath::fused, o.splits};
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
