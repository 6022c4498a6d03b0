// gaac plan: how much a KV-cache budget holds for a model, with GAAC and with a BF16 cache of the same
// block size (the paper's equal-memory comparison): estimated from calibration statistics and, with
// --check, measured by filling real caches with a KV dump's values.
#include <fmt/core.h>

#include <nlohmann/json.hpp>

#include "commands.hpp"
#include "common.hpp"
#include "engine_support.hpp"
#include "gaac/capacity.hpp"
#include "gaac/error.hpp"
#include "model/default_calibration.hpp"
#include "numbers.hpp"
#include "standard_output.hpp"
#include "terminal_text.hpp"

namespace gaac::cli {
namespace {

struct CapacityOptions {
  std::string model, calib, check;
  uint64_t budget = 0;
  int tokens = 0;  ///< 0: the model's context
  int threads = 0;
  bool json = false;
};

void run(const CapacityOptions& o) {
  const auto model = load_model(o.model);
  const model::ModelConfig& c = model->config();
  const int tokens = o.tokens > 0 ? o.tokens : c.context;
  const CacheGeometry geometry = model::cache_geometry(c);
  KvDump sample;
  if (!o.check.empty()) {  // before the calibration: a dump of another model fails at once
    sample = load_dump(o.check);
    if (static_cast<int>(sample.layers.size()) != c.layers || sample.kv_heads() != c.kv_heads || sample.head_dim() != c.head_dim) {
      throw Error("--check " + o.check + ": the KV dump is " +
                  geometry_text(sample.layers.size(), sample.kv_heads(), sample.head_dim()) + ", but " + o.model + "'s cache is " +
                  geometry_text(static_cast<size_t>(c.layers), c.kv_heads, c.head_dim));
    }
  }
  CalibrationTable table;
  std::string source = o.calib;
  if (!o.calib.empty()) {
    table = load_calibration(o.calib);
  } else {
    const auto pool = start_threads(o.threads);
    table = model::default_calibration(*model, o.model, *pool, [](const std::string& what) { fmt::print(stderr, "gaac: {}\n", what); },
                                       &source);
  }
  struct Row {
    CapacityEstimate estimate;
    int64_t measured = -1;
  };
  std::vector<Row> rows;
  for (const CacheFormat format : {CacheFormat::bf16, CacheFormat::gaac}) {
    const CalibrationTable* calibration = format == CacheFormat::gaac ? &table : nullptr;
    Row r{estimate_capacity(geometry, format, calibration, o.budget, tokens)};
    if (!o.check.empty()) r.measured = measure_capacity(geometry, format, calibration, o.budget, tokens, sample).sequences;
    rows.push_back(r);
  }
  const CapacityEstimate& bf16 = rows[0].estimate;
  const CapacityEstimate& gaac = rows[1].estimate;
  // A sequence cannot pass the model's context, whatever the budget holds.
  const auto longest = [&](const CapacityEstimate& e) { return std::min<int64_t>(e.max_tokens, c.context); };
  if (o.json) {
    nlohmann::json j;
    j["model"] = printable(o.model);
    j["calibration"] = printable(source);
    j["budget_bytes"] = o.budget;
    j["sequence_tokens"] = tokens;
    j["context_tokens"] = c.context;
    for (const Row& r : rows) {
      nlohmann::json f{{"unit_bytes", r.estimate.unit_bytes},
                       {"units", r.estimate.units},
                       {"raw_fraction", r.estimate.raw_fraction},
                       {"bytes_per_token", r.estimate.bytes_per_token},
                       {"max_tokens", r.estimate.max_tokens},
                       {"longest_sequence", longest(r.estimate)},
                       {"max_sequences", r.estimate.max_sequences}};
      if (r.measured >= 0) f["measured_sequences"] = r.measured;
      j[to_string(r.estimate.format)] = f;
    }
    fmt::print("{}\n", j.dump(2));
    return;
  }
  fmt::print("{}: {}, budget {}, sequences of {} tokens; calibration {}\n", printable(o.model),
             geometry_text(static_cast<size_t>(c.layers), c.kv_heads, c.head_dim), human_bytes(static_cast<double>(o.budget)), tokens,
             printable(source));
  fmt::print("{:<6} {:>10} {:>10} {:>12} {:>18} {:>14}{}\n", "cache", "unit B", "raw tiles", "bytes/token", "longest sequence",
             "sequences", o.check.empty() ? "" : "  measured");
  for (const Row& r : rows) {
    const CapacityEstimate& e = r.estimate;
    const std::string held = e.max_tokens > c.context ? fmt::format("{} (context)", c.context) : std::to_string(e.max_tokens);
    fmt::print("{:<6} {:>10} {:>9.2f}% {:>12.1f} {:>18} {:>14}{}\n", to_string(e.format), e.unit_bytes,
               e.format == CacheFormat::gaac ? 100.0 * e.raw_fraction : 0.0, e.bytes_per_token, held, e.max_sequences,
               r.measured >= 0 ? fmt::format("  {:>8}", r.measured) : "");
  }
  const auto ratio = [](int64_t a, int64_t b) { return static_cast<double>(a) / static_cast<double>(std::max<int64_t>(b, 1)); };
  fmt::print("sequences of {} tokens: gaac holds {}, bf16 {} ({:.3f}×)", tokens, gaac.max_sequences, bf16.max_sequences,
             ratio(gaac.max_sequences, bf16.max_sequences));
  if (tokens < kTileTokens) {
    fmt::print("; shorter than a {}-token block, each is an open block, kept raw: in two gaac units (2 × {} bytes) against "
               "one bf16 tile ({} bytes)",
               kTileTokens, gaac.unit_bytes, bf16.unit_bytes);
  }
  fmt::print("\ntokens in this budget: gaac holds {:.3f}× those of a bf16 cache{}\n", ratio(gaac.max_tokens, bf16.max_tokens),
             bf16.max_tokens > c.context ? fmt::format(" (in sequences of at most {} tokens, the model's context)", c.context) : "");
}

}  // namespace

void add_capacity(CLI::App& app) {
  auto* cmd = app.add_subcommand("plan", "How many tokens and sequences a KV-cache budget holds, with GAAC and with BF16");
  auto o = std::make_shared<CapacityOptions>();
  cmd->add_option("-m,--model", o->model, "Model (.gguf)")->required()->check(CLI::ExistingFile);
  cmd->add_option("--budget", o->budget, "KV cache memory in bytes (suffixes K, M, G, T: powers of 1024)")
      ->required()
      ->transform(bytes_in(1, uint64_t{1} << 50));
  cmd->add_option("--tokens", o->tokens, "Length of each sequence (0: the model's context)")
      ->capture_default_str()
      ->transform(number_in(0, 1 << 24));
  cmd->add_option("--calib", o->calib, "Calibration table (default: the model's, learnt once and cached)")->check(CLI::ExistingFile);
  cmd->add_option("--check", o->check, "Also fill real caches with this KV dump's values (repeated) and count what fits")
      ->check(CLI::ExistingFile);
  add_threads_option(cmd, o->threads);
  cmd->add_flag("--json", o->json, "Print JSON");
  cmd->callback([o] { run(*o); });
}

}  // namespace gaac::cli
