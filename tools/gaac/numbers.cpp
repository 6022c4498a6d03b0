#include "numbers.hpp"

#include <fmt/core.h>

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cmath>
#include <cstdint>
#include <limits>
#include <type_traits>

namespace gaac::cli {
namespace {

/// The value as parse_number() would read it back: decimal, shortest round-trip form for floats.
template <class T>
std::string canonical(T value) {
  return fmt::format("{}", value);
}

template <class T>
std::string range_text(T lo, T hi) {
  return canonical(lo) + " to " + canonical(hi);
}

}  // namespace

template <class T>
std::variant<T, std::string> parse_number(std::string_view text, T lo, T hi) {
  const std::string quoted = "'" + std::string(text) + "'";
  std::string_view digits = text;
  const bool plus = !digits.empty() && digits.front() == '+';  // from_chars takes '-' only
  if (plus) digits.remove_prefix(1);
  if (digits.empty() || (plus && (digits.front() == '+' || digits.front() == '-')) ||
      std::isspace(static_cast<unsigned char>(digits.front()))) {
    return quoted + " is not a number";
  }
  T value{};
  std::from_chars_result r{};
  if constexpr (std::is_floating_point_v<T>) {
    r = std::from_chars(digits.data(), digits.data() + digits.size(), value, std::chars_format::general);
  } else {
    r = std::from_chars(digits.data(), digits.data() + digits.size(), value, 10);
  }
  const bool whole = r.ptr == digits.data() + digits.size();
  if (r.ec == std::errc::result_out_of_range && whole) {
    return quoted + " is out of range: the value must be from " + range_text(lo, hi);
  }
  if (r.ec != std::errc() || !whole) {
    if constexpr (std::is_integral_v<T>) {
      if (std::is_unsigned_v<T> && digits.front() == '-') return quoted + " is negative; the value must be 0 or more";
      return quoted + " is not a whole number";
    }
    return quoted + " is not a number";
  }
  if constexpr (std::is_floating_point_v<T>) {
    if (!std::isfinite(value)) return quoted + " is not a finite number";
  }
  return value;
}

template <class T>
CLI::Validator number_in(T lo, T hi, const std::string& bound) {
  const std::string kind = std::is_integral_v<T> ? "INT" : "NUMBER";
  return CLI::Validator(
      [lo, hi, bound](std::string& text) -> std::string {
        const auto parsed = parse_number<T>(text, lo, hi);
        if (const auto* problem = std::get_if<std::string>(&parsed)) return *problem;
        const T value = std::get<T>(parsed);
        if (value < lo || value > hi) {
          return canonical(value) + " is out of range: the value must be from " + range_text(lo, hi) +
                 (bound.empty() ? "" : " (" + bound + ")");
        }
        text = canonical(value);
        return {};
      },
      kind + " in [" + canonical(lo) + ", " + canonical(hi) + "]");
}

template <class T>
CLI::Validator number_of(std::vector<T> allowed) {
  std::string list;
  for (const T v : allowed) list += (list.empty() ? "" : ", ") + canonical(v);
  return CLI::Validator(
      [allowed, list](std::string& text) -> std::string {
        const auto parsed = parse_number<T>(text);
        if (const auto* problem = std::get_if<std::string>(&parsed)) return *problem;
        const T value = std::get<T>(parsed);
        if (std::find(allowed.begin(), allowed.end(), value) == allowed.end()) {
          return canonical(value) + " is not allowed: the value must be one of " + list;
        }
        text = canonical(value);
        return {};
      },
      "one of {" + list + "}");
}

std::variant<uint64_t, std::string> parse_bytes(std::string_view text, uint64_t lo, uint64_t hi) {
  const std::string quoted = "'" + std::string(text) + "'";
  std::string_view digits = text, suffix;
  const size_t end = digits.find_first_not_of("0123456789");
  if (end != std::string_view::npos) {
    suffix = digits.substr(end);
    digits = digits.substr(0, end);
  }
  int shift = 0;
  if (!suffix.empty()) {
    std::string s(suffix);
    for (char& c : s) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
    const std::string units = "KMGT";
    const size_t at = units.find(s.front());
    if (at == std::string::npos || !(s.size() == 1 || s.substr(1) == "B" || s.substr(1) == "IB")) {
      return quoted + " is not a size: a whole number of bytes, optionally with K, M, G or T (1024-based)";
    }
    shift = 10 * static_cast<int>(at + 1);
  }
  const std::string out_of_range = quoted + " is out of range: the size must be from " + canonical(lo) + " to " + canonical(hi) + " bytes";
  const auto parsed = parse_number<uint64_t>(digits, lo, hi);
  if (const auto* problem = std::get_if<std::string>(&parsed)) {
    if (digits.empty()) return quoted + " is not a size";
    return problem->find("out of range") != std::string::npos ? out_of_range : *problem;
  }
  const uint64_t value = std::get<uint64_t>(parsed);
  if (shift > 0 && value > (UINT64_MAX >> shift)) return out_of_range;
  const uint64_t bytes = value << shift;
  if (bytes < lo || bytes > hi) return out_of_range;
  return bytes;
}

CLI::Validator bytes_in(uint64_t lo, uint64_t hi) {
  return CLI::Validator(
      [lo, hi](std::string& text) -> std::string {
        const auto parsed = parse_bytes(text, lo, hi);
        if (const auto* problem = std::get_if<std::string>(&parsed)) return *problem;
        text = canonical(std::get<uint64_t>(parsed));
        return {};
      },
      "SIZE");
}

template std::variant<int, std::string> parse_number<int>(std::string_view, int, int);
template std::variant<int64_t, std::string> parse_number<int64_t>(std::string_view, int64_t, int64_t);
template std::variant<uint64_t, std::string> parse_number<uint64_t>(std::string_view, uint64_t, uint64_t);
template std::variant<float, std::string> parse_number<float>(std::string_view, float, float);
template std::variant<double, std::string> parse_number<double>(std::string_view, double, double);
template CLI::Validator number_in<int>(int, int, const std::string&);
template CLI::Validator number_in<int64_t>(int64_t, int64_t, const std::string&);
template CLI::Validator number_in<uint64_t>(uint64_t, uint64_t, const std::string&);
template CLI::Validator number_in<float>(float, float, const std::string&);
template CLI::Validator number_in<double>(double, double, const std::string&);
template CLI::Validator number_of<int>(std::vector<int>);

}  // namespace gaac::cli
