// Conversions between float and BF16 bit patterns.
#pragma once

#include <bit>
#include <cstdint>

namespace gaac {

/// Rounds a float to the nearest BF16 (ties to even), as an engine does when it writes its cache.
/// NaNs stay NaNs (quiet, sign kept).
constexpr uint16_t float_to_bf16(float value) {
  const uint32_t bits = std::bit_cast<uint32_t>(value);
  if ((bits & 0x7FFFFFFFu) > 0x7F800000u) return static_cast<uint16_t>((bits >> 16) | 0x0040u);
  const uint32_t rounding = 0x7FFFu + ((bits >> 16) & 1u);
  return static_cast<uint16_t>((bits + rounding) >> 16);
}

/// Widens a BF16 bit pattern to the float it denotes (exact).
constexpr float bf16_to_float(uint16_t value) { return std::bit_cast<float>(static_cast<uint32_t>(value) << 16); }

}  // namespace gaac
