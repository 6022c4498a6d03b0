// The forward pass of the Llama family and Gemma 3 over a BF16 KV cache.
#include <algorithm>
#include <cmath>

#include "gaac/bf16.hpp"
#include "gaac/error.hpp"
#include "model/model.hpp"
#include "model/ops.hpp"
#include "model/quants.hpp"
#include "model/quants_q8.hpp"

namespace gaac::model {
Session::Session(const Model& model, ThreadPool& pool)
    : model_(model), pool_(pool), k_cache_(model.config().layers), v_cache_(model.config().layers) {}

std::vector<float> Session::forward(std::span<const Token> tokens, bool all_logits) {
  const ModelConfig& c = model_.config();
  const auto T = static_cast<int64_t>(tokens.size());
  if (T == 0) return {};
  if (position_ + T > c.context) {
    throw Error("context of " + std::to_string(c.context) + " tokens exceeded (" + std::to_string(position_ + T) + ")");
  }
  const int d = c.d_model, hd = c.head_dim;
  const int q_width = c.heads * hd, kv_width = c.kv_heads * hd;
  const auto rows = [](int64_t t, int width) { return static_cast<size_t>(t) * static_cast<size_t>(width); };

  // As llama.cpp's CPU backend: the activations are converted once per product to the weight's
  // vec_dot_type (Q8_0, Q8_1 or Q8_K with ggml's x86 rounding, or F16/BF16), spread over the pool by
  // tokens, then shared read-only by the threads that split the rows.
  QuantizedActivations xq;
  auto matmul = [&](const Weight& w, const float* x, int64_t n_tokens, float* y) {
    prepare_activations(w.type, w.cols, n_tokens, xq, Q8Rounding::x86);
    pool_.parallel_for(n_tokens, 8, [&](int64_t t0, int64_t t1) { quantize_activation_rows(x, t0, t1, xq); });
    pool_.parallel_for(w.rows, 16, [&](int64_t r0, int64_t r1) {
      matmul_rows_quantized(w.type, w.data, w.row_bytes, w.cols, r0, r1, xq, y, w.rows);
    });
  };

  // Embeddings.
  std::vector<float> x(rows(T, d));
  const Weight& embd = model_.embedding();
  for (int64_t t = 0; t < T; ++t) {
    const Token id = tokens[static_cast<size_t>(t)];
    if (id < 0 || id >= c.vocab) throw Error("token id " + std::to_string(id) + " outside the vocabulary");
    dequantize_row(embd.type, embd.data + static_cast<size_t>(id) * embd.row_bytes, &x[rows(t, d)], d);
    if (c.arch == Architecture::gemma3) {
      const float scale = std::sqrt(static_cast<float>(d));
      for (int i = 0; i < d; ++i) x[rows(t, d) + i] *= scale;
    }
  }

  std::vector<float> h(rows(T, d)), q(rows(T, q_width)), k(rows(T, kv_width)), v(rows(T, kv_width));
  std::vector<float> attn(rows(T, q_width)), o(rows(T, d)), gate(rows(T, c.d_ff)), up(rows(T, c.d_ff));
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  const int group = c.heads / c.kv_heads;

  for (int l = 0; l < c.layers; ++l) {
    const Model::Layer& L = model_.layers()[static_cast<size_t>(l)];
    const bool sliding = c.is_sliding(l);
    const float base = sliding ? c.rope_base_local : c.rope_base;

    for (int64_t t = 0; t < T; ++t) ops::rms_norm(&x[rows(t, d)], L.attn_norm.data(), d, c.rms_eps, &h[rows(t, d)]);
    matmul(L.wq, h.data(), T, q.data());
    matmul(L.wk, h.data(), T, k.data());
    matmul(L.wv, h.data(), T, v.data());

    // Per-head norms (Gemma 3), RoPE, and K/V into the cache rounded to BF16.
    auto& kc = k_cache_[static_cast<size_t>(l)];
    auto& vc = v_cache_[static_cast<size_t>(l)];
    kc.resize(rows(position_ + T, kv_width));
    vc.resize(rows(position_ + T, kv_width));
    for (int64_t t = 0; t < T; ++t) {
      const int pos = position_ + static_cast<int>(t);
      for (int head = 0; head < c.heads; ++head) {
        float* qh = &q[rows(t, q_width) + static_cast<size_t>(head) * hd];
        if (!L.q_norm.empty()) ops::rms_norm(qh, L.q_norm.data(), hd, c.rms_eps, qh);
        ops::rope(qh, hd, pos, base, c.neox_rope);
      }
      for (int head = 0; head < c.kv_heads; ++head) {
        float* kh = &k[rows(t, kv_width) + static_cast<size_t>(head) * hd];
        if (!L.k_norm.empty()) ops::rms_norm(kh, L.k_norm.data(), hd, c.rms_eps, kh);
        ops::rope(kh, hd, pos, base, c.neox_rope);
      }
      for (int i = 0; i < kv_width; ++i) {
        kc[rows(pos, kv_width) + i] = float_to_bf16(k[rows(t, kv_width) + i]);
        vc[rows(pos, kv_width) + i] = float_to_bf16(v[rows(t, kv_width) + i]);
      }
    }

    // Causal attention over the cache (sliding layers see the last `sliding_window` positions).
    pool_.parallel_for(T * c.heads, 1, [&](int64_t begin, int64_t end) {
      std::vector<float> scratch;
      for (int64_t job = begin; job < end; ++job) {
        const int64_t t = job / c.heads;
        const int head = static_cast<int>(job % c.heads), kv = head / group;
        const int pos = position_ + static_cast<int>(t);
        ops::AttentionQuery query;
        query.q = &q[rows(t, q_width) + static_cast<size_t>(head) * hd];
        query.keys = &kc[static_cast<size_t>(kv) * hd];
        query.values = &vc[static_cast<size_t>(kv) * hd];
        query.stride = static_cast<size_t>(kv_width);
        query.head_dim = hd;
        query.first = sliding ? std::max(0, pos - c.sliding_window + 1) : 0;
        query.last = pos;
        query.scale = scale;
        ops::attend(query, &attn[rows(t, q_width) + static_cast<size_t>(head) * hd], scratch);
      }
    });

    matmul(L.wo, attn.data(), T, o.data());
    for (int64_t t = 0; t < T; ++t) {
      float* ot = &o[rows(t, d)];
      if (!L.post_attn_norm.empty()) ops::rms_norm(ot, L.post_attn_norm.data(), d, c.rms_eps, ot);
      for (int i = 0; i < d; ++i) x[rows(t, d) + i] += ot[i];
      ops::rms_norm(&x[rows(t, d)], L.ffn_norm.data(), d, c.rms_eps, &h[rows(t, d)]);
    }
    matmul(L.gate, h.data(), T, gate.data());
    matmul(L.up, h.data(), T, up.data());
    if (c.arch == Architecture::gemma3) {
      ops::geglu(gate.data(), up.data(), gate.size());
    } else {
      ops::swiglu(gate.data(), up.data(), gate.size());
    }
    matmul(L.down, gate.data(), T, o.data());
    for (int64_t t = 0; t < T; ++t) {
      float* ot = &o[rows(t, d)];
      if (!L.post_ffn_norm.empty()) ops::rms_norm(ot, L.post_ffn_norm.data(), d, c.rms_eps, ot);
      for (int i = 0; i < d; ++i) x[rows(t, d) + i] += ot[i];
    }
  }
  position_ += static_cast<int>(T);

  // Output: final norm and the vocabulary projection, for the last token or all of them.
  const int64_t first = all_logits ? 0 : T - 1;
  const int64_t n = T - first;
  std::vector<float> normed(rows(n, d));
  for (int64_t t = 0; t < n; ++t) {
    ops::rms_norm(&x[rows(first + t, d)], model_.output_norm().data(), d, c.rms_eps, &normed[rows(t, d)]);
  }
  std::vector<float> logits(rows(n, c.vocab));
  matmul(model_.output(), normed.data(), n, logits.data());
  return logits;
}

KvDump Session::kv_dump() const {
  const ModelConfig& c = model_.config();
  KvDump dump;
  for (int l = 0; l < c.layers; ++l) {
    KvLayer layer;
    layer.k = {position_, c.kv_heads, c.head_dim, k_cache_[static_cast<size_t>(l)]};
    layer.v = {position_, c.kv_heads, c.head_dim, v_cache_[static_cast<size_t>(l)]};
    dump.layers.push_back(std::move(layer));
  }
  return dump;
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
