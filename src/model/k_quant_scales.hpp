// The 6-bit scales and mins of a Q4_K / Q5_K super-block, which ggml packs eight of each into 12
// bytes. Every kernel (reference, AVX2, 8-bit-activation products) unpacks them here.
#pragma once

#include <cstdint>

namespace gaac::model {

/// The eight sub-block scales and eight sub-block mins of one Q4_K or Q5_K super-block, each 0..63,
/// four to a 32-bit word: byte k of words[0] is scale k, of words[1] scale k + 4, of words[2] min k,
/// of words[3] min k + 4 (so that the AVX2 kernels take the words as one vector of 16 bytes:
/// the scales 0..7, then the mins 0..7).
struct KQuantScales {
  /// The sixteen values, four to a word as above.
  uint32_t words[4];
  /// The scale of sub-block j (0..7): with the block's d, it multiplies the quants of elements 32j .. 32j + 31.
  int scale(int j) const { return static_cast<int>((words[j / 4] >> (8 * (j % 4))) & 0xFFu); }
  /// The min of sub-block j (0..7): times the block's dmin, it is subtracted from each of those elements.
  int min(int j) const { return static_cast<int>((words[2 + j / 4] >> (8 * (j % 4))) & 0xFFu); }
};

/// Unpacks the 12 bytes at `packed` as ggml's get_scale_min_k4(j, packed) does for each j in 0..7:
///   j < 4: scale = p[j] & 63,                          min = p[j + 4] & 63
///   j ≥ 4: scale = (p[j + 4] & 15) | (p[j − 4] >> 6) << 4,   min = (p[j + 4] >> 4) | (p[j] >> 6) << 4
/// four bytes at a time (byte k of each word holds the result for j = k or j = k + 4).
inline KQuantScales unpack_k_quant_scales(const uint8_t* packed) {
  const auto word = [packed](int i) {  // bytes 4i .. 4i + 3, little-endian
    const uint8_t* p = packed + 4 * i;
    return static_cast<uint32_t>(p[0]) | (static_cast<uint32_t>(p[1]) << 8) | (static_cast<uint32_t>(p[2]) << 16) |
           (static_cast<uint32_t>(p[3]) << 24);
  };
  const uint32_t bytes_0_3 = word(0), bytes_4_7 = word(1), bytes_8_11 = word(2);
  // (x >> 2) & 0x30 moves each byte's top two bits to bits 4 and 5 of the same byte.
  return {{
      bytes_0_3 & 0x3F3F3F3Fu,                                           // scales 0..3
      (bytes_8_11 & 0x0F0F0F0Fu) | ((bytes_0_3 >> 2) & 0x30303030u),     // scales 4..7
      bytes_4_7 & 0x3F3F3F3Fu,                                           // mins 0..3
      ((bytes_8_11 >> 4) & 0x0F0F0F0Fu) | ((bytes_4_7 >> 2) & 0x30303030u),  // mins 4..7
  }};
}

}  // namespace gaac::model
