// gaac validate: compares the engine's logits with an independent implementation's, position by
// position over a text (see scripts/reference_logits.py for producing the reference).
#include <fmt/core.h>

#include <cstring>

#include "activity.hpp"
#include "commands.hpp"
#include "common.hpp"
#include "engine_support.hpp"
#include "gaac/error.hpp"
#include "io/files.hpp"
#include "io/output_file.hpp"
#include "logit_comparison.hpp"
#include "model/model.hpp"
#include "numbers.hpp"
#include "progress.hpp"

namespace gaac::cli {
namespace {

struct ValidateOptions {
  std::string model, text, write_tokens, reference;
  int tokens = 512;
  int threads = 0;
  double min_agreement = 100;
  CacheOptions cache;
};

std::vector<model::Token> text_tokens(const model::Model& m, const std::string& path, int limit) {
  const std::vector<uint8_t> bytes = io::read_file(path);
  const model::Tokenizer& tok = m.tokenizer();
  std::vector<model::Token> tokens;
  if (tok.add_bos()) tokens.push_back(tok.bos());
  const auto text = tok.encode(std::string(bytes.begin(), bytes.end()), false);
  tokens.insert(tokens.end(), text.begin(), text.end());
  if (tokens.size() > static_cast<size_t>(limit)) tokens.resize(static_cast<size_t>(limit));
  return tokens;
}

/// One line per token id.
std::string token_lines(const std::vector<model::Token>& tokens) {
  std::string text;
  for (const auto t : tokens) text += std::to_string(t) + '\n';
  return text;
}

/// Runs the engine over `tokens` and compares each position's logits with the reference file's.
LogitComparison compare(const model::Model& model, const std::vector<model::Token>& tokens, const ValidateOptions& o) {
  const auto vocab = static_cast<size_t>(model.config().vocab);
  const std::vector<uint8_t> reference = io::read_file(o.reference);
  if (reference.size() % (vocab * sizeof(float)) != 0 || reference.size() < tokens.size() * vocab * sizeof(float)) {
    throw Error(o.reference + ": expected at least " + std::to_string(tokens.size()) + " × " + std::to_string(vocab) +
                " float32 logits, the file has " + std::to_string(reference.size()) + " bytes");
  }
  const auto pool = start_threads(o.threads);
  const int length = static_cast<int>(tokens.size());
  EngineCache kv = make_engine_cache(model, o.model, o.cache, std::span(&length, 1), *pool);
  model::Session session(model, *pool, *kv.cache, attention_settings(o.cache));
  LogitComparison comparison;
  std::vector<float> ref(vocab);
  constexpr size_t kChunk = 64;
  const Activity activity("comparing the logits of " + o.model + " with " + o.reference);
  ProgressBar bar("validating");
  for (size_t from = 0; from < tokens.size(); from += kChunk) {
    const size_t n = std::min(kChunk, tokens.size() - from);
    const std::vector<float> logits = session.forward(std::span(tokens).subspan(from, n), true);
    for (size_t t = 0; t < n; ++t) {
      std::memcpy(ref.data(), &reference[(from + t) * vocab * sizeof(float)], vocab * sizeof(float));
      try {
        comparison.add(std::span(logits).subspan(t * vocab, vocab), ref);
      } catch (const Error& e) {
        throw e.with_context(o.reference);
      }
    }
    bar(from + n, tokens.size());
  }
  return comparison;
}

void run(const ValidateOptions& o) {
  if (o.reference.empty() && o.write_tokens.empty()) {
    throw CLI::ValidationError("validate has nothing to compare against: give --reference LOGITS (or --write-tokens T "
                               "alone, to write the token ids a reference is computed from)");
  }
  const std::vector<std::string> inputs{o.model, o.text, o.reference};
  if (!o.write_tokens.empty()) io::check_output(o.write_tokens, inputs);  // before the work
  const auto model = [&] {
    const Activity activity("loading the model " + o.model);
    return model::Model::load(o.model);
  }();
  const std::vector<model::Token> tokens = text_tokens(*model, o.text, o.tokens);
  if (tokens.size() > static_cast<size_t>(model->config().context)) {
    throw Error(fmt::format("--tokens {}: {} gives {} positions but {}'s context holds {}; give --tokens {} or fewer",
                            o.tokens, o.text, tokens.size(), o.model, model->config().context, model->config().context));
  }
  if (!o.write_tokens.empty()) {
    const std::string lines = token_lines(tokens);
    const std::span<const uint8_t> parts[] = {{reinterpret_cast<const uint8_t*>(lines.data()), lines.size()}};
    io::write_output(o.write_tokens, parts, inputs);
    fmt::print("wrote {} token ids to {}\n", tokens.size(), o.write_tokens);
  }
  if (o.reference.empty()) return;

  const LogitComparison c = compare(*model, tokens, o);
  fmt::print("{} positions: top-1 agreement {:.2f}% ({}/{}), max |dlogit| {:.4f}, mean |dlogit| {:.5f}\n", c.positions,
             c.agreement_percent(), c.agreeing, c.positions, c.max_delta, c.mean_delta());
  if (c.agreement_percent() < o.min_agreement) {
    throw CommandFailed(fmt::format("validate FAILED: top-1 agreement {:.2f}% with {} is below --min-agreement {}%",
                                    c.agreement_percent(), o.reference, o.min_agreement));
  }
}

}  // namespace

void add_validate(CLI::App& app) {
  auto* cmd = app.add_subcommand("validate", "Compare the engine's logits on a text with reference logits");
  auto o = std::make_shared<ValidateOptions>();
  cmd->add_option("-m,--model", o->model, "Model (.gguf)")->required()->check(CLI::ExistingFile);
  cmd->add_option("--text", o->text, "Text file (BOS + its first tokens are evaluated)")->required()->check(CLI::ExistingFile);
  cmd->add_option("--tokens", o->tokens, "Positions to evaluate")->capture_default_str()->transform(number_in(1, 1 << 20));
  cmd->add_option("--write-tokens", o->write_tokens, "Write the evaluated token ids (one per line) here");
  cmd->add_option("--reference", o->reference, "Reference logits: raw float32, positions × vocab")->check(CLI::ExistingFile);
  cmd->add_option("--min-agreement", o->min_agreement,
                  "Least top-1 agreement, in percent, for success (the default asks every position to agree)")
      ->capture_default_str()
      ->transform(number_in(0.0, 100.0));
  add_threads_option(cmd, o->threads);
  add_cache_options(cmd, o->cache);
  cmd->callback([o] { run(*o); });
}

}  // namespace gaac::cli
