#include "terminal_text.hpp"

#include <fmt/core.h>

#include "common/utf8.hpp"

namespace gaac::cli {
namespace {

/// Code points a terminal or a text renderer acts on rather than shows: C1 controls, the
/// bidirectional embeddings, overrides and isolates, and the line and paragraph separators.
bool is_invisible_control(char32_t cp) {
  return (cp >= 0x80 && cp <= 0x9F) || (cp >= 0x202A && cp <= 0x202E) || (cp >= 0x2066 && cp <= 0x2069) ||
         cp == 0x2028 || cp == 0x2029 || cp == 0x200E || cp == 0x200F || cp == 0x061C;
}

/// The escape of one ASCII control byte.
std::string control_escape(unsigned char c) {
  switch (c) {
    case '\n':
      return "\\n";
    case '\r':
      return "\\r";
    case '\t':
      return "\\t";
    default:
      return fmt::format("\\x{:02x}", c);
  }
}

std::string escape(std::string_view text, bool quote) {
  std::string out;
  out.reserve(text.size());
  for (size_t i = 0; i < text.size();) {
    const auto c = static_cast<unsigned char>(text[i]);
    if (c < 0x80) {
      if (c < 0x20 || c == 0x7F) {
        out += control_escape(c);
      } else if (c == '\\' || (quote && c == '"')) {
        out += '\\';
        out += static_cast<char>(c);
      } else {
        out += static_cast<char>(c);
      }
      ++i;
      continue;
    }
    char32_t cp = 0;
    const size_t n = utf8_sequence(text, i, cp);
    if (n == 0) {
      out += fmt::format("\\x{:02x}", c);
      ++i;
    } else if (is_invisible_control(cp)) {
      out += fmt::format("\\u{{{:x}}}", static_cast<uint32_t>(cp));
      i += n;
    } else {
      out.append(text.substr(i, n));
      i += n;
    }
  }
  return out;
}

}  // namespace

std::string printable(std::string_view text) { return escape(text, false); }

std::string quoted_text(std::string_view text) {
  std::string out(1, '"');
  out += escape(text, true);
  out += '"';
  return out;
}

std::string without_controls(std::string_view piece) {
  std::string out;
  out.reserve(piece.size());
  for (const char ch : piece) {
    const auto c = static_cast<unsigned char>(ch);
    if ((c < 0x20 && c != '\n' && c != '\t') || c == 0x7F) {
      out += control_escape(c);
    } else {
      out += ch;
    }
  }
  return out;
}

}  // namespace gaac::cli
