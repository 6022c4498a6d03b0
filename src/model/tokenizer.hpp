// Tokenizers read from a GGUF file: byte-level BPE with a GPT-2 style pre-tokenizer
// (`tokenizer.ggml.model = gpt2`, SmolLM2) and SentencePiece-style BPE over scores with byte
// fallback (`tokenizer.ggml.model = llama`, Gemma 3).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "model/gguf.hpp"

namespace gaac::model {

/// A token id.
using Token = int32_t;

/// Text ↔ token ids for one model.
class Tokenizer {
 public:
  virtual ~Tokenizer() = default;

  /// Builds the tokenizer the file's `tokenizer.ggml.model` names; throws gaac::Error for unknown
  /// kinds or malformed vocabularies.
  static std::unique_ptr<Tokenizer> from_gguf(const GgufFile& file);

  /// Token ids of `text`, as llama.cpp's tokenizer gives them. Special tokens written in the text
  /// (control tokens such as "<|im_start|>") are recognised as single tokens when `parse_special` is
  /// true; user-defined tokens (Gemma 3's "<h1>", runs of spaces, newlines or tabs) always are.
  /// No BOS is added (see bos()).
  virtual std::vector<Token> encode(std::string_view text, bool parse_special = true) const = 0;
  /// The text of one token (bytes, possibly an incomplete UTF-8 sequence); special tokens give their
  /// written form ("<|im_end|>"). Throws gaac::Error for ids outside the vocabulary.
  virtual std::string token_text(Token token) const = 0;
  /// Concatenated text of tokens: decode(encode(s)) == s for any valid UTF-8 s, except where the
  /// vocabulary cannot spell it: a byte-level vocabulary missing some bytes drops them, as llama.cpp
  /// does (SmolLM2 has no token for the control characters U+0004, U+0006, U+0013, U+0014, U+0016,
  /// U+001D nor for code points of planes 4 to 11), a SentencePiece vocabulary reads U+2581 as a
  /// space, and one with `add_space_prefix` gains a space before each run of text.
  std::string decode(const std::vector<Token>& tokens) const;

  /// Vocabulary size.
  virtual int32_t vocab_size() const = 0;
  /// Beginning-of-sequence token, and whether the model expects it prepended.
  virtual Token bos() const = 0;
  virtual bool add_bos() const = 0;
  /// End-of-sequence token.
  virtual Token eos() const = 0;
  /// True for tokens that end a turn or the text (EOS, "<|im_end|>", "<end_of_turn>").
  virtual bool is_end_of_generation(Token token) const = 0;
  /// "gpt2" or "llama".
  virtual const char* kind() const = 0;
};

}  // namespace gaac::model
