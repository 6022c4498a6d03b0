// Parts shared by the tokenizer implementations (tokenizer.cpp, tokenizer_bpe.cpp, tokenizer_spm.cpp):
// the vocabulary read from GGUF, special-token partitioning, end-of-generation tokens, UTF-8 decoding
// and the Unicode classes of the pre-tokenizer. Private to the library.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "model/gguf.hpp"
#include "model/tokenizer.hpp"

namespace gaac::model::detail {

// ---- Unicode ----------------------------------------------------------------------------------

/// Flags of a code point (see scripts/gen_unicode_tables.py).
enum UnicodeFlag : uint8_t { kLetter = 1, kNumber = 2, kWhitespace = 4 };

/// One entry of the generated table: flags of the code points from `first` up to the next entry.
struct UnicodeRange {
  uint32_t first;
  uint8_t flags;
};
extern const UnicodeRange kUnicodeRanges[];
extern const size_t kUnicodeRangeCount;

/// Flags of a code point; 0 (neither letter, number nor whitespace) for values past U+10FFFF.
uint8_t unicode_flags(uint32_t cp);

/// Bytes of a UTF-8 sequence as announced by its first byte (1 for continuation or invalid bytes).
size_t utf8_sequence_length(uint8_t lead);

/// One code point of a text and the bytes it came from. A byte that does not start a valid UTF-8
/// sequence decodes alone, as kInvalidCodePoint (a code point with no flags).
struct CodePoint {
  uint32_t cp;
  uint32_t offset;
  uint32_t length;
};
inline constexpr uint32_t kInvalidCodePoint = 0xFFFFFFFFu;
std::vector<CodePoint> decode_utf8(std::string_view text);

// ---- Vocabulary -------------------------------------------------------------------------------

/// Token kinds of `tokenizer.ggml.token_type` (values as in llama.cpp's GGUF files).
enum class TokenType : int32_t {
  undefined = 0, normal = 1, unknown = 2, control = 3, user_defined = 4, unused = 5, byte = 6,
};

/// Base of both tokenizer kinds: the vocabulary, special tokens, BOS/EOS/end-of-generation. Raw text
/// between special tokens is handed to encode_text().
class VocabTokenizer : public Tokenizer {
 public:
  /// Reads tokens, token types, BOS/EOS and the end-of-generation set. `default_add_bos` applies when
  /// the file has no `tokenizer.ggml.add_bos_token`.
  VocabTokenizer(const GgufFile& file, bool default_add_bos);
  // Holds views into its own strings: neither copied nor moved.
  VocabTokenizer(const VocabTokenizer&) = delete;
  VocabTokenizer& operator=(const VocabTokenizer&) = delete;

  std::vector<Token> encode(std::string_view text, bool parse_special = true) const final;
  std::string token_text(Token token) const final;
  int32_t vocab_size() const final { return static_cast<int32_t>(texts_.size()); }
  Token bos() const final { return bos_; }
  bool add_bos() const final { return add_bos_; }
  Token eos() const final { return eos_; }
  bool is_end_of_generation(Token token) const final { return eog_.count(token) != 0; }

 protected:
  /// Appends the tokens of `text`, a run of the input between special tokens (never empty).
  /// `after_special` is true for the first run and for runs that follow a special token.
  virtual void encode_text(std::string_view text, bool after_special, std::vector<Token>& out) const = 0;

  /// The token whose vocabulary text is exactly `text`, or -1.
  Token find(std::string_view text) const;
  /// Throws gaac::Error naming the file.
  [[noreturn]] void fail(const std::string& message) const;

  std::string label_;
  std::vector<std::string> texts_;  // vocabulary text of each token
  std::vector<TokenType> types_;
  std::vector<std::string> pieces_;  // decoded bytes of each token (token_text); filled by subclasses

 private:
  struct Fragment {
    size_t offset;
    size_t length;
    Token token;  // -1 for raw text
  };
  /// Splits `text` at special tokens as llama.cpp does: special tokens longest first, each cutting
  /// every raw fragment at its leftmost non-overlapping occurrences. Control (and unknown) tokens
  /// take part only when `parse_special`; user-defined ones always do.
  std::vector<Fragment> partition(std::string_view text, bool parse_special) const;

  std::unordered_map<std::string_view, Token> ids_;  // views into texts_
  std::vector<Token> specials_;                      // ids in matching order
  std::vector<uint32_t> special_rank_;               // position in specials_, per token id (or ~0u)
  // Byte trie over the special tokens' texts, to find quickly which ones occur in a text.
  struct TrieNode {
    std::vector<std::pair<uint8_t, int32_t>> children;  // sorted by byte
    Token token = -1;
  };
  std::vector<TrieNode> trie_;
  Token bos_ = -1;
  Token eos_ = -1;
  bool add_bos_ = false;
  std::unordered_set<Token> eog_;
};

/// Byte-level BPE (`tokenizer.ggml.model = gpt2`).
std::unique_ptr<Tokenizer> make_bpe_tokenizer(const GgufFile& file);
/// SentencePiece-style BPE over scores with byte fallback (`tokenizer.ggml.model = llama`).
std::unique_ptr<Tokenizer> make_spm_tokenizer(const GgufFile& file);

}  // namespace gaac::model::detail
