// The forward pass of the Llama family and Gemma 3 over a paged KV cache (BF16 or GAAC).
#include <algorithm>
#include <cmath>

#include "gaac/bf16.hpp"
#include "gaac/error.hpp"
#include "model/model.hpp"
#include "model/ops.hpp"
#include "model/quants.hpp"
#include "model/quants_q8.hpp"

namespace gaac::model {

CacheGeometry cache_geometry(const ModelConfig& c, bool release_windows) {
  CacheGeometry g{c.layers, c.kv_heads, c.head_dim, {}};
  if (release_windows) {
    for (int l = 0; l < c.layers; ++l) g.sliding_window.push_back(c.is_sliding(l) ? c.sliding_window : 0);
  }
  return g;
}

Session::Session(const Model& model, ThreadPool& pool, KvCache& cache, AttentionSettings attention)
    : model_(model), pool_(pool), cache_(cache), attention_(attention) {
  const ModelConfig& c = model.config();
  const PagedGeometry& g = cache.geometry();
  if (g.layers != c.layers || g.kv_heads != c.kv_heads || g.head_dim != c.head_dim) {
    throw Error("the KV cache is laid out for " + std::to_string(g.layers) + " layers × " + std::to_string(g.kv_heads) +
                " KV heads × head_dim " + std::to_string(g.head_dim) + ", the model needs " + std::to_string(c.layers) + " × " +
                std::to_string(c.kv_heads) + " × " + std::to_string(c.head_dim));
  }
  sequence_ = cache.add_sequence();
}

Session::~Session() { cache_.free_sequence(sequence_); }

std::vector<float> Session::forward(std::span<const Token> tokens, bool all_logits) {
  Session* self[] = {this};
  const std::span<const Token> batch[] = {tokens};
  return std::move(forward_batch(self, batch, all_logits).front());
}

KvDump Session::kv_dump() const { return cache_.dump(sequence_); }

std::vector<std::vector<float>> forward_batch(std::span<Session* const> sessions, std::span<const std::span<const Token>> tokens,
                                              bool all_logits) {
  if (sessions.size() != tokens.size()) throw Error("forward_batch: one list of tokens per session");
  if (sessions.empty()) return {};
  const Model& model = sessions[0]->model_;
  ThreadPool& pool = sessions[0]->pool_;
  KvCache& cache = sessions[0]->cache_;
  const ModelConfig& c = model.config();
  // Rows of the pass: every session's tokens, one after another.
  std::vector<int64_t> offsets{0};
  for (size_t i = 0; i < sessions.size(); ++i) {
    const Session& session = *sessions[i];
    if (&session.model_ != &model || &session.cache_ != &cache) throw Error("forward_batch: sessions of different models or caches");
    const auto n = static_cast<int64_t>(tokens[i].size());
    if (session.position_ + n > c.context) {
      throw Error("context of " + std::to_string(c.context) + " tokens exceeded (" + std::to_string(session.position_ + n) + ")");
    }
    offsets.push_back(offsets.back() + n);
  }
  const int64_t T = offsets.back();
  std::vector<std::vector<float>> results(sessions.size());
  if (T == 0) return results;
  std::vector<size_t> session_of(static_cast<size_t>(T));
  for (size_t i = 0; i < sessions.size(); ++i) {
    for (int64_t r = offsets[i]; r < offsets[i + 1]; ++r) session_of[static_cast<size_t>(r)] = i;
  }
  const auto position_of = [&](int64_t r) {
    const size_t i = session_of[static_cast<size_t>(r)];
    return sessions[i]->position_ + static_cast<int>(r - offsets[i]);
  };
  const int d = c.d_model, hd = c.head_dim;
  const int q_width = c.heads * hd, kv_width = c.kv_heads * hd;
  const auto rows = [](int64_t t, int width) { return static_cast<size_t>(t) * static_cast<size_t>(width); };

  // As llama.cpp's CPU backend: the activations are converted once per product to the weight's
  // vec_dot_type (Q8_0, Q8_1 or Q8_K with ggml's x86 rounding, or F16/BF16), spread over the pool by
  // tokens, then shared read-only by the threads that compute the product's tiles: 64 tokens by a
  // share of the rows, cut finer only where there are fewer than four tiles per thread. Every value
  // is the same whatever the tiling (matmul_tile_quantized).
  QuantizedActivations xq;
  const int64_t threads = pool.size();
  auto matmul = [&](const Weight& w, const float* x, int64_t n_tokens, float* y) {
    prepare_activations(w.type, w.cols, n_tokens, xq, Q8Rounding::x86);
    pool.parallel_for(n_tokens, 16, [&](int64_t t0, int64_t t1) { quantize_activation_rows(x, t0, t1, xq); });
    constexpr int64_t kTileTokens = 64;
    const int64_t token_tiles = (n_tokens + kTileTokens - 1) / kTileTokens;
    int64_t row_tiles = 1;
    while (token_tiles * row_tiles < 4 * threads && w.rows / (2 * row_tiles) >= 32) row_tiles *= 2;
    const int64_t rows_per = (w.rows / row_tiles + 1) & ~int64_t{1};
    pool.parallel_for(token_tiles * row_tiles, 1, [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) {
        const int64_t t0 = i / row_tiles * kTileTokens, r0 = i % row_tiles * rows_per;
        matmul_tile_quantized(w.type, w.data, w.row_bytes, w.cols, r0, std::min(w.rows, r0 + rows_per), xq, t0,
                              std::min(n_tokens, t0 + kTileTokens), y, w.rows);
      }
    });
  };
  const ParallelFor parallel = [&pool](size_t n, const std::function<void(size_t, size_t)>& body) {
    pool.parallel_for(static_cast<int64_t>(n), 1, [&](int64_t b, int64_t e) { body(static_cast<size_t>(b), static_cast<size_t>(e)); });
  };
  // The per-token arithmetic between the products, spread over the pool.
  const auto each_token = [&pool](int64_t n, const std::function<void(int64_t)>& body) {
    pool.parallel_for(n, 32, [&](int64_t t0, int64_t t1) {
      for (int64_t t = t0; t < t1; ++t) body(t);
    });
  };

  // Embeddings.
  for (int64_t t = 0; t < T; ++t) {
    const Token id = tokens[session_of[static_cast<size_t>(t)]][static_cast<size_t>(t - offsets[session_of[static_cast<size_t>(t)]])];
    if (id < 0 || id >= c.vocab) throw Error("token id " + std::to_string(id) + " outside the vocabulary");
  }
  std::vector<float> x(rows(T, d));
  const Weight& embd = model.embedding();
  each_token(T, [&](int64_t t) {
    const Token id = tokens[session_of[static_cast<size_t>(t)]][static_cast<size_t>(t - offsets[session_of[static_cast<size_t>(t)]])];
    dequantize_row(embd.type, embd.data + static_cast<size_t>(id) * embd.row_bytes, &x[rows(t, d)], d);
    if (c.arch == Architecture::gemma3) {
      const float scale = std::sqrt(static_cast<float>(d));
      for (int i = 0; i < d; ++i) x[rows(t, d) + i] *= scale;
    }
  });

  // The rotary angles of every row, once per base (Gemma 3's sliding layers have their own).
  const auto angles_for = [&](float base) {
    std::vector<float> cs(rows(T, hd));
    each_token(T, [&](int64_t t) { ops::rope_angles(hd, position_of(t), base, &cs[rows(t, hd)]); });
    return cs;
  };
  const std::vector<float> angles = angles_for(c.rope_base);
  const bool local_base = c.sliding_window > 0 && c.rope_base_local != c.rope_base;
  const std::vector<float> angles_local = local_base ? angles_for(c.rope_base_local) : std::vector<float>();

  std::vector<float> h(rows(T, d)), q(rows(T, q_width)), k(rows(T, kv_width)), v(rows(T, kv_width));
  std::vector<float> attn(rows(T, q_width)), o(rows(T, d)), gate(rows(T, c.d_ff)), up(rows(T, c.d_ff));
  // The pass's own K and V rounded to BF16, per layer: attention reads them after the cached ones,
  // and they join the cache once every layer is done.
  std::vector<std::vector<uint16_t>> staged_k(static_cast<size_t>(c.layers)), staged_v(static_cast<size_t>(c.layers));
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  const auto staged_view = [&](const std::vector<uint16_t>& layer_rows, size_t i) {
    const KvView all{layer_rows.data(), static_cast<int>(T), c.kv_heads, hd, static_cast<size_t>(kv_width), static_cast<size_t>(hd)};
    return all.tokens_from(static_cast<int>(offsets[i]), static_cast<int>(offsets[i + 1] - offsets[i]));
  };

  for (int l = 0; l < c.layers; ++l) {
    const Model::Layer& L = model.layers()[static_cast<size_t>(l)];
    const bool sliding = c.is_sliding(l);
    const std::vector<float>& layer_angles = sliding && local_base ? angles_local : angles;

    each_token(T, [&](int64_t t) { ops::rms_norm(&x[rows(t, d)], L.attn_norm.data(), d, c.rms_eps, &h[rows(t, d)]); });
    matmul(L.wq, h.data(), T, q.data());
    matmul(L.wk, h.data(), T, k.data());
    matmul(L.wv, h.data(), T, v.data());

    // Per-head norms (Gemma 3), RoPE, and K/V rounded to BF16.
    auto& kc = staged_k[static_cast<size_t>(l)];
    auto& vc = staged_v[static_cast<size_t>(l)];
    kc.resize(rows(T, kv_width));
    vc.resize(rows(T, kv_width));
    each_token(T, [&](int64_t t) {
      const float* cs = &layer_angles[rows(t, hd)];
      for (int head = 0; head < c.heads; ++head) {
        float* qh = &q[rows(t, q_width) + static_cast<size_t>(head) * hd];
        if (!L.q_norm.empty()) ops::rms_norm(qh, L.q_norm.data(), hd, c.rms_eps, qh);
        ops::rope_rotate(qh, hd, cs, c.neox_rope);
      }
      for (int head = 0; head < c.kv_heads; ++head) {
        float* kh = &k[rows(t, kv_width) + static_cast<size_t>(head) * hd];
        if (!L.k_norm.empty()) ops::rms_norm(kh, L.k_norm.data(), hd, c.rms_eps, kh);
        ops::rope_rotate(kh, hd, cs, c.neox_rope);
      }
      for (int i = 0; i < kv_width; ++i) {
        kc[rows(t, kv_width) + i] = float_to_bf16(k[rows(t, kv_width) + i]);
        vc[rows(t, kv_width) + i] = float_to_bf16(v[rows(t, kv_width) + i]);
      }
    });

    // Causal attention: the cached positions, then the pass's own rows up to each token (sliding
    // layers see the last `sliding_window` positions).
    std::vector<AttentionQuery> queries(static_cast<size_t>(T));
    for (int64_t t = 0; t < T; ++t) {
      const size_t i = session_of[static_cast<size_t>(t)];
      queries[static_cast<size_t>(t)] = {sessions[i]->sequence_, position_of(t), &q[rows(t, q_width)], &attn[rows(t, q_width)],
                                         staged_view(kc, i), staged_view(vc, i)};
    }
    AttentionOptions options;
    options.q_heads = c.heads;
    options.scale = scale;
    options.window = sliding ? c.sliding_window : 0;
    options.path = sessions[0]->attention_.path;
    options.splits = sessions[0]->attention_.splits;
    options.parallel = parallel;
    attend(cache, l, queries, options);

    matmul(L.wo, attn.data(), T, o.data());
    each_token(T, [&](int64_t t) {
      float* ot = &o[rows(t, d)];
      if (!L.post_attn_norm.empty()) ops::rms_norm(ot, L.post_attn_norm.data(), d, c.rms_eps, ot);
      for (int i = 0; i < d; ++i) x[rows(t, d) + i] += ot[i];
      ops::rms_norm(&x[rows(t, d)], L.ffn_norm.data(), d, c.rms_eps, &h[rows(t, d)]);
    });
    matmul(L.gate, h.data(), T, gate.data());
    matmul(L.up, h.data(), T, up.data());
    each_token(T, [&](int64_t t) {
      if (c.arch == Architecture::gemma3) {
        ops::geglu(&gate[rows(t, c.d_ff)], &up[rows(t, c.d_ff)], static_cast<size_t>(c.d_ff));
      } else {
        ops::swiglu(&gate[rows(t, c.d_ff)], &up[rows(t, c.d_ff)], static_cast<size_t>(c.d_ff));
      }
    });
    matmul(L.down, gate.data(), T, o.data());
    each_token(T, [&](int64_t t) {
      float* ot = &o[rows(t, d)];
      if (!L.post_ffn_norm.empty()) ops::rms_norm(ot, L.post_ffn_norm.data(), d, c.rms_eps, ot);
      for (int i = 0; i < d; ++i) x[rows(t, d) + i] += ot[i];
    });
  }

  // The pass's K and V join each session's sequence.
  for (size_t i = 0; i < sessions.size(); ++i) {
    std::vector<KvView> kv(static_cast<size_t>(c.layers)), vv(kv.size());
    for (size_t l = 0; l < kv.size(); ++l) {
      kv[l] = staged_view(staged_k[l], i);
      vv[l] = staged_view(staged_v[l], i);
    }
    const AppendOutcome stored = cache.append(sessions[i]->sequence_, kv, vv);
    if (stored.status != CacheStatus::ok) {
      throw Error(ErrorCode::out_of_space,
                  "the KV cache (" + std::string(to_string(cache.format())) + ") is full: storing " +
                      std::to_string(offsets[i + 1] - offsets[i]) + " more tokens at position " +
                      std::to_string(sessions[i]->position_) + " needs a budget of " +
                      (stored.measured ? "" : "at least ") + std::to_string(stored.budget_needed) + " bytes; the budget is " +
                      std::to_string(cache.usage().budget_bytes) + " bytes");
    }
    sessions[i]->position_ += static_cast<int>(offsets[i + 1] - offsets[i]);
  }

  // Output: final norm and the vocabulary projection, for each session's last token or all of them.
  std::vector<int64_t> wanted;
  for (size_t i = 0; i < sessions.size(); ++i) {
    for (int64_t r = all_logits ? offsets[i] : offsets[i + 1] - 1; r < offsets[i + 1]; ++r) wanted.push_back(r);
  }
  const auto n = static_cast<int64_t>(wanted.size());
  std::vector<float> normed(rows(n, d));
  each_token(n, [&](int64_t t) {
    ops::rms_norm(&x[rows(wanted[static_cast<size_t>(t)], d)], model.output_norm().data(), d, c.rms_eps, &normed[rows(t, d)]);
  });
  std::vector<float> logits(rows(n, c.vocab));
  matmul(model.output(), normed.data(), n, logits.data());
  for (int64_t t = 0; t < n; ++t) {
    std::vector<float>& r = results[session_of[static_cast<size_t>(wanted[static_cast<size_t>(t)])]];
    r.insert(r.end(), logits.begin() + static_cast<std::ptrdiff_t>(rows(t, c.vocab)),
             logits.begin() + static_cast<std::ptrdiff_t>(rows(t + 1, c.vocab)));
  }
  return results;
}

Token sample(std::span<const float> logits, const Sampling& sampling, uint64_t& state) {
  if (logits.empty()) throw Error("no logits to sample from");
  if (sampling.temperature <= 0.0f) {
    return static_cast<Token>(std::max_element(logits.begin(), logits.end()) - logits.begin());
  }
  // Softmax at the temperature, then the nucleus: the most probable tokens up to top_p.
  std::vector<std::pair<float, Token>> probs(logits.size());
  const float top = *std::max_element(logits.begin(), logits.end());
  double total = 0;
  for (size_t i = 0; i < logits.size(); ++i) {
    const float p = std::exp((logits[i] - top) / sampling.temperature);
    probs[i] = {p, static_cast<Token>(i)};
    total += p;
  }
  std::sort(probs.begin(), probs.end(), [](const auto& a, const auto& b) { return a.first > b.first || (a.first == b.first && a.second < b.second); });
  double kept = 0;
  size_t n = 0;
  while (n < probs.size() && (n == 0 || kept / total < sampling.top_p)) kept += probs[n++].first;
  // splitmix64 step: a uniform draw in [0, kept).
  uint64_t z = (state += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  z ^= z >> 31;
  double r = static_cast<double>(z >> 11) * 0x1.0p-53 * kept;
  for (size_t i = 0; i < n; ++i) {
    r -= probs[i].first;
    if (r < 0) return probs[i].second;
  }
  return probs[n - 1].second;
}

}  // namespace gaac::model
