// Byte-level BPE (`tokenizer.ggml.model = gpt2`), as llama.cpp runs it: special tokens are cut out,
// the rest is split into words by the pre-tokenizer named in `tokenizer.ggml.pre`, each word's bytes
// are written as GPT-2's printable code points, and merges are applied lowest rank first.
#include <array>
#include <queue>

#include "gaac/error.hpp"
#include "model/tokenizer_internal.hpp"

namespace gaac::model::detail {

namespace {

/// GPT-2's map from bytes to printable code points: the printable Latin-1 bytes ('!'..'~', '¡'..'¬',
/// '®'..'ÿ') stand for themselves, the other 68 bytes take U+0100, U+0101, ... in byte order.
std::array<uint32_t, 256> gpt2_byte_code_points() {
  std::array<uint32_t, 256> map{};
  uint32_t next = 0x100;
  for (uint32_t b = 0; b < 256; ++b) {
    const bool printable = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
    map[b] = printable ? b : next++;
  }
  return map;
}

void append_utf8(std::string& out, uint32_t cp) {
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xC0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += static_cast<char>(0xE0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (cp >> 18));
    out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  }
}

/// Pre-tokenizers gaac implements, by the `tokenizer.ggml.pre` values that select them in llama.cpp.
enum class PreTokenizer {
  gpt2,         // 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)
  digits_gpt2,  // every \p{N} code point alone, then gpt2 within the pieces between them
};

PreTokenizer pre_tokenizer(const std::string& name, const std::string& label) {
  for (const char* n : {"smollm", "starcoder", "refact", "command-r", "codeshell", "exaone", "minerva"}) {
    if (name == n) return PreTokenizer::digits_gpt2;
  }
  for (const char* n : {"gpt-2", "gpt2", "mpt", "olmo", "jais", "trillion"}) {
    if (name == n) return PreTokenizer::gpt2;
  }
  throw Error(label + ": unsupported tokenizer.ggml.pre '" + name + "' for a gpt2 vocabulary");
}

class BpeTokenizer final : public VocabTokenizer {
 public:
  explicit BpeTokenizer(const GgufFile& file);
  const char* kind() const override { return "gpt2"; }

 protected:
  void encode_text(std::string_view text, bool after_special, std::vector<Token>& out) const override;

 private:
  /// Appends the byte ranges [begin, end) of the words of `text`.
  void split(std::string_view text, std::vector<std::pair<size_t, size_t>>& words) const;
  /// GPT-2's split of code points [b, e) of `cps` (flags in `flags`), as byte ranges.
  static void split_gpt2(const std::vector<CodePoint>& cps, const std::vector<uint8_t>& flags, size_t b, size_t e,
                         std::vector<std::pair<size_t, size_t>>& words);
  void encode_word(std::string_view word, std::vector<Token>& out) const;
  /// Merge rank of the pair, or -1.
  int32_t rank(std::string_view left, std::string_view right, std::string& scratch) const;

  PreTokenizer pre_;
  std::unordered_map<std::string, int32_t> ranks_;  // "left right" → rank
  std::array<std::string, 256> byte_chars_;          // UTF-8 of each byte's GPT-2 code point
  std::array<Token, 256> byte_tokens_{};             // token of each byte alone, or -1
};

BpeTokenizer::BpeTokenizer(const GgufFile& file) : VocabTokenizer(file, false) {
  pre_ = pre_tokenizer(file.find("tokenizer.ggml.pre") != nullptr ? file.get_string("tokenizer.ggml.pre") : "gpt2",
                       label_);

  const std::array<uint32_t, 256> cps = gpt2_byte_code_points();
  std::unordered_map<uint32_t, uint8_t> cp_to_byte;
  for (size_t b = 0; b < 256; ++b) {
    append_utf8(byte_chars_[b], cps[b]);
    cp_to_byte[cps[b]] = static_cast<uint8_t>(b);
    byte_tokens_[b] = find(byte_chars_[b]);  // -1 when missing (SmolLM2 lacks 21 bytes, e.g. 0x04)
  }

  const std::vector<std::string> merges = file.get_strings("tokenizer.ggml.merges");
  ranks_.reserve(merges.size());
  for (size_t i = 0; i < merges.size(); ++i) {
    const std::string& m = merges[i];
    const size_t space = m.find(' ', 1);
    if (space == std::string::npos || space + 1 >= m.size()) fail("malformed merge '" + m + "'");
    ranks_.emplace(m, static_cast<int32_t>(i));  // the first of duplicates wins
  }

  // What each token stands for: normal tokens spell bytes in GPT-2's code points; special ones are
  // their text.
  pieces_.resize(texts_.size());
  for (size_t i = 0; i < texts_.size(); ++i) {
    const TokenType t = types_[i];
    if (t == TokenType::control || t == TokenType::user_defined || t == TokenType::unknown) {
      pieces_[i] = texts_[i];
      continue;
    }
    std::string& piece = pieces_[i];
    for (const CodePoint& c : decode_utf8(texts_[i])) {
      const auto it = c.cp == kInvalidCodePoint ? cp_to_byte.end() : cp_to_byte.find(c.cp);
      if (it != cp_to_byte.end()) {
        piece += static_cast<char>(it->second);
      } else {
        piece.append(texts_[i], c.offset, c.length);  // not a byte's code point: kept as written
      }
    }
  }
}

void BpeTokenizer::split_gpt2(const std::vector<CodePoint>& cps, const std::vector<uint8_t>& flags, size_t b,
                              size_t e, std::vector<std::pair<size_t, size_t>>& words) {
  auto emit = [&](size_t from, size_t to) {
    words.emplace_back(cps[from].offset, cps[to - 1].offset + cps[to - 1].length);
  };
  // Class of a code point for the runs \p{L}+, \p{N}+, [^\s\p{L}\p{N}]+ and \s.
  auto cls = [&](size_t k) -> uint8_t {
    const uint8_t f = flags[k];
    if (f & kLetter) return kLetter;
    if (f & kNumber) return kNumber;
    if (f & kWhitespace) return kWhitespace;
    return 0;  // anything else
  };
  size_t i = b;
  while (i < e) {
    const uint32_t c = cps[i].cp;
    // 's|'t|'re|'ve|'m|'ll|'d
    if (c == '\'' && i + 1 < e) {
      const uint32_t c1 = cps[i + 1].cp;
      if (c1 == 's' || c1 == 't' || c1 == 'm' || c1 == 'd') {
        emit(i, i + 2);
        i += 2;
        continue;
      }
      if (i + 2 < e) {
        const uint32_t c2 = cps[i + 2].cp;
        if ((c1 == 'r' && c2 == 'e') || (c1 == 'v' && c2 == 'e') || (c1 == 'l' && c2 == 'l')) {
          emit(i, i + 3);
          i += 3;
          continue;
        }
      }
    }
    // ' ?\p{L}+', ' ?\p{N}+', ' ?[^\s\p{L}\p{N}]+': an optional space, then a run of one class.
    const size_t start = (c == ' ' && i + 1 < e) ? i + 1 : i;
    const uint8_t k = cls(start);
    if (k != kWhitespace) {
      size_t j = start + 1;
      while (j < e && cls(j) == k) ++j;
      emit(i, j);
      i = j;
      continue;
    }
    // '\s+(?!\S)': a whitespace run, less its last code point when a non-space follows in the piece
    // (that one goes with what follows, or stands alone).
    size_t j = i;
    while (j < e && cls(j) == kWhitespace) ++j;
    if (j - i > 1 && j < e) --j;
    emit(i, j);
    i = j;
  }
}

void BpeTokenizer::split(std::string_view text, std::vector<std::pair<size_t, size_t>>& words) const {
  const std::vector<CodePoint> cps = decode_utf8(text);
  std::vector<uint8_t> flags(cps.size());
  for (size_t i = 0; i < cps.size(); ++i) flags[i] = unicode_flags(cps[i].cp);
  if (pre_ == PreTokenizer::gpt2) {
    split_gpt2(cps, flags, 0, cps.size(), words);
    return;
  }
  // digits_gpt2: each number code point is a piece of its own; gpt2 splits the pieces between them.
  size_t b = 0;
  for (size_t i = 0; i < cps.size(); ++i) {
    if (!(flags[i] & kNumber)) continue;
    if (i > b) split_gpt2(cps, flags, b, i, words);
    words.emplace_back(cps[i].offset, cps[i].offset + cps[i].length);
    b = i + 1;
  }
  if (b < cps.size()) split_gpt2(cps, flags, b, cps.size(), words);
}

int32_t BpeTokenizer::rank(std::string_view left, std::string_view right, std::string& scratch) const {
  scratch.assign(left);
  scratch += ' ';
  scratch.append(right);
  const auto it = ranks_.find(scratch);
  return it == ranks_.end() ? -1 : it->second;
}

void BpeTokenizer::encode_word(std::string_view word, std::vector<Token>& out) const {
  // Symbols over the word written in GPT-2 code points; each starts as one byte of the word.
  struct Symbol {
    size_t start;  // in `enc`
    size_t size;   // bytes of `enc`; 0 once merged into its left neighbour
    size_t first_byte;
    size_t bytes;  // bytes of the word it covers
    int prev;
    int next;
  };
  std::string enc;
  std::vector<Symbol> symbols;
  symbols.reserve(word.size());
  for (size_t i = 0; i < word.size(); ++i) {
    const std::string& ch = byte_chars_[static_cast<uint8_t>(word[i])];
    const int idx = static_cast<int>(symbols.size());
    symbols.push_back({enc.size(), ch.size(), i, 1, idx - 1, i + 1 < word.size() ? idx + 1 : -1});
    enc += ch;
  }
  auto text_of = [&](const Symbol& s) { return std::string_view(enc).substr(s.start, s.size); };

  struct Bigram {
    int32_t rank;
    int left;
    int right;
    size_t size;
  };
  // Lowest rank first; among equal ranks the leftmost.
  auto after = [](const Bigram& a, const Bigram& b) {
    return a.rank > b.rank || (a.rank == b.rank && a.left > b.left);
  };
  std::priority_queue<Bigram, std::vector<Bigram>, decltype(after)> queue(after);
  std::string scratch;
  auto add = [&](int left, int right) {
    if (left < 0 || right < 0) return;
    const Symbol& l = symbols[static_cast<size_t>(left)];
    const Symbol& r = symbols[static_cast<size_t>(right)];
    const int32_t rk = rank(text_of(l), text_of(r), scratch);
    if (rk >= 0) queue.push({rk, left, right, l.size + r.size});
  };
  for (int i = 1; i < static_cast<int>(symbols.size()); ++i) add(i - 1, i);

  while (!queue.empty()) {
    const Bigram bg = queue.top();
    queue.pop();
    Symbol& l = symbols[static_cast<size_t>(bg.left)];
    Symbol& r = symbols[static_cast<size_t>(bg.right)];
    // Stale when either side has changed since the pair was queued.
    if (l.size == 0 || r.size == 0 || l.next != bg.right || l.size + r.size != bg.size) continue;
    l.size += r.size;
    l.bytes += r.bytes;
    r.size = 0;
    l.next = r.next;
    if (r.next >= 0) symbols[static_cast<size_t>(r.next)].prev = bg.left;
    add(l.prev, bg.left);
    add(bg.left, l.next);
  }

  for (int i = symbols.empty() ? -1 : 0; i >= 0; i = symbols[static_cast<size_t>(i)].next) {
    const Symbol& s = symbols[static_cast<size_t>(i)];
    const Token id = find(text_of(s));
    if (id >= 0) {
      out.push_back(id);
    } else {
      // Not a token (a byte the vocabulary cannot spell, or a merge whose result is not a token): its
      // bytes one by one, dropping those without a token, as llama.cpp does.
      for (size_t k = 0; k < s.bytes; ++k) {
        const Token b = byte_tokens_[static_cast<uint8_t>(word[s.first_byte + k])];
        if (b >= 0) out.push_back(b);
      }
    }
  }
}

void BpeTokenizer::encode_text(std::string_view text, bool /*after_special*/, std::vector<Token>& out) const {
  std::vector<std::pair<size_t, size_t>> words;
  split(text, words);
  for (const auto& [b, e] : words) encode_word(text.substr(b, e - b), out);
}

}  // namespace

std::unique_ptr<Tokenizer> make_bpe_tokenizer(const GgufFile& file) { return std::make_unique<BpeTokenizer>(file); }

}  // namespace gaac::model::detail
