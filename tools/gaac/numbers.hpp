// One strict parser for every numeric option, so that each option refuses text, NaN, infinities
// and values outside its range in the same way, with a message naming the option.
#pragma once

#include <CLI/CLI.hpp>
#include <limits>
#include <string>
#include <string_view>
#include <variant>

namespace gaac::cli {

/// Parses all of `text` as a T (int, int64_t, uint64_t, float or double): decimal digits after an
/// optional sign ('-' only where T is signed), and for floating types a fraction and an exponent
/// ("0.7", "1e-3"). Returns the value, or what is wrong: empty text, spaces or other characters,
/// a fraction for an integer type, NaN or an infinity, or a value T cannot hold (never clamped; the
/// message gives the range [lo, hi] the caller accepts).
template <class T>
std::variant<T, std::string> parse_number(std::string_view text, T lo = std::numeric_limits<T>::lowest(),
                                          T hi = std::numeric_limits<T>::max());

/// A CLI11 transform for an option of type T: the value must parse (parse_number) and lie in
/// [lo, hi], else CLI11 reports "<option>: <what is wrong>"; `bound` explains hi in that message
/// (e.g. "4 per available CPU"). It rewrites the value in canonical form, so CLI11's own conversion
/// (which would read "010" as octal) sees exactly the number that was checked.
template <class T>
CLI::Validator number_in(T lo, T hi, const std::string& bound = "");

/// Parses a size in bytes: a whole number, optionally followed by K, M, G or T (powers of 1024; KB,
/// KiB, MB, MiB, ... read the same, in either case). Returns the bytes or what is wrong (as
/// parse_number does), including a size outside [lo, hi].
std::variant<uint64_t, std::string> parse_bytes(std::string_view text, uint64_t lo, uint64_t hi);

/// A CLI11 transform for a size option (parse_bytes in [lo, hi]); it rewrites the value as the number
/// of bytes, so the option's variable is a plain integer.
CLI::Validator bytes_in(uint64_t lo, uint64_t hi);

/// The same for an option whose value must be one of `allowed`.
template <class T>
CLI::Validator number_of(std::vector<T> allowed);

}  // namespace gaac::cli
