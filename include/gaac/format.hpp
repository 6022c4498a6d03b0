// GAAC v1 tile format: the constants and the element order that every executor shares.
//
// docs/format.md is the normative description; this header is its single machine-readable copy.
// Nothing here allocates or depends on anything but the standard library, so device code and
// bindings can include it too.
#pragma once

#include <cstddef>
#include <cstdint>

/// Marks the layout functions callable from CUDA device code too.
#if defined(__CUDACC__)
#define GAAC_HOST_DEVICE __host__ __device__
#else
#define GAAC_HOST_DEVICE
#endif

namespace gaac {

/// Version of the tile layout described by this header (docs/format.md). Bumped whenever a byte moves.
inline constexpr uint32_t kTileFormatVersion = 1;

/// Tokens per tile (and per cache block): one m16 / k16 extent of a bf16 `mma.m16n8k16`.
inline constexpr int kTileTokens = 16;
/// Elements per exponent group; each group carries one 2-bit mode tag.
inline constexpr int kGroupSize = 8;
/// Elements per quad: the four bf16 values one GPU lane holds for one m16n8k16 B operand.
inline constexpr int kQuadSize = 4;
/// Lanes of the warp whose fragment layout orders a tile.
inline constexpr int kWarpLanes = 32;
/// Widest tile; heads wider than this are split into tiles of this width (half-heads).
inline constexpr int kMaxTileChannels = 128;

/// Whether a tile holds keys (read token by token by Q·Kᵀ) or values (read along tokens by P·V).
/// The two use different element orders, matched to the operand each attention product reads.
enum class TensorKind : uint8_t { key = 0, value = 1 };

/// Exponent coding mode of one group, as stored in its 2-bit tag. Tag value 3 is invalid.
enum class GroupMode : uint8_t {
  bits3 = 0,  ///< offsets 0..7 from the channel's `b3` base; no escape bytes
  bits4 = 1,  ///< offsets 0..15 from the channel's `b4` base; 1 escape byte (bit 3 of each offset)
  raw = 2,    ///< the full 8-bit exponent (base 0); 5 escape bytes (bits 3..7 of each exponent)
};
/// The tag value no encoder writes and every decoder rejects.
inline constexpr uint8_t kInvalidTag = 3;

/// Escape bytes a group of the given mode adds to its tile's escape slot.
GAAC_HOST_DEVICE constexpr int escape_bytes_for(GroupMode mode) {
  return mode == GroupMode::bits3 ? 0 : mode == GroupMode::bits4 ? 1 : 5;
}

/// Largest `b3` base: the 3-bit window [b3, b3+7] must lie inside the 8-bit exponent range.
inline constexpr int kMaxBase3 = 255 - 7;
/// Largest `b4` base: the 4-bit window [b4, b4+15] must lie inside the 8-bit exponent range.
inline constexpr int kMaxBase4 = 255 - 15;
/// Escape-slot capacities are multiples of this, so every section of a slot stays 16-byte aligned.
inline constexpr int kSlotAlignment = 16;

/// BF16 bit fields. An element is sign(1) | exponent(8) | mantissa(7).
GAAC_HOST_DEVICE constexpr uint8_t bf16_exponent(uint16_t x) { return static_cast<uint8_t>((x >> 7) & 0xFF); }
/// The stored byte of an element: `sign << 7 | mantissa`.
GAAC_HOST_DEVICE constexpr uint8_t bf16_sign_mantissa(uint16_t x) {
  return static_cast<uint8_t>(((x >> 8) & 0x80) | (x & 0x7F));
}
/// Rebuilds a BF16 bit pattern from its stored byte and its exponent.
GAAC_HOST_DEVICE constexpr uint16_t bf16_compose(uint8_t sign_mantissa, uint8_t exponent) {
  return static_cast<uint16_t>(((sign_mantissa & 0x80) << 8) | (exponent << 7) | (sign_mantissa & 0x7F));
}

/// Shape of one tile: which tensor it belongs to and how many channels (64 or 128) it spans.
struct TileShape {
  TensorKind kind = TensorKind::key;
  int channels = kMaxTileChannels;

  /// True for the widths the v1 layout defines (64 and 128 channels).
  GAAC_HOST_DEVICE constexpr bool valid() const { return channels == 64 || channels == 128; }
  /// Elements in the tile: 16 tokens × channels.
  GAAC_HOST_DEVICE constexpr int elements() const { return kTileTokens * channels; }
  /// Exponent groups in the tile.
  GAAC_HOST_DEVICE constexpr int groups() const { return elements() / kGroupSize; }
  /// Quads each lane of the ordering warp owns.
  GAAC_HOST_DEVICE constexpr int quads_per_lane() const { return elements() / (kQuadSize * kWarpLanes); }
  /// Groups each lane owns (consecutive in group order).
  GAAC_HOST_DEVICE constexpr int groups_per_lane() const { return quads_per_lane() / 2; }

  /// Bytes of the sign+mantissa section (one byte per element).
  GAAC_HOST_DEVICE constexpr size_t sign_mantissa_bytes() const { return static_cast<size_t>(elements()); }
  /// Bytes of the low-3-bit code section (3 bits per element).
  GAAC_HOST_DEVICE constexpr size_t code_bytes() const { return static_cast<size_t>(elements()) * 3 / 8; }
  /// Bytes of the mode-tag section (2 bits per group).
  GAAC_HOST_DEVICE constexpr size_t tag_bytes() const { return static_cast<size_t>(groups()) / 4; }
  /// Bytes before the escape slot: sign+mantissa, codes and tags.
  GAAC_HOST_DEVICE constexpr size_t fixed_bytes() const { return sign_mantissa_bytes() + code_bytes() + tag_bytes(); }
  /// Bytes of the same tile stored raw (BF16).
  GAAC_HOST_DEVICE constexpr size_t raw_bytes() const { return static_cast<size_t>(elements()) * 2; }
  /// Escape bytes if every group were raw: the most a tile can ever need.
  GAAC_HOST_DEVICE constexpr size_t max_escape_bytes() const { return static_cast<size_t>(groups()) * 5; }
  /// Largest useful escape-slot capacity: the biggest whose slot is still smaller than the raw tile.
  GAAC_HOST_DEVICE constexpr size_t max_slot_capacity() const {
    return (raw_bytes() - fixed_bytes() - 1) / kSlotAlignment * kSlotAlignment;
  }
  /// Bytes of a compressed slot with the given escape capacity.
  GAAC_HOST_DEVICE constexpr size_t slot_bytes(size_t escape_capacity) const { return fixed_bytes() + escape_capacity; }

  /// Byte offset of the code section inside a slot.
  GAAC_HOST_DEVICE constexpr size_t code_offset() const { return sign_mantissa_bytes(); }
  /// Byte offset of the tag section inside a slot.
  GAAC_HOST_DEVICE constexpr size_t tag_offset() const { return sign_mantissa_bytes() + code_bytes(); }
  /// Byte offset of the escape slot inside a slot.
  GAAC_HOST_DEVICE constexpr size_t escape_offset() const { return fixed_bytes(); }
};

/// Where one element of a tile lives in fragment order.
struct ElementSlot {
  uint16_t token;    ///< 0..15, row inside the tile
  uint16_t channel;  ///< 0..channels-1, column inside the tile
};

/// Position of the element with byte `byte` (0..3) of quad `quad` of lane `lane`, for the given shape.
/// This is the whole element order of the format (docs/format.md, "Element order").
///
/// Lane `lane = 4g + t` holds, for every m16n8k16 B operand, the elements at k = 2t, 2t+1, 2t+8,
/// 2t+9 of column n = g. Keys are B = Kᵀ (k = channel, n = token): quad `j = h·(C/16) + s` is token
/// 8h+g, channels 16s + 2t + {0, 8, 1, 9}. Values are B = V (k = token, n = channel): quad `j = c`
/// is channel 8c+g, tokens 2t + {0, 8, 1, 9}. Byte order {0, 8, 1, 9} puts the two halves of each
/// bf16x2 register in bytes (0, 2) and (1, 3).
GAAC_HOST_DEVICE constexpr ElementSlot element_slot(TileShape shape, int lane, int quad, int byte) {
  constexpr int kByteOffset[4] = {0, 8, 1, 9};
  const int g = lane / 4;
  const int t = lane % 4;
  if (shape.kind == TensorKind::key) {
    const int steps = shape.channels / 16;
    const int h = quad / steps;
    const int s = quad % steps;
    return {static_cast<uint16_t>(8 * h + g), static_cast<uint16_t>(16 * s + 2 * t + kByteOffset[byte])};
  }
  return {static_cast<uint16_t>(2 * t + kByteOffset[byte]), static_cast<uint16_t>(8 * quad + g)};
}

/// Offset inside the sign+mantissa section of byte `byte` of quad `quad` of lane `lane`:
/// chunks of 16 bytes per lane (four quads), 512 bytes per chunk, so a warp reads a chunk with one
/// coalesced 16-byte load per lane.
GAAC_HOST_DEVICE constexpr size_t sign_mantissa_offset(int lane, int quad, int byte) {
  return static_cast<size_t>(quad / 4) * (16 * kWarpLanes) + static_cast<size_t>(lane) * 16 +
         static_cast<size_t>(quad % 4) * 4 + static_cast<size_t>(byte);
}

/// Index, in group order, of the group holding quad `quad` of lane `lane`. A lane's groups are
/// consecutive, so its escape bytes are too.
GAAC_HOST_DEVICE constexpr int group_index(TileShape shape, int lane, int quad) {
  return lane * shape.groups_per_lane() + quad / 2;
}

/// Position of an element inside its group (0..7): the group's first quad, then its second.
GAAC_HOST_DEVICE constexpr int index_in_group(int quad, int byte) { return (quad % 2) * kQuadSize + byte; }

/// Location of one 3-bit code inside a lane's code words (docs/format.md, "Code words").
struct CodeBits {
  int low_word;   ///< lane word holding bits 0..(low_bits-1) of the code
  int low_shift;  ///< bit position of the code's bit 0 inside each byte of `low_word`
  int low_bits;   ///< 3, or 2 when bit 2 is stored apart
  int high_word;  ///< lane word holding bit 2 when `low_bits == 2`, else -1
  int high_shift; ///< bit position of bit 2 inside each byte of `high_word`
};

/// Words of code bits per lane: three for every eight quads.
GAAC_HOST_DEVICE constexpr int code_words_per_lane(TileShape shape) { return shape.quads_per_lane() / 8 * 3; }

/// Which lane word and bits hold the code of quad `quad` (byte b of the quad sits in byte b of the
/// word). Per octet of quads o the lane has words W0, W1, W2; quads 0/1 sit at bits 0-2/3-5 of W0,
/// quads 2/3 of W1, quads 4/5 of W2; quads 6 and 7 keep bits 0-1 in bits 6-7 of W0 and W1 and bit 2
/// in bit 6 and bit 7 of W2. Lane words are numbered W0 of every octet first, then W1s, then W2s.
GAAC_HOST_DEVICE constexpr CodeBits code_bits(TileShape shape, int quad) {
  const int octets = shape.quads_per_lane() / 8;
  const int o = quad / 8;
  const int k = quad % 8;
  const int w0 = o, w1 = octets + o, w2 = 2 * octets + o;
  switch (k) {
    case 0: return {w0, 0, 3, -1, 0};
    case 1: return {w0, 3, 3, -1, 0};
    case 2: return {w1, 0, 3, -1, 0};
    case 3: return {w1, 3, 3, -1, 0};
    case 4: return {w2, 0, 3, -1, 0};
    case 5: return {w2, 3, 3, -1, 0};
    case 6: return {w0, 6, 2, w2, 6};
    default: return {w1, 6, 2, w2, 7};
  }
}

/// Byte offset inside the code section of lane word `word` of lane `lane`. The first two thirds of
/// a lane's words (W0s and W1s) are contiguous per lane (16 bytes for 128 channels, 8 for 64), then
/// the W2s (8 or 4 bytes per lane): a warp reads the section with one 16- and one 8-byte load per
/// lane (or one 8- and one 4-byte load).
GAAC_HOST_DEVICE constexpr size_t code_word_offset(TileShape shape, int lane, int word) {
  const int words = code_words_per_lane(shape);
  const int first = words / 3 * 2;  // W0s and W1s
  if (word < first) return static_cast<size_t>(lane) * first * 4 + static_cast<size_t>(word) * 4;
  const size_t base = static_cast<size_t>(kWarpLanes) * first * 4;
  const int rest = words - first;
  return base + static_cast<size_t>(lane) * rest * 4 + static_cast<size_t>(word - first) * 4;
}

}  // namespace gaac
