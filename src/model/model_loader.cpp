// Model::load: configuration from GGUF metadata and weight views checked against it.
#include <cmath>
#include <string>

#include "gaac/error.hpp"
#include "model/model.hpp"
#include "model/quants.hpp"

namespace gaac::model {
namespace {

// Gemma 3 stores only the global RoPE base; its sliding-window layers use 10,000 (fixed by the model).
constexpr float kGemma3LocalRopeBase = 10000.0f;
// Every sixth Gemma 3 layer attends globally.
constexpr int kGemma3GlobalEvery = 6;

ModelConfig read_config(const GgufFile& f) {
  ModelConfig c;
  const std::string arch = f.get_string("general.architecture");
  if (arch == "llama") {
    c.arch = Architecture::llama;
  } else if (arch == "gemma3") {
    c.arch = Architecture::gemma3;
  } else {
    throw Error(f.label() + ": architecture '" + arch + "' is not supported (llama, gemma3)");
  }
  const auto key = [&](const char* name) { return arch + "." + name; };
  c.layers = static_cast<int>(f.get_uint(key("block_count")));
  c.d_model = static_cast<int>(f.get_uint(key("embedding_length")));
  c.d_ff = static_cast<int>(f.get_uint(key("feed_forward_length")));
  c.heads = static_cast<int>(f.get_uint(key("attention.head_count")));
  c.kv_heads = static_cast<int>(f.get_uint(key("attention.head_count_kv")));
  c.context = static_cast<int>(f.get_uint(key("context_length")));
  c.rms_eps = static_cast<float>(f.get_float(key("attention.layer_norm_rms_epsilon")));
  c.head_dim = f.find(key("attention.key_length")) ? static_cast<int>(f.get_uint(key("attention.key_length")))
                                                     : c.d_model / std::max(1, c.heads);
  c.rope_base = f.find(key("rope.freq_base")) ? static_cast<float>(f.get_float(key("rope.freq_base"))) : 10000.0f;
  c.rope_base_local = c.rope_base;
  if (c.arch == Architecture::gemma3) {
    c.neox_rope = true;
    c.rope_base_local = kGemma3LocalRopeBase;
    c.sliding_window = static_cast<int>(f.get_uint(key("attention.sliding_window")));
  }
  const auto tokens = f.get_strings("tokenizer.ggml.tokens");
  c.vocab = static_cast<int>(tokens.size());
  if (c.layers < 1 || c.d_model < 1 || c.heads < 1 || c.kv_heads < 1 || c.heads % c.kv_heads != 0 ||
      c.head_dim < 2 || c.head_dim % 2 != 0 || c.d_ff < 1 || c.vocab < 1) {
    throw Error(f.label() + ": inconsistent hyper-parameters");
  }
  return c;
}

Weight weight(const GgufFile& f, const std::string& name, int64_t cols, int64_t rows) {
  const GgufTensor* t = f.tensor(name);
  if (!t) throw Error(f.label() + ": tensor '" + name + "' is missing");
  if (t->ne.size() != 2 || t->ne[0] != cols || t->ne[1] != rows) {
    throw Error(f.label() + ": tensor '" + name + "' should be " + std::to_string(cols) + " × " + std::to_string(rows));
  }
  if (!supported_type(t->type)) {
    throw Error(f.label() + ": tensor '" + name + "' has unsupported type " + ggml_type_info(t->type).name);
  }
  return {t->type, t->bytes.data(), rows, cols, t->row_bytes()};
}

std::vector<float> vector_weight(const GgufFile& f, const std::string& name, int64_t n) {
  const GgufTensor* t = f.tensor(name);
  if (!t) throw Error(f.label() + ": tensor '" + name + "' is missing");
  if (t->elements() != n) throw Error(f.label() + ": tensor '" + name + "' should have " + std::to_string(n) + " elements");
  if (!supported_type(t->type)) {
    throw Error(f.label() + ": tensor '" + name + "' has unsupported type " + ggml_type_info(t->type).name);
  }
  std::vector<float> out(static_cast<size_t>(n));
  dequantize_row(t->type, t->bytes.data(), out.data(), n);
  return out;
}

}  // namespace

bool ModelConfig::is_sliding(int layer) const {
  return arch == Architecture::gemma3 && sliding_window > 0 && (layer + 1) % kGemma3GlobalEvery != 0;
}

std::unique_ptr<Model> Model::load(const std::string& path) {
  std::unique_ptr<Model> m(new Model());
  m->file_ = GgufFile::open(path);
  const GgufFile& f = m->file_;
  m->config_ = read_config(f);
  const ModelConfig& c = m->config_;
  m->tokenizer_ = Tokenizer::from_gguf(f);
  const int64_t q_width = static_cast<int64_t>(c.heads) * c.head_dim;
  const int64_t kv_width = static_cast<int64_t>(c.kv_heads) * c.head_dim;
  m->embedding_ = weight(f, "token_embd.weight", c.d_model, c.vocab);
  m->output_ = f.tensor("output.weight") ? weight(f, "output.weight", c.d_model, c.vocab) : m->embedding_;
  m->output_norm_ = vector_weight(f, "output_norm.weight", c.d_model);
  for (int l = 0; l < c.layers; ++l) {
    const std::string p = "blk." + std::to_string(l) + ".";
    Layer layer;
    layer.wq = weight(f, p + "attn_q.weight", c.d_model, q_width);
    layer.wk = weight(f, p + "attn_k.weight", c.d_model, kv_width);
    layer.wv = weight(f, p + "attn_v.weight", c.d_model, kv_width);
    layer.wo = weight(f, p + "attn_output.weight", q_width, c.d_model);
    layer.gate = weight(f, p + "ffn_gate.weight", c.d_model, c.d_ff);
    layer.up = weight(f, p + "ffn_up.weight", c.d_model, c.d_ff);
    layer.down = weight(f, p + "ffn_down.weight", c.d_ff, c.d_model);
    layer.attn_norm = vector_weight(f, p + "attn_norm.weight", c.d_model);
    layer.ffn_norm = vector_weight(f, p + "ffn_norm.weight", c.d_model);
    if (c.arch == Architecture::gemma3) {
      layer.q_norm = vector_weight(f, p + "attn_q_norm.weight", c.head_dim);
      layer.k_norm = vector_weight(f, p + "attn_k_norm.weight", c.head_dim);
      layer.post_attn_norm = vector_weight(f, p + "post_attention_norm.weight", c.d_model);
      layer.post_ffn_norm = vector_weight(f, p + "post_ffw_norm.weight", c.d_model);
    }
    m->layers_.push_back(std::move(layer));
  }
  return m;
}

std::string Model::chat_prompt(const std::string& user_message) const {
  if (config_.arch == Architecture::gemma3) {
    return "<start_of_turn>user\n" + user_message + "<end_of_turn>\n<start_of_turn>model\n";
  }
  // SmolLM2's ChatML template, with the system line its template inserts when none is given.
  return "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"
         "<|im_start|>user\n" +
         user_message + "<|im_end|>\n<|im_start|>assistant\n";
}

}  // namespace gaac::model
