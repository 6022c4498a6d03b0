// UTF-8 decoding, for text that must be valid (safetensors headers are JSON) or must be shown safely
// (strings from model files on a terminal).
#pragma once

#include <cstddef>
#include <string_view>

namespace gaac {

/// Decodes the UTF-8 sequence starting at `s[i]`: returns its length (1 to 4) and stores the code
/// point, or returns 0 when the bytes there are not valid UTF-8 (a stray continuation byte, a
/// truncated or overlong sequence, a surrogate, or a value beyond U+10FFFF).
inline size_t utf8_sequence(std::string_view s, size_t i, char32_t& code_point) {
  const auto byte = [&](size_t k) { return static_cast<unsigned char>(s[k]); };
  const unsigned char lead = byte(i);
  if (lead < 0x80) {
    code_point = lead;
    return 1;
  }
  size_t length = 0;
  char32_t cp = 0, min = 0;
  if ((lead & 0xE0) == 0xC0) {
    length = 2, cp = lead & 0x1F, min = 0x80;
  } else if ((lead & 0xF0) == 0xE0) {
    length = 3, cp = lead & 0x0F, min = 0x800;
  } else if ((lead & 0xF8) == 0xF0) {
    length = 4, cp = lead & 0x07, min = 0x10000;
  } else {
    return 0;
  }
  if (s.size() - i < length) return 0;
  for (size_t k = 1; k < length; ++k) {
    if ((byte(i + k) & 0xC0) != 0x80) return 0;
    cp = (cp << 6) | (byte(i + k) & 0x3F);
  }
  if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return 0;
  code_point = cp;
  return length;
}

/// Offset of the first byte of `s` that does not begin a valid UTF-8 sequence, or npos when all is valid.
inline size_t first_invalid_utf8(std::string_view s) {
  for (size_t i = 0; i < s.size();) {
    char32_t cp = 0;
    const size_t n = utf8_sequence(s, i, cp);
    if (n == 0) return i;
    i += n;
  }
  return std::string_view::npos;
}

}  // namespace gaac
