// SentencePiece-style BPE over token scores (`tokenizer.ggml.model = llama`), as llama.cpp runs it:
// special tokens are cut out; in the rest spaces become U+2581 ('▁', as the vocabulary writes them),
// the text starts as one symbol per UTF-8 character, and the adjacent pair whose concatenation is the
// highest-scoring token is merged until no pair is a token. Characters left outside the vocabulary
// fall back to byte tokens <0xNN>.
#include <array>
#include <cstdio>
#include <queue>

#include "gaac/error.hpp"
#include "model/tokenizer_internal.hpp"

namespace gaac::model::detail {

namespace {

constexpr std::string_view kSpace = "\xE2\x96\x81";  // U+2581, the vocabulary's space

class SpmTokenizer final : public VocabTokenizer {
 public:
  explicit SpmTokenizer(const GgufFile& file);
  const char* kind() const override { return "llama"; }

 protected:
  void encode_text(std::string_view text, bool after_special, std::vector<Token>& out) const override;

 private:
  std::vector<float> scores_;
  // When set (llama.cpp's default; Gemma 3 turns it off), a space is put before the first text and
  // before text that follows a special token. decode() then gives those spaces back too.
  bool add_space_prefix_ = true;
  std::array<Token, 256> byte_tokens_{};
};

SpmTokenizer::SpmTokenizer(const GgufFile& file) : VocabTokenizer(file, true) {
  const size_t n = texts_.size();
  if (file.find("tokenizer.ggml.scores") != nullptr) {
    scores_ = file.get_floats("tokenizer.ggml.scores");
    if (scores_.size() != n) {
      fail("tokenizer.ggml.scores has " + std::to_string(scores_.size()) + " entries for " + std::to_string(n) +
           " tokens");
    }
  } else {
    scores_.assign(n, 0.0f);
  }
  if (file.find("tokenizer.ggml.add_space_prefix") != nullptr) {
    add_space_prefix_ = file.get_bool("tokenizer.ggml.add_space_prefix");
  }
  for (size_t b = 0; b < 256; ++b) {
    char name[8];
    std::snprintf(name, sizeof name, "<0x%02X>", static_cast<unsigned>(b));
    byte_tokens_[b] = find(name);
    if (byte_tokens_[b] < 0) fail(std::string("llama vocabulary lacks the byte-fallback token ") + name);
  }

  pieces_.resize(n);
  for (size_t i = 0; i < n; ++i) {
    const std::string& text = texts_[i];
    switch (types_[i]) {
      case TokenType::normal: {
        std::string& piece = pieces_[i];
        for (size_t pos = 0; pos < text.size();) {
          if (text.compare(pos, kSpace.size(), kSpace) == 0) {
            piece += ' ';
            pos += kSpace.size();
          } else {
            piece += text[pos++];
          }
        }
        break;
      }
      case TokenType::byte: {
        unsigned value = 0;
        char tail = 0;
        if (text.size() == 6 && std::sscanf(text.c_str(), "<0x%2X%c", &value, &tail) == 2 && tail == '>') {
          pieces_[i] = std::string(1, static_cast<char>(value));
        } else {
          pieces_[i] = text;
        }
        break;
      }
      default:  // control, user-defined, unknown, unused: their text
        pieces_[i] = text;
        break;
    }
  }
}

void SpmTokenizer::encode_text(std::string_view raw, bool after_special, std::vector<Token>& out) const {
  std::string text;
  text.reserve(raw.size() + raw.size() / 2 + kSpace.size());
  if (add_space_prefix_ && after_special) text += kSpace;
  for (const char ch : raw) {
    if (ch == ' ') {
      text += kSpace;
    } else {
      text += ch;
    }
  }

  struct Symbol {
    size_t start;
    size_t size;  // 0 once merged into its left neighbour
    int prev;
    int next;
  };
  std::vector<Symbol> symbols;
  for (size_t pos = 0; pos < text.size();) {
    const size_t len = std::min(utf8_sequence_length(static_cast<uint8_t>(text[pos])), text.size() - pos);
    const int idx = static_cast<int>(symbols.size());
    symbols.push_back({pos, len, idx - 1, pos + len < text.size() ? idx + 1 : -1});
    pos += len;
  }
  auto text_of = [&](const Symbol& s) { return std::string_view(text).substr(s.start, s.size); };

  struct Bigram {
    float score;
    int left;
    int right;
    size_t size;
  };
  // Highest score first; among equal scores the leftmost.
  auto before = [](const Bigram& a, const Bigram& b) {
    return a.score < b.score || (a.score == b.score && a.left > b.left);
  };
  std::priority_queue<Bigram, std::vector<Bigram>, decltype(before)> queue(before);
  auto add = [&](int left, int right) {
    if (left < 0 || right < 0) return;
    const Symbol& l = symbols[static_cast<size_t>(left)];
    const Symbol& r = symbols[static_cast<size_t>(right)];
    const Token id = find(std::string_view(text).substr(l.start, l.size + r.size));
    if (id >= 0) queue.push({scores_[static_cast<size_t>(id)], left, right, l.size + r.size});
  };
  for (int i = 1; i < static_cast<int>(symbols.size()); ++i) add(i - 1, i);

  while (!queue.empty()) {
    const Bigram bg = queue.top();
    queue.pop();
    Symbol& l = symbols[static_cast<size_t>(bg.left)];
    Symbol& r = symbols[static_cast<size_t>(bg.right)];
    if (l.size == 0 || r.size == 0 || l.next != bg.right || l.size + r.size != bg.size) continue;  // stale
    l.size += r.size;
    r.size = 0;
    l.next = r.next;
    if (r.next >= 0) symbols[static_cast<size_t>(r.next)].prev = bg.left;
    add(l.prev, bg.left);
    add(bg.left, l.next);
  }

  for (int i = symbols.empty() ? -1 : 0; i >= 0; i = symbols[static_cast<size_t>(i)].next) {
    const std::string_view piece = text_of(symbols[static_cast<size_t>(i)]);
    const Token id = find(piece);
    if (id >= 0) {
      out.push_back(id);
    } else {  // a character outside the vocabulary: its bytes
      for (const char ch : piece) out.push_back(byte_tokens_[static_cast<uint8_t>(ch)]);
    }
  }
}

}  // namespace

std::unique_ptr<Tokenizer> make_spm_tokenizer(const GgufFile& file) { return std::make_unique<SpmTokenizer>(file); }

}  // namespace gaac::model::detail
