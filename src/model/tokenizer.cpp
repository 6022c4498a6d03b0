// Tokenizer factory and the parts both tokenizer kinds share: vocabulary, special tokens, decoding,
// UTF-8 and Unicode classes.
#include <algorithm>
#include <array>

#include "gaac/error.hpp"
#include "model/tokenizer_internal.hpp"

namespace gaac::model {

std::unique_ptr<Tokenizer> Tokenizer::from_gguf(const GgufFile& file) {
  const std::string kind = file.get_string("tokenizer.ggml.model");
  if (kind == "gpt2") return detail::make_bpe_tokenizer(file);
  if (kind == "llama") return detail::make_spm_tokenizer(file);
  throw Error(file.label() + ": unsupported tokenizer.ggml.model '" + kind + "' (gaac reads 'gpt2' and 'llama')");
}

std::string Tokenizer::decode(const std::vector<Token>& tokens) const {
  std::string text;
  for (const Token token : tokens) text += token_text(token);
  return text;
}

namespace detail {

// ---- Unicode ----------------------------------------------------------------------------------

uint8_t unicode_flags(uint32_t cp) {
  if (cp < 0x80) {
    // ASCII fast path (agrees with the table).
    if ((cp >= 'a' && cp <= 'z') || (cp >= 'A' && cp <= 'Z')) return kLetter;
    if (cp >= '0' && cp <= '9') return kNumber;
    if (cp == ' ' || (cp >= 0x09 && cp <= 0x0D)) return kWhitespace;
    return 0;
  }
  if (cp > 0x10FFFF) return 0;
  const UnicodeRange* end = kUnicodeRanges + kUnicodeRangeCount;
  const UnicodeRange* it =
      std::upper_bound(kUnicodeRanges, end, cp, [](uint32_t v, const UnicodeRange& r) { return v < r.first; });
  return it == kUnicodeRanges ? 0 : (it - 1)->flags;
}

size_t utf8_sequence_length(uint8_t lead) {
  if (lead < 0xC0) return 1;
  if (lead < 0xE0) return 2;
  if (lead < 0xF0) return 3;
  if (lead < 0xF8) return 4;
  return 1;
}

std::vector<CodePoint> decode_utf8(std::string_view text) {
  std::vector<CodePoint> out;
  out.reserve(text.size());
  const auto* s = reinterpret_cast<const uint8_t*>(text.data());
  const size_t n = text.size();
  size_t i = 0;
  auto cont = [&](size_t k) { return k < n && (s[k] & 0xC0) == 0x80; };
  while (i < n) {
    const uint8_t b = s[i];
    uint32_t cp = kInvalidCodePoint;
    size_t len = 1;
    if (b < 0x80) {
      cp = b;
    } else if (b >= 0xC2 && b <= 0xDF && cont(i + 1)) {
      cp = (uint32_t(b & 0x1F) << 6) | (s[i + 1] & 0x3F);
      len = 2;
    } else if (b >= 0xE0 && b <= 0xEF && cont(i + 1) && cont(i + 2)) {
      const uint32_t v = (uint32_t(b & 0x0F) << 12) | (uint32_t(s[i + 1] & 0x3F) << 6) | (s[i + 2] & 0x3F);
      if (v >= 0x800 && (v < 0xD800 || v > 0xDFFF)) {
        cp = v;
        len = 3;
      }
    } else if (b >= 0xF0 && b <= 0xF4 && cont(i + 1) && cont(i + 2) && cont(i + 3)) {
      const uint32_t v = (uint32_t(b & 0x07) << 18) | (uint32_t(s[i + 1] & 0x3F) << 12) |
                         (uint32_t(s[i + 2] & 0x3F) << 6) | (s[i + 3] & 0x3F);
      if (v >= 0x10000 && v <= 0x10FFFF) {
        cp = v;
        len = 4;
      }
    }
    out.push_back({cp, static_cast<uint32_t>(i), static_cast<uint32_t>(len)});
    i += len;
  }
  return out;
}

// ---- Vocabulary -------------------------------------------------------------------------------

namespace {

// Tokens that end a turn or the text, recognised by their text as llama.cpp does (GGUF files do not
// mark them), beside the file's EOS and EOT ids.
constexpr std::array<std::string_view, 9> kEndOfGenerationTexts = {
    "<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>",
    "<|eom_id|>", "<EOT>", "<|end_of_text|>", "<end_of_utterance>",
};

Token optional_id(const GgufFile& file, const std::string& key, size_t vocab) {
  if (file.find(key) == nullptr) return -1;
  const uint64_t id = file.get_uint(key);
  if (id >= vocab) {
    throw Error(file.label() + ": " + key + " = " + std::to_string(id) + " is outside the vocabulary of " +
                std::to_string(vocab) + " tokens");
  }
  return static_cast<Token>(id);
}

}  // namespace

VocabTokenizer::VocabTokenizer(const GgufFile& file, bool default_add_bos) : label_(file.label()) {
  texts_ = file.get_strings("tokenizer.ggml.tokens");
  const size_t n = texts_.size();
  if (n == 0) fail("tokenizer.ggml.tokens is empty");
  if (n > static_cast<size_t>(INT32_MAX)) fail("tokenizer.ggml.tokens has too many tokens");

  types_.assign(n, TokenType::normal);
  if (file.find("tokenizer.ggml.token_type") != nullptr) {
    const std::vector<int64_t> types = file.get_ints("tokenizer.ggml.token_type");
    if (types.size() != n) {
      fail("tokenizer.ggml.token_type has " + std::to_string(types.size()) + " entries for " + std::to_string(n) +
           " tokens");
    }
    for (size_t i = 0; i < n; ++i) {
      const int64_t t = types[i];
      types_[i] = (t >= 0 && t <= 6) ? static_cast<TokenType>(t) : TokenType::undefined;
    }
  }

  ids_.reserve(n);
  for (size_t i = 0; i < n; ++i) ids_[texts_[i]] = static_cast<Token>(i);  // the last of duplicates wins

  bos_ = optional_id(file, "tokenizer.ggml.bos_token_id", n);
  eos_ = optional_id(file, "tokenizer.ggml.eos_token_id", n);
  add_bos_ = file.find("tokenizer.ggml.add_bos_token") != nullptr ? file.get_bool("tokenizer.ggml.add_bos_token")
                                                                  : default_add_bos;
  if (add_bos_ && bos_ < 0) fail("tokenizer.ggml.add_bos_token is set but there is no tokenizer.ggml.bos_token_id");

  if (eos_ >= 0) eog_.insert(eos_);
  for (const char* key : {"tokenizer.ggml.eot_token_id", "tokenizer.ggml.eom_token_id"}) {
    if (const Token id = optional_id(file, key, n); id >= 0) eog_.insert(id);
  }
  for (const std::string_view text : kEndOfGenerationTexts) {
    if (const Token id = find(text); id >= 0) eog_.insert(id);
  }

  // Special tokens, longest first (ties by id, for determinism), and a trie over their texts.
  for (size_t i = 0; i < n; ++i) {
    const TokenType t = types_[i];
    if ((t == TokenType::control || t == TokenType::user_defined || t == TokenType::unknown) && !texts_[i].empty()) {
      specials_.push_back(static_cast<Token>(i));
    }
  }
  std::stable_sort(specials_.begin(), specials_.end(),
                   [&](Token a, Token b) { return texts_[a].size() > texts_[b].size(); });
  special_rank_.assign(n, ~0u);
  trie_.emplace_back();
  for (size_t r = 0; r < specials_.size(); ++r) {
    const Token id = specials_[r];
    special_rank_[id] = static_cast<uint32_t>(r);
    size_t node = 0;
    for (const char ch : texts_[id]) {
      const auto byte = static_cast<uint8_t>(ch);
      auto& kids = trie_[node].children;
      auto it = std::lower_bound(kids.begin(), kids.end(), byte,
                                 [](const std::pair<uint8_t, int32_t>& c, uint8_t v) { return c.first < v; });
      if (it != kids.end() && it->first == byte) {
        node = static_cast<size_t>(it->second);
      } else {
        const auto child = static_cast<int32_t>(trie_.size());
        kids.insert(it, {byte, child});
        trie_.emplace_back();  // may reallocate: `kids` is not used after this
        node = static_cast<size_t>(child);
      }
    }
    trie_[node].token = id;
  }
}

void VocabTokenizer::fail(const std::string& message) const { throw Error(label_ + ": " + message); }

Token VocabTokenizer::find(std::string_view text) const {
  const auto it = ids_.find(text);
  return it == ids_.end() ? -1 : it->second;
}

std::string VocabTokenizer::token_text(Token token) const {
  if (token < 0 || static_cast<size_t>(token) >= pieces_.size()) {
    throw Error(label_ + ": token " + std::to_string(token) + " is outside the vocabulary of " +
                std::to_string(pieces_.size()) + " tokens");
  }
  return pieces_[static_cast<size_t>(token)];
}

std::vector<VocabTokenizer::Fragment> VocabTokenizer::partition(std::string_view text, bool parse_special) const {
  std::vector<Fragment> fragments;
  if (text.empty()) return fragments;
  fragments.push_back({0, text.size(), -1});
  if (specials_.empty()) return fragments;

  // Which special tokens occur anywhere in the text: the others cannot match any fragment of it.
  std::vector<bool> present(specials_.size(), false);
  bool any = false;
  for (size_t i = 0; i < text.size(); ++i) {
    size_t node = 0;
    for (size_t j = i; j < text.size(); ++j) {
      const auto& kids = trie_[node].children;
      const auto byte = static_cast<uint8_t>(text[j]);
      auto it = std::lower_bound(kids.begin(), kids.end(), byte,
                                 [](const std::pair<uint8_t, int32_t>& c, uint8_t v) { return c.first < v; });
      if (it == kids.end() || it->first != byte) break;
      node = static_cast<size_t>(it->second);
      const Token id = trie_[node].token;
      if (id < 0) continue;
      const TokenType t = types_[static_cast<size_t>(id)];
      if (!parse_special && (t == TokenType::control || t == TokenType::unknown)) continue;
      present[special_rank_[static_cast<size_t>(id)]] = true;
      any = true;
    }
  }
  if (!any) return fragments;

  std::vector<Fragment> next;
  for (size_t r = 0; r < specials_.size(); ++r) {
    if (!present[r]) continue;
    const Token id = specials_[r];
    const std::string_view needle = texts_[static_cast<size_t>(id)];
    next.clear();
    for (const Fragment& f : fragments) {
      if (f.token >= 0) {
        next.push_back(f);
        continue;
      }
      const size_t end = f.offset + f.length;
      const std::string_view window = text.substr(0, end);
      size_t pos = f.offset;
      for (;;) {
        const size_t match = window.find(needle, pos);
        if (match == std::string_view::npos) break;
        if (match > pos) next.push_back({pos, match - pos, -1});
        next.push_back({match, needle.size(), id});
        pos = match + needle.size();
      }
      if (pos < end) next.push_back({pos, end - pos, -1});
    }
    fragments.swap(next);
  }
  return fragments;
}

std::vector<Token> VocabTokenizer::encode(std::string_view text, bool parse_special) const {
  std::vector<Token> out;
  out.reserve(text.size() / 3 + 4);
  bool after_special = true;
  for (const Fragment& f : partition(text, parse_special)) {
    if (f.token >= 0) {
      out.push_back(f.token);
      after_special = true;
    } else {
      encode_text(text.substr(f.offset, f.length), after_special, out);
      after_special = false;
    }
  }
  return out;
}

}  // namespace detail
}  // namespace gaac::model
