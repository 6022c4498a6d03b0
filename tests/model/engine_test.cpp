// The engine: thread pool, sampling, and the real models end to end (KV capture round trip).
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <thread>
#include <stdexcept>

#include "gaac/calibration.hpp"
#include "gaac/snapshot.hpp"
#include <cstring>

#include "model/default_calibration.hpp"
#include "model/model.hpp"
#include "support/models.hpp"

namespace gaac::model {
namespace {

TEST(ThreadPool, ParallelForCoversTheRangeExactlyOnce) {
  ThreadPool pool(3);
  for (const int64_t n : {1, 2, 7, 64, 1000, 1001}) {
    for (const int64_t grain : {1, 4, 16, 5000}) {
      std::vector<std::atomic<int>> hits(static_cast<size_t>(n));
      pool.parallel_for(n, grain, [&](int64_t begin, int64_t end) {
        EXPECT_EQ(begin % grain, 0);                 // one grain per call ...
        EXPECT_EQ(end, std::min(n, begin + grain));  // ... the last one shorter
        for (int64_t i = begin; i < end; ++i) ++hits[static_cast<size_t>(i)];
      });
      for (int64_t i = 0; i < n; ++i) ASSERT_EQ(hits[static_cast<size_t>(i)].load(), 1) << n << " " << grain << " " << i;
    }
  }
}

TEST(ThreadPool, AThreadHeldUpLeavesItsGrainsToTheOthers) {
  // Grains go to whichever thread is free: while one grain holds a thread, the other threads take
  // every remaining grain (a static share would leave half of them waiting for the held thread).
  ThreadPool pool(2);
  std::atomic<int> done{0};
  std::atomic<bool> release{false};
  pool.parallel_for(100, 1, [&](int64_t begin, int64_t) {
    if (begin == 0) {  // held until the other thread has done the rest (or, failing that, for 30 s)
      const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
      while (done.load() < 99 && std::chrono::steady_clock::now() < deadline) std::this_thread::yield();
      release = done.load() == 99;
    }
    ++done;
  });
  EXPECT_TRUE(release.load());
  EXPECT_EQ(done.load(), 100);
}

TEST(ThreadPool, ExceptionsReachTheCaller) {
  ThreadPool pool(2);
  EXPECT_THROW(pool.parallel_for(100, 1, [](int64_t begin, int64_t) {
    if (begin > 0) throw std::runtime_error("boom");
  }),
               std::runtime_error);
  int64_t total = 0;
  pool.parallel_for(10, 1, [&](int64_t b, int64_t e) { total += 0 * (e - b); });  // still usable afterwards
  EXPECT_EQ(total, 0);
}

TEST(Sampling, GreedyPicksTheArgMaxAndTemperatureFollowsTheDistribution) {
  const std::vector<float> logits{0.0f, 3.0f, 1.0f, 3.0f};
  uint64_t state = 1;
  EXPECT_EQ(sample(logits, {}, state), 1);  // lowest id among equal maxima
  Sampling hot{1.0f, 1.0f, 7};
  std::vector<int> counts(4, 0);
  for (int i = 0; i < 20000; ++i) ++counts[static_cast<size_t>(sample(logits, hot, state))];
  // p = softmax(0, 3, 1, 3) = 0.02278, 0.45763, 0.06195, 0.45763; bounds of about 4 standard deviations.
  EXPECT_NEAR(counts[0] / 20000.0, 0.02278, 0.005);
  EXPECT_NEAR(counts[1] / 20000.0, 0.45763, 0.015);
  EXPECT_NEAR(counts[2] / 20000.0, 0.06195, 0.007);
  Sampling nucleus{1.0f, 0.5f, 7};
  for (int i = 0; i < 200; ++i) {
    const Token t = sample(logits, nucleus, state);
    EXPECT_TRUE(t == 1 || t == 3);
  }
}

/// The tokens of the first `n` tokens of the built-in calibration text.
std::vector<Token> text_tokens(const Model& model, size_t n) {
  const Tokenizer& tok = model.tokenizer();
  std::vector<Token> tokens;
  if (tok.add_bos()) tokens.push_back(tok.bos());
  const auto text = tok.encode(kCalibrationText, false);
  tokens.insert(tokens.end(), text.begin(), text.end());
  tokens.resize(std::min(n, tokens.size()));
  return tokens;
}

/// Windows learnt on the model's own KV of the first 256 tokens of the calibration text.
CalibrationTable test_calibration(const Model& model, ThreadPool& pool) {
  CacheConfig config;
  config.geometry = cache_geometry(model.config(), false);
  config.format = CacheFormat::bf16;
  config.budget_bytes = worst_case_budget(config.geometry, CacheFormat::bf16, nullptr, 256);
  KvCache cache(std::move(config));
  Session session(model, pool, cache);
  session.forward(text_tokens(model, 256));
  const KvDump dump = session.kv_dump();
  const KvDump* dumps[] = {&dump};
  return calibrate(dumps);
}

/// A cache for `tokens` tokens of `model`; gaac caches use `table`.
KvCache test_cache(const Model& model, int tokens, CacheFormat format, bool keep_all, const CalibrationTable* table = nullptr) {
  CacheConfig config;
  config.geometry = cache_geometry(model.config(), !keep_all);
  config.format = format;
  config.calibration = table;
  config.budget_bytes = worst_case_budget(config.geometry, format, table, tokens);
  return KvCache(std::move(config));
}

/// Captures the KV of a short text and checks it survives compression bit for bit.
void capture_round_trip(const std::string& path, int expected_layers, int expected_heads, int expected_dim) {
  const auto model = Model::load(path);
  ThreadPool pool(0);
  KvCache cache = test_cache(*model, 256, CacheFormat::bf16, true);
  Session session(*model, pool, cache);
  const Tokenizer& tok = model->tokenizer();
  std::vector<Token> tokens;
  if (tok.add_bos()) tokens.push_back(tok.bos());
  const auto text = tok.encode(
      "The quick brown fox jumps over the lazy dog. Lossless compression keeps every bit of the cache, "
      "so attention sees exactly the values it would have seen without it.");
  tokens.insert(tokens.end(), text.begin(), text.end());
  session.forward(std::span(tokens).first(tokens.size() / 2));
  session.forward(std::span(tokens).subspan(tokens.size() / 2));
  const KvDump dump = session.kv_dump();
  ASSERT_EQ(static_cast<int>(dump.layers.size()), expected_layers);
  EXPECT_EQ(dump.kv_heads(), expected_heads);
  EXPECT_EQ(dump.head_dim(), expected_dim);
  EXPECT_EQ(dump.layers[0].k.tokens, static_cast<int>(tokens.size()));
  const KvDump* dumps[] = {&dump};
  const CalibrationTable table = calibrate(dumps);
  const Snapshot restored = parse_snapshot(snapshot_image(dump, table), "capture");
  for (size_t l = 0; l < dump.layers.size(); ++l) {
    ASSERT_EQ(restored.dump.layers[l].k.data, dump.layers[l].k.data) << "layer " << l;
    ASSERT_EQ(restored.dump.layers[l].v.data, dump.layers[l].v.data) << "layer " << l;
  }
}

// Golden greedy continuations. Produced by llama.cpp (llama-cpp-python 0.3.36, BF16 KV cache, flash
// attention, weights as stored, micro-batches of 4) with
//   gaac validate -m MODEL --text PROMPT.txt --write-tokens prompt.txt   (PROMPT.txt: kGoldenPrompt, no newline)
//   python3 scripts/reference_logits.py greedy MODEL prompt.txt 32
// The prompt ids are checked too, so a tokenizer change is reported as such.
constexpr const char* kGoldenPrompt = "The three most important ideas in the history of computing are";

/// The prompt's ids as `gaac validate` makes them, then `n` greedy tokens from the engine, the prompt
/// given at once and each new token on its own (as the reference was run).
std::pair<std::vector<Token>, std::vector<Token>> greedy_continuation(const std::string& path, int n, CacheFormat format) {
  const auto model = Model::load(path);
  ThreadPool pool(0);
  const CalibrationTable table = format == CacheFormat::gaac ? test_calibration(*model, pool) : CalibrationTable();
  KvCache cache = test_cache(*model, 64, format, false, &table);
  Session session(*model, pool, cache);
  const Tokenizer& tok = model->tokenizer();
  std::vector<Token> prompt;
  if (tok.add_bos()) prompt.push_back(tok.bos());
  const auto text = tok.encode(kGoldenPrompt, false);
  prompt.insert(prompt.end(), text.begin(), text.end());
  std::vector<Token> out;
  std::vector<float> logits = session.forward(prompt);
  uint64_t state = 0;
  for (int i = 0; i < n; ++i) {
    const Token next = sample(logits, Sampling{}, state);
    out.push_back(next);
    logits = session.forward(std::span(&out.back(), 1));
  }
  return {prompt, out};
}

TEST(Engine, SmolLm2GreedyTokensMatchLlamaCpp) {
  GAAC_REQUIRE_MODEL(path, "smollm2");
  for (const CacheFormat format : {CacheFormat::bf16, CacheFormat::gaac}) {
  SCOPED_TRACE(to_string(format));
  const auto [prompt, tokens] = greedy_continuation(path, 32, format);
  EXPECT_EQ(prompt, (std::vector<Token>{504, 1296, 768, 1070, 2821, 281, 260, 1463, 282, 7867, 359}));
  EXPECT_EQ(tokens, (std::vector<Token>{260, 10531, 282, 260, 2583, 28, 260, 10531, 282, 260, 5594, 28, 284, 260, 10531, 282,
                                        260, 17030, 30, 198, 198, 504, 10531, 282, 260, 2583, 314, 1129, 10866, 288, 2322,
                                        28516}));
  }
}

TEST(Engine, Gemma3GreedyTokensMatchLlamaCpp) {
  GAAC_REQUIRE_MODEL(path, "gemma3");
  for (const CacheFormat format : {CacheFormat::bf16, CacheFormat::gaac}) {
  SCOPED_TRACE(to_string(format));
  const auto [prompt, tokens] = greedy_continuation(path, 32, format);
  EXPECT_EQ(prompt, (std::vector<Token>{2, 818, 1806, 1346, 2132, 6549, 528, 506, 4083, 529, 20124, 659}));
  EXPECT_EQ(tokens, (std::vector<Token>{236787, 108, 236829, 236743, 198, 818, 9513, 207, 107, 236829, 236743, 198, 818,
                                        4109, 45735, 6940, 207, 107, 236829, 236743, 198, 818, 4109, 45735, 6940, 207,
                                        108, 818, 9513, 563, 506, 1902}));
  }
}

/// The same text through a GAAC and a BF16 cache (a prefill, then tokens one by one, then a second
/// prefill): every logit identical, and the GAAC cache holds most tiles compressed.
void identical_logits(const std::string& path, size_t n, size_t prefill, size_t singles) {
  const auto model = Model::load(path);
  ThreadPool pool(0);
  const CalibrationTable table = test_calibration(*model, pool);
  const std::vector<Token> tokens = text_tokens(*model, n);
  ASSERT_EQ(tokens.size(), n);
  KvCache gaac = test_cache(*model, static_cast<int>(n), CacheFormat::gaac, false, &table);
  KvCache bf16 = test_cache(*model, static_cast<int>(n), CacheFormat::bf16, false);
  Session a(*model, pool, gaac), b(*model, pool, bf16);
  const auto span = std::span(tokens);
  const auto expect_same = [](const std::vector<float>& x, const std::vector<float>& y, const std::string& where) {
    ASSERT_EQ(x.size(), y.size());
    ASSERT_EQ(std::memcmp(x.data(), y.data(), x.size() * sizeof(float)), 0) << where;
  };
  expect_same(a.forward(span.first(prefill), true), b.forward(span.first(prefill), true), "prefill");
  for (size_t i = prefill; i < prefill + singles; ++i) {
    expect_same(a.forward(span.subspan(i, 1)), b.forward(span.subspan(i, 1)), "token " + std::to_string(i));
  }
  expect_same(a.forward(span.subspan(prefill + singles), true), b.forward(span.subspan(prefill + singles), true), "second prefill");
  const CacheUsage u = gaac.usage();
  EXPECT_GT(u.compressed_tiles, 4 * u.raw_tiles);  // windows from 256 tokens: positions past them drift (RoPE)
  EXPECT_LT(u.resident_bytes(), bf16.usage().resident_bytes());
}

TEST(Engine, SmolLm2LogitsAreIdenticalWithEitherCache) {
  GAAC_REQUIRE_MODEL(path, "smollm2");
  identical_logits(path, 300, 173, 20);
}

TEST(Engine, Gemma3LogitsAreIdenticalWithEitherCache) {
  GAAC_REQUIRE_MODEL(path, "gemma3");
  identical_logits(path, 560, 413, 20);  // past 512 tokens: the sliding layers release blocks
}

/// A prompt in one pass and in passes of uneven sizes (query tiles that cross the cache's end, cached
/// blocks that several tiles read), over a BF16 and a GAAC cache: every logit identical.
void passes_equal_one_pass(const std::string& path, size_t n) {
  const auto model = Model::load(path);
  ThreadPool pool(2);
  const CalibrationTable table = test_calibration(*model, pool);
  const std::vector<Token> tokens = text_tokens(*model, n);
  ASSERT_EQ(tokens.size(), n);
  KvCache whole = test_cache(*model, static_cast<int>(n), CacheFormat::bf16, false);
  const std::vector<float> want = Session(*model, pool, whole).forward(tokens, true);
  for (const CacheFormat format : {CacheFormat::bf16, CacheFormat::gaac}) {
    SCOPED_TRACE(to_string(format));
    KvCache cache = test_cache(*model, static_cast<int>(n), format, false, &table);
    Session session(*model, pool, cache);
    std::vector<float> got;
    for (size_t at = 0, i = 0; at < n; ++i) {
      const size_t sizes[] = {37, 1, 70, 16, 3};
      const size_t take = std::min(sizes[i % 5], n - at);
      const std::vector<float> logits = session.forward(std::span(tokens).subspan(at, take), true);
      got.insert(got.end(), logits.begin(), logits.end());
      at += take;
    }
    ASSERT_EQ(got.size(), want.size());
    EXPECT_EQ(std::memcmp(got.data(), want.data(), got.size() * sizeof(float)), 0);
  }
}

TEST(Engine, SmolLm2PromptInPassesEqualsOnePass) {
  GAAC_REQUIRE_MODEL(path, "smollm2");
  passes_equal_one_pass(path, 200);
}

TEST(Engine, SmolLm2CaptureRoundTripsBitExact) {
  GAAC_REQUIRE_MODEL(path, "smollm2");
  capture_round_trip(path, 30, 3, 64);
}

TEST(Engine, Gemma3CaptureRoundTripsBitExact) {
  GAAC_REQUIRE_MODEL(path, "gemma3");
  capture_round_trip(path, 18, 1, 256);
}

}  // namespace
}  // namespace gaac::model
