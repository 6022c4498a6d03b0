// gaac generate: run a GGUF model on the CPU over a paged KV cache (GAAC or BF16) and stream its
// answer; with --batch-file, answer several prompts at once, their sequences sharing one cache and one
// budget as a server's would.
#include <fmt/core.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>

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
#include "standard_output.hpp"
#include "terminal_text.hpp"

namespace gaac::cli {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point start) { return std::chrono::duration<double>(Clock::now() - start).count(); }

struct GenerateOptions {
  std::string model, prompt, prompt_file, batch_file, save_kv;
  int max_tokens = 128;
  int prompt_tokens = 0;  ///< 0: the whole prompt
  int threads = 0;
  bool prompt_given = false;  ///< -p was given (perhaps empty)
  bool raw = false;
  bool json = false;
  model::Sampling sampling;
  CacheOptions cache;
};

/// The user messages: one, or one per non-empty line of the batch file.
std::vector<std::string> messages(const GenerateOptions& o) {
  if (!o.prompt_file.empty()) {
    std::string text = read_text(o.prompt_file);
    if (text.empty()) throw Error("--prompt-file " + o.prompt_file + " is empty: it should hold the message to answer");
    return {std::move(text)};
  }
  if (o.batch_file.empty()) {
    if (o.prompt.empty()) throw Error("--prompt is empty: give the message to answer");
    return {o.prompt};
  }
  std::vector<std::string> out;
  std::istringstream lines(read_text(o.batch_file));
  for (std::string line; std::getline(lines, line);) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (!line.empty()) out.push_back(line);
  }
  if (out.empty()) throw Error(o.batch_file + ": the batch file holds no prompt (one per line)");
  if (out.size() > 4096) throw Error(o.batch_file + ": more than 4,096 prompts");
  return out;
}

/// One answer being generated.
struct Answer {
  model::Session* session = nullptr;
  std::vector<model::Token> prompt, tokens;
  std::vector<float> logits;
  std::string text;
  uint64_t state = 0;  // sampling stream
  bool done = false;
  bool context_full = false;
  bool kv_full = false;  ///< stopped because the KV cache's budget ran out
};

void run_generate(const GenerateOptions& o) {
  const int given = o.prompt_given + !o.prompt_file.empty() + !o.batch_file.empty();
  if (given != 1) throw Error("give exactly one of --prompt, --prompt-file and --batch-file");
  if (!o.save_kv.empty() && !o.batch_file.empty()) throw Error("--save-kv writes one sequence: it does not go with --batch-file");
  std::vector<std::string> inputs{o.model};
  for (const std::string* path : {&o.prompt_file, &o.batch_file, &o.cache.calib}) {
    if (!path->empty()) inputs.push_back(*path);
  }
  const std::vector<std::string> users = messages(o);
  if (!o.save_kv.empty()) {
    if (io::is_standard_output(o.save_kv)) {
      throw Error("--save-kv " + o.save_kv + " is standard output, which carries the answer" + (o.json ? " (--json's report)" : "") +
                  "; write the KV dump to a file");
    }
    io::check_output(o.save_kv, inputs);  // before the work: a bad output fails at once
    check_metadata_text(users.front(), o.prompt_file.empty() ? "--prompt" : "--prompt-file " + o.prompt_file);
  }
  const auto model = load_model(o.model);
  const model::Tokenizer& tok = model->tokenizer();
  const auto pool = start_threads(o.threads);
  const auto context = static_cast<size_t>(model->config().context);

  std::vector<Answer> answers(users.size());
  std::vector<int> lengths;  // per answer: its prompt and the tokens it may generate
  size_t prompt_tokens = 0;
  for (size_t i = 0; i < users.size(); ++i) {
    Answer& a = answers[i];
    if (tok.add_bos()) a.prompt.push_back(tok.bos());
    const auto text = tok.encode(o.raw ? users[i] : model->chat_prompt(users[i]));
    a.prompt.insert(a.prompt.end(), text.begin(), text.end());
    if (o.prompt_tokens > 0 && a.prompt.size() > static_cast<size_t>(o.prompt_tokens)) a.prompt.resize(static_cast<size_t>(o.prompt_tokens));
    if (a.prompt.size() >= context) {
      throw Error(fmt::format("prompt {} is {} tokens, and {}'s context holds {}: there is no room for an answer", i + 1,
                              a.prompt.size(), o.model, context));
    }
    a.state = o.sampling.seed + i;
    lengths.push_back(static_cast<int>(std::min(context, a.prompt.size() + static_cast<size_t>(o.max_tokens))));
    prompt_tokens += a.prompt.size();
  }
  EngineCache kv = make_engine_cache(*model, o.model, o.cache, lengths, *pool, !o.save_kv.empty());
  KvCache& cache = *kv.cache;
  std::vector<std::unique_ptr<model::Session>> sessions;  // after the cache: they end first, freeing their sequences
  for (Answer& a : answers) {
    sessions.push_back(std::make_unique<model::Session>(*model, *pool, cache, attention_settings(o.cache)));
    a.session = sessions.back().get();
  }

  const Activity activity(fmt::format("generating with {}", o.model));
  const bool stream = answers.size() == 1 && !o.json;
  const bool terminal = ::isatty(STDOUT_FILENO) == 1;  // untrusted text: a terminal sees its controls escaped
  uint64_t peak_resident = 0;

  // The prompts, all of them together in passes of up to kPrefillChunk tokens each (a progress bar on
  // stderr follows a long prefill); then one token per unfinished answer per step. A budget that runs
  // out stops the unfinished answers where they are; the finished ones are kept and printed.
  std::optional<Error> ran_out;
  const auto start = Clock::now();
  double prefill_s = 0;
  int generated = 0;
  auto decode_start = start;
  try {
    {
      const Activity prefilling(fmt::format("prefilling {} prompt tokens", prompt_tokens));
      ProgressBar bar("prefill");
      size_t done = 0;
      for (size_t from = 0; done < prompt_tokens; from += kPrefillChunk) {
        std::vector<model::Session*> sessions_now;
        std::vector<std::span<const model::Token>> pieces;
        std::vector<Answer*> owners;
        for (Answer& a : answers) {
          if (a.prompt.size() <= from) continue;
          const size_t n = std::min(kPrefillChunk, a.prompt.size() - from);
          sessions_now.push_back(a.session);
          pieces.push_back(std::span<const model::Token>(a.prompt).subspan(from, n));
          owners.push_back(&a);
          done += n;
        }
        std::vector<std::vector<float>> logits = model::forward_batch(sessions_now, pieces);
        for (size_t i = 0; i < owners.size(); ++i) {
          if (pieces[i].data() + pieces[i].size() == owners[i]->prompt.data() + owners[i]->prompt.size()) {
            owners[i]->logits = std::move(logits[i]);  // its prompt's last token
          }
        }
        bar(done, prompt_tokens);
      }
    }
    prefill_s = seconds_since(start);
    peak_resident = cache.resident_bytes();
    decode_start = Clock::now();
    for (;;) {
      std::vector<model::Session*> batch;
      std::vector<model::Token> next;
      std::vector<Answer*> stepping;
      for (Answer& a : answers) {
        if (a.done) continue;
        const model::Token t = model::sample(a.logits, o.sampling, a.state);
        if (tok.is_end_of_generation(t) || a.tokens.size() >= static_cast<size_t>(o.max_tokens)) {
          a.done = true;
          continue;
        }
        a.tokens.push_back(t);
        ++generated;
        const std::string piece = tok.token_text(t);  // raw bytes: a character split across tokens completes later
        a.text += piece;
        if (stream) {
          fmt::print("{}", terminal ? without_controls(piece) : piece);
          flush_stdout();  // a reader sees each token at once, and a lost write stops the generation
        }
        if (static_cast<size_t>(a.session->position()) >= context) {  // no room to feed it back
          a.context_full = true;
          a.done = true;
          continue;
        }
        batch.push_back(a.session);
        next.push_back(t);
        stepping.push_back(&a);
      }
      if (batch.empty()) break;
      std::vector<std::span<const model::Token>> tokens;
      for (const model::Token& t : next) tokens.emplace_back(&t, 1);
      std::vector<std::vector<float>> logits = model::forward_batch(batch, tokens);
      for (size_t i = 0; i < stepping.size(); ++i) stepping[i]->logits = std::move(logits[i]);
      peak_resident = std::max(peak_resident, cache.resident_bytes());
    }
  } catch (const Error& e) {
    if (e.code() != ErrorCode::out_of_space) throw;
    ran_out = e;
    for (Answer& a : answers) a.kv_full = !a.done;
  }
  if (prefill_s == 0) prefill_s = seconds_since(start);
  const double decode_s = generated > 0 ? seconds_since(decode_start) : 0.0;
  const CacheUsage usage = cache.usage();
  bool context_full = false;
  for (const Answer& a : answers) context_full = context_full || a.context_full;

  if (!o.save_kv.empty() && !ran_out) {
    KvDump dump = answers.front().session->kv_dump();
    dump.metadata.emplace_back("model", printable(o.model));  // a path is only a label: shown, not kept byte for byte
    dump.metadata.emplace_back("prompt", users.front());
    dump.metadata.emplace_back("tokens", std::to_string(answers.front().session->position()));
    const Activity saving("writing " + o.save_kv);
    io::save_kv_dump(dump, o.save_kv, inputs);
  }
  const double prompt_rate = static_cast<double>(prompt_tokens) / prefill_s;
  const double decode_rate = generated > 0 ? generated / decode_s : 0.0;
  if (o.json) {
    nlohmann::json j;
    j["model"] = printable(o.model);
    j["kv"] = to_string(cache.format());
    j["kv_budget_bytes"] = usage.budget_bytes;
    if (cache.format() == CacheFormat::gaac) j["calibration"] = printable(kv.calibration_source);
    j["attention"] = o.cache.attention;
    j["attention_splits"] = o.cache.splits;
    nlohmann::json sequences = nlohmann::json::array();
    for (const Answer& a : answers) {
      sequences.push_back({{"prompt_tokens", a.prompt.size()}, {"tokens", a.tokens}, {"text", a.text}, {"context_full", a.context_full},
                           {"kv_full", a.kv_full}});
    }
    if (answers.size() == 1) j["tokens"] = answers.front().tokens;
    j["sequences"] = std::move(sequences);
    j["prompt_tokens"] = prompt_tokens;
    j["generated_tokens"] = generated;
    j["prompt_seconds"] = prefill_s;
    j["decode_seconds"] = decode_s;
    j["prompt_tokens_per_s"] = prompt_rate;
    j["decode_tokens_per_s"] = decode_rate;
    j["kv_resident_bytes"] = usage.resident_bytes();
    j["kv_peak_resident_bytes"] = peak_resident;
    j["kv_bf16_bytes"] = usage.bf16_bytes();
    j["kv_bits_per_element"] = usage.bits_per_element();
    j["compressed_tiles"] = usage.compressed_tiles;
    j["raw_fallback_tiles"] = cache.format() == CacheFormat::gaac ? usage.raw_tiles : 0;  // a bf16 cache has nothing to fall back from
    j["raw_fallback_fraction"] = cache.format() == CacheFormat::gaac ? usage.raw_fraction() : 0.0;
    j["raw_tiles"] = usage.raw_tiles;
    j["tail_tiles"] = usage.tail_tiles;
    j["unused_slot_bytes"] = usage.unused_slot_bytes;
    fmt::print("{}\n", j.dump(2, ' ', false, nlohmann::json::error_handler_t::replace));
  } else if (stream) {
    fmt::print("\n");
  } else {
    for (size_t i = 0; i < answers.size(); ++i) {
      const std::string text = terminal ? without_controls(answers[i].text) : answers[i].text;
      fmt::print("### {}: {}\n{}{}\n\n", i + 1, terminal ? without_controls(users[i]) : users[i], text,
                 answers[i].kv_full ? " [stopped: the KV cache is full]" : "");
    }
  }
  flush_stdout();  // the text ends before the timing line on stderr, even through one pipe
  fmt::print(stderr,
             "prompt: {} tokens in {:.2f} s ({:.1f} tokens/s); generated: {} tokens in {:.2f} s ({:.1f} tokens/s){}\n"
             "KV cache ({}): {} resident for {} of BF16 values ({:.2f} bits per element{})\n",
             prompt_tokens, prefill_s, prompt_rate, generated, decode_s, decode_rate,
             context_full ? fmt::format("; stopped at the model's context of {} tokens", context) : "",
             to_string(cache.format()), human_bytes(static_cast<double>(usage.resident_bytes())),
             human_bytes(static_cast<double>(usage.bf16_bytes())), usage.bits_per_element(),
             cache.format() == CacheFormat::gaac ? fmt::format(", {} of {} finalized tiles raw", usage.raw_tiles,
                                                               usage.raw_tiles + usage.compressed_tiles)
                                                 : "");
  if (cache.format() == CacheFormat::gaac) fmt::print(stderr, "{}", raw_tiles_note(usage.raw_fraction(), printable(kv.calibration_source)));
  if (ran_out) {
    size_t finished = 0;
    for (const Answer& a : answers) finished += a.kv_full ? 0 : 1;
    throw Error(ErrorCode::out_of_space, std::string(ran_out->what()) + "; " +
                                             (answers.size() == 1 ? std::string("the answer stops there")
                                                                  : fmt::format("{} of {} answers finished (printed above)", finished,
                                                                                answers.size())));
  }
}

}  // namespace

void add_generate(CLI::App& app) {
  auto* cmd = app.add_subcommand("generate", "Generate text with a GGUF model (Llama family, Gemma 3) on the CPU, over a GAAC or BF16 KV cache");
  auto o = std::make_shared<GenerateOptions>();
  cmd->add_option("-m,--model", o->model, "Model (.gguf)")->required()->check(CLI::ExistingFile);
  cmd->add_option("-p,--prompt", o->prompt, "User message (wrapped in the model's chat template)");
  cmd->add_option("--prompt-file", o->prompt_file, "Read the user message from this file")->check(CLI::ExistingFile);
  cmd->add_option("--batch-file", o->batch_file,
                  "Answer every line of this file (one prompt a line) at once: one cache, one budget, decoded in batches")
      ->check(CLI::ExistingFile);
  cmd->add_option("--prompt-tokens", o->prompt_tokens, "Keep at most this many tokens of each prompt (0: all)")
      ->capture_default_str()
      ->transform(number_in(0, 1 << 24));
  cmd->add_option("-n,--max-tokens", o->max_tokens, "Most tokens to generate per prompt (generation also stops at the context's end)")
      ->capture_default_str()
      ->transform(number_in(1, 1 << 20));
  cmd->add_option("--temperature", o->sampling.temperature, "Sampling temperature (0: greedy)")
      ->capture_default_str()
      ->transform(number_in(0.0f, 100.0f));
  cmd->add_option("--top-p", o->sampling.top_p, "Nucleus sampling threshold")
      ->capture_default_str()
      ->transform(number_in(0.0f, 1.0f));
  cmd->add_option("--seed", o->sampling.seed, "Sampling seed (prompt i of a batch uses seed + i)")
      ->capture_default_str()
      ->transform(number_in<uint64_t>(0, UINT64_MAX));
  add_threads_option(cmd, o->threads);
  add_cache_options(cmd, o->cache);
  cmd->add_flag("--raw", o->raw, "Use the prompt as is, without the chat template");
  cmd->add_flag("--json", o->json, "Print one JSON object (tokens, texts, speeds, KV bytes) instead of the text");
  cmd->add_option("--save-kv", o->save_kv, "Write the KV cache of the prompt and answer to this KV dump (.safetensors)");
  cmd->callback([o, cmd] {
    o->prompt_given = cmd->count("--prompt") > 0;
    run_generate(*o);
  });
}

}  // namespace gaac::cli
