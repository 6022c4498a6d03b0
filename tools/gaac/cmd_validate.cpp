// gaac validate: compares the engine's logits with an independent implementation's, position by
// position over a text (see scripts/reference_logits.py for producing the reference).
#include <fmt/core.h>

#include <cmath>
#include <cstring>
#include <fstream>
#include <sstream>

#include "commands.hpp"
#include "engine_cache.hpp"
#include "gaac/error.hpp"
#include "io/files.hpp"
#include "model/model.hpp"
#include "progress.hpp"

namespace gaac::cli {
namespace {

struct ValidateOptions {
  std::string model, text, write_tokens, reference;
  int tokens = 512;
  int threads = 0;
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

void run(const ValidateOptions& o) {
  const auto model = model::Model::load(o.model);
  const std::vector<model::Token> tokens = text_tokens(*model, o.text, o.tokens);
  if (!o.write_tokens.empty()) {
    std::ofstream out(o.write_tokens);
    for (const auto t : tokens) out << t << '\n';
    if (!out) throw Error(ErrorCode::io, "cannot write " + o.write_tokens);
    fmt::print("wrote {} token ids to {}\n", tokens.size(), o.write_tokens);
  }
  if (o.reference.empty()) return;

  const auto vocab = static_cast<size_t>(model->config().vocab);
  const std::vector<uint8_t> reference = io::read_file(o.reference);
  if (reference.size() % (vocab * sizeof(float)) != 0 || reference.size() < tokens.size() * vocab * sizeof(float)) {
    throw Error(o.reference + ": expected at least " + std::to_string(tokens.size()) + " × " + std::to_string(vocab) +
                " float32 logits, the file has " + std::to_string(reference.size()) + " bytes");
  }
  model::ThreadPool pool(o.threads);
  KvCache cache = bf16_cache_for(*model, static_cast<int>(tokens.size()), pool, false);
  model::Session session(*model, pool, cache);
  size_t agree = 0;
  double max_delta = 0, sum_delta = 0;
  constexpr size_t kChunk = 64;
  ProgressBar bar("validating");
  for (size_t from = 0; from < tokens.size(); from += kChunk) {
    const size_t n = std::min(kChunk, tokens.size() - from);
    const std::vector<float> logits = session.forward(std::span(tokens).subspan(from, n), true);
    for (size_t t = 0; t < n; ++t) {
      const float* ours = &logits[t * vocab];
      float ref_top = -INFINITY, our_top = -INFINITY;
      size_t ref_arg = 0, our_arg = 0;
      for (size_t v = 0; v < vocab; ++v) {
        float r;
        std::memcpy(&r, &reference[((from + t) * vocab + v) * sizeof(float)], sizeof r);
        const double delta = std::fabs(static_cast<double>(ours[v]) - r);
        max_delta = std::max(max_delta, delta);
        sum_delta += delta;
        if (r > ref_top) ref_top = r, ref_arg = v;
        if (ours[v] > our_top) our_top = ours[v], our_arg = v;
      }
      agree += ref_arg == our_arg;
    }
    bar(from + n, tokens.size());
  }
  fmt::print("{} positions: top-1 agreement {:.2f}% ({}/{}), max |dlogit| {:.4f}, mean |dlogit| {:.5f}\n", tokens.size(),
             100.0 * static_cast<double>(agree) / static_cast<double>(tokens.size()), agree, tokens.size(), max_delta,
             sum_delta / static_cast<double>(tokens.size() * vocab));
}

}  // namespace

void add_validate(CLI::App& app) {
  auto* cmd = app.add_subcommand("validate", "Compare the engine's logits on a text with reference logits");
  auto o = std::make_shared<ValidateOptions>();
  cmd->add_option("-m,--model", o->model, "Model (.gguf)")->required()->check(CLI::ExistingFile);
  cmd->add_option("--text", o->text, "Text file (BOS + its first tokens are evaluated)")->required()->check(CLI::ExistingFile);
  cmd->add_option("--tokens", o->tokens, "Positions to evaluate")->capture_default_str()->check(CLI::Range(1, 1 << 20));
  cmd->add_option("--write-tokens", o->write_tokens, "Write the evaluated token ids (one per line) here");
  cmd->add_option("--reference", o->reference, "Reference logits: raw float32, positions × vocab")->check(CLI::ExistingFile);
  cmd->add_option("-t,--threads", o->threads, "Threads (0: all)")->capture_default_str();
  cmd->callback([o] { run(*o); });
}

}  // namespace gaac::cli
