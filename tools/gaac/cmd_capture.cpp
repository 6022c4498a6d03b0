// gaac capture: prefill a GGUF model over a text and write its KV cache as a KV dump.
#include <fmt/core.h>

#include <chrono>

#include "activity.hpp"
#include "commands.hpp"
#include "common.hpp"
#include "engine_support.hpp"
#include "gaac/error.hpp"
#include "io/kv_dump_file.hpp"
#include "io/output_file.hpp"
#include "model/model.hpp"
#include "numbers.hpp"
#include "progress.hpp"
#include "terminal_text.hpp"

namespace gaac::cli {
namespace {

/// Prefills `tokens` in passes of kPrefillChunk so a progress bar can follow long texts.
void prefill(model::Session& session, const std::vector<model::Token>& tokens, ProgressBar& bar) {
  for (size_t i = 0; i < tokens.size(); i += kPrefillChunk) {
    const size_t n = std::min(kPrefillChunk, tokens.size() - i);
    session.forward(std::span(tokens).subspan(i, n));
    bar(i + n, tokens.size());
  }
}

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

}  // namespace

void add_capture(CLI::App& app) {
  auto* cmd = app.add_subcommand("capture", "Prefill a GGUF model over a text and write its KV cache (BF16) as a KV dump");
  auto model_path = std::make_shared<std::string>();
  auto text_path = std::make_shared<std::string>();
  auto output = std::make_shared<std::string>();
  auto max_tokens = std::make_shared<int>(0);
  auto threads = std::make_shared<int>(0);
  cmd->add_option("-m,--model", *model_path, "Model (.gguf)")->required()->check(CLI::ExistingFile);
  cmd->add_option("--text", *text_path, "Text file to prefill")->required()->check(CLI::ExistingFile);
  cmd->add_option("--tokens", *max_tokens, "Use at most this many tokens of the text (0: all, up to the context)")
      ->capture_default_str()
      ->transform(number_in(0, 1 << 24));
  add_threads_option(cmd, *threads);
  cmd->add_option("-o,--output", *output, "KV dump to write (.safetensors)")->required();
  cmd->callback([=] {
    const std::vector<std::string> inputs{*model_path, *text_path};
    io::check_output(*output, inputs);  // before the work: a bad output fails at once
    const auto model = load_model(*model_path);
    const model::Tokenizer& tok = model->tokenizer();
    std::vector<model::Token> tokens;
    if (tok.add_bos()) tokens.push_back(tok.bos());
    const auto text = tok.encode(read_text(*text_path), false);
    tokens.insert(tokens.end(), text.begin(), text.end());
    size_t limit = static_cast<size_t>(model->config().context);
    if (*max_tokens > 0) limit = std::min(limit, static_cast<size_t>(*max_tokens));
    if (tokens.size() > limit) tokens.resize(limit);
    const auto pool = start_threads(*threads);
    KvCache cache = bf16_cache_for(*model, static_cast<int>(tokens.size()), *pool, true);
    model::Session session(*model, *pool, cache);
    const auto start = std::chrono::steady_clock::now();
    {
      const Activity activity(fmt::format("prefilling {} tokens of {}", tokens.size(), *text_path));
      ProgressBar bar("prefill");
      prefill(session, tokens, bar);
    }
    KvDump dump = session.kv_dump();
    dump.metadata.emplace_back("model", printable(*model_path));  // paths are labels: shown, not kept byte for byte
    dump.metadata.emplace_back("text", printable(*text_path));
    dump.metadata.emplace_back("tokens", std::to_string(tokens.size()));
    {
      const Activity activity("writing " + *output);
      io::save_kv_dump(dump, *output, inputs);
    }
    fmt::print("{}: {} tokens × {} layers × {} KV heads × head_dim {} ({} of BF16 KV) in {:.1f} s, wrote {}\n", *text_path,
               tokens.size(), dump.layers.size(), dump.kv_heads(), dump.head_dim(),
               human_bytes(static_cast<double>(dump.bf16_bytes())), seconds_since(start), *output);
  });
}

}  // namespace gaac::cli
