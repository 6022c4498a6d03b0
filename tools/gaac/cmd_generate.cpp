// gaac generate / gaac capture: run a GGUF model; stream an answer, or write the KV cache of a text.
#include <fmt/core.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>

#include "activity.hpp"
#include "commands.hpp"
#include "common.hpp"
#include "common/utf8.hpp"
#include "engine_cache.hpp"
#include "gaac/error.hpp"
#include "io/files.hpp"
#include "io/output_file.hpp"
#include "model/model.hpp"
#include "numbers.hpp"
#include "progress.hpp"
#include "standard_output.hpp"
#include "terminal_text.hpp"

namespace gaac::cli {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

std::string read_text(const std::string& path) {
  const std::vector<uint8_t> bytes = io::read_file(path);
  return {bytes.begin(), bytes.end()};
}

std::unique_ptr<model::Model> load_model(const std::string& path) {
  const Activity activity("loading the model " + path);
  return model::Model::load(path);
}

/// Refuses text that a KV dump's metadata (safetensors JSON) cannot hold, before any work is done.
void check_metadata_text(const std::string& text, const std::string& what) {
  const size_t bad = first_invalid_utf8(text);
  if (bad != std::string::npos) {
    throw Error(fmt::format("{} is not valid UTF-8 (byte {}), so the KV dump's metadata cannot record it", what, bad));
  }
}

/// Prefills `tokens` in chunks so a progress bar can follow long texts.
void prefill(model::Session& session, const std::vector<model::Token>& tokens, ProgressBar& bar) {
  constexpr size_t kChunk = 64;
  for (size_t i = 0; i < tokens.size(); i += kChunk) {
    const size_t n = std::min(kChunk, tokens.size() - i);
    session.forward(std::span(tokens).subspan(i, n));
    bar(i + n, tokens.size());
  }
}

struct GenerateOptions {
  std::string model, prompt, save_kv;
  int max_tokens = 128;
  int threads = 0;
  bool raw = false;
  model::Sampling sampling;
};

void run_generate(const GenerateOptions& o) {
  const std::vector<std::string> inputs{o.model};
  if (!o.save_kv.empty()) {
    io::check_output(o.save_kv, inputs);  // before the work: a bad output fails at once
    check_metadata_text(o.prompt, "--prompt");
  }
  const auto model = load_model(o.model);
  const model::Tokenizer& tok = model->tokenizer();
  const auto pool = start_threads(o.threads);
  std::vector<model::Token> prompt;
  if (tok.add_bos()) prompt.push_back(tok.bos());
  const auto text = tok.encode(o.raw ? o.prompt : model->chat_prompt(o.prompt));
  prompt.insert(prompt.end(), text.begin(), text.end());
  const auto context = static_cast<size_t>(model->config().context);
  if (prompt.size() >= context) {
    throw Error(fmt::format("--prompt is {} tokens, and {}'s context holds {}: there is no room for an answer",
                            prompt.size(), o.model, context));
  }
  KvCache cache = bf16_cache_for(*model, static_cast<int>(prompt.size()) + o.max_tokens, *pool, !o.save_kv.empty());
  model::Session session(*model, *pool, cache);

  const Activity activity(fmt::format("generating with {}", o.model));
  const auto start = Clock::now();
  std::vector<float> logits = session.forward(prompt);
  const double prefill_s = seconds_since(start);
  uint64_t state = o.sampling.seed;
  // Text from a model file is untrusted: on a terminal, its control characters are shown escaped.
  const bool terminal = ::isatty(STDOUT_FILENO) == 1;
  const auto decode_start = Clock::now();
  int generated = 0;
  bool context_full = false;
  for (; generated < o.max_tokens; ++generated) {
    const model::Token next = model::sample(logits, o.sampling, state);
    if (tok.is_end_of_generation(next)) break;
    const std::string piece = tok.token_text(next);  // raw bytes: a character split across tokens completes later
    fmt::print("{}", terminal ? without_controls(piece) : piece);
    flush_stdout();  // a reader sees each token at once, and a lost write stops the generation
    if (static_cast<size_t>(session.position()) >= context) {
      context_full = true;
      ++generated;
      break;
    }
    logits = session.forward(std::span(&next, 1));
  }
  const double decode_s = seconds_since(decode_start);
  fmt::print("\n");
  flush_stdout();  // the text ends before the timing line on stderr, even through one pipe
  if (!o.save_kv.empty()) {
    KvDump dump = session.kv_dump();
    dump.metadata.emplace_back("model", printable(o.model));  // a path is only a label: shown, not kept byte for byte
    dump.metadata.emplace_back("prompt", o.prompt);
    dump.metadata.emplace_back("tokens", std::to_string(session.position()));
    const Activity saving("writing " + o.save_kv);
    save_kv_dump(dump, o.save_kv, inputs);
  }
  fmt::print(stderr, "prompt: {} tokens in {:.2f} s ({:.1f} tokens/s); generated: {} tokens in {:.2f} s ({:.1f} tokens/s){}\n",
             prompt.size(), prefill_s, static_cast<double>(prompt.size()) / prefill_s, generated, decode_s,
             generated > 0 ? generated / decode_s : 0.0,
             context_full ? fmt::format("; stopped at the model's context of {} tokens", context) : "");
}

}  // namespace

void add_generate(CLI::App& app) {
  auto* cmd = app.add_subcommand("generate", "Generate text with a GGUF model (Llama family, Gemma 3) on the CPU");
  auto o = std::make_shared<GenerateOptions>();
  cmd->add_option("-m,--model", o->model, "Model (.gguf)")->required()->check(CLI::ExistingFile);
  cmd->add_option("-p,--prompt", o->prompt, "User message (wrapped in the model's chat template)")->required();
  cmd->add_option("-n,--max-tokens", o->max_tokens, "Most tokens to generate (generation also stops at the context's end)")
      ->capture_default_str()
      ->transform(number_in(1, 1 << 20));
  cmd->add_option("--temperature", o->sampling.temperature, "Sampling temperature (0: greedy)")
      ->capture_default_str()
      ->transform(number_in(0.0f, 100.0f));
  cmd->add_option("--top-p", o->sampling.top_p, "Nucleus sampling threshold")
      ->capture_default_str()
      ->transform(number_in(0.0f, 1.0f));
  cmd->add_option("--seed", o->sampling.seed, "Sampling seed")
      ->capture_default_str()
      ->transform(number_in<uint64_t>(0, UINT64_MAX));
  add_threads_option(cmd, o->threads);
  cmd->add_flag("--raw", o->raw, "Use the prompt as is, without the chat template");
  cmd->add_option("--save-kv", o->save_kv, "Write the KV cache of the prompt and answer to this KV dump (.safetensors)");
  cmd->callback([o] { run_generate(*o); });
}

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
    const auto start = Clock::now();
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
      save_kv_dump(dump, *output, inputs);
    }
    fmt::print("{}: {} tokens × {} layers × {} KV heads × head_dim {} ({} of BF16 KV) in {:.1f} s, wrote {}\n", *text_path,
               tokens.size(), dump.layers.size(), dump.kv_heads(), dump.head_dim(),
               human_bytes(static_cast<double>(dump.bf16_bytes())), seconds_since(start), *output);
  });
}

}  // namespace gaac::cli
