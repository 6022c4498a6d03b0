// A small CPU inference engine for the Llama family and Gemma 3, reading GGUF files, whose purpose
// is to produce real KV caches: K and V are rounded to BF16 when written to the cache, as an engine
// with a BF16 cache does; logits are fp32.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "gaac/attention.hpp"
#include "gaac/kv_cache.hpp"
#include "gaac/kv_dump.hpp"
#include "model/gguf.hpp"
#include "model/thread_pool.hpp"
#include "model/tokenizer.hpp"

namespace gaac::model {

/// Architectures the engine runs.
enum class Architecture { llama, gemma3 };

/// Hyper-parameters of a model, read from its GGUF metadata.
struct ModelConfig {
  Architecture arch = Architecture::llama;
  int layers = 0;
  int d_model = 0;
  int d_ff = 0;
  int heads = 0;
  int kv_heads = 0;
  int head_dim = 0;
  int vocab = 0;
  int context = 0;
  float rms_eps = 1e-5f;
  float rope_base = 10000.0f;        ///< RoPE base of full-attention layers
  float rope_base_local = 10000.0f;  ///< RoPE base of sliding-window layers (Gemma 3)
  int sliding_window = 0;            ///< 0: every layer attends to the whole context
  bool neox_rope = false;            ///< rotate pairs (i, i + d/2) instead of (2i, 2i + 1)

  /// True when layer `layer` uses sliding-window attention (Gemma 3: all but every sixth).
  bool is_sliding(int layer) const;
};

/// One weight matrix: `rows` rows of `cols` elements of `type`, `row_bytes` apart, in the file's bytes.
struct Weight {
  GgmlType type = GgmlType::f32;
  const uint8_t* data = nullptr;
  int64_t rows = 0;
  int64_t cols = 0;
  size_t row_bytes = 0;
};

/// A loaded model: configuration, tokenizer and weights (views into the file's bytes, held in memory).
class Model {
 public:
  /// Opens a GGUF file and checks that every tensor the architecture needs is there with the
  /// expected shape and a supported type; throws gaac::Error otherwise.
  static std::unique_ptr<Model> load(const std::string& path);

  const ModelConfig& config() const { return config_; }
  const Tokenizer& tokenizer() const { return *tokenizer_; }
  /// The chat prompt for one user message, in the model's template, ending where the assistant's
  /// answer begins.
  std::string chat_prompt(const std::string& user_message) const;

  /// Per-layer weights.
  struct Layer {
    Weight wq, wk, wv, wo, gate, up, down;
    std::vector<float> attn_norm, ffn_norm, q_norm, k_norm, post_attn_norm, post_ffn_norm;
  };
  const std::vector<Layer>& layers() const { return layers_; }
  const Weight& embedding() const { return embedding_; }
  const Weight& output() const { return output_; }
  const std::vector<float>& output_norm() const { return output_norm_; }

 private:
  Model() = default;
  GgufFile file_{};
  ModelConfig config_;
  std::unique_ptr<Tokenizer> tokenizer_;
  std::vector<Layer> layers_;
  Weight embedding_, output_;
  std::vector<float> output_norm_;
};

/// The geometry of a model's KV cache. With `release_windows`, the cache frees blocks that fall out
/// of a sliding layer's window; without, it keeps every position (to write the whole cache out).
CacheGeometry cache_geometry(const ModelConfig& config, bool release_windows = true);

/// How a session's attention reads the cache.
struct AttentionSettings {
  AttentionPath path = AttentionPath::fused;
  /// Context ranges per (token, KV head): 1 keeps llama.cpp's order of operations (and its logits).
  int splits = 1;
};

/// One sequence being processed: its tokens' K and V live in a KvCache (BF16 or GAAC), which the
/// session reads through gaac::attend and extends after each forward pass.
class Session {
 public:
  /// A session on `model` whose KV is a new sequence of `cache` (laid out for the model, see
  /// cache_geometry), freed when the session ends. `pool` runs its parallel loops.
  Session(const Model& model, ThreadPool& pool, KvCache& cache, AttentionSettings attention = {});
  ~Session();
  Session(const Session&) = delete;
  Session& operator=(const Session&) = delete;

  /// Runs `tokens` at the next positions and appends their K and V to the cache. Returns the logits
  /// of the last token, or of every token (`tokens.size()` × vocab, row-major) when `all_logits`.
  /// Throws gaac::Error when the cache has no room for them (saying how much it needs); the session
  /// and the cache are then unchanged.
  std::vector<float> forward(std::span<const Token> tokens, bool all_logits = false);

  /// Tokens processed so far.
  int position() const { return position_; }
  /// The cache as a KV dump: per layer K (post-RoPE) and V, `[tokens, kv_heads, head_dim]` BF16.
  KvDump kv_dump() const;
  /// The sequence of the cache this session writes.
  SequenceId sequence() const { return sequence_; }
  const Model& model() const { return model_; }

 private:
  friend std::vector<std::vector<float>> forward_batch(std::span<Session* const>, std::span<const std::span<const Token>>, bool);
  const Model& model_;
  ThreadPool& pool_;
  KvCache& cache_;
  AttentionSettings attention_;
  SequenceId sequence_;
  int position_ = 0;
};

/// One forward pass over several sessions of one model sharing one cache and one pool, as a server
/// steps its running sequences: `tokens[i]` are session i's next tokens. The weights are read once
/// for all of them; each session's arithmetic is exactly that of its own forward(). Returns per
/// session what forward() would. When the cache cannot take every session's tokens it throws
/// gaac::Error (ErrorCode::out_of_space) saying the budget that storing them needs and the budget
/// given; the sessions stored before the one that failed keep their tokens.
std::vector<std::vector<float>> forward_batch(std::span<Session* const> sessions, std::span<const std::span<const Token>> tokens,
                                              bool all_logits = false);

/// How to pick the next token.
struct Sampling {
  float temperature = 0.0f;  ///< 0: greedy (arg-max, lowest id on ties)
  float top_p = 1.0f;        ///< nucleus: smallest set of top tokens whose probability reaches top_p
  uint64_t seed = 0;
};

/// Picks a token from logits; `state` carries the random stream between calls.
Token sample(std::span<const float> logits, const Sampling& sampling, uint64_t& state);

}  // namespace gaac::model
