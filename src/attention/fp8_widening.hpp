// FP8 codes widened to the BF16 operands attention reads (docs/format.md, section 13): each code's exact
// value, which every E4M3 and E5M2 code has in BF16 (NaN staying NaN, E5M2's infinities infinite). The
// layer's K and V scales are applied to the scores and to the output, not here. One table per format, made
// once; every kernel then reads BF16 rows.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>

#include "gaac/bf16.hpp"
#include "gaac/fp8_dump.hpp"

namespace gaac::attention {

/// The BF16 operand of every FP8 code of one format, indexed by the code.
using Fp8Widening = std::array<uint16_t, 256>;

/// The table of `format` (E4M3 or E5M2): entry x is fp8_to_float(x) as BF16, exactly. Made once per format.
inline const Fp8Widening& fp8_widening(ElementFormat format) {
  static const auto make = [](ElementFormat f) {
    Fp8Widening table{};
    for (size_t x = 0; x < table.size(); ++x) table[x] = float_to_bf16(fp8_to_float(static_cast<uint8_t>(x), f));
    return table;
  };
  static const Fp8Widening e4m3 = make(ElementFormat::e4m3), e5m2 = make(ElementFormat::e5m2);
  return format == ElementFormat::e5m2 ? e5m2 : e4m3;
}

/// Widens `count` codes to their BF16 operands.
inline void widen(const Fp8Widening& table, const uint8_t* codes, size_t count, uint16_t* out) {
  for (size_t i = 0; i < count; ++i) out[i] = table[codes[i]];
}

}  // namespace gaac::attention
