// The parts of the scalar oracles that do not depend on the element format (codec_scalar.cpp for BF16,
// fp8_scalar.cpp for FP8): little-endian words, a group's two-window mode choice, tag words and the
// escape-slot checks. Both formats code a group of eight exponents as offsets from one of two windows
// (narrow, wide) or raw; only the windows' widths and the escape planes per mode differ.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "gaac/format.hpp"

namespace gaac::scalar::group {

inline uint32_t load_le32(const uint8_t* p) {
  return static_cast<uint32_t>(p[0]) | static_cast<uint32_t>(p[1]) << 8 | static_cast<uint32_t>(p[2]) << 16 |
         static_cast<uint32_t>(p[3]) << 24;
}

inline void store_le32(uint8_t* p, uint32_t v) {
  for (int i = 0; i < 4; ++i) p[i] = static_cast<uint8_t>(v >> (8 * i));
}

/// Exponents and channels of one group's eight elements, in group order.
struct Group {
  std::array<uint8_t, kGroupSize> exponent{};
  std::array<uint16_t, kGroupSize> channel{};
};

/// A group's two windows: the per-channel bases of the narrow (`NarrowBits`-bit offsets) and the wide
/// (`NarrowBits` + 1) mode. Mode 0 is narrow, 1 wide, 2 raw, as both formats' tags have it.
template <int NarrowBits>
struct Windows {
  std::span<const uint8_t> narrow;
  std::span<const uint8_t> wide;

  /// The first mode whose window holds all eight exponents (0 narrow, 1 wide, 2 raw).
  int choose(const Group& group) const {
    bool fits_narrow = true;
    bool fits_wide = true;
    for (int i = 0; i < kGroupSize; ++i) {
      const int e = group.exponent[i];
      const int dn = e - narrow[group.channel[i]];
      const int dw = e - wide[group.channel[i]];
      fits_narrow = fits_narrow && dn >= 0 && dn < (1 << NarrowBits);
      fits_wide = fits_wide && dw >= 0 && dw < (2 << NarrowBits);
    }
    return fits_narrow ? 0 : fits_wide ? 1 : 2;
  }

  /// The base a group of `mode` (0, 1 or 2) measures channel `channel`'s offsets from; 0 for raw.
  int base_for(int mode, int channel) const { return mode == 0 ? narrow[channel] : mode == 1 ? wide[channel] : 0; }
};

/// Tag words (16 tags of 2 bits each) of a tile of `groups` groups, all 0 until set.
class TagWords {
 public:
  explicit TagWords(int groups) : words_(static_cast<size_t>(groups) / 16, 0) {}
  void set(int group, int mode) { words_[group / 16] |= static_cast<uint32_t>(mode) << (2 * (group % 16)); }
  /// Writes the words little-endian at `tags`.
  void store(uint8_t* tags) const {
    for (size_t r = 0; r < words_.size(); ++r) store_le32(tags + 4 * r, words_[r]);
  }

 private:
  std::vector<uint32_t> words_;
};

/// The 2-bit tag of group `group` in the tag words at `tags`.
inline uint32_t tag_of(const uint8_t* tags, int group) { return (load_le32(tags + 4 * (group / 16)) >> (2 * (group % 16))) & 3u; }

/// Escape planes of one group: plane k holds, at bit i, the bit above the code bits + k of element i.
template <size_t MaxPlanes>
using Planes = std::array<uint8_t, MaxPlanes>;

/// Reads the `count` planes of the next group from the escape slot, advancing `next`. False when they
/// would run past `capacity`.
template <size_t MaxPlanes>
bool take_planes(const uint8_t* escapes, size_t capacity, size_t count, size_t& next, Planes<MaxPlanes>& planes) {
  if (next + count > capacity) return false;
  for (size_t k = 0; k < count; ++k) planes[k] = escapes[next + k];
  next += count;
  return true;
}

/// Appends a group's first `count` planes to the escape slot at `used` (counting past `capacity`
/// without writing there, so the caller learns the size a slot would need).
template <size_t MaxPlanes>
void put_planes(const Planes<MaxPlanes>& planes, int count, uint8_t* escapes, size_t capacity, size_t& used) {
  for (int k = 0; k < count; ++k, ++used) {
    if (used < capacity) escapes[used] = planes[static_cast<size_t>(k)];
  }
}

/// True when the escape bytes [from, capacity) are all zero, as the format requires of the padding.
inline bool padding_is_zero(const uint8_t* escapes, size_t from, size_t capacity) {
  for (size_t i = from; i < capacity; ++i) {
    if (escapes[i] != 0) return false;
  }
  return true;
}

}  // namespace gaac::scalar::group
