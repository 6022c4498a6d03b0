// GAAC-FP8 tile format: the element formats, the FP8 fields, the modes, the field streams and the slot
// layout of E4M3 and E5M2 tiles.
//
// docs/format.md, section 14, is the normative description; this header is its machine-readable copy.
// The element order, groups and tags are BF16's (gaac/format.hpp). Nothing here allocates or depends on
// anything but the standard library, so device code and bindings can include it too.
#pragma once

#include <cstddef>
#include <cstdint>

#include "gaac/format.hpp"

namespace gaac {

/// Version of the FP8 tile layout described by this header. Bumped whenever a byte moves.
inline constexpr uint32_t kFp8TileFormatVersion = 1;

/// The element format of a KV tensor: BF16, or one of the two OCP FP8 formats.
enum class ElementFormat : uint8_t {
  bf16 = 0,  ///< sign(1) | exponent(8) | mantissa(7)
  e4m3 = 1,  ///< sign(1) | exponent(4) | mantissa(3); S.1111.111 is NaN, no infinities (E4M3FN)
  e5m2 = 2,  ///< sign(1) | exponent(5) | mantissa(2); IEEE-like infinities and NaNs
};

/// True for E4M3 and E5M2.
GAAC_HOST_DEVICE constexpr bool is_fp8(ElementFormat f) { return f == ElementFormat::e4m3 || f == ElementFormat::e5m2; }
/// Exponent bits X of an element: 8, 4 or 5.
GAAC_HOST_DEVICE constexpr int exponent_bits(ElementFormat f) { return f == ElementFormat::e4m3 ? 4 : f == ElementFormat::e5m2 ? 5 : 8; }
/// Mantissa bits M of an element: 7, 3 or 2.
GAAC_HOST_DEVICE constexpr int mantissa_bits(ElementFormat f) { return f == ElementFormat::e4m3 ? 3 : f == ElementFormat::e5m2 ? 2 : 7; }
/// Bytes per element: 2 or 1.
GAAC_HOST_DEVICE constexpr int element_bytes(ElementFormat f) { return is_fp8(f) ? 1 : 2; }
/// The format's name as gaac's files and tools spell it: "bf16", "e4m3", "e5m2".
constexpr const char* to_string(ElementFormat f) {
  return f == ElementFormat::e4m3 ? "e4m3" : f == ElementFormat::e5m2 ? "e5m2" : "bf16";
}

/// The exponent field of an FP8 element (0 .. 2^X − 1).
GAAC_HOST_DEVICE constexpr uint8_t fp8_exponent(uint8_t x, ElementFormat f) {
  return static_cast<uint8_t>((x >> mantissa_bits(f)) & ((1u << exponent_bits(f)) - 1));
}
/// The stored sign+mantissa field of an FP8 element: `sign << M | mantissa` (M + 1 bits).
GAAC_HOST_DEVICE constexpr uint8_t fp8_sign_mantissa(uint8_t x, ElementFormat f) {
  const int m = mantissa_bits(f);
  return static_cast<uint8_t>((x >> 7) << m | (x & ((1u << m) - 1)));
}
/// Rebuilds an FP8 element from its sign+mantissa field and its exponent.
GAAC_HOST_DEVICE constexpr uint8_t fp8_compose(uint8_t sign_mantissa, uint8_t exponent, ElementFormat f) {
  const int m = mantissa_bits(f);
  return static_cast<uint8_t>((sign_mantissa >> m) << 7 | exponent << m | (sign_mantissa & ((1u << m) - 1)));
}

/// Exponent coding mode of one FP8 group, as stored in its 2-bit tag. Tag value 3 (kInvalidTag) is invalid.
enum class Fp8GroupMode : uint8_t {
  bits2 = 0,  ///< offsets 0..3 from the channel's `b2` base; no escape bytes
  bits3 = 1,  ///< offsets 0..7 from the channel's `b3` base; 1 escape byte (bit 2 of each offset)
  raw = 2,    ///< the whole exponent (base 0); X − 2 escape bytes (bits 2 .. X−1 of each exponent)
};

/// Bits of every offset kept in the code stream (the 2-bit mode's width).
inline constexpr int kFp8CodeBits = 2;

/// Escape bytes a group of the given mode adds to its tile's escape slot.
GAAC_HOST_DEVICE constexpr int fp8_escape_bytes_for(Fp8GroupMode mode, ElementFormat f) {
  return mode == Fp8GroupMode::bits2 ? 0 : mode == Fp8GroupMode::bits3 ? 1 : exponent_bits(f) - kFp8CodeBits;
}
/// Largest `b2` base: the window [b2, b2+3] stays inside the exponent range (E4M3 12, E5M2 28).
GAAC_HOST_DEVICE constexpr int fp8_max_base2(ElementFormat f) { return (1 << exponent_bits(f)) - 4; }
/// Largest `b3` base: the window [b3, b3+7] stays inside the exponent range (E4M3 8, E5M2 24).
GAAC_HOST_DEVICE constexpr int fp8_max_base3(ElementFormat f) { return (1 << exponent_bits(f)) - 8; }

/// Shape of one FP8 tile: its element format and its BF16-style shape (kind, 64 or 128 channels).
struct Fp8TileShape {
  ElementFormat format = ElementFormat::e4m3;
  TileShape tile;

  /// True for an FP8 format and a width the layout defines.
  GAAC_HOST_DEVICE constexpr bool valid() const { return is_fp8(format) && tile.valid(); }
  /// Elements in the tile: 16 tokens × channels.
  GAAC_HOST_DEVICE constexpr int elements() const { return tile.elements(); }
  /// Exponent groups in the tile.
  GAAC_HOST_DEVICE constexpr int groups() const { return tile.groups(); }

  /// Bytes of the sign+mantissa section: E4M3 one 4-bit stream (8·C), E5M2 a 1-bit and a 2-bit stream (6·C).
  GAAC_HOST_DEVICE constexpr size_t sign_mantissa_bytes() const {
    return static_cast<size_t>(elements()) * static_cast<size_t>(mantissa_bits(format) + 1) / 8;
  }
  /// Bytes of the code section: one 2-bit stream (4·C).
  GAAC_HOST_DEVICE constexpr size_t code_bytes() const { return static_cast<size_t>(elements()) * kFp8CodeBits / 8; }
  /// Bytes of the tag section (2 bits per group, C/2).
  GAAC_HOST_DEVICE constexpr size_t tag_bytes() const { return static_cast<size_t>(groups()) / 4; }
  /// Bytes before the escape slot.
  GAAC_HOST_DEVICE constexpr size_t fixed_bytes() const { return sign_mantissa_bytes() + code_bytes() + tag_bytes(); }
  /// Bytes of the same tile stored raw (FP8, row-major).
  GAAC_HOST_DEVICE constexpr size_t raw_bytes() const { return static_cast<size_t>(elements()); }
  /// Escape bytes if every group were raw: the most a tile can ever need.
  GAAC_HOST_DEVICE constexpr size_t max_escape_bytes() const {
    return static_cast<size_t>(groups()) * static_cast<size_t>(exponent_bits(format) - kFp8CodeBits);
  }
  /// Largest useful escape-slot capacity: the biggest whose slot is still smaller than the raw tile.
  GAAC_HOST_DEVICE constexpr size_t max_slot_capacity() const {
    return (raw_bytes() - fixed_bytes() - 1) / kSlotAlignment * kSlotAlignment;
  }
  /// Bytes of a compressed slot with the given escape capacity.
  GAAC_HOST_DEVICE constexpr size_t slot_bytes(size_t escape_capacity) const { return fixed_bytes() + escape_capacity; }

  /// E4M3: offset of the 4-bit stream of sign+mantissa fields. E5M2: of the 1-bit stream of signs.
  GAAC_HOST_DEVICE constexpr size_t sign_mantissa_offset() const { return 0; }
  /// E5M2 only: offset of the 2-bit stream of mantissas (after the 2·C bytes of signs).
  GAAC_HOST_DEVICE constexpr size_t mantissa_offset() const { return static_cast<size_t>(elements()) / 8; }
  /// Offset of the 2-bit stream of codes (the low two bits of every offset).
  GAAC_HOST_DEVICE constexpr size_t code_offset() const { return sign_mantissa_bytes(); }
  /// Offset of the tag section.
  GAAC_HOST_DEVICE constexpr size_t tag_offset() const { return sign_mantissa_bytes() + code_bytes(); }
  /// Offset of the escape slot.
  GAAC_HOST_DEVICE constexpr size_t escape_offset() const { return fixed_bytes(); }
};

/// Fragment position (0 .. 16·C − 1) of byte `byte` of quad `quad` of lane `lane`: the order every FP8
/// stream follows, BF16's sign+mantissa order (docs/format.md, sections 5.1 and 14.2).
GAAC_HOST_DEVICE constexpr int fragment_position(int lane, int quad, int byte) {
  return static_cast<int>(sign_mantissa_offset(lane, quad, byte));
}

/// Where the field of one fragment position lives in a k-bit stream (docs/format.md, section 14.4).
struct StreamField {
  size_t byte;  ///< byte offset inside the stream
  int shift;    ///< bit position of the field's bit 0 inside that byte
};

/// The field of fragment position `position` in a stream of `bits`-bit fields (1, 2 or 4): blocks of 32
/// bytes cover 32·(8/bits) positions; byte i of block j holds at bits bits·r.. the field of position
/// 32·(8/bits)·j + 32·r + i.
GAAC_HOST_DEVICE constexpr StreamField stream_field(int bits, int position) {
  const int per_block = 32 * (8 / bits);
  return {static_cast<size_t>(position / per_block) * 32 + static_cast<size_t>(position % 32),
          bits * (position % per_block / 32)};
}

}  // namespace gaac
