// Text from files (a model's metadata, tensor names) made safe to print: nothing in it can reach a
// terminal as a control or escape sequence.
#pragma once

#include <string>
#include <string_view>

namespace gaac::cli {

/// `text` with every byte or character a terminal could act on written as a visible escape: C0
/// controls and DEL (`\x1b`, with `\n`, `\r`, `\t` as such), C1 controls and bidirectional-text
/// overrides (`\u{202e}`), and bytes that are not valid UTF-8 (`\xff`). A backslash becomes `\\`,
/// so the result reads back unambiguously. Printable text, non-ASCII included, is kept.
std::string printable(std::string_view text);

/// printable(text) in double quotes, with `"` escaped as `\"`.
std::string quoted_text(std::string_view text);

/// Escapes only the C0 controls (other than newline and tab) and DEL of a byte stream, one piece at
/// a time: for text generated token by token, where a multi-byte character may be split between
/// pieces and must pass through intact.
std::string without_controls(std::string_view piece);

}  // namespace gaac::cli
